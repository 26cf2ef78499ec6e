// The TCP transport and the stores in one process: wire formats, the data path on socket
// pairs (with bytes injected by hand), the stores, and whole jobs with ranks as threads over
// loopback (IPv4 and IPv6): the suite, strangers, wrong tokens, missing ranks, aborts, lost peers.
#include "../ports.hpp"
#include "../support.hpp"

#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <cohort/cohort.hpp>
#include <cohort/rendezvous/detail/peer_uid.hpp>
#include <cohort/rendezvous/file_store.hpp>
#include <cohort/rendezvous/redis_store.hpp>
#include <cohort/rendezvous/tcp_store.hpp>
#include <cohort/transport/tcp.hpp>

#include "../collectives/suite.hpp"

namespace ct = cohort::test;
namespace tcpd = cohort::detail::tcp;
namespace net = cohort::detail::net;
using namespace std::chrono_literals;

namespace {

// A temporary directory removed at the end of the test.
struct temp_dir {
  std::string path;
  temp_dir() {
    char tmpl[] = "/tmp/cohort-tcp-XXXXXX";
    path = ::mkdtemp(tmpl);
  }
  ~temp_dir() { std::filesystem::remove_all(path); }
};

// Collects log lines from every rank.
struct log_sink {
  std::mutex m;
  std::vector<std::string> lines;
  std::function<void(std::string_view)> fn() {
    return [this](std::string_view s) {
      std::lock_guard lk(m);
      lines.emplace_back(s);
    };
  }
  bool contains(std::string_view needle) {
    std::lock_guard lk(m);
    for (const auto& l : lines)
      if (l.find(needle) != std::string::npos) return true;
    return false;
  }
  std::string all() {
    std::lock_guard lk(m);
    std::string s;
    for (const auto& l : lines) s += l + "\n";
    return s;
  }
};

cohort::launch_info info_for(int rank, int size, const std::string& job) {
  cohort::launch_info info;
  info.rank = rank;
  info.size = size;
  info.local_rank = rank;
  info.local_size = size;
  info.job_id = job;
  return info;
}

std::string unique_job(const char* what) {
  static std::atomic<int> n{0};
  return std::string(what) + "-" + std::to_string(::getpid()) + "-" + std::to_string(n++);
}

// Runs fn(comm) on `p` threads, each rank meeting the others through its own store from
// make_store(rank); rethrows the first exception.
template <class MakeStore, class Fn>
void run_tcp(int p, const std::string& job, cohort::tcp_options opts, MakeStore make_store, Fn fn,
             std::vector<std::chrono::milliseconds> delays = {}) {
  std::vector<std::exception_ptr> errors(p);
  std::vector<std::thread> threads;
  for (int r = 0; r < p; ++r) {
    threads.emplace_back([&, r] {
      try {
        if (r < static_cast<int>(delays.size())) std::this_thread::sleep_for(delays[r]);
        auto s = make_store(r);
        auto comm = cohort::make_tcp_communicator(info_for(r, p, job), *s, opts);
        fn(comm);
      } catch (...) {
        errors[r] = std::current_exception();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
}

cohort::tcp_options loopback_options(log_sink* sink = nullptr, bool v6 = false) {
  cohort::tcp_options o;
  o.interface = "lo";
  o.family = v6 ? cohort::tcp_family::v6 : cohort::tcp_family::v4;
  o.connect_timeout = 20s;
  o.spin = 0us;  // ranks as threads on 2 cores: spinning only steals from the peer
  if (sink)
    o.log = sink->fn();
  else
    o.log = [](std::string_view) {};
  return o;
}

// Two engines joined by a socket pair: the data path without any setup.
struct engine_pair {
  std::unique_ptr<tcpd::engine> a, b;
  explicit engine_pair(std::chrono::milliseconds abort_grace = 10ms) {
    int sv[2];
    REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, sv) == 0);
    a = make(0, sv[0], abort_grace);
    b = make(1, sv[1], abort_grace);
  }
  static std::unique_ptr<tcpd::engine> make(int rank, int fd,
                                            std::chrono::milliseconds abort_grace = 10ms) {
    std::vector<net::unique_fd> fds(2);
    fds[1 - rank].reset(fd);
    tcpd::engine_options o;
    o.spin = 0us;
    o.abort_linger = std::max<std::chrono::milliseconds>(200ms, abort_grace);
    o.abort_grace = abort_grace;
    return std::make_unique<tcpd::engine>(rank, 2, std::move(fds),
                                          std::vector<std::string>{"a", "b"}, o);
  }
};

// One engine and the raw other end of its socket, to inject bytes.
struct engine_raw {
  std::unique_ptr<tcpd::engine> e;
  net::unique_fd raw;
  engine_raw() {
    int sv[2];
    REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, sv) == 0);
    e = engine_pair::make(0, sv[0]);
    raw.reset(sv[1]);
  }
  void inject(const void* p, std::size_t n) {
    REQUIRE(::send(raw.get(), p, n, MSG_NOSIGNAL) == static_cast<ssize_t>(n));
  }
  void inject_frame(tcpd::frame_type t, std::span<const std::byte> payload) {
    std::byte h[tcpd::frame_header_size];
    tcpd::encode_frame_header(h, t, static_cast<std::uint32_t>(payload.size()));
    inject(h, sizeof h);
    inject(payload.data(), payload.size());
  }
};

// Rank 0 of three, with the raw other ends of its sockets to ranks 1 and 2.
struct engine_trio {
  std::unique_ptr<tcpd::engine> e;
  net::unique_fd raw[3];
  engine_trio() {
    std::vector<net::unique_fd> fds(3);
    for (int q = 1; q < 3; ++q) {
      int sv[2];
      REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, sv) == 0);
      fds[q].reset(sv[0]);
      raw[q].reset(sv[1]);
    }
    tcpd::engine_options o;
    o.spin = 0us;
    o.abort_linger = 200ms;
    e = std::make_unique<tcpd::engine>(0, 3, std::move(fds),
                                       std::vector<std::string>{"a", "b", "c"}, o);
  }
  void inject(int q, const void* p, std::size_t n) {
    REQUIRE(::send(raw[q].get(), p, n, MSG_NOSIGNAL) == static_cast<ssize_t>(n));
  }
};

// An abort frame: `origin` failed with `code`, saying `what`.
std::vector<std::byte> abort_frame(int origin, cohort::errc code, const std::string& what) {
  std::vector<std::byte> f(tcpd::frame_header_size + tcpd::max_control_frame);
  f.resize(
      tcpd::encode_abort(f.data(), f.size(), origin, {cohort::make_error_code(code), 0, what}));
  return f;
}

