/// @file
/// The command line of cohort-bench and cohort-bench-mpi. One parser serves both, so that the
/// two programs take the same options and describe a run in the same words.
#pragma once

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <iterator>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include <cohort/core/dtype.hpp>

namespace cohort::bench {

/// The collective a run measures.
enum class collective { all_reduce, reduce_scatter, all_gather, broadcast };
/// The reduction of all_reduce and reduce_scatter.
enum class reduction { sum, prod, min, max, avg };
/// How results are printed.
enum class output_format { table, csv, json };

inline constexpr std::string_view collective_names[] = {"all_reduce", "reduce_scatter",
                                                        "all_gather", "broadcast"};
inline constexpr std::string_view reduction_names[] = {"sum", "prod", "min", "max", "avg"};
inline constexpr std::string_view format_names[] = {"table", "csv", "json"};
/// The element types offered, in the order the usage text lists them.
inline constexpr dtype offered_dtypes[] = {dtype::f32, dtype::f64, dtype::i32, dtype::fp16,
                                           dtype::bf16};

/// The name of `c` as the command line spells it, e.g. "all_reduce".
constexpr std::string_view name_of(collective c) noexcept {
  return collective_names[static_cast<int>(c)];
}
/// The name of `r` as the command line spells it, e.g. "sum".
constexpr std::string_view name_of(reduction r) noexcept {
  return reduction_names[static_cast<int>(r)];
}
/// True for the collectives that take a reduction.
constexpr bool reduces(collective c) noexcept {
  return c == collective::all_reduce || c == collective::reduce_scatter;
}

/// A command-line mistake; the message names the option and says what is wrong.
struct usage_error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// Everything one run is asked to do.
struct options {
  collective op = collective::all_reduce;     ///< --op
  dtype type = dtype::f32;                    ///< --dtype
  reduction reduce = reduction::sum;          ///< --reduce (all_reduce, reduce_scatter)
  std::vector<std::size_t> sizes;             ///< Requested full-buffer sizes in bytes, ascending.
  int ranks = 0;                              ///< --ranks; 0 when not given.
  std::string transport;                      ///< --transport; empty when not given.
  int root = 0;                               ///< --root (broadcast).
  int warmup = 5;                             ///< --warmup: calls per size before timing (>= 1).
  double budget_ms = 100;                     ///< --budget-ms: timed time per size.
  int min_iters = 10;                         ///< --min-iters
  int max_iters = 10'000;                     ///< --max-iters
  output_format format = output_format::table;  ///< --format
  bool check = true;                          ///< --check / --no-check
  bool help = false;                          ///< -h / --help
};

/// A byte count: digits, then optionally K, M or G (powers of 1024, any case), then optionally
/// "B" or "iB": "4", "1K", "64KiB", "16M", "1G". Nullopt for anything else or on overflow.
inline std::optional<std::size_t> parse_bytes(std::string_view text) {
  std::size_t value = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc{} || end == text.data()) return std::nullopt;
  std::string_view unit(end, static_cast<std::size_t>(text.data() + text.size() - end));
  int shift = 0;
  if (!unit.empty()) {
    switch (unit.front()) {
      case 'k': case 'K': shift = 10; break;
      case 'm': case 'M': shift = 20; break;
      case 'g': case 'G': shift = 30; break;
      default: break;
    }
    if (shift != 0) unit.remove_prefix(1);
    if (unit == "iB" && shift != 0) unit = {};
    if (unit == "B" || unit == "b") unit = {};
    if (!unit.empty()) return std::nullopt;
  }
  if (value > (SIZE_MAX >> shift)) return std::nullopt;
  return value << shift;
}

/// `bytes` for a person: "4 B", "64 KiB", "1.5 MiB".
inline std::string format_bytes(std::size_t bytes) {
  constexpr std::string_view units[] = {"B", "KiB", "MiB", "GiB"};
  double v = static_cast<double>(bytes);
  int u = 0;
  while (v >= 1024 && u < 3) v /= 1024, ++u;
  char text[32];
  std::snprintf(text, sizeof text, v == std::floor(v) ? "%.0f %s" : "%.1f %s", v,
                units[u].data());
  return text;
}

/// begin, begin*factor, begin*factor^2, ... up to end, each rounded to whole bytes.
inline std::vector<std::size_t> geometric_sizes(std::size_t begin, std::size_t end,
                                                double factor) {
  std::vector<std::size_t> sizes;
  for (double s = static_cast<double>(begin); s <= static_cast<double>(end) * (1 + 1e-9);
       s *= factor) {
    const auto bytes = static_cast<std::size_t>(std::llround(s));
    if (sizes.empty() || sizes.back() != bytes) sizes.push_back(bytes);
    if (factor <= 1) break;
  }
  return sizes;
}

