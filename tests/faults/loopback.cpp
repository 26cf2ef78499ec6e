// Failure matrices on the in-process transport.
#include "../support.hpp"

#include "mismatch_matrix.hpp"

using namespace std::chrono_literals;

TEST_CASE("mismatch matrix: every pair of collectives and every differing argument") {
  const auto cases = cohort::test::mismatch_cases();
  CHECK(cases.size() == 30 + 15);
  for (int p : {2, 3}) {
    for (const auto& c : cases) {
      const auto& usual = c.first;  // no structured bindings: clang 14 cannot capture them
      const auto& odd = c.second;
      const int odd_rank = p - 1;
      std::vector<std::pair<std::error_code, std::string>> got(p);
      cohort::run_loopback(p, [&](auto& comm) {
        comm.set_timeout(10s);
        got[comm.rank()] = cohort::test::try_call(comm, comm.rank() == odd_rank ? odd : usual);
      });
      for (int r = 0; r < p; ++r) {
        INFO("P=", p, " rank ", r, ": ", got[r].second);
        CHECK(got[r].first == cohort::errc::mismatch);
        // The detecting rank wrote both sides; the others quote it.
        CHECK(got[r].second.find(cohort::test::expected_text(usual) + " #0") != std::string::npos);
        CHECK(got[r].second.find(cohort::test::expected_text(odd) + " #0") != std::string::npos);
      }
    }
  }
}
