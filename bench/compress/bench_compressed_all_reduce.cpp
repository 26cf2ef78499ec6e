// Compressed all_reduce against the uncompressed f32 all_reduce: wall time per call on rank 0,
// from a barrier to a barrier after the call (so every rank has finished), P ranks as threads.
// Contenders are interleaved within each round; rounds repeat; medians with min - max.
//
//   bench_compressed_all_reduce [--transport loopback|tcp] [--ranks 2] [--mib 16,64]
//                               [--rounds 9] [--only 0,5,7]
//
// --only runs the contenders of those rows (0 = f32, 1 = fp16, ..., 7 = top-k + error feedback,
// in the table's order; f32 always runs, as every ratio is against it), e.g. to profile one.
//
// loopback: the in-process transport (the receiver copies straight from the sender's memory).
// tcp: cohort's TCP transport over 127.0.0.1 (built when Boost.Asio and the transport are).
#include <cohort/collectives/all_reduce.hpp>
#include <cohort/collectives/barrier.hpp>
#include <cohort/compress/all_reduce.hpp>
#include <cohort/transport/loopback.hpp>
#if defined(COHORT_BENCH_TCP)
#include <unistd.h>

#include <filesystem>
#include <cohort/rendezvous/file_store.hpp>
#include <cohort/transport/tcp.hpp>
#endif

#include <exception>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common.hpp"

namespace cc = cohort::compress;
namespace cb = cohort::bench;
using namespace std::chrono_literals;

