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
// For each 8-bit mask, the lanes of its set bits packed to the front: the permutation that
// compacts the chosen lanes of a vector, keeping their order.
inline constexpr auto compact_lanes = [] {
  std::array<std::array<std::uint32_t, 8>, 256> t{};
  for (unsigned mask = 0; mask < 256; ++mask)
    for (unsigned b = 0, k = 0; b < 8; ++b)
      if ((mask >> b) & 1u) t[mask][k++] = b;
  return t;
}();

// Lanes of v whose key exceeds `below`, as all-ones.
[[gnu::always_inline]] COHORT_TARGET_AVX2 inline __m256i at_least8(__m256 v,
                                                                  __m256i below) noexcept {
  const __m256i abs_mask = _mm256_set1_epi32(0x7FFF'FFFF);
  return _mm256_cmpgt_epi32(_mm256_and_si256(_mm256_castps_si256(v), abs_mask), below);
}

// Appends the lanes of v that `hit` marks (index base + lane, value) at m: with one
// permutation (no branch per element) while at least 8 slots are left below `cap`, element by
// element after.
[[gnu::always_inline]] COHORT_TARGET_AVX2 inline void take8(__m256 v, __m256i hit,
                                                           std::size_t base, std::size_t& m,
                                                           std::uint32_t* idx, float* vals,
                                                           std::size_t cap) noexcept {
  const auto mask = static_cast<unsigned>(_mm256_movemask_ps(_mm256_castsi256_ps(hit)));
  if (m + 8 <= cap) {
    const __m256i perm =
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(compact_lanes[mask].data()));
    const auto first = static_cast<std::int32_t>(static_cast<std::uint32_t>(base));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(idx + m),
                        _mm256_add_epi32(_mm256_set1_epi32(first), perm));
    _mm256_storeu_ps(vals + m, _mm256_permutevar8x32_ps(v, perm));
    m += static_cast<std::size_t>(std::popcount(mask));
    return;
  }
  alignas(32) float lane[8];
  _mm256_store_ps(lane, v);
  for (unsigned h = mask; h != 0; h &= h - 1, ++m) {
    const int b = std::countr_zero(h);
    if (m < cap) {
      idx[m] = static_cast<std::uint32_t>(base + b);
      vals[m] = lane[b];
    }
  }
}

// Loads of the collecting loop: floats x[at..at+8).
struct load_plain {
  const float* x;
  [[gnu::always_inline]] COHORT_TARGET_AVX2 __m256 operator()(std::size_t at) const noexcept {
    return _mm256_loadu_ps(x + at);
  }
};
// c = g + r (g where `Fresh`) at [at, at+8), stored to r on the way.
template <bool Fresh>
struct load_corrected {
  const float* g;
  float* r;
  [[gnu::always_inline]] COHORT_TARGET_AVX2 __m256 operator()(std::size_t at) const noexcept {
    __m256 c = _mm256_loadu_ps(g + at);
    if constexpr (!Fresh) c = _mm256_add_ps(c, _mm256_loadu_ps(r + at));
    _mm256_storeu_ps(r + at, c);
    return c;
  }
};

// The collecting loop over whole groups of 32 floats, `load(i)` giving floats i..i+8 (and
// doing whatever else the pass does with them): 32 comparisons per test, then the groups of 8
// with a hit compacted. Returns how many passed; `done`: how far it got.
template <class Load>
[[gnu::always_inline]] COHORT_TARGET_AVX2 inline std::size_t collect_groups_avx2(
    Load load, std::size_t n, std::size_t base, std::uint32_t t, std::uint32_t* idx, float* vals,
    std::size_t cap, std::size_t& done) noexcept {
  // key >= t  <=>  key > t - 1 (signed compare: keys and t are below 2^31; t - 1 may be -1).
  const __m256i below = _mm256_set1_epi32(static_cast<std::int32_t>(t) - 1);
  std::size_t m = 0, i = 0;
  for (; i + 32 <= n; i += 32) {
    const __m256 v0 = load(i), v1 = load(i + 8), v2 = load(i + 16), v3 = load(i + 24);
    const __m256i h0 = at_least8(v0, below), h1 = at_least8(v1, below);
    const __m256i h2 = at_least8(v2, below), h3 = at_least8(v3, below);
    const __m256i any = _mm256_or_si256(_mm256_or_si256(h0, h1), _mm256_or_si256(h2, h3));
    if (_mm256_testz_si256(any, any)) continue;
    take8(v0, h0, base + i, m, idx, vals, cap);
    take8(v1, h1, base + i + 8, m, idx, vals, cap);
    take8(v2, h2, base + i + 16, m, idx, vals, cap);
    take8(v3, h3, base + i + 24, m, idx, vals, cap);
  }
  done = i;
  return m;
}

COHORT_TARGET_AVX2 inline std::size_t collect_at_least_avx2(const float* x, std::size_t n,
                                                           std::size_t base, std::uint32_t t,
                                                           std::uint32_t* idx, float* vals,
                                                           std::size_t cap) noexcept {
  std::size_t i = 0;
  const std::size_t m = collect_groups_avx2(load_plain{x}, n, base, t, idx, vals, cap, i);
  const std::size_t used = std::min(m, cap);
  return m + collect_at_least_portable(x + i, n - i, base + i, t, idx + used, vals + used,
                                       cap - used);
}

// `correct_tile` for the vector path (the same float additions).
COHORT_TARGET_AVX2 inline void correct_tile_avx2(const float* g, float* r,
                                                 std::size_t len) noexcept {
  for (std::size_t i = 0; i < len; ++i) r[i] = g[i] + r[i];
}

