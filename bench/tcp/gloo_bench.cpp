// Gloo's collectives over its TCP transport, with cohort-bench's options, measuring code, checks
// and output (bench/collectives/driver.hpp): the Gloo peer of bench/compare_peers.py and
// bench/tcp/compare_tcp.py. Not a test: built only when libgloo-dev is installed.
//
//   all_reduce      gloo::allreduce, ring algorithm, input and output apart
//   reduce_scatter  gloo::ReduceScatterHalvingDoubling (P a power of two), in place on a work
//                   buffer filled from the input once per size: the checked call sees the
//                   input, the timed calls reduce the previous result again (refreshing the
//                   input would add a copy to Gloo's time); this rank's block is copied out
//   all_gather      gloo::allgather
//   broadcast       gloo::broadcast, in place from --root
// f32 only, and sum for the reducing collectives.
//
// usage: RANK=r WORLD_SIZE=p GLOO_STORE_DIR=dir gloo_bench [cohort-bench options]
//   e.g. ... gloo_bench --op all_gather --sizes 4,1K,1M --format json
#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/reduce_scatter.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/transport/tcp/device.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "../collectives/driver.hpp"

namespace cohort::bench {
namespace {

constexpr const char* program = "gloo_bench";

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

// One call of `o.op` on Gloo; reduce_scatter keeps its algorithm (and buffers) per size.
class gloo_invoke {
 public:
  gloo_invoke(std::shared_ptr<gloo::Context> context, const options& o)
      : context_(std::move(context)), o_(o) {}

  void operator()(std::span<const float> in, std::span<float> out) {
    switch (o_.op) {
      case collective::all_reduce: {
        gloo::AllreduceOptions opts(context_);
        opts.setInput(const_cast<float*>(in.data()), in.size());
        opts.setOutput(out.data(), out.size());
        opts.setReduceFunction(
            static_cast<void (*)(void*, const void*, const void*, size_t)>(&gloo::sum<float>));
        opts.setAlgorithm(gloo::AllreduceOptions::Algorithm::RING);
        gloo::allreduce(opts);
        return;
      }
      case collective::reduce_scatter: {
        if (in.data() != rs_input_ || in.size() != work_.size()) {  // a new size
          rs_input_ = in.data();
          work_.assign(in.begin(), in.end());
          const std::vector<int> blocks(static_cast<std::size_t>(context_->size),
                                        static_cast<int>(out.size()));
          rs_ = std::make_unique<gloo::ReduceScatterHalvingDoubling<float>>(
              context_, std::vector<float*>{work_.data()}, static_cast<int>(work_.size()),
              blocks);
        }
        rs_->run();
        std::copy_n(work_.begin(), out.size(), out.begin());
        return;
      }
      case collective::all_gather: {
        gloo::AllgatherOptions opts(context_);
        opts.setInput(const_cast<float*>(in.data()), in.size());
        opts.setOutput(out.data(), out.size());
        gloo::allgather(opts);
        return;
      }
      case collective::broadcast: {
        gloo::BroadcastOptions opts(context_);
        opts.setOutput(out.data(), out.size());
        opts.setRoot(o_.root);
        gloo::broadcast(opts);
        return;
      }
    }
  }

 private:
  std::shared_ptr<gloo::Context> context_;
  const options& o_;
  const float* rs_input_ = nullptr;
  std::vector<float> work_;
  std::unique_ptr<gloo::ReduceScatterHalvingDoubling<float>> rs_;
};

int env_int(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr) throw usage_error(std::string(name) + " is not set (see the top of " +
                                      __FILE__ + ")");
  return std::atoi(v);
}

int run(const options& o) {
  const int rank = env_int("RANK");
  const int size = env_int("WORLD_SIZE");
  const char* dir = std::getenv("GLOO_STORE_DIR");
  if (dir == nullptr) throw usage_error("GLOO_STORE_DIR is not set");
  if (o.type != dtype::f32 || (reduces(o.op) && o.reduce != reduction::sum))
    throw usage_error("Gloo is measured with f32 (and sum) only");
  if (o.ranks > 0 && o.ranks != size)
    throw usage_error("--ranks " + std::to_string(o.ranks) + " but WORLD_SIZE is " +
                      std::to_string(size));
  if (o.root >= size) throw usage_error("--root " + std::to_string(o.root) + " is not a rank");
  if (o.op == collective::reduce_scatter && (size & (size - 1)) != 0)
    throw usage_error("reduce_scatter: Gloo's halving-doubling needs a power-of-two P");

  gloo::transport::tcp::attr attr;
  attr.hostname = "127.0.0.1";
  auto device = gloo::transport::tcp::CreateDevice(attr);
  gloo::rendezvous::FileStore store(dir);
  auto context = std::make_shared<gloo::rendezvous::Context>(rank, size);
  context->setTimeout(std::chrono::seconds(300));
  context->connectFullMesh(store, device);
  gloo_group g{context};

  run_info info{program, "gloo tcp", "env", size, describe_host(), {}};
  if (rank == 0) info.ceiling = measure_memcpy(o.sizes.back());
  g.barrier();
  std::optional<reporter> rep;
  if (rank == 0) rep.emplace(stdout, o, info);
  gloo_invoke invoke(context, o);
  const int failed = run_benchmark<float>(g, o, ops::sum, invoke, rep ? &*rep : nullptr);
  return failed > 0 ? 1 : 0;
}

}  // namespace
}  // namespace cohort::bench

int main(int argc, char** argv) {
  using namespace cohort::bench;
  try {
    const options o = parse_options(argc, argv, /*with_transport=*/false);
    if (o.help) {
      std::fputs(usage(program, /*with_transport=*/false).c_str(), stdout);
      return 0;
    }
    return run(o);
  } catch (const usage_error& e) {
    std::fprintf(stderr, "%s: %s (see %s --help)\n", program, e.what(), program);
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: %s\n", program, e.what());
    return 1;
  }
}
