/// @file
/// tcp_store: a client of the store a `tcp_store_server` hosts (rank 0, at MASTER_ADDR:MASTER_PORT
/// under `make_tcp_communicator`). Plain POSIX sockets; no Asio.
///
/// The client connects on first use and again after any failure, retrying with backoff until
/// the operation's deadline, so ranks may start before the server does. Waits are held on the
/// server, which answers with the keys still missing when the time is up.
///
/// Each connection opens with a challenge and response (detail/tcp_store_protocol.hpp). With a
/// token, the client proves that it knows it and checks that the server does too, so it never
/// talks to a store that does not know the job's secret; the token itself is never sent.
/// Without one, it uses only a server that wants none.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

#include <cohort/core/error.hpp>
#include <cohort/core/options.hpp>
#include <cohort/detail/net/socket.hpp>
#include <cohort/rendezvous/detail/tcp_store_handshake.hpp>
#include <cohort/rendezvous/detail/tcp_store_protocol.hpp>
#include <cohort/rendezvous/store.hpp>
#include <cohort/rendezvous/tcp_store_server.hpp>

namespace cohort {

/// How a `tcp_store` client behaves.
struct tcp_store_options {
  std::string token{};  ///< The secret the server wants (COHORT_TOKEN); empty when it wants none.
  std::chrono::milliseconds timeout{
      30'000};  ///< Deadline of set, try_get and add (connecting included).
};

/// A client of a `tcp_store_server`; models `store`. Not thread-safe.
class tcp_store final : public store {
 public:
  /// A client of the server at `host` (name or numeric) and `port`; connects on first use.
  tcp_store(std::string host, int port, tcp_store_options opts = {})
      : host_(std::move(host)), port_(port), opts_(std::move(opts)) {}

  /// Closes the connection (the server forgets nothing: keys stay).
  void disconnect() noexcept { fd_.reset(); }

  /// "host:port" of the server.
  std::string server() const { return host_ + ":" + std::to_string(port_); }

  std::string describe() const override { return "the store at " + server(); }

 protected:
  void do_set(std::string_view key, std::string_view value, std::error_code& ec) override {
    namespace w = detail::store_wire;
    if (!check_key(key, ec) || !check_value(value, ec)) return;
    reply r;
    roundtrip(w::op::set, key, value, 0, deadline_after(opts_.timeout), r, ec);
    if (!ec && r.s != w::status::ok)  // refused: the store is full
      fail(ec, errc::invalid_argument, "set: " + r.payload + " (key \"" + std::string(key) + "\")");
  }

  std::optional<std::string> do_try_get(std::string_view key, std::error_code& ec) override {
    return do_try_get_until(key, deadline_after(opts_.timeout), ec);
  }

  std::optional<std::string> do_try_get_until(std::string_view key, deadline until,
                                              std::error_code& ec) override {
    namespace w = detail::store_wire;
    if (!check_key(key, ec)) return std::nullopt;
    reply r;
    roundtrip(w::op::get, key, {}, 0, std::min(until, deadline_after(opts_.timeout)), r, ec);
    if (ec || r.s != w::status::ok) return std::nullopt;
    return std::move(r.payload);
  }

  std::int64_t do_add(std::string_view key, std::int64_t n, std::error_code& ec) override {
    namespace w = detail::store_wire;
    if (!check_key(key, ec)) return 0;
    reply r;
    roundtrip(w::op::add, key, {}, n, deadline_after(opts_.timeout), r, ec);
    if (!ec && r.s != w::status::ok)
      fail(ec, errc::invalid_argument, "add: " + r.payload + " (key \"" + std::string(key) + "\")");
    return r.number;
  }

  std::vector<std::string> do_wait(std::span<const std::string> keys, deadline until,
                                   std::error_code& ec) override {
    namespace w = detail::store_wire;
    std::vector<std::string> all(keys.begin(), keys.end());
    for (const auto& k : keys)
      if (!check_key(k, ec)) return all;
    const std::string list = w::encode_keys(keys);
    if (!check_value(list, ec)) return all;
    // The server holds the wait for the time left when the request arrives, so it answers at
    // `until`; its answer has a moment past that. Connecting comes first, so that the time it
    // takes is not waited again on the server: a server that refuses is tried again until
    // `until` only (each try bounded by the answer's deadline); the moment is for the answer.
    const deadline answer_by = later(until, std::chrono::seconds(2));
    if (!connect(answer_by, until, ec)) return all;
    const auto left = std::chrono::ceil<std::chrono::milliseconds>(until - clock::now()).count();
    reply r;
    roundtrip(w::op::wait, {}, list, std::max<long long>(left, 0), answer_by, r, ec);
    if (ec) return all;
    if (r.s == w::status::ok) return {};
    auto missing = w::decode_keys(r.payload);
    if (!missing) {
      fd_.reset();
      fail(ec, errc::protocol_error, "the store at " + server() + " sent a malformed reply");
      return all;
    }
    fail(ec, errc::timed_out,
         "timed out waiting for " + std::to_string(missing->size()) + " of " +
             std::to_string(keys.size()) + " keys at the store " + server());
    return std::move(*missing);
  }

