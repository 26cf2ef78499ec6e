// One rank of a TCP job, for the process tests (tcp_test.py) and the measurements: it reads
// where it sits from its launcher's environment and sets up with make_tcp_communicator.
//
// usage: tcp_rank suite [quick]       the collective suite over TCP; exit 0 when it passes
//        tcp_rank loop COUNT ELEMS     all_reduce COUNT times, printing "iter i"; on failure
//                                      prints "error <code> peer=<p> after=<ms>ms: <what>", exit 3
//        tcp_rank setup                only set up; on failure prints the error line, exit 3
//        tcp_rank bench SIZE... [--budget-ms MS]  all_reduce (float sum) timed as cohort-bench does
//        tcp_rank pingpong SIZE [--iters N]   ranks 0 and 1 bounce SIZE bytes, raw transport
//        tcp_rank exchange SIZE [--iters N]   ranks 0 and 1 send each other SIZE bytes at once
#define DOCTEST_CONFIG_DISABLE  // a plain program: no doctest registry
#include "../support.hpp"

#include <algorithm>
#include <span>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include <cohort/cohort.hpp>
#include <cohort/launch/env.hpp>
#include <cohort/transport/tcp.hpp>

#include "../../bench/collectives/measure.hpp"
#include "../collectives/suite.hpp"

namespace ct = cohort::test;
using namespace std::chrono_literals;

