// Strangers at the listeners of a TCP job, ranks as processes: a storm of 1000 connections at
// the store the ranks meet at, and at a rank's own listener, while the job sets up (one rank
// comes late, so the others wait through the storm). Each connection does something hostile:
// random bytes, a truncated hello, oversized length fields, a wrong token, job or magic, a
// claim to be a rank that is already there, a reset, or silence (held open). The job must
// complete with correct results, the listening rank's memory must stay bounded, and every
// rank's descriptors must be back where they were once it is done.
#include "../support.hpp"

#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>

#include <filesystem>
#include <map>
#include <random>

#include "process.hpp"

#include "../collectives/suite.hpp"

namespace ct = cohort::test;
namespace cf = cohort::faults;
namespace tcpd = cohort::detail::tcp;
namespace sw = cohort::detail::store_wire;
using namespace std::chrono_literals;

namespace {

long rss_kib_of(pid_t pid) {
  std::ifstream status("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(status, line))
    if (line.rfind("VmRSS:", 0) == 0) return std::atol(line.c_str() + 6);
  return -1;
}

enum class hostile {
  random_bytes, random_then_hold, silence, truncated_hello, oversized_fields, wrong_token,
  wrong_job, wrong_magic, reset, duplicate_rank, store_oversized_request, store_partial_value
};
constexpr int hostile_kinds = 12;
const char* hostile_name(hostile h) {
  constexpr const char* n[] = {"random bytes", "random bytes, held", "silence", "truncated hello",
                               "oversized length fields", "wrong token", "wrong job", "wrong magic",
                               "reset", "a rank that is already there",
                               "store: oversized request", "store: 256 KiB of a value, held"};
  return n[static_cast<int>(h)];
}

std::string mesh_bytes(hostile h, std::mt19937& rng, const std::string& job, int size) {
  auto hello = [&](int rank, const std::string& j, const std::string& token) {
    const auto b = tcpd::encode_hello({rank, size, j, token});
    return std::string(reinterpret_cast<const char*>(b.data()), b.size());
  };
  std::string s;
  switch (h) {
    case hostile::random_bytes:
    case hostile::random_then_hold:
      s.resize(64 + rng() % 4000);
      for (auto& c : s) c = static_cast<char>(rng());
      break;
    case hostile::truncated_hello: s = hello(1, job, "secret").substr(0, 1 + rng() % 255); break;
    case hostile::oversized_fields: {
      s = hello(1, job, "secret");
      auto* p = reinterpret_cast<std::byte*>(s.data());
      tcpd::store_le<std::uint16_t>(p + 20, 0xffff);
      tcpd::store_le<std::uint16_t>(p + 22, 0xffff);
      tcpd::store_le<std::uint32_t>(p + 16, 0x7fffffff);
      break;
    }
    case hostile::wrong_token: s = hello(1 + static_cast<int>(rng() % 2), job, "guess"); break;
    case hostile::wrong_job: s = hello(1, job + "-other", "secret"); break;
    case hostile::wrong_magic: s = hello(1, job, "secret"); s[0] ^= 0x55; break;
    case hostile::duplicate_rank: s = hello(static_cast<int>(rng() % 2), job, "secret"); break;  // an insider's hello
    default: break;
  }
  return s;
}

std::string store_bytes(hostile h, std::mt19937& rng) {
  std::string hello(sw::hello_size, '\0');
  auto* p = reinterpret_cast<std::byte*>(hello.data());
  sw::store_le<std::uint64_t>(p, sw::magic);
  sw::store_le<std::uint32_t>(p + 8, sw::version);
  std::string s;
  switch (h) {
    case hostile::random_bytes:
    case hostile::random_then_hold:
      s.resize(64 + rng() % 4000);
      for (auto& c : s) c = static_cast<char>(rng());
      break;
    case hostile::truncated_hello: s = hello.substr(0, 1 + rng() % 15); break;
    case hostile::oversized_fields: {
      s = hello;
      sw::store_le<std::uint16_t>(reinterpret_cast<std::byte*>(s.data()) + 12, 0xffff);
      break;
    }
    case hostile::wrong_token: {
      s = hello;
      sw::store_le<std::uint16_t>(reinterpret_cast<std::byte*>(s.data()) + 12, 5);
      s += "guess";
      break;
    }
    case hostile::wrong_magic: s = hello; s[3] ^= 0x55; break;
    case hostile::store_oversized_request: {
      std::byte r[sw::request_size];
      sw::encode_request(r, sw::op::set, 1, 0, 0);
      sw::store_le<std::uint32_t>(r + 8, 0xffffffffu);
      s = hello + std::string(reinterpret_cast<const char*>(r), sizeof r);
      break;
    }
    case hostile::store_partial_value: {
      std::byte r[sw::request_size];
      sw::encode_request(r, sw::op::set, 3, 16u << 20, 0);
      s = hello + std::string(reinterpret_cast<const char*>(r), sizeof r) + "key" + std::string(256 * 1024, 'v');
      break;
    }
    default: break;
  }
  return s;
}

struct storm_result {
  int connected = 0, refused_or_slow = 0;
  std::map<std::string, int> kinds;
  std::vector<int> held;  // descriptors kept open until the job is done
  ~storm_result() {
    for (int fd : held) ::close(fd);
  }
};

// `count` connections at 127.0.0.1:`port`, opened together, each hostile in its own way once
// connected; those that hold stay open in `r.held`. Bounded: what has not connected within 3 s
// (the listener's backlog is full and nobody accepts) is given up.
void storm(int port, int count, bool at_store, const std::string& job, int size, storm_result& r) {
  std::mt19937 rng(12345);
  struct attempt { int fd; hostile h; };
  std::vector<attempt> pending;
  for (int i = 0; i < count; ++i) {
    const auto h = static_cast<hostile>(i % hostile_kinds);
    if (!at_store && (h == hostile::store_oversized_request || h == hostile::store_partial_value)) continue;
    if (at_store && h == hostile::wrong_job) continue;
    // A hello with the right token is an insider, not a stranger (see the impersonation test).
    if (h == hostile::duplicate_rank) continue;
    const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<std::uint16_t>(port));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
    pending.push_back({fd, h});
  }
  const auto until = cf::steady::now() + 3s;
  while (!pending.empty() && cf::steady::now() < until) {
    std::vector<pollfd> pfds;
    for (auto& a : pending) pfds.push_back({a.fd, POLLOUT, 0});
    if (::poll(pfds.data(), pfds.size(), 50) <= 0) continue;
    std::vector<attempt> still;
    for (std::size_t i = 0; i < pending.size(); ++i) {
      const attempt a = pending[i];
      if (pfds[i].revents == 0) {
        still.push_back(a);
        continue;
      }
      int err = 0;
      socklen_t len = sizeof err;
      if (::getsockopt(a.fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0 || err != 0) {
        ++r.refused_or_slow;
        ::close(a.fd);
        continue;
      }
      ++r.connected;
      ++r.kinds[hostile_name(a.h)];
      ::fcntl(a.fd, F_SETFL, ::fcntl(a.fd, F_GETFL) & ~O_NONBLOCK);
      timeval tv{1, 0};
      ::setsockopt(a.fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
      const std::string bytes = at_store ? store_bytes(a.h, rng) : mesh_bytes(a.h, rng, job, size);
      std::size_t done = 0;
      while (done < bytes.size()) {
        const ssize_t n = ::send(a.fd, bytes.data() + done, bytes.size() - done, MSG_NOSIGNAL);
        if (n <= 0) break;
        done += static_cast<std::size_t>(n);
      }
      if (a.h == hostile::reset) {
        linger l{1, 0};
        ::setsockopt(a.fd, SOL_SOCKET, SO_LINGER, &l, sizeof l);
        ::close(a.fd);
      } else if (a.h == hostile::random_bytes || a.h == hostile::wrong_magic) {
        ::close(a.fd);
      } else {
        r.held.push_back(a.fd);
      }
    }
    pending.swap(still);
  }
  for (auto& a : pending) {
    ++r.refused_or_slow;
    ::close(a.fd);
  }
}

// A store that takes `delay` before each try_get: a rank slow to read its peers' addresses, so
// that the others wait for its connection with their listeners accepting.
class slow_store final : public cohort::store {
 public:
  slow_store(cohort::store& inner, std::chrono::milliseconds delay) : inner_(inner), delay_(delay) {}

 protected:
  void do_set(std::string_view k, std::string_view v, std::error_code& ec) override { inner_.set(k, v, ec); }
  std::optional<std::string> do_try_get(std::string_view k, std::error_code& ec) override {
    std::this_thread::sleep_for(delay_);
    return inner_.try_get(k, ec);
  }
  std::int64_t do_add(std::string_view k, std::int64_t n, std::error_code& ec) override { return inner_.add(k, n, ec); }
  std::vector<std::string> do_wait(std::span<const std::string> keys, cohort::deadline until, std::error_code& ec) override {
    return inner_.wait(keys, until, ec);
  }

 private:
  cohort::store& inner_;
  std::chrono::milliseconds delay_;
};

struct storm_job_result {
  std::vector<int> status;
  long rss_before_kib = 0, rss_peak_kib = 0, storm_done_ms = 0, job_ms = 0;
};

// A 3-rank TCP job whose rank 2 starts `late`; `during(pids)` runs in the parent meanwhile.
// A 3-rank TCP job: rank 2 starts `late`, and (over a file store) takes `slow_rank2` for each
// read of a peer's address; `during()` runs in the parent meanwhile, once `ready()` says so.
template <class Ready, class During>
storm_job_result run_storm_job(const cf::job_spec& spec, const std::string& store_dir, std::chrono::milliseconds late,
                               std::chrono::milliseconds slow_rank2, cf::report_board& board, Ready ready, During during) {
  auto body = [&](int r) -> int {
    cf::rank_report& rep = board[r];
    rep.fds_before = cf::open_fds();
    try {
      auto run = [&](auto& comm) {
        comm.set_timeout(20s);
        ct::check<float>(comm, ct::kind::all_reduce, cohort::ops::sum, 100'003, 0, 7);
        ct::check<std::int32_t>(comm, ct::kind::all_gather, cohort::ops::sum, 1000, 0, 8);
        ct::check<double>(comm, ct::kind::broadcast, cohort::ops::sum, 70'001, 2, 9);
        rep.completed = 1;
      };
      if (!store_dir.empty()) {
        cohort::file_store files(store_dir);
        slow_store slow(files, r == 2 ? slow_rank2 : 0ms);
        cohort::tcp_options o = cf::tcp_test_options(spec.connect_timeout);
        o.token = "secret";
        cohort::tcp_communicator comm(std::in_place, cf::info_for(spec, r), slow, o);
        run(comm);
      } else {
        cohort::tcp_communicator comm(std::in_place, cf::info_for(spec, r), cf::tcp_test_options(spec.connect_timeout));
        run(comm);
      }
    } catch (const ct::check_failed& e) {
      rep.wrong_data = 1;
      cf::copy_text(rep.what, sizeof rep.what, e.what());
    } catch (const cohort::error& e) {
      cf::record(rep, e.code(), e.peer(), e.what());
    }
    rep.value = cf::rss_kib();
    rep.fds_after = cf::open_fds();
    if (rep.fds_after > rep.fds_before) cf::copy_text(rep.fds_text, sizeof rep.fds_text, cf::describe_fds());
    rep.leaks = cf::leak_check_failed();
    rep.written = 1;
    return 0;
  };
  storm_job_result res;
  std::vector<pid_t> pids;
  const auto start = cf::steady::now();
  pids.push_back(cf::spawn(0, body));
  pids.push_back(cf::spawn(1, body));
  if (late.count() == 0) pids.push_back(cf::spawn(2, body));
  ready();
  res.rss_before_kib = rss_kib_of(pids[0]);
  during();
  res.rss_peak_kib = rss_kib_of(pids[0]);
  res.storm_done_ms = std::chrono::duration_cast<std::chrono::milliseconds>(cf::steady::now() - start).count();
  if (late.count() > 0) {
    std::this_thread::sleep_until(start + late);
    pids.push_back(cf::spawn(2, body));
  }
  res.status = cf::reap(pids, spec.connect_timeout + 40s);
  res.job_ms = std::chrono::duration_cast<std::chrono::milliseconds>(cf::steady::now() - start).count();
  return res;
}

void check_storm_job(const storm_job_result& res, cf::report_board& board, const storm_result& s, int min_connected) {
  for (int r = 0; r < 3; ++r) {
    const cf::rank_report& rep = board[r];
    INFO("rank ", r, ": ", cf::status_text(res.status[r]), ", ", cf::code_name(rep.code), ": ", rep.what);
    CHECK(res.status[r] == 0);
    CHECK(rep.completed == 1);
    CHECK(rep.wrong_data == 0);
    INFO("descriptors before ", rep.fds_before, ", after ", rep.fds_after, ": ", rep.fds_text);
    CHECK(rep.fds_after <= rep.fds_before);
    CHECK(rep.leaks == 0);
  }
  std::string kinds;
  for (auto& [k, v] : s.kinds) kinds += std::to_string(v) + " " + k + "; ";
  MESSAGE(s.connected, " strangers connected (", kinds, s.refused_or_slow,
          " found the backlog full for 3 s); the listening rank's memory went from ", res.rss_before_kib,
          " KiB to ", res.rss_peak_kib, " KiB during the storm; the job was done ", res.job_ms,
          " ms after it started (the storm ended at ", res.storm_done_ms, " ms)");
  CHECK(s.connected >= min_connected);
  // Bounded: at most 64 MiB more (512 MiB under a sanitizer's allocator and shadow memory),
  // where a store that kept every declared 16 MiB value would need gigabytes.
  CHECK(res.rss_peak_kib - res.rss_before_kib < (cf::sanitized ? 512 : 64) * 1024);
}

}  // namespace

TEST_CASE("stranger: a storm of 1000 connections at the store a TCP job meets at") {
  cf::job_spec spec = cf::make_spec(cf::kind::tcp, "storm-store", 3);
  spec.connect_timeout = 30s;
  cf::report_board board(3);
  storm_result s;
  const int storm_size = static_cast<int>(cf::scaled(1000, 100));
  const auto res = run_storm_job(spec, "", 4000ms, 0ms, board, [] { std::this_thread::sleep_for(200ms); },
                                 [&] { storm(spec.master_port, storm_size, true, spec.job, 3, s); });
  check_storm_job(res, board, s, storm_size * 3 / 4);
}

namespace {

// Waits until every rank of `job` published its address in the file store at `dir`; returns
// rank 0's port.
int wait_for_addresses(const std::string& dir, const std::string& job, int ranks) {
  cohort::file_store st(dir);
  std::vector<std::string> keys;
  for (int r = 0; r < ranks; ++r) keys.push_back("cohort/" + job + "/addr/" + std::to_string(r));
  st.wait(keys, cohort::clock::now() + 20s);
  const auto addr = *st.try_get(keys[0]);
  return std::atoi(addr.c_str() + addr.find(' ') + 1);
}

}  // namespace

TEST_CASE("stranger: a storm of 1000 connections at a rank's listener while it accepts its peers") {
  // Rank 2 publishes its address, then takes 2.5 s to read the others': ranks 0 and 1 are
  // accepting, and the strangers come first.
  cf::job_spec spec = cf::make_spec(cf::kind::tcp, "storm-mesh", 3);
  spec.connect_timeout = 30s;
  char dir_template[] = "/tmp/cohort-storm-XXXXXX";
  REQUIRE(::mkdtemp(dir_template) != nullptr);
  const std::string dir = dir_template;
  cf::report_board board(3);
  storm_result s;
  int port = 0;
  const int storm_size = static_cast<int>(cf::scaled(1000, 100));
  const auto res = run_storm_job(spec, dir, 0ms, 2500ms, board,
                                 [&] { port = wait_for_addresses(dir, spec.job, 3); },
                                 [&] { storm(port, storm_size, false, spec.job, 3, s); });
  std::filesystem::remove_all(dir);
  check_storm_job(res, board, s, storm_size * 3 / 4);
}

TEST_CASE("stranger: a storm at a rank's listener before it accepts fills the backlog; the job still forms") {
  // Rank 2 comes 4 s late: rank 0 listens but accepts only once every address is known, so
  // the kernel's backlog (128) fills with strangers, and the peers' connects wait behind them.
  cf::job_spec spec = cf::make_spec(cf::kind::tcp, "storm-backlog", 3);
  spec.connect_timeout = 30s;
  char dir_template[] = "/tmp/cohort-storm-XXXXXX";
  REQUIRE(::mkdtemp(dir_template) != nullptr);
  const std::string dir = dir_template;
  cf::report_board board(3);
  storm_result s;
  int port = 0;
  const int storm_size = static_cast<int>(cf::scaled(1000, 100));
  const auto res = run_storm_job(spec, dir, 4000ms, 0ms, board,
                                 [&] { port = wait_for_addresses(dir, spec.job, 2) ; },
                                 [&] { storm(port, storm_size, false, spec.job, 3, s); });
  std::filesystem::remove_all(dir);
  check_storm_job(res, board, s, 100);
}

// Bug 7 (tcp_store_server.hpp): a connection that never says hello holds a client slot until
// the server is destroyed (no hello timeout), so `max_clients` silent strangers lock every rank
// out of the store ("too many clients"). With the default 4096 slots and no token, anyone who
// can reach MASTER_PORT can stop a job from forming. Shown with 16 slots: a legitimate client
// must get in within 12 s (any reasonable hello timeout); today it never does.
TEST_CASE("bug: silent connections take every slot of the store server, for good" * doctest::should_fail()) {
  cohort::tcp_store_server server("127.0.0.1", 0, {.token = {}, .log = [](std::string_view) {}, .linger = 100ms, .max_clients = 16});
  storm_result s;
  for (int i = 0; i < 16; ++i) {
    const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<std::uint16_t>(server.port()));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    REQUIRE(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
    s.held.push_back(fd);
  }
  std::this_thread::sleep_for(100ms);
  bool got_in = false;
  const auto until = cf::steady::now() + 12s;
  while (!got_in && cf::steady::now() < until) {
    cohort::tcp_store client("127.0.0.1", server.port(), {.token = {}, .timeout = 1s});
    std::error_code ec;
    client.set("k", "v", ec);
    got_in = !ec;
    client.disconnect();
    if (!got_in) std::this_thread::sleep_for(500ms);
  }
  CHECK(got_in);
}

// Bug 8, security (tcp_setup.hpp, tcp_store_server.hpp): without COHORT_TOKEN, rank 0 makes the
// job's token and hands it out through its store, and that store accepts any client. So anyone
// who can reach MASTER_PORT and knows the job id (under torchrun, by default
// "<MASTER_ADDR>_<MASTER_PORT>" or the run id) reads the token, publishes an address for a rank
// that has not come yet, and passes the handshake as that rank: the job forms with a stranger in
// it, who may then read and write its gradients. Here ranks 0 and 1 of 3 must not form a
// communicator while the real rank 2 never started; today they do, with the stranger as rank 2.
TEST_CASE("bug: a stranger who reaches the default store takes a rank's place in the job" * doctest::should_fail()) {
  cf::job_spec spec = cf::make_spec(cf::kind::tcp, "impostor", 3);
  spec.connect_timeout = 4s;
  cf::report_board board(3);
  std::vector<pid_t> pids;
  for (int r = 0; r < 2; ++r)
    pids.push_back(cf::spawn(r, [&](int rank) {
      try {
        cohort::tcp_communicator comm(std::in_place, cf::info_for(spec, rank), cf::tcp_test_options(spec.connect_timeout));
        board[rank].completed = 1;  // formed a job whose rank 2 never started
      } catch (const cohort::error& e) {
        cf::record(board[rank], e.code(), e.peer(), e.what());
      }
      board[rank].written = 1;
      return 0;
    }));
  // The stranger: a store client like any rank, no secret.
  storm_result held;
  {
    cohort::tcp_store st("127.0.0.1", spec.master_port, {.token = {}, .timeout = 5s});
    const std::string prefix = "cohort/" + spec.job + "/";
    const std::string token = st.get(prefix + "token", cohort::clock::now() + 5s);
    std::vector<std::string> keys = {prefix + "addr/0", prefix + "addr/1"};
    st.wait(keys, cohort::clock::now() + 5s);
    st.set(prefix + "addr/2", "127.0.0.1 9");  // never dialled: rank 2 dials the lower ranks
    for (int r = 0; r < 2; ++r) {
      const std::string addr = *st.try_get(keys[r]);
      const int port = std::atoi(addr.c_str() + addr.find(' ') + 1);
      const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
      sockaddr_in a{};
      a.sin_family = AF_INET;
      a.sin_port = htons(static_cast<std::uint16_t>(port));
      a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      REQUIRE(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
      const auto hello = tcpd::encode_hello({2, 3, spec.job, token});
      REQUIRE(::send(fd, hello.data(), hello.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(hello.size()));
      held.held.push_back(fd);
    }
    st.disconnect();
  }
  cf::reap(pids, 30s);
  for (int r = 0; r < 2; ++r) {
    INFO("rank ", r, ": ", std::string(board[r].completed ? "formed the job with the stranger as rank 2" : board[r].what));
    CHECK(board[r].completed == 0);
  }
}
