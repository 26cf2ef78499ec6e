/// @file
/// all_gather: every rank ends with every rank's buffer, in rank order.
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

// `in_place`: `out` is the whole buffer of the in-place form, P blocks of n = out_n / P.
template <communicator Comm, element T>
failure all_gather(Comm& comm, const T* in, std::size_t n, T* out, std::size_t out_n,
                   const call_options& opts, bool in_place = false) {
  call c(comm, collective::all_gather, opts);
  c.template describe_data<T>(n);
  const int p = c.size();
  T* mine = out + n * c.rank();
  if (in_place && out_n % p != 0)
    return c.invalid(text("the buffer holds ", out_n, " elements, not a multiple of ", p,
                          " ranks")),
           c.result();
  if (out_n / p < n)
    return c.invalid(text("output holds ", out_n, " elements, ", p, " ranks x ", n, " needed")),
           c.result();
  if (in != mine && overlap(in, n, static_cast<const T*>(out), out_n))
    return c.invalid("input overlaps output without being this rank's block of it"), c.result();
  if (!c.start()) return c.result();
  if (in != mine && n > 0) std::memcpy(mine, in, n * sizeof(T));
  const std::size_t row = n * sizeof(T);
  if (all_gather_rows(c, reinterpret_cast<std::byte*>(out), row))
    c.finish();
  return c.result();
}

template <communicator Comm, element T>
failure all_gather_in_place(Comm& comm, T* all, std::size_t size, const call_options& opts) {
  const std::size_t n = size / static_cast<std::size_t>(comm.size());
  return all_gather(comm, all + n * static_cast<std::size_t>(comm.rank()), n, all, size, opts,
                    true);
}

}  // namespace detail

/// Gathers every rank's `in` (n elements, the same n on every rank) into `out` in rank order:
/// rank i's elements land at out[i*n, (i+1)*n).
///
/// Every rank calls it with the same n and element type; `out` holds at least P*n elements.
/// Schedule: ring, P-1 steps, each rank sending (P-1)*n elements; where P is a power of two
/// over a transport that coalesces sends (TCP), up to 64 KiB per rank, recursive doubling:
/// log2(P) steps, the same elements. Results are bitwise copies, identical on every rank.
/// Throws `cohort::error`.
template <communicator Comm, class In, class Out>
  requires detail::buffer_pair<In, Out>
void all_gather(Comm& comm, const In& in, Out&& out, const call_options& opts = {}) {
  detail::throw_if_failed(detail::all_gather(comm, std::data(in), std::size(in),
                                             std::data(out), std::size(out),
                                             opts), "all_gather");
}

/// As above; reports failure through `ec`, and its sentence through `comm.last_error()`
/// (a bad argument, `errc::invalid_argument`, included: it does not poison).
template <communicator Comm, class In, class Out>
  requires detail::buffer_pair<In, Out>
void all_gather(Comm& comm, const In& in, Out&& out, const call_options& opts,
                std::error_code& ec) {
  ec = detail::error_code_for(comm, detail::all_gather(comm, std::data(in), std::size(in),
                                                       std::data(out), std::size(out), opts));
}

/// In place: `data` holds P blocks of size()/P elements (a size that is not a multiple of P
/// is `errc::invalid_argument`); this rank's block is already filled.
template <communicator Comm, mutable_buffer Data>
void all_gather(Comm& comm, Data&& data, const call_options& opts = {}) {
  detail::throw_if_failed(
      detail::all_gather_in_place(comm, std::data(data), std::size(data), opts), "all_gather");
}

/// In place, reporting failure through `ec`.
template <communicator Comm, mutable_buffer Data>
void all_gather(Comm& comm, Data&& data, const call_options& opts, std::error_code& ec) {
  ec = detail::error_code_for(comm, detail::all_gather_in_place(comm, std::data(data),
                                                                std::size(data), opts));
}

}  // namespace cohort
