/// @file
/// The store interface ranks meet at: a key-value store with waits that have deadlines.
///
/// | expression            | semantics |
/// |-----------------------|-----------|
/// | `s.set(key, value)`   | sets `key`, replacing any value |
/// | `s.try_get(key)`      | the value now, or nullopt |
/// | `s.get(key, until)`   | waits until `key` exists, then its value; `timed_out` at `until` |
/// | `s.add(key, n)`       | adds `n` to the integer at `key` (absent: 0), returns the sum |
/// | `s.wait(keys, until)` | waits for every key; at `until`: `timed_out` and the ones missing |
///
/// `add` is atomic; values are bytes, integers in decimal. An `add` whose sum would leave the
/// range of `std::int64_t` fails with `invalid_argument` and leaves the value as it was.
///
/// Every operation has a throwing overload (`cohort::error`, operation "store.<name>") and an
/// `std::error_code&` one; `last_error()` holds the sentence that goes with the last code.
/// Models: `tcp_store` (a server one rank hosts), `file_store` (a shared directory),
/// `redis_store` (a Redis server; needs hiredis). No Asio in any of them.
#pragma once

#include <algorithm>
#include <charconv>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include <cohort/core/error.hpp>
#include <cohort/core/options.hpp>

namespace cohort {

class store;
inline std::vector<int> wait_for_ranks(store& s, std::string_view prefix, int size, deadline until,
                                       std::error_code& ec);

/// A key-value store with deadlines, shared by the ranks of a job (see the table above).
class store {
 public:
  virtual ~store() = default;

  /// Sets `key` to `value`.
  void set(std::string_view key, std::string_view value, std::error_code& ec) {
    ec.clear();
    do_set(key, value, ec);
  }
  void set(std::string_view key, std::string_view value) {
    std::error_code ec;
    set(key, value, ec);
    throw_if(ec, "set");
  }

  /// The value of `key` now, or nullopt when it is absent.
  std::optional<std::string> try_get(std::string_view key, std::error_code& ec) {
    ec.clear();
    return do_try_get(key, ec);
  }
  std::optional<std::string> try_get(std::string_view key) {
    std::error_code ec;
    auto v = try_get(key, ec);
    throw_if(ec, "try_get");
    return v;
  }

  /// The same, giving up at `until`: a store that went away (or stopped answering) costs the
  /// caller no more than that, however long the store's own timeout.
  std::optional<std::string> try_get(std::string_view key, deadline until, std::error_code& ec) {
    ec.clear();
    return do_try_get_until(key, until, ec);
  }
  std::optional<std::string> try_get(std::string_view key, deadline until) {
    std::error_code ec;
    auto v = try_get(key, until, ec);
    throw_if(ec, "try_get");
    return v;
  }

  /// Waits until `key` exists and returns its value; `errc::timed_out` at `until`.
  std::string get(std::string_view key, deadline until, std::error_code& ec) {
    const std::string k(key);
    if (wait(std::span(&k, 1), until, ec); ec) return {};
    auto v = try_get(key, ec);
    return v ? std::move(*v) : std::string();
  }
  std::string get(std::string_view key, deadline until) {
    std::error_code ec;
    auto v = get(key, until, ec);
    throw_if(ec, "get");
    return v;
  }

  /// Adds `n` to the integer at `key` (0 when absent) and returns the new value;
  /// `errc::invalid_argument` when the value is not an integer or the sum would overflow.
  std::int64_t add(std::string_view key, std::int64_t n, std::error_code& ec) {
    ec.clear();
    return do_add(key, n, ec);
  }
  std::int64_t add(std::string_view key, std::int64_t n) {
    std::error_code ec;
    auto v = add(key, n, ec);
    throw_if(ec, "add");
    return v;
  }

  /// Waits until every one of `keys` exists. At `until`, sets `errc::timed_out` and returns the
  /// keys still missing (all of them when the store could not say).
  std::vector<std::string> wait(std::span<const std::string> keys, deadline until,
                                std::error_code& ec) {
    ec.clear();
    if (keys.empty()) return {};
    return do_wait(keys, until, ec);
  }
  void wait(std::span<const std::string> keys, deadline until) {
    std::error_code ec;
    wait(keys, until, ec);
    throw_if(ec, "wait");
  }

