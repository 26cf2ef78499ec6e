/// @file
/// The timing loop shared by cohort-bench and cohort-bench-mpi, and the machine's ceiling.
///
/// Per size: warmup iterations, each timed, size the timed block (their median, the max over
/// ranks, divided into the time budget, clamped to the iteration caps; every rank computes the
/// same count). One barrier, then the timed iterations back to back, each stamped with one
/// clock read, so that a sample is one call plus the loop. Afterwards, outside the timed
/// region, the samples are reduced elementwise with max over ranks: sample i is iteration i as
/// the slowest rank saw it. p50 and p99 are nearest-rank percentiles of those samples.
#pragma once

#include <algorithm>
#include <chrono>
#include <cmath>
#include <concepts>
#include <cstddef>
#include <cstring>
#include <fstream>
#include <span>
#include <string>
#include <thread>
#include <vector>

namespace cohort::bench {

/// A group of ranks as the timing loop needs it.
///
/// | expression             | semantics |
/// |------------------------|-----------|
/// | `g.rank()`, `g.size()` | this rank, the number of ranks |
/// | `g.barrier()`          | returns once every rank has entered |
/// | `g.max_over_ranks(v)`  | `v`, a `std::span<double>`, becomes its elementwise max over ranks |
///
/// `max_over_ranks` is called by every rank with spans of one length.
template <class G>
concept rank_group = requires(G& g, std::span<double> v) {
  { g.rank() } -> std::convertible_to<int>;
  { g.size() } -> std::convertible_to<int>;
  g.barrier();
  g.max_over_ranks(v);
};

/// How long and how often a size is timed (from the options of the same names).
struct timing {
  int warmup = 5;
  double budget_ms = 100;
  int min_iters = 10;
  int max_iters = 10'000;
};

/// The timed iterations of one size.
struct sample_summary {
  std::size_t iters = 0;  ///< Timed iterations.
  double p50_us = 0;      ///< Median time of one iteration, slowest rank, in microseconds.
  double p99_us = 0;      ///< 99th percentile of the same.
  double min_us = 0;      ///< The fastest of them: with p50, how much the waits cost.
};

/// The nearest-rank percentile `q` (0 < q <= 1) of `v`, which this sorts.
inline double percentile(std::vector<double>& v, double q) {
  std::sort(v.begin(), v.end());
  const auto k = static_cast<std::size_t>(std::ceil(q * static_cast<double>(v.size())));
  return v[std::clamp<std::size_t>(k, 1, v.size()) - 1];
}

namespace detail {
using clock = std::chrono::steady_clock;
inline double seconds_between(clock::time_point a, clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}
}  // namespace detail

/// Times `run` (one call of the collective, on every rank) as described at the top.
/// Every rank of `g` calls it with the same `t`.
template <rank_group G, std::invocable Run>
sample_summary time_iterations(G& g, Run&& run, const timing& t) {
  using detail::clock;
  std::vector<double> warm(static_cast<std::size_t>(std::max(t.warmup, 1)));
  for (double& s : warm) {
    const auto t0 = clock::now();
    run();
    s = detail::seconds_between(t0, clock::now());
  }
  double estimate = percentile(warm, 0.5);
  g.max_over_ranks(std::span(&estimate, 1));

  const double wanted = t.budget_ms * 1e-3 / std::max(estimate, 1e-9);
  const auto iters = static_cast<std::size_t>(std::clamp(
      std::ceil(wanted), static_cast<double>(t.min_iters), static_cast<double>(t.max_iters)));
  std::vector<double> samples(iters);

  g.barrier();
  auto last = clock::now();
  for (double& s : samples) {
    run();
    const auto now = clock::now();
    s = detail::seconds_between(last, now);
    last = now;
  }

  g.max_over_ranks(samples);
  const double p50 = percentile(samples, 0.5) * 1e6;  // sorts samples
  return {iters, p50, percentile(samples, 0.99) * 1e6, samples.front() * 1e6};
}

/// The single-thread memcpy bandwidth at one size: the machine's ceiling for moving bytes.
struct memcpy_ceiling {
  std::size_t bytes = 0;  ///< Bytes per copy.
  double gbps = 0;        ///< Best of repeated copies, in 1e9 bytes per second.
};

/// Copies `bytes` between two buffers (touched first) for about 50 ms, at least 5 times, and
/// returns the best bandwidth (bytes copied per second, the way nccl-tests counts bytes). The
/// best, as STREAM reports it: a ceiling is what the machine can do, and the neighbours on a
/// shared machine only ever slow a copy down.
inline memcpy_ceiling measure_memcpy(std::size_t bytes) {
  using detail::clock;
  bytes = std::max<std::size_t>(bytes, 64);
  std::vector<unsigned char> src(bytes, 1), dst(bytes, 0);
  std::vector<double> gbps;
  const auto stop = clock::now() + std::chrono::milliseconds(50);
  while (gbps.size() < 5 || (clock::now() < stop && gbps.size() < 100'000)) {
    const auto t0 = clock::now();
    std::memcpy(dst.data(), src.data(), bytes);
#if defined(__GNUC__)
    asm volatile("" : : "r"(dst.data()) : "memory");  // the copy must happen
#endif
    gbps.push_back(static_cast<double>(bytes) / detail::seconds_between(t0, clock::now()) / 1e9);
  }
  return {bytes, *std::max_element(gbps.begin(), gbps.end())};
}

/// "2 cpus, Intel(R) Xeon(R) ..." from the thread count and /proc/cpuinfo (Linux).
inline std::string describe_host() {
  std::string model = "unknown cpu";
  std::ifstream cpuinfo("/proc/cpuinfo");
  for (std::string line; std::getline(cpuinfo, line);) {
    if (line.starts_with("model name")) {
      if (auto colon = line.find(':'); colon != std::string::npos)
        model = line.substr(line.find_first_not_of(" \t", colon + 1));
      break;
    }
  }
  return std::to_string(std::thread::hardware_concurrency()) + " cpus, " + model;
}

}  // namespace cohort::bench
