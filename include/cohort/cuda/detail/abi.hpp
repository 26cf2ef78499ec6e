/// @file
/// The functions of the cohort-cuda library (built by nvcc from cuda/), declared as plain C.
///
/// This is the only door between host headers and the kernels: no template, no CUDA header, no
/// CUDA type except the opaque `CUstream_st*` (what `cudaStream_t` is), so a header that uses
/// these compiles with any C++ compiler and without the toolkit; only the program that calls
/// them links `cohort_cuda_dep`. Every function returns a `cudaError_t` value as an `int`
/// (0 = success); `cohort_cuda_error_name/string` turn it into text. Enumerations travel as
/// the numbers of cohort's own enums: `dtype`, `detail::builtin_reduction`
/// (core/detail/reduction_tags.hpp), `compress::decode_mode`, `compress::selection`. Kernels run on the calling thread's current device, in stream order;
/// they never synchronize unless a comment says so.
#pragma once

#include <cstddef>
#include <cstdint>

struct CUstream_st;  // cudaStream_t is `CUstream_st*`; nullptr is the legacy default stream

/// Bumped whenever a declaration below changes meaning; the library reports its own.
#define COHORT_CUDA_ABI_VERSION 2

/// The most sources and destinations one `cohort_cuda_reduce` takes (and so the most ranks of
/// a CUDA IPC communicator).
#define COHORT_CUDA_MAX_OPERANDS 32

/// Elements per block of the int8 codec on the device (`compress::int8_codec<256>`).
#define COHORT_CUDA_INT8_BLOCK 256

