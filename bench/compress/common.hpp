// Shared by the compression benchmarks: gradient-like input, timing and medians.
#pragma once

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace cohort::bench {

using seconds = std::chrono::duration<double>;

/// Normally distributed floats (sd 1e-3, as gradients are), reproducible from the seed.
inline std::vector<float> gradient(std::size_t n, std::uint64_t seed) {
  std::vector<float> g(n);
  std::uint64_t s = seed * 0x9e3779b97f4a7c15ull + 1;
  auto next = [&s] {
    std::uint64_t z = (s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return static_cast<double>((z ^ (z >> 31)) >> 11) * 0x1p-53;
  };
  for (std::size_t i = 0; i < n; ++i) {
    const double u1 = next(), u2 = next();
    g[i] = static_cast<float>(1e-3 * std::sqrt(-2.0 * std::log(1.0 - u1)) *
                              std::cos(6.283185307179586 * u2));
  }
  return g;
}

/// Median, smallest and largest of a sample.
struct summary {
  double median = 0, min = 0, max = 0;
};

inline summary summarize(std::vector<double> v) {
  if (v.empty()) return {};
  std::sort(v.begin(), v.end());
  const std::size_t k = v.size() / 2;
  const double med = v.size() % 2 ? v[k] : 0.5 * (v[k - 1] + v[k]);
  return {med, v.front(), v.back()};
}

/// The value of `--name=value` or `--name value` in argv, or `fallback`.
inline std::string option(int argc, char** argv, const std::string& name, std::string fallback) {
  const std::string flag = "--" + name;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == flag && i + 1 < argc) return argv[i + 1];
    if (a.rfind(flag + "=", 0) == 0) return a.substr(flag.size() + 1);
  }
  return fallback;
}

/// Comma-separated numbers.
inline std::vector<double> numbers(const std::string& s) {
  std::vector<double> v;
  for (std::size_t i = 0; i < s.size();) {
    const std::size_t j = std::min(s.find(',', i), s.size());
    v.push_back(std::atof(s.substr(i, j - i).c_str()));
    i = j + 1;
  }
  return v;
}

}  // namespace cohort::bench
