/// @file
/// The numbers of the built-in reductions, written once: call headers carry them on the wire,
/// CUDA IPC call records carry them between processes, and the device ABI takes them
/// (`cohort_cuda_reduce`). Append only; a number never changes meaning.
///
/// Includes nothing but <cstdint>, so that the kernels nvcc compiles (cuda/) use the same
/// numbers as the host (core/ops.hpp maps the `ops::` types onto them).
#pragma once

#include <cstdint>

namespace cohort::detail {

/// A built-in reduction as a number; `none` for a user-defined one (or no reduction).
enum class builtin_reduction : std::uint32_t {
  none = 0,
  sum = 1,
  prod = 2,
  min = 3,
  max = 4,
  avg = 5,
};

/// The largest number a built-in has; user-defined reductions get tags above 255.
inline constexpr std::uint32_t last_builtin_reduction = 5;

}  // namespace cohort::detail
