// The hierarchical communicator with ranks as forked processes: two fake hosts of two ranks
// each on this machine (COHORT_HOST per process), a TCP world meeting at a store on 127.0.0.1,
// shared memory inside each "host" and TCP rails between them. The collective suite at a few
// counts, a world whose hosts interleave, and a killed rank.
//
// Each rank is a child process that exits 0 on success; on failure it prints why to stderr
// (prefixed "[rank r]") and exits non-zero.
#include "../support.hpp"

#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <cohort/cohort.hpp>
#include <cohort/compress/hierarchical.hpp>
#include <cohort/hierarchical_tcp.hpp>
#include <cohort/rendezvous/tcp_store.hpp>
#include <cohort/rendezvous/tcp_store_server.hpp>

#include "../collectives/suite.hpp"
#include "../ports.hpp"

namespace ct = cohort::test;
using namespace std::chrono_literals;
using steady = std::chrono::steady_clock;

namespace {

const std::string token = "hierarchical-test-token";

std::string job_name(const char* what) {
  static int counter = 0;
  return "hiertest-" + std::to_string(::getpid()) + "-" + what + "-" + std::to_string(counter++);
}

void expect(bool ok, const std::string& what) {
  if (!ok) throw std::runtime_error(what);
}

constexpr int killed_at_limit = -1000;

/// A tcp_store_server in a process of its own, killed at the end of the scope. The ranks are
/// forked from a process with no other thread: a child forked while a server thread held a lock
/// (the allocator's, under ASan) would wait on it forever.
struct store_process {
  pid_t pid = -1;
  int port = 0;
  store_process() {
    int fds[2];
    REQUIRE(::pipe(fds) == 0);
    std::fflush(nullptr);
    pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      ::close(fds[0]);
      cohort::tcp_store_server server("127.0.0.1", 0,
                                      {.token = token, .log = [](std::string_view) {}});
      const int p = server.port();
      [[maybe_unused]] const auto w = ::write(fds[1], &p, sizeof p);
      ::close(fds[1]);
      for (;;) ::pause();  // until killed
    }
    ::close(fds[1]);
    pollfd pfd{fds[0], POLLIN, 0};
    const bool ready = ::poll(&pfd, 1, 10'000) == 1 && ::read(fds[0], &port, sizeof port) == sizeof port;
    ::close(fds[0]);
    REQUIRE(ready);
  }
  store_process(const store_process&) = delete;
  store_process& operator=(const store_process&) = delete;
  ~store_process() {
    ::kill(pid, SIGKILL);
    ::waitpid(pid, nullptr, 0);
  }
};

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

/// Nothing of the job left in /dev/shm.
void check_no_segments(const std::string& job) {
  for (const auto& e : std::filesystem::directory_iterator("/dev/shm")) {
    INFO("left in /dev/shm: ", e.path().string());
    CHECK(e.path().filename().string().find(job) == std::string::npos);
  }
}

/// Rank `r` of 4 on fake host `host_of(r)`: a TCP world through the store at `port`, split into
/// the hierarchical communicator.
cohort::hierarchical_tcp_communicator join(int r, int host, int port, const std::string& job) {
  ::setenv("COHORT_HOST", ("fake-host-" + std::to_string(host)).c_str(), 1);
  cohort::tcp_store st("127.0.0.1", port, {.token = token});
  cohort::launch_info info;
  info.rank = r;
  info.size = 4;
  info.job_id = job;
  cohort::tcp_options tcp;
  tcp.interface = "lo";
  tcp.token = token;
  auto world = cohort::make_tcp_communicator(info, st, tcp);
  return cohort::make_hierarchical_communicator(world, st, tcp, {}, {.base = job});
}

template <class T, class Op>
void suite(cohort::hierarchical_tcp_communicator& h, const Op& op, std::uint64_t seed) {
  const int p = h.size();
  for (std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{5}, std::size_t{1000},
                        std::size_t{65537}})
    for (ct::kind k : ct::every_kind) {
      const int root = p - 1 - static_cast<int>(n % static_cast<std::size_t>(p));
      try {
        ct::check<T>(h, k, op, n, root, seed + n);
      } catch (const ct::check_failed& e) {
        h.abort(e.what());
        throw;
      }
    }
}

}  // namespace

