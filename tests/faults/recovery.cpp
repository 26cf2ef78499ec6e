// Recovery after a failure, ranks as processes over shm and TCP: a rank is SIGKILLed in the
// middle of an all_reduce; the survivors (a) build a smaller communicator among themselves and go
// on, or (b) meet a restarted process of the dead rank under a new generation (a new job id, and
// over TCP a new store, hosted by the restarted rank 0) and go on at full size. Results after
// recovery are checked against the reference; descriptors and /dev/shm are checked too.
#include "../support.hpp"

#include <future>

#include <boost/asio/use_future.hpp>

#include <cohort/async.hpp>

#include "process.hpp"

#include "../collectives/suite.hpp"

namespace ct = cohort::test;
namespace cf = cohort::faults;
using cohort::errc;
using namespace std::chrono_literals;

namespace {

// The collectives each generation runs, checked.
template <class Comm>
void work(Comm& comm, std::uint64_t seed) {
  ct::check<float>(comm, ct::kind::all_reduce, cohort::ops::sum, 3 * 65536 + 7, 0, seed);
  ct::check<double>(comm, ct::kind::broadcast, cohort::ops::sum, 10'007, comm.size() - 1, seed + 1);
  ct::check<std::int32_t>(comm, ct::kind::reduce_scatter, cohort::ops::sum, 50'001, 0, seed + 2);
}

// Generation 0: the victim dies half-way into its first all_reduce; the others must fail with
// peer_lost. Returns true for a survivor that saw the failure.
template <class Comm>
bool generation_zero(Comm& comm, cf::fault_plan& plan, bool victim, cf::rank_report& rep) {
  comm.set_timeout(10s);
  ct::check<float>(comm, ct::kind::all_reduce, cohort::ops::sum, 1000, 0, 1);  // all healthy
  if (victim) {
    plan.action = cf::fault_action::kill;
    plan.at_op = 6;
    plan.reset();
  }
  try {
    for (int i = 0; i < 3; ++i) work(comm, 10 + static_cast<std::uint64_t>(i));
  } catch (const cohort::error& e) {
    cf::record(rep, e.code(), e.peer(), e.what());
    return e.code() == errc::peer_lost;
  }
  return false;
}

void shrink(cf::kind transport) {
  constexpr int p = 4, victim = 2;
  const cf::job_spec g0 = cf::make_spec(transport, "shrink", p);
  cf::job_spec g1 = cf::make_spec(transport, "shrink1", p - 1);
  g1.job = g0.job + "-g1";
  cf::report_board board(p);
  std::vector<pid_t> pids;
  for (int r = 0; r < p; ++r)
    pids.push_back(cf::spawn(r, [&](int rank) -> int {
      cf::rank_report& rep = board[rank];
      rep.fds_before = cf::open_fds();
      cf::fault_plan plan;
      bool saw = false;
      cf::with_comm(g0, rank, &plan, [&](auto& comm) { saw = generation_zero(comm, plan, rank == victim, rep); });
      if (!saw) return 4;
      // Who is gone is what a launcher would tell the survivors; their new ranks keep order.
      const int new_rank = rank < victim ? rank : rank - 1;
      cf::fault_plan none;
      try {
        cf::with_comm(g1, new_rank, &none, [&](auto& comm) {
          comm.set_timeout(20s);
          for (int i = 0; i < 3; ++i) work(comm, 100 + static_cast<std::uint64_t>(i));
          rep.completed = 1;
        });
      } catch (const ct::check_failed& e) {
        rep.wrong_data = 1;
        cf::copy_text(rep.what, sizeof rep.what, e.what());
      } catch (const cohort::error& e) {
        cf::record(rep, e.code(), e.peer(), std::string("generation 1: ") + e.what());
      }
      rep.fds_after = cf::open_fds();
      rep.maps_after = cf::shm_mappings();
      if (rep.fds_after > rep.fds_before) cf::copy_text(rep.fds_text, sizeof rep.fds_text, cf::describe_fds());
      rep.written = 1;
      return 0;
    }));
  const auto status = cf::reap(pids, 120s);
  CHECK(status[victim] == -SIGKILL);
  for (int r = 0; r < p; ++r) {
    if (r == victim) continue;
    INFO("rank ", r, ": ", cf::status_text(status[r]), ": ", std::string(board[r].what));
    CHECK(status[r] == 0);
    CHECK(board[r].completed == 1);
    CHECK(board[r].wrong_data == 0);
    INFO("descriptors: ", std::string(board[r].fds_text));
    CHECK(board[r].fds_after <= board[r].fds_before);
    CHECK(board[r].maps_after == 0);
  }
  CHECK(cf::shm_names(g0.job).empty());
  CHECK(cf::shm_names(g1.job).empty());
}

void restart(cf::kind transport, int victim) {
  constexpr int p = 3;
  const cf::job_spec g0 = cf::make_spec(transport, "restart", p);
  cf::job_spec g1 = cf::make_spec(transport, "restart1", p);  // a new store port, over TCP
  g1.job = g0.job + "-g1";
  cf::report_board board(p + 1);  // the restarted process reports in slot p
  auto survivor = [&](int rank) -> int {
    cf::rank_report& rep = board[rank];
    rep.fds_before = cf::open_fds();
    cf::fault_plan plan;
    bool saw = false;
    cf::with_comm(g0, rank, &plan, [&](auto& comm) { saw = generation_zero(comm, plan, rank == victim, rep); });
    if (!saw) return 4;
    cf::fault_plan none;
    try {
      cf::with_comm(g1, rank, &none, [&](auto& comm) {
        comm.set_timeout(20s);
        for (int i = 0; i < 3; ++i) work(comm, 200 + static_cast<std::uint64_t>(i));
        rep.completed = 1;
      });
    } catch (const ct::check_failed& e) {
      rep.wrong_data = 1;
      cf::copy_text(rep.what, sizeof rep.what, e.what());
    } catch (const cohort::error& e) {
      cf::record(rep, e.code(), e.peer(), std::string("generation 1: ") + e.what());
    }
    rep.fds_after = cf::open_fds();
    rep.maps_after = cf::shm_mappings();
    if (rep.fds_after > rep.fds_before) cf::copy_text(rep.fds_text, sizeof rep.fds_text, cf::describe_fds());
    rep.written = 1;
    return 0;
  };
  std::vector<pid_t> pids;
  for (int r = 0; r < p; ++r) pids.push_back(cf::spawn(r, survivor));
  // Like torchrun or a supervisor: once the victim is dead, start it again, next generation.
  int st = 0;
  REQUIRE(::waitpid(pids[victim], &st, 0) == pids[victim]);
  CHECK((WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL));
  pids[victim] = cf::spawn(victim, [&](int rank) -> int {
    cf::rank_report& rep = board[p];
    cf::fault_plan none;
    try {
      cf::with_comm(g1, rank, &none, [&](auto& comm) {
        comm.set_timeout(20s);
        for (int i = 0; i < 3; ++i) work(comm, 200 + static_cast<std::uint64_t>(i));
        rep.completed = 1;
      });
    } catch (const ct::check_failed& e) {
      rep.wrong_data = 1;
      cf::copy_text(rep.what, sizeof rep.what, e.what());
    } catch (const cohort::error& e) {
      cf::record(rep, e.code(), e.peer(), e.what());
    }
    rep.written = 1;
    return 0;
  });
  const auto status = cf::reap(pids, 120s);
  for (int r = 0; r < p; ++r) {
    const cf::rank_report& rep = board[r == victim ? p : r];
    INFO("rank ", r, r == victim ? " (restarted)" : "", ": ", cf::status_text(status[r]), ": ", std::string(rep.what));
    CHECK(status[r] == 0);
    CHECK(rep.completed == 1);
    CHECK(rep.wrong_data == 0);
    if (r != victim) {
      INFO("descriptors: ", std::string(rep.fds_text));
      CHECK(rep.fds_after <= rep.fds_before);
      CHECK(rep.maps_after == 0);
    }
  }
  CHECK(cf::shm_names(g0.job).empty());
  CHECK(cf::shm_names(g1.job).empty());
}

}  // namespace

TEST_CASE("recovery: survivors rebuild a smaller communicator and go on, over shm") { shrink(cf::kind::shm); }
TEST_CASE("recovery: survivors rebuild a smaller communicator and go on, over tcp") { shrink(cf::kind::tcp); }
TEST_CASE("recovery: a restarted rank meets the survivors in a new generation, over shm") {
  restart(cf::kind::shm, 1);
}
TEST_CASE("recovery: a restarted rank 0, the store's host, meets the survivors in a new generation, over tcp") {
  restart(cf::kind::tcp, 0);
}

// ---------------------------------------------------------------------------------------------
// Async collectives: a rank dies while operations are queued on the progress threads.

namespace {

void async_kill(cf::kind transport) {
  constexpr int p = 3, victim = 1, queued = 8;
  const cf::job_spec spec = cf::make_spec(transport, "async", p);
  cf::report_board board(p);
  std::vector<pid_t> pids;
  for (int r = 0; r < p; ++r)
    pids.push_back(cf::spawn(r, [&](int rank) -> int {
      cf::rank_report& rep = board[rank];
      rep.fds_before = cf::open_fds();
      cf::fault_plan plan;
      if (rank == victim) {
        plan.action = cf::fault_action::kill;
        plan.at_op = 40;  // a few calls in
      }
      cf::with_comm(spec, rank, &plan, [&](auto& comm) {
        comm.set_timeout(10s);
        std::vector<std::vector<float>> data(queued, std::vector<float>(100'003, 1.0f));
        int peer_lost = 0, poisoned = 0, ok = 0, other = 0;
        const auto t0 = cf::steady::now();
        {
          cohort::progress_thread pt(comm);
          std::vector<std::future<void>> f;
          for (auto& d : data) f.push_back(cohort::async_all_reduce(pt, d, cohort::ops::sum, boost::asio::use_future));
          for (auto& x : f) {
            if (x.wait_for(30s) != std::future_status::ready) {
              rep.value = -1;  // hung
              std::fflush(nullptr);
              ::_exit(5);
            }
            try {
              x.get();
              ++ok;
            } catch (const cohort::error& e) {
              if (e.code() == errc::peer_lost && peer_lost++ == 0) cf::copy_text(rep.what, sizeof rep.what, e.what());
              else if (e.code() == errc::poisoned) ++poisoned;
              else if (e.code() != errc::peer_lost) ++other;
            }
          }
        }  // the progress thread joins
        rep.elapsed_ms = std::chrono::duration_cast<std::chrono::milliseconds>(cf::steady::now() - t0).count();
        for (int i = 0; i < ok; ++i)
          if (data[static_cast<std::size_t>(i)][7] != static_cast<float>(p)) rep.wrong_data = 1;
        rep.completed = ok;
        rep.code = peer_lost;
        rep.peer = poisoned;
        rep.value = other;
      });
      rep.fds_after = cf::open_fds();
      if (rep.fds_after > rep.fds_before) cf::copy_text(rep.fds_text, sizeof rep.fds_text, cf::describe_fds());
      rep.leaks = cf::leak_check_failed();
      rep.written = 1;
      return 0;
    }));
  const auto status = cf::reap(pids, 90s);
  CHECK(status[victim] == -SIGKILL);
  for (int r = 0; r < p; ++r) {
    if (r == victim) continue;
    const cf::rank_report& rep = board[r];
    INFO("rank ", r, ": ", cf::status_text(status[r]), "; ", rep.completed, " completed, ", rep.code,
         " peer_lost, ", rep.peer, " poisoned, ", rep.value, " other; ", std::string(rep.what));
    CHECK(status[r] == 0);
    CHECK(rep.written == 1);
    CHECK(rep.code >= 1);                                  // the failing call says peer_lost
    CHECK(rep.completed + rep.code + rep.peer == queued);  // the later ones say poisoned at once
    CHECK(rep.value == 0);
    CHECK(rep.wrong_data == 0);
    CHECK(rep.elapsed_ms < 10'000);
    INFO("descriptors: ", std::string(rep.fds_text));
    CHECK(rep.fds_after <= rep.fds_before);
    CHECK(rep.leaks == 0);
  }
  CHECK(cf::shm_names(spec.job).empty());
}

}  // namespace

TEST_CASE("recovery: a rank killed under queued async collectives, over shm") { async_kill(cf::kind::shm); }
TEST_CASE("recovery: a rank killed under queued async collectives, over tcp") { async_kill(cf::kind::tcp); }
