/// @file
/// Local SGD: ranks step on their own and average their parameters every few steps.
///
/// Synchronous (one blocking all_reduce on the calling thread), so it needs no Asio and no
/// progress thread: a helper over the collectives, as gradient bucketing (async/) is over the
/// async layer.
#pragma once

#include <span>
#include <string>

#include <cohort/collectives/all_reduce.hpp>
#include <cohort/core/communicator.hpp>
#include <cohort/core/error.hpp>
#include <cohort/core/ops.hpp>
#include <cohort/core/options.hpp>

namespace cohort {

/// Local SGD: ranks step on their own and average their parameters every `period` steps.
///
/// Every rank calls `after_step` after each of its optimizer steps, with parameters of the
/// same size; on every `period`-th call all ranks average them (`all_reduce` with `ops::avg`,
/// bitwise identical on every rank).
template <communicator Comm>
class local_sgd {
 public:
  /// Averages every `period` steps. Throws `cohort::error` (`errc::invalid_argument`,
  /// operation "local_sgd") when `period` < 1.
  explicit local_sgd(int period) : period_(period) {
    if (period < 1)
      throw error(make_error_code(errc::invalid_argument), "local_sgd", -1,
                  "local_sgd: period " + std::to_string(period) + " < 1");
  }
  /// Call after each optimizer step; averages `params` across ranks on every `period`-th call
  /// and returns whether it did. Throws what `all_reduce` throws.
  bool after_step(Comm& comm, std::span<float> params, const call_options& opts = {}) {
    if (++steps_ % period_ != 0) return false;
    all_reduce(comm, params, ops::avg, opts);
    return true;
  }

 private:
  int period_;
  long steps_ = 0;
};

}  // namespace cohort
