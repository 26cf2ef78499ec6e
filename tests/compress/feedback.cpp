// Error feedback: sent + new residual == gradient + old residual, exactly, for every codec
// whose error is representable; within half an ulp for stochastic int8.
#include "../support.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
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

// The reference of one encode with error feedback: correct (c = g on the first call, bit for
// bit), encode c, decode-subtract the encoding from c.
template <class Inner>
std::vector<std::byte> reference_step(const Inner& inner, std::vector<float>& r,
                                      std::span<const float> g, std::uint64_t salt) {
  std::vector<float> c(g.begin(), g.end());
  if (!r.empty())
    for (std::size_t i = 0; i < c.size(); ++i) c[i] = g[i] + r[i];
  auto bytes = ct::encode(inner, c, salt);
  r = c;
  inner.decode(bytes, r, cc::decode_mode::subtract);
  return bytes;
}

// Gradients with signed zeros and a tiny block, so that the first call's c = g (not g + 0)
// shows in the residual's bits.
std::vector<float> awkward_gradient(std::uint64_t seed, std::size_t n) {
  auto g = ct::gradient(seed, n);
  for (std::size_t i = 0; i < n; i += 7) g[i] = -0.0f;
  for (std::size_t i = 0; i < std::min<std::size_t>(n, 64); ++i) g[i] = i % 2 ? -0.0f : 1e-30f;
  return g;
}

template <class Inner>
void check_one_pass(const Inner& inner, std::size_t n, int steps) {
  for (int cap : {0, -1}) {
    ct::with_isa(cap, [&] {
      cc::error_feedback ef{inner};
      std::vector<float> r;
      for (int step = 0; step < steps; ++step) {
        const auto g = awkward_gradient(77 + step, n);
        const auto salt = static_cast<std::uint64_t>(step) + 5;
        const auto want = reference_step(inner, r, g, salt);
        const auto got = ct::encode(ef, g, salt);
        INFO(ef.name(), " isa cap ", cap, " step ", step);
        REQUIRE(got == want);
        REQUIRE(ct::same_bits(ef.residual(), r));
      }
    });
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

TEST_CASE("error feedback in one pass: the bytes and residual of correct, encode, absorb") {
  const std::size_t n = 3001;
  check_one_pass(cc::fp16, n, 3);
  check_one_pass(cc::int8, n, 3);
  check_one_pass(cc::int8_codec<64>{}, n, 3);
  check_one_pass(cc::int8_codec<>{.stochastic = true, .seed = 12345}, n, 3);
  check_one_pass(cc::top_k(0.01, cc::selection::exact), n, 3);
  check_one_pass(cc::top_k(0.05) | cc::bf16, n, 3);
  check_one_pass(cc::top_k(0.01), 100000, 3);  // sampled: corrected in the collecting pass
  check_one_pass(cc::top_k(0.3), 100000, 2);   // too many candidates: exact on the residual
}

TEST_CASE("int8 in pieces: first_block gives the bytes and residual of the whole") {
  const std::size_t n = 3001, split = 5 * 256;
  for (const auto& q : {cc::int8_codec<>{}, cc::int8_codec<>{.stochastic = true, .seed = 9}}) {
    const auto g = awkward_gradient(3, n);
    std::vector<float> r;
    const auto want = reference_step(q, r, g, 41);
    REQUIRE(ct::encode(q, g, 41) == want);
    std::vector<std::uint32_t> out(q.encoded_bytes(n) / 4 + 1);
    const auto bytes = std::as_writable_bytes(std::span(out));
    const std::span<const float> gs(g);
    const std::size_t at = q.encoded_bytes(split);
    q.encode(gs.first(split), bytes.first(at), {}, 41, 0);
    q.encode(gs.subspan(split), bytes.subspan(at), {}, 41, split / 256);
    CHECK(std::memcmp(bytes.data(), want.data(), want.size()) == 0);
    cc::error_feedback ef{q};
    ef.begin(n);
    ef.encode_part(q, gs.subspan(split), split, bytes.subspan(at), {}, 41, split / 256);
    ef.encode_part(q, gs.first(split), 0, bytes.first(at), {}, 41, 0);
    ef.end();
    CHECK(std::memcmp(bytes.data(), want.data(), want.size()) == 0);
    CHECK(ct::same_bits(ef.residual(), r));
  }
}
