/// @file
/// The server of the TCP store: one thread, one `poll` loop, every client non-blocking.
///
/// It survives what strangers do: a connection that does not open with the store's hello and
/// token, or sends a request over the limits, is closed and logged; a slow client holds only
/// its own buffers. Waits are held on the server and answered when their keys arrive or their
/// time is up, so that a waiting client costs nothing.
#pragma once

#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <system_error>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include <cohort/core/error.hpp>
#include <cohort/core/options.hpp>
#include <cohort/rendezvous/detail/socket.hpp>
#include <cohort/rendezvous/detail/tcp_store_protocol.hpp>

namespace cohort {

/// How a `tcp_store_server` runs.
struct tcp_store_server_options {
  std::string token;  ///< Clients must present this secret; empty: any client may use the store.
  std::function<void(std::string_view)>
      log;  ///< Where refused connections are told (stderr if empty).
  std::chrono::milliseconds linger{2000};  ///< On destruction, how long connected clients may stay.
  std::size_t max_clients = 4096;          ///< Connections beyond this are closed at once.
};

/// Hosts a TCP store on a thread of its own until destroyed.
class tcp_store_server {
 public:
  /// Listens on `host` (a numeric address or a name; "" is every address) at `port` (0: any).
  /// Throws `cohort::error` when it cannot.
  tcp_store_server(const std::string& host, int port, tcp_store_server_options opts = {})
      : opts_(std::move(opts)) {
    if (!opts_.log)
      opts_.log = [](std::string_view s) {
        std::fprintf(stderr, "cohort: %.*s\n", int(s.size()), s.data());
      };
    std::error_code ec;
    std::string why;
    std::vector<detail::net::endpoint> eps;
    if (host.empty()) {
      detail::net::endpoint any;
      detail::net::numeric_endpoint("::", port, any);
      eps.push_back(any);
      detail::net::numeric_endpoint("0.0.0.0", port, any);
      eps.push_back(any);
    } else {
      eps = detail::net::resolve(host, port, clock::now() + std::chrono::seconds(30), ec, why);
      if (ec) throw error(ec, "tcp_store_server", -1, "tcp_store_server: " + why);
    }
    int last = 0;
    for (const auto& e : eps) {
      detail::net::unique_fd fd = detail::net::tcp_socket(e.family(), ec);
      if (ec) continue;
      int one = 1;
      ::setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
      if (::bind(fd.get(), reinterpret_cast<const sockaddr*>(&e.addr), e.len) != 0 ||
          ::listen(fd.get(), 1024) != 0) {
        last = errno;
        continue;
      }
      listener_ = std::move(fd);
      local_ = e;
      socklen_t len = sizeof local_.addr;
      ::getsockname(listener_.get(), reinterpret_cast<sockaddr*>(&local_.addr), &len);
      local_.len = len;
      break;
    }
    if (!listener_)
      throw error(std::error_code(last, std::generic_category()), "tcp_store_server", -1,
                  "tcp_store_server: cannot listen on " + (host.empty() ? "*" : host) + ":" +
                      std::to_string(port) + ": " + std::generic_category().message(last));
    int pipefd[2];
    if (::pipe2(pipefd, O_CLOEXEC | O_NONBLOCK) != 0)
      throw error(std::error_code(errno, std::generic_category()), "tcp_store_server", -1,
                  "tcp_store_server: pipe failed");
    wake_rd_.reset(pipefd[0]);
    wake_wr_.reset(pipefd[1]);
    thread_ = std::thread([this] { run(); });
  }

  tcp_store_server(const tcp_store_server&) = delete;
  tcp_store_server& operator=(const tcp_store_server&) = delete;

  /// Stops after the connected clients left, or after `linger`, whichever is first.
  ~tcp_store_server() {
    stop_.store(true);
    char b = 1;
    [[maybe_unused]] auto r = ::write(wake_wr_.get(), &b, 1);
    if (thread_.joinable()) thread_.join();
  }

  /// The port it listens on.
  int port() const { return local_.port(); }
  /// The address it listens on, as "host:port".
  std::string address() const { return local_.text(); }

 private:
  struct client {
    detail::net::unique_fd fd;
    std::string peer, in, out;
    bool authed = false, waiting = false, closing = false;
    std::vector<std::string> keys;
    deadline until{};
  };

