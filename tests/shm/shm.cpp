// The shared-memory transport with ranks as forked processes: the collective suite at P = 2, 3,
// 4, the byte-stream semantics of the transport itself, and the failures (a killed rank, a rank
// that never calls, a mismatch, an abort, a rank that leaves), the connect rules (timeouts,
// taken ranks, stale segments) and that nothing is left in /dev/shm.
//
// Each rank is a child process that exits 0 on success; on failure it prints why to stderr
// (prefixed "[rank r]") and exits non-zero, and the parent reports which rank failed. A child
// whose own check fails aborts its communicator first, so that its peers stop at once.
#include "../support.hpp"

#include <dirent.h>
#include <poll.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <optional>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include <cohort/cohort.hpp>
#include <cohort/transport/shm.hpp>

#include "../collectives/suite.hpp"

namespace ct = cohort::test;
using namespace std::chrono_literals;
using steady = std::chrono::steady_clock;
using cohort::errc;

static_assert(cohort::zero_copy_transport<cohort::shm_transport>);
static_assert(std::is_nothrow_move_constructible_v<cohort::shm_transport>);
static_assert(!std::is_copy_constructible_v<cohort::shm_transport>);
static_assert(cohort::communicator<cohort::shm_communicator>);

namespace {

/// A job id no other test (or test run) uses.
std::string job_name(const char* what) {
  static int counter = 0;
  return "shmtest-" + std::to_string(::getpid()) + "-" + what + "-" + std::to_string(counter++);
}

/// The names in /dev/shm that contain `job`.
std::vector<std::string> leftovers(const std::string& job) {
  std::vector<std::string> found;
  if (DIR* d = ::opendir("/dev/shm")) {
    while (dirent* e = ::readdir(d))
      if (std::strstr(e->d_name, job.c_str()) != nullptr) found.emplace_back(e->d_name);
    ::closedir(d);
  }
  return found;
}

/// Throws unless `ok`: the children's CHECK.
void expect(bool ok, const std::string& what) {
  if (!ok) throw std::runtime_error(what);
}

/// A rank's process: runs `body(rank)` and exits with what it returns (0: success); an
/// exception is printed and exits 1.
template <class Body>
pid_t spawn(int rank, Body&& body) {
  std::fflush(nullptr);
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    int code = 1;
    try {
      code = body(rank);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "[rank %d] %s\n", rank, e.what());
    } catch (...) {
      std::fprintf(stderr, "[rank %d] unknown exception\n", rank);
    }
    std::fflush(nullptr);
    ::_exit(code);
  }
  return pid;
}

constexpr int killed_at_limit = -1000;

