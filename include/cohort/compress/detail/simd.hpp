/// @file
/// Run-time choice between the portable codec kernels and AVX2/F16C ones.
///
/// The library is header-only and built without `-march` flags, so the vector kernels are
/// compiled as separate functions with a target attribute and chosen once, at first use, by
/// asking the CPU. Every kernel pair computes the same IEEE operations in the same order (no
/// FMA is enabled, so nothing contracts), so both paths give the same bits and ranks on
/// different CPUs agree. Define `COHORT_NO_SIMD_DISPATCH` to compile the portable path only.
#pragma once

#include <atomic>

#include <cohort/core/detail/cpu.hpp>

#if !defined(COHORT_NO_SIMD_DISPATCH) && (defined(__x86_64__) || defined(__i386__)) && \
    (defined(__GNUC__) || defined(__clang__)) && !defined(__CUDA_ARCH__)
#define COHORT_SIMD_X86 1
#include <immintrin.h>
/// Marks a function compiled for AVX2 and F16C (called only when the CPU has both).
#define COHORT_TARGET_AVX2 __attribute__((target("avx2,f16c")))
#else
#define COHORT_SIMD_X86 0
#define COHORT_TARGET_AVX2
#endif

namespace cohort::compress::detail {

/// The instruction sets a kernel may be written for, in increasing order.
enum class isa : int { portable = 0, avx2 = 1 };

/// Caps the kernels at `portable` (0) or lets them use what the CPU has (-1); for tests and
/// benchmarks that compare the two paths. Not for use while a codec runs on another thread.
inline std::atomic<int> isa_cap{-1};

/// What this CPU offers (core/detail/cpu.hpp).
inline isa detected_isa() noexcept {
#if COHORT_SIMD_X86
  return cohort::detail::cpu().avx2 ? isa::avx2 : isa::portable;
#else
  return isa::portable;
#endif
}

/// The instruction set the kernels use now: the CPU's, unless `isa_cap` lowers it.
inline isa active_isa() noexcept {
  const int cap = isa_cap.load(std::memory_order_relaxed);
  const isa found = detected_isa();
  return cap >= 0 && cap < static_cast<int>(found) ? static_cast<isa>(cap) : found;
}

}  // namespace cohort::compress::detail
