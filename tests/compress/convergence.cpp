// Convergence on real data: data-parallel training of a small MLP on the UCI optical digits
// with 4 ranks (threads), 3 seeds (1 when thinned) and a fixed budget of 30 epochs. Every codec must land within
// 1 percentage point of uncompressed test accuracy with a final training loss at most 1.25x;
// top-k 1% without error feedback, the negative control, must be clearly worse.
#include "../scale.hpp"
#include "../support.hpp"

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include <cohort/collectives/all_reduce.hpp>
#include <cohort/compress/all_reduce.hpp>
#include <cohort/transport/loopback.hpp>

#include "digits.hpp"  // examples/common, through digits_mlp_dep
#include "mlp.hpp"

namespace cc = cohort::compress;
namespace ex = cohort::examples;

namespace {

constexpr int ranks = 4;
constexpr std::size_t per_rank_batch = 16;  // global batch 64
constexpr int epochs = 30;
constexpr float learning_rate = 0.1f, momentum = 0.9f;
constexpr std::uint64_t all_seeds[] = {1, 2, 3};

// Every seed in the whole run; the first one when COHORT_TEST_SCALE thins it (the fast tier).
std::span<const std::uint64_t> seeds() {
  return {all_seeds, cohort::test::test_scale() < 1.0 ? std::size_t{1} : std::size(all_seeds)};
}

struct outcome {
  double accuracy = 0.0;  // on the held-out 20%
  double loss = 0.0;      // mean cross-entropy over the training set, after the last epoch
};

const std::pair<ex::dataset, ex::dataset>& digits() {
  static const auto data = [] {
    const char* env = std::getenv("COHORT_DIGITS");
    return ex::split(ex::load_digits(env ? env : "data/digits/digits.csv.gz"), 0.2, 42);
  }();
  return data;
}

// One data-parallel run: every rank holds a replica, computes the gradient of its 16 examples,
// averages gradients with the (compressed) all_reduce and takes the same SGD step.
template <class Codec>
outcome train(std::uint64_t seed, const Codec* prototype) {
  const ex::dataset& train_set = digits().first;  // no structured bindings: clang 14 cannot
  const ex::dataset& test_set = digits().second;  // capture them in the lambda below
  outcome out;
  std::mutex m;
  std::vector<std::vector<float>> finals(ranks);
  cohort::run_loopback(ranks, [&](auto& comm) {
    ex::mlp net({64, 64, 10}, seed);
    ex::sgd opt(learning_rate, momentum);
    std::optional<Codec> codec;
    if (prototype) codec.emplace(*prototype);
    const std::size_t global = ranks * per_rank_batch;
    for (int e = 0; e < epochs; ++e) {
      const auto order = ex::permutation(train_set.size(), seed * 1000 + e);
      for (std::size_t b = 0; b + global <= train_set.size(); b += global) {
        const std::span<const std::size_t> rows(order.data() + b + per_rank_batch * comm.rank(),
                                                per_rank_batch);
        net.backward_batch(train_set, rows);
        if (codec) cohort::compressed_all_reduce(comm, net.gradients(), *codec, cohort::ops::avg);
        else cohort::all_reduce(comm, net.gradients(), cohort::ops::avg);
        opt.step(net.parameters(), net.gradients());
      }
    }
    const auto p = net.parameters();
    std::lock_guard lk(m);
    finals[comm.rank()].assign(p.begin(), p.end());
    if (comm.rank() == 0) out = {net.accuracy(test_set), net.loss(train_set)};
  });
  for (int r = 1; r < ranks; ++r)  // the replicas never drift apart: results are bitwise equal
    REQUIRE(std::memcmp(finals[r].data(), finals[0].data(), finals[0].size() * 4) == 0);
  return out;
}

template <class Codec>
outcome mean_over_seeds(const char* name, const Codec* codec) {
  outcome mean;
  for (std::uint64_t s : seeds()) {
    const outcome o = train(s, codec);
    mean.accuracy += o.accuracy / static_cast<double>(seeds().size());
    mean.loss += o.loss / static_cast<double>(seeds().size());
  }
  const std::string line = std::string(name) + ": test accuracy " +
                           std::to_string(mean.accuracy) + ", final training loss " +
                           std::to_string(mean.loss);
  MESSAGE(line);
  return mean;
}

}  // namespace

TEST_CASE("compressed data-parallel training converges like uncompressed training") {
  const auto [train_set, test_set] = digits();
  REQUIRE(train_set.size() + test_set.size() == 1797);

  const outcome base = mean_over_seeds<cc::cast_codec<cohort::bf16>>("uncompressed f32", nullptr);
  CHECK(base.accuracy > 0.95);

  auto close_to_base = [&](const outcome& o) {
    CHECK(o.accuracy >= base.accuracy - 0.01);
    CHECK(o.loss <= 1.25 * base.loss);
  };
  close_to_base(mean_over_seeds("fp16", &cc::fp16));
  close_to_base(mean_over_seeds("bf16", &cc::bf16));
  close_to_base(mean_over_seeds("int8", &cc::int8));
  const cc::error_feedback top_k_ef{cc::top_k(0.01)};
  close_to_base(mean_over_seeds("top_k 1% + error feedback", &top_k_ef));

  // The negative control: without error feedback, top-k 1% drops 99% of every gradient.
  const auto top_k = cc::top_k(0.01);
  const outcome bare = mean_over_seeds("top_k 1% without error feedback", &top_k);
  CHECK(bare.accuracy < base.accuracy - 0.02);
  CHECK(bare.loss > 2.0 * base.loss);
}
