// cohort-bench: times cohort's collectives the way nccl-tests times NCCL's.
//
//   cohort-bench --ranks 2 --op all_reduce --dtype f32 --sizes 4,1K,64K,1M,16M,64M
//   cohort-bench --ranks 4 --transport loopback -b 1K -e 16M -f 4 --format csv
//   cohort-run -n 2 cohort-bench --op all_gather --dtype bf16
//   mpirun -np 2 cohort-bench --transport mpi --sizes 4,1K,1M
//
// How it measures (driver.hpp and measure.hpp hold the code, which cohort-bench-mpi shares, so
// that both sides of a comparison are measured alike):
//
// - Ranks. With --ranks P (default 2) it starts the ranks itself: P threads over the loopback
//   transport, or P forked processes over the shared-memory transport with a fresh job id.
//   Under a launcher (cohort-run, mpirun, torchrun, Slurm: launch_info_from_env() reports a
//   size above 1) it is one rank of that job, over shared memory.
// - Ceiling. Before the ranks start (under a launcher: on rank 0, before it connects), one
//   thread times memcpy at the largest size; the header prints it as the bandwidth to compare
//   busbw with.
// - Per size, on fresh buffers:
//   1. check: one call, its result compared element by element with an exact reference (the
//      inputs are small integers, for which every order of combination is exact); the count
//      of wrong elements, max over ranks, is the #wrong column;
//   2. warmup: --warmup calls, each timed; their median, max over ranks, divided into
//      --budget-ms gives the number of timed calls, clamped to [--min-iters, --max-iters]
//      (every rank computes the same number);
//   3. timing: one barrier, then the calls back to back with one clock read between calls;
//   4. outside the timed region the per-call samples are combined with cohort's own
//      all_reduce(max): sample i is call i as the slowest rank saw it.
// - Reported: p50 and p99 of those samples (nearest rank); algbw = bytes / p50; busbw = algbw
//   times 2(P-1)/P (all_reduce), (P-1)/P (reduce_scatter, all_gather) or 1 (broadcast), as in
//   nccl-tests. "bytes" is the full buffer: all_gather's output, reduce_scatter's input.
#include <sys/types.h>
#include <sys/wait.h>
#include <csignal>
#include <unistd.h>
#ifdef __linux__
#include <sys/prctl.h>
#endif

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <exception>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include <cohort/cohort.hpp>
#include <cohort/launch/env.hpp>

// The shared-memory transport is optional at build time, so that this program builds (with
// loopback only) on a tree that does not have it.
#if __has_include(<cohort/transport/shm.hpp>)
#include <cohort/transport/shm.hpp>
#define COHORT_BENCH_HAS_SHM 1
#else
#define COHORT_BENCH_HAS_SHM 0
#endif

// The MPI transport, where this program is built with MPI (--transport mpi under mpirun).
#if __has_include(<mpi.h>) && __has_include(<cohort/transport/mpi.hpp>)
#include <cohort/transport/mpi.hpp>
#define COHORT_BENCH_HAS_MPI 1
#else
#define COHORT_BENCH_HAS_MPI 0
#endif

// The TCP transport and the hierarchical communicator (shm hosts, TCP rails), where this program
// is built with Boost.Asio (--transport tcp|hier under a launcher).
#if __has_include(<boost/asio.hpp>) && __has_include(<cohort/hierarchical_tcp.hpp>)
#include <cohort/hierarchical_tcp.hpp>
#include <cohort/rendezvous/tcp_store.hpp>
#include <cohort/rendezvous/tcp_store_server.hpp>
#include <cohort/transport/tcp.hpp>
#define COHORT_BENCH_HAS_TCP 1
#else
#define COHORT_BENCH_HAS_TCP 0
#endif

#include "driver.hpp"

