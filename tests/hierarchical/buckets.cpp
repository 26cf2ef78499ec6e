// gradient_buckets over the hierarchical communicator, ranks as threads on loopback. The
// hierarchical communicator does not model `communicator`, so neither progress_thread nor
// gradient_buckets takes it directly: the progress thread is anchored on the host's local
// communicator and each bucket's reduction (bucket_options::reduce) calls the hierarchical
// collective, which then runs on the progress thread only. Checked: all_reduce(hier, avg),
// with accumulation, and compressed_all_reduce(hier) with bf16 and top-k + error feedback.
#include "../support.hpp"

#include <atomic>
#include <cstdint>
#include <memory>
#include <span>
#include <thread>
#include <vector>

#include <cohort/async/gradient_buckets.hpp>
#include <cohort/async/progress_thread.hpp>
#include <cohort/cohort.hpp>
#include <cohort/compress/hierarchical.hpp>
#include <cohort/hierarchical.hpp>

#include "../collectives/suite.hpp"

namespace ct = cohort::test;

namespace {

using loopback_hier =
    cohort::hierarchical_communicator<cohort::loopback_communicator, cohort::loopback_communicator>;
using local_comm = cohort::loopback_communicator;

/// Runs `fn(h)` on hosts x l_size threads, each with its hierarchical communicator.
template <class Fn>
void run_hierarchical(int hosts, int l_size, Fn&& fn) {
  std::vector<std::shared_ptr<cohort::loopback_world>> local, rail;
  for (int h = 0; h < hosts; ++h) local.push_back(std::make_shared<cohort::loopback_world>(l_size));
  for (int l = 0; l < l_size; ++l) rail.push_back(std::make_shared<cohort::loopback_world>(hosts));
  const int p = hosts * l_size;
  std::vector<std::exception_ptr> errors(static_cast<std::size_t>(p));
  std::vector<std::thread> threads;
  for (int r = 0; r < p; ++r)
    threads.emplace_back([&, r] {
      const int h = r / l_size, l = r % l_size;
      try {
        loopback_hier comm(
            std::make_unique<local_comm>(cohort::loopback_transport(local[h], l)),
            std::make_unique<local_comm>(cohort::loopback_transport(rail[l], h)));
        fn(comm);
      } catch (...) {
        errors[static_cast<std::size_t>(r)] = std::current_exception();
      }
    });
  for (auto& t : threads) t.join();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
}

// Five tensors of awkward sizes; rank r's gradient for tensor t element k = (r + 1) * (t + k % 3
// + 1): small integers, so sums and means over 4 or 6 ranks are exact in f32 and bf16.
std::vector<std::vector<float>> make_grads(int rank) {
  std::vector<std::vector<float>> g;
  for (std::size_t t = 0, sizes[] = {7, 1000, 3, 40'000, 129}; t < 5; ++t) {
    g.emplace_back(sizes[t]);
    for (std::size_t k = 0; k < sizes[t]; ++k) g[t][k] = float((rank + 1) * (t + k % 3 + 1));
  }
  return g;
}

std::vector<std::span<float>> spans(std::vector<std::vector<float>>& g) {
  return {g.begin(), g.end()};
}

// The mean over ranks 0..p-1 of make_grads: (p + 1) / 2 * (t + k % 3 + 1).
float mean_of(int p, std::size_t t, std::size_t k) {
  return float(p + 1) / 2.0f * float(t + k % 3 + 1);
}

constexpr int layouts[][2] = {{2, 2}, {3, 2}, {2, 3}};

}  // namespace

TEST_CASE("gradient buckets all-reduce through the hierarchical all_reduce") {
  for (auto [hosts, l_size] : layouts)
    run_hierarchical(hosts, l_size, [&](loopback_hier& h) {
      const int p = h.size();
      cohort::progress_thread<local_comm> progress(h.local());
      auto g = make_grads(h.rank());
      std::atomic<int> calls{0};
      cohort::bucket_options<local_comm> opts;
      opts.bucket_bytes = 4000;
      opts.reduce = [&h, &calls](local_comm&, std::span<float> b) {
        ++calls;
        cohort::all_reduce(h, b, cohort::ops::avg);
      };
      cohort::gradient_buckets buckets(progress, spans(g), opts);
      CHECK(buckets.bucket_count() == 3);  // {129, 40000} {3, 1000} {7}
      for (std::size_t t = 5; t-- > 0;) buckets.ready(t);
      CHECK(buckets.finish());
      CHECK(calls == 3);
      for (std::size_t t = 0; t < 5; ++t)
        for (std::size_t k = 0; k < g[t].size(); ++k)
          if (g[t][k] != mean_of(p, t, k)) FAIL("tensor ", t, " element ", k, ": ", g[t][k]);
    });
}

TEST_CASE("gradient buckets with accumulation over the hierarchical all_reduce") {
  run_hierarchical(2, 2, [&](loopback_hier& h) {
    cohort::progress_thread<local_comm> progress(h.local());
    auto g = make_grads(h.rank());
    cohort::bucket_options<local_comm> opts;
    opts.accumulate = 2;
    opts.reduce = [&h](local_comm&, std::span<float> b) { cohort::all_reduce(h, b, cohort::ops::avg); };
    cohort::gradient_buckets buckets(progress, spans(g), opts);
    for (std::size_t t = 5; t-- > 0;) buckets.ready(t);
    CHECK_FALSE(buckets.finish());
    for (auto& t : g)
      for (float& x : t) x *= 2;  // the second micro-batch adds the same gradient again
    for (std::size_t t = 5; t-- > 0;) buckets.ready(t);
    CHECK(buckets.finish());
    // Mean over ranks of 2 * grad, divided by 2 micro-batches: the plain mean.
    for (std::size_t t = 0; t < 5; ++t)
      for (std::size_t k = 0; k < g[t].size(); k += 31) CHECK(g[t][k] == mean_of(4, t, k));
  });
}

TEST_CASE("gradient buckets through compressed_all_reduce(hier): bf16 exact, top-k agreeing") {
  for (auto [hosts, l_size] : layouts)
    run_hierarchical(hosts, l_size, [&](loopback_hier& h) {
      const int p = h.size();
      cohort::progress_thread<local_comm> progress(h.local());
      {
        auto g = make_grads(h.rank());
        std::uint64_t sent = 0;
        cohort::bucket_options<local_comm> opts;
        opts.bucket_bytes = 4000;
        opts.reduce = [&h, &sent](local_comm&, std::span<float> b) {
          sent += cohort::compressed_all_reduce(h, b, cohort::compress::bf16, cohort::ops::avg)
                      .bytes_sent;
        };
        cohort::gradient_buckets buckets(progress, spans(g), opts);
        for (std::size_t t = 5; t-- > 0;) buckets.ready(t);
        CHECK(buckets.finish());
        // Small integers: exact in bf16, so the mean is exact too.
        for (std::size_t t = 0; t < 5; ++t)
          for (std::size_t k = 0; k < g[t].size(); ++k)
            if (g[t][k] != mean_of(p, t, k)) FAIL("bf16: tensor ", t, " element ", k, ": ", g[t][k]);
        CHECK(sent > 0);
      }
      {
        // Top-k 1% with error feedback: lossy, but every rank ends with the same bits, and
        // what a step leaves out is carried into the next.
        auto g = make_grads(h.rank());
        std::vector<std::vector<float>> first;
        cohort::compress::error_feedback ef{cohort::compress::top_k(0.01)};
        cohort::bucket_options<local_comm> opts;
        opts.reduce = [&h, &ef](local_comm&, std::span<float> b) {
          cohort::compressed_all_reduce(h, b, ef, cohort::ops::avg);
        };
        cohort::gradient_buckets buckets(progress, spans(g), opts);
        CHECK(buckets.bucket_count() == 1);
        for (std::size_t t = 5; t-- > 0;) buckets.ready(t);
        CHECK(buckets.finish());
        std::size_t nonzero = 0, total = 0;
        for (auto& t : g) {
          total += t.size();
          for (float x : t) nonzero += x != 0.0f;
        }
        CHECK(nonzero > 0);
        CHECK(nonzero < total / 10);  // sparse: far fewer than all
        std::uint64_t hash = 0;
        for (auto& t : g) hash = hash * 1000003u + ct::hash_bytes(std::as_bytes(std::span(t)));
        auto mine = static_cast<std::int64_t>(hash);
        std::vector<std::int64_t> all(static_cast<std::size_t>(p));
        cohort::all_gather(h, std::span(&mine, 1), all);  // no bucket in flight now
        for (auto v : all) CHECK(v == all[0]);
      }
    });
}
