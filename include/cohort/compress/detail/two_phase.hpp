/// @file
/// The two-phase aggregation (int8): a direct reduce-scatter in which each chunk's owner
/// dequantizes, sums in fp32 and re-quantizes once, then a ring all-gather of the quantized
/// chunks. Re-quantizing at every hop of a ring would grow the error with sqrt(P); here every
/// element is quantized at most twice whatever P is.
///
/// Chunk j is the blocks block_of(blocks, P, j), so chunks start on block boundaries and their
/// encodings are contiguous slices E_j of the encoding E of the whole tensor. Phase 1: every
/// rank encodes each chunk j != r and sends it straight to rank j as soon as it is encoded.
/// Rank j sums, block by block and in rank order 0..P-1, the P - 1 dequantized contributions
/// and its own fp32 values (exactly: its own chunk is never quantized before the sum), and
/// quantizes each summed block into its slot of E. Phase 2: ring all-gather of the slots,
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
};

/// Scratch the two-phase aggregation needs: the whole encoding, a receive slot per rank, a
/// block of fp32 sums, the codec's workspace and 2P requests.
template <two_phase_codec Q, class Request>
std::size_t two_phase_scratch(const Q& q, std::size_t n, int p) noexcept {
  const two_phase_layout<Q> lay{n, p};
  return align64(Q::encoded_bytes(n)) + p * align64(lay.max_encoded()) +
         align64(4 * Q::block_elements) + align64(q.workspace_bytes(n)) +
         align64(2 * p * sizeof(Request));
}

/// Sums this rank's `contribution` with every rank's through `q` (see this file's comment) into
/// `data`, which may be the contribution itself. `salt[0]`, `salt[1]` seed the first and
/// second quantization.
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
  auto work = carve.take(q.workspace_bytes(n));
  auto* reqs = reinterpret_cast<request*>(carve.take(2 * p * sizeof(request)).data());
  std::uninitialized_value_construct_n(reqs, 2 * p);  // trivially copyable: nothing to destroy
  request* sends = reqs;
  request* recvs = reqs + p;

  // Phase 1: every other chunk to its owner, each sent as soon as it is encoded, the nearest
  // owner first; no send is waited for before the receives are posted (a transport may buffer
  // nothing).
  rep.encoded_bytes = 0;
  rep.density = 1.0;
  for (int k = 1; k < p; ++k) {
    const int j = (r + k) % p;
    const block el = lay.elements(j), e = lay.encoded(j);
    q.encode(contribution.subspan(el.offset, el.count), all.subspan(e.offset, e.count), work,
             salt[0] + static_cast<std::uint64_t>(j));
    sends[j] = c.transport().send(j, all.subspan(e.offset, e.count));
    nudge(c, sends[j]);
    rep.encoded_bytes += e.count;
  }
  const block mine = lay.encoded(r), el = lay.elements(r);
  if (!c.check_header()) return false;
  for (int from = 0; from < p; ++from)
    if (from != r) recvs[from] = c.transport().recv(from, slots.subspan(from * slot, mine.count));
  for (int from = 0; from < p; ++from)
    if (from != r && !c.wait(recvs[from], from)) return false;

  // The owner's sum, block by block: the contributions in rank order, accumulated in fp32 (its
  // own exactly), then quantized once into this rank's slot of `all`.
  for (std::size_t off = 0, b = 0; off < el.count; off += B, ++b) {
    const std::size_t len = std::min(B, el.count - off);
    const std::span<float> acc(sum, len);
    for (int from = 0; from < p; ++from) {
      if (from == r) {
        const float* own = contribution.data() + el.offset + off;
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
  // Every other chunk was sent as encoded; this rank's own values were added exactly.
  for (int j = 0; j < p; ++j) {
    const block e = lay.elements(j), bytes = lay.encoded(j);
    if (j == r) feedback.settle(e.offset, e.count);
    else feedback.absorb(q, all.subspan(bytes.offset, bytes.count), e.offset, e.count);
  }
  for (int j = 0; j < p; ++j)
    if (j != r && !c.wait(sends[j], j)) return false;

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
