/// @file
/// The output of cohort-bench and cohort-bench-mpi: a header that says what was measured and
/// how, then one row per size, as a table, CSV or JSON.
///
/// Bandwidths follow nccl-tests: algbw = bytes / time, where bytes is the full buffer (the
/// output of all_gather, the input of reduce_scatter), and busbw = algbw * factor, with factor
/// 2(P-1)/P for all_reduce, (P-1)/P for reduce_scatter and all_gather and 1 for broadcast, so
/// that busbw compares with the bandwidth of one link whatever P is. GB/s are 1e9 bytes/s.
/// The time is the p50 of the per-iteration samples (see measure.hpp).
#pragma once

#include <cstddef>
#include <cstdio>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include <cohort/core/dtype.hpp>

#include "measure.hpp"
#include "options.hpp"
#include "workload.hpp"

namespace cohort::bench {

/// What a run is, for the header of its output.
struct run_info {
  std::string program;    ///< "cohort-bench" or "cohort-bench-mpi".
  std::string transport;  ///< "shm", "loopback", "open-mpi btl=self,vader", ...
  std::string launch;     ///< How the ranks were started: "fork", "threads", "cohort-run", ...
  int ranks = 1;          ///< The number of ranks.
  std::string host;       ///< `describe_host()`.
  memcpy_ceiling ceiling;  ///< Measured on rank 0 before the first size.
};

/// nccl-tests' bus bandwidth factor of `c` at `ranks` ranks (see the top of this file).
constexpr double bus_factor(collective c, int ranks) noexcept {
  const double p = ranks;
  switch (c) {
    case collective::all_reduce: return 2 * (p - 1) / p;
    case collective::reduce_scatter:
    case collective::all_gather: return (p - 1) / p;
    case collective::broadcast: return 1;
  }
  return 1;
}

/// One row of output: a size, its times, bandwidths and check.
struct size_result {
  std::size_t bytes = 0;             ///< Full-buffer bytes.
  std::size_t count = 0;             ///< Full-buffer elements.
  sample_summary time;               ///< Iterations, p50, p99, minimum.
  double algbw_gbps = 0;             ///< bytes / p50.
  double busbw_gbps = 0;             ///< algbw * bus_factor.
  std::optional<std::size_t> wrong;  ///< Wrong elements (max over ranks); empty if unchecked.
};

/// The row of a case of `s` elements of `elem` bytes, timed as `t`.
inline size_result make_result(collective c, int ranks, const shape& s, std::size_t elem,
                               const sample_summary& t, std::optional<std::size_t> wrong) {
  size_result r{s.count * elem, s.count, t, 0, 0, wrong};
  if (t.p50_us > 0) r.algbw_gbps = static_cast<double>(r.bytes) / (t.p50_us * 1e-6) / 1e9;
  r.busbw_gbps = r.algbw_gbps * bus_factor(c, ranks);
  return r;
}

/// Writes the header, the rows as they come, and the end of the output; rank 0 owns one.
class reporter {
 public:
  /// Writes to `out`, which must outlive this.
  reporter(std::FILE* out, const options& o, run_info run)
      : out_(out), options_(o), run_(std::move(run)) {}

