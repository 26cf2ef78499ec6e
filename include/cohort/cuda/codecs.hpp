/// @file
/// The device codecs, typed: the codecs of cohort/compress/ on device memory, stream-ordered.
///
/// Every function takes device pointers and a stream, checks its arguments (`errc::
/// invalid_argument`), launches, and returns without waiting, except top-k, whose output
/// length depends on the data (see `top_k_encode`). CUDA failures throw `cohort::error` with
/// `errc::cuda_error` and the CUDA text.
///
/// The encodings are bit for bit the bytes of `compress::fp16`, `compress::bf16`,
/// `compress::int8` (round to nearest or stochastic, same seeds) and `compress::top_k_codec`
/// (same indices, same sample), and the `_feedback` forms leave the residual
/// `compress::error_feedback` would. The host tests check the per-element arithmetic
/// (detail/math.hpp) and the top-k plan (detail/top_k_plan.hpp) without a GPU; the device tests
/// compare the kernels with the host codecs. The reductions are cuda/reduce.hpp.
#pragma once

#include <cohort/compress/codec.hpp>
#include <cohort/compress/quantize.hpp>
#include <cohort/compress/top_k.hpp>
#include <cohort/core/dtype.hpp>
#include <cohort/cuda/detail/abi.hpp>
#include <cohort/cuda/detail/launch.hpp>
#include <cohort/cuda/error.hpp>
#include <cohort/cuda/runtime.hpp>
#include <concepts>
#include <cstddef>
#include <cstdint>

