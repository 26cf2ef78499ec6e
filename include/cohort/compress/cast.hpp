/// @file
/// Cast codecs: gradients sent as fp16 or bf16, rounded to nearest, ties to even.
///
/// `compress::fp16` and `compress::bf16` halve the bytes and are summable: a ring all_reduce
/// runs on the 16-bit values and accumulates every hop in fp32. Per element, rounding keeps
/// |x - decode(encode(x))| <= 2^-11 |x| for fp16 (normal range, 2^-14 <= |x| <= 65504) and
/// <= 2^-8 |x| for bf16 (normal floats). The bits are those of `cohort::fp16(x)` and
/// `cohort::bf16(x)`. Encoding to fp16 is core/dtype.hpp's `to_fp16`, 8 at a time with F16C
/// where the CPU has it; the rest (bf16 encoding, and accumulation and decoding of both) runs 8
/// or 16 at a time where the CPU has AVX2 and F16C, and otherwise element by element through
/// core/dtype.hpp's scalar conversions (its bulk ones where a decode only assigns).
#pragma once

#include <cassert>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include <cohort/compress/codec.hpp>
#include <cohort/compress/detail/simd.hpp>
#include <cohort/core/dtype.hpp>

namespace cohort::compress {
namespace detail {

/// x op= v as `decode_mode` M says; the one place every decoder combines values.
template <decode_mode M>
inline void apply(float& x, float v) noexcept {
  if constexpr (M == decode_mode::assign) x = v;
  else if constexpr (M == decode_mode::add) x = x + v;
  else x = x - v;
}

template <decode_mode M, class W>
void cast_decode_portable(const W* in, float* x, std::size_t n) noexcept {
  if constexpr (M == decode_mode::assign) {
    if constexpr (std::same_as<W, cohort::fp16>) from_fp16({in, n}, {x, n});
    else from_bf16({in, n}, {x, n});
  } else {
    for (std::size_t i = 0; i < n; ++i) apply<M>(x[i], static_cast<float>(in[i]));
  }
}

// out[i] = W(float(in[i]) + mine[i]), divided by `divisor` before the rounding when nonzero.
template <class W>
void cast_accumulate_portable(const W* in, const float* mine, W* out, std::size_t n,
                              float divisor) noexcept {
  if (divisor != 0.0f) {
    for (std::size_t i = 0; i < n; ++i) out[i] = W((static_cast<float>(in[i]) + mine[i]) / divisor);
  } else {
    for (std::size_t i = 0; i < n; ++i) out[i] = W(static_cast<float>(in[i]) + mine[i]);
  }
}

#if COHORT_SIMD_X86
// The bf16 rounding of core/dtype.hpp (`f32_to_bf16`) on 8 floats' bits, in 32-bit lanes.
[[gnu::always_inline]] COHORT_TARGET_AVX2 inline __m256i bf16_round8(__m256i x) noexcept {
  const __m256i top = _mm256_srli_epi32(x, 16);
  const __m256i odd = _mm256_and_si256(top, _mm256_set1_epi32(1));
  const __m256i rounded =
      _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(x, _mm256_set1_epi32(0x7FFF)), odd), 16);
  const __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(x, _mm256_set1_epi32(0x7FFF'FFFF)),
                                         _mm256_set1_epi32(0x7F80'0000));
  return _mm256_blendv_epi8(rounded, _mm256_or_si256(top, _mm256_set1_epi32(0x0040)), nan);
}

COHORT_TARGET_AVX2 inline void to_bf16_avx2(const float* in, cohort::bf16* out,
                                            std::size_t n) noexcept {
  std::size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256i a = bf16_round8(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(in + i)));
    const __m256i b = bf16_round8(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(in + i + 8)));
    // packus interleaves the 128-bit lanes; the permute puts the 64-bit groups back in order.
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i),
                        _mm256_permute4x64_epi64(_mm256_packus_epi32(a, b), 0xD8));
  }
  for (; i < n; ++i) out[i].bits = cohort::detail::f32_to_bf16(in[i]);
}