// `collect_at_least` over c = g + r (g where `fresh`), written to r in the same loop: g and r
// are read once and r written once.
COHORT_TARGET_AVX2 inline std::size_t collect_corrected_avx2(const float* g, float* r, bool fresh,
                                                             std::size_t n, std::uint32_t t,
                                                             std::uint32_t* idx, float* vals,
                                                             std::size_t cap) noexcept {
  std::size_t i = 0, m = 0;
  if (fresh) {
    m = collect_groups_avx2(load_corrected<true>{g, r}, n, 0, t, idx, vals, cap, i);
    std::copy(g + i, g + n, r + i);
  } else {
    m = collect_groups_avx2(load_corrected<false>{g, r}, n, 0, t, idx, vals, cap, i);
    correct_tile_avx2(g + i, r + i, n - i);
  }
  const std::size_t used = std::min(m, cap);
  return m + collect_at_least_portable(r + i, n - i, i, t, idx + used, vals + used, cap - used);
}
#endif

inline std::size_t collect_at_least(const float* x, std::size_t n, std::uint32_t t,
                                    std::uint32_t* idx, float* vals, std::size_t cap) noexcept {
#if COHORT_SIMD_X86
  if (active_isa() == isa::avx2) return collect_at_least_avx2(x, n, 0, t, idx, vals, cap);
#endif
  return collect_at_least_portable(x, n, 0, t, idx, vals, cap);
}

/// r = g + r over `len` floats, or r = g where `fresh` (no residual yet: g itself, -0 and NaN
/// payloads included, rather than g + 0).
inline void correct_tile(const float* g, float* r, std::size_t len, bool fresh) noexcept {
  if (fresh) {
    std::copy_n(g, len, r);
    return;
  }
#if COHORT_SIMD_X86
  if (active_isa() == isa::avx2) return correct_tile_avx2(g, r, len);
#endif
  for (std::size_t i = 0; i < len; ++i) r[i] = g[i] + r[i];
}

/// The input of a selection: floats in memory.
struct plain_input {
  const float* x;

  float at(std::size_t i) const noexcept { return x[i]; }
  std::size_t collect(std::size_t n, std::uint32_t t, std::uint32_t* idx, float* vals,
                      std::size_t cap) const noexcept {
    return collect_at_least(x, n, t, idx, vals, cap);
  }
  /// The whole input, in memory.
  const float* values(std::size_t) const noexcept { return x; }
};

/// The input of a selection with error feedback: c = g + r (g where `fresh`), formed on the
/// way and written to r, so that the corrected gradient costs no pass of its own: the
/// collecting pass reads g and r and writes r (the portable path tile by tile, the tile
/// staying in L1 for the comparison). `values` corrects what is left, if the selection did
/// not, and returns r.
struct corrected_input {
  const float* g;
  float* r;
  bool fresh;
  std::size_t corrected = 0;  // r holds c below this index

  /// Tiles of the collecting pass: small enough to stay in L1 between correction and test.
  static constexpr std::size_t tile = 2048;

  float at(std::size_t i) const noexcept { return fresh ? g[i] : g[i] + r[i]; }
  std::size_t collect(std::size_t n, std::uint32_t t, std::uint32_t* idx, float* vals,
                      std::size_t cap) noexcept {
    corrected = n;
#if COHORT_SIMD_X86
    if (active_isa() == isa::avx2) return collect_corrected_avx2(g, r, fresh, n, t, idx, vals, cap);
#endif
    std::size_t m = 0;
    for (std::size_t at = 0; at < n; at += tile) {
      const std::size_t len = std::min(tile, n - at), used = std::min(m, cap);
      correct_tile(g + at, r + at, len, fresh);
      m += collect_at_least_portable(r + at, len, at, t, idx + used, vals + used, cap - used);
    }
    return m;
  }
  const float* values(std::size_t n) noexcept {
    if (corrected < n) correct_tile(g + corrected, r + corrected, n - corrected, fresh);
    corrected = n;
    return r;
  }
};

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
/// `Input`: `plain_input` or `corrected_input`.
template <class Input>
selected top_k_sampled(Input& in, std::size_t n, std::size_t k, std::uint32_t* out,
                       std::uint32_t* work, std::uint64_t salt) {
  namespace tune = top_k_tuning;
  constexpr std::size_t run = tune::sample_run;
  const std::size_t s = tune::sample_length(n, k);
  if (k == 0 || k >= n || !tune::sampling_pays(n, s))
    return {top_k_exact(in.values(n), n, k, out), nullptr};
  // Stratified: one run of `run` consecutive floats (a cache line) at a random place in each
  // of s / run equal strata, so that the sample costs one memory access per run.
  const std::size_t runs = s / run, stride = n / runs;
  for (std::size_t j = 0; j < runs; ++j) {
    const auto jitter = static_cast<std::size_t>(mix64(salt + j) % (stride - run + 1));
    const std::size_t at = j * stride + jitter;
    for (std::size_t i = 0; i < run; ++i) work[j * run + i] = magnitude_key(in.at(at + i));
  }
  const std::size_t want = tune::sample_rank(n, k, s);
  std::nth_element(work, work + (s - want), work + s);
  const std::uint32_t t = work[s - want];
  const std::size_t cap = tune::candidate_capacity(k);
  std::uint32_t* cand = work + s;
  float* vals = reinterpret_cast<float*>(cand + cap);
  const std::size_t m = in.collect(n, t, cand, vals, cap);
  if (m > cap) return {top_k_exact(in.values(n), n, k, out), nullptr};
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

/// Sampled top-k of the floats at `x`.
inline selected top_k_sampled(const float* x, std::size_t n, std::size_t k, std::uint32_t* out,
                              std::uint32_t* work, std::uint64_t salt) {
  plain_input in{x};
  return top_k_sampled(in, n, k, out, work, salt);
}

}  // namespace cohort::compress::detail
