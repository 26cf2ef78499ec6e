// Element-wise reduction of up to COHORT_CUDA_MAX_OPERANDS sources into as many destinations,
// in one pass: the kernel of cohort_cuda_reduce and of the CUDA IPC all_reduce, where the
// sources and destinations are the ranks' buffers mapped into this process.
#pragma once

#include "common.cuh"

namespace cohort::cuda::kernels {

/// Passed by value (kernel parameter space): the pointers are read by every thread.
struct reduce_args {
  const void* src[COHORT_CUDA_MAX_OPERANDS];
  void* dst[COHORT_CUDA_MAX_OPERANDS];
  int nsrc;
  int ndst;
  std::size_t count;
  int ranks;  // > 0: finalize with this many ranks (avg)
};

template <class T, builtin_reduction Op>
__device__ __forceinline__ typename T::acc finish(typename T::acc v, int ranks) {
  return ranks > 0 ? reduce_op<Op>::finalize(v, ranks) : v;
}

// Every element is read from all sources before any destination is written, by the same
// thread, so a destination may be one of the sources (in place).
template <class T, builtin_reduction Op, bool Vec>
__global__ void __launch_bounds__(threads_per_block) reduce_kernel(const reduce_args a) {
  using S = typename T::storage;
  using A = typename T::acc;
  using R = reduce_op<Op>;
  const std::size_t start = global_thread(), step = grid_threads();
  std::size_t done = 0;
  if constexpr (Vec) {
    constexpr int V = vec16<S>::size;
    const std::size_t nv = a.count / V;
    for (std::size_t i = start; i < nv; i += step) {
      A acc[V];
      vec16<S> x = load16<S>(a.src[0], i);
#pragma unroll
      for (int j = 0; j < V; ++j) acc[j] = T::widen(x.v[j]);
      for (int q = 1; q < a.nsrc; ++q) {
        x = load16<S>(a.src[q], i);
#pragma unroll
        for (int j = 0; j < V; ++j) acc[j] = R::apply(acc[j], T::widen(x.v[j]));
      }
      vec16<S> y;
#pragma unroll
      for (int j = 0; j < V; ++j) y.v[j] = T::narrow(finish<T, Op>(acc[j], a.ranks));
      for (int q = 0; q < a.ndst; ++q) store16<S>(a.dst[q], i, y);
    }
    done = nv * V;
  }
  for (std::size_t i = done + start; i < a.count; i += step) {
    A acc = T::widen(static_cast<const S*>(a.src[0])[i]);
    for (int q = 1; q < a.nsrc; ++q)
      acc = R::apply(acc, T::widen(static_cast<const S*>(a.src[q])[i]));
    const S y = T::narrow(finish<T, Op>(acc, a.ranks));
    for (int q = 0; q < a.ndst; ++q) static_cast<S*>(a.dst[q])[i] = y;
  }
}

template <class T, builtin_reduction Op>
int launch_reduce(const reduce_args& a, cudaStream_t stream) {
  bool vec = true;
  for (int q = 0; q < a.nsrc; ++q) vec = vec && aligned16(a.src[q]);
  for (int q = 0; q < a.ndst; ++q) vec = vec && aligned16(a.dst[q]);
  constexpr std::size_t V = vec16<typename T::storage>::size;
  const std::size_t items = vec ? a.count / V + a.count % V : a.count;
  const unsigned grid = grid_for(items);
  if (vec)
    reduce_kernel<T, Op, true><<<grid, threads_per_block, 0, stream>>>(a);
  else
    reduce_kernel<T, Op, false><<<grid, threads_per_block, 0, stream>>>(a);
  return launched();
}

template <class T>
int launch_reduce_op(int op, const reduce_args& a, cudaStream_t stream) {
  switch (static_cast<builtin_reduction>(op)) {
    case builtin_reduction::sum:
      return launch_reduce<T, builtin_reduction::sum>(a, stream);
    case builtin_reduction::prod:
      return launch_reduce<T, builtin_reduction::prod>(a, stream);
    case builtin_reduction::min:
      return launch_reduce<T, builtin_reduction::min>(a, stream);
    case builtin_reduction::max:
      return launch_reduce<T, builtin_reduction::max>(a, stream);
    case builtin_reduction::avg:
      return launch_reduce<T, builtin_reduction::avg>(a, stream);
    case builtin_reduction::none:
      break;
  }
  return static_cast<int>(cudaErrorInvalidValue);
}

}  // namespace cohort::cuda::kernels
