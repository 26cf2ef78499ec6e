#include <cohort/core/error.hpp>

#include <ostream>

#include <doctest/doctest.h>

TEST_CASE("errc converts to std::error_code in the cohort category") {
  std::error_code ec = cohort::errc::peer_lost;
  CHECK(ec.category().name() == std::string("cohort"));
  CHECK(ec == cohort::errc::peer_lost);
  CHECK(ec != cohort::errc::timed_out);
  CHECK(ec.message() == "peer lost");
}

TEST_CASE("cohort::error carries code, operation and peer") {
  cohort::error e(cohort::errc::timed_out, "all_reduce", 3, "all_reduce #4: rank 3 did not answer");
  CHECK(e.code() == cohort::errc::timed_out);
  CHECK(e.operation() == "all_reduce");
  CHECK(e.peer() == 3);
  CHECK(std::string(e.what()).find("rank 3") != std::string::npos);
}
