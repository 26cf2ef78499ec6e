// cohort-cuda, part 1 of 2: the runtime and interprocess wrappers, the reductions and the
// codecs (top-k, which pulls in CUB, is top_k.cu). Every entry point is declared in
// include/cohort/cuda/detail/abi.hpp; each checks its arguments, launches, and returns the
// cudaError_t of the launch as an int.
#include <cuda.h>  // driver types only: cuPointerGetAttributes is reached through cudart
#include <cuda_runtime.h>

#include <cstring>

#include "codecs.cuh"
#include "common.cuh"
#include "reduce.cuh"

using namespace cohort::cuda::kernels;

static_assert(sizeof(cudaIpcMemHandle_t) == 64 && sizeof(cudaIpcEventHandle_t) == 64,
              "the ABI passes IPC handles as 64 opaque bytes");

namespace {

cudaStream_t as_stream(CUstream_st* s) { return s; }
int invalid() { return static_cast<int>(cudaErrorInvalidValue); }

using pointer_get_attributes_fn = CUresult(CUDAAPI*)(unsigned int, CUpointer_attribute*, void**,
                                                     CUdeviceptr);

// cuPointerGetAttributes from the driver, through cudart (no -lcuda at link time).
pointer_get_attributes_fn pointer_get_attributes(cudaError_t& status) {
  static cudaError_t found_status = cudaSuccess;
  static pointer_get_attributes_fn fn = [] {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
    found_status = cudaGetDriverEntryPointByVersion("cuPointerGetAttributes", &p, 12000,
                                                    cudaEnableDefault, &q);
    if (found_status == cudaSuccess && q != cudaDriverEntryPointSuccess)
      found_status = cudaErrorSymbolNotFound;
    return found_status == cudaSuccess ? reinterpret_cast<pointer_get_attributes_fn>(p) : nullptr;
  }();
  status = found_status;
  return fn;
}

}  // namespace

extern "C" {

// --- Runtime -------------------------------------------------------------------------------

int cohort_cuda_abi_version(void) { return COHORT_CUDA_ABI_VERSION; }
const char* cohort_cuda_error_name(int code) {
  return cudaGetErrorName(static_cast<cudaError_t>(code));
}
const char* cohort_cuda_error_string(int code) {
  return cudaGetErrorString(static_cast<cudaError_t>(code));
}
int cohort_cuda_device_count(int* count) {
  *count = 0;
  const cudaError_t e = cudaGetDeviceCount(count);
  if (e != cudaSuccess) *count = 0;
  return static_cast<int>(e);
}
int cohort_cuda_get_device(int* device) { return static_cast<int>(cudaGetDevice(device)); }
int cohort_cuda_set_device(int device) { return static_cast<int>(cudaSetDevice(device)); }
int cohort_cuda_device_name(int device, char* name, std::size_t capacity) {
  cudaDeviceProp prop;
  COHORT_CUDA_TRY(cudaGetDeviceProperties(&prop, device));
  if (capacity == 0) return invalid();
  std::strncpy(name, prop.name, capacity - 1);
  name[capacity - 1] = '\0';
  return 0;
}
int cohort_cuda_device_synchronize(void) { return static_cast<int>(cudaDeviceSynchronize()); }
int cohort_cuda_malloc(void** ptr, std::size_t bytes) {
  return static_cast<int>(cudaMalloc(ptr, bytes));
}
int cohort_cuda_free(void* ptr) { return static_cast<int>(cudaFree(ptr)); }
int cohort_cuda_memcpy(void* dst, const void* src, std::size_t bytes, CUstream_st* stream) {
  if (bytes == 0) return 0;
  return static_cast<int>(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, as_stream(stream)));
}
int cohort_cuda_memset(void* dst, int value, std::size_t bytes, CUstream_st* stream) {
  if (bytes == 0) return 0;
  return static_cast<int>(cudaMemsetAsync(dst, value, bytes, as_stream(stream)));
}
int cohort_cuda_stream_create(CUstream_st** stream) {
  cudaStream_t s = nullptr;
  const cudaError_t e = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  *stream = s;
  return static_cast<int>(e);
}
int cohort_cuda_stream_destroy(CUstream_st* stream) {
  return static_cast<int>(cudaStreamDestroy(stream));
}
int cohort_cuda_stream_synchronize(CUstream_st* stream) {
  return static_cast<int>(cudaStreamSynchronize(stream));
}
int cohort_cuda_stream_query(CUstream_st* stream) {
  return static_cast<int>(cudaStreamQuery(stream));
}
int cohort_cuda_event_create(void** event, int timing) {
  cudaEvent_t e = nullptr;
  const cudaError_t r =
      cudaEventCreateWithFlags(&e, timing ? cudaEventDefault : cudaEventDisableTiming);
  *event = e;
  return static_cast<int>(r);
}
int cohort_cuda_event_destroy(void* event) {
  return static_cast<int>(cudaEventDestroy(static_cast<cudaEvent_t>(event)));
}
int cohort_cuda_event_record(void* event, CUstream_st* stream) {
  return static_cast<int>(cudaEventRecord(static_cast<cudaEvent_t>(event), stream));
}
int cohort_cuda_event_synchronize(void* event) {
  return static_cast<int>(cudaEventSynchronize(static_cast<cudaEvent_t>(event)));
}
int cohort_cuda_event_elapsed_ms(float* ms, void* start, void* end) {
  return static_cast<int>(
      cudaEventElapsedTime(ms, static_cast<cudaEvent_t>(start), static_cast<cudaEvent_t>(end)));
}
int cohort_cuda_stream_wait_event(CUstream_st* stream, void* event) {
  return static_cast<int>(cudaStreamWaitEvent(stream, static_cast<cudaEvent_t>(event), 0));
}

