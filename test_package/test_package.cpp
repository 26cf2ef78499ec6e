// Conan's test of the package: four ranks (threads) all-reduce 10'007 ints (not a multiple
// of 4) and check that every rank got the sum. Same program as tests/consumers/consumer.cpp.
#include <atomic>
#include <cstdio>
#include <vector>

#include <cohort/cohort.hpp>

int main() {
  constexpr int ranks = 4;
  constexpr int expected = 1 + 2 + 3 + 4;  // rank r contributes r + 1
  constexpr std::size_t count = 10'007;
  std::atomic<int> wrong_ranks{0};
  cohort::run_loopback(ranks, [&](cohort::loopback_communicator& comm) {
    std::vector<int> data(count, comm.rank() + 1);
    cohort::all_reduce(comm, data, cohort::ops::sum);
    for (int x : data) {
      if (x != expected) {
        ++wrong_ranks;
        break;
      }
    }
  });
  if (wrong_ranks != 0) {
    std::fprintf(stderr, "all_reduce gave a wrong sum on %d of %d ranks\n", wrong_ranks.load(),
                 ranks);
    return 1;
  }
  std::printf("cohort %s: %d ranks all-reduced %zu ints, every rank got %d\n",
              COHORT_VERSION_STRING, ranks, count, expected);
  return 0;
}
