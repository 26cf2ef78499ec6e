/// @file
/// int8 quantization with one fp32 scale per block of `Block` floats.
///
/// Encoding, block by block: scale s = absmax / 127, q[i] = round(x[i] / s) in [-127, 127];
/// a block is stored as its scale (4 bytes) then its `Block` int8 values, the last block
/// possibly shorter, so n floats take n + 4 * ceil(n / Block) bytes (a quarter of fp32 plus
/// 1.6% at Block = 256). Decoding gives q[i] * s.
///
/// Error per element: round to nearest (the default) keeps |x - decoded| <= absmax / 254 of
/// its block; stochastic rounding (`.stochastic = true`) rounds up with probability equal to
/// the fraction, which is unbiased, with |x - decoded| < absmax / 127. Round to nearest also
/// sends 0 rather than +-1 for |x| < s / 2, so that x - decoded is exactly representable: error
/// feedback's residual is then exact. Blocks whose absmax is below 2^-100 are sent as zeros (an
/// absolute error below 2^-100); a block holding an infinity or a NaN decodes to NaN throughout.
///
/// The vector and portable paths run the same float operations in the same order and give
/// the same bytes (in the default rounding mode, and without -ffast-math, which would fold
/// the add-and-subtract that rounds).
#pragma once

#include <algorithm>
#include <bit>
#include <cassert>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>

#include <cohort/compress/cast.hpp>
#include <cohort/compress/codec.hpp>
#include <cohort/compress/detail/hash.hpp>
#include <cohort/compress/detail/simd.hpp>