// --- Interprocess ---------------------------------------------------------------------------

int cohort_cuda_pointer_get_info(const void* ptr, cohort_cuda_pointer_info* info) {
  *info = {};
  cudaError_t status = cudaSuccess;
  const pointer_get_attributes_fn get = pointer_get_attributes(status);
  if (get == nullptr) return static_cast<int>(status);
  unsigned long long id = 0;
  CUdeviceptr base = 0;
  std::size_t size = 0;
  int device = -1;
  int capable = 0;  // the driver writes a boolean into the low byte
  CUpointer_attribute attrs[] = {
      CU_POINTER_ATTRIBUTE_BUFFER_ID, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR,
      CU_POINTER_ATTRIBUTE_RANGE_SIZE, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
      CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE};
  void* data[] = {&id, &base, &size, &device, &capable};
  if (get(5, attrs, data, reinterpret_cast<CUdeviceptr>(ptr)) != CUDA_SUCCESS)
    return invalid();  // not a pointer the driver knows (host memory, freed memory...)
  if (base == 0) return invalid();
  info->buffer_id = id;
  info->base = static_cast<std::uintptr_t>(base);
  info->size = size;
  info->device = device;
  info->ipc_capable = (capable & 0xFF) != 0 ? 1 : 0;
  return 0;
}

int cohort_cuda_ipc_get_mem_handle(void* handle64, const void* base) {
  cudaIpcMemHandle_t h;
  COHORT_CUDA_TRY(cudaIpcGetMemHandle(&h, const_cast<void*>(base)));
  std::memcpy(handle64, &h, sizeof h);
  return 0;
}

int cohort_cuda_ipc_open_mem_handle(void** base, const void* handle64) {
  cudaIpcMemHandle_t h;
  std::memcpy(&h, handle64, sizeof h);
  *base = nullptr;
  return static_cast<int>(cudaIpcOpenMemHandle(base, h, cudaIpcMemLazyEnablePeerAccess));
}

int cohort_cuda_ipc_close_mem_handle(void* base) {
  return static_cast<int>(cudaIpcCloseMemHandle(base));
}

int cohort_cuda_ipc_event_create(void** event, void* handle64) {
  cudaEvent_t e = nullptr;
  *event = nullptr;
  COHORT_CUDA_TRY(cudaEventCreateWithFlags(&e, cudaEventDisableTiming | cudaEventInterprocess));
  cudaIpcEventHandle_t h;
  const cudaError_t r = cudaIpcGetEventHandle(&h, e);
  if (r != cudaSuccess) {
    cudaEventDestroy(e);
    return static_cast<int>(r);
  }
  std::memcpy(handle64, &h, sizeof h);
  *event = e;
  return 0;
}

