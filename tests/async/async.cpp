// The asynchronous layer over the in-process transport: completion tokens, ordering, errors,
// bucketing, accumulation and local SGD.
#include "../support.hpp"

#include <atomic>
#include <latch>
#include <mutex>
#include <chrono>
#include <future>
#include <numeric>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/use_future.hpp>

#include <cohort/async.hpp>
#include <cohort/cohort.hpp>

namespace asio = boost::asio;
using namespace std::chrono_literals;

TEST_CASE("async_all_reduce completes a future, a callback and a coroutine") {
  cohort::run_loopback(3, [](cohort::loopback_communicator& comm) {
    cohort::progress_thread progress(comm);
    std::vector<float> a(100'000, 1.0f), b(10, 2.0f), c(5000, 3.0f);

    auto fut = cohort::async_all_reduce(progress, a, cohort::ops::sum, asio::use_future);

    std::promise<std::exception_ptr> called;
    cohort::async_all_reduce(progress, b, cohort::ops::max,
                             [&](std::exception_ptr e) { called.set_value(e); });

    asio::io_context io;
    bool coroutine_done = false;
    asio::co_spawn(io, [&]() -> asio::awaitable<void> {
      co_await cohort::async_all_reduce(progress, c, cohort::ops::avg, asio::use_awaitable);
      coroutine_done = true;
    }, asio::detached);
    io.run();

    fut.get();
    CHECK(called.get_future().get() == nullptr);
    CHECK(coroutine_done);
    CHECK(a[0] == 3.0f);
    CHECK(a[99'999] == 3.0f);
    CHECK(b[9] == 2.0f);
    CHECK(c[0] == 3.0f);
  });
}

TEST_CASE("several in flight run and complete in the order they were started") {
  cohort::run_loopback(2, [](cohort::loopback_communicator& comm) {
    cohort::progress_thread progress(comm);
    std::vector<std::vector<double>> bufs(8, std::vector<double>(20'000, comm.rank() + 1.0));
    std::vector<int> order;
    std::mutex m;
    std::vector<std::future<void>> futures;
    for (int i = 0; i < 8; ++i) {
      cohort::async_all_reduce(progress, bufs[i], cohort::ops::sum, [&, i](std::exception_ptr e) {
        std::lock_guard lk(m);
        CHECK(e == nullptr);
        order.push_back(i);
      });
    }
    futures.push_back(cohort::async_barrier(progress, {}, asio::use_future));
    futures.back().get();
    std::vector<int> expected(8);
    std::iota(expected.begin(), expected.end(), 0);
    std::lock_guard lk(m);
    CHECK(order == expected);
    for (auto& b : bufs) CHECK(b[123] == 3.0);
  });
}

TEST_CASE("an async failure arrives as the same cohort::error the blocking call throws") {
  std::latch done(1);
  cohort::run_loopback(2, [&](cohort::loopback_communicator& comm) {
    if (comm.rank() == 1) {
      done.wait();  // never calls
      return;
    }
    cohort::progress_thread progress(comm);
    std::vector<float> v(100, 1.0f);
    auto fut = cohort::async_all_reduce(progress, v, cohort::ops::sum, {.timeout = 100ms},
                                        asio::use_future);
    try {
      fut.get();
      FAIL("no error");
    } catch (const cohort::error& e) {
      CHECK(e.code() == cohort::errc::timed_out);
      CHECK(e.operation() == "all_reduce");
      CHECK(e.peer() == 1);
    }
    done.count_down();
  });
}

namespace {

// Five tensors of awkward sizes, gradient of rank r for tensor t element k = r + t + k%3.
std::vector<std::vector<float>> make_grads(int rank) {
  std::vector<std::vector<float>> g;
  for (std::size_t t = 0, sizes[] = {7, 1000, 3, 40'000, 129}; t < 5; ++t) {
    g.emplace_back(sizes[t]);
    for (std::size_t k = 0; k < sizes[t]; ++k) g[t][k] = float(rank + t + k % 3);
  }
  return g;
}

std::vector<std::span<float>> spans(std::vector<std::vector<float>>& g) {
  return {g.begin(), g.end()};
}

}  // namespace

TEST_CASE("gradient buckets reduce each bucket when its last gradient is ready") {
  cohort::run_loopback(3, [](cohort::loopback_communicator& comm) {
    cohort::progress_thread progress(comm);
    auto g = make_grads(comm.rank());
    cohort::gradient_buckets buckets(progress, spans(g), {.bucket_bytes = 4000});
    // Filled from the back until each holds 4000 bytes: {129, 40000} {3, 1000} {7}.
    CHECK(buckets.bucket_count() == 3);
    for (std::size_t t = 5; t-- > 0;) buckets.ready(t);  // back-propagation order
    CHECK(buckets.finish());
    for (std::size_t t = 0; t < 5; ++t)
      for (std::size_t k = 0; k < g[t].size(); k += 97)
        CHECK(g[t][k] == float(1 + t + k % 3));  // mean of ranks 0, 1, 2
    CHECK(buckets.bytes_reduced() == (7 + 1000 + 3 + 40'000 + 129) * sizeof(float));
  });
}

TEST_CASE("gradient accumulation reduces every k-th micro-batch, scaled by 1/k") {
  cohort::run_loopback(2, [](cohort::loopback_communicator& comm) {
    cohort::progress_thread progress(comm);
    auto g = make_grads(comm.rank());
    cohort::gradient_buckets buckets(progress, spans(g), {.accumulate = 2});
    CHECK(buckets.bucket_count() == 1);
    for (std::size_t t = 5; t-- > 0;) buckets.ready(t);
    CHECK_FALSE(buckets.finish());  // micro-batch 1: nothing sent
    CHECK(g[1][0] == float(comm.rank() + 1));
    for (auto& t : g)
      for (float& x : t) x *= 2;  // the second micro-batch adds the same gradient again
    for (std::size_t t = 5; t-- > 0;) buckets.ready(t);
    CHECK(buckets.finish());
    CHECK(g[1][0] == 1.5f);  // mean over ranks {1, 2}, two micro-batches each, divided by 2
  });
}

TEST_CASE("a custom bucket reduction (e.g. a compressor) replaces the default") {
  cohort::run_loopback(2, [](cohort::loopback_communicator& comm) {
    cohort::progress_thread progress(comm);
    auto g = make_grads(comm.rank());
    std::atomic<int> calls{0};
    cohort::bucket_options<cohort::loopback_communicator> opts;
    opts.reduce = [&](cohort::loopback_communicator& c, std::span<float> b) {
      ++calls;
      cohort::all_reduce(c, b, cohort::ops::max);
    };
    cohort::gradient_buckets buckets(progress, spans(g), opts);
    for (std::size_t t = 5; t-- > 0;) buckets.ready(t);
    CHECK(buckets.finish());
    CHECK(calls == 1);
    CHECK(g[4][0] == 5.0f);  // max over ranks 0 and 1 of r + 4
  });
}

TEST_CASE("gradient buckets refuse bad arguments with cohort::error naming the call") {
  cohort::run_loopback(1, [](cohort::loopback_communicator& comm) {
    cohort::progress_thread progress(comm);
    auto g = make_grads(0);
    const auto invalid_in = [](const std::string& operation, auto fn) {
      try {
        fn();
      } catch (const cohort::error& e) {
        INFO(e.what());
        CHECK(std::string(e.what()).rfind(operation + ": ", 0) == 0);
        return e.code() == cohort::errc::invalid_argument && e.operation() == operation;
      }
      return false;
    };
    CHECK(invalid_in("gradient_buckets", [&] {
      cohort::gradient_buckets bad(progress, spans(g), {.accumulate = 0});
    }));
    cohort::gradient_buckets buckets(progress, spans(g), {.bucket_bytes = 4000});
    CHECK(invalid_in("gradient_buckets::ready", [&] { buckets.ready(5); }));
    buckets.ready(4);
    buckets.ready(3);  // the bucket {129, 40000} starts; {3, 1000} and {7} never do
    CHECK(invalid_in("gradient_buckets::finish", [&] { buckets.finish(); }));
  });
}

TEST_CASE("local SGD averages parameters every H steps") {
  cohort::run_loopback(4, [](cohort::loopback_communicator& comm) {
    cohort::local_sgd<cohort::loopback_communicator> sgd(3);
    std::vector<float> params(1000, float(comm.rank()));
    CHECK_FALSE(sgd.after_step(comm, params));
    CHECK_FALSE(sgd.after_step(comm, params));
    CHECK(params[0] == float(comm.rank()));
    CHECK(sgd.after_step(comm, params));
    CHECK(params[999] == 1.5f);
  });
}
