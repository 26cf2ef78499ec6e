// Going on after a rank dies, with cohort::elastic: the shape of Elastic Horovod and torchrun's
// elastic agent, on one host.
//
//   retry_training_step [--ranks N] [--steps S] [--crash-rank R] [--crash-step K] [--transport shm|tcp]
//
// A supervisor (this process) starts N workers. Each trains a toy model with
// cohort::elastic::run: per step the generation's ranks split N data shards between them,
// all_reduce their gradients and take an SGD step, then commit. The worker started as R
// crashes (SIGKILL) at step K. The others fail with peer_lost, agree in the store on generation
// 1 (N-1 ranks), sync the state from the most advanced of them and go on. The supervisor starts
// a replacement, which registers in the store and is taken in at the next commit (generation
// 2, N ranks again); it receives the state. The gradients are small integers, exact in any
// order of summation, so every worker ends with the model an uninterrupted run gives, to the
// bit: the supervisor checks it.
//
// Output (abridged):
//   supervisor: 3 workers
//   worker 1: generation 0: rank 1 of 3, from step 0
//   worker 1: crashing at step 7
//   worker 0: generation 1: rank 0 of 2, from step 7 (state from rank 0)
//   supervisor: worker 1 died (signal 9); starting a replacement
//   worker 3: generation 2: rank 2 of 3, from step 8 (state from rank 0)
//   supervisor: 3 workers finished 20 steps; every model matches the uninterrupted run
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include <cohort/cohort.hpp>
#include <cohort/elastic.hpp>
#include <cohort/elastic/tcp.hpp>
#include <cohort/rendezvous/file_store.hpp>

using namespace std::chrono_literals;

namespace {

struct options {
  int ranks = 3, steps = 20, crash_rank = 1, crash_step = 7;
  bool tcp = false;
  std::string store_dir, job;  // set by the supervisor
};

constexpr std::size_t model_size = 100'000;
constexpr float learning_rate = 1.0f / 1024;

// Shard `shard`'s gradient: small integers, so that a sum is exact in any order.
void add_gradient(std::vector<float>& g, const std::vector<float>& w, int shard, std::int64_t step) {
  for (std::size_t i = 0; i < g.size(); ++i)
    g[i] += static_cast<float>(static_cast<int>((i * 7 + static_cast<std::size_t>(shard) * 13 +
                                                 static_cast<std::size_t>(step) * 31) % 9) - 4) +
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

int worker(const options& o, int name) {
  cohort::file_store store(o.store_dir);
  cohort::elastic::options eo;
  eo.job = o.job;
  eo.min_size = 1;
  eo.max_size = o.ranks;
  eo.timeout = 20s;
  std::vector<float> w(model_size, 0.0f), g(model_size);
  cohort::elastic::state st;
  st.add(std::span(w));

  auto train = [&](auto& ctx) {
    // Short of ranks: hold at this step (at most 5 s) until a replacement is taken in.
    for (int i = 0; i < 500 && ctx.size() < o.ranks; ++i) {
      ctx.commit(st.step());  // ends the generation once a newcomer waits
      std::this_thread::sleep_for(10ms);
    }
    for (std::int64_t step = st.step(); step < o.steps; ++step) {
      if (name == o.crash_rank && step == o.crash_step) {
        std::printf("worker %d: crashing at step %lld\n", name, static_cast<long long>(step));
        std::fflush(stdout);
        ::raise(SIGKILL);  // a node failure, as far as the others can tell
      }
      std::fill(g.begin(), g.end(), 0.0f);
      for (int shard = ctx.rank(); shard < o.ranks; shard += ctx.size()) add_gradient(g, w, shard, step);
      cohort::all_reduce(ctx.comm(), g, cohort::ops::sum);
      for (std::size_t i = 0; i < w.size(); ++i) w[i] -= learning_rate * g[i];
      ctx.commit(step + 1);
    }
  };
  auto on_generation = [&](const auto& ctx) {
    std::printf("worker %d: generation %llu: rank %d of %d, from step %lld", name,
                static_cast<unsigned long long>(ctx.current().number), ctx.rank(), ctx.size(),
                static_cast<long long>(st.step()));
    if (ctx.current().number > 0) std::printf(" (state from rank %d)", ctx.synced_from());
    std::printf("\n");
    std::fflush(stdout);
  };
  try {
    if (o.tcp) {
      cohort::tcp_options t;
      t.interface = "lo";
      t.connect_timeout = 30s;
      cohort::elastic::run(store, eo, st, cohort::elastic::tcp_generations{&store, t}, train,
                           on_generation);
    } else {
      cohort::elastic::run(store, eo, st, cohort::elastic::shm_generations{}, train, on_generation);
    }
  } catch (const cohort::error& e) {
    std::printf("worker %d: %s\n", name, e.what());
    return 1;
  }
  store.set("result/" + std::to_string(name), std::to_string(checksum(w)));
  return 0;
}

// The uninterrupted run, serially.
std::uint64_t reference(const options& o) {
  std::vector<float> w(model_size, 0.0f), g(model_size);
  for (int step = 0; step < o.steps; ++step) {
    std::fill(g.begin(), g.end(), 0.0f);
    for (int s = 0; s < o.ranks; ++s) add_gradient(g, w, s, step);
    for (std::size_t i = 0; i < w.size(); ++i) w[i] -= learning_rate * g[i];
  }
  return checksum(w);
}

pid_t start(const options& o, int name) {
  std::fflush(nullptr);
  const pid_t pid = ::fork();
  if (pid == 0) {
    const int code = worker(o, name);
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

  std::printf("supervisor: %d workers\n", o.ranks);
  std::vector<pid_t> workers;
  for (int r = 0; r < o.ranks; ++r) workers.push_back(start(o, r));
  std::vector<int> finished;
  int status = 0, restarts = 0;
  bool failed = false;
  for (std::size_t running = workers.size(); running > 0; --running) {
    const pid_t pid = ::waitpid(-1, &status, 0);
    int name = 0;
    while (name < static_cast<int>(workers.size()) && workers[static_cast<std::size_t>(name)] != pid) ++name;
    if (name == static_cast<int>(workers.size())) {
      ++running;
      continue;
    }
    if (WIFEXITED(status) && WEXITSTATUS(status) == 0) {
      finished.push_back(name);
    } else if (WIFSIGNALED(status) && restarts < 3) {
      ++restarts;
      std::printf("supervisor: worker %d died (signal %d); starting a replacement\n", name, WTERMSIG(status));
      workers.push_back(start(o, static_cast<int>(workers.size())));
      ++running;
    } else {
      failed = true;
    }
  }
  cohort::file_store control(o.store_dir);
  const std::string want = std::to_string(reference(o));
  bool all_match = !failed && static_cast<int>(finished.size()) == o.ranks;
  for (int n : finished) all_match = all_match && control.try_get("result/" + std::to_string(n)) == want;
  std::filesystem::remove_all(o.store_dir);
  std::printf("supervisor: %zu workers finished %d steps after %d restart(s); %s\n", finished.size(), o.steps,
              restarts, all_match ? "every model matches the uninterrupted run" : "MODELS DIFFER from the uninterrupted run");
  return all_match ? 0 : 1;
}
