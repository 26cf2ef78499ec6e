// The "cohort" process group: torch's collectives on cohort's communicators, every call run on
// the communicator's progress thread, in the order the calls were made.
#include "process_group.hpp"

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <random>
#include <span>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/ivalue.h>

#include <cohort/async/progress_thread.hpp>
#include <cohort/collectives/all_gather.hpp>
#include <cohort/collectives/all_reduce.hpp>
#include <cohort/collectives/barrier.hpp>
#include <cohort/collectives/broadcast.hpp>
#include <cohort/collectives/reduce.hpp>
#include <cohort/collectives/reduce_scatter.hpp>
#include <cohort/compress/all_reduce.hpp>
#include <cohort/compress/cast.hpp>
#include <cohort/compress/error_feedback.hpp>
#include <cohort/compress/quantize.hpp>
#include <cohort/compress/hierarchical.hpp>
#include <cohort/compress/top_k.hpp>
#include <cohort/hierarchical_tcp.hpp>
#include <cohort/split.hpp>
#include <cohort/transport/shm.hpp>
#include <cohort/transport/tcp.hpp>

#include "store_adapter.hpp"

namespace cohort_torch {
namespace {

using red = c10d::ReduceOp::RedOpType;

enum class kind { all_reduce, broadcast, all_gather, reduce_scatter, reduce, barrier, compressed };

// One collective call on raw buffers: what the progress thread runs.
struct call {
  kind what = kind::barrier;
  at::ScalarType dtype = at::kFloat;
  red op = red::SUM;
  int root = 0;
  void* in = nullptr;
  void* out = nullptr;
  std::size_t n = 0, out_n = 0;
  cohort::call_options opts;
  std::string codec;  // kind::compressed
  double ratio = 0;
  bool feedback = false;
  std::int64_t index = 0;
};

[[noreturn]] void unsupported(const std::string& what) {
  TORCH_CHECK(false, "cohort: ", what, " is not supported by cohort");
}

template <class T>
struct type_tag {
  using type = T;
};

template <class F>
void with_type(at::ScalarType t, F&& f) {
  switch (t) {
    case at::kFloat: return f(type_tag<float>{});
    case at::kDouble: return f(type_tag<double>{});
    case at::kHalf: return f(type_tag<cohort::fp16>{});
    case at::kBFloat16: return f(type_tag<cohort::bf16>{});
    case at::kInt: return f(type_tag<std::int32_t>{});
    case at::kLong: return f(type_tag<std::int64_t>{});
    case at::kChar: return f(type_tag<std::int8_t>{});
    case at::kByte: return f(type_tag<std::uint8_t>{});
    default: unsupported(std::string("the dtype ") + c10::toString(t));
  }
}

template <class T, class F>
void with_op(red op, F&& f) {
  switch (op) {
    case red::SUM: return f(cohort::ops::sum);
    case red::PRODUCT: return f(cohort::ops::prod);
    case red::MIN: return f(cohort::ops::min);
    case red::MAX: return f(cohort::ops::max);
    case red::AVG:
      if constexpr (cohort::reduction_for<cohort::ops::avg_t, T>) return f(cohort::ops::avg);
      unsupported("ReduceOp.AVG on integer tensors");
    default: unsupported("this ReduceOp (cohort has SUM, AVG, PRODUCT, MIN and MAX)");
  }
}

// Checks, on the caller's thread, what the progress thread would otherwise refuse later.
void check_op(red op, at::ScalarType t) {
  with_type(t, [&](auto tag) { with_op<typename decltype(tag)::type>(op, [](auto) {}); });
}

// The work of one call: completes (and its future, with the output tensors) on the progress
// thread once the collective and the copies after it are done.
class work final : public c10d::Work {
 public:
  work(int rank, c10d::OpType type, std::vector<at::Tensor> outputs)
      : c10d::Work(rank, type),
        outputs_(std::move(outputs)),
        future_(c10::make_intrusive<c10::ivalue::Future>(
            c10::ListType::create(c10::TensorType::get()))) {}

