/// @file
/// The summable aggregation (fp16, bf16): a ring all_reduce whose wire carries 16-bit partial
/// sums, accumulating every hop in fp32.
///
/// Reduce-scatter, P-1 steps as in collectives/detail/schedules.hpp: block j starts at rank
/// j+1, which encodes its own values of the block; each following rank q receives the 16-bit
/// partial sum, adds its own fp32 values in fp32 and rounds once to 16 bits (avg divides by P
/// before the last rounding), ending at rank j. Then the ring all-gather of the 16-bit blocks,
/// and every rank decodes the same wire values: bitwise identical results. Each rank's values
/// enter the sum in full precision; only the partial sums (and the block a rank starts) are
/// rounded. The encode of the first block and the add-and-round of each hop run in the codec's
/// vector kernels, straight out of the transport's memory when it lends views.
///
/// Bytes each rank sends, with b = sizeof(wire_type) and c_j = block_of(n, P, j).count:
/// reduce-scatter sum_{j != r} b c_j, all-gather sum_{j != r+1} b c_j; about 2(P-1)/P * 2n.
#pragma once

#include <algorithm>
#include <cstddef>
#include <span>
#include <type_traits>

#include <cohort/collectives/detail/schedules.hpp>
#include <cohort/collectives/detail/tuning.hpp>
#include <cohort/compress/cast.hpp>
#include <cohort/compress/codec.hpp>
#include <cohort/compress/detail/pipeline.hpp>
#include <cohort/compress/detail/scratch.hpp>
#include <cohort/compress/report.hpp>
#include <cohort/core/buffer.hpp>
#include <cohort/core/concepts.hpp>
#include <cohort/core/ops.hpp>

namespace cohort::compress::detail {

/// Scratch the summable aggregation needs for n floats.
template <summable_codec W>
constexpr std::size_t summable_scratch(std::size_t n) noexcept {
  return align64(n * sizeof(typename W::wire_type)) + cohort::detail::staging_bytes;
}

/// Receives `n` wire values from `peer` and writes dst[i] = T(float(received[i]) + mine[i])
/// (divided by `divisor` when nonzero): from the transport's memory when it lends views, else
/// through two staging chunks, adding one while the next arrives.
template <class Call, class T>
bool recv_accumulate(Call& c, int peer, const float* mine, T* dst, std::size_t n,
                     float divisor, std::span<std::byte> staging) {
  return cohort::detail::recv_each<T>(
      c, peer, n, staging, [&](const T* received, std::size_t off, std::size_t k) {
        cast_accumulate(received, mine + off, dst + off, k, divisor);
      });
}

/// Sums (or averages) this rank's `contribution` with every rank's through the 16-bit wire
/// type of `w` (see this file's comment) and writes the result to `data`, which may be the
/// contribution itself. Then `feedback` learns what this rank's encoding dropped.
template <class Call, summable_codec W, class Op, class Feedback>
bool summable_all_reduce(Call& c, std::span<const float> contribution, std::span<float> data,
                         const W& w, const Op&, Feedback& feedback, std::span<std::byte> scratch,
                         report& rep) {
  using T = typename W::wire_type;
  const std::size_t n = data.size();
  const int p = c.size(), r = c.rank();
  carver carve(scratch);
  auto wire_bytes = carve.take(n * sizeof(T));
  auto staging = carve.take(cohort::detail::staging_bytes);
  T* wire = reinterpret_cast<T*>(wire_bytes.data());
  rep.density = 1.0;

  // This rank encodes the block it starts (everything when alone) and adds the rest exactly.
  // The block goes out in pieces, each sent as soon as it is encoded, none waited for before
  // the receive of this step is posted (a transport may buffer nothing).
  const block first = p == 1 ? block{0, n} : block_of(n, p, (r - 1 + p) % p);
  constexpr int pieces = 4;
  typename Call::request first_sent[pieces];
  for (int k = 0; k < pieces; ++k) {
    const block piece = block_of(first.count, pieces, k);
    const std::size_t at = first.offset + piece.offset;
    w.encode(contribution.subspan(at, piece.count), std::span<T>(wire + at, piece.count));
    if (p > 1) {
      const auto bytes = std::as_bytes(std::span(wire + at, piece.count));
      first_sent[k] = c.transport().send(c.right(), bytes);
      nudge(c, first_sent[k]);
    }
  }
  const auto first_bytes = wire_bytes.subspan(first.offset * sizeof(T), first.count * sizeof(T));
  rep.encoded_bytes = first_bytes.size();

  const float divisor = finalizing_reduction_for<Op, float> ? static_cast<float>(p) : 0.0f;
  for (int s = 0; s + 1 < p; ++s) {
    const block sb = block_of(n, p, (r - s - 1 + 2 * p) % p);
    const block rb = block_of(n, p, (r - s - 2 + 2 * p) % p);
    typename Call::request sent{};
    if (s > 0)
      sent = c.transport().send(c.right(), std::as_bytes(std::span(wire + sb.offset, sb.count)));
    const float d = s + 2 == p ? divisor : 0.0f;
    if (!recv_accumulate(c, c.left(), contribution.data() + rb.offset, wire + rb.offset,
                         rb.count, d, staging))
      return false;
    if (s == 0) {
      for (auto& req : first_sent)
        if (!c.wait(req, c.right())) return false;
    } else if (!c.wait(sent, c.right())) {
      return false;
    }
  }
  // The contribution is read: the block this rank encoded keeps its rounding error, the rest
  // was added exactly.
  feedback.absorb(w, first_bytes, first.offset, first.count);
  feedback.settle(0, first.offset);
  feedback.settle(first.offset + first.count, n - first.offset - first.count);

  // The all-gather of the 16-bit blocks, decoded into `data` as they arrive. At P = 1 the sum
  // is the encoding itself, and avg's division by 1 changes no bits.
  auto block_bytes = [n, p](int i) {
    const block b = block_of(n, p, i);
    return block{b.offset * sizeof(T), b.count * sizeof(T)};
  };
  return all_gather_decoding(c, wire_bytes.data(), block_bytes, sizeof(T),
                             [&](std::size_t offset, std::size_t bytes) {
                               const std::size_t i = offset / sizeof(T), k = bytes / sizeof(T);
                               w.decode(std::span<const T>(wire + i, k), data.subspan(i, k),
                                        decode_mode::assign);
                             });
}

}  // namespace cohort::compress::detail
