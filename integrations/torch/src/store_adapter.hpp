/// @file
/// `torch_store`: cohort's `store` interface over torch's `c10d::Store`, so that a process
/// group meets its peers through the store torchrun (or init_process_group) already made.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <thread>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

#include <c10/util/intrusive_ptr.h>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <cohort/core/error.hpp>
#include <cohort/core/options.hpp>
#include <cohort/rendezvous/store.hpp>

namespace cohort_torch {

/// A `cohort::store` that forwards to a `c10d::Store`. c10d's waits throw on timeout and its
/// `get` waits with the store's own timeout, so `try_get` asks `check` first and `wait` polls
/// `check` against cohort's deadline (in steps that grow to 10 ms).
class torch_store final : public cohort::store {
 public:
  explicit torch_store(c10::intrusive_ptr<c10d::Store> s) : store_(std::move(s)) {}

  std::string describe() const override { return "torch's store"; }

 protected:
  void do_set(std::string_view key, std::string_view value, std::error_code& ec) override {
    guard(ec, "set", [&] {
      store_->set(std::string(key), std::vector<std::uint8_t>(value.begin(), value.end()));
    });
  }

  std::optional<std::string> do_try_get(std::string_view key, std::error_code& ec) override {
    std::optional<std::string> v;
    guard(ec, "get", [&] {
      const std::string k(key);
      if (!store_->check({k})) return;
      const auto bytes = store_->get(k);
      v.emplace(bytes.begin(), bytes.end());
    });
    return v;
  }

  std::int64_t do_add(std::string_view key, std::int64_t n, std::error_code& ec) override {
    std::int64_t v = 0;
    guard(ec, "add", [&] { v = store_->add(std::string(key), n); });
    return v;
  }

  std::vector<std::string> do_wait(std::span<const std::string> keys, cohort::deadline until,
                                   std::error_code& ec) override {
    std::vector<std::string> missing(keys.begin(), keys.end());
    auto pause = std::chrono::microseconds(50);
    for (;;) {
      bool failed = false;
      guard(ec, "check", [&] {
        std::vector<std::string> still;
        for (auto& k : missing)
          if (!store_->check({k})) still.push_back(std::move(k));
        missing = std::move(still);
      });
      if (ec) failed = true;
      if (failed || missing.empty()) return failed ? std::vector<std::string>(keys.begin(), keys.end()) : missing;
      if (cohort::clock::now() >= until) {
        fail(ec, make_error_code(cohort::errc::timed_out),
             "timed out waiting for " + std::to_string(missing.size()) + " key(s) at torch's "
             "store, \"" + missing.front() + "\" among them");
        return missing;
      }
      std::this_thread::sleep_for(pause);
      pause = std::min<std::chrono::microseconds>(pause * 2, std::chrono::milliseconds(10));
    }
  }

 private:
  template <class Fn>
  void guard(std::error_code& ec, const char* what, Fn fn) {
    try {
      fn();
    } catch (const std::exception& e) {
      fail(ec, make_error_code(cohort::errc::peer_lost),
           std::string("torch's store failed a ") + what + ": " + e.what());
    }
  }

  c10::intrusive_ptr<c10d::Store> store_;
};

}  // namespace cohort_torch