template <bool Divide>
COHORT_TARGET_AVX2 void fp16_accumulate_avx2(const cohort::fp16* in, const float* mine,
                                             cohort::fp16* out, std::size_t n,
                                             float divisor) noexcept {
  const __m256 d = _mm256_set1_ps(divisor);
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i));
    __m256 v = _mm256_add_ps(_mm256_cvtph_ps(h), _mm256_loadu_ps(mine + i));
    if constexpr (Divide) v = _mm256_div_ps(v, d);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i),
                     _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT));
  }
  for (; i < n; ++i) {
    float v = cohort::detail::f16_to_f32_portable(in[i].bits) + mine[i];
    if constexpr (Divide) v = v / divisor;
    out[i].bits = cohort::detail::f32_to_f16_portable(v);
  }
}

template <bool Divide>
COHORT_TARGET_AVX2 void bf16_accumulate_avx2(const cohort::bf16* in, const float* mine,
                                             cohort::bf16* out, std::size_t n,
                                             float divisor) noexcept {
  const __m256 d = _mm256_set1_ps(divisor);
  std::size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    __m256i lanes[2];
    for (int half = 0; half < 2; ++half) {
      const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i + 8 * half));
      const __m256 w = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
      __m256 v = _mm256_add_ps(w, _mm256_loadu_ps(mine + i + 8 * half));
      if constexpr (Divide) v = _mm256_div_ps(v, d);
      lanes[half] = bf16_round8(_mm256_castps_si256(v));
    }
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i),
                        _mm256_permute4x64_epi64(_mm256_packus_epi32(lanes[0], lanes[1]), 0xD8));
  }
  for (; i < n; ++i) {
    float v = cohort::detail::bf16_to_f32(in[i].bits) + mine[i];
    if constexpr (Divide) v = v / divisor;
    out[i].bits = cohort::detail::f32_to_bf16(v);
  }
}

template <decode_mode M>
COHORT_TARGET_AVX2 void fp16_decode_avx2(const cohort::fp16* in, float* x,
                                         std::size_t n) noexcept {
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 v = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i)));
    if constexpr (M == decode_mode::assign) _mm256_storeu_ps(x + i, v);
    else if constexpr (M == decode_mode::add)
      _mm256_storeu_ps(x + i, _mm256_add_ps(_mm256_loadu_ps(x + i), v));
    else _mm256_storeu_ps(x + i, _mm256_sub_ps(_mm256_loadu_ps(x + i), v));
  }
  for (; i < n; ++i) apply<M>(x[i], cohort::detail::f16_to_f32_portable(in[i].bits));
}

template <decode_mode M>
COHORT_TARGET_AVX2 void bf16_decode_avx2(const cohort::bf16* in, float* x,
                                         std::size_t n) noexcept {
  for (std::size_t i = 0; i < n; ++i) apply<M>(x[i], cohort::detail::bf16_to_f32(in[i].bits));
}
#endif

/// Rounds `n` floats to W (fp16 or bf16) on the best path this CPU has.
template <class W>
void cast_encode(const float* in, W* out, std::size_t n) noexcept {
  if constexpr (std::same_as<W, cohort::fp16>) {
    to_fp16({in, n}, {out, n});  // F16C where the CPU has it (core/dtype.hpp)
  } else {
#if COHORT_SIMD_X86
    if (active_isa() == isa::avx2) return to_bf16_avx2(in, out, n);
#endif
    to_bf16({in, n}, {out, n});
  }
}

/// One hop of the summable ring: out[i] = W(float(in[i]) + mine[i]), accumulated in fp32 and
/// rounded once; divided by `divisor` before the rounding when it is nonzero (avg's last hop).
/// `out` may alias `in`.
template <class W>
void cast_accumulate(const W* in, const float* mine, W* out, std::size_t n,
                     float divisor) noexcept {
#if COHORT_SIMD_X86
  if (active_isa() == isa::avx2) {
    if constexpr (std::same_as<W, cohort::fp16>) {
      if (divisor != 0.0f) fp16_accumulate_avx2<true>(in, mine, out, n, divisor);
      else fp16_accumulate_avx2<false>(in, mine, out, n, divisor);
    } else {
      if (divisor != 0.0f) bf16_accumulate_avx2<true>(in, mine, out, n, divisor);
      else bf16_accumulate_avx2<false>(in, mine, out, n, divisor);
    }
    return;
  }
#endif
  cast_accumulate_portable(in, mine, out, n, divisor);
}