namespace {

using steady = std::chrono::steady_clock;

const char* code_name(std::error_code ec) {
  if (ec.category() != cohort::error_category()) return "other";
  switch (static_cast<cohort::errc>(ec.value())) {
    case cohort::errc::ok:
      return "ok";
    case cohort::errc::timed_out:
      return "timed_out";
    case cohort::errc::peer_lost:
      return "peer_lost";
    case cohort::errc::mismatch:
      return "mismatch";
    case cohort::errc::protocol_error:
      return "protocol_error";
    case cohort::errc::aborted:
      return "aborted";
    case cohort::errc::invalid_argument:
      return "invalid_argument";
    case cohort::errc::unsupported:
      return "unsupported";
    case cohort::errc::cuda_error:
      return "cuda_error";
    case cohort::errc::poisoned:
      return "poisoned";
  }
  return "unknown";
}

int report(int rank, const cohort::error& e, steady::time_point since) {
  const auto ms =
      std::chrono::duration_cast<std::chrono::milliseconds>(steady::now() - since).count();
  std::printf("rank %d: error %s peer=%d after=%lldms: %s\n", rank, code_name(e.code()), e.peer(),
              static_cast<long long>(ms), e.what());
  std::fflush(stdout);
  return 3;
}

template <class T, class Op>
void run_counts(cohort::tcp_communicator& comm, const Op& op,
                const std::vector<std::size_t>& counts, bool reducing_only, int& checks) {
  const int p = comm.size();
  for (std::size_t n : counts) {
    for (ct::kind k : ct::every_kind) {
      if (reducing_only && !ct::reduces(k)) continue;
      const int root = p - 1 - static_cast<int>(n % static_cast<std::size_t>(p));
      try {
        ct::check<T>(comm, k, op, n, root, 99 + n);
      } catch (const ct::check_failed& e) {
        std::printf("rank %d: CHECK FAILED %s P=%d n=%zu: %s\n", comm.rank(), ct::kind_name(k), p,
                    n, e.what());
        std::fflush(stdout);
        std::exit(1);
      }
      ++checks;
    }
  }
}

int suite(cohort::tcp_communicator& comm, bool quick) {
  using namespace cohort;
  const int p = comm.size();
  int checks = 0;
  auto all = ct::counts_for<float>(p);
  if (quick) all = {0, 1, static_cast<std::size_t>(p - 1), 1025, 3 * 65536 + 7};
  const std::vector<std::size_t> some = {1, 1024, 1025, 70'001};
  run_counts<float>(comm, ops::sum, all, false, checks);
  run_counts<double>(comm, ops::sum, some, false, checks);
  run_counts<std::int32_t>(comm, ops::sum, some, true, checks);
  run_counts<fp16>(comm, ops::sum, some, true, checks);
  run_counts<bf16>(comm, ops::sum, some, true, checks);
  run_counts<float>(comm, ops::prod, some, true, checks);
  run_counts<float>(comm, ops::min, some, true, checks);
  run_counts<std::int32_t>(comm, ops::max, some, true, checks);
  run_counts<float>(comm, ops::avg, some, true, checks);
  ct::check_rounding<float>(comm, 100'003, 7);
  ct::check_rounding<bf16>(comm, 10'007, 8);
  checks += 2;
  std::printf("rank %d: suite passed: %d checks at P=%d\n", comm.rank(), checks, p);
  return 0;
}

int loop(cohort::tcp_communicator& comm, long count, std::size_t elems) {
  std::vector<float> x(elems, 1.0f);
  for (long i = 0; i < count; ++i) {
    cohort::all_reduce(comm, x, cohort::ops::sum);
    std::printf("iter %ld\n", i);
    std::fflush(stdout);
  }
  return 0;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

// The timing method of cohort-bench and cohort-bench-mpi (bench/collectives/measure.hpp), so
// that the figures compare: warmup, a block of back-to-back calls after one barrier, each
// sample the slowest rank's, p50.
struct tcp_group {
  cohort::tcp_communicator& comm;
  int rank() const { return comm.rank(); }
  int size() const { return comm.size(); }
  void barrier() { cohort::barrier(comm); }
  void max_over_ranks(std::span<double> v) { cohort::all_reduce(comm, v, cohort::ops::max); }
};

int bench(cohort::tcp_communicator& comm, const std::vector<std::size_t>& sizes, double budget_ms) {
  const int p = comm.size();
  tcp_group g{comm};
  cohort::bench::timing t;
  t.budget_ms = budget_ms;
  for (std::size_t bytes : sizes) {
    const std::size_t n = std::max<std::size_t>(1, bytes / sizeof(float));
    std::vector<float> x(n, 1.0f);
    const auto s = cohort::bench::time_iterations(
        g, [&] { cohort::all_reduce(comm, x, cohort::ops::sum); }, t);
    const double busbw = double(n * sizeof(float)) / (s.p50_us * 1e-6) * 2.0 * (p - 1) / p / 1e9;
    if (comm.rank() == 0)
      std::printf(
          "cohort-tcp all_reduce P=%d bytes=%zu iters=%zu p50_us=%.2f p99_us=%.2f "
          "busbw_GBps=%.3f\n",
          p, n * sizeof(float), s.iters, s.p50_us, s.p99_us, busbw);
  }
  return 0;
}

int pingpong(cohort::tcp_communicator& comm, std::size_t bytes, int iters) {
  if (comm.rank() > 1) return 0;
  auto& t = comm.transport();
  std::vector<std::byte> a(bytes), b(bytes);
  const int peer = 1 - comm.rank();
  std::vector<double> rtt;
  std::error_code ec;
  for (int i = 0; i < iters + 100; ++i) {
    const auto s = steady::now();
    const auto until = s + 10s;
    if (comm.rank() == 0) {
      auto r1 = t.send(peer, a);
      auto r2 = t.recv(peer, b);
      t.wait(r1, until, ec);
      if (!ec) t.wait(r2, until, ec);
    } else {
      auto r2 = t.recv(peer, b);
      t.wait(r2, until, ec);
      auto r1 = t.send(peer, a);
      if (!ec) t.wait(r1, until, ec);
    }
    if (ec) {
      std::printf("pingpong failed: %s\n", ec.message().c_str());
      return 3;
    }
    if (i >= 100)
      rtt.push_back(std::chrono::duration<double, std::micro>(steady::now() - s).count());
  }
  if (comm.rank() == 0)
    std::printf("pingpong bytes=%zu half_rtt_median_us=%.2f\n", bytes, median(rtt) / 2);
  return 0;
}

// Ranks 0 and 1 send each other SIZE bytes at the same time: the full-duplex ceiling of one
// connection, as this transport's data path sees it.
int exchange(cohort::tcp_communicator& comm, std::size_t bytes, int iters) {
  if (comm.rank() > 1) return 0;
  auto& t = comm.transport();
  std::vector<std::byte> a(bytes, std::byte{1}), b(bytes);
  const int peer = 1 - comm.rank();
  std::vector<double> us;
  std::error_code ec;
  for (int i = 0; i < iters + 2; ++i) {
    cohort::barrier(comm);
    const auto s = steady::now();
    auto r1 = t.send(peer, a);
    auto r2 = t.recv(peer, b);
    t.wait(r1, s + 30s, ec);
    if (!ec) t.wait(r2, s + 30s, ec);
    if (ec) return 3;
    if (i >= 2) us.push_back(std::chrono::duration<double, std::micro>(steady::now() - s).count());
  }
  if (comm.rank() == 0)
    std::printf("exchange bytes=%zu median_us=%.1f per_direction_GBps=%.3f\n", bytes, median(us),
                double(bytes) / (median(us) * 1e-6) / 1e9);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  if (argc < 2) {
    std::fprintf(stderr, "usage: tcp_rank suite|loop|setup|bench|pingpong ...\n");
    return 2;
  }
  const std::string_view mode = argv[1];
  const auto start = steady::now();
  cohort::launch_info info;
  try {
    info = cohort::launch_info_from_env();
  } catch (const cohort::error& e) {
    std::printf("bad launch environment: %s\n", e.what());
    return 2;
  }
  int iters = 1000;
  double budget_ms = 100;
  std::vector<std::size_t> sizes;
  for (int i = 2; i < argc; ++i) {
    if (std::string_view(argv[i]) == "--iters" && i + 1 < argc)
      iters = std::atoi(argv[++i]);
    else if (std::string_view(argv[i]) == "--budget-ms" && i + 1 < argc)
      budget_ms = std::atof(argv[++i]);
    else if (std::isdigit(static_cast<unsigned char>(argv[i][0])))
      sizes.push_back(std::strtoull(argv[i], nullptr, 10));
  }
  try {
    cohort::tcp_communicator comm = cohort::make_tcp_communicator(info);
    if (const char* t = std::getenv("COHORT_TEST_TIMEOUT_MS"))
      comm.set_timeout(std::chrono::milliseconds(std::atoi(t)));
    std::printf(
        "rank %d: connected (%d ranks, %lld ms)\n", comm.rank(), comm.size(),
        static_cast<long long>(
            std::chrono::duration_cast<std::chrono::milliseconds>(steady::now() - start).count()));
    if (mode == "suite") return suite(comm, argc > 2 && std::string_view(argv[2]) == "quick");
    if (mode == "loop")
      return loop(comm, sizes.size() > 0 ? long(sizes[0]) : 100,
                  sizes.size() > 1 ? sizes[1] : 1 << 20);
    if (mode == "setup") return 0;
    if (mode == "bench") return bench(comm, sizes, budget_ms);
    if (mode == "pingpong") return pingpong(comm, sizes.empty() ? 4 : sizes[0], iters);
    if (mode == "exchange") return exchange(comm, sizes.empty() ? 1 << 26 : sizes[0], iters);
    std::fprintf(stderr, "unknown mode %s\n", argv[1]);
    return 2;
  } catch (const cohort::error& e) {
    return report(info.rank, e, start);
  }
}