namespace {

const char* const names[] = {"f32 all_reduce",      "fp16", "bf16", "int8", "int8 + error feedback",
                             "top_k 1%",            "top_k 1% with bf16 values",
                             "top_k 1% + error feedback"};
constexpr int contenders = static_cast<int>(std::size(names));

struct sample {
  std::vector<double> seconds;
  std::uint64_t bytes = 0;
  cc::aggregation used = cc::aggregation::summable;
};

// One rank's part of the whole benchmark; rank 0 records into `out[size][contender]`.
template <class Comm>
void run_rank(Comm& comm, const std::vector<double>& mibs, int rounds,
              const std::vector<bool>& chosen, std::vector<std::vector<sample>>& out) {
  for (std::size_t s = 0; s < mibs.size(); ++s) {
    const std::size_t n = static_cast<std::size_t>(mibs[s] * (1 << 20)) / 4;
    const std::vector<float> pristine = cb::gradient(n, 1 + comm.rank());
    std::vector<float> data(n);
    cc::error_feedback ef8{cc::int8};
    cc::error_feedback eftk{cc::top_k(0.01)};
    auto call = [&](int c) -> cc::report {
      switch (c) {
        case 0: cohort::all_reduce(comm, data, cohort::ops::sum); return {};
        case 1: return cohort::compressed_all_reduce(comm, data, cc::fp16);
        case 2: return cohort::compressed_all_reduce(comm, data, cc::bf16);
        case 3: return cohort::compressed_all_reduce(comm, data, cc::int8);
        case 4: return cohort::compressed_all_reduce(comm, data, ef8);
        case 5: return cohort::compressed_all_reduce(comm, data, cc::top_k(0.01));
        case 6: return cohort::compressed_all_reduce(comm, data, cc::top_k(0.01) | cc::bf16);
        default: return cohort::compressed_all_reduce(comm, data, eftk);
      }
    };
    for (int round = 0; round <= rounds; ++round) {  // round 0 warms up
      for (int c = 0; c < contenders; ++c) {
        if (!chosen[c]) continue;
        std::memcpy(data.data(), pristine.data(), 4 * n);
        cohort::barrier(comm);
        const auto t0 = std::chrono::steady_clock::now();
        const cc::report rep = call(c);
        cohort::barrier(comm);
        const double secs = cb::seconds(std::chrono::steady_clock::now() - t0).count();
        if (comm.rank() == 0 && round > 0) {
          sample& x = out[s][c];
          x.seconds.push_back(secs);
          x.bytes = c == 0 ? 0 : rep.bytes_sent;
          x.used = rep.used;
        }
      }
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  const std::string transport = cb::option(argc, argv, "transport", "loopback");
  const int ranks = std::atoi(cb::option(argc, argv, "ranks", "2").c_str());
  const std::vector<double> mibs = cb::numbers(cb::option(argc, argv, "mib", "16,64"));
  const int rounds = std::atoi(cb::option(argc, argv, "rounds", "9").c_str());
  std::vector<std::vector<sample>> out(mibs.size(), std::vector<sample>(contenders));
  std::vector<bool> chosen(contenders, true);
  if (const std::string only = cb::option(argc, argv, "only", ""); !only.empty()) {
    chosen.assign(contenders, false);
    chosen[0] = true;
    for (double c : cb::numbers(only)) {
      if (c < 0 || c >= contenders || c != static_cast<int>(c)) {
        std::fprintf(stderr, "--only: %g is not a row (0 to %d)\n", c, contenders - 1);
        return 2;
      }
      chosen[static_cast<std::size_t>(c)] = true;
    }
  }

  if (transport == "loopback") {
    cohort::run_loopback(ranks, [&](auto& comm) { run_rank(comm, mibs, rounds, chosen, out); });
  } else if (transport == "tcp") {
#if defined(COHORT_BENCH_TCP)
    const std::string dir = (std::filesystem::temp_directory_path() /
                             ("cohort-bench-compress-" + std::to_string(::getpid()))).string();
    std::vector<std::exception_ptr> errors(ranks);
    std::vector<std::thread> threads;
    for (int r = 0; r < ranks; ++r)
      threads.emplace_back([&, r] {
        try {
          cohort::launch_info info;
          info.rank = info.local_rank = r;
          info.size = info.local_size = ranks;
          info.job_id = "bench-compress-" + std::to_string(::getpid());
          cohort::tcp_options opts;
          opts.interface = "lo";
          opts.family = cohort::tcp_family::v4;
          opts.spin = 0us;  // ranks as threads: spinning would steal the peer's core
          cohort::file_store store(dir);
          auto comm = cohort::make_tcp_communicator(info, store, opts);
          run_rank(comm, mibs, rounds, chosen, out);
        } catch (...) {
          errors[r] = std::current_exception();
        }
      });
    for (auto& t : threads) t.join();
    std::filesystem::remove_all(dir);
    for (auto& e : errors)
      if (e) std::rethrow_exception(e);
#else
    std::fprintf(stderr, "this build has no TCP transport (needs Boost.Asio)\n");
    return 2;
#endif
  } else {
    std::fprintf(stderr, "--transport loopback|tcp\n");
    return 2;
  }

  std::printf("transport %s, P = %d, %d rounds, times on rank 0 (barrier to barrier)\n\n",
              transport.c_str(), ranks, rounds);
  std::printf("| size | codec | aggregation | median ms | min - max ms | vs f32 "
              "| bytes sent per rank |\n");
  std::printf("|---|---|---|---|---|---|---|\n");
  for (std::size_t s = 0; s < mibs.size(); ++s) {
    const double base = cb::summarize(out[s][0].seconds).median;
    for (int c = 0; c < contenders; ++c) {
      if (!chosen[c]) continue;
      const cb::summary t = cb::summarize(out[s][c].seconds);
      const std::string agg = c == 0 ? "ring" : std::string(cc::aggregation_name(out[s][c].used));
      const std::string bytes = c == 0 ? "-" : std::to_string(out[s][c].bytes);
      std::printf("| %g MiB | %s | %s | %.2f | %.2f - %.2f | %.2fx | %s |\n", mibs[s], names[c],
                  agg.c_str(), 1e3 * t.median, 1e3 * t.min, 1e3 * t.max, t.median / base,
                  bytes.c_str());
    }
  }
  return 0;
}
