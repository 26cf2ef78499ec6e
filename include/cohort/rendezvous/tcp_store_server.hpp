/// @file
/// The server of the TCP store: one thread, one `poll` loop, every client non-blocking.
///
/// Who gets in: with a token, only clients that prove they know it (a challenge and response
/// with HMAC-SHA256, see detail/tcp_store_protocol.hpp; the token never crosses the wire, and
/// the server proves it knows the token too). Without one, only processes of this host run by
/// the server's own user (`store_access::local_user`, checked in the kernel's socket tables),
/// unless told to admit anyone (`store_access::anyone`, for trusted networks only).
///
/// It survives what strangers do: a connection that does not complete the hello within
/// `hello_timeout`, sends something malformed or a request over the limits, is closed and
/// logged; when every slot is taken, the oldest connection still in its hello makes room for a
/// new one. Buffers are bounded per client and for the whole server (`max_buffered`): over the
/// budget, reading pauses, and the largest holder that has stopped moving bytes is closed.
/// The keys and values together are bounded too (`max_stored`): a `set` or `add` that would
/// pass it is refused with a reply that says so. Memory goes back as it drains: a buffer that
/// empties gives its memory up, a value replaced by a smaller one is reallocated, and after
/// large frees the allocator is asked to return free pages to the system.
/// Waits are held on the server and answered when their keys arrive or their time is up, so
/// that a waiting client costs nothing.
#pragma once

#include <fcntl.h>
#if defined(__GLIBC__)
#include <malloc.h>
#endif
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
#include <cohort/detail/net/socket.hpp>
#include <cohort/rendezvous/detail/tcp_store_handshake.hpp>
#include <cohort/rendezvous/detail/tcp_store_protocol.hpp>

namespace cohort {

/// Whom a `tcp_store_server` without a token admits.
enum class store_access {
  local_user,  ///< Processes of this host whose user is the server's (its effective uid).
  anyone,      ///< Any client that speaks the protocol: for a network where everyone is trusted.
};

/// How a `tcp_store_server` runs.
struct tcp_store_server_options {
  std::string token{};  ///< Clients must prove they know this secret; empty: see `tokenless`.
  std::function<void(std::string_view)>
      log{};  ///< Where refused connections are told (stderr if empty).
  std::chrono::milliseconds linger{2000};  ///< On destruction, how long connected clients may stay.
  std::size_t max_clients = 4096;  ///< Connections at once; see the file comment for the overflow.
  store_access tokenless = store_access::local_user;  ///< Whom it admits when `token` is empty.
  std::chrono::milliseconds hello_timeout{
      5000};  ///< A connection not admitted by then is closed; also how long a client over the
              ///< buffer budget may sit without moving a byte before it is closed.
  std::size_t max_buffered = std::size_t(256) << 20;  ///< Bytes all connections' buffers may
                                                      ///< hold together (a request needs up to
                                                      ///< 16 MiB).
  std::size_t max_stored = std::size_t(64) << 20;  ///< Bytes of keys and values the store may
                                                   ///< hold (a job's rendezvous takes a few
                                                   ///< KiB).
};

/// Hosts a TCP store on a thread of its own until destroyed.
class tcp_store_server {
 public:

