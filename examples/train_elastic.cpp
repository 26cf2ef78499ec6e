// Elastic data-parallel training of the digits MLP: 4 workers, one killed at step K, a
// replacement started at step K2, every membership change printed.
//
//   train_elastic [--ranks 4] [--steps 400] [--kill-step 100] [--join-step 200]
//                 [--transport shm|tcp] [--data digits.csv.gz]
//
// A supervisor (this process) forks the workers; they meet at a file store and train with
// cohort::elastic::run. The global batch is fixed (64 examples a step, taken in a shared
// order); a generation of P ranks splits each batch P ways (rank r takes examples r, r+P, ...)
// and sums the per-rank gradients scaled by each rank's share, so the learning rate needs no
// change when P does. The state is the parameters and the momentum. Worker 2 SIGKILLs itself
// at step K: the others go on in generation 1 with 3 ranks. When rank 0 commits step K2 the
// supervisor starts a replacement, which the others wait for at that step (at most 10 s): it
// is taken in at the next commit (generation 2, 4 ranks) and receives the state. At the end
// every worker holds the same parameters, to the bit, and the supervisor prints the test
// accuracy beside that of the same training with no rank lost (it must be within a point).
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
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

#include "common/digits.hpp"
#include "common/mlp.hpp"

namespace ex = cohort::examples;
using namespace std::chrono_literals;

namespace {

struct settings {
  int ranks = 4, steps = 400, kill_step = 100, join_step = 200, victim = 2;
  std::size_t batch = 64;
  float lr = 0.05f, momentum = 0.9f;
  bool tcp = false;
  std::string data = COHORT_DIGITS_PATH, dir, job;
};

std::uint64_t checksum(std::span<const float> w) {
  std::uint64_t h = 1469598103934665603ull;
  for (float x : w) {
    std::uint32_t bits;
    std::memcpy(&bits, &x, 4);
    h = (h ^ bits) * 1099511628211ull;
  }
  return h;
}

int worker(const settings& s, int name) {
  cohort::file_store store(s.dir);
  const auto [train_set, test_set] = ex::split(ex::load_digits(s.data), 0.2, 7);
  ex::mlp model({train_set.features, 64, train_set.classes}, 1);
  std::vector<float> velocity(model.parameters().size(), 0.0f);
  cohort::elastic::state st;
  st.add(model.parameters());
  st.add(std::span(velocity));
  cohort::elastic::options o;
  o.job = s.job;
  o.min_size = 2;
  o.max_size = s.ranks;
  o.timeout = 10s;

  auto train = [&](auto& ctx) {
    const std::size_t p = static_cast<std::size_t>(ctx.size()), r = static_cast<std::size_t>(ctx.rank());
    for (std::int64_t step = st.step(); step < s.steps; ++step) {
      if (name == s.victim && step == s.kill_step) {
        std::printf("worker %d: killed at step %lld\n", name, static_cast<long long>(step));
        std::fflush(stdout);
        ::raise(SIGKILL);
      }
      const auto epoch = static_cast<std::size_t>(step) * s.batch / train_set.size();
      const auto order = ex::permutation(train_set.size(), 1000 + epoch);  // shared
      std::vector<std::size_t> rows;
      for (std::size_t k = r; k < s.batch; k += p)
        rows.push_back(order[(static_cast<std::size_t>(step) * s.batch + k) % train_set.size()]);
      model.backward_batch(train_set, rows);  // the mean over this rank's rows
      const float share = static_cast<float>(rows.size()) / static_cast<float>(s.batch);
      for (float& g : model.gradients()) g *= share;
      cohort::all_reduce(ctx.comm(), model.gradients(), cohort::ops::sum);
      auto w = model.parameters();
      auto g = model.gradients();
      for (std::size_t i = 0; i < w.size(); ++i) {
        velocity[i] = s.momentum * velocity[i] + g[i];
        w[i] -= s.lr * velocity[i];
      }
      ctx.commit(step + 1);
      if (ctx.rank() == 0 && ((step + 1) % 10 == 0 || step + 1 == s.join_step))
        store.set("progress", std::to_string(step + 1));
      // From join_step on, short of ranks: wait at this step (at most 10 s) for the replacement
      // rather than finish without it. The count bounds the loop on every rank alike (each
      // commit is collective); the commit that sees the newcomer ends the generation.
      for (int i = 0; i < 1000 && step + 1 >= s.join_step && ctx.size() < s.ranks; ++i) {
        std::this_thread::sleep_for(10ms);
        ctx.commit(step + 1);
      }
    }
  };
  auto on_generation = [&](const auto& ctx) {
    if (ctx.rank() == 0)
      std::printf("generation %llu: %d ranks, from step %lld\n",
                  static_cast<unsigned long long>(ctx.current().number), ctx.size(),
                  static_cast<long long>(st.step()));
    std::fflush(stdout);
  };
  try {
    if (s.tcp) {
      cohort::tcp_options t;
      t.interface = "lo";
      cohort::elastic::run(store, o, st, cohort::elastic::tcp_generations{&store, t}, train,
                           on_generation);
    } else {
      cohort::elastic::run(store, o, st, cohort::elastic::shm_generations{}, train, on_generation);
    }
  } catch (const cohort::error& e) {
    std::printf("worker %d: %s\n", name, e.what());
    return 1;
  }
  store.set("result/" + std::to_string(name), std::to_string(checksum(model.parameters())) + " " +
                                                  std::to_string(model.accuracy(test_set)));
  return 0;
}

// The same training in this process with nothing killed or added: every step's gradient is
// the mean over the whole batch, as the workers' scaled sum is. The accuracy it reaches.
double uninterrupted(const settings& s) {
  const auto [train_set, test_set] = ex::split(ex::load_digits(s.data), 0.2, 7);
  ex::mlp model({train_set.features, 64, train_set.classes}, 1);
  std::vector<float> velocity(model.parameters().size(), 0.0f);
  for (std::int64_t step = 0; step < s.steps; ++step) {
    const auto epoch = static_cast<std::size_t>(step) * s.batch / train_set.size();
    const auto order = ex::permutation(train_set.size(), 1000 + epoch);
    std::vector<std::size_t> rows;
    for (std::size_t k = 0; k < s.batch; ++k)
      rows.push_back(order[(static_cast<std::size_t>(step) * s.batch + k) % train_set.size()]);
    model.backward_batch(train_set, rows);
    auto w = model.parameters();
    auto g = model.gradients();
    for (std::size_t i = 0; i < w.size(); ++i) {
      velocity[i] = s.momentum * velocity[i] + g[i];
      w[i] -= s.lr * velocity[i];
    }
  }
  return model.accuracy(test_set);
}

pid_t start(const settings& s, int name) {
  std::fflush(nullptr);
  const pid_t pid = ::fork();
  if (pid == 0) {
    int code = 1;
    try {
      code = worker(s, name);
    } catch (const std::exception& e) {
      std::printf("worker %d: %s\n", name, e.what());
    }
    std::fflush(nullptr);
    ::_exit(code);
  }
  return pid;
}

}  // namespace

