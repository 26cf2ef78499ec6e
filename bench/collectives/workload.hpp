/// @file
/// What each rank passes in one benchmark case, and the exact reference its result is checked
/// against.
///
/// Inputs are small integers, for which every order of combination is exact in every element
/// type, so the reference needs no tolerance: whatever order an implementation picks must give
/// these very bits. Sums stay within +-2P (exact in bf16 up to P = 128); in a product one rank
/// contributes 2 and the others +-1; min and max pick an input; avg divides an exact sum once.
/// Copies (all_gather, broadcast) carry values in [-30, 30] that differ between neighbouring
/// ranks and indices, so that a block landing in the wrong place is caught.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>
#include <type_traits>
#include <vector>

#include <cohort/core/buffer.hpp>
#include <cohort/core/dtype.hpp>
#include <cohort/core/ops.hpp>

#include "options.hpp"

namespace cohort::bench {

/// The buffers of one case, counted in elements.
struct shape {
  std::size_t count = 0;      ///< Elements in the full buffer; the "bytes" column is count * size.
  std::size_t in_count = 0;   ///< Elements each rank passes in.
  std::size_t out_count = 0;  ///< Elements each rank gets back.
};

/// The buffers of `op` for a full buffer of about `bytes` bytes of `elem`-byte elements at
/// `ranks` ranks. all_gather and reduce_scatter round the count down to a multiple of P, at
/// least P, as nccl-tests does; the others use at least one element.
constexpr shape shape_of(collective op, std::size_t bytes, std::size_t elem, int ranks) {
  const std::size_t p = static_cast<std::size_t>(ranks);
  std::size_t n = bytes / elem > 0 ? bytes / elem : 1;
  switch (op) {
    case collective::all_reduce: return {n, n, n};
    case collective::broadcast: return {n, 0, n};  // in place: `out` is the root's input
    case collective::reduce_scatter:
      n = n / p > 0 ? n / p * p : p;
      return {n, n, n / p};
    case collective::all_gather:
      n = n / p > 0 ? n / p * p : p;
      return {n, n / p, n};
  }
  return {};
}

/// Where a case runs: the collective, its reduction and root, and this rank in the group.
struct case_info {
  collective op = collective::all_reduce;
  reduction reduce = reduction::sum;
  int rank = 0;
  int ranks = 1;
  int root = 0;
  shape s;
};

/// The small integer `rank` passes at index `i` of its input (its own block for all_gather).
inline int input_value(const case_info& c, int rank, std::size_t i) {
  // A cheap integer hash, so that the pattern has no short period.
  std::uint32_t h = static_cast<std::uint32_t>(i) * 0x9E37'79B1u +
                    static_cast<std::uint32_t>(rank) * 0x85EB'CA77u;
  h ^= h >> 15;
  h *= 0x2C1B'3C6Du;
  h ^= h >> 13;
  if (!reduces(c.op)) return static_cast<int>(h % 61) - 30;
  const int small = static_cast<int>(h % 5) - 2;  // [-2, 2]
  if (c.reduce != reduction::prod) return small;
  const bool gives_two = i % static_cast<std::size_t>(c.ranks) == static_cast<std::size_t>(rank);
  return gives_two ? 2 : (small < 0 ? -1 : 1);
}

/// The integer `v` as an element of type `T` (exact for the values `input_value` makes).
template <element T>
T from_int(int v) {
  if constexpr (std::is_same_v<T, fp16> || std::is_same_v<T, bf16>) return T(static_cast<float>(v));
  else return static_cast<T>(v);
}

/// A value no correct result has: outputs start as it, so an element never written is caught.
inline constexpr int poison_value = -1000;

/// This rank's buffers of one case.
template <element T>
struct buffers {
  std::vector<T> in;   ///< What this rank passes in.
  std::vector<T> out;  ///< What it gets back (for broadcast, also the root's input).
};

/// Fresh buffers for `c`: inputs filled, outputs poisoned (the root's broadcast data filled).
template <element T>
buffers<T> make_buffers(const case_info& c) {
  buffers<T> b;
  b.in.resize(c.s.in_count);
  b.out.assign(c.s.out_count, from_int<T>(poison_value));
  for (std::size_t i = 0; i < b.in.size(); ++i) b.in[i] = from_int<T>(input_value(c, c.rank, i));
  if (c.op == collective::broadcast && c.rank == c.root) {
    for (std::size_t i = 0; i < b.out.size(); ++i)
      b.out[i] = from_int<T>(input_value(c, c.root, i));
  }
  return b;
}

/// What `out[j]` must hold on this rank after one call of `c` with the reduction `op`.
template <element T, class Op>
T expected_value(const case_info& c, const Op& op, std::size_t j) {
  switch (c.op) {
    case collective::broadcast: return from_int<T>(input_value(c, c.root, j));
    case collective::all_gather: {
      const std::size_t per_rank = c.s.count / static_cast<std::size_t>(c.ranks);
      return from_int<T>(input_value(c, static_cast<int>(j / per_rank), j % per_rank));
    }
    case collective::reduce_scatter:
      j += block_of(c.s.count, c.ranks, c.rank).offset;
      [[fallthrough]];
    case collective::all_reduce: {
      accumulator_t<T> acc = widen(from_int<T>(input_value(c, 0, j)));
      for (int q = 1; q < c.ranks; ++q) acc = op(acc, widen(from_int<T>(input_value(c, q, j))));
      if constexpr (finalizing_reduction_for<Op, T>) acc = op.finalize(acc, c.ranks);
      return narrow<T>(acc);
    }
  }
  return T{};
}

/// The number of wrong elements of `out`; `first_wrong` describes the first (else unchanged).
template <element T, class Op>
std::size_t count_wrong(const case_info& c, const Op& op, const std::vector<T>& out,
                        std::string& first_wrong) {
  std::size_t wrong = 0;
  for (std::size_t j = 0; j < out.size(); ++j) {
    const T want = expected_value<T>(c, op, j);
    if (out[j] == want) continue;
    if (wrong++ == 0) {
      char text[160];
      std::snprintf(text, sizeof text, "element %zu of %zu is %g, expected %g", j, out.size(),
                    static_cast<double>(widen(out[j])), static_cast<double>(widen(want)));
      first_wrong = text;
    }
  }
  return wrong;
}

}  // namespace cohort::bench
