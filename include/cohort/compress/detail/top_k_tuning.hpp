/// @file
/// The numbers of sampled top-k selection, in one place: the host codec
/// (compress/detail/select.hpp) and the device's plan (cuda/detail/top_k_plan.hpp) both read
/// them, and must, since the two choose the same entries bit for bit.
///
/// nvcc compiles this file (cuda/top_k.cu, through the plan): it includes only standard
/// headers and nothing of cohort.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>

namespace cohort::compress::detail::top_k_tuning {

/// The sample is read in runs of this many consecutive floats (a cache line), one run at a
/// random place in each of (sample length / run) equal strata of the input.
inline constexpr std::size_t sample_run = 16;

/// How many floats the sampled selection would like to sample out of n to find k: about 128
/// expected sample hits above the threshold (a relative spread near 9%), at least 4096.
constexpr std::size_t sample_size(std::size_t n, std::size_t k) noexcept {
  if (k == 0) return 0;
  const std::size_t want = std::max<std::size_t>(4096, (128 * n + k - 1) / k);
  return std::min(n, want);
}

/// The sample actually read: `sample_size` cut to whole runs.
constexpr std::size_t sample_length(std::size_t n, std::size_t k) noexcept {
  return sample_size(n, k) / sample_run * sample_run;
}

/// Whether a sample of `s` floats out of n is worth taking: at least one run, and at most a
/// quarter of the input (else exact selection is as cheap).
constexpr bool sampling_pays(std::size_t n, std::size_t s) noexcept {
  return s > 0 && 4 * s <= n;
}

/// The threshold is the key of this rank (1-based, from the top) in a sample of s out of n:
/// the rank that matches 1.25 k in the whole input, so that the threshold rarely overshoots.
inline std::size_t sample_rank(std::size_t n, std::size_t k, std::size_t s) {
  const double scaled = std::ceil(1.25 * double(k) * double(s) / double(n));
  return std::clamp<std::size_t>(static_cast<std::size_t>(scaled), 1, s);
}

/// Candidates the sampled selection keeps room for before it falls back to exact selection.
constexpr std::size_t candidate_capacity(std::size_t k) noexcept { return 4 * k + 64; }

}  // namespace cohort::compress::detail::top_k_tuning
