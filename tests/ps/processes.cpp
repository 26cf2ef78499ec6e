// The parameter server with ranks as processes over shm and TCP: training steps in each mode,
// then SIGKILLed ranks. A worker killed mid-run: async and ssp servers go on and the other
// workers finish; in sync mode every survivor fails with peer_lost within the deadline. A
// killed server: every worker fails with peer_lost. Each rank reports through its exit code.
#include <doctest/doctest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cohort/parameter_server.hpp>
#include <cohort/transport/shm.hpp>
#include <cohort/transport/tcp.hpp>
#include <cstdio>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "../faults/process.hpp"

using namespace std::chrono_literals;
namespace ps = cohort::ps;
using steady = std::chrono::steady_clock;

namespace {

// Exit codes: 0 finished, 10 + errc for a cohort::error, 1 anything else.
constexpr int code_of(cohort::errc e) { return 10 + static_cast<int>(e); }

enum class transport_kind { shm, tcp };

struct job {
  transport_kind kind = transport_kind::shm;
  int servers = 1, size = 3;
  std::string id = {};
  int port = 0;
  std::chrono::milliseconds timeout = 4000ms;  // every call's
};

template <class Fn>
int run_rank(const job& j, int rank, Fn&& fn) {
  try {
    if (j.kind == transport_kind::shm) {
      cohort::shm_options o;
      o.liveness_interval = 100ms;
      cohort::shm_communicator comm(std::in_place, j.id, rank, j.size, o);
      comm.set_timeout(j.timeout);
      fn(comm);
    } else {
      cohort::launch_info info;
      info.rank = info.local_rank = rank;
      info.size = info.local_size = j.size;
      info.job_id = j.id;
      info.master_addr = "127.0.0.1";
      info.master_port = j.port;
      auto o = cohort::faults::tcp_test_options(10s);
      cohort::basic_communicator<cohort::tcp_transport> comm(std::in_place, info, o);
      comm.set_timeout(j.timeout);
      fn(comm);
    }
    return 0;
  } catch (const cohort::error& e) {
    std::fprintf(stderr, "[rank %d] %s (peer %d)\n", rank, e.what(), e.peer());
    return e.code().category() == cohort::error_category() ? 10 + e.code().value() : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "[rank %d] %s\n", rank, e.what());
    return 1;
  }
}

// Runs every rank of `j` as a process; `killed` (if >= 0) SIGKILLs itself after `kill_after`
// steps. Returns the exit codes (-N: signal N, -1000: still running at the limit, then killed).
std::vector<int> run_job(job j, ps::consistency mode, int killed, int kill_after,
                         steady::duration* took = nullptr) {
  static int counter = 0;
  j.id = "ps-test-" + std::to_string(::getpid()) + "-" + std::to_string(++counter);
  if (j.kind == transport_kind::tcp) j.port = cohort::faults::free_port();
  const ps::roles roles{j.servers, j.size};
  const std::vector<ps::key_spec> keys = {{0, 100'003}, {1, 10}};
  const auto start = steady::now();
  std::vector<pid_t> pids;
  std::fflush(nullptr);
  for (int r = 0; r < j.size; ++r) {
    const pid_t pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      const int code = run_rank(j, r, [&](auto& comm) {
        if (roles.is_server(r)) {
          ps::server_options o;
          o.mode = mode;
          ps::server srv(comm, keys, roles, o);
          if (r == killed) ::raise(SIGKILL);
          srv.serve();
          if (killed >= 0 && mode.mode != ps::consistency_mode::sync && srv.dropped() != 1)
            throw std::runtime_error("the killed worker was not dropped");
          return;
        }
        ps::worker wk(comm, keys, roles);
        std::vector<float> w0(100'003), g0(100'003, 0.001f), w1(10), g1(10, 0.5f);
        for (int t = 0; t < 30; ++t) {
          if (r == killed && t == kill_after) ::raise(SIGKILL);
          wk.pull(0, w0);
          wk.pull(1, w1);
          wk.wait_all();
          wk.push(0, g0);
          wk.push(1, g1);
        }
        wk.finish();
      });
      std::fflush(nullptr);
      ::_exit(code);
    }
    pids.push_back(pid);
  }
  std::vector<int> codes(pids.size(), -1000);
  std::vector<bool> done(pids.size(), false);
  const auto limit = steady::now() + 20s;
  for (std::size_t left = pids.size(); left > 0;) {
    for (std::size_t i = 0; i < pids.size(); ++i) {
      int st = 0;
      if (done[i] || ::waitpid(pids[i], &st, WNOHANG) != pids[i]) continue;
      codes[i] = WIFEXITED(st) ? WEXITSTATUS(st) : -WTERMSIG(st);
      done[i] = true;
      --left;
    }
    if (left == 0) break;
    if (steady::now() > limit) {
      for (std::size_t i = 0; i < pids.size(); ++i)
        if (!done[i]) {
          ::kill(pids[i], SIGKILL);
          ::waitpid(pids[i], nullptr, 0);
        }
      break;
    }
    std::this_thread::sleep_for(2ms);
  }
  if (took) *took = steady::now() - start;
  return codes;
}

}  // namespace