  void complete(std::exception_ptr e) {
    finish(e);
    if (e)
      future_->setError(e);
    else
      future_->markCompleted(c10::IValue(outputs_));
  }

  std::vector<at::Tensor> result() override { return outputs_; }
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return future_; }

 private:
  std::vector<at::Tensor> outputs_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
};

// cohort::error and the rest reach Python as RuntimeError with their message.
std::exception_ptr translate(std::exception_ptr e) {
  if (!e) return e;
  try {
    std::rethrow_exception(e);
  } catch (const std::exception& x) {
    return std::make_exception_ptr(std::runtime_error(x.what()));
  } catch (...) {
    return std::make_exception_ptr(std::runtime_error("cohort: unknown failure"));
  }
}

class engine {
 public:
  virtual ~engine() = default;
  virtual void start(call c, std::function<void()> after, c10::intrusive_ptr<work> w) = 0;
  virtual const char* transport() const = 0;
};

template <class Comm>
class engine_impl final : public engine {
 public:
  template <class... Args>
  engine_impl(const char* name, std::chrono::milliseconds timeout, Args&&... args)
      : name_(name), comm_(std::in_place, std::forward<Args>(args)...) {
    comm_.set_timeout(timeout);
    progress_.emplace(comm_);
  }
  engine_impl(const char* name, std::chrono::milliseconds timeout, Comm&& comm)
      : name_(name), comm_(std::move(comm)) {
    comm_.set_timeout(timeout);
    progress_.emplace(comm_);
  }

  ~engine_impl() override { progress_.reset(); }

  void start(call c, std::function<void()> after, c10::intrusive_ptr<work> w) override {
    progress_->start([this, c = std::move(c)](Comm& comm) { run(comm, c); },
                     [w = std::move(w), after = std::move(after)](std::exception_ptr e) {
                       if (!e && after) {
                         try {
                           after();
                         } catch (...) {
                           e = std::current_exception();
                         }
                       }
                       w->complete(translate(e));
                     });
  }

  const char* transport() const override { return name_; }

 private:
  using top_k_feedback = cohort::compress::error_feedback<cohort::compress::top_k_codec<float>>;

  void run(Comm& comm, const call& c) {
    if (c.what == kind::barrier) return cohort::barrier(comm, c.opts);
    if (c.what == kind::compressed) return compressed(comm, c);
    with_type(c.dtype, [&](auto tag) {
      using T = typename decltype(tag)::type;
      std::span<T> in(static_cast<T*>(c.in), c.n), out(static_cast<T*>(c.out), c.out_n);
      switch (c.what) {
        case kind::broadcast: return cohort::broadcast(comm, out, c.root, c.opts);
        case kind::all_gather: return cohort::all_gather(comm, in, out, c.opts);
        default: break;
      }
      with_op<T>(c.op, [&](auto op) {
        switch (c.what) {
          case kind::all_reduce: return cohort::all_reduce(comm, in, out, op, c.opts);
          case kind::reduce_scatter: return cohort::reduce_scatter(comm, in, out, op, c.opts);
          case kind::reduce: return cohort::reduce(comm, in, out, op, c.root, c.opts);
          default: break;
        }
      });
    });
  }

  void compressed(Comm& comm, const call& c) {
    std::span<float> data(static_cast<float*>(c.out), c.n);
    namespace cc = cohort::compress;
    if (c.codec == "fp16") {
      cohort::compressed_all_reduce(comm, data, cc::fp16, cohort::ops::avg, c.opts);
    } else if (c.codec == "bf16") {
      cohort::compressed_all_reduce(comm, data, cc::bf16, cohort::ops::avg, c.opts);
    } else if (c.codec == "int8") {
      cohort::compressed_all_reduce(comm, data, cc::int8, cohort::ops::avg, c.opts);
    } else if (!c.feedback) {
      cohort::compressed_all_reduce(comm, data, cc::top_k(c.ratio), cohort::ops::avg, c.opts);
    } else {
      // One residual per bucket; DDP rebuilds its buckets once, so a bucket whose size or
      // ratio changed starts a new residual.
      auto& slot = feedback_[c.index];
      if (!slot || !slot->fits(c.n) || slot->inner().ratio != c.ratio)
        slot = std::make_unique<top_k_feedback>(cc::top_k(c.ratio));
      cohort::compressed_all_reduce(comm, data, *slot, cohort::ops::avg, c.opts);
    }
  }

