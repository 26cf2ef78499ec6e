/// @file
/// Element types the collectives move: the 16-bit floats `fp16` and `bf16`, the `dtype` tag,
/// the `element` concept, accumulation types and bulk conversions.
///
/// Conversions to 16 bits round to nearest, ties to even; NaN stays NaN (made quiet, the top
/// payload bits kept), infinities stay infinite, overflow gives infinity, and subnormal results
/// are rounded correctly, never flushed. Conversions to float are exact.
/// The bulk conversions `to_fp16` and `from_fp16` (which the collectives' fp16 reductions use)
/// convert 8 at a time with F16C where the CPU has it, asked once at run time
/// (core/detail/cpu.hpp), so a build without `-march` flags gets them too (bench/RESULTS.md);
/// everything else, their tails included, runs a portable, branch-free bit-manipulation path
/// (it assumes the default floating-point rounding mode). With GCC and Clang that holds
/// whatever the flags (`-mf16c` included), so every translation unit has the same source for
/// these inline functions and `cohort::detail::kernel_cap` 0 makes them all portable; MSVC
/// with `/arch:AVX2` uses the F16C instructions throughout instead. Every path gives the same
/// bits for every input, so ranks built or run either way agree; define `COHORT_NO_F16C` for
/// the portable path only.
/// Nothing here allocates, locks or throws.
#pragma once

#include <bit>
#include <cassert>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>
#include <type_traits>

// MSVC with /arch:AVX2 (host only) converts with the F16C intrinsics; define COHORT_NO_F16C to
// force the portable path.
#if !defined(COHORT_NO_F16C) && !defined(__CUDA_ARCH__) && defined(_MSC_VER) && defined(__AVX2__)
#define COHORT_HAS_F16C 1
#include <immintrin.h>
#else
#define COHORT_HAS_F16C 0
#endif

// GCC and Clang on x86: the bulk conversions ask the CPU, whatever the flags, so that every
// translation unit has the same source for them; their kernels are written with the
// compiler's builtins, which need no intrinsics header.
#include <cohort/core/detail/cpu.hpp>
#if !defined(COHORT_NO_F16C) && COHORT_CPU_X86
#define COHORT_F16C_AT_RUN_TIME 1
#else
#define COHORT_F16C_AT_RUN_TIME 0
#endif

