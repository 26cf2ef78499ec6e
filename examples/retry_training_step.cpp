// Retrying a training step after a rank dies: the shape of torchrun's restarts and Elastic
// Horovod, on one host.
//
//   retry_training_step [--ranks N] [--steps S] [--crash-rank R] [--crash-step K] [--transport shm|tcp]
//
// A supervisor (this process) starts N workers, generation 0. Each trains a toy model: per step
// it computes a gradient, all_reduces it, and takes an SGD step. Worker R crashes (SIGKILL) at
// step K. The others fail with peer_lost (their communicator is poisoned: build a new one) and
// wait for the next generation. The supervisor sees the crash, announces generation 1 in a
// store and starts a new worker R. Every worker builds a new communicator for the new
// generation, the ranks agree on the most advanced state (a survivor may have finished step K
// before it noticed the crash: its all_reduce had all it needed) and copy it from its owner,
// then retry from there. At the end the supervisor checks that every worker holds the model an
// uninterrupted run gives, to the bit. (One failure at a time: a second death during recovery
// would need the survivors to follow the latest generation, as Elastic Horovod does.)
//
// Output (abridged):
//   supervisor: generation 0: 3 workers
//   worker 1 (generation 0): crashing at step 7
//   worker 0 (generation 0): step 7 failed: all_reduce #7: lost rank 1 (...): rebuilding
//   supervisor: rank 1 died (signal 9); generation 1
//   worker 1 (generation 1): joined at step 7 (state from rank 0)
//   supervisor: 3 workers finished 20 steps; every model matches the uninterrupted run
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include <cohort/cohort.hpp>
#include <cohort/rendezvous/file_store.hpp>
#include <cohort/transport/shm.hpp>
#include <cohort/transport/tcp.hpp>

using namespace std::chrono_literals;

namespace {

struct options {
  int ranks = 3, steps = 20, crash_rank = 1, crash_step = 7;
  bool tcp = false;
  std::string store_dir, job;  // set by the supervisor
};

constexpr std::size_t model_size = 100'000;
constexpr float learning_rate = 1.0f / 1024;

// A deterministic gradient of small integers (so that the sum is exact in any order, and the
// uninterrupted run can be recomputed serially).
void gradient(std::vector<float>& g, const std::vector<float>& w, int rank, int step) {
  for (std::size_t i = 0; i < g.size(); ++i)
    g[i] = static_cast<float>(static_cast<int>((i * 7 + static_cast<std::size_t>(rank) * 13 + static_cast<std::size_t>(step) * 31) % 9) - 4) +
           (w[i] > 0 ? 1.0f : 0.0f);
}

std::uint64_t checksum(const std::vector<float>& w) {
  std::uint64_t h = 1469598103934665603ull;
  for (float x : w) {
    std::uint32_t bits;
    std::memcpy(&bits, &x, 4);
    h = (h ^ bits) * 1099511628211ull;
  }
  return h;
}

// One generation's communicator: shm, or TCP meeting at the supervisor's store directory.
template <class Fn>
void with_communicator(const options& o, int rank, int generation, Fn&& fn) {
  const std::string job = o.job + "-g" + std::to_string(generation);
  if (!o.tcp) {
    cohort::shm_communicator comm(std::in_place, job, rank, o.ranks);
    fn(comm);
    return;
  }
  cohort::launch_info info;
  info.rank = rank;
  info.size = info.local_size = o.ranks;
  info.local_rank = rank;
  info.job_id = job;
  cohort::tcp_options t;
  t.interface = "lo";
  t.connect_timeout = 30s;
  cohort::file_store store(o.store_dir);
  auto comm = cohort::make_tcp_communicator(info, store, t);
  fn(comm);
}

int worker(const options& o, int rank, int generation) {
  cohort::file_store control(o.store_dir);
  std::vector<float> w(model_size, 0.0f), g(model_size);
  int step = 0;  // steps done: w is the model after them
  for (;;) {
    bool done = false;
    try {
      with_communicator(o, rank, generation, [&](auto& comm) {
        comm.set_timeout(20s);
        // Agree on the most advanced state and copy it from the lowest rank that holds it.
        std::vector<int> mine{step}, best(1);
        cohort::all_reduce(comm, mine, best, cohort::ops::max);
        std::vector<int> owner{step == best[0] ? rank : o.ranks}, first(1);
        cohort::all_reduce(comm, owner, first, cohort::ops::min);
        cohort::broadcast(comm, w, first[0]);
        if (generation > 0 && step != best[0])
          std::printf("worker %d (generation %d): joined at step %d (state from rank %d)\n", rank, generation, best[0], first[0]);
        step = best[0];
        for (; step < o.steps; ++step) {
          if (rank == o.crash_rank && step == o.crash_step && generation == 0) {
            std::printf("worker %d (generation 0): crashing at step %d\n", rank, step);
            std::fflush(stdout);
            ::raise(SIGKILL);  // a node failure, as far as the others can tell
          }
          gradient(g, w, rank, step);
          cohort::all_reduce(comm, g, cohort::ops::sum);  // throws on failure: the step is retried
          for (std::size_t i = 0; i < w.size(); ++i) w[i] -= learning_rate * g[i];
        }
        done = true;
      });
    } catch (const cohort::error& e) {
      std::printf("worker %d (generation %d): step %d failed: %s: rebuilding\n", rank, generation, step, e.what());
      std::fflush(stdout);
    }
    if (done) break;
    // Wait for the supervisor to announce the next generation, then rebuild.
    ++generation;
    control.get("generation/" + std::to_string(generation), cohort::clock::now() + 60s);
  }
  control.set("result/" + std::to_string(rank), std::to_string(checksum(w)));
  return 0;
}

// The uninterrupted run, serially.
std::uint64_t reference(const options& o) {
  std::vector<float> w(model_size, 0.0f), g(model_size), sum(model_size);
  for (int step = 0; step < o.steps; ++step) {
    std::fill(sum.begin(), sum.end(), 0.0f);
    for (int r = 0; r < o.ranks; ++r) {
      gradient(g, w, r, step);
      for (std::size_t i = 0; i < w.size(); ++i) sum[i] += g[i];
    }
    for (std::size_t i = 0; i < w.size(); ++i) w[i] -= learning_rate * sum[i];
  }
  return checksum(w);
}

pid_t start(const options& o, int rank, int generation) {
  std::fflush(nullptr);
  const pid_t pid = ::fork();
  if (pid == 0) {
    const int code = worker(o, rank, generation);
    std::fflush(nullptr);
    ::_exit(code);
  }
  return pid;
}

}  // namespace