  void run() {
    std::vector<pollfd> pfds;
    bool stopping = false;
    deadline stop_at{};
    for (;;) {
      const auto now = clock::now();
      deadline next = now + std::chrono::hours(1);
      std::size_t authed = 0;
      for (auto& c : clients_) {
        if (c->waiting) next = std::min(next, c->until);
        authed += c->authed;
      }
      if (stopping && (authed == 0 || now >= stop_at)) return;
      if (stopping) next = std::min(next, stop_at);
      pfds.clear();
      pfds.push_back({wake_rd_.get(), POLLIN, 0});
      pfds.push_back({stopping ? -1 : listener_.get(), POLLIN, 0});
      for (auto& c : clients_) {
        short ev = 0;
        if (!c->closing &&
            c->in.size() < detail::store_wire::max_value + 2 * detail::store_wire::max_key)
          ev |= POLLIN;
        if (!c->out.empty()) ev |= POLLOUT;
        pfds.push_back({c->fd.get(), ev, 0});
      }
      const int r = ::poll(pfds.data(), pfds.size(), detail::net::poll_ms(next));
      if (r < 0 && errno != EINTR) return;
      if (pfds[0].revents) {
        char sink[64];
        while (::read(wake_rd_.get(), sink, sizeof sink) > 0) {
        }
        if (stop_.load() && !stopping) {
          stopping = true;
          stop_at = clock::now() + opts_.linger;
        }
      }
      if (pfds[1].revents) accept_all();
      for (std::size_t i = 0; i < clients_.size() && i + 2 < pfds.size(); ++i) {
        auto& c = *clients_[i];
        const short re = pfds[i + 2].revents;
        if (re & (POLLIN | POLLHUP | POLLERR)) read_from(c);
        if (!c.closing) process(c);
        if (!c.out.empty() && (re & POLLOUT || !c.closing)) write_to(c);
      }
      expire_waits();
      for (auto& c : clients_) {  // requests that arrived behind a wait answered just now
        if (!c->closing && !c->waiting && !c->in.empty()) process(*c);
        if (!c->out.empty()) write_to(*c);
      }
      std::erase_if(clients_, [](const auto& c) { return c->closing && c->out.empty(); });
    }
  }

  void accept_all() {
    for (;;) {
      sockaddr_storage sa{};
      socklen_t len = sizeof sa;
      const int fd = ::accept4(listener_.get(), reinterpret_cast<sockaddr*>(&sa), &len,
                               SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd < 0) return;
      detail::net::endpoint e;
      std::memcpy(&e.addr, &sa, len);
      e.len = len;
      if (clients_.size() >= opts_.max_clients) {
        ::close(fd);
        opts_.log("store: refused a connection from " + e.text() + ": too many clients");
        continue;
      }
      auto c = std::make_unique<client>();
      c->fd.reset(fd);
      c->peer = e.text();
      clients_.push_back(std::move(c));
    }
  }

  void read_from(client& c) {
    char buf[65536];
    for (int i = 0; i < 16; ++i) {
      const ssize_t n = ::recv(c.fd.get(), buf, sizeof buf, MSG_DONTWAIT);
      if (n > 0) {
        c.in.append(buf, static_cast<std::size_t>(n));
        if (static_cast<std::size_t>(n) < sizeof buf) return;
        continue;
      }
      if (n < 0 && (errno == EINTR)) continue;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
      c.closing = true;  // closed or failed: drop it, and any wait it held
      c.out.clear();
      c.waiting = false;
      return;
    }
  }

  void write_to(client& c) {
    while (!c.out.empty()) {
      const ssize_t n = ::send(c.fd.get(), c.out.data(), c.out.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
      if (n > 0) {
        c.out.erase(0, static_cast<std::size_t>(n));
      } else if (n < 0 && errno == EINTR) {
      } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
        return;
      } else {
        c.out.clear();
        c.closing = true;
        return;
      }
    }
  }

  void refuse(client& c, const std::string& why) {
    opts_.log("store: closed the connection from " + c.peer + ": " + why);
    c.closing = true;
    c.out.clear();
    c.in.clear();
    c.waiting = false;
  }

  void reply(client& c, detail::store_wire::status s, std::string_view payload,
             std::int64_t number) {
    std::byte h[detail::store_wire::reply_size];
    detail::store_wire::encode_reply(h, s, payload.size(), number);
    c.out.append(reinterpret_cast<const char*>(h), sizeof h);
    c.out += payload;
  }

