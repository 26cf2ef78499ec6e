// What a hostile or careless user can do to a job from outside it, and what the job must do
// about it: refuse, with an error that names what it found, and never return a wrong result.
//
// - shm: another user makes the job's segment first (job ids are predictable), initialized and
//   writable by all, keeps it mapped and rewrites it. Run as root, the squatter runs as nobody
//   (uid 65534); without root the case exits 77 (skipped), saying why.
// - shm: a segment of this user that others may open is refused too; the one a rank makes is
//   0600.
// - the TCP store: a client of the server's own user fills its buffers and its map; the map is
//   bounded, and the memory comes back (VmRSS).
// - a rank with the wrong world size (shm, tcp), or another COHORT_TOKEN: every rank fails at
//   once, saying who says what, instead of waiting out its connect timeout.
#include "../support.hpp"

#include <fcntl.h>
#include <grp.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>

#include "process.hpp"

namespace cf = cohort::faults;
using cohort::errc;
using namespace std::chrono_literals;

namespace {

constexpr uid_t nobody = 65534;
constexpr std::size_t ring_bytes = std::size_t{64} << 10;

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

// Makes the segment of `job` for `size` ranks as a rank would, but with `mode`, initializes it
// and keeps it mapped; returns the mapping (or an unmapped segment, errno set).
cohort::detail::shm::segment squat(const std::string& job, int size, mode_t mode) {
  cohort::detail::shm::segment seg("/cohort-" + job, size, ring_bytes);
  const int fd = ::shm_open(seg.name().c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, mode);
  if (fd < 0) return seg;
  if (::fchmod(fd, mode) != 0 ||
      ::ftruncate(fd, static_cast<off_t>(seg.shape().total)) != 0 || !seg.map(fd)) {
    ::close(fd);
    return seg;
  }
  seg.initialize();
  ::close(fd);
  return seg;
}

// Runs the ranks of a `size`-rank shm job `job`: each one either fails to connect (recorded)
// or runs an all_reduce of known data and records whether the result was right.
std::vector<int> run_ranks(const std::string& job, int size, cf::report_board& board) {
  std::vector<pid_t> pids;
  for (int r = 0; r < size; ++r)
    pids.push_back(cf::spawn(r, [&](int rank) {
      cf::rank_report& rep = board[rank];
      const auto t0 = std::chrono::steady_clock::now();
      try {
        cohort::shm_options o;
        o.ring_bytes = ring_bytes;
        o.chunk_bytes = 4096;
        o.connect_timeout = 10s;
        cohort::shm_communicator comm(std::in_place, job, rank, size, o);
        comm.set_timeout(5s);
        rep.completed = 1;
        for (int i = 0; i < 200; ++i) {
          std::vector<float> v(4096, static_cast<float>(rank + 1));
          cohort::all_reduce(comm, v, cohort::ops::sum);
          const float want = static_cast<float>(size * (size + 1) / 2);
          for (float x : v)
            if (x != want) rep.wrong_data = 1;
        }
      } catch (const cohort::error& e) {
        cf::record(rep, e.code(), e.peer(), e.what());
      }
      rep.elapsed_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                           std::chrono::steady_clock::now() - t0)
                           .count();
      rep.written = 1;
      return 0;
    }));
  return cf::reap(pids, 60s);
}

// Every rank must have refused the segment, naming its path, owner and mode; none may return.
void check_refused(const std::string& job, int size, cf::report_board& board,
                   const std::vector<int>& status, const std::string& owner,
                   const std::string& mode) {
  for (int r = 0; r < size; ++r) {
    const cf::rank_report& rep = board[r];
    INFO("rank ", r, ": ", cf::status_text(status[r]), ", ", cf::code_name(rep.code), ": ",
         rep.what);
    CHECK(status[r] == 0);
    CHECK(rep.written == 1);
    CHECK(rep.wrong_data == 0);  // never
    CHECK(rep.completed == 0);
    CHECK(rep.code == -EACCES);  // std::errc::permission_denied
    CHECK(contains(rep.what, "/dev/shm/cohort-" + job));
    CHECK(contains(rep.what, "uid " + owner));
    CHECK(contains(rep.what, "mode " + mode));
    CHECK(rep.elapsed_ms < 2000);  // at once, not at the connect timeout
  }
}

}  // namespace

