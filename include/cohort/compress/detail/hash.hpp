/// @file
/// Small counter-based hashes: the randomness of stochastic rounding and sampling, reproducible
/// from a seed and an index.
#pragma once

#include <cstdint>

namespace cohort::compress::detail {

/// splitmix64's finalizer: a well-mixed 64-bit value from a counter.
constexpr std::uint64_t mix64(std::uint64_t x) noexcept {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

/// A 32-bit hash of (seed, i) that vectorizes (murmur3's finalizer over seed ^ i * phi).
constexpr std::uint32_t hash32(std::uint32_t seed, std::uint32_t i) noexcept {
  std::uint32_t h = seed ^ (i * 0x9E3779B9u);
  h = (h ^ (h >> 16)) * 0x85EBCA6Bu;
  h = (h ^ (h >> 13)) * 0xC2B2AE35u;
  return h ^ (h >> 16);
}

}  // namespace cohort::compress::detail
