/// @file
/// barrier: no rank leaves before every rank has entered.
#pragma once

#include <system_error>

#include <cohort/collectives/detail/schedules.hpp>
#include <cohort/core/communicator.hpp>

namespace cohort {
namespace detail {

template <communicator Comm>
failure barrier(Comm& comm, const call_options& opts) {
  call c(comm, collective::barrier, opts);
  if (!c.start()) return c.result();
  // An all-gather of one byte: a rank has heard, directly or through the ranks it heard from,
  // from every other rank once its steps are done.
  auto tokens = comm.scratch(static_cast<std::size_t>(c.size()));
  if (all_gather_rows(c, tokens.data(), 1))
    c.finish();
  return c.result();
}

}  // namespace detail

/// Returns once every rank of `comm` has called `barrier`: an all-gather of one byte per rank
/// (log2(P) steps of recursive doubling where all_gather runs it, else P-1 steps on the ring).
/// Throws `cohort::error` on failure.
template <communicator Comm>
void barrier(Comm& comm, const call_options& opts = {}) {
  detail::throw_if_failed(detail::barrier(comm, opts), "barrier");
}

/// As above; reports failure through `ec`, and its sentence through `comm.last_error()`
/// (a bad argument, `errc::invalid_argument`, included: it does not poison).
template <communicator Comm>
void barrier(Comm& comm, const call_options& opts, std::error_code& ec) {
  ec = detail::error_code_for(comm, detail::barrier(comm, opts));
}

}  // namespace cohort