TEST_CASE("hostile: an shm segment made first by another user (nobody, mode 0666, kept mapped "
          "and rewritten) is refused by every rank naming its owner and path, never joined") {
  if (::geteuid() != 0) {
    std::printf("SKIP: making the squatter another user needs root (uid %u here)\n",
                static_cast<unsigned>(::geteuid()));
    std::fflush(nullptr);
    std::_Exit(77);
  }
  constexpr int p = 2;
  const std::string job = cf::unique_job("squat");
  const std::string name = "/cohort-" + job;
  int ready[2];
  REQUIRE(::pipe(ready) == 0);
  std::fflush(nullptr);
  const pid_t squatter = ::fork();
  REQUIRE(squatter >= 0);
  if (squatter == 0) {
    ::close(ready[0]);
    char verdict = 'u';  // could not become nobody
    if (::setgroups(0, nullptr) == 0 && ::setresgid(nobody, nobody, nobody) == 0 &&
        ::setresuid(nobody, nobody, nobody) == 0) {
      ::umask(0);
      auto seg = squat(job, p, 0666);
      verdict = seg.mapped() ? 'r' : 's';
      (void)!::write(ready[1], &verdict, 1);
      if (!seg.mapped()) ::_exit(1);
      // Rewrites every ring while the job would run: the data, and the heads and tails.
      const auto& shape = seg.shape();
      for (;;) {
        if (seg.control().outcome.load(std::memory_order_acquire) ==
            cohort::detail::shm::join_connected)
          for (int from = 0; from < p; ++from)
            for (int to = 0; to < p; ++to)
              if (from != to) std::memset(seg.ring_data(from, to), 0x41, shape.ring_bytes);
        std::this_thread::sleep_for(50us);
      }
    }
    (void)!::write(ready[1], &verdict, 1);
    ::_exit(1);
  }
  ::close(ready[1]);
  char verdict = 0;
  const bool told = ::read(ready[0], &verdict, 1) == 1;
  ::close(ready[0]);
  if (!told || verdict != 'r') {
    ::kill(squatter, SIGKILL);
    ::waitpid(squatter, nullptr, 0);
    ::shm_unlink(name.c_str());
    if (verdict == 'u') {
      std::printf("SKIP: this process cannot switch to uid %u (no CAP_SETUID here)\n",
                  static_cast<unsigned>(nobody));
      std::fflush(nullptr);
      std::_Exit(77);
    }
    FAIL("the squatter could not make its segment (" << verdict << ")");
  }
  struct stat st {};
  REQUIRE(::stat(("/dev/shm" + name).c_str(), &st) == 0);
  REQUIRE(st.st_uid == nobody);

  cf::report_board board(p);
  const auto status = run_ranks(job, p, board);
  ::kill(squatter, SIGKILL);
  ::waitpid(squatter, nullptr, 0);
  ::shm_unlink(name.c_str());
  check_refused(job, p, board, status, std::to_string(nobody), "0666");
}

TEST_CASE("hostile: an shm segment of this user that others may open is refused; the segment a "
          "rank makes is 0600") {
  constexpr int p = 2;
  {
    const std::string job = cf::unique_job("wide");
    const mode_t old = ::umask(0);
    auto seg = squat(job, p, 0666);
    ::umask(old);
    REQUIRE(seg.mapped());
    cf::report_board board(p);
    const auto status = run_ranks(job, p, board);
    ::shm_unlink(seg.name().c_str());
    check_refused(job, p, board, status, std::to_string(::geteuid()), "0666");
  }
  {
    // The creator's object, seen while the job connects: no one else may open it.
    const std::string job = cf::unique_job("mode");
    const std::string path = "/dev/shm/cohort-" + job;
    const mode_t old = ::umask(0);
    cf::report_board board(p);
    std::vector<pid_t> pids;
    pids.push_back(cf::spawn(0, [&](int rank) {
      cohort::shm_options o;
      o.ring_bytes = ring_bytes;
      o.chunk_bytes = 4096;
      o.connect_timeout = 10s;
      cohort::shm_transport t(job, rank, p, o);
      return 0;
    }));
    struct stat st {};
    const auto until = std::chrono::steady_clock::now() + 10s;
    while (::stat(path.c_str(), &st) != 0 && std::chrono::steady_clock::now() < until)
      std::this_thread::sleep_for(1ms);
    ::umask(old);
    CHECK((st.st_mode & 07777) == 0600);
    CHECK(st.st_uid == ::geteuid());
    pids.push_back(cf::spawn(1, [&](int rank) {
      cohort::shm_options o;
      o.ring_bytes = ring_bytes;
      o.chunk_bytes = 4096;
      o.connect_timeout = 10s;
      cohort::shm_transport t(job, rank, p, o);
      return 0;
    }));
    const auto status = cf::reap(pids, 30s);
    CHECK(status[0] == 0);
    CHECK(status[1] == 0);
    CHECK(cf::shm_names(job).empty());
  }
}

