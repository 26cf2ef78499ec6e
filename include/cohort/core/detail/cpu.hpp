/// @file
/// What the CPU offers, asked once at run time: the headers are built without `-march` flags,
/// so the kernels that use F16C or AVX2 are compiled as separate functions with a target
/// attribute and called only where the CPU (and the OS, which must save the AVX registers)
/// has them. The fp16 bulk conversions (core/dtype.hpp) and the codec kernels
/// (compress/detail/simd.hpp) choose with `cpu()`, so one switch, `kernel_cap`, turns all of
/// them to their portable paths (except under MSVC with `/arch:AVX2`, whose fp16 conversions
/// are F16C instructions throughout: core/dtype.hpp).
#pragma once

#include <atomic>

#if (defined(__x86_64__) || defined(__i386__)) && (defined(__GNUC__) || defined(__clang__)) && \
    !defined(__CUDA_ARCH__)
#define COHORT_CPU_X86 1
#else
#define COHORT_CPU_X86 0
#endif

namespace cohort::detail {

/// The x86 extensions the kernels are written for.
struct cpu_features {
  bool f16c = false;  ///< F16C (with AVX usable): 8 fp16 <-> float conversions per instruction.
  bool avx2 = false;  ///< AVX2 and F16C, AVX usable.
};

#if COHORT_CPU_X86
/// CPUID leaf `leaf`, subleaf `sub`: eax, ebx, ecx, edx. Spelled out rather than taken from
/// <cpuid.h>, which would reach every file that includes the library and declare `__cpuid`
/// and the `bit_*` macros there. Every x86-64 CPU has CPUID, as has every x86 since the 586.
inline void cpuid(unsigned leaf, unsigned sub, unsigned (&r)[4]) noexcept {
  __asm__ __volatile__("cpuid"
                       : "=a"(r[0]), "=b"(r[1]), "=c"(r[2]), "=d"(r[3])
                       : "a"(leaf), "c"(sub));
}
#endif

/// This CPU's features, detected on first use.
inline const cpu_features& detected_cpu() noexcept {
  static const cpu_features found = [] {
    cpu_features f;
#if COHORT_CPU_X86
    // Leaf 0: the highest leaf. Leaf 1: F16C (ecx bit 29), AVX (bit 28), OSXSAVE (bit 27).
    // XCR0 bits 1 and 2: the OS saves the SSE and AVX state. Leaf 7: AVX2 (ebx bit 5).
    unsigned r[4];
    cpuid(0, 0, r);
    const unsigned highest = r[0];
    if (highest < 1) return f;
    cpuid(1, 0, r);
    constexpr unsigned f16c_avx_osxsave = (1u << 29) | (1u << 28) | (1u << 27);
    if ((r[2] & f16c_avx_osxsave) != f16c_avx_osxsave) return f;
    unsigned xcr0_lo = 0, xcr0_hi = 0;
    __asm__ __volatile__("xgetbv" : "=a"(xcr0_lo), "=d"(xcr0_hi) : "c"(0));
    if ((xcr0_lo & 6u) != 6u) return f;
    f.f16c = true;
    if (highest >= 7) {
      cpuid(7, 0, r);
      f.avx2 = (r[1] >> 5) & 1u;
    }
#endif
    return f;
  }();
  return found;
}

/// -1: the kernels use what the CPU has; 0: only their portable paths run. For tests and
/// benchmarks that compare the two; not to be changed while a kernel runs on another thread.
inline std::atomic<int> kernel_cap{-1};

/// The features the kernels may use now: the CPU's, or none under `kernel_cap` 0.
inline cpu_features cpu() noexcept {
  if (kernel_cap.load(std::memory_order_relaxed) == 0) return {};
  return detected_cpu();
}

}  // namespace cohort::detail
