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
  // A ring all-gather of one byte: a rank has heard, directly or through its left neighbours,
  // from every other rank once its P-1 steps are done.
  auto tokens = comm.scratch(static_cast<std::size_t>(c.size()));
  if (ring_all_gather(c, tokens.data(), [](int i) { return block{static_cast<std::size_t>(i), 1}; }))
    c.finish();
  return c.result();
}

}  // namespace detail

/// Returns once every rank of `comm` has called `barrier`. P-1 steps of one byte each, on the
/// ring. Throws `cohort::error` on failure.
template <communicator Comm>
void barrier(Comm& comm, const call_options& opts = {}) {
  detail::throw_if_failed(detail::barrier(comm, opts), "barrier");
}

/// As above; reports failure through `ec` (details in `comm.last_failure()`).
template <communicator Comm>
void barrier(Comm& comm, const call_options& opts, std::error_code& ec) {
  ec = detail::barrier(comm, opts).code;
}

}  // namespace cohort