namespace cohort::cuda {

namespace detail {
// The ABI passes cohort's own enumerators as numbers; the kernels read them as these.
static_assert(static_cast<int>(compress::decode_mode::assign) == 0 &&
              static_cast<int>(compress::decode_mode::add) == 1 &&
              static_cast<int>(compress::decode_mode::subtract) == 2);
static_assert(static_cast<int>(compress::selection::exact) == 0 &&
              static_cast<int>(compress::selection::sampled) == 1);
}  // namespace detail

// --- Casts ---------------------------------------------------------------------------------

/// Rounds each float to `W` (fp16 or bf16), to nearest even: the bytes of `compress::fp16/bf16`.
template <class W>
requires std::same_as<W, fp16> || std::same_as<W, bf16>
void cast_encode(const float* in, W* out, std::size_t n, stream_t s) {
  detail::run(
      "cuda::cast_encode", n > 0 && (!in || !out) ? "a null pointer" : nullptr,
      [&] { return cohort_cuda_cast_encode(static_cast<int>(dtype_of<W>), in, out, n, s); },
      nullptr);
}

/// x[i] = / += / -= float(in[i]) as `mode` says.
template <class W>
requires std::same_as<W, fp16> || std::same_as<W, bf16>
void cast_decode(const W* in, float* x, std::size_t n, compress::decode_mode mode, stream_t s) {
  detail::run(
      "cuda::cast_decode", n > 0 && (!in || !x) ? "a null pointer" : nullptr,
      [&] {
        return cohort_cuda_cast_decode(static_cast<int>(dtype_of<W>), in, x, n,
                                       static_cast<int>(mode), s);
      },
      nullptr);
}

/// Error feedback fused with the cast, one pass: c = g + r, out = W(c), r = c - float(out),
/// as `compress::error_feedback` does. `residual` holds n floats; on a tensor's `first` step
/// it holds nothing yet: c = g, and the residual is only written (as the host's first encode).
template <class W>
requires std::same_as<W, fp16> || std::same_as<W, bf16>
void cast_encode_feedback(const float* g, float* residual, W* out, std::size_t n, bool first,
                          stream_t s) {
  detail::run(
      "cuda::cast_encode_feedback", n > 0 && (!g || !residual || !out) ? "a null pointer" : nullptr,
      [&] {
        return cohort_cuda_cast_encode_feedback(static_cast<int>(dtype_of<W>), g, residual, out, n,
                                                first ? 1 : 0, s);
      },
      nullptr);
}

// --- int8 ----------------------------------------------------------------------------------

/// The int8 codec the device implements: `compress::int8_codec<256>` (either rounding).
using int8_codec = compress::int8_codec<COHORT_CUDA_INT8_BLOCK>;

/// Encodes n floats as `codec` would on the host, into `out` (4-byte aligned,
/// `codec.encoded_bytes(n)` bytes); `salt` as the host codec's `encode` takes it.
inline void int8_encode(const int8_codec& codec, const float* in, std::byte* out, std::size_t n,
                        stream_t s, std::uint64_t salt = 0) {
  const char* bad = n > 0 && (!in || !out)     ? "a null pointer"
                    : !detail::aligned(out, 4) ? "the output is not 4-byte aligned"
                                               : nullptr;
  detail::run(
      "cuda::int8_encode", bad,
      [&] {
        return cohort_cuda_int8_encode(in, out, n, codec.stochastic ? 1 : 0,
                                       codec.stochastic ? salt ^ codec.seed : 0, s);
      },
      nullptr);
}

/// x[i] = / += / -= the decoded values of an encoding of n floats (4-byte aligned).
inline void int8_decode(const std::byte* in, float* x, std::size_t n, compress::decode_mode mode,
                        stream_t s) {
  const char* bad = n > 0 && (!in || !x)      ? "a null pointer"
                    : !detail::aligned(in, 4) ? "the encoding is not 4-byte aligned"
                                              : nullptr;
  detail::run(
      "cuda::int8_decode", bad,
      [&] { return cohort_cuda_int8_decode(in, x, n, static_cast<int>(mode), s); }, nullptr);
}

/// Error feedback fused with int8, one pass: c = g + r (g on the `first` step), out =
/// encode(c), r = c - decode(out).
inline void int8_encode_feedback(const int8_codec& codec, const float* g, float* residual,
                                 std::byte* out, std::size_t n, bool first, stream_t s,
                                 std::uint64_t salt = 0) {
  const char* bad = n > 0 && (!g || !residual || !out) ? "a null pointer"
                    : !detail::aligned(out, 4)         ? "the output is not 4-byte aligned"
                                                       : nullptr;
  detail::run(
      "cuda::int8_encode_feedback", bad,
      [&] {
        return cohort_cuda_int8_encode_feedback(g, residual, out, n, first ? 1 : 0,
                                                codec.stochastic ? 1 : 0,
                                                codec.stochastic ? salt ^ codec.seed : 0, s);
      },
      nullptr);
}

// --- Top-k ---------------------------------------------------------------------------------

/// Device workspace bytes `top_k_encode` needs for n floats (asks the current device).
template <class V>
std::size_t top_k_workspace_bytes(const compress::top_k_codec<V>& codec, std::size_t n) {
  std::size_t bytes = 0;
  check(
      cohort_cuda_top_k_workspace(n, codec.max_entries(n), static_cast<int>(codec.method), &bytes),
      "cuda::top_k_workspace_bytes", "sizing the selection");
  return bytes;
}

namespace detail {
template <class V>
std::size_t top_k(const compress::top_k_codec<V>& codec, const float* x, float* residual,
                  bool first, std::size_t n, std::byte* out, void* work, std::size_t work_bytes,
                  stream_t s, std::uint64_t salt) {
  const char* bad = n >= (std::size_t{1} << 32)      ? "tensors hold fewer than 2^32 floats"
                    : n > 0 && (!x || !out || !work) ? "a null pointer"
                    : !aligned(out, 4)               ? "the output is not 4-byte aligned"
                    : !aligned(work, 256)            ? "the workspace is not 256-byte aligned"
                                                     : nullptr;
  std::size_t m = 0;
  run(
      residual ? "cuda::top_k_encode_feedback" : "cuda::top_k_encode", bad,
      [&] {
        return cohort_cuda_top_k(static_cast<int>(dtype_of<V>), x, residual, first ? 1 : 0, n,
                                 codec.max_entries(n), static_cast<int>(codec.method), salt, out,
                                 work, work_bytes, &m, s);
      },
      nullptr);
  return m * compress::top_k_codec<V>::entry_bytes;
}
}  // namespace detail

/// Selects as `codec.encode` does and writes the same payload (m u32 indices, then m values)
/// to `out` (4-byte aligned, `codec.max_encoded_bytes(n)` bytes); returns its length.
/// `work`: `top_k_workspace_bytes(codec, n)` bytes, 256-byte aligned. Waits for the stream a
/// few times (the histograms between passes and the count come back to the host); the values
/// are still being written when it returns.
template <class V>
std::size_t top_k_encode(const compress::top_k_codec<V>& codec, const float* x, std::size_t n,
                         std::byte* out, void* work, std::size_t work_bytes, stream_t s,
                         std::uint64_t salt = 0) {
  return detail::top_k(codec, x, nullptr, false, n, out, work, work_bytes, s, salt);
}

/// Error feedback fused with top-k: c = g + r (g on the `first` step) is formed in
/// `residual`, selected from, sent, and r = c - value where an entry was sent (c elsewhere),
/// as `compress::error_feedback`.
template <class V>
std::size_t top_k_encode_feedback(const compress::top_k_codec<V>& codec, const float* g,
                                  float* residual, bool first, std::size_t n, std::byte* out,
                                  void* work, std::size_t work_bytes, stream_t s,
                                  std::uint64_t salt = 0) {
  if (n > 0 && residual == nullptr) throw_invalid("cuda::top_k_encode_feedback", "a null residual");
  return detail::top_k(codec, g, residual, first, n, out, work, work_bytes, s, salt);
}

}  // namespace cohort::cuda
