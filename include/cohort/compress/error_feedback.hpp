/// @file
/// Error feedback: a decorator that remembers what a lossy codec dropped and sends it later.
///
/// `error_feedback<C>` owns the residual r of one tensor. Each encode sends c = g + r (the
/// gradient plus the old residual, one float addition per element) through the inner codec
/// and keeps r' = c - sent, where sent is what the receivers decode. The invariant, per
/// element and in float arithmetic:
///
///     sent + r' == g + r
///
/// holds exactly whenever c - sent is representable, which is always so for the casts, for
/// top-k (sent is 0, c or c rounded to 16 bits) and for int8 rounded to nearest (which never
/// rounds |c| < s/2 up). With stochastic int8 the residual is c - sent rounded once to float
/// (|error| <= half an ulp of r'). Nothing is lost, only delayed: top-k with error feedback
/// converges where plain top-k does not.
///
/// The gradient and the residual are read once per encode: where the inner codec can, the
/// correction, the encoding and the new residual happen in one pass (int8 block by block,
/// top-k in its selection's collecting pass), with the same float operations in the same order
/// as correcting, encoding and decode-subtracting in turn, so the same bits.
///
/// One object per tensor: the residual is sized by the first encode (its one allocation) and
/// a later call with another size is refused. Not thread-safe; copyable (the copy has its own
/// residual). In a compressed all_reduce the residual covers what this rank's own encoding
/// dropped: with fp16/bf16 only the block the rank starts in the ring is encoded (the rest of
/// its values enter the sum in fp32, exactly), so the residual is nonzero only there; the
/// rounding of the sum itself (per hop for fp16/bf16, once per block owner for int8) is not fed
/// back.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <cohort/compress/codec.hpp>
#include <cohort/core/error.hpp>

namespace cohort::compress {

template <codec Inner>
class error_feedback;

namespace detail {
template <class C>
inline constexpr bool is_error_feedback = false;
template <class C>
inline constexpr bool is_error_feedback<error_feedback<C>> = true;
}  // namespace detail

/// Wraps `Inner` with a residual per tensor (see this file's comment). Models `codec`.
template <codec Inner>
class error_feedback {
  static_assert(!detail::is_error_feedback<Inner>,
                "error feedback of error feedback: one residual per tensor is enough");

 public:
  /// The codec that does the encoding.
  using inner_type = Inner;
  /// Aggregated as the inner codec is.
  static constexpr aggregation aggregated_by = Inner::aggregated_by;

  /// With a default-constructed inner codec and no residual yet.
  error_feedback() = default;
  /// Wraps `inner`; no residual yet.
  explicit error_feedback(Inner inner) : inner_(std::move(inner)) {}

  /// The inner codec.
  const Inner& inner() const noexcept { return inner_; }
  /// The residual: what was dropped so far and is added to the next gradient. Empty before the
  /// first encode.
  std::span<const float> residual() const noexcept { return residual_; }
  /// Forgets the residual (e.g. when the model is reinitialized); the next encode sizes it.
  void reset() noexcept {
    residual_.clear();
    fresh_ = false;
  }

  /// As the inner codec.
  std::size_t max_encoded_bytes(std::size_t n) const { return inner_.max_encoded_bytes(n); }
  /// As the inner codec.
  std::size_t workspace_bytes(std::size_t n) const { return inner_.workspace_bytes(n); }

  /// Encodes g + residual with the inner codec and keeps what it dropped. Throws
  /// `cohort::error` (`errc::invalid_argument`, operation "error_feedback::encode") if the
  /// residual belongs to a tensor of another size.
  std::size_t encode(std::span<const float> g, std::span<std::byte> out,
                     std::span<std::byte> work, std::uint64_t salt) {
    if (!fits(g.size()))
      throw error(make_error_code(errc::invalid_argument), "error_feedback::encode", -1,
                  "error_feedback::encode: " + size_error(g.size()));
    begin(g.size());
    const std::size_t bytes = encode_part(inner_, g, 0, out, work, salt);
    end();
    return bytes;
  }
  /// As the inner codec.
  void decode(std::span<const std::byte> bytes, std::span<float> x, decode_mode mode) const {
    inner_.decode(bytes, x, mode);
  }
  /// "error_feedback(<inner>)".
  std::string name() const { return "error_feedback(" + inner_.name() + ")"; }

  /// True if a tensor of n floats can use this residual (it is empty or of that size).
  bool fits(std::size_t n) const noexcept { return residual_.empty() || residual_.size() == n; }

  /// For collectives, step 1 of 2: residual += g, and returns the residual, which now holds
  /// the corrected gradient c = g + r to encode (`g` is not written). Needs `fits(g.size())`;
  /// the first call allocates the residual.
  std::span<const float> correct(std::span<const float> g) {
    if (residual_.size() != g.size()) {
      residual_.resize(g.size());
      fresh_ = true;
    }
    correct_range(g, residual_);
    fresh_ = false;
    return residual_;
  }
  /// For collectives, step 2 of 2, once c is no longer read: elements [first, first + count)
  /// were sent as `bytes`, encoded by `wire` (the inner codec, or the codec a collective fell
  /// back to): their residual becomes c - decoded.
  template <codec Wire>
  void absorb(const Wire& wire, std::span<const std::byte> bytes, std::size_t first,
              std::size_t count) {
    wire.decode(bytes, std::span(residual_).subspan(first, count), decode_mode::subtract);
  }
  /// For collectives, step 2 of 2: elements [first, first + count) reached the sum exactly (a
  /// collective added them in fp32): their residual becomes 0.
  void settle(std::size_t first, std::size_t count) noexcept {
    std::fill_n(residual_.begin() + static_cast<std::ptrdiff_t>(first), count, 0.0f);
  }

