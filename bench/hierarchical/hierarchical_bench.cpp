// Flat TCP ring against the hierarchical communicator (shm inside a host, TCP rails between
// hosts): all_reduce of floats, 4 B to 64 MiB. One machine fakes HOSTS hosts of LOCAL ranks each
// (COHORT_HOST per forked process); the processes meet at a TCP store on 127.0.0.1. Timed as
// cohort-bench times (measure.hpp): warmup, a block of back-to-back calls after a barrier, each
// sample the slowest rank's, p50.
//
// usage: hierarchical_bench [HOSTS LOCAL] [--budget-ms MS]   (default 2 2, 100 ms per size)
//
// On one machine the "hosts" share the loopback interface, so this measures the schedules and
// what shared memory saves inside a host, not a real network between hosts.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <cohort/cohort.hpp>
#include <cohort/hierarchical_tcp.hpp>
#include <cohort/rendezvous/tcp_store.hpp>
#include <cohort/rendezvous/tcp_store_server.hpp>

#include "../collectives/measure.hpp"

namespace {

struct world_group {
  cohort::tcp_communicator& comm;
  int rank() const { return comm.rank(); }
  int size() const { return comm.size(); }
  void barrier() { cohort::barrier(comm); }
  void max_over_ranks(std::span<double> v) { cohort::all_reduce(comm, v, cohort::ops::max); }
};

int rank_main(int r, int hosts, int local, int port, const std::string& job, double budget_ms) {
  const std::string token = "hierarchical-bench";
  ::setenv("COHORT_HOST", ("bench-host-" + std::to_string(r / local)).c_str(), 1);
  cohort::tcp_store st("127.0.0.1", port, {.token = token});
  cohort::launch_info info;
  info.rank = r;
  info.size = hosts * local;
  info.job_id = job;
  cohort::tcp_options tcp;
  tcp.interface = "lo";
  tcp.token = token;
  auto world = cohort::make_tcp_communicator(info, st, tcp);
  auto hier = cohort::make_hierarchical_communicator(world, st, tcp, {}, {.base = job});
  world_group g{world};
  cohort::bench::timing t;
  t.budget_ms = budget_ms;
  if (r == 0)
    std::printf("%-10s %12s %12s %12s %8s\n", "bytes", "flat_p50_us", "hier_p50_us",
                "flat_GBps", "speedup");
  for (std::size_t bytes = 4; bytes <= (std::size_t{64} << 20); bytes *= 4) {
    const std::size_t n = bytes / sizeof(float);
    std::vector<float> x(n, 1.0f);
    const auto flat = cohort::bench::time_iterations(
        g, [&] { cohort::all_reduce(world, x, cohort::ops::sum); }, t);
    const auto two = cohort::bench::time_iterations(
        g, [&] { cohort::all_reduce(hier, x, cohort::ops::sum); }, t);
    const int p = world.size();
    const double busbw = double(bytes) / (flat.p50_us * 1e-6) * 2.0 * (p - 1) / p / 1e9;
    if (r == 0)
      std::printf("%-10zu %12.1f %12.1f %12.3f %8.2f\n", bytes, flat.p50_us, two.p50_us, busbw,
                  flat.p50_us / two.p50_us);
    std::fflush(stdout);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  int hosts = 2, local = 2;
  double budget_ms = 100;
  int i = 1;
  if (argc >= 3 && argv[1][0] != '-') {
    hosts = std::atoi(argv[1]);
    local = std::atoi(argv[2]);
    i = 3;
  }
  for (; i < argc; ++i)
    if (std::string_view(argv[i]) == "--budget-ms" && i + 1 < argc) budget_ms = std::atof(argv[++i]);
  if (hosts < 1 || local < 1) {
    std::fprintf(stderr, "usage: hierarchical_bench [HOSTS LOCAL] [--budget-ms MS]\n");
    return 2;
  }
  const std::string job = "hierbench-" + std::to_string(::getpid());
  cohort::tcp_store_server server("127.0.0.1", 0,
                                  {.token = "hierarchical-bench", .log = [](std::string_view) {}});
  std::vector<pid_t> pids;
  for (int r = 0; r < hosts * local; ++r) {
    std::fflush(nullptr);
    const pid_t pid = ::fork();
    if (pid == 0) {
      int code = 1;
      try {
        code = rank_main(r, hosts, local, server.port(), job, budget_ms);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "[rank %d] %s\n", r, e.what());
      }
      std::fflush(nullptr);
      ::_exit(code);
    }
    pids.push_back(pid);
  }
  int failed = 0;
  for (pid_t pid : pids) {
    int st = 0;
    ::waitpid(pid, &st, 0);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) ++failed;
  }
  return failed == 0 ? 0 : 1;
}