/// The usage text; `with_transport` adds --transport (cohort-bench, not the MPI peer).
inline std::string usage(std::string_view program, bool with_transport) {
  std::string text = "usage: " + std::string(program) + " [options]\n\n";
  text += with_transport
              ? "Times cohort's collectives, nccl-tests style. With --ranks P it starts P ranks\n"
                "itself (threads for loopback, processes for shm); under cohort-run, mpirun or\n"
                "torchrun it joins the job as one rank (shm).\n\n"
              : "Times Open MPI's collectives with the method and output of cohort-bench.\n"
                "Run it under mpirun; the MPI transport is chosen with mpirun's --mca options.\n\n";
  text +=
      "  --op NAME           all_reduce (default), reduce_scatter, all_gather, broadcast\n"
      "  --dtype NAME        f32 (default), f64, i32, fp16, bf16\n"
      "  --reduce NAME       sum (default), prod, min, max, avg (avg: floating dtypes)\n"
      "  -b, --begin BYTES   smallest full-buffer size (default 4); K, M, G suffixes\n"
      "  -e, --end BYTES     largest size (default 64M)\n"
      "  -f, --factor X      ratio between successive sizes (default 2)\n"
      "  --sizes LIST        explicit sizes instead of -b/-e/-f, e.g. 4,1K,64K,1M\n"
      "  --root R            root of broadcast (default 0)\n";
  text += with_transport
              ? "  --ranks P           ranks to start (default 2); under a launcher, its count\n"
                "  --transport NAME    loopback (threads), shm (processes; the default when\n"
                "                      this build has it), mpi (under mpirun, in a build\n"
                "                      with MPI), tcp or hier (shm in a host, TCP between\n"
                "                      hosts; both under a launcher, in a build with Asio)\n"
              : "  --ranks P           fails unless mpirun started exactly P ranks\n";
  text +=
      "  --warmup N          warmup calls per size, at least 1; they size the timed\n"
      "                      block and are not reported (default 5)\n"
      "  --budget-ms MS      time the timed iterations of one size aim at (default 100)\n"
      "  --min-iters N       fewest timed iterations per size (default 10)\n"
      "  --max-iters N       most timed iterations per size (default 10000)\n"
      "  --format NAME       table (default), csv, json\n"
      "  --check, --no-check verify one iteration per size against an exact reference\n"
      "                      (default on)\n"
      "  -h, --help          print this text\n\n"
      "Sizes are full buffers, as in nccl-tests: all_gather's output, reduce_scatter's input.\n"
      "Exit status: 0 when every check passed, 1 when one failed or a rank failed, 2 on bad\n"
      "arguments.\n";
  return text;
}

namespace detail {

template <std::size_t N>
std::size_t index_of(std::string_view option, std::string_view value,
                     const std::string_view (&names)[N]) {
  for (std::size_t i = 0; i < N; ++i)
    if (names[i] == value) return i;
  std::string known;
  for (auto n : names) known += (known.empty() ? "" : ", ") + std::string(n);
  throw usage_error(std::string(option) + ": unknown value '" + std::string(value) +
                    "' (one of " + known + ")");
}

inline long long parse_integer(std::string_view option, std::string_view value, long long min,
                               long long max) {
  long long v = 0;
  auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), v);
  if (ec != std::errc{} || end != value.data() + value.size() || v < min || v > max)
    throw usage_error(std::string(option) + ": '" + std::string(value) +
                      "' is not an integer in [" + std::to_string(min) + ", " +
                      std::to_string(max) + "]");
  return v;
}

inline std::size_t parse_size(std::string_view option, std::string_view value) {
  auto bytes = parse_bytes(value);
  if (!bytes || *bytes == 0)
    throw usage_error(std::string(option) + ": '" + std::string(value) +
                      "' is not a positive byte count (like 4, 64K, 16M, 1G)");
  return *bytes;
}

}  // namespace detail