/// Waits for every process of `pids` until `limit`, then kills what is left. Returns the exit
/// statuses in order: the exit code, -N for death by signal N, `killed_at_limit`.
std::vector<int> reap(const std::vector<pid_t>& pids, steady::duration limit) {
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

/// Runs `body(rank)` in `p` processes and returns their statuses.
template <class Body>
std::vector<int> run_ranks(int p, Body body, steady::duration limit = 240s) {
  std::vector<pid_t> pids;
  for (int r = 0; r < p; ++r) pids.push_back(spawn(r, body));
  return reap(pids, limit);
}

void check_all_passed(const std::vector<int>& status) {
  for (std::size_t r = 0; r < status.size(); ++r) {
    INFO("rank ", r, " exited with ", status[r],
         std::string(status[r] == killed_at_limit ? " (killed: it ran past the test's limit)" : ""));
    CHECK(status[r] == 0);
  }
}

/// Runs `fn(comm)` for every rank of a `p`-rank job; a rank whose check fails aborts the
/// communicator (its peers then stop with errc::aborted naming it) and exits 1.
template <class Fn>
std::vector<int> run_job(int p, const std::string& job, Fn fn, cohort::shm_options opts = {},
                         steady::duration limit = 240s) {
  return run_ranks(p, [&](int r) {
    cohort::shm_communicator comm(std::in_place, job, r, p, opts);
    try {
      fn(comm);
    } catch (const ct::check_failed& e) {
      comm.abort(std::string("check failed on rank ") + std::to_string(r) + ": " + e.what());
      throw;
    }
    return 0;
  }, limit);
}

// ---------------------------------------------------------------------------------------------
// The collective suite.

/// Every collective, dtype T, every op, at the suite's counts. The 10^6-element count runs for
/// sum and max only (and for the data movement kinds), which keeps P = 4 on 2 cores near a
/// second per dtype: the other ops take the same code paths at the other counts.
template <class T>
void suite(cohort::shm_communicator& comm) {
  const int p = comm.size();
  auto run = [&](const auto& op, bool reducing, bool large) {
    for (std::size_t n : ct::counts_for<T>(p)) {
      if (n >= 1'000'000 && !large) continue;
      for (ct::kind k : ct::every_kind) {
        if (reducing != ct::reduces(k)) continue;
        const int root = p - 1 - static_cast<int>(n % static_cast<std::size_t>(p));
        try {
          ct::check<T>(comm, k, op, n, root, 1234 + n);
        } catch (const ct::check_failed& e) {
          throw ct::check_failed(std::string(op.name) + " root " + std::to_string(root) + ": " +
                                 e.what());
        }
      }
    }
  };
  run(cohort::ops::sum, true, true);
  run(cohort::ops::prod, true, false);
  run(cohort::ops::min, true, false);
  run(cohort::ops::max, true, true);
  if constexpr (!std::is_integral_v<T>) {
    run(cohort::ops::avg, true, false);
    ct::check_rounding<T>(comm, 100'003, 99);
  }
  run(cohort::ops::sum, false, true);
}

}  // namespace

TEST_CASE_TEMPLATE("the collective suite over shm, ranks as processes", T, float, double,
                   std::int32_t, cohort::fp16, cohort::bf16) {
  for (int p : {2, 3, 4}) {
    INFO("P = ", p);
    const std::string job = job_name("suite");
    check_all_passed(run_job(p, job, [](auto& comm) { suite<T>(comm); }));
    CHECK(leftovers(job).empty());
  }
}

TEST_CASE("broadcast over shm from every root on both sides of the tree/chain crossover") {
  for (int p : {3, 4, 5}) {
    INFO("P = ", p);
    const std::string job = job_name("bcast");
    check_all_passed(run_job(p, job, [](auto& comm) { ct::check_broadcast_sweep<float>(comm); }));
    CHECK(leftovers(job).empty());
  }
}

TEST_CASE("a small ring: sends split, wrap and wait for room") {
  cohort::shm_options opts;
  opts.ring_bytes = 64 << 10;
  opts.chunk_bytes = 16 << 10;
  check_all_passed(run_job(3, job_name("small-ring"), [](auto& comm) {
    for (std::size_t n : {std::size_t{1}, std::size_t{5000}, std::size_t{100'003}, std::size_t{1'000'003}})
      for (ct::kind k : ct::every_kind) ct::check<double>(comm, k, cohort::ops::sum, n, 1, n);
  }, opts));
}

TEST_CASE("one rank: no segment, collectives are local") {
  cohort::shm_communicator comm(std::in_place, job_name("single"), 0, 1);
  CHECK(comm.transport().segment_name().empty());
  for (ct::kind k : ct::every_kind) CHECK_NOTHROW(ct::check<float>(comm, k, cohort::ops::sum, 1000, 0, 7));
}

// ---------------------------------------------------------------------------------------------
// The transport's own contract: one FIFO byte stream per ordered pair, whatever the sizes of
// sends and receives, with recv() and recv_view()/recv_release() mixed on one stream.

TEST_CASE("byte streams: any send and receive sizes, views mixed with receives, full duplex") {
  cohort::shm_options opts;
  opts.ring_bytes = 64 << 10;  // small, so that the ring wraps and fills often
  opts.chunk_bytes = 8 << 10;
  const std::string job = job_name("stream");
  constexpr std::size_t total = 3'000'000;
  auto pattern = [](int from, std::size_t i) {
    return static_cast<std::byte>((i * 31 + 7 + static_cast<std::size_t>(from) * 101) % 251);
  };
  check_all_passed(run_ranks(2, [&](int r) {
    cohort::shm_transport t(job, r, 2, opts);
    const int peer = 1 - r;
    const auto until = cohort::clock::now() + 60s;
    std::vector<std::byte> out(total), in(total);
    for (std::size_t i = 0; i < total; ++i) out[i] = pattern(r, i);
    // Both ranks draw the same round lengths; each cuts its round into its own pieces.
    std::mt19937_64 shared(42), mine(static_cast<std::uint64_t>(r) + 5);
    auto piece = [&](std::size_t left) {
      const std::size_t caps[] = {1, 7, 32, 100, 4096, 70'000};
      return std::min<std::size_t>(left, 1 + mine() % caps[mine() % 6]);
    };
    std::error_code ec;
    for (std::size_t done = 0; done < total;) {
      const std::size_t round = std::min<std::size_t>(total - done, 1 + shared() % 150'000);
      // Post the round's sends (up to three pieces, the last takes the rest) ...
      cohort::shm_transport::request sends[3];
      for (std::size_t k = 0, sent = 0; k < 3 && sent < round; ++k) {
        const std::size_t n = k == 2 ? round - sent : piece(round - sent);
        sends[k] = t.send(peer, std::span(out).subspan(done + sent, n));
        sent += n;
      }
      // ... receive the peer's round in random pieces, by recv() or by views released in part ...
      for (std::size_t got = 0; got < round;) {
        const std::size_t at = done + got;
        if (mine() % 2 == 0) {
          const std::size_t n = piece(round - got);
          auto req = t.recv(peer, std::span(in).subspan(at, n));
          t.wait(req, until, ec);
          expect(!ec, "recv: " + ec.message());
          got += n;
        } else {
          auto view = t.recv_view(peer, piece(round - got), 1, until, ec);
          expect(!ec && !view.empty(), "recv_view: " + ec.message());
          const std::size_t n = 1 + mine() % view.size();
          std::memcpy(in.data() + at, view.data(), n);
          t.recv_release(peer, n);
          got += n;
        }
      }
      // ... and only then wait for the sends.
      for (auto& s : sends) {
        t.wait(s, until, ec);
        expect(!ec, "send: " + ec.message());
      }
      done += round;
    }
    for (std::size_t i = 0; i < total; ++i)
      expect(in[i] == pattern(peer, i), "byte " + std::to_string(i) + " of the stream is wrong");
    return 0;
  }));
  CHECK(leftovers(job).empty());
}

// ---------------------------------------------------------------------------------------------
// Failures.

TEST_CASE("a rank killed during a large all_reduce: the others fail with peer_lost, in time") {
  constexpr int p = 3, victim = 1;
  const std::string job = job_name("kill");
  constexpr auto deadline = 10s;
  int ready[2];
  REQUIRE(::pipe(ready) == 0);
  auto body = [&](int r) -> int {
    ::close(ready[0]);
    cohort::shm_communicator comm(std::in_place, job, r, p);
    comm.set_timeout(deadline);
    std::vector<float> x(std::size_t{4} << 20, 1.0f), y(x.size());  // 16 MiB
    cohort::all_reduce(comm, x, y, cohort::ops::sum);
    expect(::write(ready[1], "r", 1) == 1, "pipe");
    for (int i = 0; i < 1'000'000; ++i) {
      std::error_code ec;
      const auto t0 = steady::now();
      cohort::all_reduce(comm, x, y, cohort::ops::sum, ec);
      if (!ec) continue;
      const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(steady::now() - t0);
      std::fprintf(stderr, "[rank %d] all_reduce failed after %lld ms: %s\n", r,
                   static_cast<long long>(ms.count()), comm.last_failure()->what.c_str());
      expect(ec == errc::peer_lost, "expected peer_lost, got " + ec.message());
      expect(ms < deadline, "peer_lost came after the deadline");
      return 0;
    }
    return 4;  // never failed: the victim was not killed
  };
  std::vector<pid_t> pids;
  for (int r = 0; r < p; ++r) pids.push_back(spawn(r, body));
  ::close(ready[1]);
  char buf[p];
  std::size_t got = 0;
  while (got < p) {
    pollfd pfd{ready[0], POLLIN, 0};
    REQUIRE(::poll(&pfd, 1, 60'000) == 1);
    const ssize_t n = ::read(ready[0], buf, sizeof buf);
    REQUIRE(n > 0);
    got += static_cast<std::size_t>(n);
  }
  ::close(ready[0]);
  std::this_thread::sleep_for(30ms);  // mid-collective: they loop all_reduce back to back
  const auto killed = steady::now();
  ::kill(pids[victim], SIGKILL);
  const std::vector<int> status = reap(pids, 30s);
  const auto elapsed = steady::now() - killed;
  MESSAGE("survivors reported within ",
          std::chrono::duration_cast<std::chrono::milliseconds>(elapsed).count(), " ms");
  CHECK(status[victim] == -SIGKILL);
  for (int r = 0; r < p; ++r)
    if (r != victim) {
      INFO("rank ", r);
      CHECK(status[r] == 0);
    }
  CHECK(elapsed < deadline);
  CHECK(elapsed < 5s);  // a liveness check, not the deadline, found the dead rank
  INFO("left in /dev/shm: ", leftovers(job).size());
  CHECK(leftovers(job).empty());
}

TEST_CASE("a rank that never calls: timed_out at the deadline") {
  const std::string job = job_name("timeout");
  check_all_passed(run_ranks(2, [&](int r) {
    cohort::shm_communicator comm(std::in_place, job, r, 2);
    if (r == 1) {
      std::this_thread::sleep_for(1500ms);  // alive, connected, and silent
      return 0;
    }
    std::vector<float> x(1000, 1.0f);
    std::error_code ec;
    const auto t0 = steady::now();
    cohort::all_reduce(comm, x, cohort::ops::sum, {.timeout = 300ms}, ec);
    const auto took = steady::now() - t0;
    expect(ec == errc::timed_out, "expected timed_out, got " + ec.message());
    expect(took >= 300ms && took < 1200ms,
           "timed out after " + std::to_string(std::chrono::duration<double>(took).count()) + " s");
    expect(comm.last_failure()->peer == 1, "the failure names rank 1");
    // Poisoned now: later calls fail at once.
    cohort::all_reduce(comm, x, cohort::ops::sum, ec);
    expect(ec == errc::poisoned, "expected poisoned, got " + ec.message());
    return 0;
  }));
}

TEST_CASE("ranks that disagree about the call: mismatch on every rank, named") {
  const std::string job = job_name("mismatch");
  check_all_passed(run_ranks(3, [&](int r) {
    {
      cohort::shm_communicator comm(std::in_place, job + "a", r, 3);
      std::vector<float> x(r == 2 ? 12 : 10, 1.0f);
      std::error_code ec;
      cohort::all_reduce(comm, x, cohort::ops::sum, {.timeout = 10s}, ec);
      expect(ec == errc::mismatch, "count: expected mismatch, got " + ec.message());
      expect(comm.last_failure()->what.find("12 f32") != std::string::npos,
             "message names the count: " + comm.last_failure()->what);
    }
    {
      cohort::shm_communicator comm(std::in_place, job + "b", r, 3);
      std::vector<float> x(64, 1.0f), all(64 * 3);
      std::error_code ec;
      if (r == 0) cohort::all_gather(comm, x, all, {.timeout = 10s}, ec);
      else cohort::all_reduce(comm, x, cohort::ops::sum, {.timeout = 10s}, ec);
      expect(ec == errc::mismatch, "kind: expected mismatch, got " + ec.message());
    }
    return 0;
  }));
}

TEST_CASE("small rooted calls back to back: roots run ahead, every result right") {
  // The root of a small broadcast and the first rank of a small reduce only send: they return
  // without waiting for their left neighbour, whose header a later call compares. Many such
  // calls in a row, with the roots moving, must still give every rank the right bytes.
  const std::string job = job_name("ahead");
  for (int p : {2, 3, 4}) {
    check_all_passed(run_ranks(p, [&](int r) {
      cohort::shm_communicator comm(std::in_place, job + std::to_string(p), r, p);
      for (int i = 0; i < 300; ++i) {
        const int root = (i / 7) % p;
        const std::size_t n = static_cast<std::size_t>(1 + i % 5) * 100;  // up to 2000 B
        std::vector<int> x(n, r == root ? i : -1);
        cohort::broadcast(comm, x, root, {.timeout = 10s});
        for (int v : x) expect(v == i, "broadcast " + std::to_string(i) + " gave " + std::to_string(v));
        std::vector<int> y(n, r + i), sum(n, -1);
        cohort::reduce(comm, y, sum, cohort::ops::sum, root, {.timeout = 10s});
        if (r == root)
          for (int v : sum)
            expect(v == p * i + p * (p - 1) / 2, "reduce " + std::to_string(i) + " gave " + std::to_string(v));
      }
      return 0;
    }));
  }
}

TEST_CASE("roots that disagree about small calls: mismatch at the call or the next, named") {
  const std::string job = job_name("roots");
  // Rank 2 names itself the root, the others rank 0: ranks that only send may finish the
  // call; their next call must fail naming both sides.
  check_all_passed(run_ranks(3, [&](int r) {
    cohort::shm_communicator comm(std::in_place, job + "a", r, 3);
    std::vector<int> x(10, r);
    std::error_code ec;
    cohort::broadcast(comm, x, r == 2 ? 2 : 0, {.timeout = 10s}, ec);
    if (!ec) cohort::barrier(comm, {.timeout = 10s}, ec);
    expect(ec == errc::mismatch, "expected mismatch, got " + ec.message());
    const std::string& what = comm.last_failure()->what;
    expect(what.find("broadcast #0 with 10 i32 from root 0") != std::string::npos &&
               what.find("broadcast #0 with 10 i32 from root 2") != std::string::npos,
           "message names both calls: " + what);
    return 0;
  }));
  // Two ranks that each think they are the root, call after call: neither receives, so
  // neither waits; the calls they may run ahead are bounded, and the disagreement is found
  // within them, never at the deadline.
  check_all_passed(run_ranks(2, [&](int r) {
    cohort::shm_communicator comm(std::in_place, job + "b", r, 2);
    std::vector<float> x(256, 1.0f);
    std::error_code ec;
    const auto t0 = steady::now();
    for (int i = 0; i < 100 && !ec; ++i) cohort::broadcast(comm, x, r, {.timeout = 10s}, ec);
    expect(ec == errc::mismatch, "expected mismatch, got " + ec.message());
    expect(steady::now() - t0 < 5s, "the mismatch took until the deadline");
    expect(comm.last_failure()->what.find("from root 1") != std::string::npos &&
               comm.last_failure()->what.find("from root 0") != std::string::npos,
           "message names both calls: " + comm.last_failure()->what);
    return 0;
  }));
}

TEST_CASE("abort reaches every peer with its code, rank and text") {
  const std::string job = job_name("abort");
  check_all_passed(run_ranks(3, [&](int r) {
    cohort::shm_communicator comm(std::in_place, job, r, 3);
    cohort::barrier(comm);
    if (r == 2) {
      std::this_thread::sleep_for(50ms);  // the others are waiting in all_reduce by now
      comm.abort("rank 2 gives up: out of patience");
      expect(comm.transport().remote_failure() == nullptr, "the aborting rank has no remote failure");
      return 0;
    }
    std::vector<float> x(1 << 16, 1.0f);
    std::error_code ec;
    cohort::all_reduce(comm, x, cohort::ops::sum, {.timeout = 10s}, ec);
    expect(ec == errc::aborted, "expected aborted, got " + ec.message());
    const cohort::failure* f = comm.transport().remote_failure();
    expect(f != nullptr && f->peer == 2, "remote_failure names rank 2");
    expect(f->what == "rank 2 gives up: out of patience", "remote text: " + f->what);
    expect(comm.last_failure()->what.find("out of patience") != std::string::npos,
           "the failure quotes it: " + comm.last_failure()->what);
    return 0;
  }));
}

TEST_CASE("a rank that closes cleanly is lost to the peers that wait on it") {
  const std::string job = job_name("close");
  check_all_passed(run_ranks(2, [&](int r) {
    std::optional<cohort::shm_communicator> comm(std::in_place, std::in_place, job, r, 2);
    std::vector<float> x(4096, 1.0f);
    cohort::all_reduce(*comm, x, cohort::ops::sum);
    if (r == 1) {
      comm.reset();  // leaves, but the process lives on
      std::this_thread::sleep_for(1200ms);  // longer than rank 0 may take to notice
      return 0;
    }
    std::error_code ec;
    const auto t0 = steady::now();
    cohort::all_reduce(*comm, x, cohort::ops::sum, {.timeout = 20s}, ec);
    expect(ec == errc::peer_lost, "expected peer_lost, got " + ec.message());
    expect(steady::now() - t0 < 1s, "noticed the close late");
    return 0;
  }));
}

// ---------------------------------------------------------------------------------------------
// Connecting.

TEST_CASE("the segment exists while the job connects, and is gone once every rank mapped it") {
  const std::string job = job_name("unlink");
  const std::string path = "/dev/shm/cohort-" + job;
  int go[2];
  REQUIRE(::pipe(go) == 0);
  auto body = [&](int r) -> int {
    ::close(go[1]);
    if (r == 2) {  // the last rank joins only when the parent says so
      char c;
      expect(::read(go[0], &c, 1) == 1, "pipe");
    }
    cohort::shm_communicator comm(std::in_place, job, r, 3);
    struct stat st {};
    expect(::stat(path.c_str(), &st) != 0, path + " still exists after connect");
    expect(comm.transport().segment_name() == "/cohort-" + job, "segment name");
    cohort::barrier(comm);
    return 0;
  };
  std::vector<pid_t> pids;
  for (int r = 0; r < 3; ++r) pids.push_back(spawn(r, body));
  ::close(go[0]);
  bool seen = false;  // ranks 0 and 1 wait for rank 2: the name must be there meanwhile
  for (int i = 0; i < 2000 && !seen; ++i) {
    struct stat st {};
    seen = ::stat(path.c_str(), &st) == 0;
    if (!seen) std::this_thread::sleep_for(1ms);
  }
  CHECK(seen);
  REQUIRE(::write(go[1], "g", 1) == 1);
  ::close(go[1]);
  check_all_passed(reap(pids, 60s));
  CHECK(leftovers(job).empty());
}

TEST_CASE("connect timeout names the missing ranks and leaves nothing behind") {
  const std::string job = job_name("absent");
  cohort::shm_options opts;
  opts.connect_timeout = 200ms;
  const auto t0 = steady::now();
  try {
    cohort::shm_transport t(job, 0, 4, opts);
    FAIL("connected without peers");
  } catch (const cohort::error& e) {
    CHECK(e.code() == errc::timed_out);
    CHECK(std::string(e.what()).find("ranks 1, 2, 3 of 4") != std::string::npos);
    CHECK(e.operation() == "shm_transport");
  }
  const auto took = steady::now() - t0;
  CHECK(took >= 200ms);
  CHECK(took < 2s);
  CHECK(leftovers(job).empty());
}

TEST_CASE("invalid arguments") {
  auto code_of = [](auto make) {
    try {
      make();
    } catch (const cohort::error& e) {
      return e.code();
    }
    return std::error_code();
  };
  const std::error_code invalid = errc::invalid_argument;
  CHECK(code_of([] { cohort::shm_transport("a/b", 0, 2); }) == invalid);
  CHECK(code_of([] { cohort::shm_transport("", 0, 2); }) == invalid);
  CHECK(code_of([] { cohort::shm_transport("j", 2, 2); }) == invalid);
  CHECK(code_of([] { cohort::shm_transport("j", 0, 0); }) == invalid);
  CHECK(code_of([] { cohort::shm_transport("j", 0, 2, {.ring_bytes = 100'000}); }) == invalid);
  CHECK(code_of([] { cohort::shm_transport("j", 0, 2, {.ring_bytes = 1 << 16, .chunk_bytes = 1 << 15}); }) == invalid);
  cohort::launch_info info;
  info.size = 4;
  info.local_size = 2;
  info.rank = info.local_rank = 1;
  info.job_id = "x";
  CHECK(code_of([&] { cohort::make_shm_communicator(info); }) == std::error_code(errc::unsupported));
}

TEST_CASE("a rank taken by a live process is refused") {
  const std::string job = job_name("taken");
  cohort::shm_options opts;
  opts.connect_timeout = 1500ms;
  const auto status = run_ranks(2, [&](int r) {
    if (r == 1) std::this_thread::sleep_for(300ms);  // the second claimant of rank 0
    try {
      cohort::shm_transport t(job, 0, 2, opts);
    } catch (const cohort::error& e) {
      if (r == 1) {
        expect(e.code() == errc::invalid_argument, "expected invalid_argument: " + std::string(e.what()));
        expect(std::string(e.what()).find("already taken") != std::string::npos, e.what());
        return 0;
      }
      expect(e.code() == errc::timed_out, "expected timed_out: " + std::string(e.what()));
      return 0;
    }
    return 3;
  });
  check_all_passed(status);
  CHECK(leftovers(job).empty());
}

TEST_CASE("a segment left by a job that died while connecting is replaced") {
  const std::string job = job_name("stale");
  const pid_t crashed = spawn(0, [&](int) {  // joins, then dies waiting for rank 1
    cohort::shm_transport t(job, 0, 2);
    return 0;
  });
  for (int i = 0; i < 2000 && leftovers(job).empty(); ++i) std::this_thread::sleep_for(1ms);
  std::this_thread::sleep_for(20ms);
  ::kill(crashed, SIGKILL);
  ::waitpid(crashed, nullptr, 0);
  REQUIRE(!leftovers(job).empty());  // the stale segment
  check_all_passed(run_job(2, job, [](auto& comm) {
    ct::check<float>(comm, ct::kind::all_reduce, cohort::ops::sum, 1000, 0, 1);
  }, {}, 60s));
  CHECK(leftovers(job).empty());
}

TEST_CASE("make_shm_communicator from launch_info, and a transport moved into a communicator") {
  const std::string job = job_name("launch");
  check_all_passed(run_ranks(3, [&](int r) {
    cohort::launch_info info;
    info.rank = info.local_rank = r;
    info.size = info.local_size = 3;
    info.job_id = job;
    info.source = cohort::launcher::cohort_run;
    auto comm = cohort::make_shm_communicator(info);
    ct::check<float>(comm, ct::kind::all_reduce, cohort::ops::sum, 5000, 0, 3);
    cohort::shm_communicator moved(cohort::shm_transport(job + "m", r, 3));
    ct::check<std::int32_t>(moved, ct::kind::broadcast, cohort::ops::sum, 5000, 2, 4);
    return 0;
  }));
}
