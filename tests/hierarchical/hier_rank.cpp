// One rank of a hierarchical job across real hosts (or network namespaces posing as hosts), for
// netns_hier.py and bench/hierarchical/netns_bench.py. It reads where it sits from torchrun's
// variables (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT, TORCHELASTIC_RUN_ID); rank 0 hosts a
// TCP store at MASTER_ADDR:MASTER_PORT with COHORT_TOKEN; every rank sets up a TCP world through
// it (COHORT_SOCKET_IFNAME picks the interface) and splits it with
// make_hierarchical_communicator (COHORT_HOST, where set, names the host).
//
// usage: hier_rank suite               the collective suite; prints "rank r: suite passed", exit 0
//        hier_rank loop COUNT ELEMS     all_reduce COUNT times (10 s deadline each), printing
//                                       "iter i"; on failure prints
//                                       "rank r: error <code> peer=<p> after=<ms>ms: <what>", exit 3
//        hier_rank bench IFACE ROUNDS BUDGET_MS [compress]
//                                       flat TCP ring against hierarchical all_reduce of f32,
//                                       4 B to 64 MiB, ROUNDS interleaved rounds; rank 0 prints
//                                       the medians. With "compress": hierarchical all_reduce
//                                       uncompressed, bf16 and top-k 1% + error feedback at 4 and
//                                       64 MiB, with the bytes IFACE sent per call on each host.
#define DOCTEST_CONFIG_DISABLE  // a plain program: no doctest registry
#include "../support.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <string_view>
#include <vector>

#include <cohort/cohort.hpp>
#include <cohort/compress/hierarchical.hpp>
#include <cohort/hierarchical_tcp.hpp>
#include <cohort/launch/env.hpp>
#include <cohort/rendezvous/tcp_store.hpp>
#include <cohort/rendezvous/tcp_store_server.hpp>

#include "../../bench/collectives/measure.hpp"
#include "../collectives/suite.hpp"

namespace ct = cohort::test;
using namespace std::chrono_literals;

namespace {

using steady = std::chrono::steady_clock;

const char* code_name(std::error_code ec) {
  if (ec.category() != cohort::error_category()) return "other";
  switch (static_cast<cohort::errc>(ec.value())) {
    case cohort::errc::ok: return "ok";
    case cohort::errc::timed_out: return "timed_out";
    case cohort::errc::peer_lost: return "peer_lost";
    case cohort::errc::mismatch: return "mismatch";
    case cohort::errc::protocol_error: return "protocol_error";
    case cohort::errc::aborted: return "aborted";
    case cohort::errc::invalid_argument: return "invalid_argument";
    case cohort::errc::unsupported: return "unsupported";
    case cohort::errc::cuda_error: return "cuda_error";
    case cohort::errc::poisoned: return "poisoned";
  }
  return "unknown";
}

template <class T, class Op>
void suite_of(cohort::hierarchical_tcp_communicator& h, const Op& op, std::uint64_t seed) {
  const int p = h.size();
  for (std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{5}, std::size_t{1000},
                        std::size_t{65537}})
    for (ct::kind k : ct::every_kind) {
      const int root = p - 1 - static_cast<int>(n % static_cast<std::size_t>(p));
      try {
        ct::check<T>(h, k, op, n, root, seed + n);
      } catch (const ct::check_failed& e) {
        std::printf("rank %d: CHECK FAILED %s n=%zu: %s\n", h.rank(), ct::kind_name(k), n,
                    e.what());
        std::fflush(stdout);
        h.abort(e.what());
        std::exit(1);
      }
    }
}