  /// Listens on `host` (a numeric address or a name; "" is every address) at `port` (0: any).
  /// Throws `cohort::error` when it cannot.
  tcp_store_server(const std::string& host, int port, tcp_store_server_options opts = {})
      : opts_(std::move(opts)), rule_{opts_.token, opts_.tokenless == store_access::local_user} {
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
      eps = detail::net::resolve(host, port, deadline_after(std::chrono::seconds(30)), ec, why);
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

  /// Changes how long connected clients may stay once it is destroyed (see
  /// `tcp_store_server_options::linger`). Call it before the destructor starts.
  void set_linger(std::chrono::milliseconds linger) { opts_.linger = linger; }

  /// The port it listens on.
  int port() const { return local_.port(); }
  /// The address it listens on, as "host:port".
  std::string address() const { return local_.text(); }

 private:
  struct client {
    detail::net::unique_fd fd;
    std::string peer, in, out;
    detail::store_wire::server_handshake hello;
    bool waiting = false, closing = false;
    std::vector<std::string> keys;
    deadline until{};     // of its wait
    deadline admit_by{};  // the end of its hello
    deadline moved{};     // when it last sent or took a byte
  };

  // The most one client may hold unread: one whole request.
  static constexpr std::size_t max_request = detail::store_wire::request_size +
                                             detail::store_wire::max_key +
                                             detail::store_wire::max_value;
  // A client with this much of its replies unread gets no more until it reads.
  static constexpr std::size_t out_pause = std::size_t(1) << 20;
  // A buffer that empties gives its memory back when it holds more than this.
  static constexpr std::size_t keep_capacity = std::size_t(64) << 10;
  // Freed this much since the last time, the allocator is asked to return free pages.
  static constexpr std::size_t trim_after = std::size_t(8) << 20;

  // Empties `s`, giving its memory back if it holds much.
  void release(std::string& s) {
    if (s.capacity() > keep_capacity) {
      freed_ += s.capacity();
      std::string().swap(s);
    } else {
      s.clear();
    }
  }

  // Returns free memory to the system once enough was freed (glibc keeps it otherwise: the
  // server's thread has an arena of its own, trimmed only from its top).
  void trim() {
    if (freed_ < trim_after) return;
    freed_ = 0;
#if defined(__GLIBC__)
    ::malloc_trim(0);
#endif
  }

  static std::size_t held(const client& c) { return c.in.size() + c.out.size(); }

  void run() {
    std::vector<pollfd> pfds;
    bool stopping = false;
    deadline stop_at{};
    for (;;) {
      auto now = clock::now();
      deadline next = now + std::chrono::hours(1);
      std::size_t authed = 0, buffered = 0;
      for (auto& c : clients_) {
        if (!c->hello.admitted() && now >= c->admit_by) {
          if (!c->closing)
            opts_.log("store: closed the connection from " + c->peer + ": no hello within " +
                      std::to_string(opts_.hello_timeout.count()) + " ms");
          c->closing = true;  // dropped with what it had left to send
          c->out.clear();
          continue;
        }
        if (c->waiting) next = std::min(next, c->until);
        if (!c->hello.admitted()) next = std::min(next, c->admit_by);
        authed += c->hello.admitted() && !c->closing;
        buffered += held(*c);
      }
      drop_closed();
      if (stopping && (authed == 0 || now >= stop_at)) return;
      if (stopping) next = std::min(next, stop_at);
      if (buffered >= opts_.max_buffered) {
        if (client* c = stalled_holder(now, next)) {
          buffered -= held(*c);
          refuse(*c, "the store's buffers are full (" + std::to_string(buffered + held(*c)) +
                         " bytes of " + std::to_string(opts_.max_buffered) +
                         "); it held the most and moved nothing for " +
                         std::to_string(opts_.hello_timeout.count()) + " ms");
        }
      }
      pfds.clear();
      pfds.push_back({wake_rd_.get(), POLLIN, 0});
      pfds.push_back({stopping ? -1 : listener_.get(), POLLIN, 0});
      for (auto& c : clients_) {
        short ev = 0;
        if (!c->closing &&
            (c->hello.admitted() ? c->in.size() < max_request && buffered < opts_.max_buffered
                                 : c->hello.wanted(c->in.size()) > 0))
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
          stop_at = deadline_after(opts_.linger);
        }
      }
      const std::size_t polled = pfds.size() - 2;
      for (std::size_t i = 0; i < polled && i < clients_.size(); ++i) {
        auto& c = *clients_[i];
        const short re = pfds[i + 2].revents;
        const std::size_t before = held(c);
        if (re & (POLLIN | POLLHUP | POLLERR)) {
          const std::size_t room =
              opts_.max_buffered > buffered ? opts_.max_buffered - buffered : 0;
          read_from(c,
                    c.hello.admitted() ? std::min(room, max_request - c.in.size())
                                       : c.hello.wanted(c.in.size()),
                    re);
        }
        if (!c.closing) process(c);
        if (!c.out.empty() && (re & POLLOUT || !c.closing)) write_to(c);
        buffered = buffered - std::min(buffered, before) + held(c);
      }
      if (pfds[1].revents) accept_all();
      expire_waits();
      for (auto& c : clients_) {  // requests that arrived behind a wait answered just now
        if (!c->closing && !c->waiting && !c->in.empty()) process(*c);
        if (!c->out.empty()) write_to(*c);
      }
      drop_closed();
      trim();
    }
  }