  /// For collectives that correct as they encode, instead of `correct`: sizes the residual for
  /// a tensor of n floats (needs `fits(n)`; the first call allocates it) without reading the
  /// gradient. Until the tensor has gone through `encode_part`, `encode_corrected`, `take_part`
  /// or `correct`, the residual of a first call is "none yet": the corrected gradient is g
  /// itself, bit for bit (-0 and NaN payloads included), not g + 0.
  void begin(std::size_t n) {
    fresh_ = residual_.size() != n;
    if (fresh_) residual_.assign(n, 0.0f);
  }
  /// After `begin`: encodes elements [first, first + g.size()) of the corrected gradient (g is
  /// that range of the gradient) with `wire` into `out` and leaves their residual as c -
  /// decoded, reading g and the residual once where `wire` fuses the two (`encode_feedback`);
  /// else correcting, encoding and absorbing in turn. Returns the encoded length.
  /// `first_block` goes to a block codec's encode (a tensor encoded in pieces).
  template <codec Wire>
  std::size_t encode_part(const Wire& wire, std::span<const float> g, std::size_t first,
                          std::span<std::byte> out, std::span<std::byte> work,
                          std::uint64_t salt, std::size_t first_block = 0) {
    const auto r = std::span(residual_).subspan(first, g.size());
    if constexpr (requires { wire.encode_feedback(g, r, fresh_, out, work, salt, first_block); }) {
      return wire.encode_feedback(g, r, fresh_, out, work, salt, first_block);
    } else if constexpr (requires { wire.encode_feedback(g, r, fresh_, out, work, salt); }) {
      return wire.encode_feedback(g, r, fresh_, out, work, salt);
    } else {
      const std::size_t bytes = correct_and_encode(wire, g, r, out, work, salt);
      absorb(wire, out.first(bytes), first, g.size());
      return bytes;
    }
  }
  /// After `begin`, for a collective that decides later whether the encoding is used: writes
  /// c = g + r over the whole tensor to the residual (`corrected()` then returns it) and
  /// returns the length of `wire`'s encoding of c in `out`, correcting in the selection's pass
  /// where `wire` can (`encode_corrected`). Nothing is absorbed yet.
  template <codec Wire>
  std::size_t encode_corrected(const Wire& wire, std::span<const float> g,
                               std::span<std::byte> out, std::span<std::byte> work,
                               std::uint64_t salt) {
    const std::size_t bytes =
        correct_and_encode(wire, g, std::span<float>(residual_), out, work, salt);
    fresh_ = false;
    return bytes;
  }
  /// Ends what `begin` started: the residual of every element is formed.
  void end() noexcept { fresh_ = false; }
  /// The corrected gradient c, once `correct` or `encode_corrected` has formed it.
  std::span<const float> corrected() const noexcept { return residual_; }
  /// After `begin`, for values a collective adds exactly: writes c = g + r of elements
  /// [first, first + g.size()) (g is that range of the gradient) to `out` and sets their
  /// residual to 0; returns `out`. One pass over g and the residual instead of correcting,
  /// reading and settling.
  const float* take_part(std::span<const float> g, std::size_t first, float* out) noexcept {
    float* r = residual_.data() + first;
    if (fresh_) {
      std::copy(g.begin(), g.end(), out);
    } else {
      for (std::size_t i = 0; i < g.size(); ++i) out[i] = g[i] + r[i];
    }
    std::fill_n(r, g.size(), 0.0f);
    return out;
  }

  /// The message of a size mismatch, for error reports.
  std::string size_error(std::size_t n) const {
    return "error_feedback holds the residual of a tensor of " + std::to_string(residual_.size()) +
           " floats, not " + std::to_string(n) + " (use one error_feedback per tensor)";
  }

 private:
  // r = g + r (r = g while there is no residual yet) over one range.
  void correct_range(std::span<const float> g, std::span<float> r) const noexcept {
    if (fresh_) std::copy(g.begin(), g.end(), r.begin());
    else for (std::size_t i = 0; i < g.size(); ++i) r[i] = g[i] + r[i];
  }

  // r = g + r over one range and the encoding of it in `out`, in one pass where `wire` can
  // (`encode_corrected`); returns the encoding's length.
  template <codec Wire>
  std::size_t correct_and_encode(const Wire& wire, std::span<const float> g, std::span<float> r,
                                 std::span<std::byte> out, std::span<std::byte> work,
                                 std::uint64_t salt) {
    if constexpr (requires { wire.encode_corrected(g, r, fresh_, out, work, salt); }) {
      return wire.encode_corrected(g, r, fresh_, out, work, salt);
    } else {
      correct_range(g, r);
      return wire.encode(r, out, work, salt);
    }
  }

  Inner inner_{};
  std::vector<float> residual_;
  bool fresh_ = false;  // set by `begin` on a first call: the residual is none yet, not zeros
};

template <codec C>
error_feedback(C) -> error_feedback<C>;

/// The codec that actually encodes: `C` itself, or the inner codec of an `error_feedback`.
template <class C>
struct wire_codec {
  using type = C;
};
template <class C>
struct wire_codec<error_feedback<C>> {
  using type = C;
};
/// `wire_codec<C>::type`.
template <class C>
using wire_codec_t = typename wire_codec<std::remove_cvref_t<C>>::type;

}  // namespace cohort::compress
