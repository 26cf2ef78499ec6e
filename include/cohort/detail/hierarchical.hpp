/// @file
/// The stages of the hierarchical collectives (<cohort/hierarchical.hpp>): rings over uneven
/// block layouts, the reduction each stage runs, and the deadline the stages share.
#pragma once

#include <algorithm>
#include <chrono>
#include <concepts>
#include <cstddef>
#include <span>
#include <string>
#include <cstring>
#include <string_view>
#include <type_traits>

#include <cohort/collectives/all_gather.hpp>
#include <cohort/collectives/all_reduce.hpp>
#include <cohort/collectives/barrier.hpp>
#include <cohort/collectives/broadcast.hpp>
#include <cohort/collectives/reduce.hpp>
#include <cohort/collectives/reduce_scatter.hpp>

#include <cohort/collectives/detail/schedules.hpp>
#include <cohort/core/buffer.hpp>
#include <cohort/core/communicator.hpp>
#include <cohort/core/error.hpp>
#include <cohort/core/ops.hpp>
#include <cohort/core/options.hpp>

namespace cohort::detail::hier {

/// The op without its finalize: the stages combine, and the hierarchical call finalizes once
/// with the whole job's size at the end (so that avg divides the full sum by P, as the flat
/// ring does, instead of dividing by L and then by H).
template <class Op>
struct unfinalized {
  static constexpr bool commutative = is_commutative_v<Op>;
  Op op;
  template <class A>
  constexpr A operator()(A a, A b) const { return op(a, b); }
};

/// The reduction each stage runs: sum for avg (so that the headers name a built-in op), the op
/// itself when it has no finalize.
template <class Op, class T>
constexpr auto stage_op(const Op& op) {
  if constexpr (std::same_as<Op, ops::avg_t>) return ops::sum_t{};
  else if constexpr (finalizing_reduction_for<Op, T>) return unfinalized<Op>{op};
  else return op;
}

/// Applies the op's finalize with the job's size `ranks`, in place; nothing for other ops.
template <element T, class Op>
void finalize_in_place(T* data, std::size_t n, const Op& op, int ranks) {
  if constexpr (finalizing_reduction_for<Op, T>) finalize(data, data, n, op, ranks);
}

/// One deadline for every stage of a call: each stage gets what is left of it.
class stage_deadline {
 public:
  stage_deadline(const call_options& opts, std::chrono::milliseconds fallback)
      : until_(deadline_after(opts.timeout.count() > 0 ? opts.timeout : fallback)),
        negative_(opts.timeout.count() < 0) {}
  call_options next() const {
    if (negative_) return {.timeout = std::chrono::milliseconds(-1)};  // the stage rejects it
    const auto left = std::chrono::ceil<std::chrono::milliseconds>(until_ - clock::now());
    return {.timeout = std::max(left, std::chrono::milliseconds(1))};
  }