  // Forgets the connections that are closed and have nothing left to send.
  void drop_closed() {
    std::erase_if(clients_, [&](const auto& c) {
      if (!c->closing || !c->out.empty()) return false;
      freed_ += c->in.capacity() + c->out.capacity();
      return true;
    });
  }

  // Over the buffer budget: the admitted client holding the most that has moved nothing for
  // `hello_timeout`, or null (then `next` is when one may qualify).
  client* stalled_holder(deadline now, deadline& next) {
    client* worst = nullptr;
    for (auto& c : clients_) {
      if (c->closing || !c->hello.admitted() || held(*c) == 0) continue;
      if (now < later(c->moved, opts_.hello_timeout)) {
        next = std::min(next, later(c->moved, opts_.hello_timeout));
        continue;
      }
      if (!worst || held(*c) > held(*worst)) worst = c.get();
    }
    return worst;
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
      if (clients_.size() >= opts_.max_clients && !make_room()) {
        ::close(fd);
        opts_.log("store: refused a connection from " + e.text() + ": too many clients");
        continue;
      }
      auto c = std::make_unique<client>();
      c->fd.reset(fd);
      c->peer = e.text();
      c->admit_by = deadline_after(opts_.hello_timeout);
      c->moved = clock::now();
      clients_.push_back(std::move(c));
    }
  }

  // Every slot is taken: drops the oldest connection still in its hello (a legitimate client
  // finishes its hello in a few round trips), so that silent strangers cannot keep ranks out.
  bool make_room() {
    auto oldest = clients_.end();
    for (auto it = clients_.begin(); it != clients_.end(); ++it)
      if (!(*it)->hello.admitted() &&
          (oldest == clients_.end() || (*it)->admit_by < (*oldest)->admit_by))
        oldest = it;
    if (oldest == clients_.end()) return false;
    opts_.log("store: closed the connection from " + (*oldest)->peer +
              ": every slot is taken and it had not finished its hello");
    clients_.erase(oldest);
    return true;
  }