  const char* name_;
  Comm comm_;
  std::optional<cohort::progress_thread<Comm>> progress_;
  std::map<std::int64_t, std::unique_ptr<top_k_feedback>> feedback_;  // progress thread only
};

cohort::call_options options_of(std::chrono::milliseconds t) {
  return {.timeout = t.count() > 0 ? t : std::chrono::milliseconds(0)};
}

void check_tensor(const at::Tensor& t, const char* what) {
  TORCH_CHECK(t.defined(), "cohort: ", what, ": undefined tensor");
  TORCH_CHECK(t.device().is_cpu(), "cohort: ", what, ": CPU tensors only, not ", t.device());
  with_type(t.scalar_type(), [](auto) {});
}

const at::Tensor& one(const std::vector<at::Tensor>& ts, const char* what) {
  TORCH_CHECK(ts.size() == 1, "cohort: ", what, " takes one tensor per rank, not ", ts.size());
  check_tensor(ts[0], what);
  return ts[0];
}

std::size_t count(const at::Tensor& t) { return static_cast<std::size_t>(t.numel()); }

// Copies `src` (contiguous) into `dst`, whatever dst's strides.
void copy_into(at::Tensor dst, const at::Tensor& src) {
  if (!dst.is_same(src)) dst.copy_(src.view(dst.sizes()));
}

class process_group final : public c10d::ProcessGroup {
 public:
  process_group(int rank, int size, std::unique_ptr<engine> e)
      : c10d::ProcessGroup(rank, size), engine_(std::move(e)) {
    init();
  }

  ~process_group() override { engine_.reset(); }

