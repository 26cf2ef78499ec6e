// The codecs on the device, byte for byte those of cohort/compress/: fp16/bf16 casts, int8 with
// an fp32 scale per block of 256, and their error-feedback forms fused into one pass (the
// residual is read, corrected, encoded and rewritten without another trip through memory).
#pragma once

#include "common.cuh"

namespace cohort::cuda::kernels {

// --- Casts: 8 floats (two 16-byte loads) to 8 halves (one 16-byte store) per vector step ----

template <class W, bool Vec>
__global__ void __launch_bounds__(threads_per_block)
    cast_encode_kernel(const float* in, std::uint16_t* out, std::size_t n) {
  const std::size_t start = global_thread(), step = grid_threads();
  std::size_t done = 0;
  if constexpr (Vec) {
    const std::size_t nv = n / 8;
    for (std::size_t i = start; i < nv; i += step) {
      const float4 a = reinterpret_cast<const float4*>(in)[2 * i];
      const float4 b = reinterpret_cast<const float4*>(in)[2 * i + 1];
      vec16<std::uint16_t> y;
      y.v[0] = W::narrow(a.x);
      y.v[1] = W::narrow(a.y);
      y.v[2] = W::narrow(a.z);
      y.v[3] = W::narrow(a.w);
      y.v[4] = W::narrow(b.x);
      y.v[5] = W::narrow(b.y);
      y.v[6] = W::narrow(b.z);
      y.v[7] = W::narrow(b.w);
      store16(out, i, y);
    }
    done = nv * 8;
  }
  for (std::size_t i = done + start; i < n; i += step) out[i] = W::narrow(in[i]);
}

template <class W, int Mode, bool Vec>
__global__ void __launch_bounds__(threads_per_block)
    cast_decode_kernel(const std::uint16_t* in, float* x, std::size_t n) {
  const std::size_t start = global_thread(), step = grid_threads();
  std::size_t done = 0;
  if constexpr (Vec) {
    const std::size_t nv = n / 8;
    for (std::size_t i = start; i < nv; i += step) {
      const vec16<std::uint16_t> h = load16<std::uint16_t>(in, i);
      float4 a = make_float4(0.f, 0.f, 0.f, 0.f), b = a;
      if constexpr (Mode != 0) {
        a = reinterpret_cast<const float4*>(x)[2 * i];
        b = reinterpret_cast<const float4*>(x)[2 * i + 1];
      }
      a.x = apply_mode<Mode>(a.x, W::widen(h.v[0]));
      a.y = apply_mode<Mode>(a.y, W::widen(h.v[1]));
      a.z = apply_mode<Mode>(a.z, W::widen(h.v[2]));
      a.w = apply_mode<Mode>(a.w, W::widen(h.v[3]));
      b.x = apply_mode<Mode>(b.x, W::widen(h.v[4]));
      b.y = apply_mode<Mode>(b.y, W::widen(h.v[5]));
      b.z = apply_mode<Mode>(b.z, W::widen(h.v[6]));
      b.w = apply_mode<Mode>(b.w, W::widen(h.v[7]));
      reinterpret_cast<float4*>(x)[2 * i] = a;
      reinterpret_cast<float4*>(x)[2 * i + 1] = b;
    }
    done = nv * 8;
  }
  for (std::size_t i = done + start; i < n; i += step) {
    const float prev = Mode != 0 ? x[i] : 0.0f;
    x[i] = apply_mode<Mode>(prev, W::widen(in[i]));
  }
}

// c = g + r (g on the first call); w = cast(c); r = c - float(w): the host's
// error_feedback<cast_codec> step.
template <class W>
__device__ __forceinline__ std::uint16_t feedback_cast(float g, float& r, bool first) {
  const float c = first ? g : add_rn(g, r);
  const std::uint16_t w = W::narrow(c);
  r = sub_rn(c, W::widen(w));
  return w;
}

template <class W, bool Vec>
__global__ void __launch_bounds__(threads_per_block)
    cast_feedback_kernel(const float* g, float* r, std::uint16_t* out, std::size_t n, bool first) {
  const std::size_t start = global_thread(), step = grid_threads();
  std::size_t done = 0;
  if constexpr (Vec) {
    const std::size_t nv = n / 8;
    for (std::size_t i = start; i < nv; i += step) {
      const float4 ga = reinterpret_cast<const float4*>(g)[2 * i];
      const float4 gb = reinterpret_cast<const float4*>(g)[2 * i + 1];
      float4 ra = make_float4(0.f, 0.f, 0.f, 0.f), rb = ra;  // not read on the first call
      if (!first) {
        ra = reinterpret_cast<const float4*>(r)[2 * i];
        rb = reinterpret_cast<const float4*>(r)[2 * i + 1];
      }
      vec16<std::uint16_t> y;
      y.v[0] = feedback_cast<W>(ga.x, ra.x, first);
      y.v[1] = feedback_cast<W>(ga.y, ra.y, first);
      y.v[2] = feedback_cast<W>(ga.z, ra.z, first);
      y.v[3] = feedback_cast<W>(ga.w, ra.w, first);
      y.v[4] = feedback_cast<W>(gb.x, rb.x, first);
      y.v[5] = feedback_cast<W>(gb.y, rb.y, first);
      y.v[6] = feedback_cast<W>(gb.z, rb.z, first);
      y.v[7] = feedback_cast<W>(gb.w, rb.w, first);
      store16(out, i, y);
      reinterpret_cast<float4*>(r)[2 * i] = ra;
      reinterpret_cast<float4*>(r)[2 * i + 1] = rb;
    }
    done = nv * 8;
  }
  for (std::size_t i = done + start; i < n; i += step) {
    float ri = first ? 0.0f : r[i];
    out[i] = feedback_cast<W>(g[i], ri, first);
    r[i] = ri;
  }
}

// --- int8: one thread block per quantization block of 256 floats ----------------------------

inline constexpr std::uint32_t int8_block = COHORT_CUDA_INT8_BLOCK;
static_assert(int8_block == threads_per_block, "one thread per element of a block");

// Max and XOR of one value per thread over the thread block; every thread gets both.
__device__ __forceinline__ void block_max_xor(std::uint32_t& amax, std::uint32_t& fold) {
  __shared__ std::uint32_t s_max[threads_per_block / 32], s_xor[threads_per_block / 32];
  for (int o = 16; o > 0; o >>= 1) {
    amax = max(amax, __shfl_xor_sync(0xFFFF'FFFFu, amax, o));
    fold ^= __shfl_xor_sync(0xFFFF'FFFFu, fold, o);
  }
  const unsigned warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) {
    s_max[warp] = amax;
    s_xor[warp] = fold;
  }
  __syncthreads();
  amax = 0;
  fold = 0;
  for (unsigned w = 0; w < threads_per_block / 32; ++w) {
    amax = max(amax, s_max[w]);
    fold ^= s_xor[w];
  }
  __syncthreads();  // the shared words are reused by the next block of a grid-stride loop
}

// Encodes blocks blockIdx.x, blockIdx.x + gridDim.x, ...; with Feedback, the input is
// c = g + r (g on the first call) and r becomes c - decode(encoding).
template <bool Stochastic, bool Feedback>
__global__ void __launch_bounds__(threads_per_block)
    int8_encode_kernel(const float* x, float* r, unsigned char* out, std::size_t n,
                       std::uint64_t salt, bool first) {
  const std::size_t blocks = (n + int8_block - 1) / int8_block;
  const std::uint32_t t = threadIdx.x;
  for (std::size_t b = blockIdx.x; b < blocks; b += gridDim.x) {
    const std::size_t off = b * int8_block + t;
    const std::uint32_t len = static_cast<std::uint32_t>(
        n - b * int8_block < int8_block ? n - b * int8_block : int8_block);
    const bool have = t < len;
    float c = 0.0f;
    if (have) {
      if constexpr (Feedback)
        c = first ? x[off] : add_rn(x[off], r[off]);
      else
        c = x[off];
    }
    std::uint32_t amax = have ? (f2u(c) & 0x7FFF'FFFFu) : 0u;
    std::uint32_t fold = have ? f2u(c) : 0u;
    block_max_xor(amax, fold);
    const quant_params p = quant_prepare(amax);
    std::int8_t q = 0;
    if (p.live) {
      if constexpr (Stochastic)
        q = quant_stochastic(c, p, quant_seed(salt, b, fold, len), t);
      else
        q = quant_nearest(c, p);
    }
    unsigned char* rec = out + b * int8_record_bytes(int8_block);
    if (t == 0) *reinterpret_cast<float*>(rec) = p.scale;
    if (have) {
      rec[4 + t] = static_cast<unsigned char>(q);
      if constexpr (Feedback) r[off] = sub_rn(c, dequant(q, p.scale));
    }
  }
}

template <int Mode>
__global__ void __launch_bounds__(threads_per_block)
    int8_decode_kernel(const unsigned char* in, float* x, std::size_t n) {
  const std::size_t start = global_thread(), step = grid_threads();
  for (std::size_t i = start; i < n; i += step) {
    const unsigned char* rec = in + (i / int8_block) * int8_record_bytes(int8_block);
    const float scale = *reinterpret_cast<const float*>(rec);
    const auto q = static_cast<std::int8_t>(rec[4 + i % int8_block]);
    const float prev = Mode != 0 ? x[i] : 0.0f;
    x[i] = apply_mode<Mode>(prev, dequant(q, scale));
  }
}

}  // namespace cohort::cuda::kernels
