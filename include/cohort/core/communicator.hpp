/// @file
/// The communicator: a transport plus the state every collective call shares.
#pragma once

#include <chrono>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <new>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>

#include <cohort/core/concepts.hpp>
#include <cohort/core/error.hpp>
#include <cohort/core/options.hpp>

namespace cohort {
namespace detail {

/// Call headers whose comparison with the left neighbour's a call left to later calls (see
/// collectives/detail/call.hpp, which gives the bytes their meaning): a rank whose part of a
/// small call only sends returns without waiting for its neighbour to enter the call. Each
/// entry holds this rank's header, the neighbour's as it lands, and the receive bringing it.
template <class Request>
struct unchecked_headers {
  static constexpr std::size_t capacity = 4, header_bytes = 32;
  struct entry {
    alignas(8) std::byte mine[header_bytes];
    alignas(8) std::byte theirs[header_bytes];
    Request recv{};
  };
  entry entries[capacity];
  std::size_t first = 0, count = 0;  // the oldest entry, and how many are pending
};

}  // namespace detail

/// What the collectives need from a communicator (modelled by `basic_communicator`).
template <class C>
concept communicator =
    transport<typename C::transport_type> &&
    requires(C& c, const C& cc, failure f, std::size_t n) {
      { cc.rank() } -> std::same_as<int>;
      { cc.size() } -> std::same_as<int>;
      { c.transport() } -> std::same_as<typename C::transport_type&>;
      { c.next_sequence() } -> std::same_as<std::uint64_t>;
      { cc.timeout() } -> std::same_as<std::chrono::milliseconds>;
      { cc.last_failure() } -> std::same_as<const failure*>;
      { c.fail(std::move(f)) } -> std::same_as<void>;
      { c.scratch(n) } -> std::same_as<std::span<std::byte>>;
    };

/// A group of ranks over `Transport`, with the state collective calls share: the sequence
/// number that matches calls across ranks, the default deadline, reusable scratch memory and
/// the poisoned state.
///
/// After a failure (a timeout, a lost peer, a mismatch, an abort) the communicator is
/// poisoned: every later call fails at once with `errc::poisoned` and the first failure stays
/// readable through `last_failure()`. Build a new communicator to go on. Not thread-safe: one
/// thread calls collectives on a communicator at a time, and every rank calls the same
/// collectives in the same order.
template <transport Transport>
class basic_communicator {
 public:
  using transport_type = Transport;

  /// Takes ownership of a connected transport.
  explicit basic_communicator(Transport t) : transport_(std::move(t)) {}

  /// Builds the transport in place from `args`.
  template <class... Args>
  explicit basic_communicator(std::in_place_t, Args&&... args)
      : transport_(std::forward<Args>(args)...) {}

  basic_communicator(const basic_communicator&) = delete;
  basic_communicator& operator=(const basic_communicator&) = delete;

  /// This process's rank, in [0, size()).
  int rank() const { return transport_.rank(); }
  /// The number of ranks.
  int size() const { return transport_.size(); }
  /// The transport underneath.
  Transport& transport() { return transport_; }

  /// The deadline each call gets unless its options say otherwise (30 s to start).
  std::chrono::milliseconds timeout() const { return timeout_; }
  /// Sets the default per-call deadline. Throws `cohort::error` (`errc::invalid_argument`,
  /// operation "set_timeout") unless `t` is positive: a zero deadline would fail a waiting
  /// rank at once while a rank that need not wait succeeds.
  void set_timeout(std::chrono::milliseconds t) {
    if (t.count() <= 0)
      throw error(errc::invalid_argument, "set_timeout", -1,
                  "set_timeout: the timeout must be positive, not " + std::to_string(t.count()) +
                      " ms");
    timeout_ = t;
  }

  /// The first failure, or null while the communicator is healthy. A call refused for a bad
  /// argument (`errc::invalid_argument`) leaves it healthy and records nothing here (the
  /// `std::error_code` overloads keep its sentence in `last_error()`).
  const failure* last_failure() const { return failure_ ? &*failure_ : nullptr; }
  /// What the last call that reported through a `std::error_code` failed with: its code, peer
  /// and the sentence the throwing overload would have thrown (a bad argument's too), or null
  /// while none has failed. A later failed call replaces it.
  const failure* last_error() const { return error_ ? &*error_ : nullptr; }
  /// Keeps `f` as `last_error()` (the collectives' business: `detail::error_code_for`).
  void note_error(failure&& f) noexcept { error_ = std::move(f); }
  /// True after a failure: later calls fail at once with `errc::poisoned`.
  bool poisoned() const { return failure_.has_value(); }

  /// Fails this communicator and tells every peer, whose pending and later calls then fail
  /// with `errc::aborted`. Safe to call more than once.
  void abort(std::string_view why = "aborted by the application") noexcept {
    fail({make_error_code(errc::aborted), rank(), std::string(why)});
  }

  /// Records `f` as the failure (the first one wins), poisons, and aborts the transport.
  void fail(failure f) noexcept {
    if (failure_) return;
    try {
      failure_ = std::move(f);
    } catch (...) {
      failure_.emplace();
      failure_->code = f.code;
    }
    transport_.abort(*failure_);
  }

  /// The sequence number of the next collective call; both ranks of a matched call agree.
  std::uint64_t next_sequence() { return sequence_++; }

  /// The call headers still to compare with the left neighbour's (the collectives' business).
  /// Receives into them may be pending in the transport, so they are declared before it and
  /// outlive it.
  detail::unchecked_headers<typename Transport::request>& unchecked_headers() {
    return unchecked_;
  }

  /// At least `bytes` bytes of 64-byte-aligned scratch memory, reused across calls (grows,
  /// never shrinks). Invalidated by the next call to `scratch`.
  std::span<std::byte> scratch(std::size_t bytes) {
    if (bytes > scratch_size_) {
      scratch_.reset(static_cast<std::byte*>(::operator new(bytes, std::align_val_t{64})));
      scratch_size_ = bytes;
    }
    return {scratch_.get(), bytes};
  }

 private:
  struct aligned_delete {
    void operator()(std::byte* p) const noexcept { ::operator delete(p, std::align_val_t{64}); }
  };

  detail::unchecked_headers<typename Transport::request> unchecked_;
  Transport transport_;
  std::uint64_t sequence_ = 0;
  std::chrono::milliseconds timeout_ = default_timeout;
  std::optional<failure> failure_, error_;
  std::unique_ptr<std::byte, aligned_delete> scratch_;
  std::size_t scratch_size_ = 0;
};

}  // namespace cohort
