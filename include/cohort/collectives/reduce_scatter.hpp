/// @file
/// reduce_scatter: the reduction of every rank's buffer, split into P blocks, one per rank.
#pragma once

#include <cstring>
#include <span>
#include <string>
#include <system_error>

#include <cohort/collectives/all_reduce.hpp>
#include <cohort/collectives/detail/schedules.hpp>
#include <cohort/core/buffer.hpp>
#include <cohort/core/communicator.hpp>
#include <cohort/core/ops.hpp>

namespace cohort {

namespace detail {

// `out == in + own block` means in place: the input's blocks are the ring's workspace.
template <communicator Comm, element T, class Op>
failure reduce_scatter(Comm& comm, const T* in, std::size_t n, T* out, std::size_t out_n,
                       const Op& op, const call_options& opts) {
  call c(comm, collective::reduce_scatter, opts);
  c.template describe_data<T>(n);
  c.template describe_op<Op>();
  const int p = c.size();
  const block mine = block_of(n, p, c.rank());
  const bool in_place = out == in + mine.offset;
  if (out_n < mine.count)
    return c.invalid(text("output holds ", out_n, " elements, this rank's block ", mine.count)),
           c.result();
  if (!in_place && overlap(in, n, static_cast<const T*>(out), mine.count))
    return c.invalid("input and output overlap, and output is not this rank's block of input"),
           c.result();
  if (!c.start()) return c.result();
  bool ok = true;
  if (p == 1) {
    finalize(in, out, n, op, 1);
  } else if (const std::size_t bytes = n * sizeof(T);
             bytes <= tuning::doubling_reduce_scatter_bytes && gathers_by_doubling(c, bytes)) {
    // Few bytes over log2(P) hops: every input gathered, this rank's block reduced locally.
    ok = gather_reduce(c, in, n, mine, out, op);
  } else if constexpr (!is_commutative_v<Op>) {
    // Ordered ops: reduce everything in rank order, then keep this rank's block.
    auto all = comm.scratch(n * sizeof(T) + chain_reduce_scratch);
    T* full = reinterpret_cast<T*>(all.data() + chain_reduce_scratch);
    ok = chain_reduce(c, in, full, n, op, 0, all.first(chain_reduce_scratch)) &&
         chain_broadcast(c, reinterpret_cast<std::byte*>(full), n * sizeof(T), p - 1);
    if (ok && mine.count > 0) std::memcpy(out, full + mine.offset, mine.count * sizeof(T));
  } else if (in_place) {
    T* work = const_cast<T*>(in);  // the caller passed it as mutable
    ok = ring_reduce_scatter(c, in, n, op, [&](int, block b) { return work + b.offset; },
                             comm.scratch(staging_bytes));
  } else {
    // Two blocks in flight at a time: the one being sent and the one being reduced.
    const std::size_t half = (n / p + 1) * sizeof(T);
    auto s = comm.scratch(2 * half + staging_bytes);
    T* work[2] = {reinterpret_cast<T*>(s.data()), reinterpret_cast<T*>(s.data() + half)};
    ok = ring_reduce_scatter(c, in, n, op, [&](int step, block) {
      return step + 2 == p ? out : work[step % 2];
    }, s.subspan(2 * half));
  }
  if (ok) c.finish();
  return c.result();
}

template <class In, class Out, class Op>
concept reduce_scatter_args = buffer_pair<In, Out> && reduction_for<Op, buffer_element_t<Out>>;

}  // namespace detail

/// Reduces `in` (n elements, the same n on every rank) across all ranks with `op` and leaves
/// block `rank` of the result (`block_of(n, size, rank)`) in `out`.
///
/// Every rank calls it with the same n, element type and op; `out` holds at least this rank's
/// block. Schedule: ring, P-1 steps, each rank sending (P-1)/P of the buffer; ordered ops go
/// through a rank-order chain. Where P is a power of two over a transport that coalesces sends
/// (TCP), up to 4 KiB: every rank's buffer gathered by recursive doubling (log2(P) steps) and
/// this rank's block reduced locally, in rank order. Determinism as in `all_reduce`: each
/// block is combined in an order fixed by P, so the result does not depend on timing. Throws
/// `cohort::error`.
template <communicator Comm, class In, class Out, class Op>
  requires detail::reduce_scatter_args<In, Out, Op>
void reduce_scatter(Comm& comm, const In& in, Out&& out, const Op& op,
                    const call_options& opts = {}) {
  detail::throw_if_failed(
      detail::reduce_scatter(comm, std::data(in), std::size(in),
                             std::data(out), std::size(out), op, opts),
      "reduce_scatter");
}

/// As above; reports failure through `ec`, and its sentence through `comm.last_error()`
/// (a bad argument, `errc::invalid_argument`, included: it does not poison).
template <communicator Comm, class In, class Out, class Op>
  requires detail::reduce_scatter_args<In, Out, Op>
void reduce_scatter(Comm& comm, const In& in, Out&& out, const Op& op, const call_options& opts,
                    std::error_code& ec) {
  ec = detail::error_code_for(comm, detail::reduce_scatter(comm, std::data(in), std::size(in),
                                                           std::data(out), std::size(out), op,
                                                           opts));
}

/// In place: on return, this rank's block of `data` holds its block of the result; the rest of
/// `data` is unspecified.
template <communicator Comm, mutable_buffer Data, class Op>
  requires reduction_for<Op, buffer_element_t<Data>>
void reduce_scatter(Comm& comm, Data&& data, const Op& op, const call_options& opts = {}) {
  const block b = block_of(std::size(data), comm.size(), comm.rank());
  std::span all(data);
  reduce_scatter(comm, all, all.subspan(b.offset, b.count), op, opts);
}

/// In place, reporting failure through `ec`.
template <communicator Comm, mutable_buffer Data, class Op>
  requires reduction_for<Op, buffer_element_t<Data>>
void reduce_scatter(Comm& comm, Data&& data, const Op& op, const call_options& opts,
                    std::error_code& ec) {
  const block b = block_of(std::size(data), comm.size(), comm.rank());
  std::span all(data);
  reduce_scatter(comm, all, all.subspan(b.offset, b.count), op, opts, ec);
}

}  // namespace cohort