int main(int argc, char** argv) {
  options o;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--ranks") o.ranks = std::atoi(argv[i + 1]);
    else if (a == "--steps") o.steps = std::atoi(argv[i + 1]);
    else if (a == "--crash-rank") o.crash_rank = std::atoi(argv[i + 1]);
    else if (a == "--crash-step") o.crash_step = std::atoi(argv[i + 1]);
    else if (a == "--transport") o.tcp = std::string(argv[i + 1]) == "tcp";
    else return std::fprintf(stderr, "unknown option %s\n", argv[i]), 2;
  }
  char dir[] = "/tmp/cohort-retry-XXXXXX";
  if (!::mkdtemp(dir)) return 1;
  o.store_dir = dir;
  o.job = "retry-" + std::to_string(::getpid());
  cohort::file_store control(o.store_dir);

  int generation = 0;
  std::vector<pid_t> workers(o.ranks);
  std::printf("supervisor: generation 0: %d workers\n", o.ranks);
  for (int r = 0; r < o.ranks; ++r) workers[r] = start(o, r, 0);
  int running = o.ranks, restarts = 0, status = 0;
  while (running > 0) {
    const pid_t pid = ::waitpid(-1, &status, 0);
    int rank = 0;
    while (rank < o.ranks && workers[rank] != pid) ++rank;
    if (rank == o.ranks) continue;
    if (WIFEXITED(status) && WEXITSTATUS(status) == 0) {
      --running;
      continue;
    }
    if (++restarts > 3) {
      std::printf("supervisor: too many failures; giving up\n");
      for (pid_t p : workers) ::kill(p, SIGKILL);
      return 1;
    }
    ++generation;
    std::printf("supervisor: rank %d died (%s %d); generation %d\n", rank,
                WIFSIGNALED(status) ? "signal" : "exit", WIFSIGNALED(status) ? WTERMSIG(status) : WEXITSTATUS(status),
                generation);
    control.set("generation/" + std::to_string(generation), "go");
    workers[rank] = start(o, rank, generation);
  }
  const std::string want = std::to_string(reference(o));
  bool all_match = true;
  for (int r = 0; r < o.ranks; ++r) all_match = all_match && control.try_get("result/" + std::to_string(r)) == want;
  std::filesystem::remove_all(o.store_dir);
  std::printf("supervisor: %d workers finished %d steps after %d restart(s); %s\n", o.ranks, o.steps, restarts,
              all_match ? "every model matches the uninterrupted run" : "MODELS DIFFER from the uninterrupted run");
  return all_match ? 0 : 1;
}