  // Reads at most `limit` bytes (at most 1 MiB at a time, so that one client does not hold
  // the loop); a closed or failed connection is dropped. `events`: what poll said.
  void read_from(client& c, std::size_t limit, short events) {
    char buf[65536];
    bool closed = false;
    for (int i = 0; i < 16 && !closed; ++i) {
      const std::size_t want = std::min(limit, sizeof buf);
      if (want == 0) {  // nothing may be read now; a hang-up or an error still ends it
        closed = events & (POLLHUP | POLLERR);
        break;
      }
      const ssize_t n = ::recv(c.fd.get(), buf, want, MSG_DONTWAIT);
      if (n > 0) {
        c.in.append(buf, static_cast<std::size_t>(n));
        c.moved = clock::now();
        limit -= static_cast<std::size_t>(n);
        if (static_cast<std::size_t>(n) < want) break;
      } else if (n < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK)) {
        if (errno != EINTR) break;
      } else {
        closed = true;
      }
    }
    if (!closed) return;
    c.closing = true;  // closed or failed: drop it, and any wait it held
    c.out.clear();
    c.waiting = false;
  }

  void write_to(client& c) {
    while (!c.out.empty()) {
      const ssize_t n = ::send(c.fd.get(), c.out.data(), c.out.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
      if (n > 0) {
        c.out.erase(0, static_cast<std::size_t>(n));
        c.moved = clock::now();
        if (c.out.empty()) release(c.out);
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

  // Handles every complete request in `c.in`; one wait at a time holds the rest, and a client
  // that does not read its replies gets no more.
  void process(client& c) {
    namespace w = detail::store_wire;
    auto bytes = [&] { return reinterpret_cast<const std::byte*>(c.in.data()); };
    while (!c.closing && !c.waiting && c.out.size() < out_pause) {
      if (!c.hello.admitted()) {
        std::string why;
        using state = detail::store_wire::server_handshake::state;
        const state s = c.hello.step(c.in, c.out, rule_, nonces_, c.fd.get(), why);
        if (s == state::refused) {
          std::string told = std::move(c.out);  // the verdict, when the client may hear why
          if (why == "wrong token") note_wrong_token(c);
          refuse(c, why);
          c.out = std::move(told);
        }
        if (s != state::admitted) return;
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
          if (!put(c, std::move(key), value)) break;
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
          auto it = data_.find(key);
          std::int64_t now = 0, sum = 0;
          if (it != data_.end() && !it->second.empty()) {
            const std::string& v = it->second;
            auto [end, e] = std::from_chars(v.data(), v.data() + v.size(), now);
            if (e != std::errc{} || end != v.data() + v.size()) {
              reply(c, w::status::bad_request, "the value is not an integer", 0);
              break;
            }
          }
          if (__builtin_add_overflow(now, req->arg, &sum)) {
            reply(c, w::status::bad_request,
                  std::to_string(now) + " + " + std::to_string(req->arg) +
                      " overflows a 64-bit integer; the value is unchanged",
                  0);
            break;
          }
          if (!put(c, std::move(key), std::to_string(sum))) break;
          reply(c, w::status::ok, {}, sum);
          woke_ = true;
          break;
        }
        case w::op::wait: {
          auto keys = w::decode_keys(value);
          if (!keys) return refuse(c, "malformed key list");
          c.keys = std::move(*keys);
          c.waiting = true;
          c.until = deadline_after(
              std::chrono::milliseconds(std::clamp<std::int64_t>(req->arg, 0, 86'400'000)));
          break;
        }
      }
      c.in.erase(0, total);
      if (c.in.empty()) release(c.in);
      if (c.waiting) answer_if_ready(c, false);
      if (woke_) {
        woke_ = false;
        for (auto& other : clients_)
          if (other->waiting) answer_if_ready(*other, false);
      }
    }
  }

  // A process of this user on this host came with another token: most likely a rank of the
  // job started with another COHORT_TOKEN. Says so under `store_wire::refusal_key` (wall-clock
  // ns, then the
  // address), so that the ranks waiting for it fail at once instead of at their deadline. Only
  // for this user's processes: a stranger must not be able to stop a job this way.
  void note_wrong_token(const client& c) {
    const auto owner = detail::net::peer_uid(c.fd.get());
    if (owner.what != detail::net::peer_owner::kind::local || owner.uid != ::geteuid()) return;
    const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                        std::chrono::system_clock::now().time_since_epoch())
                        .count();
    std::string v = std::to_string(ns) + " " + c.peer;
    const std::string key(detail::store_wire::refusal_key);
    auto it = data_.find(key);
    const std::size_t old = it == data_.end() ? 0 : key.size() + it->second.size();
    if (stored_ - old + key.size() + v.size() > opts_.max_stored) return;
    stored_ = stored_ - old + key.size() + v.size();
    data_[key] = std::move(v);
    woke_ = true;
  }

  // Sets `key` to `value` unless the map would pass `max_stored` (then replies why and returns
  // false). A value replaced by a smaller one is reallocated, so that its memory goes back.
  bool put(client& c, std::string key, std::string_view value) {
    auto it = data_.find(key);
    const std::size_t old = it == data_.end() ? 0 : key.size() + it->second.size();
    const std::size_t now = stored_ - old + key.size() + value.size();
    if (now > opts_.max_stored && now > stored_) {
      reply(c, detail::store_wire::status::bad_request,
            "the store holds " + std::to_string(stored_) + " bytes of keys and values; this " +
                "would take it to " + std::to_string(now) + ", over its limit (max_stored, " +
                std::to_string(opts_.max_stored) + " bytes); the value is unchanged",
            0);
      return false;
    }
    stored_ = now;
    if (it == data_.end()) {
      data_.emplace(std::move(key), std::string(value));
    } else if (it->second.capacity() > keep_capacity && value.size() < it->second.capacity() / 2) {
      freed_ += it->second.capacity();
      std::string(value).swap(it->second);
    } else {
      it->second.assign(value);
    }
    return true;
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
  detail::store_wire::admission_rule rule_;
  detail::store_wire::nonce_source nonces_;
  std::size_t stored_ = 0;  // bytes of keys and values in data_
  std::size_t freed_ = 0;   // bytes freed since the last trim
  bool woke_ = false;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace cohort