TEST_CASE("hierarchical over processes: 2 fake hosts x 2 ranks, shm hosts, TCP rails") {
  const std::string job = job_name("suite");
  store_process store;
  const int port = store.port;
  const auto status = run_ranks(4, [&](int r) {
    auto h = join(r, r / 2, port, job);
    expect(h.rank() == r && h.size() == 4 && h.host() == r / 2 && h.local_rank() == r % 2,
           "not host-major");
    suite<float>(h, cohort::ops::sum, 10);
    suite<float>(h, cohort::ops::max, 20);
    suite<std::int32_t>(h, cohort::ops::sum, 30);
    suite<double>(h, cohort::ops::avg, 40);
    suite<cohort::bf16>(h, cohort::ops::sum, 50);
    ct::check_rounding<float>(h, 10'007, 60);
    std::vector<float> x(70'001, static_cast<float>(r));
    cohort::compressed_all_reduce(h, x, cohort::compress::bf16, cohort::ops::sum);
    expect(x[0] == 6.0f && x[70'000] == 6.0f, "compressed sum is wrong");
    return 0;
  });
  for (std::size_t r = 0; r < status.size(); ++r) {
    INFO("rank ", r, " exited with ", status[r]);
    CHECK(status[r] == 0);
  }
  check_no_segments(job);
}

TEST_CASE("hierarchical over processes: interleaved hosts get host-major ranks (from launch_info)") {
  const std::string job = job_name("interleaved");
  store_process store;
  const int port = store.port;
  const auto status = run_ranks(4, [&](int r) {
    // World ranks 0, 2 on host 0; 1, 3 on host 1; through the launch_info overload.
    ::setenv("COHORT_HOST", ("fake-host-" + std::to_string(r % 2)).c_str(), 1);
    cohort::tcp_store st("127.0.0.1", port, {.token = token});
    cohort::launch_info info;
    info.rank = r;
    info.size = 4;
    info.job_id = job;
    cohort::tcp_options tcp;
    tcp.interface = "lo";
    tcp.token = token;
    auto h = cohort::make_hierarchical_communicator(info, st, tcp);
    expect(h.host() == r % 2 && h.local_rank() == r / 2 && h.rank() == (r % 2) * 2 + r / 2,
           "ranks not host-major");
    suite<std::int32_t>(h, cohort::ops::sum, 70);
    return 0;
  });
  for (std::size_t r = 0; r < status.size(); ++r) {
    INFO("rank ", r, " exited with ", status[r]);
    CHECK(status[r] == 0);
  }
  check_no_segments(job);
}

TEST_CASE("hierarchical over processes: from the launcher's numbers alone (no store of the "
          "user's)") {
  const std::string job = job_name("env");
  const int port = ct::free_port();
  const auto status = run_ranks(4, [&](int r) {
    ::setenv("COHORT_HOST", ("fake-host-" + std::to_string(r / 2)).c_str(), 1);
    cohort::launch_info info;
    info.rank = r;
    info.size = 4;
    info.local_rank = r % 2;
    info.local_size = 2;
    info.master_addr = "127.0.0.1";
    info.master_port = port;
    info.job_id = job;
    cohort::tcp_options tcp;
    tcp.interface = "lo";
    tcp.token = token;
    tcp.connect_timeout = 20s;
    auto h = cohort::make_hierarchical_communicator(info, tcp);
    expect(h.rank() == r && h.host() == r / 2 && h.local_rank() == r % 2, "not host-major");
    suite<float>(h, cohort::ops::sum, 80);
    return 0;
  });
  for (std::size_t r = 0; r < status.size(); ++r) {
    INFO("rank ", r, " exited with ", status[r]);
    CHECK(status[r] == 0);
  }
  check_no_segments(job);
}

TEST_CASE("hierarchical over processes: a killed rank fails every survivor in time") {
  for (int victim : {3, 0}) {
    const std::string job = job_name("kill");
    store_process store;
    const int port = store.port;
    INFO("victim ", victim);
    const auto start = steady::now();
    const auto status = run_ranks(4, [&](int r) {
      auto h = join(r, r / 2, port, job);
      std::vector<float> x(100'000, 1.0f);
      cohort::all_reduce(h, x, cohort::ops::sum);
      if (r == victim) ::raise(SIGKILL);
      const auto t0 = steady::now();
      try {
        for (int i = 0; i < 100; ++i) cohort::all_reduce(h, x, cohort::ops::sum, {.timeout = 10s});
      } catch (const cohort::error& e) {
        const bool expected = e.code() == cohort::errc::peer_lost ||
                              e.code() == cohort::errc::timed_out;
        if (!expected || steady::now() - t0 > 12s) {
          std::fprintf(stderr, "[rank %d] %s (code %d)\n", r, e.what(), e.code().value());
          return 2;
        }
        return 0;
      }
      std::fprintf(stderr, "[rank %d] no failure\n", r);
      return 3;
    }, 60s);
    CHECK(steady::now() - start < 40s);
    for (std::size_t r = 0; r < status.size(); ++r) {
      INFO("rank ", r, " exited with ", status[r]);
      CHECK(status[r] == (static_cast<int>(r) == victim ? -SIGKILL : 0));
    }
    check_no_segments(job);
  }
}

TEST_CASE("hierarchical over processes: hosts of 2 and 1 ranks are invalid_argument everywhere") {
  const std::string job = job_name("uneven");
  store_process store;
  const int port = store.port;
  const auto status = run_ranks(3, [&](int r) {
    ::setenv("COHORT_HOST", r < 2 ? "fake-host-a" : "fake-host-b", 1);
    cohort::tcp_store st("127.0.0.1", port, {.token = token});
    cohort::launch_info info;
    info.rank = r;
    info.size = 3;
    info.job_id = job;
    cohort::tcp_options tcp;
    tcp.interface = "lo";
    tcp.token = token;
    auto world = cohort::make_tcp_communicator(info, st, tcp);
    try {
      (void)cohort::make_hierarchical_communicator(world, st, tcp);
    } catch (const cohort::error& e) {
      expect(e.code() == cohort::errc::invalid_argument, e.what());
      expect(std::string(e.what()).find("2, 1") != std::string::npos, e.what());
      std::vector<int> x(10, 1);  // the world goes on
      cohort::all_reduce(world, x, cohort::ops::sum);
      expect(x[9] == 3, "the world's all_reduce is wrong");
      return 0;
    }
    return 4;
  });
  for (std::size_t r = 0; r < status.size(); ++r) {
    INFO("rank ", r, " exited with ", status[r]);
    CHECK(status[r] == 0);
  }
}
