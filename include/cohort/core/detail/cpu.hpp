/// @file
/// What the CPU offers, asked once at run time: the headers are built without `-march` flags,
/// so the kernels that use F16C or AVX2 are compiled as separate functions with a target
/// attribute and called only where the CPU (and the OS, which must save the AVX registers)
/// has them. The fp16 bulk conversions (core/dtype.hpp) and the codec kernels
/// (compress/detail/simd.hpp) choose with it.
#pragma once

#if (defined(__x86_64__) || defined(__i386__)) && (defined(__GNUC__) || defined(__clang__)) && \
    !defined(__CUDA_ARCH__)
#define COHORT_CPU_X86 1
#include <cpuid.h>
#else
#define COHORT_CPU_X86 0
#endif

namespace cohort::detail {

/// The x86 extensions the kernels are written for.
struct cpu_features {
  bool f16c = false;  ///< F16C (with AVX usable): 8 fp16 <-> float conversions per instruction.
  bool avx2 = false;  ///< AVX2 and F16C, AVX usable.
};

/// This CPU's features, detected on first use.
inline const cpu_features& cpu() noexcept {
  static const cpu_features found = [] {
    cpu_features f;
#if COHORT_CPU_X86
    // CPUID leaf 1: F16C (ecx bit 29), AVX (bit 28), OSXSAVE (bit 27); XCR0 bits 1 and 2: the
    // OS saves the SSE and AVX state; leaf 7: AVX2 (ebx bit 5).
    unsigned a = 0, b = 0, c = 0, d = 0;
    if (!__get_cpuid(1, &a, &b, &c, &d)) return f;
    constexpr unsigned f16c_avx_osxsave = (1u << 29) | (1u << 28) | (1u << 27);
    if ((c & f16c_avx_osxsave) != f16c_avx_osxsave) return f;
    unsigned xcr0_lo = 0, xcr0_hi = 0;
    __asm__("xgetbv" : "=a"(xcr0_lo), "=d"(xcr0_hi) : "c"(0));
    if ((xcr0_lo & 6u) != 6u) return f;
    f.f16c = true;
    if (__get_cpuid_count(7, 0, &a, &b, &c, &d)) f.avx2 = (b >> 5) & 1u;
#endif
    return f;
  }();
  return found;
}

}  // namespace cohort::detail
