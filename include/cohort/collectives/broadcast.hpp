/// @file
/// broadcast: every rank ends with the root's buffer.
#pragma once

#include <cstring>
#include <span>
#include <string>
#include <system_error>

#include <cohort/collectives/detail/schedules.hpp>
#include <cohort/core/buffer.hpp>
#include <cohort/core/communicator.hpp>

namespace cohort {
namespace detail {

template <communicator Comm, element T>
failure broadcast(Comm& comm, const T* in, T* data, std::size_t n, int root,
                  const call_options& opts) {
  call c(comm, collective::broadcast, opts);
  c.template describe_data<T>(n);
  c.describe_root(root);
  if (root < 0 || root >= c.size())
    return c.invalid(text("root ", root, " is not a rank of a group of ", c.size())), c.result();
  if (c.rank() == root && partly_overlap(in, n, static_cast<const T*>(data), n))
    return c.invalid("input and output overlap without being the same buffer"), c.result();
  const int p = c.size();
  const std::size_t bytes = n * sizeof(T);
  using tuning::broadcast_schedule;
  const bool tree = tuning::broadcast_choice == broadcast_schedule::tree ||
                    (tuning::broadcast_choice == broadcast_schedule::by_size && p >= 4 &&
                     bytes > deferred_send_bytes<Comm> && bytes <= tuning::tree_broadcast_bytes);
  if (c.rank() == root) c.only_sends(bytes);
  if (!c.start()) return c.result();
  if (c.rank() == root && in != data && n > 0) std::memcpy(data, in, bytes);
  auto* d = reinterpret_cast<std::byte*>(data);
  if (p == 1 || (tree ? tree_broadcast(c, d, bytes, root) : chain_broadcast(c, d, bytes, root)))
    c.finish();
  return c.result();
}

// Out of place: the root's input must hold the output's count. Checked before the call starts
// (no sequence number taken), as the root alone can see it.
template <communicator Comm, class In, class Out>
failure broadcast_buffers(Comm& comm, const In& in, Out& out, int root,
                          const call_options& opts) {
  if (comm.rank() == root && std::size(in) < std::size(out))
    return {make_error_code(errc::invalid_argument), -1,
            text("broadcast: the root's input holds ", std::size(in), " elements, its output ",
                 std::size(out))};
  return detail::broadcast(comm, std::data(in), std::data(out),
                           std::size(out), root, opts);
}

}  // namespace detail

/// Copies the root's `data` into `data` on every other rank.
///
/// Every rank calls it with the same element count, element type and root. Schedule: a
/// pipelined chain root, root+1, ..., root-1 in 256 KiB chunks: P-1 hops of latency, each rank
/// but the last sending the buffer once, so the time approaches one buffer's transfer as the
/// buffer grows. Up to 8 KiB over shared memory, 16 KiB over TCP (the transport's
/// `eager_send_bytes`), the root returns once its bytes are sent, without waiting for the
/// others to enter the call, so that calls overlap; a disagreement it did not see fails its next
/// call, naming both calls. From there up to `tuning::tree_broadcast_bytes` (256 KiB) at four
/// ranks or more, where the chain cannot yet pipeline, a binomial tree instead: ceil(log2 P)
/// hops. Results are bitwise copies. Throws `cohort::error`.
template <communicator Comm, mutable_buffer Data>
void broadcast(Comm& comm, Data&& data, int root, const call_options& opts = {}) {
  detail::throw_if_failed(detail::broadcast(comm, std::data(data), std::data(data),
                                            std::size(data), root, opts), "broadcast");
}

/// As above; reports failure through `ec`, and its sentence through `comm.last_error()`
/// (a bad argument, `errc::invalid_argument`, included: it does not poison).
template <communicator Comm, mutable_buffer Data>
void broadcast(Comm& comm, Data&& data, int root, const call_options& opts, std::error_code& ec) {
  ec = detail::error_code_for(comm, detail::broadcast(comm, std::data(data), std::data(data),
                                                      std::size(data), root, opts));
}

/// Out of place: the root sends `in`; every rank, the root included, receives into `out`
/// (`in` is read on the root only; `out.size()` elements move).
template <communicator Comm, class In, class Out>
  requires detail::buffer_pair<In, Out>
void broadcast(Comm& comm, const In& in, Out&& out, int root, const call_options& opts = {}) {
  detail::throw_if_failed(detail::broadcast_buffers(comm, in, out, root, opts), "broadcast");
}

/// As above; reports failure through `ec`, and its sentence through `comm.last_error()`
/// (a bad argument, `errc::invalid_argument`, included: it does not poison).
template <communicator Comm, class In, class Out>
  requires detail::buffer_pair<In, Out>
void broadcast(Comm& comm, const In& in, Out&& out, int root, const call_options& opts,
               std::error_code& ec) {
  ec = detail::error_code_for(comm, detail::broadcast_buffers(comm, in, out, root, opts));
}

}  // namespace cohort
