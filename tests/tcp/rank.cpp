// One rank of a TCP job, for the process tests (tcp_test.py): it reads where it sits from its
// launcher's environment and sets up with make_tcp_communicator. The measuring modes live in
// bench/tcp/tcp_bench.cpp.
//
// usage: tcp_rank suite [quick]       the collective suite over TCP; exit 0 when it passes
//        tcp_rank loop COUNT ELEMS     all_reduce COUNT times, printing "iter i"; on failure
//                                      prints "error <code> peer=<p> after=<ms>ms: <what>", exit 3
//        tcp_rank setup                only set up; on failure prints the error line, exit 3
#define DOCTEST_CONFIG_DISABLE  // a plain program: no doctest registry
#include "../support.hpp"

#include <cctype>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include <cohort/cohort.hpp>
#include <cohort/launch/env.hpp>
#include <cohort/transport/tcp.hpp>

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
  try {
    ct::check_broadcast_sweep<float>(comm);
  } catch (const ct::check_failed& e) {
    std::printf("rank %d: CHECK FAILED broadcast sweep P=%d: %s\n", comm.rank(), p, e.what());
    std::fflush(stdout);
    std::exit(1);
  }
  ++checks;
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

}  // namespace

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  if (argc < 2) {
    std::fprintf(stderr, "usage: tcp_rank suite|loop|setup ...\n");
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
  std::vector<std::size_t> sizes;
  for (int i = 2; i < argc; ++i) {
    if (std::isdigit(static_cast<unsigned char>(argv[i][0])))
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
    std::fprintf(stderr, "unknown mode %s\n", argv[1]);
    return 2;
  } catch (const cohort::error& e) {
    return report(info.rank, e, start);
  }
}
