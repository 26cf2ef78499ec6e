/// @file
/// Top-k selection by magnitude: exact (radix select, no workspace) and sampled (a threshold
/// estimated from a sample, as in Deep Gradient Compression, then trimmed exactly).
///
/// Both write the chosen indices in increasing order and choose deterministically: the k
/// largest |x| (compared as the bits of |x|, so a NaN counts as larger than infinity), ties at
/// the threshold broken by lower index.
#pragma once

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>

#include <cohort/compress/detail/hash.hpp>
#include <cohort/compress/detail/simd.hpp>
#include <cohort/compress/detail/top_k_tuning.hpp>

namespace cohort::compress::detail {

inline std::uint32_t magnitude_key(float v) noexcept {
  return std::bit_cast<std::uint32_t>(v) & 0x7FFF'FFFFu;
}

/// The k-th largest key among `count` keys (`key_at(i)`), and how many keys exceed it.
struct threshold {
  std::uint32_t key = 0;
  std::size_t greater = 0;
};

/// Radix select over the 31 key bits in three passes (11, 11, 9 bits), without copying keys.
/// Needs 1 <= k <= count.
template <class KeyAt>
threshold radix_threshold(std::size_t count, std::size_t k, KeyAt key_at) {
  constexpr int shifts[3] = {20, 9, 0};
  constexpr std::uint32_t widths[3] = {11, 11, 9};
  std::array<std::size_t, 2048> hist;
  std::uint32_t prefix = 0;  // the bits of the threshold found so far, above `shifts[d]`
  std::size_t greater = 0;   // keys known to exceed the threshold
  for (int d = 0; d < 3; ++d) {
    const int shift = shifts[d];
    const std::uint32_t bins = 1u << widths[d];
    std::fill_n(hist.begin(), bins, 0);
    const int high = shift + static_cast<int>(widths[d]);  // bits at and above are fixed
    for (std::size_t i = 0; i < count; ++i) {
      const std::uint32_t key = key_at(i);
      if (d == 0 || (key >> high) == prefix) ++hist[(key >> shift) & (bins - 1)];
    }
    std::uint32_t bin = bins;
    for (std::size_t above = greater; bin-- > 0;) {
      if (above + hist[bin] >= k) break;
      above += hist[bin];
    }
    for (std::uint32_t b = bin + 1; b < bins; ++b) greater += hist[b];
    prefix = (prefix << widths[d]) | bin;
  }
  return {prefix, greater};
}

/// Writes the indices (ascending) of the k largest of `count` candidates to `out`; candidate
/// i has index `index_at(i)` (ascending in i) and key `key_at(i)`. Returns min(k, count).
template <class IndexAt, class KeyAt>
std::size_t select_exact(std::size_t count, std::size_t k, IndexAt index_at, KeyAt key_at,
                         std::uint32_t* out) {
  if (k >= count) {
    for (std::size_t i = 0; i < count; ++i) out[i] = index_at(i);
    return count;
  }
  if (k == 0) return 0;
  const threshold t = radix_threshold(count, k, key_at);
  std::size_t ties = k - t.greater, m = 0;
  for (std::size_t i = 0; i < count && m < k; ++i) {
    const std::uint32_t key = key_at(i);
    if (key > t.key || (key == t.key && ties > 0)) {
      ties -= key == t.key ? 1 : 0;
      out[m++] = index_at(i);
    }
  }
  return m;
}

/// Writes to `idx` the indices (ascending), and to `vals` the values, of every element with
/// key >= `t`, up to `cap` of them; returns how many there are, which may exceed `cap`.
inline std::size_t collect_at_least_portable(const float* x, std::size_t n, std::size_t base,
                                             std::uint32_t t, std::uint32_t* idx, float* vals,
                                             std::size_t cap) noexcept {
  std::size_t m = 0;
  for (std::size_t i = 0; i < n; ++i) {
    if (magnitude_key(x[i]) >= t) {
      if (m < cap) {
        idx[m] = static_cast<std::uint32_t>(base + i);
        vals[m] = x[i];
      }
      ++m;
    }
  }
  return m;
}

#if COHORT_SIMD_X86
// Lanes of p[0..8) whose key exceeds `below`, as all-ones.
[[gnu::always_inline]] COHORT_TARGET_AVX2 inline __m256i at_least8(const float* p,
                                                                  __m256i below) noexcept {
  const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm256_cmpgt_epi32(_mm256_and_si256(v, _mm256_set1_epi32(0x7FFF'FFFF)), below);
}

// 32 comparisons per test; only groups of 8 with a hit are looked at element by element.
COHORT_TARGET_AVX2 inline std::size_t collect_at_least_avx2(const float* x, std::size_t n,
                                                           std::uint32_t t, std::uint32_t* idx,
                                                           float* vals,
                                                           std::size_t cap) noexcept {
  // key >= t  <=>  key > t - 1 (signed compare: keys and t are below 2^31; t - 1 may be -1).
  const __m256i below = _mm256_set1_epi32(static_cast<std::int32_t>(t) - 1);
  std::size_t m = 0, i = 0;
  auto take = [&](std::size_t at, unsigned hits) {
    for (; hits != 0; hits &= hits - 1, ++m) {
      const int b = std::countr_zero(hits);
      if (m < cap) {
        idx[m] = static_cast<std::uint32_t>(at + b);
        vals[m] = x[at + b];
      }
    }
  };
  for (; i + 32 <= n; i += 32) {
    const __m256i h0 = at_least8(x + i, below), h1 = at_least8(x + i + 8, below);
    const __m256i h2 = at_least8(x + i + 16, below), h3 = at_least8(x + i + 24, below);
    const __m256i any = _mm256_or_si256(_mm256_or_si256(h0, h1), _mm256_or_si256(h2, h3));
    if (_mm256_testz_si256(any, any)) continue;
    take(i, static_cast<unsigned>(_mm256_movemask_ps(_mm256_castsi256_ps(h0))));
    take(i + 8, static_cast<unsigned>(_mm256_movemask_ps(_mm256_castsi256_ps(h1))));
    take(i + 16, static_cast<unsigned>(_mm256_movemask_ps(_mm256_castsi256_ps(h2))));
    take(i + 24, static_cast<unsigned>(_mm256_movemask_ps(_mm256_castsi256_ps(h3))));
  }
  const std::size_t used = std::min(m, cap);
  return m + collect_at_least_portable(x + i, n - i, i, t, idx + used, vals + used, cap - used);
}
#endif

inline std::size_t collect_at_least(const float* x, std::size_t n, std::uint32_t t,
                                    std::uint32_t* idx, float* vals, std::size_t cap) noexcept {
#if COHORT_SIMD_X86
  if (active_isa() == isa::avx2) return collect_at_least_avx2(x, n, t, idx, vals, cap);
#endif
  return collect_at_least_portable(x, n, 0, t, idx, vals, cap);
}

/// Top-k selection of `x` (exact, see the file comment): indices ascending into `out`.
inline std::size_t top_k_exact(const float* x, std::size_t n, std::size_t k, std::uint32_t* out) {
  return select_exact(
      n, k, [](std::size_t i) { return static_cast<std::uint32_t>(i); },
      [x](std::size_t i) { return magnitude_key(x[i]); }, out);
}

/// Workspace (4-byte slots) of the sampled selection: the sample, candidate indices and values.
constexpr std::size_t sampled_workspace(std::size_t n, std::size_t k) noexcept {
  return top_k_tuning::sample_size(n, k) + 2 * top_k_tuning::candidate_capacity(k);
}

/// What a selection chose: `count` indices (in the caller's array) and, when the selection had
/// them at hand, their values (else null: the caller reads them from the input).
struct selected {
  std::size_t count = 0;
  const float* values = nullptr;
};

/// Sampled top-k: estimates the threshold that about 1.25k elements pass from a stratified
/// sample, collects those candidates (indices and values) in one pass, and keeps the k largest
/// of them exactly. The result is always the m largest elements for some m <= k (usually
/// m = k: fewer only when the estimate overshoots). Falls back to exact selection when the
/// sample would be most of the input or too many candidates pass. `work`:
/// `sampled_workspace(n, k)` 4-byte slots; the values returned live there.
inline selected top_k_sampled(const float* x, std::size_t n, std::size_t k, std::uint32_t* out,
                              std::uint32_t* work, std::uint64_t salt) {
  namespace tune = top_k_tuning;
  constexpr std::size_t run = tune::sample_run;
  const std::size_t s = tune::sample_length(n, k);
  if (k == 0 || k >= n || !tune::sampling_pays(n, s)) return {top_k_exact(x, n, k, out), nullptr};
  // Stratified: one run of `run` consecutive floats (a cache line) at a random place in each
  // of s / run equal strata, so that the sample costs one memory access per run.
  const std::size_t runs = s / run, stride = n / runs;
  for (std::size_t j = 0; j < runs; ++j) {
    const auto jitter = static_cast<std::size_t>(mix64(salt + j) % (stride - run + 1));
    const std::size_t at = j * stride + jitter;
    for (std::size_t i = 0; i < run; ++i) work[j * run + i] = magnitude_key(x[at + i]);
  }
  const std::size_t want = tune::sample_rank(n, k, s);
  std::nth_element(work, work + (s - want), work + s);
  const std::uint32_t t = work[s - want];
  const std::size_t cap = tune::candidate_capacity(k);
  std::uint32_t* cand = work + s;
  float* vals = reinterpret_cast<float*>(cand + cap);
  const std::size_t m = collect_at_least(x, n, t, cand, vals, cap);
  if (m > cap) return {top_k_exact(x, n, k, out), nullptr};
  // Choose candidate positions, then turn them into indices and values, in place (the
  // positions increase, so position j is never written before it is read).
  const std::size_t got = select_exact(
      m, k, [](std::size_t i) { return static_cast<std::uint32_t>(i); },
      [vals](std::size_t i) { return magnitude_key(vals[i]); }, out);
  for (std::size_t j = 0; j < got; ++j) {
    const std::uint32_t pos = out[j];
    out[j] = cand[pos];
    vals[j] = vals[pos];
  }
  return {got, vals};
}

}  // namespace cohort::compress::detail
