// Time to recover in an elastic job at P=4: rank 3 is SIGKILLed at step 3 while the others
// are in an all_reduce; the survivors detect it, agree on generation 1 in a file store, build
// its communicator and sync the state (a broadcast of every byte from the lowest rank with
// the highest committed step). Reported: kill -> every survivor synced in generation 1 (the
// whole recovery), and one more state sync of the same size timed alone.
//
//   elastic_bench [--mib 10,100] [--repeats 3] [--transport shm,tcp]
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <sstream>
#include <string>
#include <vector>

#include <cohort/elastic.hpp>
#include <cohort/elastic/tcp.hpp>
#include <cohort/rendezvous/file_store.hpp>

using namespace std::chrono_literals;

namespace {

std::int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

struct board {
  std::int64_t kill_ns;
  std::int64_t ready_ns[4];
  std::int64_t sync_ns[4];
};

int worker(bool tcp, const std::string& dir, const std::string& job, std::size_t mib, int index,
           board* b) {
  cohort::file_store store(dir);
  cohort::elastic::options o;
  o.job = job;
  o.min_size = 2;
  o.max_size = 4;
  o.timeout = 10s;
  o.check_every = 0;
  std::vector<float> w(mib * (1 << 20) / 4, 1.0f), g(1024);
  cohort::elastic::state st;
  st.add(std::span(w));
  auto train = [&](auto& ctx) {
    if (ctx.current().number == 1) {
      const auto t0 = now_ns();
      st.sync(ctx.comm());
      b->sync_ns[ctx.rank()] = now_ns() - t0;
      return;
    }
    for (std::int64_t step = st.step(); step < 10; ++step) {
      if (index == 3 && step == 3) {
        b->kill_ns = now_ns();
        ::raise(SIGKILL);
      }
      std::fill(g.begin(), g.end(), 1.0f);
      cohort::all_reduce(ctx.comm(), g, cohort::ops::sum);
      w[static_cast<std::size_t>(step)] += g[0];
      ctx.commit(step + 1);
    }
  };
  auto on_generation = [&](const auto& ctx) {
    if (ctx.current().number == 1) b->ready_ns[ctx.rank()] = now_ns();
  };
  try {
    if (tcp) {
      cohort::tcp_options t;
      t.interface = "lo";
      cohort::elastic::run(store, o, st, cohort::elastic::tcp_generations{&store, t}, train,
                           on_generation);
    } else {
      cohort::elastic::run(store, o, st, cohort::elastic::shm_generations{}, train,
                           on_generation);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "worker %d: %s\n", index, e.what());
    return 1;
  }
  return 0;
}

// One recovery: {kill -> all survivors synced, the sync alone}, in ms; {-1, -1} on failure.
std::pair<double, double> once(bool tcp, std::size_t mib, int rep) {
  char d[] = "/tmp/cohort-elastic-bench-XXXXXX";
  if (!::mkdtemp(d)) return {-1, -1};
  auto* b = static_cast<board*>(::mmap(nullptr, sizeof(board), PROT_READ | PROT_WRITE,
                                       MAP_SHARED | MAP_ANONYMOUS, -1, 0));
  *b = {};
  const std::string job = "elbench-" + std::to_string(::getpid()) + "-" + std::to_string(rep) +
                          (tcp ? "t" : "s") + std::to_string(mib);
  std::vector<pid_t> pids;
  for (int i = 0; i < 4; ++i) {
    std::fflush(nullptr);
    const pid_t p = ::fork();
    if (p == 0) ::_exit(worker(tcp, d, job, mib, i, b));
    pids.push_back(p);
  }
  bool ok = true;
  for (int i = 0; i < 4; ++i) {
    int s = 0;
    ::waitpid(pids[static_cast<std::size_t>(i)], &s, 0);
    if (i < 3) ok = ok && WIFEXITED(s) && WEXITSTATUS(s) == 0;
  }
  std::filesystem::remove_all(d);
  std::pair<double, double> r{-1, -1};
  if (ok) {
    std::int64_t ready = 0, sync = 0;
    for (int i = 0; i < 3; ++i) {
      ready = std::max(ready, b->ready_ns[i]);
      sync = std::max(sync, b->sync_ns[i]);
    }
    r = {static_cast<double>(ready - b->kill_ns) / 1e6, static_cast<double>(sync) / 1e6};
  }
  ::munmap(b, sizeof(board));
  return r;
}

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> v;
  std::istringstream in(s);
  for (std::string x; std::getline(in, x, ',');) v.push_back(x);
  return v;
}

}  // namespace

int main(int argc, char** argv) {
  std::string mibs = "10,100", transports = "shm,tcp";
  int repeats = 3;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--mib") mibs = argv[i + 1];
    else if (a == "--repeats") repeats = std::atoi(argv[i + 1]);
    else if (a == "--transport") transports = argv[i + 1];
    else return std::fprintf(stderr, "unknown option %s\n", argv[i]), 2;
  }
  std::printf("| transport | state | recover: kill -> 3 survivors synced (median [min, max]) | "
              "state sync alone (median) |\n|---|---|---|---|\n");
  for (const auto& t : split(transports))
    for (const auto& m : split(mibs)) {
      std::vector<double> total, sync;
      for (int r = 0; r < repeats; ++r) {
        auto [a, s] = once(t == "tcp", static_cast<std::size_t>(std::stoul(m)), r);
        if (a < 0) {
          std::printf("| %s | %s MiB | failed |  |\n", t.c_str(), m.c_str());
          return 1;
        }
        total.push_back(a);
        sync.push_back(s);
      }
      std::sort(total.begin(), total.end());
      std::sort(sync.begin(), sync.end());
      std::printf("| %s | %s MiB | %.0f ms [%.0f, %.0f] | %.0f ms |\n", t.c_str(), m.c_str(),
                  total[total.size() / 2], total.front(), total.back(), sync[sync.size() / 2]);
      std::fflush(stdout);
    }
  return 0;
}
