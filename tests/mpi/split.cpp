// Splitting communicators (<cohort/split.hpp>, <cohort/split_tcp.hpp>), ranks as forked
// processes over shared memory: the collective suite on the sub-communicators, the order by
// key, split_none, split_by_host, and TCP sub-communicators meeting at a file store.
//
// Each rank is a child process that exits 0 on success; on failure it prints why to stderr
// (prefixed "[rank r]") and exits non-zero, and the parent test reports which rank failed.
#include "../support.hpp"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <cohort/cohort.hpp>
#include <cohort/split.hpp>
#include <cohort/transport/shm.hpp>
#if defined(COHORT_TEST_SPLIT_TCP)
#include <cohort/rendezvous/file_store.hpp>
#include <cohort/split_tcp.hpp>
#endif

#include "../collectives/suite.hpp"

namespace ct = cohort::test;
using namespace std::chrono_literals;
using steady = std::chrono::steady_clock;

namespace {

std::string job_name(const char* what) {
  static int counter = 0;
  return "splittest-" + std::to_string(::getpid()) + "-" + what + "-" + std::to_string(counter++);
}

void expect(bool ok, const std::string& what) {
  if (!ok) throw std::runtime_error(what);
}

constexpr int killed_at_limit = -1000;

/// Runs `body(rank)` in `p` forked processes; returns their exit statuses (-N: signal N,
/// killed_at_limit: still running at `limit`, then killed).
template <class Body>
std::vector<int> run_ranks(int p, Body body, steady::duration limit = 120s) {
  std::vector<pid_t> pids;
  for (int r = 0; r < p; ++r) {
    std::fflush(nullptr);
    const pid_t pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      int code = 1;
      try {
        code = body(r);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "[rank %d] %s\n", r, e.what());
      }
      std::fflush(nullptr);
      ::_exit(code);
    }
    pids.push_back(pid);
  }
  std::vector<int> status(pids.size(), killed_at_limit);
  std::vector<bool> done(pids.size(), false);
  const auto until = steady::now() + limit;
  for (std::size_t left = pids.size(); left > 0;) {
    for (std::size_t i = 0; i < pids.size(); ++i) {
      int st = 0;
      if (done[i] || ::waitpid(pids[i], &st, WNOHANG) != pids[i]) continue;
      status[i] = WIFEXITED(st) ? WEXITSTATUS(st) : -WTERMSIG(st);
      done[i] = true;
      --left;
    }
    if (left > 0 && steady::now() > until) {
      for (std::size_t i = 0; i < pids.size(); ++i)
        if (!done[i]) {
          ::kill(pids[i], SIGKILL);
          ::waitpid(pids[i], nullptr, 0);
        }
      break;
    }
    if (left > 0) std::this_thread::sleep_for(2ms);
  }
  return status;
}

void check_all_passed(const std::vector<int>& status) {
  for (std::size_t r = 0; r < status.size(); ++r) {
    INFO("rank ", r, " exited with ", status[r]);
    CHECK(status[r] == 0);
  }
}

/// The collective suite on `comm` at its counts (thinned by COHORT_TEST_SCALE), every kind, for
/// float sum and max, double sum and bf16 sum; a failed check aborts `comm` and throws.
template <cohort::communicator Comm>
void suite(Comm& comm, std::uint64_t seed) {
  const int p = comm.size();
  auto run = [&]<class T>(const auto& op, std::type_identity<T>) {
    for (std::size_t n : ct::counts_for<T>(p))
      for (ct::kind k : ct::every_kind) {
        const int root = p - 1 - static_cast<int>(n % static_cast<std::size_t>(p));
        try {
          ct::check<T>(comm, k, op, n, root, seed + n);
        } catch (const ct::check_failed& e) {
          comm.abort(e.what());
          throw;
        }
      }
  };
  run(cohort::ops::sum, std::type_identity<float>{});
  run(cohort::ops::max, std::type_identity<float>{});
  run(cohort::ops::sum, std::type_identity<double>{});
  run(cohort::ops::sum, std::type_identity<cohort::bf16>{});
  ct::check_rounding<float>(comm, 10'007, seed);
}

/// Each rank's parent rank, all-gathered over the sub-communicator: the order the split made.
template <cohort::communicator Comm>
std::vector<std::int32_t> parents_in_order(Comm& sub, int parent_rank) {
  const std::int32_t mine = parent_rank;
  std::vector<std::int32_t> all(static_cast<std::size_t>(sub.size()));
  cohort::all_gather(sub, std::span(&mine, 1), all);
  return all;
}

/// After a split the parent goes on working: an all_reduce of its ranks.
template <cohort::communicator Comm>
void parent_still_works(Comm& parent) {
  std::vector<std::int32_t> x(1000, parent.rank() + 1);
  cohort::all_reduce(parent, x, cohort::ops::sum);
  const int p = parent.size();
  expect(x[999] == p * (p + 1) / 2, "the parent's all_reduce after the split is wrong");
}

}  // namespace

