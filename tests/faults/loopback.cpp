// Failure matrices on the in-process transport.
#include "../support.hpp"

#include "../coalescing_loopback.hpp"
#include "mismatch_matrix.hpp"

using namespace std::chrono_literals;

namespace {

template <class Transport>
void check_mismatch_matrix(int p) {
  for (const auto& c : cohort::test::mismatch_cases()) {
    const auto& usual = c.first;  // no structured bindings: clang 14 cannot capture them
    const auto& odd = c.second;
    const int odd_rank = p - 1;
    std::vector<cohort::test::mismatch_outcome> got(p);
    cohort::run_loopback<Transport>(p, [&](auto& comm) {
      comm.set_timeout(10s);
      got[comm.rank()] =
          cohort::test::try_call_or_next(comm, comm.rank() == odd_rank ? odd : usual);
    });
    for (int r = 0; r < p; ++r) {
      INFO("P=", p, " rank ", r, got[r].late ? " (at its next call): " : ": ", got[r].what);
      CHECK(got[r].code == cohort::errc::mismatch);
      // The detecting rank wrote both sides; the others quote it.
      CHECK(got[r].what.find(cohort::test::expected_text(usual) + " #0") != std::string::npos);
      CHECK(got[r].what.find(cohort::test::expected_text(odd) + " #0") != std::string::npos);
    }
  }
}

}  // namespace

TEST_CASE("mismatch matrix: every pair of collectives and every differing argument") {
  CHECK(cohort::test::mismatch_cases().size() == 30 + 17);
  for (int p : {2, 3, 4}) check_mismatch_matrix<cohort::loopback_transport>(p);
  // Recursive doubling, where edges off the ring carry their own headers.
  for (int p : {4, 8}) check_mismatch_matrix<cohort::test::coalescing_loopback>(p);
}