  const std::string getBackendName() const override { return "cohort"; }
  const char* transport() const { return engine_->transport(); }

  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& opts) override {
    const at::Tensor& t = one(tensors, "allreduce");
    check_op(opts.reduceOp, t.scalar_type());
    at::Tensor buf = t.contiguous();
    call c{.what = kind::all_reduce, .dtype = t.scalar_type(), .op = opts.reduceOp,
           .in = buf.data_ptr(), .out = buf.data_ptr(), .n = count(buf), .out_n = count(buf),
           .opts = options_of(opts.timeout)};
    return enqueue(c10d::OpType::ALLREDUCE, {t}, std::move(c), [t, buf] { copy_into(t, buf); });
  }

  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(
      std::vector<at::Tensor>& tensors, const c10d::AllreduceCoalescedOptions& opts) override {
    TORCH_CHECK(!tensors.empty(), "cohort: allreduce_coalesced: no tensors");
    std::vector<at::Tensor> flat;
    for (auto& t : tensors) {
      check_tensor(t, "allreduce_coalesced");
      TORCH_CHECK(t.scalar_type() == tensors[0].scalar_type(),
                  "cohort: allreduce_coalesced: tensors of one dtype only");
      flat.push_back(t.reshape(-1));
    }
    check_op(opts.reduceOp, tensors[0].scalar_type());
    at::Tensor buf = at::cat(flat);
    call c{.what = kind::all_reduce, .dtype = buf.scalar_type(), .op = opts.reduceOp,
           .in = buf.data_ptr(), .out = buf.data_ptr(), .n = count(buf), .out_n = count(buf),
           .opts = options_of(opts.timeout)};
    return enqueue(c10d::OpType::ALLREDUCE_COALESCED, tensors, std::move(c),
                   [ts = tensors, buf] {
                     std::int64_t at = 0;
                     for (auto t : ts) {
                       t.copy_(buf.narrow(0, at, t.numel()).view(t.sizes()));
                       at += t.numel();
                     }
                   });
  }

  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
                                           const c10d::BroadcastOptions& opts) override {
    const at::Tensor& t = one(tensors, "broadcast");
    check_root(opts.rootRank);
    at::Tensor buf = t.contiguous();
    call c{.what = kind::broadcast, .dtype = t.scalar_type(), .root = int(opts.rootRank),
           .in = buf.data_ptr(), .out = buf.data_ptr(), .n = count(buf), .out_n = count(buf),
           .opts = options_of(opts.timeout)};
    return enqueue(c10d::OpType::BROADCAST, {t}, std::move(c), [t, buf] { copy_into(t, buf); });
  }

  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>& tensors,
                                        const c10d::ReduceOptions& opts) override {
    const at::Tensor& t = one(tensors, "reduce");
    check_root(opts.rootRank);
    check_op(opts.reduceOp, t.scalar_type());
    at::Tensor buf = t.contiguous();
    const bool root = opts.rootRank == getRank();
    call c{.what = kind::reduce, .dtype = t.scalar_type(), .op = opts.reduceOp,
           .root = int(opts.rootRank), .in = buf.data_ptr(), .out = buf.data_ptr(),
           .n = count(buf), .out_n = count(buf), .opts = options_of(opts.timeout)};
    return enqueue(c10d::OpType::REDUCE, {t}, std::move(c), [t, buf, root] {
      if (root) copy_into(t, buf);
    });
  }

  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                           std::vector<at::Tensor>& inputs,
                                           const c10d::AllgatherOptions& opts) override {
    const at::Tensor& in = one(inputs, "allgather");
    TORCH_CHECK(outputs.size() == 1 && int(outputs[0].size()) == getSize(),
                "cohort: allgather needs one list of ", getSize(), " output tensors");
    check_like(outputs[0], in, "allgather");
    at::Tensor src = in.contiguous();
    at::Tensor buf = at::empty({std::int64_t(getSize()) * in.numel()}, in.options());
    call c{.what = kind::all_gather, .dtype = in.scalar_type(), .in = src.data_ptr(),
           .out = buf.data_ptr(), .n = count(src), .out_n = count(buf),
           .opts = options_of(opts.timeout)};
    auto outs = outputs[0];
    return enqueue(c10d::OpType::ALLGATHER, outs, std::move(c), [outs, src, buf] {
      const std::int64_t n = src.numel();
      for (std::size_t i = 0; i < outs.size(); ++i)
        copy_into(outs[i], buf.narrow(0, std::int64_t(i) * n, n));
    });
  }

  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& output, at::Tensor& input,
                                                 const c10d::AllgatherOptions& opts) override {
    check_tensor(input, "_allgather_base");
    check_tensor(output, "_allgather_base");
    TORCH_CHECK(output.scalar_type() == input.scalar_type() &&
                    output.numel() == getSize() * input.numel(),
                "cohort: _allgather_base: the output must hold ", getSize(),
                " times the input's elements, of its dtype");
    at::Tensor src = input.contiguous(), buf = output.contiguous();
    call c{.what = kind::all_gather, .dtype = input.scalar_type(), .in = src.data_ptr(),
           .out = buf.data_ptr(), .n = count(src), .out_n = count(buf),
           .opts = options_of(opts.timeout)};
    return enqueue(c10d::OpType::_ALLGATHER_BASE, {output}, std::move(c),
                   [output, src, buf] { copy_into(output, buf); });
  }

  c10::intrusive_ptr<c10d::Work> reduce_scatter(std::vector<at::Tensor>& outputs,
                                                std::vector<std::vector<at::Tensor>>& inputs,
                                                const c10d::ReduceScatterOptions& opts) override {
    const at::Tensor& out = one(outputs, "reduce_scatter");
    TORCH_CHECK(inputs.size() == 1 && int(inputs[0].size()) == getSize(),
                "cohort: reduce_scatter needs one list of ", getSize(), " input tensors");
    check_like(inputs[0], out, "reduce_scatter");
    check_op(opts.reduceOp, out.scalar_type());
    std::vector<at::Tensor> flat;
    for (auto& t : inputs[0]) flat.push_back(t.reshape(-1));
    return scatter_reduced(out, at::cat(flat), opts, c10d::OpType::REDUCE_SCATTER);
  }

  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(
      at::Tensor& output, at::Tensor& input, const c10d::ReduceScatterOptions& opts) override {
    check_tensor(input, "_reduce_scatter_base");
    check_tensor(output, "_reduce_scatter_base");
    TORCH_CHECK(output.scalar_type() == input.scalar_type() &&
                    input.numel() == getSize() * output.numel(),
                "cohort: _reduce_scatter_base: the input must hold ", getSize(),
                " times the output's elements, of its dtype");
    check_op(opts.reduceOp, output.scalar_type());
    return scatter_reduced(output, input.contiguous(), opts,
                           c10d::OpType::_REDUCE_SCATTER_BASE);
  }

  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& opts) override {
    call c{.what = kind::barrier, .opts = options_of(opts.timeout)};
    return enqueue(c10d::OpType::BARRIER, {}, std::move(c), {});
  }

  // gather: an all_gather whose result the root keeps (P-1 times the bytes of a tree gather,
  // built from cohort's collectives alone).
  c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>>& outputs,
                                        std::vector<at::Tensor>& inputs,
                                        const c10d::GatherOptions& opts) override {
    const at::Tensor& in = one(inputs, "gather");
    check_root(opts.rootRank);
    const bool root = opts.rootRank == getRank();
    std::vector<at::Tensor> outs;
    if (root) {
      TORCH_CHECK(outputs.size() == 1 && int(outputs[0].size()) == getSize(),
                  "cohort: gather needs one list of ", getSize(), " output tensors on the root");
      check_like(outputs[0], in, "gather");
      outs = outputs[0];
    }
    at::Tensor src = in.contiguous();
    at::Tensor buf = at::empty({std::int64_t(getSize()) * in.numel()}, in.options());
    call c{.what = kind::all_gather, .dtype = in.scalar_type(), .in = src.data_ptr(),
           .out = buf.data_ptr(), .n = count(src), .out_n = count(buf),
           .opts = options_of(opts.timeout)};
    return enqueue(c10d::OpType::GATHER, outs, std::move(c), [outs, src, buf] {
      const std::int64_t n = src.numel();
      for (std::size_t i = 0; i < outs.size(); ++i)
        copy_into(outs[i], buf.narrow(0, std::int64_t(i) * n, n));
    });
  }

  // scatter: a broadcast of the root's P tensors, of which each rank keeps its own.
  c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor>& outputs,
                                         std::vector<std::vector<at::Tensor>>& inputs,
                                         const c10d::ScatterOptions& opts) override {
    const at::Tensor& out = one(outputs, "scatter");
    check_root(opts.rootRank);
    at::Tensor buf;
    if (opts.rootRank == getRank()) {
      TORCH_CHECK(inputs.size() == 1 && int(inputs[0].size()) == getSize(),
                  "cohort: scatter needs one list of ", getSize(), " input tensors on the root");
      check_like(inputs[0], out, "scatter");
      std::vector<at::Tensor> flat;
      for (auto& t : inputs[0]) flat.push_back(t.reshape(-1));
      buf = at::cat(flat);
    } else {
      buf = at::empty({std::int64_t(getSize()) * out.numel()}, out.options());
    }
    call c{.what = kind::broadcast, .dtype = out.scalar_type(), .root = int(opts.rootRank),
           .in = buf.data_ptr(), .out = buf.data_ptr(), .n = count(buf), .out_n = count(buf),
           .opts = options_of(opts.timeout)};
    const std::int64_t r = getRank();
    return enqueue(c10d::OpType::SCATTER, {out}, std::move(c), [out, buf, r] {
      copy_into(out, buf.narrow(0, r * out.numel(), out.numel()));
    });
  }

  // alltoall with equal splits: an all_gather of every rank's whole input, of which each rank
  // keeps its block from each (P times the bytes of a pairwise exchange).
  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor& output, at::Tensor& input,
                                               std::vector<std::int64_t>& output_splits,
                                               std::vector<std::int64_t>& input_splits,
                                               const c10d::AllToAllOptions& opts) override {
    check_tensor(input, "alltoall_base");
    check_tensor(output, "alltoall_base");
    if (!output_splits.empty() || !input_splits.empty())
      unsupported("alltoall with uneven splits");
    TORCH_CHECK(input.numel() == output.numel() && input.numel() % getSize() == 0 &&
                    input.scalar_type() == output.scalar_type(),
                "cohort: alltoall_base: input and output of one dtype and size, a multiple of ",
                getSize());
    const std::int64_t p = getSize(), m = input.numel() / p, r = getRank();
    at::Tensor src = input.contiguous();
    at::Tensor buf = at::empty({p * p * m}, input.options());
    call c{.what = kind::all_gather, .dtype = input.scalar_type(), .in = src.data_ptr(),
           .out = buf.data_ptr(), .n = count(src), .out_n = count(buf),
           .opts = options_of(opts.timeout)};
    return enqueue(c10d::OpType::ALLTOALL_BASE, {output}, std::move(c),
                   [output, src, buf, p, m, r] {
                     at::Tensor mine = buf.view({p, p, m}).select(1, r).reshape(-1);
                     copy_into(output, mine);
                   });
  }

  c10::intrusive_ptr<c10d::Work> alltoall(std::vector<at::Tensor>& outputs,
                                          std::vector<at::Tensor>& inputs,
                                          const c10d::AllToAllOptions& opts) override {
    TORCH_CHECK(int(inputs.size()) == getSize() && int(outputs.size()) == getSize(),
                "cohort: alltoall needs ", getSize(), " input and output tensors");
    check_like(inputs, outputs[0], "alltoall");
    check_like(outputs, inputs[0], "alltoall");
    std::vector<at::Tensor> flat;
    for (auto& t : inputs) flat.push_back(t.reshape(-1));
    at::Tensor src = at::cat(flat);
    const std::int64_t p = getSize(), m = inputs[0].numel(), r = getRank();
    at::Tensor buf = at::empty({p * p * m}, src.options());
    call c{.what = kind::all_gather, .dtype = src.scalar_type(), .in = src.data_ptr(),
           .out = buf.data_ptr(), .n = count(src), .out_n = count(buf),
           .opts = options_of(opts.timeout)};
    return enqueue(c10d::OpType::ALLTOALL, outputs, std::move(c),
                   [outputs, src, buf, p, m, r] {
                     at::Tensor v = buf.view({p, p, m});
                     for (std::int64_t q = 0; q < p; ++q) copy_into(outputs[q], v[q][r]);
                   });
  }

  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>&, int, int) override {
    unsupported("send (point-to-point; cohort has collectives only)");
  }
  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>&, int, int) override {
    unsupported("recv (point-to-point; cohort has collectives only)");
  }
  c10::intrusive_ptr<c10d::Work> recvAnysource(std::vector<at::Tensor>&, int) override {
    unsupported("recv from any source (point-to-point; cohort has collectives only)");
  }

  c10::intrusive_ptr<c10d::Work> compressed(at::Tensor bucket, const std::string& codec,
                                            double ratio, bool feedback, std::int64_t index) {
    check_tensor(bucket, "compressed allreduce");
    TORCH_CHECK(bucket.scalar_type() == at::kFloat && bucket.is_contiguous(),
                "cohort: compressed allreduce: a contiguous float32 tensor, not ",
                bucket.scalar_type());
    TORCH_CHECK(codec == "fp16" || codec == "bf16" || codec == "int8" || codec == "top_k",
                "cohort: no codec \"", codec, "\" (fp16, bf16, int8, top_k)");
    TORCH_CHECK(codec != "top_k" || (ratio > 0 && ratio <= 1),
                "cohort: top_k: the ratio must be in (0, 1], not ", ratio);
    call c{.what = kind::compressed, .dtype = at::kFloat, .in = bucket.data_ptr(),
           .out = bucket.data_ptr(), .n = count(bucket), .out_n = count(bucket),
           .codec = codec, .ratio = ratio, .feedback = feedback, .index = index};
    return enqueue(c10d::OpType::ALLREDUCE, {bucket}, std::move(c), [bucket] {});
  }

 private:
  c10::intrusive_ptr<c10d::Work> scatter_reduced(const at::Tensor& output, at::Tensor in,
                                                 const c10d::ReduceScatterOptions& opts,
                                                 c10d::OpType type) {
    at::Tensor buf = output.contiguous();
    call c{.what = kind::reduce_scatter, .dtype = output.scalar_type(), .op = opts.reduceOp,
           .in = in.data_ptr(), .out = buf.data_ptr(), .n = count(in), .out_n = count(buf),
           .opts = options_of(opts.timeout)};
    return enqueue(type, {output}, std::move(c),
                   [output, in, buf] { copy_into(output, buf); });
  }

  void check_root(std::int64_t root) const {
    TORCH_CHECK(root >= 0 && root < getSize(), "cohort: root ", root, " is not a rank of ",
                getSize());
  }

  static void check_like(const std::vector<at::Tensor>& ts, const at::Tensor& like,
                         const char* what) {
    for (auto& t : ts) {
      check_tensor(t, what);
      TORCH_CHECK(t.scalar_type() == like.scalar_type() && t.numel() == like.numel(), "cohort: ",
                  what, ": every tensor must have the dtype and element count of the others");
    }
  }

  c10::intrusive_ptr<c10d::Work> enqueue(c10d::OpType type, std::vector<at::Tensor> outputs,
                                         call c, std::function<void()> after) {
    auto w = c10::make_intrusive<work>(getRank(), type, std::move(outputs));
    engine_->start(std::move(c), std::move(after), w);
    return w;
  }

  std::unique_ptr<engine> engine_;
};

