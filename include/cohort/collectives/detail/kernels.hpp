/// @file
/// Element-wise host kernels the schedules call: combine two buffers with a reduction.
#pragma once

#include <cstddef>
#include <cstring>
#include <span>

#include <cohort/core/detail/min.hpp>
#include <cohort/core/dtype.hpp>
#include <cohort/core/ops.hpp>

namespace cohort::detail {

// 16-bit floats are converted in blocks through the bulk conversions, which vectorize, and
// combined in fp32; a block of two inputs stays in L1.
inline constexpr std::size_t widen_block = 512;

inline void widen_n(const fp16* in, float* out, std::size_t n) { from_fp16({in, n}, {out, n}); }
inline void widen_n(const bf16* in, float* out, std::size_t n) { from_bf16({in, n}, {out, n}); }
inline void narrow_n(const float* in, fp16* out, std::size_t n) { to_fp16({in, n}, {out, n}); }
inline void narrow_n(const float* in, bf16* out, std::size_t n) { to_bf16({in, n}, {out, n}); }

/// out[i] = last(op(a[i], b[i])), accumulated in `accumulator_t<T>` and rounded once.
/// `out` may alias `a` or `b`.
template <element T, class Op, class Last>
void combine_with(const T* a, const T* b, T* out, std::size_t n, const Op& op, Last last) {
  if constexpr (is_16bit_float<T>) {
    float fa[widen_block], fb[widen_block];
    for (std::size_t i = 0; i < n; i += widen_block) {
      const std::size_t k = min_of(widen_block, n - i);
      widen_n(a + i, fa, k);
      widen_n(b + i, fb, k);
      for (std::size_t j = 0; j < k; ++j) fa[j] = last(op(fa[j], fb[j]));
      narrow_n(fa, out + i, k);
    }
  } else {
    for (std::size_t i = 0; i < n; ++i) out[i] = last(op(a[i], b[i]));
  }
}

/// out[i] = op(a[i], b[i]). `out` may alias `a` or `b`.
template <element T, class Op>
void combine(const T* a, const T* b, T* out, std::size_t n, const Op& op) {
  combine_with(a, b, out, n, op, [](accumulator_t<T> v) { return v; });
}

/// Like `combine`, then applies `op.finalize(., ranks)` where the op has one, in one rounding.
template <element T, class Op>
void combine_last(const T* a, const T* b, T* out, std::size_t n, const Op& op, int ranks) {
  if constexpr (finalizing_reduction_for<Op, T>) {
    combine_with(a, b, out, n, op, [&](accumulator_t<T> v) { return op.finalize(v, ranks); });
  } else {
    combine(a, b, out, n, op);
  }
}

/// out[i] = op.finalize(in[i], ranks) where the op has a finalize; a copy otherwise.
template <element T, class Op>
void finalize(const T* in, T* out, std::size_t n, const Op& op, int ranks) {
  if constexpr (finalizing_reduction_for<Op, T>) {
    for (std::size_t i = 0; i < n; ++i) out[i] = narrow<T>(op.finalize(widen(in[i]), ranks));
  } else if (in != out && n > 0) {  // an empty block may come with null pointers
    std::memmove(out, in, n * sizeof(T));
  }
}

}  // namespace cohort::detail
