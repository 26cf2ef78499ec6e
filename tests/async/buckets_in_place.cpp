// How the progress thread sets up its transport (progress_options), and gradient buckets that
// reduce adjacent tensors in place instead of packing them into a copy.
#include "../support.hpp"

#include <chrono>
#include <cstddef>
#include <mutex>
#include <span>
#include <vector>

#include <cohort/async.hpp>
#include <cohort/cohort.hpp>

using namespace std::chrono_literals;

namespace {

// The in-process transport with a `set_spin` that records what it was given.
struct spin_recording_transport : cohort::loopback_transport {
  using cohort::loopback_transport::loopback_transport;
  std::chrono::nanoseconds spin{-1};
  void set_spin(std::chrono::nanoseconds d) noexcept { spin = d; }
};

using recording_communicator = cohort::basic_communicator<spin_recording_transport>;

static_assert(cohort::detail::spin_settable<recording_communicator>);
static_assert(!cohort::detail::spin_settable<cohort::loopback_communicator>);

recording_communicator solo() {
  return recording_communicator(
      spin_recording_transport(std::make_shared<cohort::loopback_world>(1), 0));
}

// Three "layers" in one flat buffer, as a model keeps its gradients: 300, 5 and 1000 floats.
struct flat_model {
  std::vector<float> grads;
  std::vector<std::span<float>> layers;
  explicit flat_model(float value) : grads(1305, value) {
    layers = {{grads.data(), 300}, {grads.data() + 300, 5}, {grads.data() + 305, 1000}};
  }
};

}  // namespace

TEST_CASE("the progress thread sets the spin of a transport that has set_spin") {
  {
    auto comm = solo();
    cohort::progress_thread progress(comm);  // default: waits block at once
    CHECK(comm.transport().spin == 0ns);
  }
  {
    auto comm = solo();
    cohort::progress_thread progress(comm, {.spin = 20us});
    CHECK(comm.transport().spin == 20us);
  }
  {
    auto comm = solo();
    cohort::progress_thread progress(comm, {.spin = std::nullopt});  // left as it is
    CHECK(comm.transport().spin == -1ns);
  }
}

TEST_CASE("a transport without set_spin is left alone and still runs collectives") {
  cohort::run_loopback(2, [](cohort::loopback_communicator& comm) {
    cohort::progress_thread progress(comm, {.spin = 0ns});
    std::vector<float> v(10, float(comm.rank()));
    cohort::async_all_reduce(progress, v, cohort::ops::sum, boost::asio::use_future).get();
    CHECK(v[9] == 1.0f);
  });
}

TEST_CASE("buckets of tensors that lie end to end are reduced in place") {
  cohort::run_loopback(3, [](cohort::loopback_communicator& comm) {
    cohort::progress_thread progress(comm);
    flat_model m(float(comm.rank() + 1));
    std::mutex mu;
    std::vector<const float*> reduced;
    cohort::bucket_options<cohort::loopback_communicator> opts;
    opts.bucket_bytes = 4000;  // {1000} {5, 300}
    opts.reduce = [&](cohort::loopback_communicator& c, std::span<float> b) {
      {
        std::lock_guard lk(mu);
        reduced.push_back(b.data());
      }
      cohort::all_reduce(c, b, cohort::ops::avg);
    };
    cohort::gradient_buckets buckets(progress, m.layers, opts);
    REQUIRE(buckets.bucket_count() == 2);
    for (std::size_t t = 3; t-- > 0;) buckets.ready(t);
    CHECK(buckets.finish());
    CHECK(reduced == std::vector<const float*>{m.grads.data() + 305, m.grads.data()});
    for (float g : m.grads) CHECK(g == 2.0f);  // mean of 1, 2, 3
  });
}

TEST_CASE("in-place buckets scale accumulated gradients by 1/k") {
  cohort::run_loopback(2, [](cohort::loopback_communicator& comm) {
    cohort::progress_thread progress(comm);
    flat_model m(float(comm.rank() + 1));
    cohort::bucket_options<cohort::loopback_communicator> opts;
    opts.accumulate = 2;
    cohort::gradient_buckets buckets(progress, m.layers, opts);
    for (std::size_t t = 3; t-- > 0;) buckets.ready(t);
    CHECK_FALSE(buckets.finish());
    for (float& g : m.grads) g *= 2;  // the second micro-batch adds the same gradient again
    for (std::size_t t = 3; t-- > 0;) buckets.ready(t);
    CHECK(buckets.finish());
    CHECK(m.grads.front() == 1.5f);
    CHECK(m.grads.back() == 1.5f);
  });
}

TEST_CASE("tensors with a gap between them are packed, and unpacked after the reduction") {
  cohort::run_loopback(2, [](cohort::loopback_communicator& comm) {
    cohort::progress_thread progress(comm);
    std::vector<float> memory(40, float(comm.rank() + 1));
    std::vector<std::span<float>> grads = {{memory.data(), 10}, {memory.data() + 20, 10}};
    std::vector<const float*> reduced;
    cohort::bucket_options<cohort::loopback_communicator> opts;
    opts.reduce = [&](cohort::loopback_communicator& c, std::span<float> b) {
      reduced.push_back(b.data());  // one bucket: one call, on the progress thread
      cohort::all_reduce(c, b, cohort::ops::avg);
    };
    cohort::gradient_buckets buckets(progress, grads, opts);
    buckets.ready(1);
    buckets.ready(0);
    CHECK(buckets.finish());
    REQUIRE(reduced.size() == 1);
    CHECK((reduced[0] < memory.data() || reduced[0] >= memory.data() + memory.size()));
    CHECK(memory[0] == 1.5f);
    CHECK(memory[10] == float(comm.rank() + 1));  // the gap is not touched
    CHECK(memory[29] == 1.5f);
  });
}
