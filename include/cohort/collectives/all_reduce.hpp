/// @file
/// all_reduce: every rank ends with the reduction of every rank's buffer.
#pragma once

#include <cstring>
#include <span>
#include <string>
#include <system_error>

#include <cohort/collectives/detail/schedules.hpp>
#include <cohort/collectives/detail/tuning.hpp>
#include <cohort/core/buffer.hpp>
#include <cohort/core/communicator.hpp>
#include <cohort/core/ops.hpp>

namespace cohort {
namespace detail {

// Gathers every rank's n elements (`all_gather_rows`) and reduces elements [b.offset,
// b.offset + b.count) in rank order into out[0, b.count): one accumulation in accumulator_t<T>
// and one rounding per element, the same on every rank. `in` and `out` may alias.
template <class Call, element T, class Op>
bool gather_reduce(Call& c, const T* in, std::size_t n, block b, T* out, const Op& op) {
  const int p = c.size();
  const std::size_t row = n * sizeof(T);
  auto rows = c.comm().scratch(row * p);
  if (n > 0) std::memcpy(rows.data() + row * c.rank(), in, row);
  if (!all_gather_rows(c, rows.data(), row)) return false;
  const T* x = reinterpret_cast<const T*>(rows.data()) + b.offset;
  const std::size_t k = b.count;
  if constexpr (std::same_as<accumulator_t<T>, T>) {
    // Row by row, so the loops vectorize; the same order and roundings as one element at a time.
    if (p == 2) {
      combine_last(x, x + n, out, k, op, p);
    } else {
      combine(x, x + n, out, k, op);
      for (int q = 2; q + 1 < p; ++q) combine(out, x + q * n, out, k, op);
      combine_last(out, x + (p - 1) * n, out, k, op, p);
    }
  } else {
    // 16-bit floats: each element accumulated in fp32 over the rows in rank order and rounded
    // once, a block at a time through the bulk conversions, which vectorize (with F16C where
    // the CPU has it).
    static_assert(is_16bit_float<T>);
    float acc[widen_block], next[widen_block];
    for (std::size_t i = 0; i < k; i += widen_block) {
      const std::size_t m = min_of(widen_block, k - i);
      widen_n(x + i, acc, m);
      for (int q = 1; q < p; ++q) {
        widen_n(x + q * n + i, next, m);
        for (std::size_t j = 0; j < m; ++j) acc[j] = op(acc[j], next[j]);
      }
      if constexpr (finalizing_reduction_for<Op, T>) {
        for (std::size_t j = 0; j < m; ++j) acc[j] = op.finalize(acc[j], p);
      }
      narrow_n(acc, out + i, m);
    }
  }
  return true;
}

template <communicator Comm, element T, class Op>
failure all_reduce(Comm& comm, const T* in, std::size_t n, T* out, std::size_t out_n,
                   const Op& op, const call_options& opts) {
  call c(comm, collective::all_reduce, opts);
  c.template describe_data<T>(n);
  c.template describe_op<Op>();
  if (out_n < n)
    return c.invalid(text("output holds ", out_n, " elements, input ", n)), c.result();
  if (partly_overlap(in, n, out, out_n))
    return c.invalid("input and output overlap without being the same buffer"), c.result();
  if (!c.start()) return c.result();
  const int p = c.size();
  bool ok = true;
  if (p == 1) {
    finalize(in, out, n, op, 1);
  } else if (const std::size_t bytes = n * sizeof(T);
             bytes <= tuning::small_all_reduce_bytes ||
             (bytes <= tuning::doubling_all_reduce_bytes && gathers_by_doubling(c, bytes))) {
    ok = gather_reduce(c, in, n, block{0, n}, out, op);
  } else if constexpr (!is_commutative_v<Op>) {
    ok = chain_reduce(c, in, out, n, op, 0, comm.scratch(chain_reduce_scratch)) &&
         chain_broadcast(c, reinterpret_cast<std::byte*>(out), n * sizeof(T), p - 1);
  } else {
    auto staging = comm.scratch(staging_bytes);
    ok = ring_reduce_scatter(c, in, n, op, [&](int, block b) { return out + b.offset; }, staging) &&
         ring_all_gather(c, reinterpret_cast<std::byte*>(out), [&](int i) {
           const block b = block_of(n, p, i);
           return block{b.offset * sizeof(T), b.count * sizeof(T)};
         });
  }
  if (ok) c.finish();
  return c.result();
}

template <class In, class Out, class Op>
concept all_reduce_args = buffer_pair<In, Out> && reduction_for<Op, buffer_element_t<Out>>;

}  // namespace detail

/// Reduces `in` across all ranks with `op`; every rank receives the result in `out`.
///
/// Every rank of `comm` calls it, with the same element count, element type and op.
/// `out` holds at least `in.size()` elements; `in` and `out` may be the same buffer.
/// Schedule: above 4 KiB, a ring reduce-scatter then a ring all-gather, 2(P-1) steps, each
/// rank sending 2(P-1)/P of the buffer, pipelined in 256 KiB chunks; up to 4 KiB, the ranks
/// gather every buffer (P-1 steps) and reduce locally. Where P is a power of two over a
/// transport that coalesces sends (TCP), the gather runs by recursive doubling (log2(P)
/// steps), and up to 32 KiB (`tuning::doubling_all_reduce_bytes`). An op that does not
/// commute is combined in rank order 0..P-1, through a chain reduce and a chain broadcast.
/// Determinism: the combination order is fixed by P, n and the rank, never by timing, so every
/// rank gets bitwise the same result, and repeated calls the same result. fp16 and bf16 are
/// combined in fp32 and rounded once per step. Throws `cohort::error` on failure.
template <communicator Comm, class In, class Out, class Op>
  requires detail::all_reduce_args<In, Out, Op>
void all_reduce(Comm& comm, const In& in, Out&& out, const Op& op, const call_options& opts = {}) {
  detail::throw_if_failed(detail::all_reduce(comm, std::data(in), std::size(in),
                                             std::data(out), std::size(out), op,
                                             opts), "all_reduce");
}

/// As above; reports failure through `ec`, and its sentence through `comm.last_error()`
/// (a bad argument, `errc::invalid_argument`, included: it does not poison).
template <communicator Comm, class In, class Out, class Op>
  requires detail::all_reduce_args<In, Out, Op>
void all_reduce(Comm& comm, const In& in, Out&& out, const Op& op, const call_options& opts,
                std::error_code& ec) {
  ec = detail::error_code_for(comm, detail::all_reduce(comm, std::data(in), std::size(in),
                                                       std::data(out), std::size(out), op, opts));
}

/// As above, with the communicator's default deadline.
template <communicator Comm, class In, class Out, class Op>
  requires detail::all_reduce_args<In, Out, Op>
void all_reduce(Comm& comm, const In& in, Out&& out, const Op& op, std::error_code& ec) {
  all_reduce(comm, in, out, op, call_options{}, ec);
}

/// In place: reduces `data` across all ranks and leaves the result in `data`.
template <communicator Comm, mutable_buffer Data, class Op>
  requires reduction_for<Op, buffer_element_t<Data>>
void all_reduce(Comm& comm, Data&& data, const Op& op, const call_options& opts = {}) {
  all_reduce(comm, std::span(data), std::span(data), op, opts);
}

/// In place, reporting failure through `ec`.
template <communicator Comm, mutable_buffer Data, class Op>
  requires reduction_for<Op, buffer_element_t<Data>>
void all_reduce(Comm& comm, Data&& data, const Op& op, const call_options& opts,
                std::error_code& ec) {
  all_reduce(comm, std::span(data), std::span(data), op, opts, ec);
}

/// In place, reporting failure through `ec`, with the default deadline.
template <communicator Comm, mutable_buffer Data, class Op>
  requires reduction_for<Op, buffer_element_t<Data>>
void all_reduce(Comm& comm, Data&& data, const Op& op, std::error_code& ec) {
  all_reduce(comm, std::span(data), std::span(data), op, call_options{}, ec);
}

}  // namespace cohort