namespace cohort::compress {
namespace detail {

inline constexpr float quant_levels = 127.0f;
inline constexpr float quant_floor = 0x1p-100f;  // absmax below this: sent as zeros
inline constexpr float round_magic = 0x1.8p23f;  // x + m - m rounds |x| < 2^22 to nearest even

// The scale of a block from the bits of its largest magnitude: `quantize` false when the block
// is sent as zeros (absmax below 2^-100) or as NaN (absmax infinite or NaN).
struct block_scale {
  float scale = 0.0f, inv = 0.0f, half = 0.0f;
  bool quantize = false;
};

inline block_scale scale_for(std::uint32_t amax) noexcept {
  const float absmax = std::bit_cast<float>(amax);
  if (amax >= 0x7F80'0000u) return {std::bit_cast<float>(0x7FC0'0000u), 0.0f, 0.0f, false};
  if (!(absmax >= quant_floor)) return {};
  const float scale = absmax / quant_levels;
  return {scale, quant_levels / absmax, 0.5f * scale, true};
}

// One element rounded to nearest: |x| < s/2 gives 0, never +-1, even where x * inv rounded up
// to 0.5, so that x - decoded is exactly representable.
inline std::int8_t quantize_nearest(float x, const block_scale& s) noexcept {
  const float r = (x * s.inv + round_magic) - round_magic;
  const std::int32_t v = std::clamp(static_cast<std::int32_t>(r), -127, 127);
  const float ax = std::bit_cast<float>(std::bit_cast<std::uint32_t>(x) & 0x7FFF'FFFFu);
  return static_cast<std::int8_t>(ax < s.half ? 0 : v);
}

// One element rounded up with probability equal to its fraction; `h` is its random draw.
inline std::int8_t quantize_stochastic(float x, const block_scale& s, std::uint32_t h) noexcept {
  const float t = x * s.inv;
  std::int32_t f = static_cast<std::int32_t>(t);  // toward zero, then down to the floor
  f -= static_cast<float>(f) > t ? 1 : 0;
  const float frac = t - static_cast<float>(f);
  const float u = static_cast<float>(h >> 8) * 0x1p-24f;
  return static_cast<std::int8_t>(std::clamp(f + (frac > u ? 1 : 0), -127, 127));
}

// Quantizes one block of `len` floats: writes the scale to `scale_out` and the values to `q`.
// Written once; instantiated for the portable and the AVX2 path (same operations, same bits).
template <bool Stochastic>
[[gnu::always_inline]] inline void quantize_block(const float* x, std::size_t len,
                                                  std::byte* scale_out, std::int8_t* q,
                                                  std::uint32_t seed) noexcept {
  std::uint32_t amax = 0, fold = 0;
  for (std::size_t i = 0; i < len; ++i) {
    const std::uint32_t b = std::bit_cast<std::uint32_t>(x[i]);
    amax = std::max(amax, b & 0x7FFF'FFFFu);
    if constexpr (Stochastic) fold ^= b;
  }
  const block_scale s = scale_for(amax);
  std::memcpy(scale_out, &s.scale, sizeof s.scale);
  if (!s.quantize) {
    std::memset(q, 0, len);
  } else if constexpr (Stochastic) {
    const std::uint32_t k = seed ^ hash32(fold, static_cast<std::uint32_t>(len));
    for (std::size_t i = 0; i < len; ++i)
      q[i] = quantize_stochastic(x[i], s, hash32(k, static_cast<std::uint32_t>(i)));
  } else {
    for (std::size_t i = 0; i < len; ++i) q[i] = quantize_nearest(x[i], s);
  }
}

template <decode_mode M>
[[gnu::always_inline]] inline void dequantize_block(const std::byte* rec, std::size_t len,
                                                    float* x) noexcept {
  float scale;
  std::memcpy(&scale, rec, sizeof scale);
  const auto* q = reinterpret_cast<const std::int8_t*>(rec + sizeof scale);
  for (std::size_t i = 0; i < len; ++i) apply<M>(x[i], static_cast<float>(q[i]) * scale);
}

template <std::size_t Block, bool Stochastic>
[[gnu::always_inline]] inline void quantize_all(const float* x, std::size_t n, std::byte* out,
                                                std::uint64_t salt) noexcept {
  for (std::size_t b = 0, off = 0; off < n; ++b, off += Block) {
    const std::size_t len = std::min(Block, n - off);
    std::byte* rec = out + b * (Block + 4);
    const auto seed = Stochastic ? static_cast<std::uint32_t>(mix64(salt + b)) : 0u;
    quantize_block<Stochastic>(x + off, len, rec, reinterpret_cast<std::int8_t*>(rec + 4), seed);
  }
}

template <std::size_t Block, decode_mode M>
[[gnu::always_inline]] inline void dequantize_all(const std::byte* in, std::size_t n,
                                                  float* x) noexcept {
  for (std::size_t b = 0, off = 0; off < n; ++b, off += Block)
    dequantize_block<M>(in + b * (Block + 4), std::min(Block, n - off), x + off);
}

// c = g + r (g itself where `fresh`: no residual yet) written to r, or g copied.
[[gnu::always_inline]] inline void correct_into(const float* g, float* r, std::size_t len,
                                               bool fresh) noexcept {
  if (fresh) std::memcpy(r, g, len * sizeof(float));
  else for (std::size_t i = 0; i < len; ++i) r[i] = g[i] + r[i];
}

// Error feedback fused into quantization, block by block: r = g + r, the block quantized from
// r, then r = r - decoded. The same operations, in the same order, as correcting the whole
// tensor, quantizing it and decode-subtracting it, but the block stays in L1 between the three
// steps: the gradient and the residual are read once and the residual written once.
// `QuantizeBlock(c, len, rec, b)` quantizes block b.
template <std::size_t Block, class QuantizeBlock>
[[gnu::always_inline]] inline void quantize_feedback_all(const float* g, float* r, bool fresh,
                                                         std::size_t n, std::byte* out,
                                                         QuantizeBlock quantize_one) noexcept {
  for (std::size_t b = 0, off = 0; off < n; ++b, off += Block) {
    const std::size_t len = std::min(Block, n - off);
    std::byte* rec = out + b * (Block + 4);
    correct_into(g + off, r + off, len, fresh);
    quantize_one(r + off, len, rec, b);
    dequantize_block<decode_mode::subtract>(rec, len, r + off);
  }
}

template <std::size_t Block, bool Stochastic>
[[gnu::always_inline]] inline void quantize_feedback_portable(const float* g, float* r,
                                                              bool fresh, std::size_t n,
                                                              std::byte* out,
                                                              std::uint64_t salt) noexcept {
  quantize_feedback_all<Block>(
      g, r, fresh, n, out, [salt](const float* c, std::size_t len, std::byte* rec, std::size_t b) {
        const auto seed = Stochastic ? static_cast<std::uint32_t>(mix64(salt + b)) : 0u;
        quantize_block<Stochastic>(c, len, rec, reinterpret_cast<std::int8_t*>(rec + 4), seed);
      });
}

#if COHORT_SIMD_X86
// `quantize_nearest` on 8 lanes: the same operations, so the same integers.
[[gnu::always_inline]] COHORT_TARGET_AVX2 inline __m256i quantize_nearest8(
    const float* p, __m256 inv, __m256 half) noexcept {
  const __m256 magic = _mm256_set1_ps(round_magic);
  const __m256i abs_mask = _mm256_set1_epi32(0x7FFF'FFFF);
  const __m256 v = _mm256_loadu_ps(p);
  const __m256 r = _mm256_sub_ps(_mm256_add_ps(_mm256_mul_ps(v, inv), magic), magic);
  const __m256i k = _mm256_max_epi32(
      _mm256_min_epi32(_mm256_cvttps_epi32(r), _mm256_set1_epi32(127)), _mm256_set1_epi32(-127));
  const __m256 ax = _mm256_castsi256_ps(_mm256_and_si256(_mm256_castps_si256(v), abs_mask));
  return _mm256_andnot_si256(_mm256_castps_si256(_mm256_cmp_ps(ax, half, _CMP_LT_OQ)), k);
}

// Round to nearest, 32 floats at a time.
COHORT_TARGET_AVX2 inline void quantize_block_nearest_avx2(const float* x, std::size_t len,
                                                         std::byte* scale_out,
                                                         std::int8_t* q) noexcept {
  const __m256i abs_mask = _mm256_set1_epi32(0x7FFF'FFFF);
  __m256i vmax = _mm256_setzero_si256();
  std::size_t i = 0;
  for (; i + 8 <= len; i += 8)
    vmax = _mm256_max_epu32(vmax, _mm256_and_si256(_mm256_loadu_si256(
                                         reinterpret_cast<const __m256i*>(x + i)), abs_mask));
  alignas(32) std::uint32_t lanes[8];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), vmax);
  std::uint32_t amax = 0;
  for (std::uint32_t l : lanes) amax = std::max(amax, l);
  for (; i < len; ++i) amax = std::max(amax, std::bit_cast<std::uint32_t>(x[i]) & 0x7FFF'FFFFu);
  const block_scale s = scale_for(amax);
  std::memcpy(scale_out, &s.scale, sizeof s.scale);
  if (!s.quantize) {
    std::memset(q, 0, len);
    return;
  }
  const __m256 inv = _mm256_set1_ps(s.inv), half = _mm256_set1_ps(s.half);
  for (i = 0; i + 32 <= len; i += 32) {
    const __m256i ab = _mm256_packs_epi32(quantize_nearest8(x + i, inv, half),
                                          quantize_nearest8(x + i + 8, inv, half));
    const __m256i cd = _mm256_packs_epi32(quantize_nearest8(x + i + 16, inv, half),
                                          quantize_nearest8(x + i + 24, inv, half));
    // The packs interleave 128-bit lanes; the permute puts the groups of 4 back in order.
    const __m256i packed = _mm256_permutevar8x32_epi32(_mm256_packs_epi16(ab, cd),
                                                       _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(q + i), packed);
  }
  for (; i < len; ++i) q[i] = quantize_nearest(x[i], s);
}

template <std::size_t Block, bool Stochastic>
COHORT_TARGET_AVX2 void quantize_avx2(const float* x, std::size_t n, std::byte* out,
                                      std::uint64_t salt) noexcept {
  if constexpr (Stochastic) {
    quantize_all<Block, true>(x, n, out, salt);
  } else {
    for (std::size_t b = 0, off = 0; off < n; ++b, off += Block) {
      std::byte* rec = out + b * (Block + 4);
      quantize_block_nearest_avx2(x + off, std::min(Block, n - off), rec,
                                  reinterpret_cast<std::int8_t*>(rec + 4));
    }
  }
}
template <std::size_t Block, bool Stochastic>
COHORT_TARGET_AVX2 void quantize_feedback_avx2(const float* g, float* r, bool fresh, std::size_t n,
                                               std::byte* out, std::uint64_t salt) noexcept {
  quantize_feedback_all<Block>(
      g, r, fresh, n, out, [salt](const float* c, std::size_t len, std::byte* rec, std::size_t b) {
        auto* q = reinterpret_cast<std::int8_t*>(rec + 4);
        if constexpr (Stochastic)
          quantize_block<true>(c, len, rec, q, static_cast<std::uint32_t>(mix64(salt + b)));
        else quantize_block_nearest_avx2(c, len, rec, q);
      });
}
template <std::size_t Block, decode_mode M>
COHORT_TARGET_AVX2 void dequantize_avx2(const std::byte* in, std::size_t n, float* x) noexcept {
  dequantize_all<Block, M>(in, n, x);
}
#endif

template <std::size_t Block, bool Stochastic>
void quantize(const float* x, std::size_t n, std::byte* out, std::uint64_t salt) noexcept {
#if COHORT_SIMD_X86
  if (active_isa() == isa::avx2) return quantize_avx2<Block, Stochastic>(x, n, out, salt);
#endif
  quantize_all<Block, Stochastic>(x, n, out, salt);
}

template <std::size_t Block, bool Stochastic>
void quantize_feedback(const float* g, float* r, bool fresh, std::size_t n, std::byte* out,
                       std::uint64_t salt) noexcept {
#if COHORT_SIMD_X86
  if (active_isa() == isa::avx2)
    return quantize_feedback_avx2<Block, Stochastic>(g, r, fresh, n, out, salt);
#endif
  quantize_feedback_portable<Block, Stochastic>(g, r, fresh, n, out, salt);
}

template <std::size_t Block>
void dequantize(const std::byte* in, std::size_t n, float* x, decode_mode mode) noexcept {
  auto run = [&]<decode_mode M>() {
#if COHORT_SIMD_X86
    if (active_isa() == isa::avx2) return dequantize_avx2<Block, M>(in, n, x);
#endif
    dequantize_all<Block, M>(in, n, x);
  };
  switch (mode) {
    case decode_mode::assign: run.template operator()<decode_mode::assign>(); break;
    case decode_mode::add: run.template operator()<decode_mode::add>(); break;
    case decode_mode::subtract: run.template operator()<decode_mode::subtract>(); break;
  }
}

}  // namespace detail

/// int8 values with an fp32 scale per block of `Block` floats (see this file's comment).
///
/// Two-phase: encodings of different ranks cannot be added, so a compressed all_reduce sends
/// each block to the rank that owns it, which decodes, sums in fp32 and re-encodes once.
/// `Block` is a multiple of 4 (records stay 4-byte aligned). Stateless; needs no workspace.
template <std::size_t Block = 256>
  requires(Block > 0 && Block % 4 == 0 && Block <= (std::size_t{1} << 24))
struct int8_codec {
  /// Floats per block, each block with its own scale.
  static constexpr std::size_t block_elements = Block;
  /// Two-phase: decoded, summed and re-encoded by the owner of each block.
  static constexpr aggregation aggregated_by = aggregation::two_phase;

  /// Round up with probability equal to the fraction (unbiased) instead of to nearest.
  bool stochastic = false;
  /// Mixed into the salt of stochastic rounding; vary it between calls to draw fresh noise
  /// for inputs that repeat (otherwise the noise is a function of the block's contents).
  std::uint64_t seed = 0;

  /// n + 4 * ceil(n / Block): the exact length of every encoding of n floats.
  static constexpr std::size_t encoded_bytes(std::size_t n) noexcept {
    return n + 4 * ((n + Block - 1) / Block);
  }
  /// The same as `encoded_bytes`.
  constexpr std::size_t max_encoded_bytes(std::size_t n) const noexcept {
    return encoded_bytes(n);
  }
  /// None.
  constexpr std::size_t workspace_bytes(std::size_t) const noexcept { return 0; }

  /// Quantizes `in` into `out` (4-byte aligned, `encoded_bytes(in.size())` long).
  /// `first_block`: the index of in's first block within a tensor encoded in pieces, which
  /// then draws the same stochastic rounding as the tensor encoded whole with `salt`.
  std::size_t encode(std::span<const float> in, std::span<std::byte> out, std::span<std::byte>,
                     std::uint64_t salt, std::size_t first_block = 0) const noexcept {
    assert(out.size() >= encoded_bytes(in.size()));
    if (stochastic)
      detail::quantize<Block, true>(in.data(), in.size(), out.data(), (salt ^ seed) + first_block);
    else detail::quantize<Block, false>(in.data(), in.size(), out.data(), 0);
    return encoded_bytes(in.size());
  }
  /// Error feedback in one pass: encodes c = g + r (c = g where `fresh`, r then holding no
  /// residual yet) as `encode(c)` would, and leaves r = c - decoded, as decode-subtracting the
  /// encoding from c would: the same bytes and the same residual, bit for bit.
  std::size_t encode_feedback(std::span<const float> g, std::span<float> r, bool fresh,
                              std::span<std::byte> out, std::span<std::byte>, std::uint64_t salt,
                              std::size_t first_block = 0) const noexcept {
    assert(r.size() == g.size() && out.size() >= encoded_bytes(g.size()));
    if (stochastic)
      detail::quantize_feedback<Block, true>(g.data(), r.data(), fresh, g.size(), out.data(),
                                             (salt ^ seed) + first_block);
    else
      detail::quantize_feedback<Block, false>(g.data(), r.data(), fresh, g.size(), out.data(), 0);
    return encoded_bytes(g.size());
  }
  /// Dequantizes `bytes` (the encoding of x.size() floats) into `x` as `mode` says.
  void decode(std::span<const std::byte> bytes, std::span<float> x,
              decode_mode mode) const noexcept {
    assert(bytes.size() == encoded_bytes(x.size()));
    detail::dequantize<Block>(bytes.data(), x.size(), x.data(), mode);
  }

  /// "int8", "int8(block=64)", "int8(stochastic)".
  std::string name() const {
    std::string s = "int8";
    if (Block != 256) s += "(block=" + std::to_string(Block) + ")";
    if (stochastic) s += "(stochastic)";
    return s;
  }
};

/// int8 with a scale per 256 floats, rounded to nearest: about 3.9x fewer bytes than fp32.
inline constexpr int8_codec<256> int8{};

}  // namespace cohort::compress
