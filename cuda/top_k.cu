// cohort-cuda, part 2 of 2: top-k selection by magnitude on the device. The plan (which passes,
// what they decide) is include/cohort/cuda/detail/top_k_plan.hpp, shared with the host tests;
// this file is its backend: radix histograms, the sample, a count, and stable selections with
// cub::DeviceSelect (CUDA 13.0 ships no cub::DeviceTopK).
#include <cuda_runtime.h>
#include <thrust/iterator/counting_iterator.h>

#include <cohort/cuda/detail/top_k_plan.hpp>
#include <cub/device/device_select.cuh>

#include "common.cuh"

using namespace cohort::cuda::kernels;
using cohort::cuda::detail::top_k_source;

namespace {

constexpr int source_all = 0, source_candidates = 1, source_sample = 2;

template <int Src>
__device__ __forceinline__ std::uint64_t composite_at(const float* x, const std::uint32_t* list,
                                                      std::size_t i) {
  if constexpr (Src == source_all) {
    return composite_key(x[i], static_cast<std::uint32_t>(i));
  } else if constexpr (Src == source_candidates) {
    const std::uint32_t idx = list[i];
    return composite_key(x[idx], idx);
  } else {
    return static_cast<std::uint64_t>(list[i]) << 32;
  }
}

template <int Src>
__global__ void __launch_bounds__(threads_per_block)
    histogram_kernel(const float* x, const std::uint32_t* list, std::size_t count, int shift,
                     int width, std::uint64_t prefix, std::uint32_t* hist) {
  __shared__ std::uint32_t h[cohort::cuda::detail::top_k_max_bins];
  const std::uint32_t bins = 1u << width;
  for (std::uint32_t b = threadIdx.x; b < bins; b += blockDim.x) h[b] = 0;
  __syncthreads();
  const int high = shift + width;  // at most 63
  for (std::size_t i = global_thread(); i < count; i += grid_threads()) {
    const std::uint64_t c = composite_at<Src>(x, list, i);
    if ((c >> high) == prefix) atomicAdd(&h[(c >> shift) & (bins - 1)], 1u);
  }
  __syncthreads();
  for (std::uint32_t b = threadIdx.x; b < bins; b += blockDim.x)
    if (h[b] != 0) atomicAdd(&hist[b], h[b]);
}

// Sample key t = j * run + i: float i of the run that starts at a random place of stratum j.
__global__ void __launch_bounds__(threads_per_block)
    sample_kernel(const float* x, std::size_t runs, std::size_t stride, std::uint64_t salt,
                  std::uint32_t* sample) {
  constexpr std::size_t run = cohort::cuda::detail::top_k_tuning::sample_run;
  for (std::size_t t = global_thread(); t < runs * run; t += grid_threads()) {
    const std::size_t j = t / run;
    const std::size_t at =
        j * stride + static_cast<std::size_t>(mix64(salt + j) % (stride - run + 1));
    sample[t] = magnitude_key(x[at + t % run]);
  }
}

__global__ void __launch_bounds__(threads_per_block)
    count_kernel(const float* x, std::size_t n, std::uint32_t key, unsigned long long* count) {
  __shared__ unsigned long long warp_counts[threads_per_block / 32];
  unsigned long long mine = 0;
  for (std::size_t i = global_thread(); i < n; i += grid_threads())
    mine += magnitude_key(x[i]) >= key ? 1 : 0;
  for (int o = 16; o > 0; o >>= 1) mine += __shfl_xor_sync(0xFFFF'FFFFu, mine, o);
  if (threadIdx.x % 32 == 0) warp_counts[threadIdx.x / 32] = mine;
  __syncthreads();
  if (threadIdx.x == 0) {
    unsigned long long sum = 0;
    for (int w = 0; w < threads_per_block / 32; ++w) sum += warp_counts[w];
    if (sum != 0) atomicAdd(count, sum);
  }
}

__global__ void __launch_bounds__(threads_per_block)
    add_residual_kernel(const float* g, float* r, std::size_t n, bool first) {
  for (std::size_t i = global_thread(); i < n; i += grid_threads())
    r[i] = first ? g[i] : add_rn(g[i], r[i]);
}

// values[j] = V(c[idx[j]]); with feedback c[idx[j]] -= float(values[j]) (c is the residual).
template <class V, bool Feedback>
__global__ void __launch_bounds__(threads_per_block)
    gather_kernel(float* c, const std::uint32_t* idx, typename V::storage* values, std::size_t m) {
  for (std::size_t j = global_thread(); j < m; j += grid_threads()) {
    const std::uint32_t i = idx[j];
    const float v = c[i];
    const typename V::storage w = V::narrow(v);
    values[j] = w;
    if constexpr (Feedback) c[i] = sub_rn(v, V::widen(w));
  }
}

/// composite(x[i], i) >= t: the selection predicate over indices.
struct at_least {
  const float* x;
  std::uint64_t t;
  __device__ bool operator()(std::uint32_t i) const { return composite_key(x[i], i) >= t; }
};

std::size_t round_up(std::size_t v) { return (v + 255) / 256 * 256; }

struct layout {
  std::size_t hist = 0, counters = 0, sample = 0, candidates = 0, temp = 0, temp_bytes = 0,
              total = 0;
};

int select_temp_bytes(std::size_t n, std::size_t& bytes) {
  std::size_t a = 0, b = 0;
  auto* none = static_cast<std::uint32_t*>(nullptr);
  auto* count = static_cast<long long*>(nullptr);
  COHORT_CUDA_TRY(cub::DeviceSelect::If(nullptr, a, thrust::counting_iterator<std::uint32_t>(0),
                                        none, count, static_cast<std::int64_t>(n),
                                        at_least{nullptr, 0}));
  COHORT_CUDA_TRY(cub::DeviceSelect::If(nullptr, b, static_cast<const std::uint32_t*>(nullptr),
                                        none, count, static_cast<std::int64_t>(n),
                                        at_least{nullptr, 0}));
  bytes = a > b ? a : b;
  return 0;
}

int plan_layout(std::size_t n, std::size_t k, int method, layout& l) {
  using namespace cohort::cuda::detail;
  std::size_t temp = 0;
  COHORT_CUDA_TRY(static_cast<cudaError_t>(select_temp_bytes(n > 0 ? n : 1, temp)));
  std::size_t at = 0;
  l.hist = at;
  at += round_up(top_k_max_bins * sizeof(std::uint32_t));
  l.counters = at;
  at += round_up(2 * sizeof(long long));
  k = k < n ? k : n;
  const bool sampled = method == 1;
  l.sample = at;
  at += sampled ? round_up(top_k_tuning::sample_size(n, k) * sizeof(std::uint32_t)) : 0;
  l.candidates = at;
  at += sampled ? round_up(top_k_tuning::candidate_capacity(k) * sizeof(std::uint32_t)) : 0;
  l.temp = at;
  l.temp_bytes = temp;
  at += round_up(temp);
  l.total = at;
  return 0;
}

// The passes of top_k_plan, on the device; each result the plan needs is read back here.
struct device_backend {
  const float* x;  // what is selected from (the corrected residual under error feedback)
  std::size_t n;
  cudaStream_t stream;
  std::uint32_t* hist;
  unsigned long long* counter;
  long long* selected;
  std::uint32_t* sample_keys;
  std::uint32_t* candidates;
  std::uint32_t* out;
  void* temp;
  std::size_t temp_bytes;

  int histogram(top_k_source src, std::size_t count, int shift, int width, std::uint64_t prefix,
                std::uint32_t* host_hist) {
    const std::size_t bins = std::size_t{1} << width;
    COHORT_CUDA_TRY(cudaMemsetAsync(hist, 0, bins * sizeof(std::uint32_t), stream));
    const std::size_t cap = static_cast<std::size_t>(sm_count()) * 2;
    std::size_t blocks = (count + threads_per_block - 1) / threads_per_block;
    blocks = blocks < cap ? blocks : cap;
    const unsigned grid = static_cast<unsigned>(blocks > 0 ? blocks : 1);
    switch (src) {
      case top_k_source::all:
        histogram_kernel<source_all>
            <<<grid, threads_per_block, 0, stream>>>(x, nullptr, count, shift, width, prefix, hist);
        break;
      case top_k_source::candidates:
        histogram_kernel<source_candidates><<<grid, threads_per_block, 0, stream>>>(
            x, candidates, count, shift, width, prefix, hist);
        break;
      case top_k_source::sample:
        histogram_kernel<source_sample><<<grid, threads_per_block, 0, stream>>>(
            nullptr, sample_keys, count, shift, width, prefix, hist);
        break;
    }
    COHORT_CUDA_TRY(static_cast<cudaError_t>(launched()));
    COHORT_CUDA_TRY(cudaMemcpyAsync(host_hist, hist, bins * sizeof(std::uint32_t),
                                    cudaMemcpyDeviceToHost, stream));
    COHORT_CUDA_TRY(cudaStreamSynchronize(stream));
    return 0;
  }

  int sample(std::size_t runs, std::size_t stride, std::uint64_t salt) {
    const std::size_t s = runs * cohort::cuda::detail::top_k_tuning::sample_run;
    sample_kernel<<<grid_for(s), threads_per_block, 0, stream>>>(x, runs, stride, salt,
                                                                 sample_keys);
    return launched();
  }

  int count_at_least(std::uint32_t key, std::size_t* m) {
    COHORT_CUDA_TRY(cudaMemsetAsync(counter, 0, sizeof(unsigned long long), stream));
    count_kernel<<<grid_for(n), threads_per_block, 0, stream>>>(x, n, key, counter);
    COHORT_CUDA_TRY(static_cast<cudaError_t>(launched()));
    unsigned long long c = 0;
    COHORT_CUDA_TRY(cudaMemcpyAsync(&c, counter, sizeof c, cudaMemcpyDeviceToHost, stream));
    COHORT_CUDA_TRY(cudaStreamSynchronize(stream));
    *m = static_cast<std::size_t>(c);
    return 0;
  }

  int select(top_k_source src, std::size_t count, std::uint64_t t, bool to_candidates,
             std::size_t* m) {
    std::uint32_t* dst = to_candidates ? candidates : out;
    std::size_t bytes = temp_bytes;
    const auto items = static_cast<std::int64_t>(count);
    if (src == top_k_source::all) {
      COHORT_CUDA_TRY(cub::DeviceSelect::If(temp, bytes,
                                            thrust::counting_iterator<std::uint32_t>(0), dst,
                                            selected, items, at_least{x, t}, stream));
    } else {
      COHORT_CUDA_TRY(cub::DeviceSelect::If(temp, bytes,
                                            static_cast<const std::uint32_t*>(candidates), dst,
                                            selected, items, at_least{x, t}, stream));
    }
    long long got = 0;
    COHORT_CUDA_TRY(cudaMemcpyAsync(&got, selected, sizeof got, cudaMemcpyDeviceToHost, stream));
    COHORT_CUDA_TRY(cudaStreamSynchronize(stream));
    *m = static_cast<std::size_t>(got);
    return 0;
  }
};

template <class V>
int gather(float* c, bool feedback, const std::uint32_t* idx, void* values, std::size_t m,
           cudaStream_t s) {
  if (m == 0) return 0;
  auto* v = static_cast<typename V::storage*>(values);
  if (feedback)
    gather_kernel<V, true><<<grid_for(m), threads_per_block, 0, s>>>(c, idx, v, m);
  else
    gather_kernel<V, false><<<grid_for(m), threads_per_block, 0, s>>>(c, idx, v, m);
  return launched();
}

}  // namespace

extern "C" {

int cohort_cuda_top_k_workspace(std::size_t n, std::size_t k, int method, std::size_t* bytes) {
  *bytes = 0;
  if (method != 0 && method != 1) return static_cast<int>(cudaErrorInvalidValue);
  layout l;
  if (const int e = plan_layout(n, k, method, l)) return e;
  *bytes = l.total;
  return 0;
}

int cohort_cuda_top_k(int value_dtype, const float* x, float* residual, int first, std::size_t n,
                      std::size_t k, int method, std::uint64_t salt, void* out, void* work,
                      std::size_t work_bytes, std::size_t* m, CUstream_st* stream) {
  *m = 0;
  const int invalid = static_cast<int>(cudaErrorInvalidValue);
  if ((method != 0 && method != 1) || n >= (std::size_t{1} << 32)) return invalid;
  if (value_dtype != f32_type::code && value_dtype != fp16_type::code &&
      value_dtype != bf16_type::code)
    return invalid;
  if (n == 0 || k == 0) return 0;
  if (x == nullptr || out == nullptr || work == nullptr ||
      (reinterpret_cast<std::uintptr_t>(out) & 3u) != 0 ||
      (reinterpret_cast<std::uintptr_t>(work) & 255u) != 0)
    return invalid;
  layout l;
  if (const int e = plan_layout(n, k, method, l)) return e;
  if (work_bytes < l.total) return invalid;

  if (residual != nullptr) {  // error feedback: select from c = g + r, formed in r
    add_residual_kernel<<<grid_for(n), threads_per_block, 0, stream>>>(x, residual, n, first != 0);
    COHORT_CUDA_TRY(static_cast<cudaError_t>(launched()));
  }
  auto* base = static_cast<unsigned char*>(work);
  device_backend b{residual != nullptr ? residual : x,
                   n,
                   stream,
                   reinterpret_cast<std::uint32_t*>(base + l.hist),
                   reinterpret_cast<unsigned long long*>(base + l.counters),
                   reinterpret_cast<long long*>(base + l.counters + sizeof(unsigned long long)),
                   reinterpret_cast<std::uint32_t*>(base + l.sample),
                   reinterpret_cast<std::uint32_t*>(base + l.candidates),
                   static_cast<std::uint32_t*>(out),
                   base + l.temp,
                   l.temp_bytes};
  std::size_t got = 0;
  if (const int e = cohort::cuda::detail::top_k_plan(b, n, k, method == 1, salt, &got)) return e;
  *m = got;
  void* values = static_cast<unsigned char*>(out) + 4 * got;
  const auto* idx = static_cast<const std::uint32_t*>(out);
  float* from =
      residual != nullptr ? residual : const_cast<float*>(x);  // read-only without feedback
  const bool fb = residual != nullptr;
  switch (value_dtype) {
    case f32_type::code:
      return gather<f32_type>(from, fb, idx, values, got, stream);
    case fp16_type::code:
      return gather<fp16_type>(from, fb, idx, values, got, stream);
    default:
      return gather<bf16_type>(from, fb, idx, values, got, stream);
  }
}

}  // extern "C"