/// Parses the command line; throws `usage_error`. `with_transport` accepts --transport.
inline options parse_options(int argc, char** argv, bool with_transport) {
  options o;
  std::size_t begin = 4, end = 64u << 20;
  double factor = 2;
  bool explicit_end = false;
  for (int i = 1; i < argc; ++i) {
    std::string_view arg = argv[i], value;
    bool has_value = false;
    if (arg.starts_with("--")) {
      if (auto eq = arg.find('='); eq != std::string_view::npos) {
        value = arg.substr(eq + 1), arg = arg.substr(0, eq), has_value = true;
      }
    }
    auto next = [&]() -> std::string_view {
      if (has_value) return value;
      if (i + 1 >= argc) throw usage_error(std::string(arg) + " needs a value");
      return argv[++i];
    };
    if (arg == "-h" || arg == "--help") {
      o.help = true;
    } else if (arg == "--op") {
      o.op = static_cast<collective>(detail::index_of(arg, next(), collective_names));
    } else if (arg == "--dtype") {
      std::string_view names[std::size(offered_dtypes)];
      for (std::size_t k = 0; k < std::size(offered_dtypes); ++k)
        names[k] = dtype_name(offered_dtypes[k]);
      o.type = offered_dtypes[detail::index_of(arg, next(), names)];
    } else if (arg == "--reduce") {
      o.reduce = static_cast<reduction>(detail::index_of(arg, next(), reduction_names));
    } else if (arg == "-b" || arg == "--begin") {
      begin = detail::parse_size(arg, next());
    } else if (arg == "-e" || arg == "--end") {
      end = detail::parse_size(arg, next()), explicit_end = true;
    } else if (arg == "-f" || arg == "--factor") {
      const std::string text(next());
      char* stop = nullptr;
      factor = std::strtod(text.c_str(), &stop);
      if (text.empty() || *stop != '\0' || !(factor > 1) || !std::isfinite(factor))
        throw usage_error(std::string(arg) + ": '" + text + "' is not a number above 1");
    } else if (arg == "--sizes") {
      std::string_view list = next();
      o.sizes.clear();
      while (!list.empty()) {
        const auto comma = list.find(',');
        o.sizes.push_back(detail::parse_size(arg, list.substr(0, comma)));
        list = comma == std::string_view::npos ? std::string_view{} : list.substr(comma + 1);
      }
      if (o.sizes.empty()) throw usage_error("--sizes: the list is empty");
    } else if (arg == "--ranks") {
      o.ranks = static_cast<int>(detail::parse_integer(arg, next(), 1, 1024));
    } else if (arg == "--transport" && !with_transport) {
      throw usage_error("--transport: mpirun's --mca options choose the MPI transport");
    } else if (arg == "--transport") {
      o.transport = std::string(next());
      if (o.transport != "loopback" && o.transport != "shm" && o.transport != "mpi" &&
          o.transport != "tcp" && o.transport != "hier")
        throw usage_error("--transport: unknown value '" + o.transport +
                          "' (loopback, shm, mpi, tcp or hier)");
    } else if (arg == "--root") {
      o.root = static_cast<int>(detail::parse_integer(arg, next(), 0, 1023));
    } else if (arg == "--warmup") {
      o.warmup = static_cast<int>(detail::parse_integer(arg, next(), 1, 1'000'000));
    } else if (arg == "--budget-ms") {
      o.budget_ms = static_cast<double>(detail::parse_integer(arg, next(), 0, 3'600'000));
    } else if (arg == "--min-iters") {
      o.min_iters = static_cast<int>(detail::parse_integer(arg, next(), 1, 100'000'000));
    } else if (arg == "--max-iters") {
      o.max_iters = static_cast<int>(detail::parse_integer(arg, next(), 1, 100'000'000));
    } else if (arg == "--format") {
      o.format = static_cast<output_format>(detail::index_of(arg, next(), format_names));
    } else if (arg == "--check" || arg == "--no-check") {
      if (has_value) throw usage_error(std::string(arg) + " takes no value");
      o.check = arg == "--check";
    } else {
      throw usage_error("unknown option '" + std::string(argv[i]) + "'");
    }
  }
  if (o.sizes.empty()) {
    if (!explicit_end) end = std::max(end, begin);
    if (begin > end) throw usage_error("--begin is larger than --end");
    o.sizes = geometric_sizes(begin, end, factor);
  }
  std::sort(o.sizes.begin(), o.sizes.end());
  o.sizes.erase(std::unique(o.sizes.begin(), o.sizes.end()), o.sizes.end());
  if (o.min_iters > o.max_iters) throw usage_error("--min-iters is larger than --max-iters");
  if (o.reduce == reduction::avg && o.type == dtype::i32 && reduces(o.op))
    throw usage_error("--reduce avg needs a floating-point --dtype (f32, f64, fp16, bf16)");
  if (o.ranks > 0 && o.root >= o.ranks)
    throw usage_error("--root " + std::to_string(o.root) + " is not a rank of " +
                      std::to_string(o.ranks));
  return o;
}

}  // namespace cohort::bench
