// The mismatch matrix (mismatch_matrix.hpp) with ranks as processes, over shm and TCP: for every
// pair of collectives, and for a different count, element type, reduction or root at the same
// sequence number, every rank fails with errc::mismatch and a message that describes both calls.
// Each rank process runs every case in turn on a fresh communicator (a new job id per case):
// a poisoned communicator is rebuilt, as a user would after a failure.
#include "../support.hpp"

#include "mismatch_matrix.hpp"
#include "process.hpp"

namespace cf = cohort::faults;
namespace ct = cohort::test;
using namespace std::chrono_literals;

namespace {

struct case_result {
  int code = -1;
  int done = 0;
  int late = 0;  // the call itself completed; the mismatch came at the next call
  char what[700] = {};
};

// A shared array of results: rank-major, one per (rank, case).
class result_board {
 public:
  result_board(int ranks, int cases) : n_(static_cast<std::size_t>(ranks) * static_cast<std::size_t>(cases)), cases_(cases) {
    void* p = ::mmap(nullptr, n_ * sizeof(case_result), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    REQUIRE(p != MAP_FAILED);
    r_ = static_cast<case_result*>(p);
    for (std::size_t i = 0; i < n_; ++i) new (&r_[i]) case_result{};
  }
  ~result_board() { ::munmap(r_, n_ * sizeof(case_result)); }
  case_result& at(int rank, int c) { return r_[static_cast<std::size_t>(rank) * cases_ + c]; }

 private:
  std::size_t n_;
  int cases_;
  case_result* r_;
};

void matrix(cf::kind transport, int p) {
  const auto cases = ct::mismatch_cases();
  const int n = static_cast<int>(cases.size());
  result_board board(p, n);
  const std::string base = cf::unique_job("mm");
  const int store_port = cf::free_port();
  pid_t store_pid = -1;
  if (transport == cf::kind::tcp) {
    store_pid = cf::spawn(0, [&](int) -> int {
      cohort::tcp_store_server server("127.0.0.1", store_port, {.token = {}, .log = [](std::string_view) {}});
      for (;;) ::pause();
    });
  }
  std::vector<pid_t> pids;
  for (int r = 0; r < p; ++r)
    pids.push_back(cf::spawn(r, [&](int rank) -> int {
      cohort::tcp_store st("127.0.0.1", store_port, {.token = {}, .timeout = 20s});
      for (int i = 0; i < n; ++i) {
        const auto& usual = cases[i].first;
        const auto& odd = cases[i].second;
        cf::job_spec spec;
        spec.transport = transport;
        spec.job = base + "-" + std::to_string(i);
        spec.size = p;
        cf::fault_plan plan;
        case_result& out = board.at(rank, i);
        try {
          cf::with_comm(spec, rank, &plan, [&](auto& comm) {
            comm.set_timeout(10s);
            auto [code, what, late] = ct::try_call_or_next(comm, rank == p - 1 ? odd : usual);
            out.late = late;
            out.code = code.value();
            cf::copy_text(out.what, sizeof out.what, what);
          }, transport == cf::kind::tcp ? &st : nullptr);
        } catch (const cohort::error& e) {
          out.code = -e.code().value();
          cf::copy_text(out.what, sizeof out.what, std::string("setup: ") + e.what());
        }
        out.done = 1;
      }
      return 0;
    }));
  const auto status = cf::reap(pids, 240s);
  if (store_pid > 0) {
    ::kill(store_pid, SIGKILL);
    ::waitpid(store_pid, nullptr, 0);
  }
  for (int r = 0; r < p; ++r) CHECK(status[r] == 0);
  int checked = 0, late = 0;
  for (int i = 0; i < n; ++i) {
    const auto& usual = cases[i].first;
    const auto& odd = cases[i].second;
    for (int r = 0; r < p; ++r) {
      const case_result& c = board.at(r, i);
      INFO(std::string(cf::kind_name(transport)), " P=", p, " case ", i, " (", ct::expected_text(usual),
           " vs ", ct::expected_text(odd), ") rank ", r, c.late ? " (at its next call)" : "", ": ", std::string(c.what));
      late += c.late;
      CHECK(c.done == 1);
      CHECK(c.code == static_cast<int>(cohort::errc::mismatch));
      const std::string what = c.what;
      CHECK(what.find(ct::expected_text(usual) + " #0") != std::string::npos);
      CHECK(what.find(ct::expected_text(odd) + " #0") != std::string::npos);
      ++checked;
    }
    CHECK(cf::shm_names(base + "-" + std::to_string(i)).empty());
  }
  MESSAGE(std::string(cf::kind_name(transport)), " P=", p, ": ", n, " disagreements, ", checked,
          " rank results, each errc::mismatch describing both calls (", late,
          " of them at the rank's next call: its part had completed)");
}

}  // namespace

TEST_CASE("mismatch matrix over shm processes") {
  matrix(cf::kind::shm, 2);
  matrix(cf::kind::shm, 3);
}

TEST_CASE("mismatch matrix over tcp processes") {
  matrix(cf::kind::tcp, 2);
  matrix(cf::kind::tcp, 3);
  matrix(cf::kind::tcp, 4);  // recursive doubling: headers on edges off the ring
}
