/// @file
/// The codec concept: what a gradient compressor provides, and the aggregation it asks for.
///
/// A codec turns a span of `float` into bytes and back. Decoding is lossy; decoding the same
/// bytes always gives the same floats on every rank and every build (the vector and the
/// portable paths agree bit for bit), which is what makes compressed collectives bitwise
/// identical across ranks.
///
/// | expression                         | type          | semantics |
/// |------------------------------------|---------------|-----------|
/// | `aggregation_of<C>`                | `aggregation` | read from `C::aggregated_by`: how a collective combines encodings |
/// | `c.max_encoded_bytes(n)`           | `size_t`      | bytes `encode` may write for `n` floats |
/// | `c.workspace_bytes(n)`             | `size_t`      | 64-byte-aligned scratch `encode` needs for `n` floats |
/// | `c.encode(in, out, work, salt)`    | `size_t`      | writes the encoding of `in` to `out`, returns its length |
/// | `c.decode(bytes, x, mode)`         | `void`        | x = / += / -= the decoded floats (`decode_mode`); `x.size()` is `n` |
/// | `c.name()`                         | `std::string` | e.g. "top_k(0.01)|bf16" |
///
/// `encode` may be non-const (error feedback keeps state); everything else is const. `salt`
/// seeds whatever randomness the codec uses (stochastic rounding, sampling); the same input,
/// salt and codec give the same bytes. Nothing allocates, except error feedback's residual on
/// first use.
#pragma once

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>

#include <cohort/core/dtype.hpp>

namespace cohort::compress {

/// How a compressed all_reduce combines the ranks' encodings.
enum class aggregation : std::uint8_t {
  /// The wire format is an element type (fp16, bf16): a ring all_reduce runs on it and
  /// accumulates each hop in fp32.
  summable,
  /// Encodings cannot be summed (int8 with per-block scales): each chunk's owner decodes the
  /// P contributions, sums them in fp32 in rank order, re-encodes once; then an all-gather.
  two_phase,
  /// Variable-size sparse payloads (top-k): all-gather them, decode-add in rank order.
  gather,
  /// Reported, never requested: a gather codec whose payloads would outweigh a dense bf16 ring
  /// all_reduce, which ran instead.
  dense_fallback,
};

/// "summable", "two_phase", "gather" or "dense_fallback".
constexpr std::string_view aggregation_name(aggregation a) noexcept {
  switch (a) {
    case aggregation::summable: return "summable";
    case aggregation::two_phase: return "two_phase";
    case aggregation::gather: return "gather";
    case aggregation::dense_fallback: return "dense_fallback";
  }
  return "unknown";
}

/// How `decode` combines the decoded values `v` with the destination `x`.
enum class decode_mode : std::uint8_t {
  assign,    ///< x[i] = v[i] (zero where a sparse encoding has no entry)
  add,       ///< x[i] += v[i] (entries only, for sparse encodings)
  subtract,  ///< x[i] -= v[i] (entries only): how error feedback forms its residual
};

/// A gradient compressor (see the requirement table in this file's comment).
template <class C>
concept codec =
    std::copy_constructible<C> &&
    requires(C& c, const C& cc, std::size_t n, std::span<const float> in,
             std::span<std::byte> out, std::uint64_t salt, std::span<const std::byte> bytes,
             std::span<float> x, decode_mode m) {
      { C::aggregated_by } -> std::convertible_to<aggregation>;
      { cc.max_encoded_bytes(n) } -> std::same_as<std::size_t>;
      { cc.workspace_bytes(n) } -> std::same_as<std::size_t>;
      { c.encode(in, out, out, salt) } -> std::same_as<std::size_t>;
      { cc.decode(bytes, x, m) } -> std::same_as<void>;
      { cc.name() } -> std::convertible_to<std::string>;
    };

/// How the collectives aggregate encodings of `C`.
template <codec C>
inline constexpr aggregation aggregation_of = C::aggregated_by;

/// A summable codec: its encoding is an array of `C::wire_type`, one per input float, that a
/// ring reduction can add (fp32 accumulation per hop) and that decodes element by element.
template <class C>
concept summable_codec = codec<C> && C::aggregated_by == aggregation::summable &&
                         element<typename C::wire_type> &&
                         sizeof(typename C::wire_type) < sizeof(float);

/// A two-phase codec: blocks of `C::block_elements` floats encode independently and in
/// order, so the encoding of a block-aligned range is a contiguous slice of the encoding of
/// the whole tensor, `encoded_bytes(first)` bytes in and `encoded_bytes(count)` long.
template <class C>
concept two_phase_codec =
    codec<C> && C::aggregated_by == aggregation::two_phase &&
    requires(const C& c, std::size_t n) {
      { C::block_elements } -> std::convertible_to<std::size_t>;
      { c.encoded_bytes(n) } -> std::same_as<std::size_t>;
    };

/// A gather codec: sparse payloads of (u32 index, value) entries whose byte length tells their
/// count; `valid(bytes, n)` checks a payload received from a peer before it is decoded.
template <class C>
concept gather_codec = codec<C> && C::aggregated_by == aggregation::gather &&
                       requires(const C& c, std::span<const std::byte> bytes, std::size_t n) {
                         { C::entry_bytes } -> std::convertible_to<std::size_t>;
                         { c.valid(bytes, n) } -> std::same_as<bool>;
                       };

}  // namespace cohort::compress
