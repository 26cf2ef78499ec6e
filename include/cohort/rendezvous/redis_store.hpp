/// @file
/// redis_store: a store on a Redis server, through hiredis (Debian: libhiredis-dev; link
/// `-lhiredis`, or `dependency('hiredis')` in Meson). Optional: nothing else includes it.
///
/// Keys live under a prefix (give each job its own: keys are never deleted); `add` is INCRBY;
/// waits poll with EXISTS, backing off from 1 ms to 20 ms. Each command has a deadline
/// (`redis_store_options::timeout`); a failed connection is rebuilt on the next call.
#pragma once

// Without hiredis this header declares nothing, so that it still compiles on its own;
// COHORT_HAS_REDIS_STORE says which.
#if !__has_include(<hiredis/hiredis.h>)
#define COHORT_HAS_REDIS_STORE 0
#else
#define COHORT_HAS_REDIS_STORE 1

#include <hiredis/hiredis.h>
#include <sys/time.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <thread>
#include <vector>

#include <cohort/core/error.hpp>
#include <cohort/core/options.hpp>
#include <cohort/rendezvous/store.hpp>

namespace cohort {

/// How a `redis_store` connects.
struct redis_store_options {
  std::string prefix;                         ///< Put before every key, e.g. "cohort/<job id>/".
  std::string password;                       ///< Sent with AUTH when not empty.
  std::chrono::milliseconds timeout{30'000};  ///< Deadline of connecting and of each command.
};

/// A store on a Redis server; models `store`. Not thread-safe.
class redis_store final : public store {
 public:
  /// Connects to Redis at `host`:`port`; throws `cohort::error` if it cannot within the timeout.
  redis_store(std::string host, int port, redis_store_options opts = {})
      : host_(std::move(host)), port_(port), opts_(std::move(opts)) {
    std::error_code ec;
    if (!connect(ec)) throw error(ec, "redis_store", -1, "redis_store: " + last_error());
  }

  std::string describe() const override { return "the Redis store at " + where(); }

 protected:
  void do_set(std::string_view key, std::string_view value, std::error_code& ec) override {
    const std::string k = opts_.prefix + std::string(key);
    command(ec, "SET %b %b", k.data(), k.size(), value.data(), value.size());
  }

  std::optional<std::string> do_try_get(std::string_view key, std::error_code& ec) override {
    const std::string k = opts_.prefix + std::string(key);
    auto r = command(ec, "GET %b", k.data(), k.size());
    if (ec || !r || r->type != REDIS_REPLY_STRING) return std::nullopt;
    return std::string(r->str, r->len);
  }

  std::int64_t do_add(std::string_view key, std::int64_t n, std::error_code& ec) override {
    const std::string k = opts_.prefix + std::string(key);
    const std::string by = std::to_string(n);
    auto r = command(ec, "INCRBY %b %b", k.data(), k.size(), by.data(), by.size());
    return (!ec && r && r->type == REDIS_REPLY_INTEGER) ? r->integer : 0;
  }

  std::vector<std::string> do_wait(std::span<const std::string> keys, deadline until,
                                   std::error_code& ec) override {
    std::vector<std::string> left(keys.begin(), keys.end());
    auto pause = std::chrono::milliseconds(1);
    for (;;) {
      std::vector<std::string> still;
      for (const auto& key : left) {
        const std::string k = opts_.prefix + key;
        auto r = command(ec, "EXISTS %b", k.data(), k.size());
        if (ec) return left;
        if (!r || r->type != REDIS_REPLY_INTEGER || r->integer == 0) still.push_back(key);
      }
      left.swap(still);
      if (left.empty()) return {};
      if (clock::now() >= until) break;
      std::this_thread::sleep_for(std::min<clock::duration>(pause, until - clock::now()));
      pause = std::min(pause * 2, std::chrono::milliseconds(20));
    }
    fail(ec, errc::timed_out,
         "timed out waiting for " + std::to_string(left.size()) + " of " +
             std::to_string(keys.size()) + " keys at Redis " + where());
    return left;
  }

 private:
  struct context_free {
    void operator()(redisContext* c) const noexcept { redisFree(c); }
  };
  struct reply_free {
    void operator()(redisReply* r) const noexcept { freeReplyObject(r); }
  };
  using reply_ptr = std::unique_ptr<redisReply, reply_free>;

  std::string where() const { return host_ + ":" + std::to_string(port_); }

  timeval tv() const {
    // In seconds first: a timeout of milliseconds::max() overflows a count of microseconds.
    const auto s = std::chrono::duration_cast<std::chrono::seconds>(opts_.timeout);
    const auto us = std::chrono::duration_cast<std::chrono::microseconds>(opts_.timeout - s);
    return {static_cast<time_t>(s.count()), static_cast<suseconds_t>(us.count())};
  }

  bool connect(std::error_code& ec) {
    const timeval t = tv();
    ctx_.reset(redisConnectWithTimeout(host_.c_str(), port_, t));
    if (!ctx_ || ctx_->err) {
      const std::string why = ctx_ ? ctx_->errstr : "out of memory";
      ctx_.reset();
      fail(ec, errc::peer_lost, "cannot connect to Redis at " + where() + ": " + why);
      return false;
    }
    redisSetTimeout(ctx_.get(), t);
    if (!opts_.password.empty()) {
      reply_ptr r(static_cast<redisReply*>(
          redisCommand(ctx_.get(), "AUTH %b", opts_.password.data(), opts_.password.size())));
      if (!r || r->type == REDIS_REPLY_ERROR) {
        ctx_.reset();
        fail(ec, errc::invalid_argument, "Redis at " + where() + " refused the password");
        return false;
      }
    }
    return true;
  }

  template <class... Args>
  reply_ptr command(std::error_code& ec, const char* format, Args... args) {
    if (!ctx_ && !connect(ec)) return nullptr;
    reply_ptr r(static_cast<redisReply*>(redisCommand(ctx_.get(), format, args...)));
    if (!r) {
      const bool timeout = ctx_->err == REDIS_ERR_IO && (errno == EAGAIN || errno == EWOULDBLOCK);
      const std::string why = ctx_->errstr;
      ctx_.reset();
      fail(ec, timeout ? make_error_code(errc::timed_out) : make_error_code(errc::peer_lost),
           "Redis at " + where() + ": " + why);
      return nullptr;
    }
    if (r->type == REDIS_REPLY_ERROR) {
      fail(ec, errc::invalid_argument,
           "Redis at " + where() + " said: " + std::string(r->str, r->len));
      return nullptr;
    }
    return r;
  }

  std::string host_;
  int port_;
  redis_store_options opts_;
  std::unique_ptr<redisContext, context_free> ctx_;
};

}  // namespace cohort

#endif  // hiredis
