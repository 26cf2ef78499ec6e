/// @file
/// The two-phase aggregation (int8): a direct reduce-scatter in which each chunk's owner
/// dequantizes, sums in fp32 and re-quantizes once, then a ring all-gather of the quantized
/// chunks. Re-quantizing at every hop of a ring would grow the error with sqrt(P); here every
/// element is quantized at most twice whatever P is.
///
/// Chunk j is the blocks block_of(blocks, P, j), so chunks start on block boundaries and their
/// encodings are contiguous slices E_j of the encoding E of the whole tensor. Phase 1: every
/// rank encodes each chunk j != r and sends it straight to rank j in pieces of whole blocks,
/// each as soon as it is encoded. Rank j sums, piece by piece as they arrive, block by block
/// and in rank order 0..P-1, the P - 1 dequantized contributions and its own fp32 values
/// (exactly: its own chunk is never quantized before the sum), and quantizes each summed block
/// into its slot of E. Phase 2: ring all-gather of the slots,
/// decoded as they arrive; every rank decodes the same bytes, so results are bitwise
/// identical. Bytes each rank sends: (|E| - |E_r|) + (|E| - |E_{r+1}|), about
/// 2(P-1)/P * (n + 4n/Block).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>

#include <cohort/collectives/detail/schedules.hpp>
#include <cohort/collectives/detail/tuning.hpp>
#include <cohort/compress/codec.hpp>
#include <cohort/compress/detail/pipeline.hpp>
#include <cohort/compress/detail/scratch.hpp>
#include <cohort/compress/report.hpp>
#include <cohort/core/buffer.hpp>
#include <cohort/core/ops.hpp>

namespace cohort::compress::detail {

/// Chunk j of a two-phase aggregation over n floats: its elements, and the bytes of its
/// encoding within the encoding of the whole tensor.
template <two_phase_codec Q>
struct two_phase_layout {
  std::size_t n;
  int p;

  std::size_t blocks() const noexcept { return (n + Q::block_elements - 1) / Q::block_elements; }
  /// The elements of chunk j.
  block elements(int j) const noexcept {
    const block b = block_of(blocks(), p, j);
    const std::size_t first = std::min(n, b.offset * Q::block_elements);
    const std::size_t last = std::min(n, (b.offset + b.count) * Q::block_elements);
    return {first, last - first};
  }
  /// The bytes of chunk j's encoding.
  block encoded(int j) const noexcept {
    const block e = elements(j);
    return {Q::encoded_bytes(e.offset), Q::encoded_bytes(e.count)};
  }
  /// The longest chunk encoding (chunk 0's: block_of gives earlier chunks more blocks).
  std::size_t max_encoded() const noexcept { return encoded(0).count; }

