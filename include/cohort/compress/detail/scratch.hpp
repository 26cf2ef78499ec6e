/// @file
/// Carving one scratch span into the 64-byte-aligned buffers of a compressed collective.
#pragma once

#include <cassert>
#include <cstddef>
#include <span>

namespace cohort::compress::detail {

/// `n` rounded up to a multiple of 64.
constexpr std::size_t align64(std::size_t n) noexcept { return (n + 63) / 64 * 64; }

/// Hands out consecutive pieces of a span, each starting 64-byte aligned (if the span does).
class carver {
 public:
  explicit carver(std::span<std::byte> s) noexcept : rest_(s) {}

  /// The next `bytes` bytes; the following piece starts at the next multiple of 64.
  std::span<std::byte> take(std::size_t bytes) noexcept {
    const std::size_t step = align64(bytes);
    assert(step <= rest_.size());
    auto piece = rest_.first(bytes);
    rest_ = rest_.subspan(step);
    return piece;
  }
  /// Everything not taken yet.
  std::span<std::byte> rest() const noexcept { return rest_; }

 private:
  std::span<std::byte> rest_;
};

/// The error feedback of a call without one: correcting and absorbing do nothing.
struct no_feedback {
  std::span<const float> correct(std::span<const float> g) const noexcept { return g; }
  template <class Wire>
  void absorb(const Wire&, std::span<const std::byte>, std::size_t, std::size_t) const noexcept {}
  void settle(std::size_t, std::size_t) const noexcept {}
};

}  // namespace cohort::compress::detail