namespace cohort {

namespace detail {

// `c ? a : b` as bit masks. GCC turns a `?:` next to a float operation into a branch and then
// does not vectorize the loop; masks keep the conversion loops vectorizable.
constexpr std::uint32_t select(bool c, std::uint32_t a, std::uint32_t b) noexcept {
  const std::uint32_t m = 0u - static_cast<std::uint32_t>(c);
  return (a & m) | (b & ~m);
}

// Portable float -> binary16 bits. Branch-free so that loops over it vectorize.
constexpr std::uint16_t f32_to_f16_portable(float f) noexcept {
  const std::uint32_t x = std::bit_cast<std::uint32_t>(f);
  const std::uint32_t sign = (x >> 16) & 0x8000u;
  const std::uint32_t a = x & 0x7FFF'FFFFu;
  // Normal result: rebias the exponent (127 -> 15) and round on bit 13, ties to even. A carry
  // out of the mantissa correctly bumps the exponent, up to infinity (0x7C00).
  const std::uint32_t normal = (a - (112u << 23) + 0x0FFFu + ((a >> 13) & 1u)) >> 13;
  // Subnormal result (|f| < 2^-14): adding 0.5f puts the units of 2^-24 at the bottom of the
  // mantissa, so the float addition itself rounds to nearest even. Clamping the operand keeps
  // NaN out of the addition (no FE_INVALID, and it stays a constant expression).
  const bool small = a < (113u << 23);
  const std::uint32_t clamped = select(small, a, 0u);
  const std::uint32_t sub = std::bit_cast<std::uint32_t>(std::bit_cast<float>(clamped) + 0.5f) -
                            std::bit_cast<std::uint32_t>(0.5f);
  // NaN: keep the top 10 payload bits and set the quiet bit, as VCVTPS2PH does.
  const std::uint32_t nan = 0x7E00u | ((a >> 13) & 0x03FFu);
  std::uint32_t r = select(small, sub, normal);
  r = select(a >= (143u << 23), 0x7C00u, r);  // |f| >= 65536 (65520..65536 carry in `normal`)
  r = select(a > 0x7F80'0000u, nan, r);
  return static_cast<std::uint16_t>(r | sign);
}

// Portable binary16 bits -> float, exact. A signalling NaN comes back quiet, as VCVTPH2PS does.
constexpr float f16_to_f32_portable(std::uint16_t h) noexcept {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  const std::uint32_t em = static_cast<std::uint32_t>(h & 0x7FFFu) << 13;
  const std::uint32_t exp = em & 0x0F80'0000u;
  const std::uint32_t normal = em + (112u << 23);
  // Subnormal m * 2^-24: read (1 + m/1024) * 2^-14 and subtract 2^-14, which is exact.
  const float two_m14 = std::bit_cast<float>(113u << 23);
  const std::uint32_t sub =
      std::bit_cast<std::uint32_t>(std::bit_cast<float>(em + (113u << 23)) - two_m14);
  const std::uint32_t special = em | 0x7F80'0000u | (em > 0x0F80'0000u ? 0x0040'0000u : 0u);
  std::uint32_t r = select(exp == 0, sub, normal);
  r = select(exp == 0x0F80'0000u, special, r);
  return std::bit_cast<float>(r | sign);
}

// float -> binary16 bits: portable, or F16C under MSVC with /arch:AVX2.
constexpr std::uint16_t f32_to_f16(float f) noexcept {
#if COHORT_HAS_F16C
  if (!std::is_constant_evaluated()) {
    const __m128i h = _mm_cvtps_ph(_mm_set_ss(f), _MM_FROUND_TO_NEAREST_INT);
    return static_cast<std::uint16_t>(_mm_cvtsi128_si32(h));
  }
#endif
  return f32_to_f16_portable(f);
}

// binary16 bits -> float: portable, or F16C under MSVC with /arch:AVX2.
constexpr float f16_to_f32(std::uint16_t h) noexcept {
#if COHORT_HAS_F16C
  if (!std::is_constant_evaluated()) return _cvtsh_ss(h);
#endif
  return f16_to_f32_portable(h);
}

#if COHORT_F16C_AT_RUN_TIME
// Eight conversions per instruction, for CPUs that have F16C (`cpu().f16c`): each converts
// the longest multiple of 8 elements of the 16-bit patterns at `halves` and returns how many
// it did. Immediate 0 of VCVTPS2PH: round to nearest even, as the portable path does.
using f16c_floats = float __attribute__((vector_size(32)));
using f16c_halves = short __attribute__((vector_size(16)));

[[gnu::target("avx,f16c")]] inline std::size_t f32_to_f16_f16c(const float* in, void* halves,
                                                                std::size_t n) noexcept {
  auto* out = static_cast<unsigned char*>(halves);
  std::size_t i = 0;
  for (const std::size_t n8 = n - n % 8; i < n8; i += 8) {
    f16c_floats x;
    __builtin_memcpy(&x, in + i, sizeof x);
    const f16c_halves h = __builtin_ia32_vcvtps2ph256(x, 0);
    __builtin_memcpy(out + 2 * i, &h, sizeof h);
  }
  return i;
}

[[gnu::target("avx,f16c")]] inline std::size_t f16_to_f32_f16c(const void* halves, float* out,
                                                                std::size_t n) noexcept {
  const auto* in = static_cast<const unsigned char*>(halves);
  std::size_t i = 0;
  for (const std::size_t n8 = n - n % 8; i < n8; i += 8) {
    f16c_halves h;
    __builtin_memcpy(&h, in + 2 * i, sizeof h);
    const f16c_floats x = __builtin_ia32_vcvtph2ps256(h);
    __builtin_memcpy(out + i, &x, sizeof x);
  }
  return i;
}
#endif

// float -> bfloat16 bits: round to nearest even on bit 16; a NaN is truncated and made quiet so
// that rounding can never carry it into infinity. Branch-free so that loops vectorize.
constexpr std::uint16_t f32_to_bf16(float f) noexcept {
  const std::uint32_t x = std::bit_cast<std::uint32_t>(f);
  const std::uint32_t rounded = (x + 0x7FFFu + ((x >> 16) & 1u)) >> 16;
  const std::uint32_t quiet = (x >> 16) | 0x0040u;
  return static_cast<std::uint16_t>((x & 0x7FFF'FFFFu) > 0x7F80'0000u ? quiet : rounded);
}

// bfloat16 bits -> float, exact (NaN payloads pass through unchanged).
constexpr float bf16_to_f32(std::uint16_t b) noexcept {
  return std::bit_cast<float>(static_cast<std::uint32_t>(b) << 16);
}

}  // namespace detail

/// IEEE 754 binary16 ("half"), stored as its bits. Trivially copyable, 2 bytes, 2-aligned.
///
/// Arithmetic is done in `float` (see `widen`, `narrow`); this type only stores and converts.
struct fp16 {
  /// The raw binary16 bits: sign, 5 exponent bits, 10 mantissa bits.
  std::uint16_t bits = 0;

  /// Positive zero.
  fp16() = default;
  /// Rounds `f` to nearest, ties to even. NaN stays NaN (quiet), infinity stays infinity,
  /// finite values of magnitude 65520 or more become infinity, subnormals round correctly.
  constexpr explicit fp16(float f) noexcept : bits(detail::f32_to_f16(f)) {}
  /// The exact value as a float (a signalling NaN comes back quiet).
  constexpr explicit operator float() const noexcept { return detail::f16_to_f32(bits); }
  /// The fp16 whose bits are `b`.
  static constexpr fp16 from_bits(std::uint16_t b) noexcept {
    fp16 h;
    h.bits = b;
    return h;
  }
  /// Bitwise equality, not IEEE equality: `+0 != -0`, and a NaN equals a NaN with the same
  /// bits. Results are compared bitwise across ranks, and this is that comparison.
  friend constexpr bool operator==(fp16 a, fp16 b) noexcept { return a.bits == b.bits; }
};

/// bfloat16: the top 16 bits of an IEEE 754 binary32. Trivially copyable, 2 bytes, 2-aligned.
///
/// Arithmetic is done in `float` (see `widen`, `narrow`); this type only stores and converts.
struct bf16 {
  /// The raw bits: sign, 8 exponent bits, 7 mantissa bits.
  std::uint16_t bits = 0;

  /// Positive zero.
  bf16() = default;
  /// Rounds `f` to nearest, ties to even. NaN stays NaN (quiet), infinity stays infinity,
  /// finite values that round past the largest bf16 become infinity.
  constexpr explicit bf16(float f) noexcept : bits(detail::f32_to_bf16(f)) {}
  /// The exact value as a float.
  constexpr explicit operator float() const noexcept { return detail::bf16_to_f32(bits); }
  /// The bf16 whose bits are `b`.
  static constexpr bf16 from_bits(std::uint16_t b) noexcept {
    bf16 h;
    h.bits = b;
    return h;
  }
  /// Bitwise equality, not IEEE equality: `+0 != -0`, and a NaN equals a NaN with the same
  /// bits. Results are compared bitwise across ranks, and this is that comparison.
  friend constexpr bool operator==(bf16 a, bf16 b) noexcept { return a.bits == b.bits; }
};

static_assert(sizeof(fp16) == 2 && alignof(fp16) == 2 && std::is_trivially_copyable_v<fp16>);
static_assert(sizeof(bf16) == 2 && alignof(bf16) == 2 && std::is_trivially_copyable_v<bf16>);

/// Element types the collectives move. The values go on the wire; they never change.
enum class dtype : std::uint8_t { f32, f64, i32, i64, i8, u8, fp16, bf16 };

/// The short name of `t`: "f32", "f64", "i32", "i64", "i8", "u8", "fp16" or "bf16"
/// ("unknown" for a value outside the enumeration, e.g. one read from a corrupt header).
constexpr std::string_view dtype_name(dtype t) noexcept {
  switch (t) {
    case dtype::f32: return "f32";
    case dtype::f64: return "f64";
    case dtype::i32: return "i32";
    case dtype::i64: return "i64";
    case dtype::i8: return "i8";
    case dtype::u8: return "u8";
    case dtype::fp16: return "fp16";
    case dtype::bf16: return "bf16";
  }
  return "unknown";
}

/// The size in bytes of one element of type `t` (0 for a value outside the enumeration).
constexpr std::size_t dtype_size(dtype t) noexcept {
  switch (t) {
    case dtype::f32: return 4;
    case dtype::f64: return 8;
    case dtype::i32: return 4;
    case dtype::i64: return 8;
    case dtype::i8: return 1;
    case dtype::u8: return 1;
    case dtype::fp16: return 2;
    case dtype::bf16: return 2;
  }
  return 0;
}

/// True for exactly the element types: `float`, `double`, `std::int32_t`, `std::int64_t`,
/// `std::int8_t`, `std::uint8_t`, `fp16` and `bf16` (no cv-qualifiers, no other aliases: `char`
/// and, where `std::int64_t` is `long`, `long long` are not elements).
template <class T>
concept element = std::same_as<T, float> || std::same_as<T, double> ||
                  std::same_as<T, std::int32_t> || std::same_as<T, std::int64_t> ||
                  std::same_as<T, std::int8_t> || std::same_as<T, std::uint8_t> ||
                  std::same_as<T, fp16> || std::same_as<T, bf16>;

namespace detail {
template <element T>
constexpr dtype dtype_of_impl() noexcept {
  if constexpr (std::same_as<T, float>) return dtype::f32;
  else if constexpr (std::same_as<T, double>) return dtype::f64;
  else if constexpr (std::same_as<T, std::int32_t>) return dtype::i32;
  else if constexpr (std::same_as<T, std::int64_t>) return dtype::i64;
  else if constexpr (std::same_as<T, std::int8_t>) return dtype::i8;
  else if constexpr (std::same_as<T, std::uint8_t>) return dtype::u8;
  else if constexpr (std::same_as<T, fp16>) return dtype::fp16;
  else return dtype::bf16;
}

template <class T>
inline constexpr bool is_16bit_float = std::same_as<T, fp16> || std::same_as<T, bf16>;
}  // namespace detail

/// The `dtype` tag of the element type `T`.
template <element T>
inline constexpr dtype dtype_of = detail::dtype_of_impl<T>();

/// The type in which `T` is accumulated: `float` for `fp16` and `bf16`, `T` otherwise.
template <element T>
using accumulator_t = std::conditional_t<detail::is_16bit_float<T>, float, T>;

/// `v` as an `accumulator_t<T>`: exact; the identity for types other than fp16 and bf16.
template <element T>
constexpr accumulator_t<T> widen(T v) noexcept {
  if constexpr (detail::is_16bit_float<T>) return static_cast<float>(v);
  else return v;
}

/// `v` rounded back to `T` (to nearest even for fp16 and bf16); the identity otherwise.
template <element T>
constexpr T narrow(accumulator_t<T> v) noexcept {
  if constexpr (detail::is_16bit_float<T>) return T(v);
  else return v;
}

/// Converts each float in `in` to fp16 as `fp16(float)` does (the same bits). Sizes must match.
inline void to_fp16(std::span<const float> in, std::span<fp16> out) noexcept {
  assert(in.size() == out.size());
  const std::size_t n = in.size();
  const float* src = in.data();
  fp16* dst = out.data();
  std::size_t i = 0;
#if COHORT_F16C_AT_RUN_TIME
  if (detail::cpu().f16c) i = detail::f32_to_f16_f16c(src, dst, n);
#elif COHORT_HAS_F16C  // MSVC with /arch:AVX2
  for (const std::size_t n8 = n - n % 8; i < n8; i += 8) {
    const __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i), h);
  }
#endif
  for (; i < n; ++i) dst[i].bits = detail::f32_to_f16(src[i]);
}

/// Converts each fp16 in `in` to float exactly, as `float(fp16)` does. Sizes must match.
inline void from_fp16(std::span<const fp16> in, std::span<float> out) noexcept {
  assert(in.size() == out.size());
  const std::size_t n = in.size();
  const fp16* src = in.data();
  float* dst = out.data();
  std::size_t i = 0;
#if COHORT_F16C_AT_RUN_TIME
  if (detail::cpu().f16c) i = detail::f16_to_f32_f16c(src, dst, n);
#elif COHORT_HAS_F16C  // MSVC with /arch:AVX2
  for (const std::size_t n8 = n - n % 8; i < n8; i += 8) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i));
    _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(h));
  }
#endif
  for (; i < n; ++i) dst[i] = detail::f16_to_f32(src[i].bits);
}

/// Converts each float in `in` to bf16 as `bf16(float)` does (the same bits). Sizes must match.
inline void to_bf16(std::span<const float> in, std::span<bf16> out) noexcept {
  assert(in.size() == out.size());
  const std::size_t n = in.size();
  const float* src = in.data();
  bf16* dst = out.data();
  for (std::size_t i = 0; i < n; ++i) dst[i].bits = detail::f32_to_bf16(src[i]);
}

/// Converts each bf16 in `in` to float exactly, as `float(bf16)` does. Sizes must match.
inline void from_bf16(std::span<const bf16> in, std::span<float> out) noexcept {
  assert(in.size() == out.size());
  const std::size_t n = in.size();
  const bf16* src = in.data();
  float* dst = out.data();
  for (std::size_t i = 0; i < n; ++i) dst[i] = detail::bf16_to_f32(src[i].bits);
}

}  // namespace cohort
