// Shared helpers for the tests: doctest with the std printers it needs, and a guard that caps
// the kernels for a scope.
#pragma once

#include <ostream>
#include <string>

#include <doctest/doctest.h>

#include <cohort/core/detail/cpu.hpp>

namespace cohort::test {

// Caps the kernels (the codecs' and the fp16 bulk conversions') at `cap` until the end of the
// scope: 0, their portable paths; -1, what the CPU has (core/detail/cpu.hpp).
class kernel_cap_guard {
 public:
  explicit kernel_cap_guard(int cap) noexcept { cohort::detail::kernel_cap.store(cap); }
  ~kernel_cap_guard() { cohort::detail::kernel_cap.store(-1); }
  kernel_cap_guard(const kernel_cap_guard&) = delete;
  kernel_cap_guard& operator=(const kernel_cap_guard&) = delete;
};

}  // namespace cohort::test
