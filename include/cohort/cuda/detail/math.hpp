/// @file
/// The per-element arithmetic of the device kernels, written once for host and device.
///
/// nvcc compiles these into the kernels (cuda/); the host tests compile the very same functions
/// with g++ and check them bit for bit against cohort's host code: core/dtype.hpp's fp16/bf16
/// conversions (the portable, branch-free algorithms, repeated here), the int8 codec of
/// compress/quantize.hpp and the reductions of collectives/detail/kernels.hpp. What the tests
/// cannot see on a machine without a GPU is only the indexing around these functions.
///
/// Every float operation is spelled `add_rn`, `mul_rn`, ...: on the device they are the `__f*_rn`
/// intrinsics, which nvcc never contracts into an FMA (a plain `a * b + c` may become one and
/// round once instead of twice, which would break bitwise agreement with the host). Build
/// without `--use_fast_math` (it flushes subnormals and approximates division).
#pragma once

#include <cohort/core/detail/reduction_tags.hpp>
#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define COHORT_HD __host__ __device__ __forceinline__
#else
#define COHORT_HD inline
#endif

namespace cohort::cuda::detail {

COHORT_HD std::uint32_t f2u(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  std::uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
#endif
}

COHORT_HD float u2f(std::uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
#endif
}

#if defined(__CUDA_ARCH__)
COHORT_HD float add_rn(float a, float b) { return __fadd_rn(a, b); }
COHORT_HD float sub_rn(float a, float b) { return __fsub_rn(a, b); }
COHORT_HD float mul_rn(float a, float b) { return __fmul_rn(a, b); }
COHORT_HD float div_rn(float a, float b) { return __fdiv_rn(a, b); }
COHORT_HD double add_rn(double a, double b) { return __dadd_rn(a, b); }
COHORT_HD double sub_rn(double a, double b) { return __dsub_rn(a, b); }
COHORT_HD double mul_rn(double a, double b) { return __dmul_rn(a, b); }
COHORT_HD double div_rn(double a, double b) { return __ddiv_rn(a, b); }
#else
COHORT_HD float add_rn(float a, float b) { return a + b; }
COHORT_HD float sub_rn(float a, float b) { return a - b; }
COHORT_HD float mul_rn(float a, float b) { return a * b; }
COHORT_HD float div_rn(float a, float b) { return a / b; }
COHORT_HD double add_rn(double a, double b) { return a + b; }
COHORT_HD double sub_rn(double a, double b) { return a - b; }
COHORT_HD double mul_rn(double a, double b) { return a * b; }
COHORT_HD double div_rn(double a, double b) { return a / b; }
#endif

// --- 16-bit floats: core/dtype.hpp's portable conversions, operation for operation ----------

COHORT_HD std::uint32_t pick(bool c, std::uint32_t a, std::uint32_t b) { return c ? a : b; }

/// float -> binary16 bits, round to nearest even; NaN made quiet with its top payload bits.
COHORT_HD std::uint16_t f32_to_f16(float f) {
  const std::uint32_t x = f2u(f);
  const std::uint32_t sign = (x >> 16) & 0x8000u;
  const std::uint32_t a = x & 0x7FFF'FFFFu;
  const std::uint32_t normal = (a - (112u << 23) + 0x0FFFu + ((a >> 13) & 1u)) >> 13;
  const bool small = a < (113u << 23);
  const std::uint32_t clamped = pick(small, a, 0u);
  const std::uint32_t sub = f2u(add_rn(u2f(clamped), 0.5f)) - f2u(0.5f);
  const std::uint32_t nan = 0x7E00u | ((a >> 13) & 0x03FFu);
  std::uint32_t r = pick(small, sub, normal);
  r = pick(a >= (143u << 23), 0x7C00u, r);
  r = pick(a > 0x7F80'0000u, nan, r);
  return static_cast<std::uint16_t>(r | sign);
}

/// binary16 bits -> float, exact (a signalling NaN comes back quiet).
COHORT_HD float f16_to_f32(std::uint16_t h) {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  const std::uint32_t em = static_cast<std::uint32_t>(h & 0x7FFFu) << 13;
  const std::uint32_t exp = em & 0x0F80'0000u;
  const std::uint32_t normal = em + (112u << 23);
  const float two_m14 = u2f(113u << 23);
  const std::uint32_t sub = f2u(sub_rn(u2f(em + (113u << 23)), two_m14));
  const std::uint32_t special = em | 0x7F80'0000u | (em > 0x0F80'0000u ? 0x0040'0000u : 0u);
  std::uint32_t r = pick(exp == 0, sub, normal);
  r = pick(exp == 0x0F80'0000u, special, r);
  return u2f(r | sign);
}

/// float -> bfloat16 bits, round to nearest even; NaN truncated and made quiet.
COHORT_HD std::uint16_t f32_to_bf16(float f) {
  const std::uint32_t x = f2u(f);
  const std::uint32_t rounded = (x + 0x7FFFu + ((x >> 16) & 1u)) >> 16;
  const std::uint32_t quiet = (x >> 16) | 0x0040u;
  return static_cast<std::uint16_t>((x & 0x7FFF'FFFFu) > 0x7F80'0000u ? quiet : rounded);
}

/// bfloat16 bits -> float, exact.
COHORT_HD float bf16_to_f32(std::uint16_t b) { return u2f(static_cast<std::uint32_t>(b) << 16); }

// --- Element types and reductions ----------------------------------------------------------

/// How a kernel stores and accumulates one element type. `code` is the `cohort::dtype` value.
struct f32_type {
  static constexpr int code = 0;
  using storage = float;
  using acc = float;
  static COHORT_HD acc widen(storage v) { return v; }
  static COHORT_HD storage narrow(acc v) { return v; }
};
struct f64_type {
  static constexpr int code = 1;
  using storage = double;
  using acc = double;
  static COHORT_HD acc widen(storage v) { return v; }
  static COHORT_HD storage narrow(acc v) { return v; }
};
struct fp16_type {
  static constexpr int code = 6;
  using storage = std::uint16_t;
  using acc = float;
  static COHORT_HD acc widen(storage v) { return f16_to_f32(v); }
  static COHORT_HD storage narrow(acc v) { return f32_to_f16(v); }
};
struct bf16_type {
  static constexpr int code = 7;
  using storage = std::uint16_t;
  using acc = float;
  static COHORT_HD acc widen(storage v) { return bf16_to_f32(v); }
  static COHORT_HD storage narrow(acc v) { return f32_to_bf16(v); }
};

/// The built-in reductions by their numbers (core/detail/reduction_tags.hpp), as cohort::ops
/// defines them for floating types.
template <cohort::detail::builtin_reduction Op>
struct reduce_op {
  using tag = cohort::detail::builtin_reduction;
  template <class A>
  static COHORT_HD A apply(A a, A b) {
    if constexpr (Op == tag::sum || Op == tag::avg)
      return add_rn(a, b);
    else if constexpr (Op == tag::prod)
      return mul_rn(a, b);
    else if constexpr (Op == tag::min)
      return b < a ? b : a;
    else
      return a < b ? b : a;
  }
  /// avg divides by the number of ranks once at the end; the others leave the value alone.
  template <class A>
  static COHORT_HD A finalize(A a, int ranks) {
    if constexpr (Op == tag::avg)
      return div_rn(a, static_cast<A>(ranks));
    else
      return a;
  }
};

// --- Hashes (compress/detail/hash.hpp) --------------------------------------------------------

COHORT_HD std::uint64_t mix64(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

COHORT_HD std::uint32_t hash32(std::uint32_t seed, std::uint32_t i) {
  std::uint32_t h = seed ^ (i * 0x9E3779B9u);
  h = (h ^ (h >> 16)) * 0x85EBCA6Bu;
  h = (h ^ (h >> 13)) * 0xC2B2AE35u;
  return h ^ (h >> 16);
}

// --- int8 with a scale per block (compress/quantize.hpp) ------------------------------------

/// Bytes of one encoded block: the fp32 scale, then the int8 values.
COHORT_HD constexpr std::uint32_t int8_record_bytes(std::uint32_t block) { return block + 4; }

/// What a block needs once its largest magnitude is known.
struct quant_params {
  float scale;  ///< Written in front of the block; NaN for a block with an inf or NaN.
  float inv;    ///< 127 / absmax.
  float half;   ///< scale / 2: magnitudes below it are sent as 0.
  bool live;    ///< False: every value of the block is sent as 0.
};

/// From the largest magnitude of a block as bits (`f2u(|x|)`, the max over the block).
COHORT_HD quant_params quant_prepare(std::uint32_t amax) {
  if (amax >= 0x7F80'0000u) return {u2f(0x7FC0'0000u), 0.0f, 0.0f, false};
  const float absmax = u2f(amax);
  if (!(absmax >= 0x1p-100f)) return {0.0f, 0.0f, 0.0f, false};
  const float scale = div_rn(absmax, 127.0f);
  return {scale, div_rn(127.0f, absmax), mul_rn(0.5f, scale), true};
}

/// Round to nearest even, |x| < scale / 2 sent as 0. Needs `p.live`.
COHORT_HD std::int8_t quant_nearest(float x, const quant_params& p) {
  constexpr float magic = 0x1.8p23f;
  const float r = sub_rn(add_rn(mul_rn(x, p.inv), magic), magic);
  int v = static_cast<int>(r);
  v = v < -127 ? -127 : (v > 127 ? 127 : v);
  const float ax = u2f(f2u(x) & 0x7FFF'FFFFu);
  return static_cast<std::int8_t>(ax < p.half ? 0 : v);
}

/// The seed of stochastic rounding for block `b` of an encoding salted with `salt`, from the
/// XOR of the block's bits and its length.
COHORT_HD std::uint32_t quant_seed(std::uint64_t salt, std::uint64_t b, std::uint32_t fold,
                                   std::uint32_t len) {
  return static_cast<std::uint32_t>(mix64(salt + b)) ^ hash32(fold, len);
}

/// Rounds up with probability equal to the fraction; element `i` of its block. Needs `p.live`.
COHORT_HD std::int8_t quant_stochastic(float x, const quant_params& p, std::uint32_t seed,
                                       std::uint32_t i) {
  const float t = mul_rn(x, p.inv);
  int f = static_cast<int>(t);
  f -= static_cast<float>(f) > t ? 1 : 0;
  const float frac = sub_rn(t, static_cast<float>(f));
  const float u = mul_rn(static_cast<float>(hash32(seed, i) >> 8), 0x1p-24f);
  int v = f + (frac > u ? 1 : 0);
  v = v < -127 ? -127 : (v > 127 ? 127 : v);
  return static_cast<std::int8_t>(v);
}

/// The decoded value of q in a block of scale `scale`.
COHORT_HD float dequant(std::int8_t q, float scale) { return mul_rn(static_cast<float>(q), scale); }

/// x combined with v as `compress::decode_mode` Mode says (0 assign, 1 add, 2 subtract).
template <int Mode>
COHORT_HD float apply_mode(float x, float v) {
  if constexpr (Mode == 0)
    return v;
  else if constexpr (Mode == 1)
    return add_rn(x, v);
  else
    return sub_rn(x, v);
}

// --- Top-k keys (compress/detail/select.hpp) --------------------------------------------------

/// The magnitude as ordered bits: larger |x| gives a larger key; NaN above infinity.
COHORT_HD std::uint32_t magnitude_key(float v) { return f2u(v) & 0x7FFF'FFFFu; }

/// Key and index in one number: the selection keeps the largest keys and, among equal keys,
/// the lowest indices, which is exactly "the largest composites".
COHORT_HD std::uint64_t composite_key(float v, std::uint32_t index) {
  return (static_cast<std::uint64_t>(magnitude_key(v)) << 32) | static_cast<std::uint32_t>(~index);
}

}  // namespace cohort::cuda::detail