/// Widens `n` values of W and combines them into `x` as `mode` says.
template <class W>
void cast_decode(const W* in, float* x, std::size_t n, decode_mode mode) noexcept {
  auto run = [&]<decode_mode M>() {
#if COHORT_SIMD_X86
    if (active_isa() == isa::avx2) {
      if constexpr (std::same_as<W, cohort::fp16>) fp16_decode_avx2<M>(in, x, n);
      else bf16_decode_avx2<M>(in, x, n);
      return;
    }
#endif
    cast_decode_portable<M>(in, x, n);
  };
  switch (mode) {
    case decode_mode::assign: run.template operator()<decode_mode::assign>(); break;
    case decode_mode::add: run.template operator()<decode_mode::add>(); break;
    case decode_mode::subtract: run.template operator()<decode_mode::subtract>(); break;
  }
}

}  // namespace detail

/// Sends each float as a `W` (`cohort::fp16` or `cohort::bf16`), rounded to nearest even.
///
/// Summable: the encoding of n floats is n values of `W` (2n bytes), which a ring all_reduce
/// adds hop by hop in fp32. Stateless; needs no workspace; `salt` is ignored.
template <class W>
  requires std::same_as<W, cohort::fp16> || std::same_as<W, cohort::bf16>
struct cast_codec {
  /// The element type on the wire.
  using wire_type = W;
  /// Cast encodings are added on the wire.
  static constexpr aggregation aggregated_by = aggregation::summable;

  /// 2n bytes.
  constexpr std::size_t max_encoded_bytes(std::size_t n) const noexcept { return n * sizeof(W); }
  /// None.
  constexpr std::size_t workspace_bytes(std::size_t) const noexcept { return 0; }

  /// Rounds each float of `in` to `W`; `out` holds in.size() values.
  void encode(std::span<const float> in, std::span<W> out) const noexcept {
    assert(out.size() >= in.size());
    detail::cast_encode(in.data(), out.data(), in.size());
  }
  /// Combines the widened values of `in` into `x` (same size) as `mode` says.
  void decode(std::span<const W> in, std::span<float> x, decode_mode mode) const noexcept {
    assert(in.size() == x.size());
    detail::cast_decode(in.data(), x.data(), x.size(), mode);
  }

  /// The codec interface: `out` is 2-byte aligned and holds 2 * in.size() bytes.
  std::size_t encode(std::span<const float> in, std::span<std::byte> out, std::span<std::byte>,
                     std::uint64_t) const noexcept {
    assert(out.size() >= in.size() * sizeof(W));
    encode(in, std::span<W>(reinterpret_cast<W*>(out.data()), in.size()));
    return in.size() * sizeof(W);
  }
  /// The codec interface: `bytes` is 2-byte aligned and holds 2 * x.size() bytes.
  void decode(std::span<const std::byte> bytes, std::span<float> x,
              decode_mode mode) const noexcept {
    assert(bytes.size() == x.size() * sizeof(W));
    decode(std::span<const W>(reinterpret_cast<const W*>(bytes.data()), x.size()), x, mode);
  }

  /// "fp16" or "bf16".
  std::string name() const { return std::string(dtype_name(dtype_of<W>)); }
};

/// Gradients as IEEE binary16: half the bytes, 11 significant bits, range +-65504.
inline constexpr cast_codec<cohort::fp16> fp16{};
/// Gradients as bfloat16: half the bytes, 8 significant bits, the range of float.
inline constexpr cast_codec<cohort::bf16> bf16{};

}  // namespace cohort::compress
