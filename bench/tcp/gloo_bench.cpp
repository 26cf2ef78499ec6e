// Gloo's ring all_reduce over its TCP transport, timed like `tcp_bench all_reduce`, for the
// comparison in bench/results/tcp.md. Not a test: built only when libgloo-dev is installed.
//
// usage: RANK=r WORLD_SIZE=p GLOO_STORE_DIR=dir gloo_bench SIZE... [--budget-ms MS]
#include <gloo/allreduce.h>
#include <gloo/barrier.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/transport/tcp/device.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "../collectives/measure.hpp"

namespace {

// cohort-bench's timing method over a Gloo context.
struct gloo_group {
  std::shared_ptr<gloo::Context> context;
  int rank() const { return context->rank; }
  int size() const { return context->size; }
  void barrier() {
    gloo::BarrierOptions b(context);
    gloo::barrier(b);
  }
  void max_over_ranks(std::span<double> v) {
    gloo::AllreduceOptions o(context);
    o.setOutput(v.data(), v.size());
    o.setReduceFunction(
        static_cast<void (*)(void*, const void*, const void*, size_t)>(&gloo::max<double>));
    gloo::allreduce(o);
  }
};

}  // namespace

int main(int argc, char** argv) {
  const int rank = std::atoi(std::getenv("RANK"));
  const int size = std::atoi(std::getenv("WORLD_SIZE"));
  const char* dir = std::getenv("GLOO_STORE_DIR");
  double budget_ms = 100;
  std::vector<std::size_t> sizes;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--budget-ms") == 0 && i + 1 < argc)
      budget_ms = std::atof(argv[++i]);
    else
      sizes.push_back(std::strtoull(argv[i], nullptr, 10));
  }
  gloo::transport::tcp::attr attr;
  attr.hostname = "127.0.0.1";
  auto device = gloo::transport::tcp::CreateDevice(attr);
  gloo::rendezvous::FileStore store(dir);
  auto context = std::make_shared<gloo::rendezvous::Context>(rank, size);
  context->connectFullMesh(store, device);
  gloo_group g{context};
  cohort::bench::timing t;
  t.budget_ms = budget_ms;
  for (std::size_t bytes : sizes) {
    const std::size_t n = std::max<std::size_t>(1, bytes / sizeof(float));
    std::vector<float> x(n, 1.0f);
    auto run = [&] {
      gloo::AllreduceOptions opts(context);
      opts.setOutput(x.data(), n);
      opts.setReduceFunction(
          static_cast<void (*)(void*, const void*, const void*, size_t)>(&gloo::sum<float>));
      opts.setAlgorithm(gloo::AllreduceOptions::Algorithm::RING);
      gloo::allreduce(opts);
    };
    const auto s = cohort::bench::time_iterations(g, run, t);
    const double busbw =
        double(n * sizeof(float)) / (s.p50_us * 1e-6) * 2.0 * (size - 1) / size / 1e9;
    if (rank == 0)
      std::printf(
          "gloo all_reduce P=%d bytes=%zu iters=%zu p50_us=%.2f p99_us=%.2f busbw_GBps=%.3f\n",
          size, n * sizeof(float), s.iters, s.p50_us, s.p99_us, busbw);
  }
  return 0;
}
