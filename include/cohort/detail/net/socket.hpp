/// @file
/// Plain POSIX socket helpers with deadlines: name resolution that gives up at a deadline,
/// connect, whole-buffer send and receive, owned descriptors, random tokens. No Asio.
///
/// The layer `cohort/detail/net/` sits below both users of sockets and above `core/` only:
/// the rendezvous stores (`rendezvous/`) and the TCP transport (`transport/`) both build on
/// it, and it includes neither. The transport may use a store (to meet its peers); a store
/// never reaches into a transport (tests/headers/check_layers.py checks both rules).
#pragma once

#include <arpa/inet.h>
#include <fcntl.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

#include <cohort/core/error.hpp>
#include <cohort/core/options.hpp>
#include <cohort/detail/net/unique_fd.hpp>

namespace cohort::detail::net {

/// A socket address of either family.
struct endpoint {
  sockaddr_storage addr{};
  socklen_t len = 0;

  int family() const noexcept { return addr.ss_family; }
  int port() const noexcept {
    if (family() == AF_INET) return ntohs(reinterpret_cast<const sockaddr_in&>(addr).sin_port);
    return ntohs(reinterpret_cast<const sockaddr_in6&>(addr).sin6_port);
  }
  /// "10.0.0.1:29500" or "[fd00::1]:29500".
  std::string text() const {
    char buf[INET6_ADDRSTRLEN] = "?";
    if (family() == AF_INET) {
      ::inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in&>(addr).sin_addr, buf, sizeof buf);
      return std::string(buf) + ":" + std::to_string(port());
    }
    ::inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6&>(addr).sin6_addr, buf, sizeof buf);
    return "[" + std::string(buf) + "]:" + std::to_string(port());
  }
};

/// Splits "host:port" or "[v6]:port"; false when it is not of that shape or the port is bad.
inline bool split_host_port(std::string_view s, std::string& host, int& port) {
  std::string_view h, p;
  if (s.starts_with('[')) {
    const auto close = s.find(']');
    if (close == std::string_view::npos || close + 1 >= s.size() || s[close + 1] != ':')
      return false;
    h = s.substr(1, close - 1);
    p = s.substr(close + 2);
  } else {
    const auto colon = s.rfind(':');
    if (colon == std::string_view::npos || s.find(':') != colon) return false;
    h = s.substr(0, colon);
    p = s.substr(colon + 1);
  }
  int v = 0;
  auto [end, ec] = std::from_chars(p.data(), p.data() + p.size(), v);
  if (h.empty() || ec != std::errc{} || end != p.data() + p.size() || v < 1 || v > 65535)
    return false;
  host = h;
  port = v;
  return true;
}

/// The endpoint of a numeric address, or false when `host` is not one.
inline bool numeric_endpoint(const std::string& host, int port, endpoint& out) {
  out = {};
  auto* v4 = reinterpret_cast<sockaddr_in*>(&out.addr);
  if (::inet_pton(AF_INET, host.c_str(), &v4->sin_addr) == 1) {
    v4->sin_family = AF_INET;
    v4->sin_port = htons(static_cast<std::uint16_t>(port));
    out.len = sizeof(sockaddr_in);
    return true;
  }
  out = {};
  auto* v6 = reinterpret_cast<sockaddr_in6*>(&out.addr);
  std::string h = host;
  if (auto pct = h.find('%'); pct != std::string::npos) {
    v6->sin6_scope_id = ::if_nametoindex(h.c_str() + pct + 1);
    h.resize(pct);
  }
  if (::inet_pton(AF_INET6, h.c_str(), &v6->sin6_addr) == 1) {
    v6->sin6_family = AF_INET6;
    v6->sin6_port = htons(static_cast<std::uint16_t>(port));
    out.len = sizeof(sockaddr_in6);
    return true;
  }
  return false;
}

/// True for "localhost", 127.0.0.0/8 and ::1.
inline bool is_loopback_host(const std::string& host) {
  if (host == "localhost" || host == "ip6-localhost") return true;
  endpoint e;
  if (!numeric_endpoint(host, 1, e)) return false;
  if (e.family() == AF_INET)
    return (ntohl(reinterpret_cast<const sockaddr_in&>(e.addr).sin_addr.s_addr) >> 24) == 127;
  return IN6_IS_ADDR_LOOPBACK(&reinterpret_cast<const sockaddr_in6&>(e.addr).sin6_addr);
}

/// Resolves `host` (a name or a numeric address) for TCP, giving up at `until`.
///
/// getaddrinfo cannot be interrupted, so a name runs it on a helper thread that is left to
/// finish alone when the deadline passes first.
inline std::vector<endpoint> resolve(const std::string& host, int port, deadline until,
                                     std::error_code& ec, std::string& why) {
  ec.clear();
  endpoint e;
  if (numeric_endpoint(host, port, e)) return {e};
  struct job {
    std::mutex m;
    std::condition_variable cv;
    bool done = false, abandoned = false;
    int rc = 0;
    addrinfo* res = nullptr;
  };
  auto j = std::make_shared<job>();
  std::thread([j, host, service = std::to_string(port)] {
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_ADDRCONFIG;
    addrinfo* res = nullptr;
    const int rc = ::getaddrinfo(host.c_str(), service.c_str(), &hints, &res);
    std::lock_guard lk(j->m);
    if (j->abandoned) {
      if (res) ::freeaddrinfo(res);
      return;
    }
    j->rc = rc;
    j->res = res;
    j->done = true;
    j->cv.notify_all();
  }).detach();
  std::unique_lock lk(j->m);
  if (!j->cv.wait_until(lk, until, [&] { return j->done; })) {
    j->abandoned = true;
    ec = errc::timed_out;
    why = "resolving \"" + host + "\" took past the deadline";
    return {};
  }
  std::vector<endpoint> out;
  if (j->rc != 0) {
    ec = errc::invalid_argument;
    why = "cannot resolve \"" + host + "\": " + ::gai_strerror(j->rc);
    return out;
  }
  for (addrinfo* a = j->res; a; a = a->ai_next) {
    if (a->ai_family != AF_INET && a->ai_family != AF_INET6) continue;
    endpoint x;
    std::memcpy(&x.addr, a->ai_addr, a->ai_addrlen);
    x.len = static_cast<socklen_t>(a->ai_addrlen);
    out.push_back(x);
  }
  ::freeaddrinfo(j->res);
  if (out.empty()) {
    ec = errc::invalid_argument;
    why = "\"" + host + "\" has no IPv4 or IPv6 address";
  }
  return out;
}

