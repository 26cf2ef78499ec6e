/// @file
/// A ring all-gather that decodes while it receives: the all-gather of collectives/detail, but
/// each block is decoded into the result as it arrives, piece by piece, and this rank's own
/// block while the first receive is in flight. The transfer and the decoding overlap, which is
/// where compression wins when the network, not memory, is the bottleneck.
#pragma once

#include <algorithm>
#include <cstddef>
#include <span>
#include <system_error>

#include <cohort/collectives/detail/tuning.hpp>
#include <cohort/core/buffer.hpp>
#include <cohort/core/options.hpp>

namespace cohort::compress::detail {

/// Lets the transport move what it can for `req` without blocking, so that a send posted
/// before some computation leaves during it: a transport driven by the caller's thread (TCP,
/// without a progress thread) only writes to its sockets inside `wait`. A wait whose deadline
/// has passed progresses once and reports `timed_out`; any other failure sticks to the
/// transport and is reported by the next real wait.
template <class Call>
void nudge(Call& c, typename Call::request req) {
  std::error_code ignored;
  c.transport().wait(req, deadline{}, ignored);
}

/// Ring all-gather over `data` (block i is `block_at(i)`, in bytes; this rank's block is in
/// place), as `cohort::detail::ring_all_gather` sends it: P-1 steps, each sending block r-s
/// right and receiving block r-s-1 from the left. `decode(offset, bytes)` is called exactly
/// once for every byte range of every block, in pieces that start on multiples of `unit` bytes
/// from the block's start (so that a record is never split), as soon as the piece is here.
template <class Call, class BlockAt, class Decode>
bool all_gather_decoding(Call& c, std::byte* data, BlockAt block_at, std::size_t unit,
                         Decode decode) {
  const int p = c.size(), r = c.rank();
  const block own = block_at(r);
  if (p == 1) {
    if (own.count > 0) decode(own.offset, own.count);
    return true;
  }
  const std::size_t piece =
      std::max<std::size_t>(1, cohort::detail::tuning::chunk_bytes / unit) * unit;
  auto& t = c.transport();
  for (int s = 0; s + 1 < p; ++s) {
    const block sb = block_at((r - s + p) % p), rb = block_at((r - s - 1 + p) % p);
    auto sent = t.send(c.right(), std::span<const std::byte>(data + sb.offset, sb.count));
    const std::size_t pieces = (rb.count + piece - 1) / piece;
    auto len = [&](std::size_t k) { return std::min(piece, rb.count - k * piece); };
    typename Call::request req[2];
    if (pieces > 0) {
      if (!c.check_header()) return false;
      auto post = [&](std::size_t k) {
        req[k % 2] = t.recv(c.left(), std::span<std::byte>(data + rb.offset + k * piece, len(k)));
      };
      post(0);
      if (pieces > 1) post(1);
      if (s == 0 && own.count > 0) {  // while the first piece arrives
        nudge(c, sent);
        decode(own.offset, own.count);
      }
      for (std::size_t k = 0; k < pieces; ++k) {
        if (!c.wait(req[k % 2], c.left())) return false;
        if (k + 2 < pieces) post(k + 2);
        nudge(c, sent);
        decode(rb.offset + k * piece, len(k));
      }
    } else if (s == 0 && own.count > 0) {
      nudge(c, sent);
      decode(own.offset, own.count);
    }
    if (!c.wait(sent, c.right())) return false;
  }
  return true;
}

}  // namespace cohort::compress::detail