namespace cohort::bench {
namespace {

constexpr const char* program = "cohort-bench";

/// A cohort communicator (flat or hierarchical) as the timing loop sees it (models `rank_group`).
template <class Comm>
class cohort_group {
 public:
  explicit cohort_group(Comm& comm) : comm_(comm) {}
  int rank() const { return comm_.rank(); }
  int size() const { return comm_.size(); }
  void barrier() { cohort::barrier(comm_); }
  void max_over_ranks(std::span<double> v) { cohort::all_reduce(comm_, v, ops::max); }

 private:
  Comm& comm_;
};

/// Calls the collective `o.op` once, with the buffers `shape_of` describes.
template <class Comm, element T, class Op>
void call_collective(Comm& comm, const options& o, const Op& op, std::span<const T> in,
                     std::span<T> out) {
  switch (o.op) {
    case collective::all_reduce: cohort::all_reduce(comm, in, out, op); break;
    case collective::reduce_scatter: cohort::reduce_scatter(comm, in, out, op); break;
    case collective::all_gather: cohort::all_gather(comm, in, out); break;
    case collective::broadcast: cohort::broadcast(comm, out, o.root); break;
  }
}

/// One rank's whole run; rank 0 prints. Returns the number of sizes whose check failed.
template <class Comm>
int run_rank(Comm& comm, const options& o, const run_info& run) {
  cohort_group<Comm> group(comm);
  std::optional<reporter> rep;
  if (comm.rank() == 0) rep.emplace(stdout, o, run);
  return visit_types(o, [&]<element T, class Op>(const Op& op) {
    auto invoke = [&](std::span<const T> in, std::span<T> out) {
      call_collective(comm, o, op, in, out);
    };
    return run_benchmark<T>(group, o, op, invoke, rep ? &*rep : nullptr);
  });
}

/// Runs `body` and turns an escaping exception into a message on stderr and exit status 1.
template <class Body>
int report_errors(const std::string& who, Body&& body) {
  try {
    return body();
  } catch (const usage_error& e) {
    std::fprintf(stderr, "%s: %s\n", who.c_str(), e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: %s\n", who.c_str(), e.what());
    return 1;
  }
}

/// P threads over the loopback transport.
int run_threads(const options& o, int ranks, run_info run) {
  run.transport = "loopback";
  run.launch = "threads";
  int failed = 0;
  cohort::run_loopback(ranks, [&](auto& comm) {
    const int f = run_rank(comm, o, run);
    if (comm.rank() == 0) failed = f;  // the same on every rank
  });
  return failed > 0 ? 1 : 0;
}

#if COHORT_BENCH_HAS_SHM
/// One rank over the shared-memory transport; exit status 0, or 1 when a check failed.
int run_shm_rank(const launch_info& info, const options& o, const run_info& run) {
  shm_communicator comm = make_shm_communicator(info);
  return run_rank(comm, o, run) > 0 ? 1 : 0;
}

/// A job id no other run on this host uses: program, pid and the clock.
std::string fresh_job_id() {
  const auto ns = std::chrono::steady_clock::now().time_since_epoch().count();
  return std::string(program) + "-" + std::to_string(::getpid()) + "-" + std::to_string(ns);
}

/// Waits for the forked ranks; at the first that fails, ends the others. Returns 0 when all
/// exited 0, else the first failure's status (128 + N for signal N).
int wait_for_ranks(std::vector<pid_t>& pids) {
  int status_of_first_failure = 0;
  for (std::size_t left = pids.size(); left > 0;) {
    int status = 0;
    const pid_t pid = ::waitpid(-1, &status, 0);
    if (pid < 0 && errno == EINTR) continue;
    if (pid < 0) break;
    std::size_t rank = 0;
    while (rank < pids.size() && pids[rank] != pid) ++rank;
    if (rank == pids.size()) continue;
    pids[rank] = -1;
    --left;
    const int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    if (code == 0 || status_of_first_failure != 0) continue;
    status_of_first_failure = code;
    std::fprintf(stderr, "%s: rank %zu %s %d; stopping the others\n", program, rank,
                 WIFEXITED(status) ? "exited with status" : "was killed by signal",
                 WIFEXITED(status) ? code : WTERMSIG(status));
    for (pid_t other : pids)
      if (other > 0) ::kill(other, SIGTERM);
  }
  return status_of_first_failure;
}

/// P forked processes over the shared-memory transport, with a fresh job id.
int run_forked(const options& o, int ranks, run_info run) {
  run.transport = "shm";
  run.launch = "fork";
  launch_info info;
  info.size = info.local_size = ranks;
  info.job_id = fresh_job_id();
  std::fflush(stdout);
  std::fflush(stderr);
  std::vector<pid_t> pids;
  for (int r = 0; r < ranks; ++r) {
    const pid_t pid = ::fork();
    if (pid < 0) {
      std::fprintf(stderr, "%s: fork: %s\n", program, std::strerror(errno));
      for (pid_t other : pids) ::kill(other, SIGTERM);
      wait_for_ranks(pids);
      return 1;
    }
    if (pid == 0) {
#ifdef __linux__
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);  // never outlive the parent
#endif
      info.rank = info.local_rank = r;
      const int code = report_errors(std::string(program) + ": rank " + std::to_string(r),
                                     [&] { return run_shm_rank(info, o, run); });
      std::fflush(stdout);
      std::fflush(stderr);
      ::_exit(code);
    }
    pids.push_back(pid);
  }
  return wait_for_ranks(pids);
}
#endif  // COHORT_BENCH_HAS_SHM

/// Fails unless `o` fits a group of `ranks`.
void check_ranks(const options& o, int ranks) {
  if (o.root >= ranks)
    throw usage_error("--root " + std::to_string(o.root) + " is not a rank of " +
                      std::to_string(ranks));
}

#if COHORT_BENCH_HAS_TCP
/// One rank over TCP, or over the hierarchical communicator: shm among the ranks of a host, TCP
/// rails between hosts, set up through a store that rank 0 hosts on MASTER_PORT + 1 (with
/// COHORT_TOKEN, which a job across hosts needs).
int run_tcp_rank(const launch_info& info, const options& o, run_info run) {
  tcp_communicator world = make_tcp_communicator(info);
  if (o.transport == "tcp") return run_rank(world, o, run) > 0 ? 1 : 0;
  if (info.master_addr.empty() || info.master_port == 0)
    throw usage_error("--transport hier needs MASTER_ADDR and MASTER_PORT (the store of its "
                      "setup listens on MASTER_PORT + 1)");
  const char* token = std::getenv("COHORT_TOKEN");
  std::unique_ptr<tcp_store_server> server;
  if (info.rank == 0)
    server = std::make_unique<tcp_store_server>(
        info.master_addr, info.master_port + 1,
        tcp_store_server_options{.token = token ? token : "", .log = [](std::string_view) {}});
  tcp_store st(info.master_addr, info.master_port + 1, {.token = token ? token : ""});
  auto hier = make_hierarchical_communicator(world, st, {}, {}, {.base = info.job_id});
  barrier(world);  // every rank has read the store: rank 0 may close it
  server.reset();
  run.transport = "hier " + std::to_string(hier.hosts()) + "x" + std::to_string(hier.local_size());
  return run_rank(hier, o, run) > 0 ? 1 : 0;
}
#endif

/// Joins the job a launcher started, as one rank over shared memory (or TCP, or the
/// hierarchical communicator).
int join_job(const options& o, const launch_info& info, run_info run) {
  if (o.ranks > 0 && o.ranks != info.size)
    throw usage_error("--ranks " + std::to_string(o.ranks) + " but the launcher (" +
                      std::string(launcher_name(info.source)) + ") started " +
                      std::to_string(info.size));
  if (o.transport == "loopback")
    throw usage_error("--transport loopback runs ranks as threads of one process; under a "
                      "launcher use shm");
  check_ranks(o, info.size);
  if (o.transport == "tcp" || o.transport == "hier") {
#if COHORT_BENCH_HAS_TCP
    run.transport = o.transport;
    run.launch = std::string(launcher_name(info.source));
    run.ranks = info.size;
    if (info.rank == 0) run.ceiling = measure_memcpy(o.sizes.back());
    return report_errors(std::string(program) + ": rank " + std::to_string(info.rank),
                         [&] { return run_tcp_rank(info, o, run); });
#else
    throw usage_error("--transport " + o.transport + ": this build has no Boost.Asio");
#endif
  }
#if COHORT_BENCH_HAS_SHM
  run.transport = "shm";
  run.launch = std::string(launcher_name(info.source));
  run.ranks = info.size;
  if (info.rank == 0) run.ceiling = measure_memcpy(o.sizes.back());
  return report_errors(std::string(program) + ": rank " + std::to_string(info.rank),
                       [&] { return run_shm_rank(info, o, run); });
#else
  (void)run;
  throw usage_error("this build has no shm transport (cohort/transport/shm.hpp was not found "
                    "when it was compiled), and a launched rank needs it");
#endif
}

#if COHORT_BENCH_HAS_MPI
/// One rank of an MPI job (mpirun) over the MPI transport, on MPI_COMM_WORLD.
int run_mpi(const options& o, run_info run) {
  MPI_Init(nullptr, nullptr);
  int code = 1;
  {
    mpi_communicator comm = make_mpi_communicator(MPI_COMM_WORLD);
    check_ranks(o, comm.size());
    if (o.ranks > 0 && o.ranks != comm.size())
      throw usage_error("--ranks " + std::to_string(o.ranks) + " but mpirun started " +
                        std::to_string(comm.size()));
    run.transport = "mpi";
    run.launch = "mpirun";
    run.ranks = comm.size();
    if (comm.rank() == 0) run.ceiling = measure_memcpy(o.sizes.back());
    code = report_errors(std::string(program) + ": rank " + std::to_string(comm.rank()),
                         [&] { return run_rank(comm, o, run) > 0 ? 1 : 0; });
  }  // the communicator goes before MPI_Finalize
  MPI_Finalize();
  return code;
}
#endif

/// The whole program after the options: join a launched job, or start the ranks here.
int run(const options& o) {
  run_info run{program, "", "", 0, describe_host(), {}};
  if (o.transport == "mpi") {
#if COHORT_BENCH_HAS_MPI
    return run_mpi(o, run);
#else
    throw usage_error("--transport mpi: this build has no MPI (build with MPI found by Meson)");
#endif
  }
  const launch_info info = launch_info_from_env();
  if (info.size > 1) return join_job(o, info, run);

  run.ranks = o.ranks > 0 ? o.ranks : 2;
  check_ranks(o, run.ranks);
  const std::string transport =
      !o.transport.empty() ? o.transport : (COHORT_BENCH_HAS_SHM ? "shm" : "loopback");
  run.ceiling = measure_memcpy(o.sizes.back());
  if (transport == "loopback") return run_threads(o, run.ranks, run);
  if (transport == "tcp" || transport == "hier")
    throw usage_error("--transport " + transport + " joins a launched job: run it under "
                      "cohort-run, torchrun, mpirun or srun (e.g. cohort-run -n 4 cohort-bench "
                      "--transport " + transport + ")");
#if COHORT_BENCH_HAS_SHM
  return run_forked(o, run.ranks, run);
#else
  throw usage_error("--transport shm: this build has no shm transport (cohort/transport/shm.hpp "
                    "was not found when it was compiled)");
#endif
}

}  // namespace
}  // namespace cohort::bench

int main(int argc, char** argv) {
  using namespace cohort::bench;
  options o;
  try {
    o = parse_options(argc, argv, /*with_transport=*/true);
  } catch (const usage_error& e) {
    std::fprintf(stderr, "%s: %s (see %s --help)\n", program, e.what(), program);
    return 2;
  }
  if (o.help) {
    std::fputs(usage(program, /*with_transport=*/true).c_str(), stdout);
    return 0;
  }
  return report_errors(program, [&] { return run(o); });
}
