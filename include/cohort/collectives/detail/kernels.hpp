/// @file
/// Element-wise host kernels the schedules call: combine two buffers with a reduction.
#pragma once

#include <cstddef>

#include <cohort/core/dtype.hpp>
#include <cohort/core/ops.hpp>

namespace cohort::detail {

/// out[i] = op(a[i], b[i]), accumulated in `accumulator_t<T>`. `out` may alias `a` or `b`.
template <element T, class Op>
void combine(const T* a, const T* b, T* out, std::size_t n, const Op& op) {
  for (std::size_t i = 0; i < n; ++i) out[i] = narrow<T>(op(widen(a[i]), widen(b[i])));
}

/// Like `combine`, then applies `op.finalize(., ranks)` where the op has one, in one rounding.
template <element T, class Op>
void combine_last(const T* a, const T* b, T* out, std::size_t n, const Op& op, int ranks) {
  if constexpr (finalizing_reduction_for<Op, T>) {
    for (std::size_t i = 0; i < n; ++i)
      out[i] = narrow<T>(op.finalize(op(widen(a[i]), widen(b[i])), ranks));
  } else {
    combine(a, b, out, n, op);
  }
}

/// out[i] = op.finalize(in[i], ranks) where the op has a finalize; a copy otherwise.
template <element T, class Op>
void finalize(const T* in, T* out, std::size_t n, const Op& op, int ranks) {
  if constexpr (finalizing_reduction_for<Op, T>) {
    for (std::size_t i = 0; i < n; ++i) out[i] = narrow<T>(op.finalize(widen(in[i]), ranks));
  } else if (in != out) {
    for (std::size_t i = 0; i < n; ++i) out[i] = in[i];
  }
}

}  // namespace cohort::detail