std::vector<std::byte> pattern(std::size_t n, unsigned seed) {
  std::vector<std::byte> v(n);
  for (std::size_t i = 0; i < n; ++i)
    v[i] = static_cast<std::byte>((i * 131 + seed * 7 + (i >> 11)) & 0xff);
  return v;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Wire formats

TEST_CASE("tcp wire: hellos are checked field by field") {
  const tcpd::hello me{3, 4, "job-a", "secret"};
  const auto b = tcpd::encode_hello(me);
  tcpd::hello peer;
  CHECK(tcpd::check_hello(b, "job-a", 4, "secret", peer).empty());
  CHECK(peer.rank == 3);
  CHECK(tcpd::check_hello(b, "job-a", 4, "other", peer) == "wrong token");
  CHECK(tcpd::check_hello(b, "job-a", 4, "", peer) == "wrong token");
  CHECK(tcpd::check_hello(b, "job-b", 4, "secret", peer).find("job id") != std::string::npos);
  CHECK(tcpd::check_hello(b, "job-a", 5, "secret", peer).find("world size") != std::string::npos);
  auto bad = b;
  bad[0] ^= std::byte{1};
  CHECK(tcpd::check_hello(bad, "job-a", 4, "secret", peer).find("magic") != std::string::npos);
  bad = b;
  bad[8] = std::byte{9};
  CHECK(tcpd::check_hello(bad, "job-a", 4, "secret", peer).find("version") != std::string::npos);
  bad = b;
  bad[20] = std::byte{0xff};
  CHECK(tcpd::check_hello(bad, "job-a", 4, "secret", peer).find("malformed") != std::string::npos);
  const auto out_of_range = tcpd::encode_hello({7, 4, "job-a", "secret"});
  CHECK(tcpd::check_hello(out_of_range, "job-a", 4, "secret", peer).find("out of range") !=
        std::string::npos);
  CHECK(tcpd::equal_secret("abc", "abc"));
  CHECK_FALSE(tcpd::equal_secret("abc", "abcd"));
}

TEST_CASE("tcp wire: frame headers and abort frames") {
  std::byte h[8];
  tcpd::encode_frame_header(h, tcpd::frame_type::data, 1234);
  auto d = tcpd::decode_frame_header(h);
  REQUIRE(d);
  CHECK(d->length == 1234);
  tcpd::encode_frame_header(h, tcpd::frame_type::data, tcpd::max_data_frame + 1);
  CHECK_FALSE(tcpd::decode_frame_header(h));  // over the limit: refused before any allocation
  tcpd::encode_frame_header(h, tcpd::frame_type::data, 0);
  CHECK_FALSE(tcpd::decode_frame_header(h));
  tcpd::encode_frame_header(h, tcpd::frame_type::abort, tcpd::max_control_frame + 1);
  CHECK_FALSE(tcpd::decode_frame_header(h));
  tcpd::encode_frame_header(h, tcpd::frame_type::data, 5);
  h[5] = std::byte{0};
  CHECK_FALSE(tcpd::decode_frame_header(h));
  h[5] = std::byte{0xC7};
  h[4] = std::byte{9};
  CHECK_FALSE(tcpd::decode_frame_header(h));

  std::vector<std::byte> buf(tcpd::frame_header_size + tcpd::max_control_frame);
  const cohort::failure f{cohort::make_error_code(cohort::errc::mismatch), 1,
                          "rank 1 called all_gather"};
  const std::size_t n = tcpd::encode_abort(buf.data(), buf.size(), 2, f);
  const auto hh = tcpd::decode_frame_header(buf.data());
  REQUIRE(hh);
  CHECK(hh->type == tcpd::frame_type::abort);
  CHECK(n == tcpd::frame_header_size + hh->length);
  const auto back = tcpd::decode_abort(buf.data() + tcpd::frame_header_size, hh->length, 4);
  REQUIRE(back);
  CHECK(back->peer == 2);
  CHECK(back->code == cohort::errc::mismatch);
  CHECK(back->what == f.what);
  CHECK_FALSE(
      tcpd::decode_abort(buf.data() + tcpd::frame_header_size, hh->length, 2));  // origin >= size
  const cohort::failure huge{std::make_error_code(std::errc::io_error), 0, std::string(10000, 'x')};
  const std::size_t m = tcpd::encode_abort(buf.data(), buf.size(), 0, huge);
  CHECK(m <= buf.size());
  const auto hb = tcpd::decode_frame_header(buf.data());
  REQUIRE(hb);
  const auto generic = tcpd::decode_abort(buf.data() + tcpd::frame_header_size, hb->length, 1);
  REQUIRE(generic);
  CHECK(generic->code == std::errc::io_error);
}

TEST_CASE("tcp wire: a leaving answer carries who gave up and why, and is no hello") {
  const cohort::failure f{cohort::make_error_code(cohort::errc::peer_lost), 0,
                          "rendezvous: lost rank 0 at 127.0.0.1:4000 during the handshake"};
  const auto b = tcpd::encode_leaving(1, f);
  const auto back = tcpd::decode_leaving(b, 3);
  REQUIRE(back);
  CHECK(back->peer == 1);  // who left; its text names the cause
  CHECK(back->code == cohort::errc::peer_lost);
  CHECK(back->what == f.what);
  CHECK_FALSE(tcpd::is_refusal(b));
  tcpd::hello peer;
  CHECK_FALSE(tcpd::check_hello(b, "job-a", 3, "", peer).empty());
  CHECK_FALSE(tcpd::decode_leaving(b, 1));  // the origin is not a rank of this job
  CHECK_FALSE(tcpd::decode_leaving(tcpd::encode_refusal(), 3));
  CHECK_FALSE(tcpd::decode_leaving(tcpd::encode_hello({1, 3, "job-a", ""}), 3));
  // A long reason is cut to what fits; a length field past the end is not believed.
  const cohort::failure long_one{std::make_error_code(std::errc::io_error), 0,
                                 std::string(1000, 'x')};
  auto cut = tcpd::encode_leaving(2, long_one);
  const auto short_back = tcpd::decode_leaving(cut, 3);
  REQUIRE(short_back);
  CHECK(short_back->code == std::errc::io_error);
  CHECK(short_back->what == std::string(tcpd::leaving_text_room, 'x'));
  tcpd::store_le<std::uint32_t>(cut.data() + 28, tcpd::hello_size);
  CHECK_FALSE(tcpd::decode_leaving(cut, 3));
}

TEST_CASE("tcp wire: a published address is host, port and size, and nothing else") {
  const auto a = tcpd::parse_address(tcpd::format_address({"127.0.0.1", 4000, 3}));
  REQUIRE(a);
  CHECK(a->host == "127.0.0.1");
  CHECK(a->port == 4000);
  CHECK(a->size == 3);
  const auto v6 = tcpd::parse_address("::1 65535 12");
  REQUIRE(v6);
  CHECK(v6->host == "::1");
  CHECK(v6->port == 65535);
  CHECK(v6->size == 12);
  const auto scoped = tcpd::parse_address("fe80::1%\xc3\xa9th0 4000 2");  // a UTF-8 interface name
  REQUIRE(scoped);
  CHECK(scoped->host == "fe80::1%\xc3\xa9th0");
  const auto zeros = tcpd::parse_address("10.0.0.2 0080 007");  // decimal, leading zeros read
  REQUIRE(zeros);
  CHECK(zeros->port == 80);
  CHECK(zeros->size == 7);
  const auto sizeless = tcpd::parse_address("10.0.0.2 1");  // the size is optional
  REQUIRE(sizeless);
  CHECK(sizeless->size == 0);
  CHECK(tcpd::format_address(*sizeless) == "10.0.0.2 1");
  for (const char* bad : {"", "127.0.0.1", "127.0.0.1 ", " 4000 3", "127.0.0.1 0 3",
                          "127.0.0.1 65536 3", "127.0.0.1 -1 3", "127.0.0.1 +4000 3",
                          "127.0.0.1 4000x 3", "127.0.0.1  4000 3", "127.0.0.1 4000 ",
                          "127.0.0.1 4000 0", "127.0.0.1 4000 -3", "127.0.0.1 4000 3 1",
                          "127.0.0.1 4000 3x", "127.0.0.1 99999999999 3",
                          "127.0.0.1 4000 99999999999", "127.0.0.1\tx 4000 3",
                          "127.0.0.1\x7f 4000 3"}) {
    INFO("address: \"" << bad << "\"");
    CHECK_FALSE(tcpd::parse_address(bad));
  }
  CHECK_FALSE(tcpd::parse_address(std::string_view("127.0.0.1\0junk 4000 3", 20)));
}

TEST_CASE("tcp net: interface lists and the loopback default") {
  CHECK(tcpd::interface_matches("", "eth0"));
  CHECK(tcpd::interface_matches("eth", "eth0"));
  CHECK_FALSE(tcpd::interface_matches("=eth", "eth0"));
  CHECK(tcpd::interface_matches("=eth0,lo", "lo"));
  CHECK_FALSE(tcpd::interface_matches("^lo,docker", "lo"));
  CHECK(tcpd::interface_matches("^lo,docker", "eth0"));
  CHECK_FALSE(tcpd::interface_matches("^lo,docker", "docker0"));
  std::string why;
  auto lo = tcpd::choose_address("lo", tcpd::family_choice::v4, "", why);
  REQUIRE(lo);
  CHECK(tcpd::host_of(lo->address) == "127.0.0.1");
  auto lo6 = tcpd::choose_address("=lo", tcpd::family_choice::v6, "", why);
  REQUIRE(lo6);
  CHECK(tcpd::host_of(lo6->address) == "::1");
  auto by_store = tcpd::choose_address("", tcpd::family_choice::any, "127.0.0.1", why);
  REQUIRE(by_store);
  CHECK(by_store->loopback);
  CHECK_FALSE(tcpd::choose_address("no-such-interface", tcpd::family_choice::any, "", why));
  CHECK(why.find("no-such-interface") != std::string::npos);
  std::string host;
  int port = 0;
  CHECK(net::split_host_port("[fd00::1]:29500", host, port));
  CHECK((host == "fd00::1" && port == 29500));
  CHECK(net::split_host_port("node7:80", host, port));
  CHECK_FALSE(net::split_host_port("fd00::1:80", host, port));
  CHECK_FALSE(net::split_host_port("host:0", host, port));
  CHECK(net::is_loopback_host("127.0.0.2"));
  CHECK(net::is_loopback_host("::1"));
  CHECK_FALSE(net::is_loopback_host("10.0.0.1"));
}

// A connected pair over loopback: `listen_family` for the listener, `connect_v4` to reach an
// IPv6 listener at 127.0.0.1 (an IPv4-mapped peer). Returns {accepted, connected}.
std::pair<net::unique_fd, net::unique_fd> loopback_pair(int listen_family, bool connect_v4) {
  net::unique_fd l(::socket(listen_family, SOCK_STREAM, 0));
  sockaddr_storage at{};
  socklen_t len = 0;
  if (listen_family == AF_INET) {
    auto& a = reinterpret_cast<sockaddr_in&>(at);
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    len = sizeof a;
  } else {
    auto& a = reinterpret_cast<sockaddr_in6&>(at);
    a.sin6_family = AF_INET6;
    a.sin6_addr = connect_v4 ? in6addr_any : in6addr_loopback;
    len = sizeof a;
  }
  REQUIRE(::bind(l.get(), reinterpret_cast<sockaddr*>(&at), len) == 0);
  REQUIRE(::listen(l.get(), 1) == 0);
  REQUIRE(::getsockname(l.get(), reinterpret_cast<sockaddr*>(&at), &len) == 0);
  if (connect_v4) {  // the same port, reached as 127.0.0.1
    sockaddr_in v4{};
    v4.sin_family = AF_INET;
    v4.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    v4.sin_port = reinterpret_cast<sockaddr_in6&>(at).sin6_port;
    std::memcpy(&at, &v4, sizeof v4);
    len = sizeof v4;
  }
  net::unique_fd c(::socket(at.ss_family, SOCK_STREAM, 0));
  REQUIRE(::connect(c.get(), reinterpret_cast<sockaddr*>(&at), len) == 0);
  net::unique_fd s(::accept(l.get(), nullptr, nullptr));
  REQUIRE(s);
  return {std::move(s), std::move(c)};
}

TEST_CASE("peer uid: a loopback peer is this user, asked of sock_diag and read from the tables "
          "alike (IPv4, IPv6, IPv4-mapped)") {
  const struct {
    const char* name;
    int family;
    bool mapped;
  } cases[] = {{"IPv4", AF_INET, false}, {"IPv6", AF_INET6, false}, {"IPv4-mapped", AF_INET6, true}};
  for (const auto& c : cases) {
    INFO(c.name);
    auto [accepted, connected] = loopback_pair(c.family, c.mapped);
    for (bool tables : {false, true}) {
      INFO((tables ? "tables" : "sock_diag"));
      for (int fd : {accepted.get(), connected.get()}) {
        const auto owner = net::peer_uid(fd, tables);
        CHECK(owner.what == net::peer_owner::kind::local);
        CHECK(owner.uid == ::getuid());
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------
// The data path on socket pairs

TEST_CASE("tcp engine: the stream ignores how sends and receives are split") {
  engine_pair p;
  const auto until = cohort::clock::now() + 20s;
  const std::size_t sizes_out[] = {1, 3 * (1u << 20) + 5, 17, 0, 65536, 7};
  const std::size_t sizes_in[] = {2, 1u << 20, 2 * (1u << 20) + 4, 65536 + 10, 3, 11};
  std::size_t total = 0;
  for (auto s : sizes_out) total += s;
  const auto src = pattern(total, 1);
  std::vector<std::byte> dst(total);
  std::vector<tcpd::engine::request> sends, recvs;
  std::size_t off = 0;
  for (auto s : sizes_out) {
    sends.push_back(p.a->send(1, std::span(src).subspan(off, s)));
    off += s;
  }
  off = 0;
  for (auto s : sizes_in) {
    recvs.push_back(p.b->recv(0, std::span(dst).subspan(off, s)));
    off += s;
  }
  REQUIRE(off == total);
  // One thread each: the sender blocks once the socket is full, until the receiver reads.
  std::thread reader([&] {
    std::error_code ec;
    for (auto& r : recvs) {
      p.b->wait(r, until, ec);
      REQUIRE_FALSE(ec);
    }
  });
  std::error_code ec;
  for (auto& s : sends) {
    p.a->wait(s, until, ec);
    CHECK_FALSE(ec);
  }
  reader.join();
  CHECK(dst == src);
}

TEST_CASE("tcp engine: full duplex, both sides send 32 MiB before they receive") {
  engine_pair p;
  const std::size_t n = 32u << 20;
  const auto out_a = pattern(n, 2), out_b = pattern(n, 3);
  std::vector<std::byte> in_a(n), in_b(n);
  auto side = [&](tcpd::engine& e, int peer, const std::vector<std::byte>& out,
                  std::vector<std::byte>& in) {
    const auto until = cohort::clock::now() + 30s;
    auto s = e.send(peer, out);
    auto r = e.recv(peer, in);
    std::error_code ec;
    e.wait(s, until, ec);  // the send completes only if this wait also reads
    REQUIRE_FALSE(ec);
    e.wait(r, until, ec);
    REQUIRE_FALSE(ec);
  };
  std::thread t([&] { side(*p.b, 0, out_b, in_b); });
  side(*p.a, 1, out_a, in_a);
  t.join();
  CHECK(in_a == out_b);
  CHECK(in_b == out_a);
}

TEST_CASE("tcp engine: end of stream is peer_lost, after the bytes that came before it") {
  engine_raw x;
  const auto until = cohort::clock::now() + 5s;
  const auto data = pattern(100, 4);
  x.inject_frame(tcpd::frame_type::data, data);
  x.raw.reset();  // the peer is gone
  std::vector<std::byte> got(100), more(1);
  auto r = x.e->recv(1, got);
  std::error_code ec;
  x.e->wait(r, until, ec);
  CHECK_FALSE(ec);
  CHECK(got == data);
  r = x.e->recv(1, more);
  x.e->wait(r, until, ec);
  CHECK(ec == cohort::errc::peer_lost);
  CHECK(x.e->lost_reason(1) == "connection closed");
  auto s = x.e->send(1, std::span(data));  // later operations fail at once
  const auto t0 = cohort::clock::now();
  x.e->wait(s, until, ec);
  CHECK(ec == cohort::errc::peer_lost);
  CHECK(cohort::clock::now() - t0 < 1s);
}

TEST_CASE("tcp engine: a malformed or oversized frame header is a protocol error") {
  for (int variant = 0; variant < 3; ++variant) {
    engine_raw x;
    std::byte h[8];
    if (variant == 0) {
      tcpd::encode_frame_header(h, tcpd::frame_type::data, 0xffffffffu);  // 4 GiB declared
    } else if (variant == 1) {
      std::mt19937 rng(variant);
      for (auto& b : h) b = static_cast<std::byte>(rng());
    } else {
      tcpd::encode_frame_header(h, tcpd::frame_type::abort, 3);  // too short to be an abort
    }
    x.inject(h, sizeof h);
    std::vector<std::byte> got(16);
    auto r = x.e->recv(1, got);
    std::error_code ec;
    x.e->wait(r, cohort::clock::now() + 5s, ec);
    CHECK(ec == cohort::errc::protocol_error);
  }
}

TEST_CASE("tcp engine: a timeout says timed_out and leaves the stream usable") {
  engine_pair p;
  std::vector<std::byte> got(8);
  auto r = p.b->recv(0, got);
  std::error_code ec;
  const auto t0 = cohort::clock::now();
  p.b->wait(r, t0 + 50ms, ec);
  CHECK(ec == cohort::errc::timed_out);
  CHECK(cohort::clock::now() - t0 >= 50ms);
  CHECK(cohort::clock::now() - t0 < 2s);
  const auto data = pattern(8, 5);
  auto s = p.a->send(1, data);
  p.a->wait(s, cohort::clock::now() + 5s, ec);
  REQUIRE_FALSE(ec);
  p.b->wait(r, cohort::clock::now() + 5s, ec);
  CHECK_FALSE(ec);
  CHECK(got == data);
}

TEST_CASE("tcp engine: abort finishes the half-sent frame, and the peer learns who and why") {
  // A send larger than the socket buffer leaves a frame half written when the sender aborts.
  // Its last wait timed out, so the abort tries only for the grace past that deadline: long
  // enough here for the reader to take the rest of the frame (megabytes) on a loaded machine or
  // under a sanitizer, which the default 10 ms is not.
  engine_pair p(10s);
  const auto big = pattern(8u << 20, 6);
  auto s = p.a->send(1, big);
  std::error_code ec;
  p.a->wait(s, cohort::clock::now() + 20ms, ec);
  CHECK(ec == cohort::errc::timed_out);
  std::vector<std::byte> sink(8u << 20);
  auto r = p.b->recv(0, sink);
  std::thread reader([&] {
    std::error_code e2;
    p.b->wait(r, cohort::clock::now() + 10s, e2);
    CHECK(e2 == cohort::errc::mismatch);  // the code the peer aborted with
  });
  p.a->abort({cohort::make_error_code(cohort::errc::mismatch), 1, "rank 0 saw a different call"});
  reader.join();
  const cohort::failure* f = p.b->remote_failure();
  REQUIRE(f);
  CHECK(f->peer == 0);
  CHECK(f->what == "rank 0 saw a different call");
  CHECK(p.a->remote_failure() == nullptr);
  auto later = p.a->send(1, big);
  p.a->wait(later, cohort::clock::now() + 1s, ec);
  CHECK(ec == cohort::errc::aborted);
}

TEST_CASE("tcp engine: an abort frame behind bytes nobody asked for is still seen") {
  engine_raw x;
  const auto data = pattern(1000, 7);
  x.inject_frame(tcpd::frame_type::data, data);
  std::vector<std::byte> abort_frame(tcpd::frame_header_size + tcpd::max_control_frame);
  abort_frame.resize(
      tcpd::encode_abort(abort_frame.data(), abort_frame.size(), 1,
                         {cohort::make_error_code(cohort::errc::timed_out), 0, "stuck"}));
  x.inject(abort_frame.data(), abort_frame.size());
  // Rank 0 waits for something else entirely (its own send to a peer that does not read):
  // the abort arrives on the stream it is not receiving from.
  std::vector<std::byte> huge(16u << 20);
  auto s = x.e->send(1, huge);
  std::error_code ec;
  x.e->wait(s, cohort::clock::now() + 5s, ec);
  CHECK(ec == cohort::errc::timed_out);
  REQUIRE(x.e->remote_failure());
  CHECK(x.e->remote_failure()->what == "stuck");
}

// Last words: before a wait fails for a reason of this rank's own, it reads what the peers
// still have to say. A rank SIGSTOPped in a call and continued after the others aborted must
// learn their cause (tests/faults: 'stop: a rank SIGCONTed after the others timed out on it ...').

TEST_CASE("tcp engine: last words: a peer lost at the end of its stream, and the abort frame "
          "another peer sent is read before the wait says peer_lost") {
  engine_trio x;
  const auto cause = abort_frame(2, cohort::errc::timed_out, "rank 2 timed out waiting for rank 1");
  x.inject(2, cause.data(), cause.size());
  const auto data = pattern(100, 8);
  std::byte h[tcpd::frame_header_size];
  tcpd::encode_frame_header(h, tcpd::frame_type::data, 100);
  x.inject(1, h, sizeof h);
  x.inject(1, data.data(), data.size());
  x.raw[1].reset();  // rank 1 closed after 100 of the 200 bytes rank 0 waits for
  std::vector<std::byte> got(200);
  auto r = x.e->recv(1, got);
  std::error_code ec;
  x.e->wait(r, cohort::clock::now() + 5s, ec);
  CHECK(ec == cohort::errc::timed_out);  // the code rank 2 aborted with, not peer_lost
  REQUIRE(x.e->remote_failure());
  CHECK(x.e->remote_failure()->peer == 2);
  CHECK(x.e->remote_failure()->what == "rank 2 timed out waiting for rank 1");
}

TEST_CASE("tcp engine: last words: a lost connection is read to its end for the abort frame, "
          "past data nobody asked for") {
  engine_raw x;
  // More than the staging buffer (64 KiB) holds, then the abort frame, then the end.
  const auto data = pattern(150 * 1024, 9);
  x.inject_frame(tcpd::frame_type::data, data);
  const auto cause = abort_frame(1, cohort::errc::timed_out, "rank 1 timed out waiting for rank 0");
  x.inject(cause.data(), cause.size());
  x.raw.reset();
  // Rank 0 sends: the send fails (the peer is gone); what it had said is still to be read.
  const auto mine = pattern(8, 10);
  auto s = x.e->send(1, mine);
  std::error_code ec;
  x.e->wait(s, cohort::clock::now() + 5s, ec);
  CHECK(ec == cohort::errc::timed_out);
  REQUIRE(x.e->remote_failure());
  CHECK(x.e->remote_failure()->what == "rank 1 timed out waiting for rank 0");
}

TEST_CASE("tcp engine: last words: a wait whose deadline passed while the process was stopped "
          "reads the abort frame that came meanwhile, from any peer") {
  engine_trio x;
  const auto cause = abort_frame(2, cohort::errc::mismatch, "rank 2 saw another call");
  x.inject(2, cause.data(), cause.size());
  std::vector<std::byte> got(8);
  auto r = x.e->recv(1, got);  // rank 1 sent nothing: its frame, if any, waits behind data
  std::error_code ec;
  x.e->wait(r, cohort::clock::now() - 1ms, ec);
  CHECK(ec == cohort::errc::mismatch);
  REQUIRE(x.e->remote_failure());
  CHECK(x.e->remote_failure()->peer == 2);
  // With nothing to read anywhere, a passed deadline is timed_out, and the stream stays usable.
  engine_trio quiet;
  auto q = quiet.e->recv(1, got);
  quiet.e->wait(q, cohort::clock::now() - 1ms, ec);
  CHECK(ec == cohort::errc::timed_out);
  CHECK(quiet.e->remote_failure() == nullptr);
  const auto data = pattern(8, 11);
  std::byte h[tcpd::frame_header_size];
  tcpd::encode_frame_header(h, tcpd::frame_type::data, 8);
  quiet.inject(1, h, sizeof h);
  quiet.inject(1, data.data(), data.size());
  quiet.e->wait(q, cohort::clock::now() + 5s, ec);
  CHECK_FALSE(ec);
  CHECK(got == data);
}

// ---------------------------------------------------------------------------------------------
// Stores

namespace {

void exercise_store(cohort::store& a, cohort::store& b) {
  const auto soon = cohort::clock::now() + 5s;
  a.set("x", "1");
  CHECK(b.try_get("x") == std::optional<std::string>("1"));
  CHECK_FALSE(b.try_get("absent").has_value());
  CHECK(a.add("n", 5) == 5);
  CHECK(b.add("n", -2) == 3);
  CHECK(a.try_get("n") == std::optional<std::string>("3"));
  const std::string binary("a\0b\xff", 4);
  b.set("bin/ary key", binary);
  CHECK(a.get("bin/ary key", soon) == binary);
  std::thread later([&] {
    std::this_thread::sleep_for(30ms);
    b.set("late", "here");
  });
  CHECK(a.get("late", soon) == "here");
  later.join();
  const std::vector<std::string> keys = {"x", "k1", "late", "k2"};
  std::error_code ec;
  const auto t0 = cohort::clock::now();
  const auto missing = a.wait(keys, t0 + 100ms, ec);
  CHECK(ec == cohort::errc::timed_out);
  CHECK(missing == std::vector<std::string>{"k1", "k2"});
  CHECK(cohort::clock::now() - t0 < 3s);
  CHECK_THROWS_AS(a.get("never", cohort::clock::now() + 10ms), cohort::error);
  b.set("x", "replaced");
  CHECK(a.try_get("x") == std::optional<std::string>("replaced"));
}

}  // namespace

TEST_CASE("tcp store: set, get, add, wait with deadlines") {
  cohort::tcp_store_server server("127.0.0.1", 0, {.token = {}, .log = [](std::string_view) {}});
  cohort::tcp_store a("127.0.0.1", server.port()), b("127.0.0.1", server.port());
  exercise_store(a, b);
}

TEST_CASE("tcp store: strangers and wrong tokens are turned away, the store goes on") {
  log_sink sink;
  cohort::tcp_store_server server("127.0.0.1", 0, {.token = "t0k", .log = sink.fn()});
  net::endpoint e;
  REQUIRE(net::numeric_endpoint("127.0.0.1", server.port(), e));
  std::error_code ec;
  auto junk = net::connect_to(e, cohort::clock::now() + 5s, ec);
  REQUIRE_FALSE(ec);
  std::mt19937 rng(42);
  std::vector<char> noise(4096);
  for (auto& c : noise) c = static_cast<char>(rng());
  net::send_all(junk.get(), noise.data(), noise.size(), cohort::clock::now() + 5s, ec);
  auto silent = net::connect_to(e, cohort::clock::now() + 5s, ec);  // says nothing at all
  cohort::tcp_store wrong("127.0.0.1", server.port(), {.token = "nope", .timeout = 5s});
  CHECK_THROWS_AS(wrong.set("k", "v"), cohort::error);
  CHECK(wrong.last_error().find("COHORT_TOKEN") != std::string::npos);
  cohort::tcp_store right("127.0.0.1", server.port(), {.token = "t0k", .timeout = 5s});
  right.set("k", "v");
  CHECK(right.try_get("k") == std::optional<std::string>("v"));
  // A declared value over the limit is refused from its header alone.
  auto big = net::connect_to(e, cohort::clock::now() + 5s, ec);
  namespace w = cohort::detail::store_wire;
  const w::nonce mine{};
  std::byte hello[w::hello_size], challenge[w::hello_size], verdict[w::verdict_size];
  w::encode_hello(hello, 0, mine);
  net::send_all(big.get(), hello, sizeof hello, cohort::clock::now() + 5s, ec);
  net::recv_all(big.get(), challenge, sizeof challenge, cohort::clock::now() + 5s, ec);
  REQUIRE_FALSE(ec);
  const auto proof = w::client_proof("t0k", mine, w::nonce_of(challenge));
  net::send_all(big.get(), proof.data(), proof.size(), cohort::clock::now() + 5s, ec);
  net::recv_all(big.get(), verdict, sizeof verdict, cohort::clock::now() + 5s, ec);
  REQUIRE_FALSE(ec);
  CHECK(verdict[8] == std::byte{0});
  std::byte req[w::request_size];
  w::encode_request(req, w::op::set, 1, 0, 0);
  w::store_le<std::uint32_t>(req + 8, 0x7fffffff);
  net::send_all(big.get(), req, sizeof req, cohort::clock::now() + 5s, ec);
  char answer[16];  // a reply's size: the server closes before any reply comes
  net::recv_all(big.get(), answer, sizeof answer, cohort::clock::now() + 5s, ec);
  CHECK(ec == cohort::errc::peer_lost);
  CHECK(right.add("n", 1) == 1);
  CHECK(sink.contains("bad magic"));
  CHECK(sink.contains("wrong token"));
  CHECK(sink.contains("malformed request"));
}

namespace {

// A store server on a port held free for it (tests/ports.hpp), started `delay` after this is
// made; and a client of it (the store's own timeout 10 s) made at once, before the server.
struct server_that_starts_late {
  int port = cohort::test::free_port();
  cohort::tcp_store early{"127.0.0.1", port, {.token = {}, .timeout = 10s}};
  std::unique_ptr<cohort::tcp_store_server> server;
  std::thread starter;

  explicit server_that_starts_late(std::chrono::milliseconds delay)
      : starter([this, delay] {
          std::this_thread::sleep_for(delay);
          server = std::make_unique<cohort::tcp_store_server>(
              "127.0.0.1", port,
              cohort::tcp_store_server_options{.token = {}, .log = [](std::string_view) {}});
        }) {}
  ~server_that_starts_late() {
    if (starter.joinable()) starter.join();
    early.disconnect();  // else the server lingers for it when destroyed
  }
};

long long ms_since(cohort::deadline t0) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(cohort::clock::now() - t0).count();
}

}  // namespace

TEST_CASE("tcp store: a client may start before the server") {
  server_that_starts_late late(200ms);
  late.early.set("k", "v");
  late.starter.join();
  CHECK(late.early.try_get("k") == std::optional<std::string>("v"));
}

TEST_CASE("tcp store: a wait that had to wait for its server to start still ends at its "
          "deadline, not that much later") {
  server_that_starts_late late(1s);
  const std::vector<std::string> keys = {"never"};
  std::error_code ec;
  const auto t0 = cohort::clock::now();
  const auto missing = late.early.wait(keys, t0 + 1200ms, ec);
  const long long took = ms_since(t0);
  INFO("took ", took, " ms: ", late.early.last_error());
  CHECK(ec == cohort::errc::timed_out);
  CHECK(missing == keys);
  // The server heard of the wait after about 1.1 s: held for the 1.2 s it was asked at the
  // start, it would answer at about 2.3 s.
  CHECK(took < 1900);
}

namespace {

// A client (with the store's own timeout of 30 s) that set "k" at a server, which then went
// away without lingering; the client is still connected to it.
struct client_of_a_gone_store {
  std::optional<cohort::tcp_store_server> server{
      std::in_place, "127.0.0.1", 0,
      cohort::tcp_store_server_options{.token = {}, .log = [](std::string_view) {}}};
  cohort::tcp_store client{"127.0.0.1", server->port(), {.token = {}, .timeout = 30s}};

  client_of_a_gone_store() {
    client.set("k", "v");
    CHECK(client.try_get("k", cohort::clock::now() + 1s) == std::optional<std::string>("v"));
    server->set_linger(0ms);
    server.reset();
  }
};

}  // namespace

TEST_CASE("tcp store: a try_get with a deadline gives up at it when the store went away, "
          "however long the store's own timeout") {
  client_of_a_gone_store gone;
  std::error_code ec;
  const auto t0 = cohort::clock::now();
  const auto v = gone.client.try_get("k", t0 + 300ms, ec);
  const long long took = ms_since(t0);
  CHECK_FALSE(v);
  CHECK(ec);
  INFO("took ", took, " ms: ", gone.client.last_error());
  CHECK(took < 3000);  // the bound (300 ms), not the store's 30 s
}

TEST_CASE("tcp store: a wait gives up at its deadline when the store went away; the moment "
          "past it is for the server's answer, not for reconnecting") {
  client_of_a_gone_store gone;
  gone.client.disconnect();  // so that the wait must connect (else it learns of the loss at once)
  const std::vector<std::string> keys = {"k", "missing"};
  std::error_code ec;
  const auto t0 = cohort::clock::now();
  const auto missing = gone.client.wait(keys, t0 + 300ms, ec);
  const long long took = ms_since(t0);
  INFO("took ", took, " ms: ", gone.client.last_error());
  CHECK(ec == cohort::errc::timed_out);
  CHECK(missing == keys);  // nothing known: every key is reported missing
  CHECK(gone.client.last_error().find("127.0.0.1:") != std::string::npos);
  CHECK(took < 1500);  // the deadline (300 ms), not the answer's 2 s past it
}

TEST_CASE("file store: set, get, add, wait with deadlines") {
  temp_dir d;
  cohort::file_store a(d.path), b(d.path + "/");
  exercise_store(a, b);
  // add is atomic across clients.
  std::vector<std::thread> ts;
  for (int i = 0; i < 4; ++i)
    ts.emplace_back([&] {
      cohort::file_store s(d.path);
      for (int k = 0; k < 25; ++k) s.add("counter", 1);
    });
  for (auto& t : ts) t.join();
  CHECK(a.try_get("counter") == std::optional<std::string>("100"));
}

TEST_CASE("file store: a directory it makes is 0700 and its keys 0600; one others may write, or "
          "another user's, is refused; a job without a token leaves no key behind") {
  temp_dir d;
  const auto mode_of = [](const std::string& path) {
    struct stat st {};
    REQUIRE(::stat(path.c_str(), &st) == 0);
    return st.st_mode & 07777;
  };
  const mode_t old = ::umask(0);  // the modes must not depend on the umask
  {
    cohort::file_store s(d.path + "/made/here");
    s.set("cohort/job/token", "secret");
    s.add("n", 1);
    CHECK(mode_of(d.path + "/made/here") == 0700);
    CHECK(mode_of(d.path + "/made/here/cohort%2Fjob%2Ftoken") == 0600);
    CHECK(mode_of(d.path + "/made/here/n") == 0600);
    CHECK(mode_of(d.path + "/made/here/n.lock") == 0600);
    s.remove("n");
    s.remove("absent");
    CHECK(!std::filesystem::exists(d.path + "/made/here/n"));
    CHECK(!std::filesystem::exists(d.path + "/made/here/n.lock"));
  }
  ::umask(old);
  for (mode_t wide : {mode_t{0777}, mode_t{0770}, mode_t{01777}}) {
    const std::string dir = d.path + "/wide" + std::to_string(wide);
    REQUIRE(::mkdir(dir.c_str(), 0700) == 0);
    REQUIRE(::chmod(dir.c_str(), wide) == 0);
    try {
      cohort::file_store s(dir);
      FAIL("a directory of mode " << wide << " was taken");
    } catch (const cohort::error& e) {
      CHECK(e.code() == std::errc::permission_denied);
      CHECK(std::string(e.what()).find(dir) != std::string::npos);
    }
  }
  if (::geteuid() == 0) {  // another user's directory, closed to everyone else
    const std::string dir = d.path + "/theirs";
    REQUIRE(::mkdir(dir.c_str(), 0700) == 0);
    REQUIRE(::chown(dir.c_str(), 65534, 65534) == 0);
    try {
      cohort::file_store s(dir);
      FAIL("another user's directory was taken");
    } catch (const cohort::error& e) {
      CHECK(e.code() == std::errc::permission_denied);
      CHECK(std::string(e.what()).find("uid 65534") != std::string::npos);
    }
  }
  // Without a token rank 0 puts one in the store; once the job connected no rank's key is left.
  const std::string dir = d.path + "/job";
  for (int p : {2, 3}) {
    CHECK_NOTHROW(run_tcp(
        p, unique_job("keys"), loopback_options(),
        [&](int) { return std::make_unique<cohort::file_store>(dir); },
        [&](auto& comm) {
          std::vector<float> v(100, 1.0f);
          cohort::all_reduce(comm, v, cohort::ops::sum);
          CHECK(v[0] == static_cast<float>(p));
        }));
    std::vector<std::string> left;
    for (const auto& e : std::filesystem::directory_iterator(dir))
      left.push_back(e.path().filename().string());
    INFO("left in the store: ", left.size() ? left.front() : std::string());
    CHECK(left.empty());
  }
}

TEST_CASE("tcp setup: a store port that is taken (torchrun's own store on MASTER_PORT) is a clear "
          "error that says to set COHORT_STORE") {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
  REQUIRE(::listen(fd, 16) == 0);
  REQUIRE(::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0);
  const int port = ntohs(a.sin_port);
  ::setenv("TORCHELASTIC_RUN_ID", "unit", 1);
  auto info = info_for(0, 2, unique_job("taken"));
  info.master_addr = "127.0.0.1";
  info.master_port = port;
  auto opts = loopback_options();
  opts.connect_timeout = 5s;
  const auto t0 = cohort::clock::now();
  try {
    auto comm = cohort::make_tcp_communicator(info, opts);
    FAIL("rank 0 hosted a store on a taken port");
  } catch (const cohort::error& e) {
    const std::string what = e.what();
    INFO(what);
    CHECK(e.code() == cohort::errc::invalid_argument);
    CHECK(what.find("torchrun") != std::string::npos);
    CHECK(what.find("COHORT_STORE=127.0.0.1:") != std::string::npos);
    CHECK(what.find("COHORT_STORE=file:") != std::string::npos);
  }
  CHECK(cohort::clock::now() - t0 < 2s);
  ::unsetenv("TORCHELASTIC_RUN_ID");
  ::close(fd);
}

#if defined(COHORT_WITH_HIREDIS)
TEST_CASE("redis store: set, get, add, wait with deadlines (against a real redis-server)") {
  const char* candidates[] = {"/usr/bin/redis-server", "/usr/sbin/redis-server",
                              "/usr/local/bin/redis-server"};
  const char* server = nullptr;
  for (const char* c : candidates)
    if (::access(c, X_OK) == 0) server = c;
  if (!server) {
    std::fprintf(stderr, "SKIP: redis-server is not installed (Debian: redis-server)\n");
    std::_Exit(77);
  }
  int port = 0;
  {
    cohort::tcp_store_server probe("127.0.0.1", 0);  // a free port, released just below
    port = probe.port();
  }
  temp_dir d;
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    const std::string p = std::to_string(port);
    ::execl(server, server, "--bind", "127.0.0.1", "--port", p.c_str(), "--save", "",
            "--appendonly", "no", "--dir", d.path.c_str(), "--protected-mode", "yes", "--loglevel",
            "warning", static_cast<char*>(nullptr));
    std::_Exit(127);
  }
  struct reaper {
    pid_t pid;
    ~reaper() {
      ::kill(pid, SIGTERM);
      ::waitpid(pid, nullptr, 0);
    }
  } reap{pid};
  std::unique_ptr<cohort::redis_store> a, b;
  const auto until = cohort::clock::now() + 10s;
  while (!a) {
    try {
      a = std::make_unique<cohort::redis_store>(
          "127.0.0.1", port,
          cohort::redis_store_options{.prefix = "t/", .password = {}, .timeout = 2s});
    } catch (const cohort::error&) {
      REQUIRE(cohort::clock::now() < until);
      std::this_thread::sleep_for(20ms);
    }
  }
  b = std::make_unique<cohort::redis_store>(
      "127.0.0.1", port,
      cohort::redis_store_options{.prefix = "t/", .password = {}, .timeout = 2s});
  exercise_store(*a, *b);
  // A whole job can meet there too.
  const std::string job = unique_job("redis");
  run_tcp(
      3, job, loopback_options(),
      [&](int) {
        return std::make_unique<cohort::redis_store>(
            "127.0.0.1", port,
            cohort::redis_store_options{.prefix = "j/", .password = {}, .timeout = 5s});
      },
      [](auto& comm) {
        ct::check<float>(comm, ct::kind::all_reduce, cohort::ops::sum, 1000, 0, 3);
      });
}
#else
TEST_CASE("redis store: set, get, add, wait with deadlines (against a real redis-server)") {
  std::fprintf(stderr, "SKIP: built without hiredis (Debian: libhiredis-dev)\n");
  std::_Exit(77);
}
#endif

// ---------------------------------------------------------------------------------------------
// Whole jobs, ranks as threads

TEST_CASE("tcp job: the collective suite over IPv4 and IPv6 loopback, ranks as threads") {
  for (bool v6 : {false, true}) {
    for (int p : {2, 3}) {
      INFO("IPv", v6 ? 6 : 4, " P=", p);
      temp_dir d;
      CHECK_NOTHROW(run_tcp(
          p, unique_job("suite"), loopback_options(nullptr, v6),
          [&](int) { return std::make_unique<cohort::file_store>(d.path); },
          [&](auto& comm) {
            if (v6)
              CHECK(comm.transport().peer_address((comm.rank() + 1) % p).starts_with("[::1]"));
            for (std::size_t n :
                 {std::size_t(0), std::size_t(1), std::size_t(1025), std::size_t(3 * 65536 + 7)})
              for (ct::kind k : ct::every_kind)
                ct::check<float>(comm, k, cohort::ops::sum, n, static_cast<int>(n % p), 11 + n);
          }));
    }
  }
}

namespace {

// The address a rank published under `key` in `store` (waiting up to 10 s for it).
net::endpoint published_endpoint(cohort::store& store, const std::string& key) {
  const auto a = tcpd::parse_address(store.get(key, cohort::clock::now() + 10s));
  REQUIRE(a);
  net::endpoint e;
  REQUIRE(net::numeric_endpoint(a->host, a->port, e));
  return e;
}

// Connects to the rank whose address `store` holds under `key`, as a rank played by hand.
net::unique_fd connect_to_published(cohort::store& store, const std::string& key) {
  std::error_code ec;
  auto fd = net::connect_to(published_endpoint(store, key), cohort::clock::now() + 5s, ec);
  REQUIRE_FALSE(ec);
  return fd;
}

}  // namespace

TEST_CASE("tcp job: a peer's malformed address fails the setup, naming the peer and the text") {
  temp_dir d;
  const std::string job = unique_job("malformed");
  auto o = loopback_options();
  o.token = "t";  // else rank 1 would wait for the token rank 0 publishes
  o.connect_timeout = 10s;
  cohort::file_store s(d.path);
  s.set("cohort/" + job + "/addr/0", "127.0.0.1 4000 two");
  const auto t0 = cohort::clock::now();
  try {
    auto comm = cohort::make_tcp_communicator(info_for(1, 2, job), s, o);
    FAIL("the setup went on with a malformed address");
  } catch (const cohort::error& e) {
    CHECK(e.code() == cohort::errc::protocol_error);
    CHECK(e.peer() == 0);
    const std::string what = e.what();
    INFO(what);
    CHECK(what.find("rank 0 published a malformed address \"127.0.0.1 4000 two\"") !=
          std::string::npos);
  }
  CHECK(cohort::clock::now() - t0 < 5s);  // at once, not at the deadline
}

TEST_CASE("tcp job: a stranger's bytes and a wrong token are refused, the job completes") {
  temp_dir d;
  log_sink sink;
  auto opts = loopback_options(&sink);
  opts.token = "the-right-token";
  opts.handshake_timeout = 10s;  // a silent stranger must not hold the job for this long
  const std::string job = unique_job("stranger");
  std::atomic<bool> strangers_done{false};
  std::thread stranger([&] {
    cohort::file_store s(d.path);
    const net::endpoint e = published_endpoint(s, "cohort/" + job + "/addr/0");
    std::error_code ec;
    std::vector<net::unique_fd> held;
    // Random bytes.
    auto a = net::connect_to(e, cohort::clock::now() + 5s, ec);
    std::mt19937 rng(7);
    std::vector<char> noise(300);
    for (auto& c : noise) c = static_cast<char>(rng());
    net::send_all(a.get(), noise.data(), noise.size(), cohort::clock::now() + 5s, ec);
    held.push_back(std::move(a));
    // A proper hello with the wrong token, claiming a rank that exists.
    auto b = net::connect_to(e, cohort::clock::now() + 5s, ec);
    const auto h = tcpd::encode_hello({2, 3, job, "wrong-token"});
    net::send_all(b.get(), h.data(), h.size(), cohort::clock::now() + 5s, ec);
    held.push_back(std::move(b));
    // Silence.
    held.push_back(net::connect_to(e, cohort::clock::now() + 5s, ec));
    std::this_thread::sleep_for(100ms);
    strangers_done = true;
    std::this_thread::sleep_for(1s);  // keep them open while the job sets up
  });
  const auto t0 = cohort::clock::now();
  CHECK_NOTHROW(run_tcp(
      3, job, opts, [&](int) { return std::make_unique<cohort::file_store>(d.path); },
      [&](auto& comm) {
        ct::check<float>(comm, ct::kind::all_reduce, cohort::ops::sum, 100'000, 0, 5);
        ct::check<std::int32_t>(comm, ct::kind::all_gather, cohort::ops::sum, 1000, 0, 6);
      },
      {0ms, 0ms, 600ms}));  // rank 2 comes late: rank 0 is still accepting
  stranger.join();
  CHECK(strangers_done);
  CHECK(cohort::clock::now() - t0 < 8s);
  INFO(sink.all());
  CHECK(sink.contains("bad magic"));
  CHECK(sink.contains("wrong token"));
}

TEST_CASE("tcp job: a rank with the wrong token cannot join") {
  temp_dir d;
  log_sink sink;
  const std::string job = unique_job("token");
  std::vector<std::string> errors(2);
  std::vector<std::thread> ts;
  for (int r = 0; r < 2; ++r)
    ts.emplace_back([&, r] {
      auto o = loopback_options(&sink);
      o.token = r == 0 ? "alpha" : "beta";
      o.connect_timeout = 1500ms;
      cohort::file_store s(d.path);
      try {
        auto comm = cohort::make_tcp_communicator(info_for(r, 2, job), s, o);
      } catch (const cohort::error& e) {
        errors[r] = e.what();
      }
    });
  for (auto& t : ts) t.join();
  INFO(errors[0], " | ", errors[1]);
  CHECK(errors[1].find("COHORT_TOKEN") != std::string::npos);
  CHECK(sink.contains("wrong token"));
}

TEST_CASE("tcp job: a rank that never arrives is named in timed_out") {
  temp_dir d;
  const std::string job = unique_job("missing");
  auto o = loopback_options();
  o.connect_timeout = 700ms;
  std::vector<std::optional<cohort::error>> errs(3);
  std::vector<std::thread> ts;
  for (int r : {0, 2})  // rank 1 never comes
    ts.emplace_back([&, r] {
      cohort::file_store s(d.path);
      try {
        auto comm = cohort::make_tcp_communicator(info_for(r, 3, job), s, o);
      } catch (const cohort::error& e) {
        errs[r] = e;
      }
    });
  for (auto& t : ts) t.join();
  for (int r : {0, 2}) {
    REQUIRE(errs[r]);
    CHECK(errs[r]->code() == cohort::errc::timed_out);
    CHECK(errs[r]->peer() == 1);
    CHECK(std::string(errs[r]->what()).find("rank 1 never arrived") != std::string::npos);
  }
}

TEST_CASE("tcp job: abort reaches every peer with who and why") {
  temp_dir d;
  const std::string job = unique_job("abort");
  std::vector<std::string> what(3);
  std::vector<std::error_code> codes(3);
  std::vector<int> peers(3, -2);
  run_tcp(
      3, job, loopback_options(), [&](int) { return std::make_unique<cohort::file_store>(d.path); },
      [&](auto& comm) {
        cohort::barrier(comm);
        if (comm.rank() == 1) {
          // Let the others leave the barrier: an abort fails every wait, even one whose
          // bytes are on their way.
          std::this_thread::sleep_for(200ms);
          comm.abort("rank 1 ran out of memory");
          return;
        }
        std::vector<float> x(1000, 1.0f);
        std::error_code ec;
        cohort::all_reduce(comm, x, cohort::ops::sum, {.timeout = 10s}, ec);
        codes[comm.rank()] = ec;
        if (comm.last_failure()) {
          what[comm.rank()] = comm.last_failure()->what;
          peers[comm.rank()] = comm.last_failure()->peer;
        }
      });
  for (int r : {0, 2}) {
    INFO("rank ", r, ": ", what[r]);
    CHECK(codes[r] == cohort::errc::aborted);
    CHECK(peers[r] == 1);
    CHECK(what[r].find("rank 1 ran out of memory") != std::string::npos);
  }
}

TEST_CASE(
    "tcp job: a rank that leaves mid-collective is peer_lost at the survivors, within the "
    "deadline") {
  temp_dir d;
  const std::string job = unique_job("lost");
  std::vector<std::error_code> codes(3);
  std::vector<cohort::clock::duration> took(3);
  run_tcp(
      3, job, loopback_options(), [&](int) { return std::make_unique<cohort::file_store>(d.path); },
      [&](auto& comm) {
        std::vector<float> x(1 << 20, 1.0f);
        cohort::all_reduce(comm, x, cohort::ops::sum);
        if (comm.rank() == 1) return;  // closes its sockets while the others are in all_reduce
        std::error_code ec;
        const auto t0 = cohort::clock::now();
        for (int i = 0; i < 20 && !ec; ++i)
          cohort::all_reduce(comm, x, cohort::ops::sum, {.timeout = 20s}, ec);
        took[comm.rank()] = cohort::clock::now() - t0;
        codes[comm.rank()] = ec;
      });
  for (int r : {0, 2}) {
    INFO("rank ", r, ": ", codes[r].message());
    CHECK(codes[r] == cohort::errc::peer_lost);
    CHECK(took[r] < 5s);
  }
}

namespace {

// A listening socket on 127.0.0.1 at a port the kernel picks: a rank played by hand.
struct hand_listener {
  net::unique_fd fd{::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0)};
  int port = 0;
  hand_listener() {
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    REQUIRE(::bind(fd.get(), reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
    REQUIRE(::listen(fd.get(), 8) == 0);
    socklen_t len = sizeof a;
    ::getsockname(fd.get(), reinterpret_cast<sockaddr*>(&a), &len);
    port = ntohs(a.sin_port);
  }
};

// What rank 1 told the hand-played rank 2 on `fd` once it gave up: a leaving answer, or (when
// it had answered the hello before it gave up) its hello and then an abort frame. Either way the
// failure it relays; nullopt (and why, in `what`) when the connection ended without one.
std::optional<cohort::failure> told_why(int fd, const std::string& job, std::string& what) {
  std::array<std::byte, tcpd::hello_size> answer{};
  std::error_code ec;
  net::recv_all(fd, answer.data(), answer.size(), cohort::clock::now() + 10s, ec);
  if (ec) {
    what = "no answer to the hello: " + ec.message();
    return std::nullopt;
  }
  if (auto left = tcpd::decode_leaving(answer, 3)) return left;
  tcpd::hello peer;
  if (const auto why = tcpd::check_hello(answer, job, 3, "t", peer); !why.empty()) {
    what = "an answer that is neither a leaving answer nor a hello: " + why;
    return std::nullopt;
  }
  std::byte header[tcpd::frame_header_size];
  net::recv_all(fd, header, sizeof header, cohort::clock::now() + 10s, ec);
  const auto h = ec ? std::nullopt : tcpd::decode_frame_header(header);
  if (!h || h->type != tcpd::frame_type::abort) {
    what = "a hello, then no abort frame";
    return std::nullopt;
  }
  std::vector<std::byte> payload(h->length);
  net::recv_all(fd, payload.data(), payload.size(), cohort::clock::now() + 10s, ec);
  if (ec) return std::nullopt;
  return tcpd::decode_abort(payload.data(), h->length, 3);
}

}  // namespace

// Rank 1 of three gives up while rank 2's hello waits for its answer. Closed unanswered, the
// socket would reset and rank 2 would report rank 1 lost, a live rank (the flake this guards).
TEST_CASE("tcp job: a rank that gives up tells a rank whose hello waits for its answer why") {
  temp_dir d;
  const std::string job = unique_job("leaving");
  const std::string addr = "cohort/" + job + "/addr/";
  auto o = loopback_options();
  o.token = "t";
  o.connect_timeout = 10s;
  std::optional<cohort::error> err;
  auto rank1 = [&] {
    cohort::file_store s(d.path);
    try {
      auto comm = cohort::make_tcp_communicator(info_for(1, 3, job), s, o);
    } catch (const cohort::error& e) {
      err = e;
    }
  };
  const auto hello2 = tcpd::encode_hello({2, 3, job, "t"});
  std::error_code ec;
  std::string what;

  SUBCASE("the hello is in the listen queue: rank 0 says the job has 4 ranks") {
    std::thread t(rank1);
    cohort::file_store s(d.path);
    auto c = connect_to_published(s, addr + "1");  // rank 1 waits for the others' addresses
    net::send_all(c.get(), hello2.data(), hello2.size(), cohort::clock::now() + 5s, ec);
    REQUIRE_FALSE(ec);
    s.set(addr + "0", tcpd::format_address({"127.0.0.1", 1, 4}));
    const auto f = told_why(c.get(), job, what);
    t.join();
    REQUIRE(err);
    CHECK(err->code() == cohort::errc::invalid_argument);
    INFO(what);
    REQUIRE(f);
    CHECK(f->peer == 1);
    CHECK(f->code == cohort::errc::invalid_argument);
    CHECK(f->what.find("rank 0 says the job has 4 ranks") != std::string::npos);
  }

  SUBCASE("the hello comes as rank 1 loses rank 0 mid-handshake") {
    hand_listener rank0, rank2;
    std::thread t(rank1);
    cohort::file_store s(d.path);
    s.set(addr + "0", tcpd::format_address({"127.0.0.1", rank0.port, 3}));
    s.set(addr + "2", tcpd::format_address({"127.0.0.1", rank2.port, 3}));
    auto c = connect_to_published(s, addr + "1");
    REQUIRE(net::wait_fd(rank0.fd.get(), POLLIN, cohort::clock::now() + 10s));
    net::unique_fd from1(::accept4(rank0.fd.get(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC));
    REQUIRE(from1);
    std::array<std::byte, tcpd::hello_size> theirs{};
    net::recv_all(from1.get(), theirs.data(), theirs.size(), cohort::clock::now() + 10s, ec);
    REQUIRE_FALSE(ec);
    const linger reset{1, 0};  // rank 0 dies: its end resets
    ::setsockopt(from1.get(), SOL_SOCKET, SO_LINGER, &reset, sizeof reset);
    from1.reset();
    net::send_all(c.get(), hello2.data(), hello2.size(), cohort::clock::now() + 5s, ec);
    REQUIRE_FALSE(ec);
    const auto f = told_why(c.get(), job, what);
    t.join();
    REQUIRE(err);
    CHECK(err->code() == cohort::errc::peer_lost);
    CHECK(err->peer() == 0);
    INFO(what);
    REQUIRE(f);
    CHECK(f->peer == 1);
    CHECK(f->code == cohort::errc::peer_lost);
    CHECK(f->what.find("lost rank 0 ") != std::string::npos);
  }
}

TEST_CASE("tcp job: ranks that call different collectives are told so by name, on every rank") {
  temp_dir d;
  std::vector<std::error_code> codes(3);
  std::vector<std::string> what(3);
  run_tcp(
      3, unique_job("mismatch"), loopback_options(),
      [&](int) { return std::make_unique<cohort::file_store>(d.path); },
      [&](auto& comm) {
        std::vector<float> x(4096, 1.0f), all(3 * 4096);
        std::error_code ec;
        if (comm.rank() == 2)
          cohort::all_gather(comm, x, all, {.timeout = 10s}, ec);
        else
          cohort::all_reduce(comm, x, cohort::ops::sum, {.timeout = 10s}, ec);
        codes[comm.rank()] = ec;
        if (comm.last_failure()) what[comm.rank()] = comm.last_failure()->what;
      });
  for (int r = 0; r < 3; ++r) {
    INFO("rank ", r, ": ", what[r]);
    CHECK(codes[r] == cohort::errc::mismatch);
    CHECK(what[r].find("all_gather") != std::string::npos);
  }
}

TEST_CASE("tcp job: small rooted calls back to back: roots run ahead, every result right") {
  // The root of a small broadcast and the first rank of a small reduce only send: they return
  // once the kernel took their bytes, without waiting for their left neighbour, whose header a
  // later call compares. Many such calls in a row, with the roots moving, must still give every
  // rank the right bytes.
  for (int p : {2, 4}) {
    temp_dir d;
    std::vector<std::string> errors(p);
    run_tcp(
        p, unique_job("ahead"), loopback_options(),
        [&](int) { return std::make_unique<cohort::file_store>(d.path); },
        [&](auto& comm) {
          const int r = comm.rank();
          for (int i = 0; i < 200 && errors[r].empty(); ++i) {
            const int root = (i / 7) % p;
            const std::size_t n = static_cast<std::size_t>(1 + i % 5) * 800;  // up to 16000 B
            std::vector<int> x(n, r == root ? i : -1);
            cohort::broadcast(comm, x, root, {.timeout = 10s});
            for (int v : x)
              if (v != i) errors[r] = "broadcast " + std::to_string(i) + " gave " + std::to_string(v);
            std::vector<int> y(n, r + i), sum(n, -1);
            cohort::reduce(comm, y, sum, cohort::ops::sum, root, {.timeout = 10s});
            if (r == root)
              for (int v : sum)
                if (v != p * i + p * (p - 1) / 2)
                  errors[r] = "reduce " + std::to_string(i) + " gave " + std::to_string(v);
          }
        });
    for (int r = 0; r < p; ++r) {
      INFO("P=", p, " rank ", r);
      CHECK(errors[r] == "");
    }
  }
}

TEST_CASE("tcp job: two ranks that both call themselves the root of small broadcasts: mismatch "
          "within the calls they may run ahead, naming both, not at the deadline") {
  // 1 KiB, and the most a root may send without waiting (eager_send_bytes): four such calls
  // must fit what the other rank holds without posting a receive.
  for (std::size_t bytes : {std::size_t{1024}, cohort::tcp_transport::eager_send_bytes}) {
    INFO(bytes, " bytes a call");
    temp_dir d;
    std::vector<std::error_code> codes(2);
    std::vector<std::string> what(2);
    std::vector<cohort::clock::duration> took(2);
    run_tcp(
        2, unique_job("roots"), loopback_options(),
        [&](int) { return std::make_unique<cohort::file_store>(d.path); },
        [&](auto& comm) {
          std::vector<float> x(bytes / sizeof(float), 1.0f);
          std::error_code ec;
          const auto t0 = cohort::clock::now();
          for (int i = 0; i < 100 && !ec; ++i)
            cohort::broadcast(comm, x, comm.rank(), {.timeout = 10s}, ec);
          took[comm.rank()] = cohort::clock::now() - t0;
          codes[comm.rank()] = ec;
          if (comm.last_failure()) what[comm.rank()] = comm.last_failure()->what;
        });
    for (int r = 0; r < 2; ++r) {
      INFO("rank ", r, ": ", what[r]);
      CHECK(codes[r] == cohort::errc::mismatch);
      CHECK(took[r] < 5s);
      CHECK(what[r].find("from root 0") != std::string::npos);
      CHECK(what[r].find("from root 1") != std::string::npos);
    }
  }
}

TEST_CASE("tcp job: one rank needs no store and no socket") {
  cohort::launch_info info = info_for(0, 1, "solo");
  auto comm = cohort::make_tcp_communicator(info);
  std::vector<float> x(10, 2.0f);
  cohort::all_reduce(comm, x, cohort::ops::sum);
  CHECK(x[9] == 2.0f);
  cohort::barrier(comm);
}