 private:
  struct reply {
    detail::store_wire::status s = detail::store_wire::status::ok;
    std::int64_t number = 0;
    std::string payload;
  };

  bool check_key(std::string_view key, std::error_code& ec) {
    if (!key.empty() && key.size() <= detail::store_wire::max_key) return true;
    fail(ec, errc::invalid_argument, "a key must be 1 to 4096 bytes");
    return false;
  }
  bool check_value(std::string_view value, std::error_code& ec) {
    if (value.size() <= detail::store_wire::max_value) return true;
    fail(ec, errc::invalid_argument, "a value (or key list) must be at most 16 MiB");
    return false;
  }

  // Connects and says hello, each try bounded by `until`; after a refused or failed try, tries
  // again with backoff, the last try at `retry_until` (<= `until`).
  bool connect(deadline until, deadline retry_until, std::error_code& ec) {
    if (fd_) return true;
    std::string why;
    if (endpoints_.empty()) {
      endpoints_ = detail::net::resolve(host_, port_, until, ec, why);
      if (ec) return fail(ec, ec, why), false;
    }
    auto backoff = std::chrono::milliseconds(5);
    std::error_code last;
    for (;;) {
      for (const auto& e : endpoints_) {
        const auto attempt = std::min(until, deadline_after(std::chrono::seconds(5)));
        detail::net::unique_fd fd = detail::net::connect_to(e, attempt, last);
        if (last) continue;
        if (!hello(fd.get(), until, ec)) {
          if (ec != errc::peer_lost) return false;  // refused: it would refuse again
          ec.clear();  // closed during the hello (a full server, one restarting): try again
          continue;
        }
        fd_ = std::move(fd);
        return true;
      }
      const auto now = clock::now();
      if (now >= retry_until) {
        fail(ec, errc::timed_out,
             "no store server answered at " + server() + " before the deadline (last error: " +
                 (last ? last.message() : last_error()) + ")");
        return false;
      }
      std::this_thread::sleep_for(std::min<clock::duration>(backoff, retry_until - now));
      backoff = std::min(backoff * 2, std::chrono::milliseconds(500));
    }
  }

  bool hello(int fd, deadline until, std::error_code& ec) {
    std::string why;
    if (detail::store_wire::client_handshake(fd, opts_.token, server(), until, ec, why))
      return true;
    fail(ec, ec, std::move(why));
    return false;
  }

  // One request and its reply by `until` (connecting first where the client is not connected).
  void roundtrip(detail::store_wire::op kind, std::string_view key, std::string_view value,
                 std::int64_t arg, deadline until, reply& r, std::error_code& ec) {
    namespace w = detail::store_wire;
    if (!connect(until, until, ec)) return;
    std::byte h[w::request_size];
    w::encode_request(h, kind, key.size(), value.size(), arg);
    std::string msg(reinterpret_cast<const char*>(h), sizeof h);
    msg += key;
    msg += value;
    detail::net::send_all(fd_.get(), msg.data(), msg.size(), until, ec);
    std::byte rh[w::reply_size];
    if (!ec) detail::net::recv_all(fd_.get(), rh, sizeof rh, until, ec);
    if (!ec) {
      const auto len = w::load_le<std::uint32_t>(rh + 4);
      const auto s = std::to_integer<std::uint8_t>(rh[0]);
      if (len > w::max_value + 8 || s > 3) {
        fd_.reset();
        return fail(ec, errc::protocol_error,
                    "the store at " + server() + " sent a malformed reply");
      }
      r.s = static_cast<w::status>(s);
      r.number = static_cast<std::int64_t>(w::load_le<std::uint64_t>(rh + 8));
      r.payload.resize(len);
      detail::net::recv_all(fd_.get(), r.payload.data(), len, until, ec);
    }
    if (ec) {
      fd_.reset();  // the stream's state is unknown now; the next call reconnects
      if (ec == errc::timed_out)
        fail(ec, ec, "the store at " + server() + " did not answer in time");
      else
        fail(ec, ec, "lost the connection to the store at " + server());
    }
  }

  std::string host_;
  int port_;
  tcp_store_options opts_;
  std::vector<detail::net::endpoint> endpoints_;
  detail::net::unique_fd fd_;
};

}  // namespace cohort
