/// @file
/// Run-time choice between the portable codec kernels and AVX2/F16C ones.
///
/// The library is header-only and built without `-march` flags, so the vector kernels are
/// compiled as separate functions with a target attribute and chosen once, at first use, by
/// asking the CPU. Every kernel pair computes the same IEEE operations in the same order (no
/// FMA is enabled, so nothing contracts), so both paths give the same bits and ranks on
/// different CPUs agree. Define `COHORT_NO_SIMD_DISPATCH` to compile the portable codec kernels
/// only; the fp16 conversions they call (core/dtype.hpp's bulk conversions) follow
/// `COHORT_NO_F16C` instead. `cohort::detail::kernel_cap` 0 turns both to portable at run time.
#pragma once

#include <cohort/core/detail/cpu.hpp>

#if !defined(COHORT_NO_SIMD_DISPATCH) && COHORT_CPU_X86
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

/// The instruction set the kernels use now: the CPU's, or `portable` under
/// `cohort::detail::kernel_cap` 0 (core/detail/cpu.hpp).
inline isa active_isa() noexcept {
#if COHORT_SIMD_X86
  return cohort::detail::cpu().avx2 ? isa::avx2 : isa::portable;
#else
  return isa::portable;
#endif
}

}  // namespace cohort::compress::detail
