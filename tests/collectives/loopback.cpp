// The collective suite on the in-process transport: ranks are threads.
#include "../support.hpp"

#include "../coalescing_loopback.hpp"
#include "suite.hpp"

namespace ct = cohort::test;

namespace {

constexpr int rank_counts[] = {1, 2, 3, 4, 7};

template <class T, class Op, class Transport = cohort::loopback_transport>
void run_suite(const Op& op, bool reducing_only, std::span<const int> ps = rank_counts) {
  for (int p : ps) {
    for (std::size_t n : ct::counts_for<T>(p)) {
      for (ct::kind k : ct::every_kind) {
        if (reducing_only != ct::reduces(k)) continue;
        const int root = p - 1 - static_cast<int>(n % static_cast<std::size_t>(p));
        INFO(ct::kind_name(k), " P=", p, " n=", n, " root=", root);
        CHECK_NOTHROW(cohort::run_loopback<Transport>(p, [&](auto& comm) {
          ct::check<T>(comm, k, op, n, root, 1234 + n);
        }));
      }
    }
  }
}

}  // namespace

TEST_CASE_TEMPLATE("every reduction on the loopback transport", T, float, double, std::int32_t,
                   cohort::fp16, cohort::bf16) {
  run_suite<T>(cohort::ops::sum, true);
  run_suite<T>(cohort::ops::prod, true);
  run_suite<T>(cohort::ops::min, true);
  run_suite<T>(cohort::ops::max, true);
  if constexpr (!std::is_integral_v<T>) run_suite<T>(cohort::ops::avg, true);
}

TEST_CASE_TEMPLATE("data movement on the loopback transport", T, float, double, std::int32_t,
                   cohort::fp16, cohort::bf16) {
  run_suite<T>(cohort::ops::sum, false);
}

// Where P is a power of two, recursive doubling: its edges off the ring, its boundaries.
TEST_CASE_TEMPLATE("every collective over a transport that coalesces sends", T, float,
                   std::int32_t, cohort::fp16) {
  constexpr int powers_of_two[] = {2, 4, 8};
  run_suite<T, decltype(cohort::ops::sum), ct::coalescing_loopback>(cohort::ops::sum, true,
                                                                     powers_of_two);
  run_suite<T, decltype(cohort::ops::sum), ct::coalescing_loopback>(cohort::ops::sum, false,
                                                                     powers_of_two);
}

TEST_CASE_TEMPLATE("broadcast from every root on both sides of the tree/chain crossover", T, float,
                   cohort::fp16, double) {
  for (int p : {3, 4, 5, 8}) {
    INFO("P=", p);
    CHECK_NOTHROW(cohort::run_loopback(p, [](auto& comm) { ct::check_broadcast_sweep<T>(comm); }));
  }
}

TEST_CASE_TEMPLATE("random floats: bitwise equal on every rank, within (P+1)·eps·Σ|x| of exact",
                   T, float, double, cohort::fp16, cohort::bf16) {
  for (int p : {2, 3, 4, 7}) {
    for (std::size_t n : {std::size_t{1000}, std::size_t{100'003}}) {
      INFO("P=", p, " n=", n);
      CHECK_NOTHROW(cohort::run_loopback(p, [&](auto& comm) { ct::check_rounding<T>(comm, n, 99 + n); }));
    }
  }
}

// A small all_reduce of 16-bit floats accumulates every rank's element in fp32 and rounds once:
// rank 0 gives 1, the P-1 others a (P-1)th of 1's ulp each. Rounding after each addition would
// lose every one of them (each is at most half an ulp, a tie going to the even 1); one rounding
// gives 1 + ulp exactly.
TEST_CASE_TEMPLATE("a small 16-bit all_reduce rounds once, not once per rank", T, cohort::fp16,
                   cohort::bf16) {
  const float ulp = std::same_as<T, cohort::fp16> ? 0x1p-10f : 0x1p-7f;
  for (int p : {3, 5}) {
    for (std::size_t n : {std::size_t{1}, std::size_t{7}, std::size_t{1000}, std::size_t{2048}}) {
      INFO("P=", p, " n=", n);
      CHECK_NOTHROW(cohort::run_loopback(p, [&](auto& comm) {
        const float mine = comm.rank() == 0 ? 1.0f : ulp / static_cast<float>(p - 1);
        std::vector<T> x(n, T(mine));
        cohort::all_reduce(comm, x, cohort::ops::sum);
        for (std::size_t i = 0; i < n; ++i)
          if (static_cast<float>(x[i]) != 1.0f + ulp)
            throw ct::check_failed("element " + std::to_string(i) + " is " +
                                   std::to_string(static_cast<float>(x[i])) + ", not 1 + ulp");
      }));
    }
  }
}
