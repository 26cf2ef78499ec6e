// The device kernels' arithmetic, run on the CPU: per element, these loops call exactly the
// functions of cohort/cuda/detail/math.hpp that the kernels call, in the kernels' order. The
// host tests compare them with cohort's host code; the device tests compare the kernels with
// the host code directly. Plus reproducible test data.
#pragma once

#include <algorithm>
#include <bit>
#include <cmath>
#include <cohort/core/dtype.hpp>
#include <cohort/cuda/detail/math.hpp>
#include <cohort/cuda/detail/top_k_plan.hpp>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <vector>

namespace cohort::cuda::test {

namespace m = cohort::cuda::detail;

inline std::uint64_t splitmix(std::uint64_t x) { return m::mix64(x); }

/// A uniform double in [0, 1) from (seed, i).
inline double uniform(std::uint64_t seed, std::uint64_t i) {
  return static_cast<double>(splitmix(seed * 0x100000001b3ull + i) >> 11) * 0x1p-53;
}

/// Gradient-like floats: normal-ish, magnitudes varying per stretch of 300 over six decades,
/// some exact zeros, some ties (values rounded to a coarse grid), a few subnormals.
inline std::vector<float> gradient(std::uint64_t seed, std::size_t n) {
  std::vector<float> g(n);
  for (std::size_t i = 0; i < n; ++i) {
    const double u1 = uniform(seed, 2 * i), u2 = uniform(seed, 2 * i + 1);
    const double normal = std::sqrt(-2.0 * std::log(1.0 - u1)) * std::cos(6.283185307179586 * u2);
    const double scale = std::pow(10.0, -5.0 + 6.0 * uniform(seed ^ 0xABCDull, i / 300));
    const double kind = uniform(seed ^ 0x5151ull, i);
    float v = static_cast<float>(normal * scale);
    if (kind < 0.02)
      v = 0.0f;
    else if (kind < 0.04)
      v = std::round(v * 8.0f) / 8.0f;  // ties for top-k
    else if (kind < 0.045)
      v = std::bit_cast<float>(static_cast<std::uint32_t>(splitmix(i) % 0x7FFFFF));
    g[i] = v;
  }
  return g;
}

/// True when a and b hold the same bits, or are both NaN (payloads may differ: the device
/// makes arithmetic NaNs canonical where x86 keeps an operand's payload).
inline bool same_or_nan(float a, float b) {
  return std::bit_cast<std::uint32_t>(a) == std::bit_cast<std::uint32_t>(b) ||
         (std::isnan(a) && std::isnan(b));
}
inline bool same_or_nan(double a, double b) {
  return std::bit_cast<std::uint64_t>(a) == std::bit_cast<std::uint64_t>(b) ||
         (std::isnan(a) && std::isnan(b));
}
inline bool same_or_nan(cohort::fp16 a, cohort::fp16 b) {
  return a.bits == b.bits || (std::isnan(float(a)) && std::isnan(float(b)));
}
inline bool same_or_nan(cohort::bf16 a, cohort::bf16 b) {
  return a.bits == b.bits || (std::isnan(float(a)) && std::isnan(float(b)));
}

// --- The kernels' loops ---------------------------------------------------------------------

/// cohort_cuda_reduce for element type Type (f32_type...) and op Op, on the CPU.
template <class Type, cohort::detail::builtin_reduction Op>
void fold(std::span<const typename Type::storage* const> src,
          std::span<typename Type::storage* const> dst, std::size_t n, int ranks) {
  for (std::size_t i = 0; i < n; ++i) {
    typename Type::acc acc = Type::widen(src[0][i]);
    for (std::size_t q = 1; q < src.size(); ++q)
      acc = m::reduce_op<Op>::apply(acc, Type::widen(src[q][i]));
    if (ranks > 0) acc = m::reduce_op<Op>::finalize(acc, ranks);
    const auto y = Type::narrow(acc);
    for (auto* d : dst) d[i] = y;
  }
}

/// int8_encode_kernel on the CPU: per block, the max and XOR reductions, then per element.
/// With `residual`, error feedback: c = g + r (g when `first`), and r = c - decode afterwards.
inline void int8_encode(const float* x, float* residual, bool first, std::byte* out, std::size_t n,
                        bool stochastic, std::uint64_t salt) {
  constexpr std::uint32_t B = COHORT_CUDA_INT8_BLOCK;
  for (std::size_t b = 0; b * B < n; ++b) {
    const auto len = static_cast<std::uint32_t>(std::min<std::size_t>(B, n - b * B));
    std::vector<float> c(len);
    std::uint32_t amax = 0, fold = 0;
    for (std::uint32_t t = 0; t < len; ++t) {
      const std::size_t i = b * B + t;
      c[t] = residual && !first ? m::add_rn(x[i], residual[i]) : x[i];
      amax = std::max(amax, m::f2u(c[t]) & 0x7FFF'FFFFu);
      fold ^= m::f2u(c[t]);
    }
    const m::quant_params p = m::quant_prepare(amax);
    std::byte* rec = out + b * m::int8_record_bytes(B);
    std::memcpy(rec, &p.scale, 4);
    for (std::uint32_t t = 0; t < len; ++t) {
      std::int8_t q = 0;
      if (p.live)
        q = stochastic ? m::quant_stochastic(c[t], p, m::quant_seed(salt, b, fold, len), t)
                       : m::quant_nearest(c[t], p);
      rec[4 + t] = static_cast<std::byte>(q);
      if (residual) residual[b * B + t] = m::sub_rn(c[t], m::dequant(q, p.scale));
    }
  }
}

/// int8_decode_kernel on the CPU.
template <int Mode>
void int8_decode(const std::byte* in, float* x, std::size_t n) {
  constexpr std::uint32_t B = COHORT_CUDA_INT8_BLOCK;
  for (std::size_t i = 0; i < n; ++i) {
    const std::byte* rec = in + (i / B) * m::int8_record_bytes(B);
    float scale;
    std::memcpy(&scale, rec, 4);
    const auto q = static_cast<std::int8_t>(rec[4 + i % B]);
    x[i] = m::apply_mode<Mode>(Mode != 0 ? x[i] : 0.0f, m::dequant(q, scale));
  }
}

/// The passes of top_k_plan as plain loops (the device backend, on the CPU).
struct cpu_top_k {
  const float* x;
  std::size_t n;
  std::vector<std::uint32_t> sample_keys, candidates, out;

  std::uint64_t composite(m::top_k_source src, std::size_t i) const {
    if (src == m::top_k_source::all) return m::composite_key(x[i], static_cast<std::uint32_t>(i));
    if (src == m::top_k_source::candidates)
      return m::composite_key(x[candidates[i]], candidates[i]);
    return static_cast<std::uint64_t>(sample_keys[i]) << 32;
  }
  int histogram(m::top_k_source src, std::size_t count, int shift, int width, std::uint64_t prefix,
                std::uint32_t* hist) {
    const std::uint32_t bins = 1u << width;
    std::fill_n(hist, bins, 0u);
    for (std::size_t i = 0; i < count; ++i) {
      const std::uint64_t c = composite(src, i);
      if ((c >> (shift + width)) == prefix) ++hist[(c >> shift) & (bins - 1)];
    }
    return 0;
  }
  int sample(std::size_t runs, std::size_t stride, std::uint64_t salt) {
    constexpr std::size_t run = m::top_k_tuning::sample_run;
    sample_keys.resize(runs * run);
    for (std::size_t j = 0; j < runs; ++j) {
      const std::size_t at = j * stride + m::mix64(salt + j) % (stride - run + 1);
      for (std::size_t i = 0; i < run; ++i) sample_keys[j * run + i] = m::magnitude_key(x[at + i]);
    }
    return 0;
  }
  int count_at_least(std::uint32_t key, std::size_t* c) {
    *c = 0;
    for (std::size_t i = 0; i < n; ++i) *c += m::magnitude_key(x[i]) >= key ? 1 : 0;
    return 0;
  }
  int select(m::top_k_source src, std::size_t count, std::uint64_t t, bool to_candidates,
             std::size_t* got) {
    std::vector<std::uint32_t> dst;
    for (std::size_t i = 0; i < count; ++i) {
      const auto idx = src == m::top_k_source::all ? static_cast<std::uint32_t>(i) : candidates[i];
      if (m::composite_key(x[idx], idx) >= t) dst.push_back(idx);
    }
    *got = dst.size();
    (to_candidates ? candidates : out) = std::move(dst);
    return 0;
  }
};

}  // namespace cohort::cuda::test
