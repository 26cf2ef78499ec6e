// Fuzz target: the rendezvous store protocol (rendezvous/detail/tcp_store_protocol.hpp), from
// both sides of the socket.
//
// Input: a mode byte, a flags byte, then bytes.
// - mode 0, decoders: decode_request on the bytes; decode_keys, whose result must encode back
//   to exactly the bytes it came from.
// - mode 1, the server: a fresh tcp_store_server per input (so inputs replay exactly) gets the
//   bytes on a TCP connection (after a proper handshake with the right token when flag 1 is
//   set; flag 2: a server without a token, which admits this user's processes), then the end of
//   the stream. The server must close the connection, and must still serve a well-behaved
//   client afterwards.
// - mode 2, the client: a fake server answers a tcp_store client's hello and proof properly
//   (flag 1: the input brings its own answers), then sends the bytes as its replies; the client
//   runs a rendezvous wait, a get and an add. Every failure must be a cohort::error; nothing may
//   crash or hang.
//
// No known bug is masked at present. While one is open, skip the inputs that show it unless
// COHORT_FUZZ_STRICT=1 (the replay of tests/fuzz/known_bugs/ sets it), so that a bounded run
// finds new ones (see README.md).
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <string>
#include <string_view>
#include <thread>

#include <cohort/core/options.hpp>
#include <cohort/detail/net/socket.hpp>
#include <cohort/rendezvous/tcp_store.hpp>
#include <cohort/rendezvous/tcp_store_server.hpp>

namespace net = cohort::detail::net;
namespace w = cohort::detail::store_wire;
using namespace std::chrono_literals;

namespace {

[[noreturn]] void fail(const char* what) {
  std::fprintf(stderr, "fuzz_store: %s\n", what);
  std::abort();
}

// The harness's sockets go through the library's helpers, which poll to a deadline and retry
// after EINTR: libFuzzer's -timeout alarm (SIGALRM, every timeout/2 + 1 s) interrupts whichever
// call it lands on, and a signal is not a refusal. Exactly n bytes within 5 s; false when the
// peer closes or the time passes.
bool send_exact(int fd, const void* p, std::size_t n) {
  std::error_code ec;
  net::send_all(fd, p, n, cohort::deadline_after(5s), ec);
  return !ec;
}

bool recv_exact(int fd, void* p, std::size_t n) {
  std::error_code ec;
  net::recv_all(fd, p, n, cohort::deadline_after(5s), ec);
  return !ec;
}

// The client's half of the handshake: hello, challenge, proof, verdict.
// False when the server refuses or closes.
bool handshake(int fd, const std::string& token) {
  w::nonce mine{};
  mine[0] = 7;
  std::byte h[w::hello_size];
  w::encode_hello(h, 0, mine);
  std::byte challenge[w::hello_size];
  if (!send_exact(fd, h, sizeof h) || !recv_exact(fd, challenge, sizeof challenge)) return false;
  const auto proof = w::client_proof(token, mine, w::nonce_of(challenge));
  std::byte verdict[w::verdict_size];
  if (!send_exact(fd, proof.data(), proof.size()) || !recv_exact(fd, verdict, sizeof verdict))
    return false;
  return verdict[8] == std::byte{0};
}

void decoders(std::string_view bytes) {
  if (bytes.size() >= w::request_size) {
    if (auto r = w::decode_request(reinterpret_cast<const std::byte*>(bytes.data()))) {
      if (r->key_length > w::max_key || r->value_length > w::max_value) fail("request over the limits accepted");
    }
  }
  if (auto keys = w::decode_keys(bytes)) {
    if (keys->size() > w::max_wait_keys) fail("too many keys accepted");
    if (w::encode_keys(*keys) != bytes) fail("decode_keys does not round trip");
  }
}

net::unique_fd connect_local(int port) {
  net::endpoint e;
  net::numeric_endpoint("127.0.0.1", port, e);
  std::error_code ec;
  return net::connect_to(e, cohort::deadline_after(5s), ec);
}

void send_all(int fd, std::string_view s) {
  std::error_code ec;
  net::send_all(fd, s.data(), s.size(), cohort::deadline_after(5s), ec);
  if (ec == cohort::errc::timed_out) fail("cannot send to the server for 5 s");
  // peer_lost: the server closed, fine
}

// Reads until the peer closes; false if it has not within `limit`.
bool drain_until_closed(int fd, std::chrono::milliseconds limit) {
  const auto until = std::chrono::steady_clock::now() + limit;
  char buf[4096];
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(until - std::chrono::steady_clock::now()).count();
    if (left <= 0) return false;
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(left)) != 1) continue;
    const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n == 0 || (n < 0 && errno != EINTR && errno != EAGAIN)) return true;
  }
}