 private:
  deadline until_;
  bool negative_;
};

/// Reduce-scatter on a ring over any layout of `in` (n elements): block `block_at(i)` of the
/// result, finalized, lands in `out` on rank i. The ring of `ring_reduce_scatter`, each block
/// combined in the order i+1, ..., i (only for ops that commute).
template <communicator Comm, element T, class Op, class BlockAt>
failure reduce_scatter_at(Comm& comm, const T* in, std::size_t n, T* out, const Op& op,
                          BlockAt block_at, const call_options& opts) {
  static_assert(is_commutative_v<Op>);
  call c(comm, collective::reduce_scatter, opts);
  c.template describe_data<T>(n);
  c.template describe_op<Op>();
  if (!c.start()) return c.result();
  const int p = c.size(), r = c.rank();
  bool ok = true;
  if (p == 1) {
    const block mine = block_at(0);
    finalize(in + mine.offset, out, mine.count, op, 1);
  } else {
    std::size_t most = 0;
    for (int i = 0; i < p; ++i) most = std::max(most, block_at(i).count);
    const std::size_t half = (most * sizeof(T) + 63) / 64 * 64;
    auto s = comm.scratch(2 * half + staging_bytes);
    T* work[2] = {reinterpret_cast<T*>(s.data()), reinterpret_cast<T*>(s.data() + half)};
    const T* previous = nullptr;
    for (int st = 0; ok && st + 1 < p; ++st) {
      const block sb = block_at((r - st - 1 + 2 * p) % p);
      const block rb = block_at((r - st - 2 + 2 * p) % p);
      const T* src = st == 0 ? in + sb.offset : previous;
      auto req = c.transport().send(c.right(), bytes_of(src, sb.count));
      T* dst = st + 2 == p ? out : work[st % 2];
      ok = recv_reduce(c, c.left(), in + rb.offset, dst, rb.count, op, st + 2 == p,
                       s.subspan(2 * half)) &&
           c.wait(req, c.right());
      previous = dst;
    }
  }
  if (ok) c.finish();
  return c.result();
}

/// All-gather on a ring over any layout of `data` (n elements): block `block_at(rank)` is this
/// rank's and already in place. Announced as an all_gather of n elements.
template <communicator Comm, element T, class BlockAt>
failure all_gather_at(Comm& comm, T* data, std::size_t n, BlockAt block_at,
                      const call_options& opts) {
  call c(comm, collective::all_gather, opts);
  c.template describe_data<T>(n);
  if (!c.start()) return c.result();
  if (ring_all_gather(c, reinterpret_cast<std::byte*>(data), [&](int i) {
        const block b = block_at(i);
        return block{b.offset * sizeof(T), b.count * sizeof(T)};
      }))
    c.finish();
  return c.result();
}


/// Ends a stage: true when `f` is a success; else records the failure on `h` (mapped to world
/// ranks, both communicators poisoned) in `out`.
template <class H>
bool stage(H& h, failure& out, failure f, bool rail, std::string_view op) {
  if (!f.code) return true;
  out = h.stage_failed(std::move(f), rail, op);
  return false;
}

inline failure invalid(std::string_view op, std::string what) {
  return {make_error_code(errc::invalid_argument), -1, std::string(op) + ": " + std::move(what)};
}

template <class H, element T, class Op>
failure all_reduce(H& h, const T* in, std::size_t n, T* out, std::size_t out_n, const Op& op,
                   const call_options& opts) {
  constexpr std::string_view name = "all_reduce";
  if (out_n < n)
    return invalid(name, "output holds " + std::to_string(out_n) + " elements, input " +
                             std::to_string(n));
  if (partly_overlap(in, n, static_cast<const T*>(out), out_n))
    return invalid(name, "input and output overlap without being the same buffer");
  if (failure f = h.enter(name, opts); f.code) return f;
  const stage_deadline d(opts, h.timeout());
  const auto so = stage_op<Op, T>(op);
  const int l_size = h.local_size();
  const block b = block_of(n, l_size, h.local_rank());
  T* shard = out + b.offset;
  failure f;
  if (!stage(h, f, detail::reduce_scatter(h.local(), in, n, shard, b.count, so, d.next()), false,
             name) ||
      !stage(h, f, detail::all_reduce(h.rail(), shard, b.count, shard, b.count, so, d.next()),
             true, name))
    return f;
  finalize_in_place(shard, b.count, op, h.size());
  stage(h, f, all_gather_at(h.local(), out, n, [&](int i) { return block_of(n, l_size, i); },
                            d.next()), false, name);
  return f;
}

/// Where world block `w` of the packed layout for reduce_scatter starts: the blocks ordered by
/// local rank, then by host (segment l holds the blocks of every host's local rank l).
struct packed_layout {
  std::size_t n;
  int hosts, l_size;
  block world(int w) const { return block_of(n, hosts * l_size, w); }
  block segment(int l) const {  // the local rank's segment of the packed buffer
    std::size_t off = 0, len = 0;
    for (int j = 0; j <= l; ++j) {
      len = 0;
      for (int h = 0; h < hosts; ++h) len += world(h * l_size + j).count;
      if (j < l) off += len;
    }
    return {off, len};
  }
  block in_segment(int l, int h) const {  // host h's block inside segment l
    std::size_t off = 0;
    for (int k = 0; k < h; ++k) off += world(k * l_size + l).count;
    return {off, world(h * l_size + l).count};
  }
};

template <class H, element T, class Op>
failure reduce_scatter(H& h, const T* in, std::size_t n, T* out, std::size_t out_n, const Op& op,
                       const call_options& opts) {
  constexpr std::string_view name = "reduce_scatter";
  const block mine = block_of(n, h.size(), h.rank());
  const bool in_place = out == in + mine.offset;
  if (out_n < mine.count)
    return invalid(name, "output holds " + std::to_string(out_n) + " elements, this rank's "
                         "block " + std::to_string(mine.count));
  if (!in_place && overlap(in, n, static_cast<const T*>(out), mine.count))
    return invalid(name, "input and output overlap, and output is not this rank's block of input");
  if constexpr (!is_commutative_v<Op>) {
    // Ordered ops: the whole reduction in rank order, then this rank's block.
    T* all = reinterpret_cast<T*>(h.scratch(n * sizeof(T)).data());
    failure f = hier::all_reduce(h, in, n, all, n, op, opts);
    if (!f.code && mine.count > 0) std::memcpy(out, all + mine.offset, mine.count * sizeof(T));
    if (f.what.starts_with("all_reduce")) f.what.replace(0, 10, name);
    return f;
  } else {
    if (failure f = h.enter(name, opts); f.code) return f;
    const stage_deadline d(opts, h.timeout());
    const auto so = stage_op<Op, T>(op);
    const int l_size = h.local_size(), l = h.local_rank(), hosts = h.hosts();
    const packed_layout lay{n, hosts, l_size};
    const block seg = lay.segment(l);
    auto s = h.scratch((n + seg.count) * sizeof(T));
    T* packed = reinterpret_cast<T*>(s.data());
    T* partial = packed + n;
    std::size_t at = 0;
    for (int j = 0; j < l_size; ++j)
      for (int k = 0; k < hosts; ++k) {
        const block b = lay.world(k * l_size + j);
        if (b.count > 0) std::memcpy(packed + at, in + b.offset, b.count * sizeof(T));
        at += b.count;
      }
    failure f;
    if (!stage(h, f, reduce_scatter_at(h.local(), packed, n, partial, so,
                                       [&](int j) { return lay.segment(j); }, d.next()),
               false, name) ||
        !stage(h, f, reduce_scatter_at(h.rail(), partial, seg.count, out, so,
                                       [&](int k) { return lay.in_segment(l, k); }, d.next()),
               true, name))
      return f;
    finalize_in_place(out, mine.count, op, h.size());
    return f;
  }
}

// `in_place`: `out` is the whole buffer of the in-place form, P blocks of n = out_n / P.
template <class H, element T>
failure all_gather(H& h, const T* in, std::size_t n, T* out, std::size_t out_n,
                   const call_options& opts, bool in_place = false) {
  constexpr std::string_view name = "all_gather";
  const int p = h.size(), l_size = h.local_size(), l = h.local_rank(), hosts = h.hosts();
  const std::size_t row = n * sizeof(T);
  if (in_place && out_n % static_cast<std::size_t>(p) != 0)
    return invalid(name, "the buffer holds " + std::to_string(out_n) +
                             " elements, not a multiple of " + std::to_string(p) + " ranks");
  if (out_n / static_cast<std::size_t>(p) < n)
    return invalid(name, "output holds " + std::to_string(out_n) + " elements, " +
                             std::to_string(p) + " ranks x " + std::to_string(n) + " needed");
  if (in != out + n * h.rank() && overlap(in, n, static_cast<const T*>(out), out_n))
    return invalid(name, "input overlaps output without being this rank's block of it");
  if (failure f = h.enter(name, opts); f.code) return f;
  const stage_deadline d(opts, h.timeout());
  // Packed by local rank, then host: the rail gathers segment l, the host gathers the segments.
  T* packed = reinterpret_cast<T*>(h.scratch(row * p).data());
  T* seg = packed + n * static_cast<std::size_t>(l) * hosts;
  if (n > 0) std::memcpy(seg + n * h.host(), in, row);
  failure f;
  if (!stage(h, f, detail::all_gather(h.rail(), seg + n * h.host(), n, seg, n * hosts,
                                      d.next()), true, name) ||
      !stage(h, f, detail::all_gather(h.local(), seg, n * hosts, packed, n * p, d.next()),
             false, name))
    return f;
  if (n > 0)
    for (int j = 0; j < l_size; ++j)
      for (int k = 0; k < hosts; ++k)
        std::memcpy(out + n * (k * l_size + j), packed + n * (j * hosts + k), row);
  return f;
}

// In place: `all` holds P blocks of size / P elements, this rank's already filled.
template <class H, element T>
failure all_gather_in_place(H& h, T* all, std::size_t size, const call_options& opts) {
  const std::size_t n = size / static_cast<std::size_t>(h.size());
  return all_gather(h, all + n * static_cast<std::size_t>(h.rank()), n, all, size, opts, true);
}

template <class H, element T>
failure broadcast(H& h, const T* in, T* data, std::size_t n, int root, const call_options& opts) {
  constexpr std::string_view name = "broadcast";
  if (root < 0 || root >= h.size())
    return invalid(name, "root " + std::to_string(root) + " is not a rank of a group of " +
                             std::to_string(h.size()));
  if (failure f = h.enter(name, opts); f.code) return f;
  const stage_deadline d(opts, h.timeout());
  const int root_host = root / h.local_size(), root_local = root % h.local_size();
  failure f;
  // The root's rail first (the other rails wait), then every host from that local rank.
  if (h.local_rank() == root_local &&
      !stage(h, f, detail::broadcast(h.rail(), in, data, n, root_host, d.next()), true, name))
    return f;
  stage(h, f, detail::broadcast(h.local(), data, data, n, root_local, d.next()), false, name);
  return f;
}

template <class H, class In, class Out>
failure broadcast_buffers(H& h, const In& in, Out& out, int root, const call_options& opts) {
  if (h.rank() == root && std::size(in) < std::size(out))
    return invalid("broadcast", "the root's input holds " + std::to_string(std::size(in)) +
                                    " elements, its output " + std::to_string(std::size(out)));
  return hier::broadcast(h, std::data(in), std::data(out), std::size(out),
                         root, opts);
}

template <class H, element T, class Op>
failure reduce(H& h, const T* in, std::size_t n, T* out, std::size_t out_n, const Op& op,
               int root, const call_options& opts) {
  constexpr std::string_view name = "reduce";
  if (root < 0 || root >= h.size())
    return invalid(name, "root " + std::to_string(root) + " is not a rank of a group of " +
                             std::to_string(h.size()));
  if (h.rank() == root && out_n < n)
    return invalid(name, "output holds " + std::to_string(out_n) + " elements, input " +
                             std::to_string(n));
  if (h.rank() == root && partly_overlap(in, n, static_cast<const T*>(out), out_n))
    return invalid(name, "input and output overlap without being the same buffer");
  if (failure f = h.enter(name, opts); f.code) return f;
  const stage_deadline d(opts, h.timeout());
  const auto so = stage_op<Op, T>(op);
  const int root_host = root / h.local_size(), root_local = root % h.local_size();
  const bool on_rail = h.local_rank() == root_local;
  T* partial = reinterpret_cast<T*>(h.scratch(on_rail ? n * sizeof(T) : 0).data());
  failure f;
  // Each host to its rank of the root's rail, then that rail to the root.
  if (!stage(h, f, detail::reduce(h.local(), in, n, partial, on_rail ? n : 0, so, root_local,
                                  d.next()), false, name))
    return f;
  if (on_rail && !stage(h, f, detail::reduce(h.rail(), partial, n, out, out_n, so, root_host,
                                             d.next()), true, name))
    return f;
  if (h.rank() == root) finalize_in_place(out, n, op, h.size());
  return f;
}

template <class H>
failure barrier(H& h, const call_options& opts) {
  constexpr std::string_view name = "barrier";
  if (failure f = h.enter(name, opts); f.code) return f;
  const stage_deadline d(opts, h.timeout());
  // Past the rail barrier, every rank of every host has passed its host's barrier.
  failure f;
  if (stage(h, f, detail::barrier(h.local(), d.next()), false, name))
    stage(h, f, detail::barrier(h.rail(), d.next()), true, name);
  return f;
}

}  // namespace cohort::detail::hier
