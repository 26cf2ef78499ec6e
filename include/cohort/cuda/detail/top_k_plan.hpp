/// @file
/// The host-side plan of top-k selection on the device: which passes run, in which order, and
/// what they decide, written once over a backend that does the passes.
///
/// cuda/top_k.cu runs it with a backend of kernels and `cub::DeviceSelect`; the host tests run
/// it with a plain-loop backend and compare the indices with compress/detail/select.hpp, so
/// the decisions (sample positions, thresholds, ties, fallbacks) are checked without a GPU.
///
/// Selection is that of the host codec: the k largest |x| compared as bits, ties broken by
/// lower index, indices ascending; `sampled` estimates a threshold from a stratified sample and
/// keeps the m <= k largest, falling back to exact selection exactly where the host does.
///
/// Exact selection is a radix select over the 63-bit composite (|x| bits, ~index) (see
/// `composite_key`): three passes of 11, 11 and 9 bits over the key, then, only when the k-th
/// key has ties that do not all fit, three passes over the index among the tied elements. The
/// threshold is then one composite T, and the selection is the single stable pass
/// "composite >= T", which keeps the indices ascending.
///
/// What the backend does (each call returns 0 or a cudaError_t value):
///
/// - `b.histogram(src, count, shift, width, prefix, hist)`: fills the host array
///   `hist[2^width]` with the counts of `(c >> shift) & (2^width - 1)` over the composites c of
///   `src` for which `c >> (shift + width) == prefix`.
/// - `b.sample(runs, stride, salt)`: sample key `j * top_k_tuning::sample_run + i` (i < the run length)
///   is the key of `x[j * stride + mix64(salt + j) % (stride - run + 1) + i]`, for j < runs:
///   one run of consecutive floats at a random place in each of `runs` equal strata.
/// - `b.count_at_least(key, &m)`: m = the number of i < n with key(x[i]) >= key.
/// - `b.select(src, count, t, to_candidates, &m)`: writes the indices of `src` whose composite
///   is >= t, in order, to the candidate list (or to the output); m = how many.
///
/// Sources: `all` (x[0..n), index i), `candidates` (the candidate list: index cand[i]) and
/// `sample` (the sample keys; their index part is 0).
#pragma once

#include <algorithm>
#include <cohort/compress/detail/top_k_tuning.hpp>
#include <cstddef>
#include <cstdint>

namespace cohort::cuda::detail {

enum class top_k_source : int { all = 0, candidates = 1, sample = 2 };

/// One radix digit of the composite: `width` bits from bit `shift`.
struct radix_digit {
  int shift;
  int width;
};
inline constexpr radix_digit top_k_digits[6] = {{52, 11}, {41, 11}, {32, 9},
                                                {21, 11}, {10, 11}, {0, 10}};
inline constexpr int top_k_max_bins = 2048;

/// The numbers of the sampled selection, the host codec's own (sample run and size, the rank
/// taken in the sample, the candidates' room).
namespace top_k_tuning = cohort::compress::detail::top_k_tuning;

/// The threshold of the k-th largest element of `src` (1 <= k <= count). With `with_index`,
/// the composite T such that exactly k composites are >= T; without, the k-th largest key.
template <class Backend>
int top_k_radix(Backend& b, top_k_source src, std::size_t count, std::size_t k, bool with_index,
                std::uint64_t& threshold) {
  std::uint32_t hist[top_k_max_bins];
  std::uint64_t prefix = 0;
  std::size_t greater = 0;  // elements known to be above the threshold
  for (int d = 0; d < (with_index ? 6 : 3); ++d) {
    const radix_digit g = top_k_digits[d];
    if (const int e = b.histogram(src, count, g.shift, g.width, prefix, hist)) return e;
    std::uint32_t bin = 1u << g.width;
    std::size_t above = greater;
    while (bin-- > 0) {
      if (above + hist[bin] >= k) break;
      above += hist[bin];
    }
    greater = above;
    prefix = (prefix << g.width) | bin;
    if (d == 2) {
      if (!with_index) {
        threshold = prefix;  // the key itself
        return 0;
      }
      if (greater + hist[bin] == k) {  // every element with the k-th key fits: no index passes
        threshold = prefix << 32;
        return 0;
      }
    }
  }
  threshold = prefix;
  return 0;
}

/// Selects the top k of x[0..n) by magnitude into the output's index list; `*m` = how many
/// (k, or fewer for `sampled` when the estimate overshoots; min(k, n) for exact).
template <class Backend>
int top_k_plan(Backend& b, std::size_t n, std::size_t k, bool sampled, std::uint64_t salt,
               std::size_t* m) {
  namespace tune = top_k_tuning;
  k = std::min(k, n);
  *m = 0;
  if (k == 0) return 0;
  if (k == n) return b.select(top_k_source::all, n, 0, false, m);
  if (sampled) {
    const std::size_t s = tune::sample_length(n, k);
    if (tune::sampling_pays(n, s)) {
      const std::size_t runs = s / tune::sample_run;
      if (const int e = b.sample(runs, n / runs, salt)) return e;
      const std::size_t want = tune::sample_rank(n, k, s);
      std::uint64_t t = 0;
      if (const int e = top_k_radix(b, top_k_source::sample, s, want, false, t)) return e;
      std::size_t c = 0;
      if (const int e = b.count_at_least(static_cast<std::uint32_t>(t), &c)) return e;
      if (c <= tune::candidate_capacity(k)) {
        std::size_t got = 0;
        if (const int e = b.select(top_k_source::all, n, t << 32, true, &got)) return e;
        if (k >= got) return b.select(top_k_source::candidates, got, 0, false, m);
        std::uint64_t threshold = 0;
        if (const int e = top_k_radix(b, top_k_source::candidates, got, k, true, threshold))
          return e;
        return b.select(top_k_source::candidates, got, threshold, false, m);
      }
    }
  }
  std::uint64_t threshold = 0;
  if (const int e = top_k_radix(b, top_k_source::all, n, k, true, threshold)) return e;
  return b.select(top_k_source::all, n, threshold, false, m);
}

}  // namespace cohort::cuda::detail