void server(std::uint8_t flags, std::string_view bytes) {
  const bool tokenless = flags & 2;
  const std::string token = tokenless ? "" : "tok";
  cohort::tcp_store_server s("127.0.0.1", 0, {.token = token, .log = [](std::string_view) {}, .linger = 2000ms, .max_clients = 4096});
  net::unique_fd fd = connect_local(s.port());
  if (!fd) fail("cannot connect to the server");
  if ((flags & 1) && !handshake(fd.get(), token)) fail("the server refused a proper handshake");
  send_all(fd.get(), bytes);
  ::shutdown(fd.get(), SHUT_WR);
  if (!drain_until_closed(fd.get(), 5000ms))
    fail("the server kept a finished connection open for 5 s");
  fd.reset();
  // Still serving.
  cohort::tcp_store client("127.0.0.1", s.port(), {.token = token, .timeout = 5s});
  std::error_code ec;
  client.set("health", "ok", ec);
  auto v = client.try_get("health", ec);
  if (ec || !v || *v != "ok") fail("the server stopped serving after the input");
  client.disconnect();
}

void client(std::uint8_t flags, std::string_view bytes) {
  const int ls = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  if (::bind(ls, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || ::listen(ls, 4) != 0 ||
      ::getsockname(ls, reinterpret_cast<sockaddr*>(&a), &len) != 0)
    fail("cannot listen");
  const int port = ntohs(a.sin_port);
  std::thread fake([&] {
    if (!net::wait_fd(ls, POLLIN, cohort::deadline_after(5s))) return;
    const int c = ::accept4(ls, nullptr, nullptr, SOCK_CLOEXEC);
    ::shutdown(ls, SHUT_RDWR);  // one connection: a client that reconnects is refused at once
    if (c < 0) return;
    std::byte hello[w::hello_size];
    const bool got_hello = recv_exact(c, hello, sizeof hello);
    std::string out;
    if (!(flags & 1) && got_hello) {  // proper answers, unless the input brings its own
      const w::nonce client_nonce = w::nonce_of(hello), server_nonce{};
      std::byte challenge[w::hello_size];
      w::encode_hello(challenge, w::flag_token, server_nonce);
      send_exact(c, challenge, sizeof challenge);
      std::byte proof[w::proof_size];
      recv_exact(c, proof, sizeof proof);
      std::byte verdict[w::verdict_size];
      w::encode_verdict(verdict, w::verdict::admitted, w::server_proof("tok", client_nonce, server_nonce));
      out.assign(reinterpret_cast<const char*>(verdict), sizeof verdict);
    }
    out += bytes;
    send_exact(c, out.data(), out.size());  // the client may close first: fine
    ::shutdown(c, SHUT_WR);
    drain_until_closed(c, 5000ms);
    ::close(c);
  });
  {
    // Short deadlines: once the one connection is gone, a reconnecting client retries until
    // its deadline; the replies are only meaningful on that connection anyway.
    cohort::tcp_store st("127.0.0.1", port, {.token = "tok", .timeout = 200ms});
    std::error_code ec;
    try {
      cohort::wait_for_ranks(st, "cohort/j/addr/", 3, cohort::clock::now() + 50ms, ec);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "fuzz_store: %s\n", e.what());
      fail("wait_for_ranks threw on what the store sent");
    }
    if (ec == cohort::errc::protocol_error &&
        st.last_error().find("127.0.0.1:") == std::string::npos)
      fail("a protocol error that does not name the store");
    if (!ec || ec == cohort::errc::timed_out) st.try_get("k", ec);
    if (!ec) st.add("n", 1, ec);
    st.disconnect();
  }
  fake.join();
  ::close(ls);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 2) return 0;
  const std::string_view bytes(reinterpret_cast<const char*>(data) + 2, size - 2);
  switch (data[0] % 3) {
    case 0: decoders(bytes); break;
    case 1: server(data[1], bytes); break;
    case 2: client(data[1], bytes); break;
  }
  return 0;
}
