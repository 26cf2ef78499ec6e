// COHORT_TEST_SCALE: sanitizer runs (tests/sanitize) thin the larger test matrices with it; and
// whether this is such a build.
#pragma once

#include <cstdlib>

// COHORT_TEST_ASAN: built with AddressSanitizer (and so LeakSanitizer); COHORT_TEST_SANITIZED:
// with ASan or ThreadSanitizer. GCC says so with __SANITIZE_*__, Clang with __has_feature.
#if defined(__SANITIZE_ADDRESS__)
#define COHORT_TEST_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define COHORT_TEST_ASAN 1
#endif
#endif
#if defined(__SANITIZE_THREAD__)
#define COHORT_TEST_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define COHORT_TEST_TSAN 1
#endif
#endif
#if defined(COHORT_TEST_ASAN) || defined(COHORT_TEST_TSAN)
#define COHORT_TEST_SANITIZED 1
#endif

namespace cohort::test {

/// True in an ASan or TSan build, whose allocators and shadow memory inflate resident memory
/// several times (bounds on memory are loosened there; LeakSanitizer checks leaks instead) and
/// whose threads and processes a loaded machine starts and runs late (waits are longer there).
#if defined(COHORT_TEST_SANITIZED)
inline constexpr bool sanitized = true;
#else
inline constexpr bool sanitized = false;
#endif

/// COHORT_TEST_SCALE as a number in (0, 1]; 1 when unset or out of range.
inline double test_scale() {
  const char* s = std::getenv("COHORT_TEST_SCALE");
  if (!s || !*s) return 1.0;
  const double v = std::atof(s);
  return v > 0 && v <= 1 ? v : 1.0;
}

}  // namespace cohort::test
