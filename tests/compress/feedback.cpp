// Error feedback: sent + new residual == gradient + old residual, exactly, for every codec
// whose error is representable; within half an ulp for stochastic int8.
#include "../support.hpp"

#include <cmath>
#include <stdexcept>
#include <string>
#include <vector>

#include "helpers.hpp"

namespace cc = cohort::compress;
namespace ct = cohort::test;

namespace {

// Runs `steps` encodes through error feedback and checks the invariant per element: exactly
// in float arithmetic, or (stochastic) to half an ulp of the new residual.
template <class Inner>
void check_invariant(const Inner& inner, std::size_t n, int steps, bool exact) {
  cc::error_feedback ef{inner};
  CHECK(ef.residual().empty());
  for (int step = 0; step < steps; ++step) {
    const auto g = ct::gradient(1000 + step, n);
    std::vector<float> r_old(ef.residual().begin(), ef.residual().end());
    if (r_old.empty()) r_old.assign(n, 0.0f);
    const auto bytes = ct::encode(ef, g, static_cast<std::uint64_t>(step));
    const auto sent = ct::decoded(inner, bytes, n);
    const auto r_new = ef.residual();
    REQUIRE(r_new.size() == n);
    for (std::size_t i = 0; i < n; ++i) {
      const float lhs = sent[i] + r_new[i], rhs = g[i] + r_old[i];
      if (exact) {
        INFO(ef.name(), " step ", step, " element ", i);
        REQUIRE(ct::bits(lhs) == ct::bits(rhs));
      } else {
        const double err = static_cast<double>(sent[i]) + r_new[i] - rhs;
        REQUIRE(std::abs(err) <= 0.5 * std::abs(std::nextafter(r_new[i], INFINITY) - r_new[i]) +
                                     0.5 * std::abs(std::nextafter(rhs, INFINITY) - rhs));
      }
    }
  }
}

}  // namespace

TEST_CASE("error feedback invariant, exact, for every codec") {
  const std::size_t n = 3001;
  check_invariant(cc::fp16, n, 4, true);
  check_invariant(cc::bf16, n, 4, true);
  check_invariant(cc::int8, n, 4, true);
  check_invariant(cc::int8_codec<64>{}, n, 4, true);
  check_invariant(cc::top_k(0.01, cc::selection::exact), n, 6, true);
  check_invariant(cc::top_k(0.1), n, 6, true);
  check_invariant(cc::top_k(0.01) | cc::bf16, n, 6, true);
  check_invariant(cc::top_k(0.05, cc::selection::exact) | cc::fp16, n, 6, true);
  check_invariant(cc::top_k(0.01), 100000, 3, true);  // large enough to sample
}

TEST_CASE("error feedback with stochastic int8: within half an ulp") {
  check_invariant(cc::int8_codec<>{.stochastic = true}, 3001, 4, false);
}

TEST_CASE("error feedback with top-k keeps every unsent value") {
  const std::size_t n = 1000;
  cc::error_feedback ef{cc::top_k(0.01, cc::selection::exact)};
  const std::vector<float> g(n, 1.0f);
  std::vector<float> total_sent(n, 0.0f);
  for (int step = 0; step < 100; ++step) {
    const auto bytes = ct::encode(ef, g);
    cc::top_k(0.01).decode(bytes, total_sent, cc::decode_mode::add);
  }
  // 100 steps of 10 entries: everything sent once the residual grew (exact in small integers).
  for (std::size_t i = 0; i < n; ++i) REQUIRE(total_sent[i] + ef.residual()[i] == 100.0f);
}

TEST_CASE("error feedback: one residual per tensor") {
  cc::error_feedback ef{cc::bf16};
  CHECK(ef.name() == "error_feedback(bf16)");
  ct::encode(ef, ct::gradient(1, 100));
  CHECK(ef.fits(100));
  CHECK_FALSE(ef.fits(99));
  try {
    ct::encode(ef, ct::gradient(1, 99));
    FAIL("a residual of 100 floats took a tensor of 99");
  } catch (const cohort::error& e) {
    CHECK(e.code() == cohort::errc::invalid_argument);
    CHECK(e.operation() == "error_feedback::encode");
    CHECK(std::string(e.what()).find("of 100 floats, not 99") != std::string::npos);
  }
  CHECK(ef.residual().size() == 100);  // refused before anything changed
  auto copy = ef;  // its own residual
  ef.reset();
  CHECK(ef.residual().empty());
  CHECK(copy.residual().size() == 100);
  ct::encode(ef, ct::gradient(1, 99));
  CHECK(ef.residual().size() == 99);
}