std::string random_id() {
  std::random_device rd;
  char s[17];
  std::snprintf(s, sizeof s, "%08x%08x", rd(), rd());
  return s;
}

int env_int(const char* name, int fallback) {
  const char* v = std::getenv(name);
  return v && *v ? std::atoi(v) : fallback;
}

}  // namespace

c10::intrusive_ptr<c10d::ProcessGroup> create_process_group(
    const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
    std::chrono::milliseconds timeout) {
  TORCH_CHECK(timeout.count() > 0, "cohort: the timeout must be positive");
  torch_store s(store);
  const cohort::deadline until = cohort::clock::now() + timeout;
  std::string mode = std::getenv("COHORT_TRANSPORT") ? std::getenv("COHORT_TRANSPORT") : "";
  TORCH_CHECK(mode.empty() || mode == "shm" || mode == "tcp" || mode == "hier",
              "cohort: COHORT_TRANSPORT is \"", mode, "\", not shm, tcp or hier");
  // Which ranks share this host: each publishes its host id (hostname and boot id, or
  // COHORT_HOST where it is set).
  const std::string host = std::to_string(cohort::detail::host_id());
  s.set("cohort/host/" + std::to_string(rank), host);
  std::error_code ec;
  auto missing = cohort::wait_for_ranks(s, "cohort/host/", size, until, ec);
  if (ec)
    throw cohort::error(ec, "init_process_group", missing.empty() ? -1 : missing.front(),
                        "cohort: init_process_group: " +
                            (missing.empty() ? s.last_error()
                                             : cohort::describe_ranks(missing) + " never arrived"));
  int local_rank = 0, local_size = 0;
  std::vector<std::string> hosts(static_cast<std::size_t>(size));
  for (int q = 0; q < size; ++q) {
    hosts[static_cast<std::size_t>(q)] = s.get("cohort/host/" + std::to_string(q), until);
    if (hosts[static_cast<std::size_t>(q)] == host) {
      local_size++;
      if (q < rank) local_rank++;
    }
  }
  // The hierarchical communicator keeps torch's ranks where they are host-major (each host's
  // ranks consecutive, as torchrun and srun number them) with as many ranks on every host.
  const bool host_major = [&] {
    if (local_size <= 0 || size % local_size != 0) return false;
    for (int q = 0; q < size; ++q)
      if (hosts[static_cast<std::size_t>(q)] !=
          hosts[static_cast<std::size_t>(q / local_size * local_size)])
        return false;
    for (int h = 0; h + 1 < size / local_size; ++h)
      if (hosts[static_cast<std::size_t>(h * local_size)] ==
          hosts[static_cast<std::size_t>((h + 1) * local_size)])
        return false;
    return true;
  }();
  TORCH_CHECK(mode != "hier" || host_major,
              "cohort: COHORT_TRANSPORT=hier needs the same number of ranks on every host, each "
              "host's ranks numbered consecutively (as torchrun and srun number them)");
  // One job id per group: shared-memory segment names and TCP handshakes tell jobs apart.
  std::string job;
  if (rank == 0) {
    job = "torch-" + std::to_string(::getpid()) + "-" + random_id();
    s.set("cohort/job", job);
  } else {
    job = s.get("cohort/job", until);
  }
  const bool shm = mode == "shm" || (mode.empty() && local_size == size);
  const bool hier = mode == "hier" || (mode.empty() && local_size > 1 && local_size < size &&
                                       host_major);
  std::unique_ptr<engine> e;
  if (shm) {
    cohort::shm_options o;
    o.connect_timeout = timeout;
    e = std::make_unique<engine_impl<cohort::shm_communicator>>("shm", timeout, job, rank, size,
                                                                 o);
  } else {
    cohort::launch_info info;
    info.rank = rank;
    info.size = size;
    info.local_rank = local_rank;
    info.local_size = local_size;
    if (const char* a = std::getenv("MASTER_ADDR")) info.master_addr = a;
    info.master_port = env_int("MASTER_PORT", 0);
    info.job_id = job;
    cohort::tcp_options o;
    o.connect_timeout = timeout;
    if (hier) {
      // Shared memory inside each host, one TCP rail per local rank between hosts.
      cohort::shm_options so;
      so.connect_timeout = timeout;
      auto world = cohort::make_tcp_communicator(info, s, o);
      world.set_timeout(timeout);
      auto h = cohort::make_hierarchical_communicator(world, s, o, so,
                                                    {.base = job, .timeout = timeout});
      TORCH_CHECK(h.rank() == rank, "cohort: the hierarchical communicator numbered rank ", rank,
                  " as ", h.rank());
      e = std::make_unique<engine_impl<cohort::hierarchical_tcp_communicator>>("hier", timeout,
                                                                               std::move(h));
    } else {
      e = std::make_unique<engine_impl<cohort::tcp_communicator>>("tcp", timeout, info, s, o);
    }
  }
  return c10::make_intrusive<process_group>(rank, size, std::move(e));
}

c10::intrusive_ptr<c10d::Work> compressed_allreduce(
    const c10::intrusive_ptr<c10d::ProcessGroup>& pg, at::Tensor bucket, const std::string& codec,
    double ratio, bool error_feedback, std::int64_t index) {
  auto* g = dynamic_cast<process_group*>(pg.get());
  TORCH_CHECK(g, "cohort: the hook needs a process group of the cohort backend, not ",
              pg->getBackendName());
  return g->compressed(std::move(bucket), codec, ratio, error_feedback, index);
}

std::string transport_name(const c10::intrusive_ptr<c10d::ProcessGroup>& pg) {
  auto* g = dynamic_cast<process_group*>(pg.get());
  TORCH_CHECK(g, "cohort: not a process group of the cohort backend");
  return g->transport();
}

}  // namespace cohort_torch
