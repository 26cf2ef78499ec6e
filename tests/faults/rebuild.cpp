// A TCP communicator rebuilt at once after the last one is gone, with the same launch info
// (the same job id and store address), over and over: the store must never hand a rank what
// the previous communicator published (its address, its token). 1000 cycles at P = 2 and 4 in
// the slow tier; a quarter of that (COHORT_TEST_SCALE=0.25) in the fast one.
#include "../support.hpp"

#include "process.hpp"

namespace cf = cohort::faults;
using cohort::errc;
using namespace std::chrono_literals;

namespace {

void rebuild(int p, long cycles) {
  cf::job_spec spec = cf::make_spec(cf::kind::tcp, "rebuild", p);
  cf::report_board board(p);
  std::vector<pid_t> pids;
  const auto t0 = std::chrono::steady_clock::now();
  for (int r = 0; r < p; ++r)
    pids.push_back(cf::spawn(r, [&](int rank) {
      cf::rank_report& rep = board[rank];
      const cohort::launch_info info = cf::info_for(spec, rank);
      auto o = cf::tcp_test_options(10s);
      for (long i = 0; i < cycles; ++i) {
        try {
          auto comm = cohort::make_tcp_communicator(info, o);
          comm.set_timeout(10s);
          std::int64_t v = rank + i;
          cohort::all_reduce(comm, std::span(&v, 1), cohort::ops::sum);
          if (v != static_cast<std::int64_t>(p) * i + p * (p - 1) / 2) rep.wrong_data = 1;
          rep.completed = static_cast<int>(i + 1);
        } catch (const cohort::error& e) {
          cf::record(rep, e.code(), e.peer(), e.what());
          rep.value = i;
          break;
        }
      }
      rep.written = 1;
      return 0;
    }));
  const auto status = cf::reap(pids, 280s);
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                      std::chrono::steady_clock::now() - t0)
                      .count();
  MESSAGE("P=", p, ": ", cycles, " cycles in ", ms, " ms");
  for (int r = 0; r < p; ++r) {
    const cf::rank_report& rep = board[r];
    INFO("P=", p, " rank ", r, ": ", cf::status_text(status[r]), "; failed in cycle ", rep.value,
         ": ", cf::code_name(rep.code), ": ", rep.what);
    CHECK(status[r] == 0);
    CHECK(rep.completed == cycles);
    CHECK(rep.wrong_data == 0);
  }
}

}  // namespace

TEST_CASE("rebuild: a tcp communicator made again at once with the same launch info, "
          "1000 times, P = 2 and 4") {
  for (int p : {2, 4}) rebuild(p, cf::scaled(1000, 50));
}
