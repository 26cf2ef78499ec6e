/// @file
/// Top-k sparsification: send only the largest `ratio` of the gradient by magnitude, as
/// (u32 index, value) entries.
///
/// Payload of m entries: m u32 indices, strictly increasing, then m values of `V` (`float`,
/// or `fp16`/`bf16` through `top_k(r) | compress::bf16`), m * (4 + sizeof(V)) bytes, read
/// unaligned. The byte length tells m. Decoding writes the values at their indices: assign
/// zeroes the rest, add and subtract touch only the entries. Selection is by |x| (see
/// detail/select.hpp): `selection::exact` picks exactly k = ceil(ratio * n); `sampled` (the
/// default, as in Deep Gradient Compression) estimates the threshold from a sample and returns
/// the m <= k largest, usually exactly k, for a fraction of the cost. Indices are 32-bit:
/// tensors hold fewer than 2^32 floats.
#pragma once

#include <algorithm>
#include <cassert>
#include <charconv>
#include <cmath>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>

#include <cohort/compress/cast.hpp>
#include <cohort/compress/codec.hpp>
#include <cohort/compress/detail/select.hpp>
#include <cohort/core/dtype.hpp>
#include <cohort/core/error.hpp>

namespace cohort::compress {

/// How top-k finds its k largest magnitudes.
enum class selection : std::uint8_t {
  exact,    ///< Radix select: exactly k entries; four passes over the input.
  sampled,  ///< Threshold from a sample, then one pass: up to k entries (DGC).
};

/// Sends the `ratio` largest magnitudes as (u32 index, `V` value) entries; gather aggregation.
template <class V = float>
  requires std::same_as<V, float> || std::same_as<V, cohort::fp16> || std::same_as<V, cohort::bf16>
struct top_k_codec {
  /// The type the values travel as.
  using value_type = V;
  /// Payloads differ in length and cannot be added: they are gathered, then decoded.
  static constexpr aggregation aggregated_by = aggregation::gather;
  /// Bytes per (index, value) entry.
  static constexpr std::size_t entry_bytes = 4 + sizeof(V);

  /// The fraction of elements sent, in (0, 1].
  double ratio = 0.01;
  /// How the entries are chosen.
  selection method = selection::sampled;

  /// k = ceil(ratio * n), at most n: the most entries an encoding of n floats holds.
  constexpr std::size_t max_entries(std::size_t n) const noexcept {
    const double k = std::ceil(ratio * static_cast<double>(n));
    return k >= static_cast<double>(n) ? n : static_cast<std::size_t>(k);
  }
  /// k * entry_bytes.
  constexpr std::size_t max_encoded_bytes(std::size_t n) const noexcept {
    return max_entries(n) * entry_bytes;
  }
  /// Scratch for sampled selection (sample and candidates); none for exact.
  constexpr std::size_t workspace_bytes(std::size_t n) const noexcept {
    return method == selection::exact ? 0 : 4 * detail::sampled_workspace(n, max_entries(n));
  }

  /// Selects and writes the payload to `out` (4-byte aligned, `max_encoded_bytes(n)` long);
  /// returns its length. `work`: `workspace_bytes(n)`, 4-byte aligned. `salt` places samples.
  std::size_t encode(std::span<const float> in, std::span<std::byte> out,
                     std::span<std::byte> work, std::uint64_t salt) const {
    detail::plain_input x{in.data()};
    return encode_from(x, in.size(), out, work, salt);
  }
  /// Error feedback's correction in the selection's pass: writes c = g + r (c = g where
  /// `fresh`, r then holding no residual yet) to r and returns `encode(c)`, the same bytes. The
  /// residual of the entries sent is not formed: decode-subtract the payload from r for that.
  std::size_t encode_corrected(std::span<const float> g, std::span<float> r, bool fresh,
                               std::span<std::byte> out, std::span<std::byte> work,
                               std::uint64_t salt) const {
    assert(r.size() == g.size());
    detail::corrected_input x{g.data(), r.data(), fresh};
    return encode_from(x, g.size(), out, work, salt);
  }
  /// Writes the entries of `bytes` into `x` as `mode` says. `bytes` must be `valid`.
  void decode(std::span<const std::byte> bytes, std::span<float> x,
              decode_mode mode) const noexcept {
    assert(valid(bytes, x.size()));
    const std::size_t m = bytes.size() / entry_bytes;
    const std::byte* values = bytes.data() + 4 * m;
    if (mode == decode_mode::assign) std::fill(x.begin(), x.end(), 0.0f);
    for (std::size_t j = 0; j < m; ++j) {
      std::uint32_t i;
      V v;
      std::memcpy(&i, bytes.data() + 4 * j, 4);
      std::memcpy(&v, values + j * sizeof(V), sizeof(V));
      if (mode == decode_mode::subtract) x[i] -= static_cast<float>(v);
      else x[i] += static_cast<float>(v);
    }
  }

