// Shared by the kernels of cohort-cuda: launch geometry, error propagation, 16-byte vectors.
// Compiled by nvcc only; includes no Asio and nothing of cohort but the plain-C ABI, the
// host/device math and the numbers of the built-in reductions.
#pragma once

#include <cuda_runtime.h>

#include <atomic>
#include <cohort/cuda/detail/abi.hpp>
#include <cohort/cuda/detail/math.hpp>
#include <cstddef>
#include <cstdint>
#include <cstring>

namespace cohort::cuda::kernels {

using namespace cohort::cuda::detail;
using cohort::detail::builtin_reduction;

/// Returns the cudaError_t of `expr` as an int when it failed.
#define COHORT_CUDA_TRY(expr)                                                             \
  do {                                                                                    \
    const cudaError_t cohort_cuda_status_ = (expr);                                       \
    if (cohort_cuda_status_ != cudaSuccess) return static_cast<int>(cohort_cuda_status_); \
  } while (0)

/// The error of the last launch (cudaGetLastError clears it, so a later call starts clean).
inline int launched() { return static_cast<int>(cudaGetLastError()); }

inline constexpr int threads_per_block = 256;

/// Multiprocessors of the current device, asked once per device.
inline int sm_count() {
  static std::atomic<int> cache[64] = {};
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess || device < 0) return 80;
  if (device < 64) {
    if (const int c = cache[device].load(std::memory_order_relaxed)) return c;
  }
  int count = 0;
  if (cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device) != cudaSuccess ||
      count <= 0)
    count = 80;
  if (device < 64) cache[device].store(count, std::memory_order_relaxed);
  return count;
}

/// Blocks for a grid-stride loop over `items` work items: enough to fill the device a few
/// times over, never more than there is work.
inline unsigned grid_for(std::size_t items) {
  const std::size_t needed = (items + threads_per_block - 1) / threads_per_block;
  const std::size_t cap = static_cast<std::size_t>(sm_count()) * 8;
  const std::size_t blocks = needed < cap ? needed : cap;
  return static_cast<unsigned>(blocks > 0 ? blocks : 1);
}

inline bool aligned16(const void* p) { return (reinterpret_cast<std::uintptr_t>(p) & 15u) == 0; }

/// 16 bytes as `N` values of `S`.
template <class S>
struct vec16 {
  static constexpr int size = 16 / sizeof(S);
  S v[size];
};

template <class S>
__device__ __forceinline__ vec16<S> load16(const void* p, std::size_t i) {
  const uint4 raw = reinterpret_cast<const uint4*>(p)[i];
  vec16<S> out;
  memcpy(&out, &raw, 16);
  return out;
}

template <class S>
__device__ __forceinline__ void store16(void* p, std::size_t i, const vec16<S>& v) {
  uint4 raw;
  memcpy(&raw, &v, 16);
  reinterpret_cast<uint4*>(p)[i] = raw;
}

__device__ __forceinline__ std::size_t global_thread() {
  return static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ __forceinline__ std::size_t grid_threads() {
  return static_cast<std::size_t>(gridDim.x) * blockDim.x;
}

}  // namespace cohort::cuda::kernels
