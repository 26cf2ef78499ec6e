/// @file
/// The benchmark both programs run, over any group of ranks and any way of calling the
/// collective: the loop over sizes, the check, the timing and the report. Only the call itself
/// differs between cohort-bench and cohort-bench-mpi.
#pragma once

#include <cstddef>
#include <cstdio>
#include <optional>
#include <span>
#include <string>

#include <cohort/core/dtype.hpp>
#include <cohort/core/ops.hpp>

#include "measure.hpp"
#include "options.hpp"
#include "report.hpp"
#include "workload.hpp"

namespace cohort::bench {

/// Calls `f.template operator()<T>(op)` with the element type `T` that `o.type` names and the
/// reduction object `o.reduce` names (sum for collectives that do not reduce), and returns its
/// result.
template <class F>
int visit_types(const options& o, F&& f) {
  const reduction r = reduces(o.op) ? o.reduce : reduction::sum;
  auto with_element = [&]<element T>() -> int {
    switch (r) {
      case reduction::sum: return f.template operator()<T>(ops::sum);
      case reduction::prod: return f.template operator()<T>(ops::prod);
      case reduction::min: return f.template operator()<T>(ops::min);
      case reduction::max: return f.template operator()<T>(ops::max);
      case reduction::avg:
        if constexpr (reduction_for<ops::avg_t, T>) return f.template operator()<T>(ops::avg);
        else break;
    }
    throw usage_error("--reduce " + std::string(name_of(r)) + " does not apply to --dtype " +
                      std::string(dtype_name(o.type)));
  };
  switch (o.type) {
    case dtype::f32: return with_element.template operator()<float>();
    case dtype::f64: return with_element.template operator()<double>();
    case dtype::i32: return with_element.template operator()<std::int32_t>();
    case dtype::fp16: return with_element.template operator()<fp16>();
    case dtype::bf16: return with_element.template operator()<bf16>();
    default: break;
  }
  throw usage_error("--dtype " + std::string(dtype_name(o.type)) + " is not offered");
}

/// Runs every size of `o` on `g` with elements `T` and reduction `op`; rank 0 reports through
/// `rep` (null on the other ranks). Every rank of `g` calls it with the same arguments.
///
/// `invoke(in, out)` calls the collective once on this rank: `in` is a `std::span<const T>`,
/// `out` a `std::span<T>`, sized as `shape_of` says; broadcast works in place on `out`.
/// Per size: fresh buffers, one checked call (with `o.check`), then `time_iterations`.
/// Returns the number of sizes whose check failed, the same on every rank.
template <element T, rank_group G, class Op, class Invoke>
int run_benchmark(G& g, const options& o, const Op& op, Invoke&& invoke, reporter* rep) {
  const timing t{o.warmup, o.budget_ms, o.min_iters, o.max_iters};
  if (rep != nullptr) rep->header();
  int failed = 0;
  std::size_t last_count = 0;
  for (const std::size_t bytes : o.sizes) {
    const case_info c{o.op, o.reduce, g.rank(), g.size(), o.root,
                      shape_of(o.op, bytes, sizeof(T), g.size())};
    if (c.s.count == last_count) continue;  // rounding to whole elements made it a repeat
    last_count = c.s.count;

    buffers<T> b = make_buffers<T>(c);
    auto once = [&] { invoke(std::span<const T>(b.in), std::span<T>(b.out)); };

    std::optional<std::size_t> wrong;
    if (o.check) {
      once();
      std::string first;
      double w = static_cast<double>(count_wrong<T>(c, op, b.out, first));
      if (w > 0)
        std::fprintf(stderr, "rank %d: %s of %zu bytes: %zu wrong elements; %s\n", c.rank,
                     name_of(o.op).data(), c.s.count * sizeof(T), static_cast<std::size_t>(w),
                     first.c_str());
      g.max_over_ranks(std::span(&w, 1));
      wrong = static_cast<std::size_t>(w);
      if (w > 0) ++failed;
    }

    const sample_summary s = time_iterations(g, once, t);
    if (rep != nullptr) rep->row(make_result(o.op, g.size(), c.s, sizeof(T), s, wrong));
  }
  if (rep != nullptr) rep->footer();
  return failed;
}

}  // namespace cohort::bench