  /// Pieces each chunk travels in: one per `tuning::chunk_bytes` of the longest chunk's
  /// encoding, at least 1 and at most `two_phase_pieces` (small tensors go in one message).
  int pieces() const noexcept;
  /// Piece k of `pieces` of chunk j: its first block counted from the chunk's first, its
  /// elements and the bytes of its encoding (within the whole tensor's).
  struct piece_of {
    std::size_t first_block;
    block elements, encoded;
  };
  piece_of piece(int j, int k, int pieces) const noexcept {
    const block chunk = block_of(blocks(), p, j);
    const block pb = block_of(chunk.count, pieces, k);
    const std::size_t first = std::min(n, (chunk.offset + pb.offset) * Q::block_elements);
    const std::size_t last =
        std::min(n, (chunk.offset + pb.offset + pb.count) * Q::block_elements);
    return {pb.offset, {first, last - first},
            {Q::encoded_bytes(first), Q::encoded_bytes(last - first)}};
  }
};

/// The most pieces a chunk travels in: a piece is sent as soon as it is encoded, so that
/// encoding the next overlaps its transfer, and the owner sums a piece as soon as every
/// contribution to it is here.
inline constexpr int two_phase_pieces = 8;

template <two_phase_codec Q>
int two_phase_layout<Q>::pieces() const noexcept {
  const std::size_t k = max_encoded() / cohort::detail::tuning::chunk_bytes;
  return static_cast<int>(std::clamp<std::size_t>(k, 1, two_phase_pieces));
}

/// Scratch the two-phase aggregation needs: the whole encoding, a receive slot per rank, two
/// blocks of fp32 (the sums, and this rank's corrected values under error feedback), the
/// codec's workspace and a request per piece sent and received.
template <two_phase_codec Q, class Request>
std::size_t two_phase_scratch(const Q& q, std::size_t n, int p) noexcept {
  const two_phase_layout<Q> lay{n, p};
  return align64(Q::encoded_bytes(n)) + p * align64(lay.max_encoded()) +
         2 * align64(4 * Q::block_elements) + align64(q.workspace_bytes(n)) +
         align64(2 * p * two_phase_pieces * sizeof(Request));
}

/// Sums this rank's `contribution` with every rank's through `q` (see this file's comment) into
/// `data`, which may be the contribution itself. `salt[0]`, `salt[1]` seed the first and
/// second quantization. `feedback` corrects the contribution as it is read (after its
/// `begin`): each chunk sent is corrected, encoded and its residual formed in one pass
/// (`encode_part`), and this rank's own chunk is corrected as the owner's sum reads it, its
/// residual set to 0 (`take_part`, exact).
template <class Call, two_phase_codec Q, class Op, class Feedback>
bool two_phase_all_reduce(Call& c, std::span<const float> contribution, std::span<float> data,
                          const Q& q, const Op& op, Feedback& feedback,
                          std::span<std::byte> scratch, const std::uint64_t (&salt)[2],
                          report& rep) {
  using request = typename Call::request;
  constexpr std::size_t B = Q::block_elements, record = B + 4;
  const std::size_t n = data.size();
  const int p = c.size(), r = c.rank();
  const two_phase_layout<Q> lay{n, p};
  carver carve(scratch);
  auto all = carve.take(Q::encoded_bytes(n));
  const std::size_t slot = align64(lay.max_encoded());
  auto slots = carve.take(p * slot);
  auto* sum = reinterpret_cast<float*>(carve.take(4 * B).data());
  auto* own_block = reinterpret_cast<float*>(carve.take(4 * B).data());
  auto work = carve.take(q.workspace_bytes(n));
  const int pieces = lay.pieces();  // the same on every rank: a function of n and P
  const std::size_t nreq = 2 * static_cast<std::size_t>(p) * pieces;
  auto* reqs = reinterpret_cast<request*>(carve.take(nreq * sizeof(request)).data());
  std::uninitialized_value_construct_n(reqs, nreq);  // trivially copyable: nothing to destroy
  request* sends = reqs;                // [owner * pieces + k]
  request* recvs = reqs + p * pieces;  // [sender * pieces + k]
  const block mine = lay.encoded(r), el = lay.elements(r);

  // Phase 1: every other chunk to its owner, the nearest owner first, piece by piece, each
  // piece sent as soon as it is encoded (and corrected, with error feedback) so that the next
  // is encoded while it travels. The receives are posted after the first send and before any
  // send is waited for (a transport may buffer nothing).
  rep.encoded_bytes = 0;
  rep.density = 1.0;
  bool posted = false;
  auto post_receives = [&] {
    posted = true;
    if (!c.check_header()) return false;
    for (int from = 0; from < p; ++from) {
      if (from == r) continue;
      for (int k = 0; k < pieces; ++k) {
        const block e = lay.piece(r, k, pieces).encoded;
        if (e.count == 0) continue;
        const auto into = slots.subspan(from * slot + (e.offset - mine.offset), e.count);
        recvs[from * pieces + k] = c.transport().recv(from, into);
      }
    }
    return true;
  };
  for (int s = 1; s < p; ++s) {
    const int j = (r + s) % p;
    for (int k = 0; k < pieces; ++k) {
      const auto pc = lay.piece(j, k, pieces);
      if (pc.elements.count == 0) continue;
      const auto bytes = all.subspan(pc.encoded.offset, pc.encoded.count);
      feedback.encode_part(q, contribution.subspan(pc.elements.offset, pc.elements.count),
                           pc.elements.offset, bytes, work,
                           salt[0] + static_cast<std::uint64_t>(j), pc.first_block);
      sends[j * pieces + k] = c.transport().send(j, bytes);
      nudge(c, sends[j * pieces + k]);
      rep.encoded_bytes += bytes.size();
      if (!posted && !post_receives()) return false;
    }
  }
  if (!posted && !post_receives()) return false;

  // The owner's sum, piece by piece as the contributions arrive, block by block within: the
  // contributions in rank order, accumulated in fp32 (its own exactly), then quantized once
  // into this rank's slot of `all`.
  for (int k = 0; k < pieces; ++k) {
    const auto pc = lay.piece(r, k, pieces);
    if (pc.elements.count == 0) continue;
    for (int from = 0; from < p; ++from)
      if (from != r && !c.wait(recvs[from * pieces + k], from)) return false;
    const std::size_t end = pc.elements.offset - el.offset + pc.elements.count;
    for (std::size_t b = pc.first_block, off = b * B; off < end; off += B, ++b) {
      const std::size_t len = std::min(B, el.count - off);
      const std::span<float> acc(sum, len);
      for (int from = 0; from < p; ++from) {
        if (from == r) {
          const float* own =
              feedback.take_part(contribution.subspan(el.offset + off, len), el.offset + off,
                                 own_block);
          if (from == 0) std::copy_n(own, len, sum);
          else for (std::size_t i = 0; i < len; ++i) sum[i] = sum[i] + own[i];
        } else {
          const auto rec = slots.subspan(from * slot + b * record, std::min(record, 4 + len));
          q.decode(rec, acc, from == 0 ? decode_mode::assign : decode_mode::add);
        }
      }
      if constexpr (finalizing_reduction_for<Op, float>)
        for (float& v : acc) v = op.finalize(v, p);
      q.encode(acc, all.subspan(mine.offset + b * record, 4 + len), work, salt[1] + b);
    }
  }
  for (int j = 0; j < p; ++j) {
    if (j == r) continue;
    for (int k = 0; k < pieces; ++k)
      if (lay.piece(j, k, pieces).elements.count > 0 && !c.wait(sends[j * pieces + k], j))
        return false;
  }

  // Phase 2: the quantized sums around the ring, decoded into `data` as they arrive.
  return all_gather_decoding(c, all.data(), [&](int i) { return lay.encoded(i); }, record,
                             [&](std::size_t offset, std::size_t bytes) {
                               const std::size_t first = offset / record * B;
                               const std::size_t rest = bytes % record;
                               const std::size_t count =
                                   bytes / record * B + (rest > 4 ? rest - 4 : 0);
                               q.decode(all.subspan(offset, bytes), data.subspan(first, count),
                                        decode_mode::assign);
                             });
}

}  // namespace cohort::compress::detail