  /// The description of the run; call once, first.
  void header() {
    const auto& o = options_;
    const std::string reduce = reduces(o.op) ? std::string(name_of(o.reduce)) : "";
    if (o.format == output_format::json) {
      const std::string reduce_json = reduce.empty() ? "null" : "\"" + reduce + "\"";
      const std::string root_json =
          o.op == collective::broadcast ? std::to_string(o.root) : "null";
      std::fprintf(out_,
                   "{\"program\": \"%s\", \"collective\": \"%s\", \"dtype\": \"%s\", "
                   "\"reduce\": %s, \"root\": %s, \"ranks\": %d, \"transport\": \"%s\", "
                   "\"launch\": \"%s\", \"host\": \"%s\",\n \"memcpy\": {\"bytes\": %zu, "
                   "\"GBps\": %.3f},\n \"timing\": {\"warmup\": %d, \"budget_ms\": %g, "
                   "\"min_iters\": %d, \"max_iters\": %d}, \"check\": %s,\n \"results\": [",
                   run_.program.c_str(), name_of(o.op).data(), dtype_name(o.type).data(),
                   reduce_json.c_str(), root_json.c_str(),
                   run_.ranks, escaped(run_.transport).c_str(), escaped(run_.launch).c_str(),
                   escaped(run_.host).c_str(), run_.ceiling.bytes, run_.ceiling.gbps,
                   o.warmup, o.budget_ms, o.min_iters, o.max_iters, o.check ? "true" : "false");
      std::fflush(out_);
      return;
    }
    std::string what = std::string(name_of(o.op)) + " " + std::string(dtype_name(o.type));
    if (!reduce.empty()) what += " " + reduce;
    if (o.op == collective::broadcast) what += " from root " + std::to_string(o.root);
    std::fprintf(out_, "# %s: %s, %d ranks, transport %s, started by %s\n", run_.program.c_str(),
                 what.c_str(), run_.ranks, run_.transport.c_str(), run_.launch.c_str());
    std::fprintf(out_, "# host: %s\n", run_.host.c_str());
    std::fprintf(out_, "# memcpy ceiling: %.2f GB/s (one thread, %s, best of repeated copies)\n",
                 run_.ceiling.gbps, format_bytes(run_.ceiling.bytes).c_str());
    std::fprintf(out_,
                 "# timing: %d warmup, then ~%g ms per size (%d..%d iterations) after one "
                 "barrier;\n#   time = one iteration on the slowest rank; algbw = bytes / p50; "
                 "busbw = algbw * %s\n",
                 o.warmup, o.budget_ms, o.min_iters, o.max_iters, factor_text(o.op));
    std::fprintf(out_, "# check: %s\n", o.check ? "one iteration per size against an exact "
                                                  "reference (#wrong elements, max over ranks)"
                                                : "off");
    if (o.format == output_format::csv)
      std::fprintf(out_, "bytes,count,iters,p50_us,p99_us,min_us,algbw_GBps,busbw_GBps,wrong\n");
    else
      std::fprintf(out_, "#%12s %12s %8s %11s %11s %11s %11s %11s %7s\n", "bytes", "count",
                   "iters", "p50_us", "p99_us", "min_us", "algbw_GB/s", "busbw_GB/s", "#wrong");
    std::fflush(out_);
  }

  /// One size; rows come in the order of the sizes.
  void row(const size_result& r) {
    const std::string wrong = r.wrong ? std::to_string(*r.wrong) : "-";
    switch (options_.format) {
      case output_format::table:
        std::fprintf(out_, " %12zu %12zu %8zu %11.2f %11.2f %11.2f %11.3f %11.3f %7s\n",
                     r.bytes, r.count, r.time.iters, r.time.p50_us, r.time.p99_us,
                     r.time.min_us, r.algbw_gbps, r.busbw_gbps, wrong.c_str());
        break;
      case output_format::csv:
        std::fprintf(out_, "%zu,%zu,%zu,%.3f,%.3f,%.3f,%.4f,%.4f,%s\n", r.bytes, r.count,
                     r.time.iters, r.time.p50_us, r.time.p99_us, r.time.min_us, r.algbw_gbps,
                     r.busbw_gbps, r.wrong ? wrong.c_str() : "");
        break;
      case output_format::json:
        std::fprintf(out_,
                     "%s\n  {\"bytes\": %zu, \"count\": %zu, \"iters\": %zu, \"p50_us\": %.3f, "
                     "\"p99_us\": %.3f, \"min_us\": %.3f, \"algbw_GBps\": %.4f, "
                     "\"busbw_GBps\": %.4f, \"wrong\": %s}",
                     rows_ == 0 ? "" : ",", r.bytes, r.count, r.time.iters, r.time.p50_us,
                     r.time.p99_us, r.time.min_us, r.algbw_gbps, r.busbw_gbps,
                     r.wrong ? wrong.c_str() : "null");
        break;
    }
    ++rows_;
    std::fflush(out_);
  }

  /// Ends the output (closes the JSON document).
  void footer() {
    if (options_.format == output_format::json) std::fprintf(out_, "\n]}\n");
    std::fflush(out_);
  }

 private:
  static const char* factor_text(collective c) {
    switch (c) {
      case collective::all_reduce: return "2(P-1)/P";
      case collective::reduce_scatter:
      case collective::all_gather: return "(P-1)/P";
      case collective::broadcast: return "1";
    }
    return "?";
  }

  static std::string escaped(std::string_view s) {
    std::string e;
    for (char c : s) {
      if (c == '"' || c == '\\') e += '\\';
      if (static_cast<unsigned char>(c) >= 0x20) e += c;
    }
    return e;
  }

  std::FILE* out_;
  options options_;
  run_info run_;
  std::size_t rows_ = 0;
};

}  // namespace cohort::bench