/// Milliseconds from now until `until`, clamped to [0, INT_MAX]: a poll timeout.
inline int poll_ms(deadline until) {
  const auto left = std::chrono::ceil<std::chrono::milliseconds>(until - clock::now()).count();
  return static_cast<int>(std::clamp<long long>(left, 0, 1 << 30));
}

/// Waits for `events` on `fd` until `until`: true when ready, false at the deadline.
inline bool wait_fd(int fd, short events, deadline until) {
  for (;;) {
    pollfd p{fd, events, 0};
    const int r = ::poll(&p, 1, poll_ms(until));
    if (r > 0) return true;
    if (r == 0) return false;
    if (errno != EINTR) return true;  // let the next syscall report it
  }
}

/// A TCP socket of `family`, close-on-exec and non-blocking.
inline unique_fd tcp_socket(int family, std::error_code& ec) {
  unique_fd fd(::socket(family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, IPPROTO_TCP));
  if (!fd) ec = std::error_code(errno, std::generic_category());
  return fd;
}

/// Connects to `e` by `until`; the socket is non-blocking with TCP_NODELAY.
inline unique_fd connect_to(const endpoint& e, deadline until, std::error_code& ec) {
  ec.clear();
  unique_fd fd = tcp_socket(e.family(), ec);
  if (ec) return {};
  int one = 1;
  ::setsockopt(fd.get(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  if (::connect(fd.get(), reinterpret_cast<const sockaddr*>(&e.addr), e.len) == 0) return fd;
  if (errno != EINPROGRESS) {
    ec = std::error_code(errno, std::generic_category());
    return {};
  }
  if (!wait_fd(fd.get(), POLLOUT, until)) {
    ec = errc::timed_out;
    return {};
  }
  int err = 0;
  socklen_t len = sizeof err;
  ::getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &err, &len);
  if (err != 0) {
    ec = std::error_code(err, std::generic_category());
    return {};
  }
  return fd;
}

/// Sends all of `data` on non-blocking `fd` by `until`.
inline void send_all(int fd, const void* data, std::size_t n, deadline until, std::error_code& ec) {
  ec.clear();
  auto* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t r = ::send(fd, p, n, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (r > 0) {
      p += r;
      n -= static_cast<std::size_t>(r);
    } else if (r < 0 && errno == EINTR) {
    } else if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      if (!wait_fd(fd, POLLOUT, until)) {
        ec = errc::timed_out;
        return;
      }
    } else {
      ec = make_error_code(errc::peer_lost);
      return;
    }
  }
}

/// Receives exactly `n` bytes from non-blocking `fd` by `until`; `errc::peer_lost` at the end
/// of the stream.
inline void recv_all(int fd, void* data, std::size_t n, deadline until, std::error_code& ec) {
  ec.clear();
  auto* p = static_cast<char*>(data);
  while (n > 0) {
    const ssize_t r = ::recv(fd, p, n, MSG_DONTWAIT);
    if (r > 0) {
      p += r;
      n -= static_cast<std::size_t>(r);
    } else if (r < 0 && errno == EINTR) {
    } else if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      if (!wait_fd(fd, POLLIN, until)) {
        ec = errc::timed_out;
        return;
      }
    } else {
      ec = make_error_code(errc::peer_lost);
      return;
    }
  }
}

/// Fills `out` with `n` bytes from the kernel's generator; false when it cannot (no getrandom
/// and no /dev/urandom).
inline bool random_bytes(void* out, std::size_t n) {
  auto* p = static_cast<unsigned char*>(out);
  std::size_t got = 0;
  while (got < n) {
    const ssize_t r = ::getrandom(p + got, n - got, 0);
    if (r > 0) {
      got += static_cast<std::size_t>(r);
    } else if (r < 0 && errno == EINTR) {
    } else {
      break;
    }
  }
  if (got == n) return true;
  const int fd = ::open("/dev/urandom", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  while (got < n) {
    const ssize_t r = ::read(fd, p + got, n - got);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) break;
    got += static_cast<std::size_t>(r);
  }
  ::close(fd);
  return got == n;
}

/// 32 random bytes as 64 hex digits, from the kernel's generator; "" when there is none (a
/// token from anything weaker could be guessed).
inline std::string random_token() {
  unsigned char raw[32] = {};
  if (!random_bytes(raw, sizeof raw)) return {};
  std::string s;
  for (unsigned char b : raw) {
    s += "0123456789abcdef"[b >> 4];
    s += "0123456789abcdef"[b & 15];
  }
  return s;
}

}  // namespace cohort::detail::net