  /// True when `bytes` is a whole number of entries with increasing indices below `n`:
  /// the check a payload from a peer passes before it is decoded.
  bool valid(std::span<const std::byte> bytes, std::size_t n) const noexcept {
    if (bytes.size() % entry_bytes != 0) return false;
    const std::size_t m = bytes.size() / entry_bytes;
    std::uint64_t next = 0;  // the smallest index allowed next
    for (std::size_t j = 0; j < m; ++j) {
      std::uint32_t i;
      std::memcpy(&i, bytes.data() + 4 * j, 4);
      if (i < next || i >= n) return false;
      next = std::uint64_t{i} + 1;
    }
    return true;
  }

  /// "top_k(0.01)", "top_k(0.01,exact)|bf16".
  std::string name() const {
    char buf[32];
    const auto r = std::to_chars(buf, buf + sizeof buf, ratio);
    std::string s = "top_k(";
    s.append(buf, r.ptr);
    s += method == selection::exact ? ",exact)" : ")";
    if constexpr (!std::same_as<V, float>) {
      s += '|';
      s += dtype_name(dtype_of<V>);
    }
    return s;
  }

 private:
  // Selection and payload over `in` (detail/select.hpp's plain or corrected input).
  template <class Input>
  std::size_t encode_from(Input& in, std::size_t n, std::span<std::byte> out,
                          std::span<std::byte> work, std::uint64_t salt) const {
    const std::size_t k = max_entries(n);
    assert(n < (std::size_t{1} << 32) && out.size() >= k * entry_bytes);
    assert(work.size() >= workspace_bytes(n));
    assert(reinterpret_cast<std::uintptr_t>(out.data()) % 4 == 0);
    auto* idx = reinterpret_cast<std::uint32_t*>(out.data());  // indices first, in place
    auto* work32 = reinterpret_cast<std::uint32_t*>(work.data());
    const detail::selected chosen =
        method == selection::exact
            ? detail::selected{detail::top_k_exact(in.values(n), n, k, idx), nullptr}
            : detail::top_k_sampled(in, n, k, idx, work32, salt);
    const std::size_t m = chosen.count;
    const float* x = in.values(n);
    std::byte* values = out.data() + 4 * m;
    for (std::size_t j = 0; j < m; ++j) {
      const V v = static_cast<V>(chosen.values ? chosen.values[j] : x[idx[j]]);
      std::memcpy(values + j * sizeof(V), &v, sizeof(V));
    }
    return m * entry_bytes;
  }
};

/// Top-k with float values: the `ratio` (0 < ratio <= 1) largest magnitudes of each tensor.
/// Compose with a cast to send the values in 16 bits: `top_k(0.01) | compress::bf16`. Throws
/// `cohort::error` (`errc::invalid_argument`, operation "compress::top_k") for another ratio.
constexpr top_k_codec<float> top_k(double ratio, selection method = selection::sampled) {
  if (!(ratio > 0.0 && ratio <= 1.0))
    throw error(make_error_code(errc::invalid_argument), "compress::top_k", -1,
                "compress::top_k: ratio must be in (0, 1]");
  return {ratio, method};
}

}  // namespace cohort::compress