extern "C" {

/// Where a device pointer lives: the allocation that contains it.
struct cohort_cuda_pointer_info {
  std::uint64_t buffer_id;  ///< Unique per allocation in this process (never reused).
  std::uintptr_t base;      ///< Start of the allocation.
  std::size_t size;         ///< Bytes in the allocation.
  int device;               ///< Device ordinal it was allocated on.
  int ipc_capable;          ///< 1 when cudaIpcGetMemHandle accepts it (plain cudaMalloc).
};

// --- Runtime -------------------------------------------------------------------------------
int cohort_cuda_abi_version(void);
const char* cohort_cuda_error_name(int code);
const char* cohort_cuda_error_string(int code);
int cohort_cuda_device_count(int* count);
int cohort_cuda_get_device(int* device);
int cohort_cuda_set_device(int device);
int cohort_cuda_device_name(int device, char* name, std::size_t capacity);
int cohort_cuda_device_synchronize(void);
int cohort_cuda_malloc(void** ptr, std::size_t bytes);
int cohort_cuda_free(void* ptr);
/// Asynchronous copy in any direction (cudaMemcpyDefault).
int cohort_cuda_memcpy(void* dst, const void* src, std::size_t bytes, CUstream_st* stream);
int cohort_cuda_memset(void* dst, int value, std::size_t bytes, CUstream_st* stream);
int cohort_cuda_stream_create(CUstream_st** stream);
int cohort_cuda_stream_destroy(CUstream_st* stream);
int cohort_cuda_stream_synchronize(CUstream_st* stream);
/// 0 when the stream is idle, cudaErrorNotReady (600) while work is pending.
int cohort_cuda_stream_query(CUstream_st* stream);
/// An event; `timing` 0 makes it cheaper (cudaEventDisableTiming).
int cohort_cuda_event_create(void** event, int timing);
int cohort_cuda_event_destroy(void* event);
int cohort_cuda_event_record(void* event, CUstream_st* stream);
int cohort_cuda_event_synchronize(void* event);
int cohort_cuda_event_elapsed_ms(float* ms, void* start, void* end);
int cohort_cuda_stream_wait_event(CUstream_st* stream, void* event);

// --- Interprocess ---------------------------------------------------------------------------
/// Handles are 64 opaque bytes (cudaIpcMemHandle_t, cudaIpcEventHandle_t).
int cohort_cuda_pointer_get_info(const void* ptr, cohort_cuda_pointer_info* info);
int cohort_cuda_ipc_get_mem_handle(void* handle64, const void* base);
/// Maps a peer's allocation (with lazy peer access when it lives on another device).
int cohort_cuda_ipc_open_mem_handle(void** base, const void* handle64);
int cohort_cuda_ipc_close_mem_handle(void* base);
/// An interprocess event (no timing) and its handle.
int cohort_cuda_ipc_event_create(void** event, void* handle64);
int cohort_cuda_ipc_event_open(void** event, const void* handle64);

// --- Reductions -----------------------------------------------------------------------------
/// For i < count: v = src[0][i] op src[1][i] op ... op src[nsrc-1][i], folded left in this
/// order in the accumulator type (fp32 for fp16/bf16), then `op.finalize(v, ranks)` when
/// ranks > 0 (avg divides), rounded once and written to every dst[j][i]. 1 <= nsrc, ndst <=
/// COHORT_CUDA_MAX_OPERANDS; dtype f32, f64, fp16 or bf16; op 1..5 (sum, prod, min, max,
/// avg). A destination may be a source (each element is read before it is written).
/// 16-byte vector accesses when every pointer is 16-byte aligned, scalar otherwise.
int cohort_cuda_reduce(int dtype, int op, const void* const* src, int nsrc, void* const* dst,
                       int ndst, std::size_t count, int ranks, CUstream_st* stream);

// --- Codecs (the bytes of the host codecs in cohort/compress/) -------------------------------
/// out[i] = round-to-nearest-even(in[i]) as fp16 (wire 6) or bf16 (wire 7).
int cohort_cuda_cast_encode(int wire, const float* in, void* out, std::size_t n,
                            CUstream_st* stream);
/// x[i] =, +=, -= (mode 0, 1, 2) the exact float value of in[i].
int cohort_cuda_cast_decode(int wire, const void* in, float* x, std::size_t n, int mode,
                            CUstream_st* stream);
/// Error feedback fused with the cast: c = g + r (c = g when `first`: the residual holds
/// nothing yet and is only written); out = cast(c); r = c - float(out).
int cohort_cuda_cast_encode_feedback(int wire, const float* g, float* residual, void* out,
                                     std::size_t n, int first, CUstream_st* stream);
/// int8 with an fp32 scale per COHORT_CUDA_INT8_BLOCK floats; `out` (4-byte aligned) takes
/// n + 4 * ceil(n / 256) bytes. Round to nearest, or stochastic rounding seeded by `salt`.
int cohort_cuda_int8_encode(const float* in, void* out, std::size_t n, int stochastic,
                            std::uint64_t salt, CUstream_st* stream);
int cohort_cuda_int8_decode(const void* in, float* x, std::size_t n, int mode, CUstream_st* stream);
/// Error feedback fused with int8: c = g + r (g when `first`); out = int8(c);
/// r = c - decode(out).
int cohort_cuda_int8_encode_feedback(const float* g, float* residual, void* out, std::size_t n,
                                     int first, int stochastic, std::uint64_t salt,
                                     CUstream_st* stream);
/// Device workspace `cohort_cuda_top_k` needs (queries the current device).
int cohort_cuda_top_k_workspace(std::size_t n, std::size_t k, int method, std::size_t* bytes);
/// Top-k by magnitude (method 0 exact, 1 sampled): writes m u32 indices (ascending) then m
/// values of `value_dtype` (f32, fp16 or bf16) to `out` (4-byte aligned) and m to `*m`.
/// With `residual` non-null, error feedback: x is the gradient g, c = g + r (g when `first`)
/// is formed in r, selected from, and r = c - value at the chosen entries. Synchronizes the
/// stream (m is data-dependent; histograms are read back between passes).
int cohort_cuda_top_k(int value_dtype, const float* x, float* residual, int first, std::size_t n,
                      std::size_t k, int method, std::uint64_t salt, void* out, void* work,
                      std::size_t work_bytes, std::size_t* m, CUstream_st* stream);

}  // extern "C"
