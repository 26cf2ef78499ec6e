/// @file
/// The device reductions, typed: `dst[j][i] = src[0][i] op ... op src[P-1][i]` on device memory,
/// stream-ordered, for the element types and built-in ops the kernels know.
///
/// Every function takes device pointers and a stream, checks its arguments (`errc::
/// invalid_argument`), launches and returns without waiting. CUDA failures throw
/// `cohort::error` with `errc::cuda_error` and the CUDA text; the overloads taking
/// `std::error_code&` report instead.
///
/// Results are bit for bit those of the host: `combine` is collectives/detail/kernels.hpp's
/// `combine` (fp32 accumulation for fp16/bf16, one rounding). The host tests check the
/// per-element arithmetic (detail/math.hpp) without a GPU; the device tests compare the kernels
/// with the host. The codecs are cuda/codecs.hpp.
#pragma once

#include <cohort/core/dtype.hpp>
#include <cohort/core/ops.hpp>
#include <cohort/cuda/detail/abi.hpp>
#include <cohort/cuda/detail/launch.hpp>
#include <cohort/cuda/runtime.hpp>
#include <concepts>
#include <cstddef>
#include <span>
#include <system_error>

namespace cohort::cuda {

/// Element types the device reductions take.
template <class T>
concept device_element = std::same_as<T, float> || std::same_as<T, double> ||
    std::same_as<T, fp16> || std::same_as<T, bf16>;

/// The built-in reductions (sum, prod, min, max, avg), the only ones the device kernels know.
template <class Op>
concept device_reduction =
    cohort::detail::builtin_reduction_of<Op> != cohort::detail::builtin_reduction::none;

namespace detail {

template <device_element T, device_reduction Op>
void fold(std::span<const T* const> src, std::span<T* const> dst, std::size_t n, int ranks,
          stream_t s, std::error_code* ec) {
  const char* bad = nullptr;
  if (src.empty() || dst.empty() || src.size() > COHORT_CUDA_MAX_OPERANDS ||
      dst.size() > COHORT_CUDA_MAX_OPERANDS)
    bad = "1 to 32 sources and destinations";
  for (const T* p : src) bad = n > 0 && p == nullptr ? "a null source pointer" : bad;
  for (T* p : dst) bad = n > 0 && p == nullptr ? "a null destination pointer" : bad;
  run(
      "cuda::fold", bad,
      [&] {
        const void* sv[COHORT_CUDA_MAX_OPERANDS];
        void* dv[COHORT_CUDA_MAX_OPERANDS];
        for (std::size_t i = 0; i < src.size(); ++i) sv[i] = src[i];
        for (std::size_t i = 0; i < dst.size(); ++i) dv[i] = dst[i];
        const auto op = static_cast<int>(cohort::detail::builtin_reduction_of<Op>);
        return cohort_cuda_reduce(static_cast<int>(dtype_of<T>), op, sv,
                                  static_cast<int>(src.size()), dv, static_cast<int>(dst.size()), n,
                                  ranks, s);
      },
      ec);
}

}  // namespace detail

/// For i < n: every dst[j][i] = src[0][i] op src[1][i] op ... (left to right, accumulated in
/// `accumulator_t<T>`), then `op.finalize(., ranks)` when `ranks` > 0, rounded once. A
/// destination may be a source. Up to 32 of each. 16-byte vector accesses when aligned.
template <device_element T, device_reduction Op>
void fold(std::span<const T* const> src, std::span<T* const> dst, std::size_t n, const Op&,
          int ranks, stream_t s) {
  detail::fold<T, Op>(src, dst, n, ranks, s, nullptr);
}
/// As above; reports failure through `ec`.
template <device_element T, device_reduction Op>
void fold(std::span<const T* const> src, std::span<T* const> dst, std::size_t n, const Op&,
          int ranks, stream_t s, std::error_code& ec) {
  detail::fold<T, Op>(src, dst, n, ranks, s, &ec);
}

/// out[i] = op(a[i], b[i]) on the device: the host `combine`. `out` may be `a` or `b`.
template <device_element T, device_reduction Op>
void combine(const T* a, const T* b, T* out, std::size_t n, const Op& op, stream_t s) {
  const T* src[] = {a, b};
  T* const dst[] = {out};
  fold<T>(std::span<const T* const>(src), std::span<T* const>(dst), n, op, 0, s);
}

}  // namespace cohort::cuda