TEST_CASE("split: P=4 by rank % 2, keys reversing the order; the suite on each half") {
  const std::string job = job_name("halves");
  check_all_passed(run_ranks(4, [&](int r) {
    cohort::shm_communicator parent(std::in_place, job, r, 4);
    auto sub = cohort::split_shm(parent, r % 2, -r);
    expect(sub != nullptr, "no sub-communicator");
    expect(sub->size() == 2, "size " + std::to_string(sub->size()) + ", not 2");
    // Color 0 is {0, 2}, color 1 is {1, 3}; the keys put the higher parent rank first.
    expect(sub->rank() == (r >= 2 ? 0 : 1), "rank " + std::to_string(sub->rank()));
    const auto order = parents_in_order(*sub, r);
    expect(order[0] == r % 2 + 2 && order[1] == r % 2, "members out of order");
    suite(*sub, 1000 + static_cast<std::uint64_t>(r % 2));
    parent_still_works(parent);
    // A second split of the same parent gets its own job id: the whole group, in order.
    auto all = cohort::split_shm(parent, 7, 0);
    expect(all && all->size() == 4 && all->rank() == r, "the second split is wrong");
    suite(*all, 77);
    return 0;
  }));
}

TEST_CASE("split: split_none gets no communicator; equal keys keep the parent's order") {
  const std::string job = job_name("none");
  check_all_passed(run_ranks(3, [&](int r) {
    cohort::shm_communicator parent(std::in_place, job, r, 3);
    const auto info = cohort::plan_split(parent, r == 1 ? cohort::split_none : 5, 0);
    expect(info.members == std::vector<int>(r == 1 ? std::vector<int>{} : std::vector<int>{0, 2}),
           "the members are wrong");
    auto sub = cohort::split_shm(parent, r == 1 ? cohort::split_none : 5, 0);
    if (r == 1) {
      expect(sub == nullptr, "split_none got a communicator");
    } else {
      expect(sub && sub->size() == 2 && sub->rank() == r / 2, "rank or size wrong");
      suite(*sub, 5);
    }
    parent_still_works(parent);
    return 0;
  }));
}

TEST_CASE("split_by_host: every rank here, in the parent's order") {
  const std::string job = job_name("host");
  check_all_passed(run_ranks(3, [&](int r) {
    cohort::shm_communicator parent(std::in_place, job, r, 3);
    expect(cohort::host_color(parent) == 0, "the ranks of one host disagree on its color");
    auto host = cohort::split_by_host(parent);
    expect(host && host->size() == 3 && host->rank() == r, "not the whole host, in order");
    const auto order = parents_in_order(*host, r);
    expect(order == std::vector<std::int32_t>{0, 1, 2}, "members out of order");
    std::vector<float> x(70'001, float(r));
    cohort::all_reduce(*host, x, cohort::ops::sum);
    expect(x[70'000] == 3.0f, "wrong sum on the host communicator");
    return 0;
  }));
}

TEST_CASE("split: a bad base is invalid_argument before anything is sent") {
  cohort::run_loopback(2, [](cohort::loopback_communicator& comm) {
    try {
      (void)cohort::split_shm(comm, 0, 0, {}, {.base = "no/slashes"});
      FAIL("no error");
    } catch (const cohort::error& e) {
      CHECK(e.code() == cohort::errc::invalid_argument);
    }
    CHECK(!comm.poisoned());
  });
}

#if defined(COHORT_TEST_SPLIT_TCP)
TEST_CASE("split_tcp: P=4 into {0,1} and {2,3} over TCP, meeting at one file store") {
  const std::string job = job_name("tcp");
  const auto dir = std::filesystem::temp_directory_path() / job;
  check_all_passed(run_ranks(4, [&](int r) {
    cohort::shm_communicator parent(std::in_place, job, r, 4);
    cohort::file_store st(dir.string());
    cohort::tcp_options tcp;
    tcp.interface = "lo";  // no traffic off this machine
    auto sub = cohort::split_tcp(parent, r / 2, r, st, tcp);
    expect(sub && sub->size() == 2 && sub->rank() == r % 2, "rank or size wrong");
    suite(*sub, 40 + static_cast<std::uint64_t>(r / 2));
    parent_still_works(parent);
    return 0;
  }));
  std::filesystem::remove_all(dir);
}
#endif