TEST_CASE("hostile: a client that fills the tcp store (its buffers and its map) is refused past "
          "the map's limit, and the server's memory comes back once the keys are emptied") {
  // A client of the server's own user gets in without a token: what it stores, the server
  // holds. Filling the buffers to their cap (256 MiB) and the map beyond it used to take the
  // server from a few MB to about 290 MB, for good.
  constexpr int clients = 16, rounds = 3;
  // The clients are threads of a child forked before the server's thread starts (a process with
  // threads that forks a child that starts threads is not supported under TSan); the last slot
  // of the board hands the child the server's port.
  cf::report_board board(clients + 1);
  std::atomic_ref<long> port_slot(board[clients].value);
  const pid_t child = cf::spawn(0, [&](int) {
    const auto until = std::chrono::steady_clock::now() + 60s;
    while (port_slot.load() == 0 && std::chrono::steady_clock::now() < until)
      std::this_thread::sleep_for(5ms);
    const int port = static_cast<int>(port_slot.load());
    if (port == 0) return 3;
    std::vector<std::thread> ts;
    for (int i = 0; i < clients; ++i)
      ts.emplace_back([&, i] {
        cf::rank_report& rep = board[i];
        // 768 MiB through one server thread: minutes, not seconds, under TSan.
        cohort::tcp_store s("127.0.0.1", port,
                            {.token = {}, .timeout = cf::sanitized ? 240s : 60s});
        const std::string key = "big/" + std::to_string(i);
        for (int k = 0; k < rounds; ++k) {
          std::error_code ec;
          s.set(key, std::string(cohort::detail::store_wire::max_value, char('a' + k)), ec);
          if (ec) {
            ++rep.value;  // refused
            cf::record(rep, ec, -1, s.last_error());
          } else {
            rep.completed++;
          }
        }
        s.set(key, "");  // gone, as far as a store without deletes goes
        rep.written = 1;
      });
    for (auto& t : ts) t.join();
    return 0;
  });
  cohort::tcp_store_server server("127.0.0.1", 0,
                                  {.token = {}, .log = [](std::string_view) {}});
  const int port = server.port();
  std::this_thread::sleep_for(50ms);
  const long before = cf::rss_kib();
  port_slot.store(port);
  const auto status = cf::reap({child}, cf::sanitized ? 600s : 120s);
  REQUIRE(status[0] == 0);
  long refused = 0;
  for (int i = 0; i < clients; ++i) {
    CHECK(board[i].written == 1);
    if (board[i].value > 0) {
      INFO("client ", i, ": ", board[i].what);
      CHECK(board[i].code == static_cast<int>(errc::invalid_argument));
      CHECK(contains(board[i].what, "max_stored"));
      refused += board[i].value;
    }
  }
  CHECK(refused > 0);  // 16 keys of 16 MiB are more than the map may hold
  // The server notices the closed connections within a poll round.
  long after = 0;
  for (int i = 0; i < 50; ++i) {
    std::this_thread::sleep_for(20ms);
    after = cf::rss_kib();
    if (after - before < 32 * 1024) break;
  }
  INFO("VmRSS before ", before, " KiB, after ", after, " KiB");
  if (!cf::sanitized) CHECK(after - before < 32 * 1024);
  // It still serves.
  cohort::tcp_store s("127.0.0.1", port, {.token = {}, .timeout = 10s});
  CHECK(s.try_get("big/0") == std::optional<std::string>(""));
  s.disconnect();
}

TEST_CASE("hostile: an shm rank started with the wrong world size makes every rank fail at once, "
          "saying who says what") {
  // Rank 1 says 3 ranks where rank 0 says 2. Used to: the one that met the segment of the
  // other shape failed, the other waited out its 30 s connect timeout.
  for (int first : {0, 1}) {
    INFO("rank ", first, " starts first");
    const std::string job = cf::unique_job("size");
    cf::report_board board(2);
    std::vector<pid_t> pids(2);
    for (int k = 0; k < 2; ++k) {
      const int r = k == 0 ? first : 1 - first;
      pids[r] = cf::spawn(r, [&](int rank) {
        cf::rank_report& rep = board[rank];
        const auto t0 = std::chrono::steady_clock::now();
        try {
          cohort::shm_options o;
          o.ring_bytes = ring_bytes;
          o.chunk_bytes = 4096;
          o.connect_timeout = 20s;
          cohort::shm_transport t(job, rank, rank == 0 ? 2 : 3, o);
          rep.completed = 1;
        } catch (const cohort::error& e) {
          cf::record(rep, e.code(), e.peer(), e.what());
        }
        rep.elapsed_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                             std::chrono::steady_clock::now() - t0)
                             .count();
        rep.written = 1;
        return 0;
      });
      std::this_thread::sleep_for(100ms);  // so that `first` makes the segment
    }
    const auto status = cf::reap(pids, 60s);
    for (int r = 0; r < 2; ++r) {
      const cf::rank_report& rep = board[r];
      INFO("rank ", r, ": ", cf::status_text(status[r]), ", ", cf::code_name(rep.code), " after ",
           rep.elapsed_ms, " ms: ", rep.what);
      CHECK(status[r] == 0);
      CHECK(rep.completed == 0);
      CHECK(rep.code == static_cast<int>(errc::invalid_argument));
      CHECK(rep.elapsed_ms < 3000);  // at once, not at the connect timeout
    }
    // The rank that met the other's segment says what it found; the other is told who.
    CHECK((contains(board[0].what, "rank 1 says the job has 3 ranks, this rank says 2") ||
           contains(board[0].what, "say the job has 3 ranks, this rank (rank 0) says 2")));
    CHECK((contains(board[1].what, "rank 0 says the job has 2 ranks, this rank says 3") ||
           contains(board[1].what, "say the job has 2 ranks, this rank (rank 1) says 3")));
    CHECK(cf::shm_names(job).empty());
  }
}

