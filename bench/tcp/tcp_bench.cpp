// One rank of a TCP measurement: it reads where it sits from its launcher's environment (as
// tests/tcp/rank.cpp does), sets up with make_tcp_communicator and times one thing.
//
// usage: tcp_bench all_reduce SIZE... [--budget-ms MS]  all_reduce (float sum), timed as
//                                                      cohort-bench times it
//        tcp_bench pingpong SIZE [--iters N]   ranks 0 and 1 bounce SIZE bytes, raw transport
//        tcp_bench exchange SIZE [--iters N]   ranks 0 and 1 send each other SIZE bytes at once
//
// compare_tcp.py runs it beside Open MPI's and Gloo's all_reduce; bench/results/tcp.md has the
// figures.
#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <span>
#include <string_view>
#include <vector>

#include <cohort/cohort.hpp>
#include <cohort/launch/env.hpp>
#include <cohort/transport/tcp.hpp>

#include "../collectives/measure.hpp"

using namespace std::chrono_literals;

namespace {

using steady = std::chrono::steady_clock;

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

// The timing method of cohort-bench and cohort-bench-mpi (measure.hpp), so that the figures
// compare: warmup, a block of back-to-back calls after one barrier, each sample the slowest
// rank's, p50.
struct tcp_group {
  cohort::tcp_communicator& comm;
  int rank() const { return comm.rank(); }
  int size() const { return comm.size(); }
  void barrier() { cohort::barrier(comm); }
  void max_over_ranks(std::span<double> v) { cohort::all_reduce(comm, v, cohort::ops::max); }
};

int all_reduce(cohort::tcp_communicator& comm, const std::vector<std::size_t>& sizes,
               double budget_ms) {
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
  const std::string_view mode = argc > 1 ? argv[1] : "";
  if (mode != "all_reduce" && mode != "pingpong" && mode != "exchange") {
    std::fprintf(stderr, "usage: tcp_bench all_reduce|pingpong|exchange SIZE... [--iters N] "
                         "[--budget-ms MS]\n");
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
    cohort::tcp_communicator comm = cohort::make_tcp_communicator(cohort::launch_info_from_env());
    if (mode == "all_reduce") return all_reduce(comm, sizes, budget_ms);
    if (mode == "pingpong") return pingpong(comm, sizes.empty() ? 4 : sizes[0], iters);
    return exchange(comm, sizes.empty() ? 1 << 26 : sizes[0], iters);
  } catch (const cohort::error& e) {
    std::fprintf(stderr, "tcp_bench: %s\n", e.what());
    return 3;
  }
}
