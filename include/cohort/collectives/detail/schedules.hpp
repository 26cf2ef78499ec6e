/// @file
/// The schedules every collective is built from, written once over the transport concept:
/// ring reduce-scatter, ring and recursive-doubling all-gather, pipelined chain broadcast,
/// binomial-tree broadcast and chain reduce.
///
/// Data moves rightward, rank r to rank r+1 (mod P), the same direction as the call header, so
/// that each stream carries the header of a call before its data. The exceptions, the tree
/// broadcast's and the recursive doubling's edges to a rank other than the right neighbour,
/// send the header along (`call::send_header`), which that rank compares before it takes the
/// data.
#pragma once

#include <cstddef>
#include <span>

#include <cohort/collectives/detail/call.hpp>
#include <cohort/collectives/detail/kernels.hpp>
#include <cohort/collectives/detail/tuning.hpp>
#include <cohort/core/buffer.hpp>
#include <cohort/core/concepts.hpp>
#include <cohort/core/detail/min.hpp>

namespace cohort::detail {

template <class T>
std::span<const std::byte> bytes_of(const T* p, std::size_t n) {
  return {reinterpret_cast<const std::byte*>(p), n * sizeof(T)};
}
template <class T>
std::span<std::byte> writable_bytes_of(T* p, std::size_t n) {
  return {reinterpret_cast<std::byte*>(p), n * sizeof(T)};
}

/// Length of chunk `k` of `n` cut into chunks of `chunk`: `chunk`, or what is left for the last.
constexpr std::size_t chunk_length(std::size_t n, std::size_t chunk, std::size_t k) noexcept {
  return min_of(chunk, n - k * chunk);
}

/// Scratch bytes `recv_reduce` needs for staging on a transport that lends no views.
inline constexpr std::size_t staging_bytes = 2 * tuning::chunk_bytes;

/// Receives `n` elements of T from `peer` piece by piece, after the header check, and calls
/// `use(received, offset, count)` on each piece as it lands: straight out of the transport's
/// memory when it lends views, else through two staging chunks, using one while the next
/// arrives.
template <class T, class Call, class Use>
bool recv_each(Call& c, int peer, std::size_t n, std::span<std::byte> staging, Use use) {
  if (n == 0) return true;
  if (!c.check_header()) return false;
  auto& t = c.transport();
  if constexpr (zero_copy_transport<std::remove_reference_t<decltype(t)>>) {
    for (std::size_t done = 0; done < n;) {
      std::error_code ec;
      auto view = t.recv_view(peer, (n - done) * sizeof(T), sizeof(T), c.until(), ec);
      // A view shorter than an element would never advance: a transport that lends one has
      // broken its contract, and looping on it would spin past the deadline.
      if (!ec && view.size() < sizeof(T)) ec = make_error_code(errc::protocol_error);
      if (ec) return c.fail_transport(ec, peer);
      const std::size_t k = view.size() / sizeof(T);
      use(reinterpret_cast<const T*>(view.data()), done, k);
      t.recv_release(peer, view.size());
      done += k;
    }
  } else {
    const std::size_t chunk = tuning::chunk_bytes / sizeof(T);
    const std::size_t chunks = (n + chunk - 1) / chunk;
    T* buf[2] = {reinterpret_cast<T*>(staging.data()),
                 reinterpret_cast<T*>(staging.data() + tuning::chunk_bytes)};
    typename Call::request req[2];
    auto len = [&](std::size_t k) { return chunk_length(n, chunk, k); };
    auto post = [&](std::size_t k) {
      req[k % 2] = t.recv(peer, writable_bytes_of(buf[k % 2], len(k)));
    };
    post(0);
    if (chunks > 1) post(1);
    for (std::size_t k = 0; k < chunks; ++k) {
      if (!c.wait(req[k % 2], peer)) return false;
      use(static_cast<const T*>(buf[k % 2]), k * chunk, len(k));
      if (k + 2 < chunks) post(k + 2);
    }
  }
  return true;
}

/// Receives `n` elements from `peer` and writes dst[i] = op(received[i], mine[i]), applying
/// the op's finalize when `last`. `dst` may alias `mine`. `staging`: `staging_bytes`.
template <class Call, element T, class Op>
bool recv_reduce(Call& c, int peer, const T* mine, T* dst, std::size_t n, const Op& op,
                 bool last, std::span<std::byte> staging) {
  return recv_each<T>(c, peer, n, staging, [&](const T* received, std::size_t off, std::size_t k) {
    if (last) combine_last(received, mine + off, dst + off, k, op, c.size());
    else combine(received, mine + off, dst + off, k, op);
  });
}

/// Receives `bytes` from `peer` into `dst` (after the header check), waiting for it.
template <class Call>
bool recv_into(Call& c, int peer, std::span<std::byte> dst) {
  if (dst.empty()) return true;
  if (!c.check_header()) return false;
  auto req = c.transport().recv(peer, dst);
  return c.wait(req, peer);
}

/// Ring reduce-scatter: P-1 steps; at step s rank r sends block r-s-1 to the right and reduces
/// block r-s-2 arriving from the left, so that block r ends fully reduced (finalized) at r.
/// `dest(step, block)` says where the partial reduced at `step` goes; the previous step's
/// destination is what is sent next. Each block is combined in the fixed order r+1, ..., r,
/// so the result does not depend on timing.
template <class Call, element T, class Op, class Dest>
bool ring_reduce_scatter(Call& c, const T* in, std::size_t n, const Op& op, Dest dest,
                         std::span<std::byte> staging) {
  const int p = c.size(), r = c.rank();
  const T* previous = nullptr;
  for (int s = 0; s + 1 < p; ++s) {
    const block sb = block_of(n, p, (r - s - 1 + 2 * p) % p);
    const block rb = block_of(n, p, (r - s - 2 + 2 * p) % p);
    const T* src = s == 0 ? in + sb.offset : previous;
    auto req = c.transport().send(c.right(), bytes_of(src, sb.count));
    T* dst = dest(s, rb);
    if (!recv_reduce(c, c.left(), in + rb.offset, dst, rb.count, op, s + 2 == p, staging))
      return false;
    if (!c.wait(req, c.right())) return false;
    previous = dst;
  }
  return true;
}

/// Ring all-gather over `data`: block r (`block_at(r)`, in bytes) is this rank's and already in
/// place; P-1 steps, at step s sending block r-s right and receiving block r-s-1 from the left.
template <class Call, class BlockAt>
bool ring_all_gather(Call& c, std::byte* data, BlockAt block_at) {
  const int p = c.size(), r = c.rank();
  for (int s = 0; s + 1 < p; ++s) {
    const block sb = block_at((r - s + p) % p), rb = block_at((r - s - 1 + p) % p);
    auto req =
        c.transport().send(c.right(), std::span<const std::byte>(data + sb.offset, sb.count));
    if (!recv_into(c, c.left(), {data + rb.offset, rb.count})) return false;
    if (!c.wait(req, c.right())) return false;
  }
  return true;
}

/// Recursive-doubling all-gather over `data`, P rows of `row` bytes in rank order, P a power
/// of two: at the step of distance d = 1, 2, 4, ..., rank r swaps the d rows it holds (from
/// r with its low log2(d) bits cleared) with rank r^d. The ring's bytes (P-1 rows) in log2(P)
/// hops instead of P-1. An exchange with a rank other than a ring neighbour carries the
/// sender's header ahead of the data.
template <class Call>
bool doubling_all_gather(Call& c, std::byte* data, std::size_t row) {
  const int p = c.size(), r = c.rank();
  if (row == 0) return true;
  for (int d = 1; d < p; d *= 2) {
    const int q = r ^ d;
    const std::span<const std::byte> have(data + row * (r & ~(d - 1)), row * d);
    if (q != c.right()) c.send_header(q);
    auto sent = c.transport().send(q, have);
    if (q != c.left() && !c.check_header_from(q)) return false;
    if (!recv_into(c, q, {data + row * (q & ~(d - 1)), row * d})) return false;
    if (!c.wait(sent, q)) return false;
  }
  return true;
}

/// Whether P rows of `row` bytes are gathered by recursive doubling rather than the ring
/// (`tuning::doubling_all_gather_bytes`).
template <class Call>
bool gathers_by_doubling(Call& c, std::size_t row) {
  const int p = c.size();
  return coalescing_transport<std::remove_reference_t<decltype(c.transport())>> &&
         (p & (p - 1)) == 0 && row <= tuning::doubling_all_gather_bytes;
}

/// All-gather of P rows of `row` bytes in rank order, by recursive doubling or the ring.
template <class Call>
bool all_gather_rows(Call& c, std::byte* data, std::size_t row) {
  if (gathers_by_doubling(c, row)) return doubling_all_gather(c, data, row);
  return ring_all_gather(c, data, [&](int i) { return block{row * i, row}; });
}

/// Pipelined chain broadcast of `bytes` along root, root+1, ..., root-1: each rank forwards
/// chunk k to the right while chunk k+1 arrives from the left.
template <class Call>
bool chain_broadcast(Call& c, std::byte* data, std::size_t bytes, int root) {
  const int p = c.size(), pos = (c.rank() - root + p) % p;
  const bool receives = pos > 0, forwards = pos + 1 < p;
  const std::size_t chunk = tuning::chunk_bytes, chunks = (bytes + chunk - 1) / chunk;
  auto piece = [&](std::size_t k) {
    return std::span<std::byte>(data + k * chunk, chunk_length(bytes, chunk, k));
  };
  if (receives && chunks > 0 && !c.check_header()) return false;
  typename Call::request in[2], out[2];
  if (receives) {
    in[0] = c.transport().recv(c.left(), piece(0));
    if (chunks > 1) in[1] = c.transport().recv(c.left(), piece(1));
  }
  for (std::size_t k = 0; k < chunks; ++k) {
    if (receives) {
      if (!c.wait(in[k % 2], c.left())) return false;
      if (k + 2 < chunks) in[k % 2] = c.transport().recv(c.left(), piece(k + 2));
    }
    if (forwards) {
      if (!c.wait(out[k % 2], c.right())) return false;  // two sends in flight at most
      out[k % 2] = c.transport().send(c.right(), piece(k));
    }
  }
  return c.wait(out[0], c.right()) && c.wait(out[1], c.right());
}

/// The binomial tree over positions relative to the root: position v > 0 receives from v with
/// its lowest set bit cleared, and sends to v + 2^k for every 2^k below that bit (every 2^k < P
/// at the root), farthest first. Odd positions hang off their left neighbour; a rank's subtree
/// holds consecutive positions. `tree_children(v, p, f)` calls f(child) for each child of v.
constexpr int tree_parent(int v) noexcept { return v & (v - 1); }
template <class F>
constexpr void tree_children(int v, int p, F f) {
  const long limit = v == 0 ? p : (v & -v);
  long step = 1;
  while (step * 2 < limit) step *= 2;
  for (; step >= 1; step /= 2)
    if (step < limit && v + step < p) f(static_cast<int>(v + step));
}

/// Binomial-tree broadcast of `bytes` from `root`, whole buffers: ceil(log2 P) hops of latency
/// instead of the chain's P-1, at the price of the root sending the buffer ceil(log2 P) times
/// (so it pays only where the chain cannot pipeline; `tuning::tree_broadcast_bytes`). An edge
/// to a rank other than the sender's right neighbour carries the sender's header ahead of the
/// data.
template <class Call>
bool tree_broadcast(Call& c, std::byte* data, std::size_t bytes, int root) {
  if (bytes == 0) return true;
  const int p = c.size(), v = (c.rank() - root + p) % p;
  auto rank_at = [&](int pos) { return (pos + root) % p; };
  const std::span<std::byte> all(data, bytes);
  if (v > 0) {
    const int parent = rank_at(tree_parent(v));
    if (parent != c.left() && !c.check_header_from(parent)) return false;
    if (!recv_into(c, parent, all)) return false;
  }
  typename Call::request sent[8 * sizeof(int)];
  int peers[8 * sizeof(int)], n = 0;
  tree_children(v, p, [&](int child) {
    const int peer = rank_at(child);
    if (peer != c.right()) c.send_header(peer);
    peers[n] = peer;
    sent[n++] = c.transport().send(peer, all);
  });
  for (int i = 0; i < n; ++i)
    if (!c.wait(sent[i], peers[i])) return false;
  return true;
}

/// Scratch bytes `chain_reduce` needs on a rank that is not the chain's last.
inline constexpr std::size_t chain_reduce_scratch = 2 * tuning::chunk_bytes + staging_bytes;

/// Pipelined chain reduce along first, first+1, ..., first+P-1 (mod P): the last rank of the
/// chain ends with op(x_first, ..., x_last), combined in exactly that order (so ordered ops are
/// right when first == 0) and finalized, in `out`. `scratch`: `chain_reduce_scratch` bytes.
template <class Call, element T, class Op>
bool chain_reduce(Call& c, const T* in, T* out, std::size_t n, const Op& op, int first,
                  std::span<std::byte> scratch) {
  const int p = c.size(), pos = (c.rank() - first + p) % p;
  const bool last = pos + 1 == p;
  const std::size_t chunk = tuning::chunk_bytes / sizeof(T), chunks = (n + chunk - 1) / chunk;
  T* buf[2] = {reinterpret_cast<T*>(scratch.data()),
               reinterpret_cast<T*>(scratch.data() + tuning::chunk_bytes)};
  auto staging = scratch.subspan(2 * tuning::chunk_bytes);
  typename Call::request sent[2];
  for (std::size_t k = 0; k < chunks; ++k) {
    const std::size_t off = k * chunk, len = chunk_length(n, chunk, k);
    const T* result = in + off;
    if (pos > 0) {
      T* dst = last ? out + off : buf[k % 2];
      if (!last && !c.wait(sent[k % 2], c.right())) return false;  // buffer free again
      if (!recv_reduce(c, c.left(), in + off, dst, len, op, last, staging)) return false;
      result = dst;
    }
    if (!last) {
      if (pos == 0 && !c.wait(sent[k % 2], c.right())) return false;
      sent[k % 2] = c.transport().send(c.right(), bytes_of(result, len));
    }
  }
  return c.wait(sent[0], c.right()) && c.wait(sent[1], c.right());
}

}  // namespace cohort::detail
