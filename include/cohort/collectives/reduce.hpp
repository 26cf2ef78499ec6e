/// @file
/// reduce: the root ends with the reduction of every rank's buffer.
#pragma once

#include <span>
#include <string>
#include <system_error>

#include <cohort/collectives/detail/schedules.hpp>
#include <cohort/core/buffer.hpp>
#include <cohort/core/communicator.hpp>
#include <cohort/core/ops.hpp>

namespace cohort {
namespace detail {

template <communicator Comm, element T, class Op>
failure reduce(Comm& comm, const T* in, std::size_t n, T* out, std::size_t out_n, const Op& op,
               int root, const call_options& opts) {
  call c(comm, collective::reduce, opts);
  c.template describe_data<T>(n);
  c.template describe_op<Op>();
  c.describe_root(root);
  const int p = c.size(), r = c.rank();
  if (root < 0 || root >= p)
    return c.invalid(text("root ", root, " is not a rank of a group of ", p)), c.result();
  if (r == root && out_n < n)
    return c.invalid(text("output holds ", out_n, " elements, input ", n)), c.result();
  if (r == root && partly_overlap(in, n, static_cast<const T*>(out), out_n))
    return c.invalid("input and output overlap without being the same buffer"), c.result();
  // The chain's first rank only sends (commutative ops; see below).
  if (is_commutative_v<Op> && p > 1 && r == (root + 1) % p) c.only_sends(n * sizeof(T));
  if (!c.start()) return c.result();
  bool ok = true;
  if (p == 1) {
    finalize(in, out, n, op, 1);
  } else if constexpr (is_commutative_v<Op>) {
    // The chain root+1, ..., root ends at the root.
    ok = chain_reduce(c, in, out, n, op, (root + 1) % p, comm.scratch(chain_reduce_scratch));
  } else {
    // Rank order 0..P-1 ends at P-1, which hands the result to the root.
    auto s = comm.scratch(chain_reduce_scratch + (r == p - 1 ? n * sizeof(T) : 0));
    T* result = r == root ? out : reinterpret_cast<T*>(s.data() + chain_reduce_scratch);
    ok = chain_reduce(c, in, result, n, op, 0, s.first(chain_reduce_scratch));
    if (ok && root != p - 1 && n > 0) {
      if (r == p - 1) {
        auto req = c.transport().send(root, bytes_of(result, n));
        ok = c.wait(req, root);
      } else if (r == root) {
        ok = recv_into(c, p - 1, writable_bytes_of(out, n));
      }
    }
  }
  if (ok) c.finish();
  return c.result();
}

template <class In, class Out, class Op>
concept reduce_args = buffer_pair<In, Out> && reduction_for<Op, buffer_element_t<Out>>;

}  // namespace detail

/// Reduces `in` across all ranks with `op` into `out` on the root; `out` is not touched on
/// the other ranks (pass an empty span there if you like).
///
/// Every rank calls it with the same count, element type, op and root. Schedule: a pipelined
/// chain root+1, ..., root in 256 KiB chunks, each rank but the root sending the buffer once;
/// ordered ops run the chain 0..P-1 and hand the result to the root. The combination order is
/// fixed, so the result does not depend on timing. Up to the transport's `eager_send_bytes`
/// (8 KiB over shared memory, 16 KiB over TCP), the chain's first rank (commutative ops)
/// returns once its bytes are sent; a disagreement it did not see fails its next call. Throws
/// `cohort::error`.
template <communicator Comm, class In, class Out, class Op>
  requires detail::reduce_args<In, Out, Op>
void reduce(Comm& comm, const In& in, Out&& out, const Op& op, int root,
            const call_options& opts = {}) {
  detail::throw_if_failed(detail::reduce(comm, std::data(in), std::size(in),
                                         std::data(out), std::size(out), op, root,
                                         opts), "reduce");
}

/// As above; reports failure through `ec`, and its sentence through `comm.last_error()`
/// (a bad argument, `errc::invalid_argument`, included: it does not poison).
template <communicator Comm, class In, class Out, class Op>
  requires detail::reduce_args<In, Out, Op>
void reduce(Comm& comm, const In& in, Out&& out, const Op& op, int root,
            const call_options& opts, std::error_code& ec) {
  ec = detail::error_code_for(comm, detail::reduce(comm, std::data(in), std::size(in),
                                                   std::data(out), std::size(out), op, root, opts));
}

/// In place: the root's `data` receives the result; other ranks' `data` is left as it was.
template <communicator Comm, mutable_buffer Data, class Op>
  requires reduction_for<Op, buffer_element_t<Data>>
void reduce(Comm& comm, Data&& data, const Op& op, int root, const call_options& opts = {}) {
  reduce(comm, std::span(data), std::span(data), op, root, opts);
}

/// In place, reporting failure through `ec`.
template <communicator Comm, mutable_buffer Data, class Op>
  requires reduction_for<Op, buffer_element_t<Data>>
void reduce(Comm& comm, Data&& data, const Op& op, int root, const call_options& opts,
            std::error_code& ec) {
  reduce(comm, std::span(data), std::span(data), op, root, opts, ec);
}

}  // namespace cohort
