/// @file
/// Carving one scratch span into the 64-byte-aligned buffers of a compressed collective.
#pragma once

#include <cassert>
#include <cstddef>
#include <cstdint>
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

/// The error feedback of a call without one: correcting and absorbing do nothing, encoding
/// encodes the gradient.
struct no_feedback {
  std::span<const float> correct(std::span<const float> g) const noexcept { return g; }
  void begin(std::size_t) const noexcept {}
  void end() const noexcept {}
  template <class Wire>
  std::size_t encode_part(const Wire& w, std::span<const float> g, std::size_t,
                          std::span<std::byte> out, std::span<std::byte> work, std::uint64_t salt,
                          std::size_t first_block = 0) const {
    if constexpr (requires { w.encode(g, out, work, salt, first_block); })
      return w.encode(g, out, work, salt, first_block);
    else return w.encode(g, out, work, salt);
  }
  template <class Wire>
  std::size_t encode_corrected(const Wire& w, std::span<const float> g, std::span<std::byte> out,
                               std::span<std::byte> work, std::uint64_t salt) const {
    return w.encode(g, out, work, salt);
  }
  const float* take_part(std::span<const float> g, std::size_t, float*) const noexcept {
    return g.data();
  }
  template <class Wire>
  void absorb(const Wire&, std::span<const std::byte>, std::size_t, std::size_t) const noexcept {}
  void settle(std::size_t, std::size_t) const noexcept {}
};

}  // namespace cohort::compress::detail