int suite(cohort::hierarchical_tcp_communicator& h) {
  suite_of<float>(h, cohort::ops::sum, 10);
  suite_of<float>(h, cohort::ops::max, 20);
  suite_of<std::int32_t>(h, cohort::ops::sum, 30);
  suite_of<double>(h, cohort::ops::avg, 40);
  suite_of<cohort::bf16>(h, cohort::ops::sum, 50);
  ct::check_rounding<float>(h, 10'007, 60);
  const int p = h.size();
  const float total = static_cast<float>(p * (p - 1) / 2);
  std::vector<float> x(70'001, static_cast<float>(h.rank()));
  cohort::compressed_all_reduce(h, x, cohort::compress::bf16, cohort::ops::sum);
  if (!std::ranges::all_of(x, [&](float v) { return v == total; })) {
    std::printf("rank %d: CHECK FAILED compressed_all_reduce(bf16) sum is wrong\n", h.rank());
    return 1;
  }
  std::printf("rank %d: suite passed (host %d of %d, local rank %d of %d)\n", h.rank(), h.host(),
              h.size() / h.local_size(), h.local_rank(), h.local_size());
  return 0;
}

int loop(cohort::hierarchical_tcp_communicator& h, long count, std::size_t elems) {
  std::vector<float> x(elems, 1.0f);
  for (long i = 0; i < count; ++i) {
    cohort::all_reduce(h, x, cohort::ops::sum, {.timeout = 10s});
    std::printf("iter %ld\n", i);
    std::fflush(stdout);
  }
  return 0;
}

// ---- bench ----

struct world_group {
  cohort::tcp_communicator& comm;
  int rank() const { return comm.rank(); }
  int size() const { return comm.size(); }
  void barrier() { cohort::barrier(comm); }
  void max_over_ranks(std::span<double> v) { cohort::all_reduce(comm, v, cohort::ops::max); }
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

std::uint64_t tx_bytes(const std::string& iface) {
  std::ifstream f("/sys/class/net/" + iface + "/statistics/tx_bytes");
  std::uint64_t n = 0;
  f >> n;
  return n;
}

int bench(cohort::tcp_communicator& world, cohort::hierarchical_tcp_communicator& h,
          const std::string& iface, int rounds, double budget_ms, bool compress) {
  world_group g{world};
  cohort::bench::timing t;
  t.budget_ms = budget_ms;
  t.warmup = 2;
  t.min_iters = 3;
  const int r = world.rank();
  if (!compress) {
    std::vector<std::size_t> sizes;
    for (std::size_t b = 4; b <= (std::size_t{64} << 20); b *= 4) sizes.push_back(b);
    std::vector<std::vector<double>> flat(sizes.size()), two(sizes.size());
    for (int round = 0; round < rounds; ++round)
      for (std::size_t i = 0; i < sizes.size(); ++i) {
        std::vector<float> x(sizes[i] / sizeof(float), 1.0f);
        flat[i].push_back(cohort::bench::time_iterations(
            g, [&] { cohort::all_reduce(world, x, cohort::ops::sum); }, t).p50_us);
        two[i].push_back(cohort::bench::time_iterations(
            g, [&] { cohort::all_reduce(h, x, cohort::ops::sum); }, t).p50_us);
      }
    if (r == 0) {
      std::printf("%-10s %12s %12s %10s %10s\n", "bytes", "flat_p50_us", "hier_p50_us",
                  "hier/flat", "hier_GBps");
      for (std::size_t i = 0; i < sizes.size(); ++i) {
        const double f = median(flat[i]), hh = median(two[i]);
        const int p = world.size();
        std::printf("%-10zu %12.1f %12.1f %10.2f %10.3f\n", sizes[i], f, hh, hh / f,
                    double(sizes[i]) / (hh * 1e-6) * 2.0 * (p - 1) / p / 1e9);
      }
    }
    return 0;
  }
  // Compressed: uncompressed hierarchical all_reduce, bf16, top-k 1% + error feedback.
  const char* names[] = {"f32", "bf16", "topk1%+ef"};
  for (std::size_t bytes : {std::size_t{4} << 20, std::size_t{64} << 20}) {
    cohort::compress::error_feedback ef{cohort::compress::top_k(0.01)};  // one per tensor
    std::vector<std::vector<double>> us(3), sent(3);
    std::vector<float> x(bytes / sizeof(float));
    for (std::size_t k = 0; k < x.size(); ++k) x[k] = float((k * 2654435761u) % 1000) * 1e-3f;
    for (int round = 0; round < rounds; ++round)
      for (int c = 0; c < 3; ++c) {
        cohort::barrier(world);
        const std::uint64_t before = tx_bytes(iface);
        std::size_t calls = 0;
        auto run = [&] {
          ++calls;
          if (c == 0) cohort::all_reduce(h, x, cohort::ops::avg);
          else if (c == 1) cohort::compressed_all_reduce(h, x, cohort::compress::bf16, cohort::ops::avg);
          else cohort::compressed_all_reduce(h, x, ef, cohort::ops::avg);
        };
        us[c].push_back(cohort::bench::time_iterations(g, run, t).p50_us);
        cohort::barrier(world);
        // Every rank of a host shares its interface: local rank 0 reads what the host sent.
        double per_call = double(tx_bytes(iface) - before) / double(calls);
        std::vector<double> v{h.local_rank() == 0 ? per_call : 0.0};
        cohort::all_reduce(world, std::span<double>(v), cohort::ops::max);
        sent[c].push_back(v[0]);
      }
    if (r == 0) {
      if (bytes == (std::size_t{4} << 20))
        std::printf("%-10s %-10s %12s %10s %16s %10s\n", "bytes", "codec", "p50_us", "vs_f32",
                    "host_tx_B/call", "vs_f32");
      for (int c = 0; c < 3; ++c)
        std::printf("%-10zu %-10s %12.1f %10.2f %16.0f %10.3f\n", bytes, names[c], median(us[c]),
                    median(us[c]) / median(us[0]), median(sent[c]),
                    median(sent[c]) / median(sent[0]));
    }
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  if (argc < 2) {
    std::fprintf(stderr, "usage: hier_rank suite|loop COUNT ELEMS|bench IFACE ROUNDS MS [compress]\n");
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
  const char* addr = std::getenv("MASTER_ADDR");
  const char* port = std::getenv("MASTER_PORT");
  const char* token = std::getenv("COHORT_TOKEN");
  if (!addr || !port || !token) {
    std::printf("MASTER_ADDR, MASTER_PORT and COHORT_TOKEN must be set\n");
    return 2;
  }
  try {
    std::unique_ptr<cohort::tcp_store_server> server;
    if (info.rank == 0)
      server = std::make_unique<cohort::tcp_store_server>(
          addr, std::atoi(port),
          cohort::tcp_store_server_options{.token = token, .log = [](std::string_view) {}});
    cohort::tcp_store st(addr, std::atoi(port), {.token = token});
    auto world = cohort::make_tcp_communicator(info, st);
    // HIER_SHM_SPIN_US / HIER_SHM_YIELD_US: the shared-memory waits (shm_options), for the bench.
    cohort::shm_options shm;
    if (const char* v = std::getenv("HIER_SHM_SPIN_US")) shm.spin = std::chrono::microseconds(std::atoi(v));
    if (const char* v = std::getenv("HIER_SHM_YIELD_US")) shm.yield = std::chrono::microseconds(std::atoi(v));
    auto h = cohort::make_hierarchical_communicator(world, st, {}, shm, {.base = info.job_id});
    std::printf("rank %d: connected as rank %d on host %d (%lld ms)\n", info.rank, h.rank(),
                h.host(),
                static_cast<long long>(std::chrono::duration_cast<std::chrono::milliseconds>(
                                           steady::now() - start).count()));
    int code = 2;
    if (mode == "suite") {
      code = suite(h);
    } else if (mode == "loop") {
      code = loop(h, argc > 2 ? std::atol(argv[2]) : 100,
                  argc > 3 ? std::strtoull(argv[3], nullptr, 10) : 1 << 20);
    } else if (mode == "bench" && argc >= 5) {
      code = bench(world, h, argv[2], std::atoi(argv[3]), std::atof(argv[4]),
                   argc > 5 && std::string_view(argv[5]) == "compress");
    } else {
      std::fprintf(stderr, "unknown mode %s\n", argv[1]);
      return 2;
    }
    if (code == 0) cohort::barrier(world);  // rank 0's store stays up until everyone is done
    return code;
  } catch (const cohort::error& e) {
    const auto ms =
        std::chrono::duration_cast<std::chrono::milliseconds>(steady::now() - start).count();
    std::printf("rank %d: error %s peer=%d after=%lldms: %s\n", info.rank, code_name(e.code()),
                e.peer(), static_cast<long long>(ms), e.what());
    std::fflush(stdout);
    return 3;
  }
}