int cohort_cuda_ipc_event_open(void** event, const void* handle64) {
  cudaIpcEventHandle_t h;
  std::memcpy(&h, handle64, sizeof h);
  cudaEvent_t e = nullptr;
  const cudaError_t r = cudaIpcOpenEventHandle(&e, h);
  *event = e;
  return static_cast<int>(r);
}

// --- Reductions -----------------------------------------------------------------------------

int cohort_cuda_reduce(int dtype, int op, const void* const* src, int nsrc, void* const* dst,
                       int ndst, std::size_t count, int ranks, CUstream_st* stream) {
  if (nsrc < 1 || nsrc > COHORT_CUDA_MAX_OPERANDS || ndst < 1 || ndst > COHORT_CUDA_MAX_OPERANDS ||
      op < 1 || op > static_cast<int>(cohort::detail::last_builtin_reduction) || ranks < 0)
    return invalid();
  if (count == 0) return 0;
  reduce_args a{};
  for (int q = 0; q < nsrc; ++q) {
    if (src[q] == nullptr) return invalid();
    a.src[q] = src[q];
  }
  for (int q = 0; q < ndst; ++q) {
    if (dst[q] == nullptr) return invalid();
    a.dst[q] = dst[q];
  }
  a.nsrc = nsrc;
  a.ndst = ndst;
  a.count = count;
  a.ranks = ranks;
  switch (dtype) {
    case f32_type::code:
      return launch_reduce_op<f32_type>(op, a, stream);
    case f64_type::code:
      return launch_reduce_op<f64_type>(op, a, stream);
    case fp16_type::code:
      return launch_reduce_op<fp16_type>(op, a, stream);
    case bf16_type::code:
      return launch_reduce_op<bf16_type>(op, a, stream);
  }
  return static_cast<int>(cudaErrorNotSupported);
}

}  // extern "C"

// --- Codecs ---------------------------------------------------------------------------------

namespace {

template <class W>
int cast_encode(const float* in, void* out, std::size_t n, cudaStream_t s) {
  auto* o = static_cast<std::uint16_t*>(out);
  const bool vec = aligned16(in) && aligned16(out);
  const unsigned grid = grid_for(vec ? n / 8 + n % 8 : n);
  if (vec)
    cast_encode_kernel<W, true><<<grid, threads_per_block, 0, s>>>(in, o, n);
  else
    cast_encode_kernel<W, false><<<grid, threads_per_block, 0, s>>>(in, o, n);
  return launched();
}

template <class W, int Mode>
int cast_decode_mode(const void* in, float* x, std::size_t n, cudaStream_t s) {
  const auto* i = static_cast<const std::uint16_t*>(in);
  const bool vec = aligned16(in) && aligned16(x);
  const unsigned grid = grid_for(vec ? n / 8 + n % 8 : n);
  if (vec)
    cast_decode_kernel<W, Mode, true><<<grid, threads_per_block, 0, s>>>(i, x, n);
  else
    cast_decode_kernel<W, Mode, false><<<grid, threads_per_block, 0, s>>>(i, x, n);
  return launched();
}

template <class W>
int cast_decode(const void* in, float* x, std::size_t n, int mode, cudaStream_t s) {
  switch (mode) {
    case 0:
      return cast_decode_mode<W, 0>(in, x, n, s);
    case 1:
      return cast_decode_mode<W, 1>(in, x, n, s);
    case 2:
      return cast_decode_mode<W, 2>(in, x, n, s);
  }
  return invalid();
}

template <class W>
int cast_feedback(const float* g, float* r, void* out, std::size_t n, bool first, cudaStream_t s) {
  auto* o = static_cast<std::uint16_t*>(out);
  const bool vec = aligned16(g) && aligned16(r) && aligned16(out);
  const unsigned grid = grid_for(vec ? n / 8 + n % 8 : n);
  if (vec)
    cast_feedback_kernel<W, true><<<grid, threads_per_block, 0, s>>>(g, r, o, n, first);
  else
    cast_feedback_kernel<W, false><<<grid, threads_per_block, 0, s>>>(g, r, o, n, first);
  return launched();
}

template <bool Feedback>
int int8_encode(const float* x, float* r, void* out, std::size_t n, bool first, int stochastic,
                std::uint64_t salt, cudaStream_t s) {
  if ((reinterpret_cast<std::uintptr_t>(out) & 3u) != 0) return invalid();
  const std::size_t blocks = (n + int8_block - 1) / int8_block;
  const std::size_t cap = static_cast<std::size_t>(sm_count()) * 16;
  const auto grid = static_cast<unsigned>(blocks < cap ? blocks : cap);
  auto* o = static_cast<unsigned char*>(out);
  if (stochastic)
    int8_encode_kernel<true, Feedback><<<grid, threads_per_block, 0, s>>>(x, r, o, n, salt, first);
  else
    int8_encode_kernel<false, Feedback><<<grid, threads_per_block, 0, s>>>(x, r, o, n, salt, first);
  return launched();
}

}  // namespace