  // Handles every complete request in `c.in`; one wait at a time holds the rest.
  void process(client& c) {
    namespace w = detail::store_wire;
    auto bytes = [&] { return reinterpret_cast<const std::byte*>(c.in.data()); };
    while (!c.closing && !c.waiting) {
      if (!c.authed) {
        if (c.in.size() < w::hello_size) return;
        if (w::load_le<std::uint64_t>(bytes()) != w::magic)
          return refuse(c, "not a cohort store client (bad magic)");
        if (w::load_le<std::uint32_t>(bytes() + 8) != w::version)
          return refuse(c, "store protocol version mismatch");
        const auto tl = w::load_le<std::uint16_t>(bytes() + 12);
        if (tl > w::max_token) return refuse(c, "malformed hello");
        if (c.in.size() < w::hello_size + tl) return;
        if (!opts_.token.empty() &&
            !detail::tcp::equal_secret(std::string_view(c.in).substr(w::hello_size, tl),
                                       opts_.token))
          return refuse(c, "wrong token");
        c.in.erase(0, w::hello_size + tl);
        c.authed = true;
        std::byte h[w::hello_size]{};
        w::store_le<std::uint64_t>(h, w::magic);
        c.out.append(reinterpret_cast<const char*>(h), sizeof h);
        continue;
      }
      if (c.in.size() < w::request_size) return;
      const auto req = w::decode_request(bytes());
      if (!req) return refuse(c, "malformed request");
      const std::size_t total = w::request_size + req->key_length + req->value_length;
      if (c.in.size() < total) return;
      std::string key = c.in.substr(w::request_size, req->key_length);
      std::string_view value =
          std::string_view(c.in).substr(w::request_size + req->key_length, req->value_length);
      switch (req->kind) {
        case w::op::set:
          data_[key] = value;
          reply(c, w::status::ok, {}, 0);
          woke_ = true;
          break;
        case w::op::get: {
          auto it = data_.find(key);
          if (it == data_.end())
            reply(c, w::status::missing, {}, 0);
          else
            reply(c, w::status::ok, it->second, 0);
          break;
        }
        case w::op::add: {
          auto& v = data_[key];
          long long now = 0;
          if (!v.empty()) {
            auto [end, e] = std::from_chars(v.data(), v.data() + v.size(), now);
            if (e != std::errc{} || end != v.data() + v.size()) {
              reply(c, w::status::bad_request, "the value is not an integer", 0);
              break;
            }
          }
          now += req->arg;
          v = std::to_string(now);
          reply(c, w::status::ok, {}, now);
          woke_ = true;
          break;
        }
        case w::op::wait: {
          auto keys = w::decode_keys(value);
          if (!keys) return refuse(c, "malformed key list");
          c.keys = std::move(*keys);
          c.waiting = true;
          c.until = clock::now() +
                    std::chrono::milliseconds(std::clamp<std::int64_t>(req->arg, 0, 86'400'000));
          break;
        }
      }
      c.in.erase(0, total);
      if (c.waiting) answer_if_ready(c, false);
      if (woke_) {
        woke_ = false;
        for (auto& other : clients_)
          if (other->waiting) answer_if_ready(*other, false);
      }
    }
  }

  // Answers a wait whose keys all exist, or (when `expired`) with the keys still missing.
  void answer_if_ready(client& c, bool expired) {
    namespace w = detail::store_wire;
    std::vector<std::string> missing;
    for (const auto& k : c.keys)
      if (!data_.contains(k)) missing.push_back(k);
    if (!missing.empty() && !expired) return;
    c.waiting = false;
    c.keys.clear();
    if (missing.empty())
      reply(c, w::status::ok, {}, 0);
    else
      reply(c, w::status::timed_out, w::encode_keys(missing),
            static_cast<std::int64_t>(missing.size()));
    write_to(c);
  }

  void expire_waits() {
    const auto now = clock::now();
    for (auto& c : clients_) {
      if (c->waiting && now >= c->until) {
        answer_if_ready(*c, true);
        if (!c->closing) process(*c);
      }
    }
  }

  tcp_store_server_options opts_;
  detail::net::unique_fd listener_, wake_rd_, wake_wr_;
  detail::net::endpoint local_;
  std::vector<std::unique_ptr<client>> clients_;
  std::unordered_map<std::string, std::string> data_;
  bool woke_ = false;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace cohort