TEST_CASE("hostile: a tcp rank started with the wrong world size makes every rank fail at once, "
          "saying who says what") {
  // Used to: both sides waited out the connect timeout, for ranks that never came.
  for (int wrong : {1, 0}) {
    INFO("rank ", wrong, " says 3 ranks, the other 2");
    cf::job_spec spec = cf::make_spec(cf::kind::tcp, "tcpsize", 2);
    cf::report_board board(2);
    std::vector<pid_t> pids;
    for (int r = 0; r < 2; ++r)
      pids.push_back(cf::spawn(r, [&](int rank) {
        cf::rank_report& rep = board[rank];
        const auto t0 = std::chrono::steady_clock::now();
        try {
          cohort::launch_info info = cf::info_for(spec, rank);
          info.size = info.local_size = rank == wrong ? 3 : 2;
          auto comm = cohort::make_tcp_communicator(info, cf::tcp_test_options(20s));
          rep.completed = 1;
        } catch (const cohort::error& e) {
          cf::record(rep, e.code(), e.peer(), e.what());
        }
        rep.elapsed_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                             std::chrono::steady_clock::now() - t0)
                             .count();
        rep.written = 1;
        return 0;
      }));
    const auto status = cf::reap(pids, 60s);
    for (int r = 0; r < 2; ++r) {
      const cf::rank_report& rep = board[r];
      INFO("rank ", r, ": ", cf::status_text(status[r]), ", ", cf::code_name(rep.code), " after ",
           rep.elapsed_ms, " ms: ", rep.what);
      CHECK(status[r] == 0);
      CHECK(rep.completed == 0);
      CHECK(rep.code == static_cast<int>(errc::invalid_argument));
      CHECK(rep.peer == 1 - r);
      CHECK(rep.elapsed_ms < 3000);  // at once, not at the connect timeout
      const int mine = r == wrong ? 3 : 2, theirs = r == wrong ? 2 : 3;
      CHECK(contains(rep.what, "rank " + std::to_string(1 - r) + " says the job has " +
                                   std::to_string(theirs) + " ranks, this rank says " +
                                   std::to_string(mine)));
    }
  }
}

TEST_CASE("hostile: a tcp rank started with another COHORT_TOKEN is refused, and rank 0 says so at "
          "once instead of 'rank 1 never arrived' at its deadline") {
  cf::job_spec spec = cf::make_spec(cf::kind::tcp, "token", 2);
  cf::report_board board(2);
  std::vector<pid_t> pids;
  for (int r = 0; r < 2; ++r)
    pids.push_back(cf::spawn(r, [&](int rank) {
      cf::rank_report& rep = board[rank];
      const auto t0 = std::chrono::steady_clock::now();
      try {
        auto o = cf::tcp_test_options(20s);
        o.token = rank == 0 ? "the-token-of-rank-0" : "another-token";
        auto comm = cohort::make_tcp_communicator(cf::info_for(spec, rank), o);
        rep.completed = 1;
      } catch (const cohort::error& e) {
        cf::record(rep, e.code(), e.peer(), e.what());
      }
      rep.elapsed_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                           std::chrono::steady_clock::now() - t0)
                           .count();
      rep.written = 1;
      return 0;
    }));
  const auto status = cf::reap(pids, 60s);
  for (int r = 0; r < 2; ++r) {
    const cf::rank_report& rep = board[r];
    INFO("rank ", r, ": ", cf::status_text(status[r]), ", ", cf::code_name(rep.code), " after ",
         rep.elapsed_ms, " ms: ", rep.what);
    CHECK(status[r] == 0);
    CHECK(rep.completed == 0);
    CHECK(rep.elapsed_ms < 3000);  // at once, not at the connect timeout
    CHECK(contains(rep.what, "COHORT_TOKEN"));
  }
  CHECK(board[0].peer == 1);
  CHECK(contains(board[0].what, "rank 1 was refused: wrong token"));
}