extern "C" {

int cohort_cuda_cast_encode(int wire, const float* in, void* out, std::size_t n,
                            CUstream_st* stream) {
  if (n == 0) return 0;
  if (in == nullptr || out == nullptr) return invalid();
  if (wire == fp16_type::code) return cast_encode<fp16_type>(in, out, n, stream);
  if (wire == bf16_type::code) return cast_encode<bf16_type>(in, out, n, stream);
  return invalid();
}

int cohort_cuda_cast_decode(int wire, const void* in, float* x, std::size_t n, int mode,
                            CUstream_st* stream) {
  if (n == 0) return 0;
  if (in == nullptr || x == nullptr) return invalid();
  if (wire == fp16_type::code) return cast_decode<fp16_type>(in, x, n, mode, stream);
  if (wire == bf16_type::code) return cast_decode<bf16_type>(in, x, n, mode, stream);
  return invalid();
}

int cohort_cuda_cast_encode_feedback(int wire, const float* g, float* residual, void* out,
                                     std::size_t n, int first, CUstream_st* stream) {
  if (n == 0) return 0;
  if (g == nullptr || residual == nullptr || out == nullptr) return invalid();
  if (wire == fp16_type::code)
    return cast_feedback<fp16_type>(g, residual, out, n, first != 0, stream);
  if (wire == bf16_type::code)
    return cast_feedback<bf16_type>(g, residual, out, n, first != 0, stream);
  return invalid();
}

int cohort_cuda_int8_encode(const float* in, void* out, std::size_t n, int stochastic,
                            std::uint64_t salt, CUstream_st* stream) {
  if (n == 0) return 0;
  if (in == nullptr || out == nullptr) return invalid();
  return int8_encode<false>(in, nullptr, out, n, false, stochastic, salt, stream);
}

int cohort_cuda_int8_encode_feedback(const float* g, float* residual, void* out, std::size_t n,
                                     int first, int stochastic, std::uint64_t salt,
                                     CUstream_st* stream) {
  if (n == 0) return 0;
  if (g == nullptr || residual == nullptr || out == nullptr) return invalid();
  return int8_encode<true>(g, residual, out, n, first != 0, stochastic, salt, stream);
}

int cohort_cuda_int8_decode(const void* in, float* x, std::size_t n, int mode,
                            CUstream_st* stream) {
  if (n == 0) return 0;
  if (in == nullptr || x == nullptr || (reinterpret_cast<std::uintptr_t>(in) & 3u) != 0)
    return invalid();
  const auto* i = static_cast<const unsigned char*>(in);
  const unsigned grid = grid_for(n);
  switch (mode) {
    case 0:
      int8_decode_kernel<0><<<grid, threads_per_block, 0, stream>>>(i, x, n);
      break;
    case 1:
      int8_decode_kernel<1><<<grid, threads_per_block, 0, stream>>>(i, x, n);
      break;
    case 2:
      int8_decode_kernel<2><<<grid, threads_per_block, 0, stream>>>(i, x, n);
      break;
    default:
      return invalid();
  }
  return launched();
}

}  // extern "C"
