// Shared by the compression tests: reproducible gradient-like data and small utilities.
#pragma once

#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <vector>

#include <cohort/compress/all_reduce.hpp>

#include "../support.hpp"

namespace cohort::test {

inline std::uint64_t splitmix(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// A uniform double in [0, 1) from a counter.
inline double uniform(std::uint64_t seed, std::uint64_t i) {
  return static_cast<double>(splitmix(seed * 0x100000001b3ull + i) >> 11) * 0x1p-53;
}

// Gradient-like values: roughly normal, scaled per stretch of 300 elements over six orders of
// magnitude (so int8 blocks and top-k see both large and tiny blocks), with some exact zeros.
inline std::vector<float> gradient(std::uint64_t seed, std::size_t n) {
  std::vector<float> g(n);
  for (std::size_t i = 0; i < n; ++i) {
    const double u1 = uniform(seed, 2 * i), u2 = uniform(seed, 2 * i + 1);
    const double normal = std::sqrt(-2.0 * std::log(1.0 - u1)) * std::cos(6.283185307179586 * u2);
    const double scale = std::pow(10.0, -5.0 + 6.0 * uniform(seed ^ 0xABCDull, i / 300));
    g[i] = uniform(seed ^ 0x5151ull, i) < 0.02 ? 0.0f : static_cast<float>(normal * scale);
  }
  return g;
}

inline std::uint32_t bits(float f) { return std::bit_cast<std::uint32_t>(f); }

// Bitwise equality of two float arrays (NaN-safe, -0 != +0).
inline bool same_bits(std::span<const float> a, std::span<const float> b) {
  return a.size() == b.size() &&
         (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

// Encodes `x` with codec `c` into an aligned buffer and returns the bytes.
template <class Codec>
std::vector<std::byte> encode(Codec& c, std::span<const float> x, std::uint64_t salt = 0) {
  std::vector<std::uint32_t> out((c.max_encoded_bytes(x.size()) + 3) / 4 + 1);
  std::vector<std::uint32_t> work(c.workspace_bytes(x.size()) / 4 + 1);
  const std::size_t len = c.encode(x, std::as_writable_bytes(std::span(out)),
                                   std::as_writable_bytes(std::span(work)), salt);
  const auto* p = reinterpret_cast<const std::byte*>(out.data());
  return {p, p + len};
}

// The floats a receiver decodes from `bytes`.
template <class Codec>
std::vector<float> decoded(const Codec& c, std::span<const std::byte> bytes, std::size_t n) {
  std::vector<std::uint32_t> aligned(bytes.size() / 4 + 1);
  if (!bytes.empty()) std::memcpy(aligned.data(), bytes.data(), bytes.size());
  std::vector<float> x(n, 1234.5f);  // assign must overwrite everything
  c.decode(std::as_bytes(std::span(aligned)).first(bytes.size()), x,
           compress::decode_mode::assign);
  return x;
}

// Runs `fn` with the kernels (codecs and fp16 conversions) capped at `cap` (0: portable, -1:
// the CPU's best; core/detail/cpu.hpp).
template <class Fn>
void with_isa(int cap, Fn&& fn) {
  const kernel_cap_guard capped(cap);
  fn();
}

}  // namespace cohort::test