  /// A sentence about the last failure ("timed out waiting for 2 keys", "no server at ...").
  const std::string& last_error() const noexcept { return last_error_; }

  /// The store for messages: "the store at 10.0.0.1:29500", "the file store in /shared/job".
  virtual std::string describe() const { return "the store"; }

 protected:
  virtual void do_set(std::string_view key, std::string_view value, std::error_code& ec) = 0;
  virtual std::optional<std::string> do_try_get(std::string_view key, std::error_code& ec) = 0;
  /// `try_get` bounded by `until`. Stores whose calls cannot block (a file, memory) need not
  /// override it.
  virtual std::optional<std::string> do_try_get_until(std::string_view key, deadline until,
                                                      std::error_code& ec) {
    (void)until;
    return do_try_get(key, ec);
  }
  virtual std::int64_t do_add(std::string_view key, std::int64_t n, std::error_code& ec) = 0;
  virtual std::vector<std::string> do_wait(std::span<const std::string> keys, deadline until,
                                           std::error_code& ec) = 0;

  /// Sets `ec` and the sentence that goes with it.
  void fail(std::error_code& ec, std::error_code code, std::string why) {
    ec = code;
    last_error_ = std::move(why);
  }

 private:
  void throw_if(std::error_code ec, const char* name) const {
    if (ec)
      throw error(ec, std::string("store.") + name, -1,
                  std::string("store.") + name + ": " + last_error_);
  }

  friend std::vector<int> wait_for_ranks(store& s, std::string_view prefix, int size,
                                         deadline until, std::error_code& ec);

  std::string last_error_;
};

/// Waits until every rank in [0, size) has set `prefix + std::to_string(rank)`; returns the
/// ranks still missing at `until` (with `errc::timed_out`), or an empty list. A store that
/// names a key it was not asked about fails it with `errc::protocol_error`.
inline std::vector<int> wait_for_ranks(store& s, std::string_view prefix, int size, deadline until,
                                       std::error_code& ec) {
  std::vector<std::string> keys;
  keys.reserve(static_cast<std::size_t>(size));
  for (int q = 0; q < size; ++q) keys.push_back(std::string(prefix) + std::to_string(q));
  std::vector<int> missing;
  for (const auto& k : s.wait(keys, until, ec)) {
    // The keys come back from the store: parse them as strangers' bytes.
    int q = -1;
    const std::string_view rest = std::string_view(k).substr(std::min(prefix.size(), k.size()));
    const auto [end, e] = std::from_chars(rest.data(), rest.data() + rest.size(), q);
    if (!k.starts_with(prefix) || e != std::errc{} || end != rest.data() + rest.size() || q < 0 ||
        q >= size || k != keys[static_cast<std::size_t>(q)]) {
      std::string shown = k.substr(0, 200);
      for (char& c : shown)
        if (static_cast<unsigned char>(c) < 0x20 || static_cast<unsigned char>(c) > 0x7e) c = '?';
      s.fail(ec, make_error_code(errc::protocol_error),
             s.describe() + " answered a wait with the key \"" + shown +
                 "\", which is not one of the " + std::to_string(size) + " keys \"" +
                 std::string(prefix) + "0\" to \"" + keys.back() + "\" it was asked about");
      return {};
    }
    missing.push_back(q);
  }
  return missing;
}

/// "rank 3" or "ranks 1, 2 and 5" (at most 16 named, then "and N more").
inline std::string describe_ranks(const std::vector<int>& ranks) {
  std::string s = ranks.size() == 1 ? "rank " : "ranks ";
  const std::size_t shown = std::min<std::size_t>(ranks.size(), 16);
  for (std::size_t i = 0; i < shown; ++i) {
    if (i > 0) s += (i + 1 == shown && shown == ranks.size()) ? " and " : ", ";
    s += std::to_string(ranks[i]);
  }
  if (shown < ranks.size()) s += " and " + std::to_string(ranks.size() - shown) + " more";
  return s;
}

}  // namespace cohort
