/// @file
/// The gather aggregation (top-k): all-gather the payload sizes, then the variable-size sparse
/// payloads (empty ones included), then decode-add them in rank order 0..P-1 on every rank.
///
/// Sparse pays while a payload is smaller than what a dense bf16 ring all_reduce sends per
/// rank: P * payload <= 4n bytes, i.e. density <= 1/(2P) with float values (2/(3P) with 16-bit
/// ones). A rank whose codec would exceed that does not encode and announces so in its size;
/// if any rank does, or any payload exceeds the bound, all ranks run the dense bf16 summable
/// aggregation instead (`aggregation::dense_fallback`). The choice is made from the gathered
/// sizes, so every rank makes the same one even if their ratios differ.
///
/// Bytes each rank sends: 8(P-1) for the sizes, then sum_{i != r+1} |payload_i|. Every rank
/// decodes the same payloads in the same order: bitwise identical results.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <span>
#include <string>
#include <utility>

#include <cohort/collectives/detail/schedules.hpp>
#include <cohort/compress/cast.hpp>
#include <cohort/compress/codec.hpp>
#include <cohort/compress/detail/pipeline.hpp>
#include <cohort/compress/detail/scratch.hpp>
#include <cohort/compress/detail/summable.hpp>
#include <cohort/compress/error_feedback.hpp>
#include <cohort/compress/report.hpp>
#include <cohort/core/buffer.hpp>
#include <cohort/core/error.hpp>
#include <cohort/core/ops.hpp>

namespace cohort::compress::detail {

/// The size a rank announces when its payload would not pay: everyone goes dense.
inline constexpr std::uint64_t wants_dense = std::numeric_limits<std::uint64_t>::max();

/// Scratch the gather aggregation needs (its dense fallback included).
template <gather_codec G>
std::size_t gather_scratch(const G& g, std::size_t n, int p) noexcept {
  const std::size_t sparse = align64(g.max_encoded_bytes(n)) + align64(4 * n) +
                             align64(g.workspace_bytes(n));
  return align64(8 * p) + std::max(sparse, summable_scratch<cast_codec<cohort::bf16>>(n));
}

/// Sums this rank's `contribution` with every rank's through the sparse codec `g` (see this
/// file's comment) into `data`, which may be the contribution itself. `feedback` corrects the
/// contribution as the selection reads it (after its `begin`).
template <class Call, gather_codec G, class Op, class Feedback>
bool gather_all_reduce(Call& c, std::span<const float> contribution, std::span<float> data,
                       const G& g, const Op& op,
                       Feedback& feedback, std::span<std::byte> scratch, std::uint64_t salt,
                       report& rep) {
  const std::size_t n = data.size();
  const int p = c.size(), r = c.rank();
  carver carve(scratch);
  auto* sizes = reinterpret_cast<std::uint64_t*>(carve.take(8 * p).data());
  const std::span<std::byte> rest = carve.rest();

  // Encode only if it can pay; announce the size (or the wish for dense) to everyone.
  const auto pays = [n, p](std::uint64_t bytes) { return bytes <= 4 * std::uint64_t{n} / p; };
  carver sparse(rest);
  auto own = sparse.take(g.max_encoded_bytes(n));
  auto all = sparse.take(4 * n);
  auto work = sparse.take(g.workspace_bytes(n));
  // With error feedback the selection's pass corrects the gradient into the residual, which
  // then holds the contribution c for the dense fallback; nothing is absorbed before the
  // aggregation is chosen.
  std::size_t mine = 0;
  if (pays(g.max_encoded_bytes(n))) {
    mine = feedback.encode_corrected(g, contribution, own, work, salt);
    if constexpr (is_error_feedback<Feedback>) contribution = feedback.corrected();
    sizes[r] = mine;
  } else {
    contribution = feedback.correct(contribution);
    sizes[r] = wants_dense;
  }
  if (!cohort::detail::ring_all_gather(c, reinterpret_cast<std::byte*>(sizes),
                                       [](int i) { return block{8 * std::size_t(i), 8}; }))
    return false;
  bool dense = false;
  for (int i = 0; i < p; ++i) {
    if (sizes[i] == wants_dense || !pays(sizes[i])) {
      dense = true;
    } else if (sizes[i] % G::entry_bytes != 0) {
      return c.fail(make_error_code(errc::protocol_error), i,
                    "rank " + std::to_string(i) + " announced a sparse payload of " +
                        std::to_string(sizes[i]) + " bytes, not a whole number of " +
                        std::to_string(G::entry_bytes) + "-byte entries");
    }
  }
  if (dense) {
    rep.used = aggregation::dense_fallback;
    return summable_all_reduce(c, contribution, data, compress::bf16, op, feedback, rest, rep);
  }

  // Everyone's payload, each at its offset (the total is at most 4n bytes: checked above).
  auto offset_of = [&](int i) {
    std::size_t off = 0;
    for (int j = 0; j < i; ++j) off += sizes[j];
    return off;
  };
  if (mine > 0) std::memcpy(all.data() + offset_of(r), own.data(), mine);
  auto block_at = [&](int i) { return block{offset_of(i), static_cast<std::size_t>(sizes[i])}; };
  // `data` is read no more (the contribution is encoded, the aggregation chosen): it is zeroed,
  // and the error feedback keeps what this rank's payload dropped, while the first payload
  // arrives: the work that can overlap the transfer.
  bool zeroed = false;
  auto zero_once = [&](std::size_t, std::size_t) {
    if (std::exchange(zeroed, true)) return;
    std::fill(data.begin(), data.end(), 0.0f);
    feedback.absorb(g, own.first(mine), 0, n);
  };
  if (!all_gather_decoding(c, all.data(), block_at, 1, zero_once)) return false;
  zero_once(0, 0);  // this rank's payload was empty
  for (int i = 0; i < p; ++i) {
    const block b = block_at(i);
    if (i != r && !g.valid(all.subspan(b.offset, b.count), n))
      return c.fail(make_error_code(errc::protocol_error), i,
                    "rank " + std::to_string(i) + " sent a sparse payload with an index out of "
                    "order or not below " + std::to_string(n));
  }
  rep.used = aggregation::gather;
  rep.encoded_bytes = mine;
  rep.density = n == 0 ? 0.0 : static_cast<double>(mine / G::entry_bytes) / static_cast<double>(n);

  // Scatter-add in rank order.
  for (int i = 0; i < p; ++i) {
    const block b = block_at(i);
    g.decode(all.subspan(b.offset, b.count), data, decode_mode::add);
  }
  if constexpr (finalizing_reduction_for<Op, float>)
    for (float& v : data) v = op.finalize(v, p);
  return true;
}

}  // namespace cohort::compress::detail