TEST_CASE("ps processes: training steps in every mode, shm and TCP") {
  for (auto kind : {transport_kind::shm, transport_kind::tcp})
    for (auto mode : {ps::consistency::sync(), ps::consistency::async(), ps::consistency::ssp(2)}) {
      CAPTURE(static_cast<int>(kind));
      CAPTURE(static_cast<int>(mode.mode));
      const auto codes = run_job(job{kind, 2, 5, {}, 0}, mode, -1, 0);
      for (int c : codes) CHECK(c == 0);
    }
}

TEST_CASE("ps processes: a killed worker") {
  for (auto kind : {transport_kind::shm, transport_kind::tcp}) {
    CAPTURE(static_cast<int>(kind));
    SUBCASE("async and ssp servers go on; the other workers finish") {
      for (auto mode : {ps::consistency::async(), ps::consistency::ssp(1)}) {
        const auto codes = run_job(job{kind, 1, 4, {}, 0}, mode, 3, 5);
        CHECK(codes[3] == -SIGKILL);
        CHECK(codes[0] == 0);
        CHECK(codes[1] == 0);
        CHECK(codes[2] == 0);
      }
    }
    SUBCASE("sync: every survivor fails with peer_lost within the deadline") {
      steady::duration took{};
      const auto codes = run_job(job{kind, 2, 5, {}, 0}, ps::consistency::sync(), 4, 5, &took);
      CHECK(codes[4] == -SIGKILL);
      for (int r = 0; r < 4; ++r)
        CHECK(codes[static_cast<std::size_t>(r)] == code_of(cohort::errc::peer_lost));
      CHECK(took < 4s);
    }
  }
}

TEST_CASE("ps processes: a killed server fails every rank with peer_lost") {
  for (auto kind : {transport_kind::shm, transport_kind::tcp}) {
    CAPTURE(static_cast<int>(kind));
    steady::duration took{};
    const auto codes = run_job(job{kind, 2, 4, {}, 0}, ps::consistency::async(), 1, 0, &took);
    CHECK(codes[1] == -SIGKILL);
    for (int r : {0, 2, 3})
      CHECK(codes[static_cast<std::size_t>(r)] == code_of(cohort::errc::peer_lost));
    CHECK(took < 4s);
  }
}

TEST_CASE("ps processes: a worker that pushes, then computes, does not hold up the others") {
  // Over shm a send moves only inside its sender's calls: worker 1 pushes 4 MiB (more than
  // the ring holds) and sleeps before it waits. The server receives that payload while it
  // answers worker 2, whose round trips must stay well under that sleep: a server held up by
  // worker 1 would keep one of them waiting for nearly all of it. Under TSan, beside other
  // tests, the first round trip has taken up to 1.5 s: there the sleep, the bound and the calls'
  // deadline are longer.
  constexpr bool slow = cohort::faults::sanitized;
  constexpr auto hold = slow ? 6000ms : 1500ms;
  constexpr auto bound = slow ? 3000ms : 200ms;
  const std::string id = "ps-test-" + std::to_string(::getpid()) + "-hold";
  const ps::roles roles{1, 3};
  const std::vector<ps::key_spec> keys = {{0, std::size_t{1} << 20}, {1, 1000}};
  std::vector<pid_t> pids;
  std::fflush(nullptr);
  for (int r = 0; r < 3; ++r) {
    const pid_t pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      const int code = run_rank(job{transport_kind::shm, 1, 3, id, 0, slow ? 12000ms : 4000ms}, r,
                                [&](auto& comm) {
        if (r == 0) {
          ps::server_options o;
          o.mode = ps::consistency::async();
          ps::server srv(comm, keys, roles, o);
          srv.serve();
          return;
        }
        ps::worker wk(comm, keys, roles);
        if (r == 1) {
          std::vector<float> g(std::size_t{1} << 20, 1.0f);
          const auto t = wk.push(0, g);
          std::this_thread::sleep_for(hold);
          wk.wait(t);
        } else {
          std::vector<float> g(1000, 1.0f), w(1000);
          std::this_thread::sleep_for(100ms);
          for (int i = 0; i < 50; ++i) {
            const auto t0 = steady::now();
            wk.wait(wk.push(1, g));
            wk.wait(wk.pull(1, w));
            const auto took =
                std::chrono::duration_cast<std::chrono::milliseconds>(steady::now() - t0);
            if (took > bound)
              throw std::runtime_error("round trip " + std::to_string(i) + " took " +
                                       std::to_string(took.count()) + " ms, more than " +
                                       std::to_string(bound.count()) + " ms");
            std::this_thread::sleep_for(10ms);
          }
        }
        wk.finish();
      });
      std::fflush(nullptr);
      ::_exit(code);
    }
    pids.push_back(pid);
  }
  for (pid_t pid : pids) {
    int st = 0;
    REQUIRE(::waitpid(pid, &st, 0) == pid);
    CHECK(WIFEXITED(st));
    CHECK(WEXITSTATUS(st) == 0);
  }
}