int main(int argc, char** argv) {
  settings s;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i], v = argv[i + 1];
    if (a == "--ranks") s.ranks = std::stoi(v);
    else if (a == "--steps") s.steps = std::stoi(v);
    else if (a == "--kill-step") s.kill_step = std::stoi(v);
    else if (a == "--join-step") s.join_step = std::stoi(v);
    else if (a == "--transport") s.tcp = v == "tcp";
    else if (a == "--data") s.data = v;
    else return std::fprintf(stderr, "unknown option %s\n", argv[i]), 2;
  }
  if (s.ranks < 3 || s.kill_step >= s.join_step || s.join_step >= s.steps)
    return std::fprintf(stderr, "need --ranks >= 3 and kill-step < join-step < steps\n"), 2;
  char dir[] = "/tmp/cohort-elastic-XXXXXX";
  if (!::mkdtemp(dir)) return 1;
  s.dir = dir;
  s.job = "train-elastic-" + std::to_string(::getpid());
  cohort::file_store store(s.dir);
  std::printf("supervisor: %d workers, %d steps of %zu examples (%s)\n", s.ranks, s.steps, s.batch,
              s.tcp ? "tcp" : "shm");
  std::vector<pid_t> workers;
  for (int n = 0; n < s.ranks; ++n) workers.push_back(start(s, n));
  // Start the replacement once rank 0 has committed join_step (bounded: 60 s).
  for (int i = 0; i < 6000; ++i) {
    const auto p = store.try_get("progress");
    if (p && std::stoi(*p) >= s.join_step) break;
    std::this_thread::sleep_for(10ms);
  }
  std::printf("supervisor: starting a replacement worker\n");
  workers.push_back(start(s, s.ranks));
  bool ok = true;
  for (std::size_t n = 0; n < workers.size(); ++n) {
    int status = 0;
    ::waitpid(workers[n], &status, 0);
    const bool victim = static_cast<int>(n) == s.victim;
    ok = ok && (victim ? WIFSIGNALED(status) : (WIFEXITED(status) && WEXITSTATUS(status) == 0));
  }
  std::string first;
  for (std::size_t n = 0; n < workers.size() && ok; ++n) {
    if (static_cast<int>(n) == s.victim) continue;
    const auto r = store.try_get("result/" + std::to_string(n)).value_or("");
    if (first.empty()) first = r;
    ok = ok && !r.empty() && r == first;
  }
  std::filesystem::remove_all(s.dir);
  if (!ok) return std::printf("supervisor: FAILED (a worker failed, or the models differ)\n"), 1;
  const double accuracy = std::stod(first.substr(first.find(' ') + 1));
  const double reference = uninterrupted(s);
  std::printf("supervisor: %d workers hold the same parameters; test accuracy %.1f%% "
              "(uninterrupted: %.1f%%)\n",
              s.ranks, 100 * accuracy, 100 * reference);
  // Within a point of the run that lost no rank, and trained.
  return accuracy > 0.9 && std::abs(accuracy - reference) <= 0.01 ? 0 : 1;
}
