// COHORT_TEST_SCALE: sanitizer runs (tests/sanitize) thin the larger test matrices with it.
#pragma once

#include <cstdlib>

namespace cohort::test {

/// COHORT_TEST_SCALE as a number in (0, 1]; 1 when unset or out of range.
inline double test_scale() {
  const char* s = std::getenv("COHORT_TEST_SCALE");
  if (!s || !*s) return 1.0;
  const double v = std::atof(s);
  return v > 0 && v <= 1 ? v : 1.0;
}

}  // namespace cohort::test
