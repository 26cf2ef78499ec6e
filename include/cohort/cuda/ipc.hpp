/// @file
/// CUDA IPC: collectives on device memory between the processes of one host, each rank's
/// kernel reading its peers' buffers in place through `cudaIpcOpenMemHandle`.
///
/// ```cpp
/// cohort::shm_communicator host(std::in_place, job, rank, size);   // any host communicator
/// cohort::cuda_ipc_communicator gpu(host);                         // every rank, collectively
/// cohort::all_reduce(gpu, grads, grads, n, cohort::ops::avg, stream);  // stream-ordered
/// ```
///
/// Not a transport: a communicator built over a host communicator, whose collectives
/// (all_gather, barrier) carry its control messages; so it sits over the collectives, beside
/// the device kernels it launches (cuda/reduce.hpp), and includes nothing of compress/.
///
/// **Data path.** A call's buffers come straight from the caller (they must be `cudaMalloc`
/// memory; `cohort::cuda::device_buffer` is). Each rank exports its input and output
/// allocations with `cudaIpcGetMemHandle` (once per allocation, cached) and its peers map them
/// with `cudaIpcOpenMemHandle` (once per allocation, cached, least recently used closed beyond
/// `max_mappings`). all_reduce is the "two-shot" schedule with both shots in one kernel: rank
/// r owns part r of the buffer (near-equal parts cut at 16 bytes); its kernel reads part r of
/// every rank's input, reduces in rank order 0..P-1 (fp32 accumulation for fp16/bf16, one
/// rounding) and writes the result into part r of every rank's output. No staging copy, one
/// kernel per rank per call, each input element read once and each output element written
/// once: the least memory traffic an all-reduce can have. On a single GPU shared by P
/// processes this bounds busbw at 2(P-1)/P^2 of the device's copy bandwidth, 50% at P=2 (see
/// bench/results/cuda.md).
///
/// **Ordering.** Everything is enqueued on the caller's stream; the host never waits for the
/// GPU. Two interprocess events per rank order the ranks' streams: `ready`, recorded where the
/// call starts (this rank's buffers may be read and written), and `done`, recorded after its
/// kernel (it no longer touches its peers' buffers). The host communicator carries the call
/// records (all_gather: the call, for the mismatch check, and the buffer handles) and a
/// barrier between the two records, so that a peer's event is always waited on after it was
/// recorded and before it is recorded again. When the stream passes the call, `out` holds the
/// result on every rank and every buffer is free again.
///
/// **Failures.** Every host exchange has the call's deadline; a peer that dies is reported by
/// the host transport (`errc::peer_lost`), a CUDA failure on any rank becomes `errc::
/// cuda_error` with the CUDA text on every rank (through the records, or by aborting the host
/// communicator), and ranks that call differently fail with `errc::mismatch` naming both calls.
/// A failure poisons the host communicator. Work a failed call already enqueued may wait on a
/// dead peer's event: after a failure use `synchronize` (it has a deadline), not
/// `cudaStreamSynchronize`, and do not reuse the stream.
///
/// One process per rank (a process cannot open its own IPC handles); the ranks' devices must be
/// the same GPU or peers with P2P access (several processes on one GPU is a valid setup).
#pragma once

#include <algorithm>
#include <chrono>
#include <cohort/collectives/all_gather.hpp>
#include <cohort/core/communicator.hpp>
#include <cohort/core/error.hpp>
#include <cohort/core/options.hpp>
#include <cohort/cuda/detail/ipc_protocol.hpp>
#include <cohort/cuda/error.hpp>
#include <cohort/cuda/reduce.hpp>
#include <cohort/cuda/runtime.hpp>
#include <cstddef>
#include <optional>
#include <string>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

namespace cohort {

/// Settings of `cuda_ipc_communicator`.
struct cuda_ipc_options {
  /// The device of this rank; -1: the calling thread's current device.
  int device = -1;
  /// Peer allocations kept mapped per peer. A mapping keeps the peer's memory alive after the
  /// peer frees it, until it is evicted (the eviction waits for the device).
  std::size_t max_mappings = 64;
};

template <communicator Host>
class cuda_ipc_communicator;

namespace detail::cuda_ipc {
template <class Host, class T, class Op>
failure all_reduce(cuda_ipc_communicator<Host>&, const T*, T*, std::size_t, const Op&,
                   cuda::stream_t, const call_options&);
}  // namespace detail::cuda_ipc

/// The ranks of a host communicator as CUDA devices that read each other's memory.
///
/// Built collectively (every rank of `host`, in the same order as its other calls); keeps a
/// reference to `host`, which must outlive it and carries its control messages, deadlines
/// and poisoned state. Not thread-safe; not copyable or movable.
template <communicator Host>
class cuda_ipc_communicator {
 public:
  /// Sets up this rank (device, interprocess events) and opens its peers' events. Throws
  /// `cohort::error`: `errc::cuda_error` on every rank when any rank has no usable device or a
  /// CUDA call fails (naming the rank and the CUDA error), `errc::unsupported` for more than
  /// 32 ranks, or what the host communicator reports (a timeout, a lost peer).
  explicit cuda_ipc_communicator(Host& host, cuda_ipc_options opts = {})
      : host_(host),
        exports_(opts.max_mappings),
        maps_(host.size(), opts.max_mappings),
        peer_ready_(no_events(host.size())),
        peer_done_(no_events(host.size())) {
    const int p = host.size(), r = host.rank();
    if (p > COHORT_CUDA_MAX_OPERANDS)
      throw error(make_error_code(errc::unsupported), "cuda_ipc_communicator", -1,
                  "cuda_ipc_communicator: " + std::to_string(p) + " ranks; at most " +
                      std::to_string(COHORT_CUDA_MAX_OPERANDS));
    detail::cuda_ipc::setup_record mine;
    mine.status = setup_local(opts.device, mine);
    mine.device = device_;
    std::vector<detail::cuda_ipc::setup_record> all(static_cast<std::size_t>(p));
    exchange(&mine, all.data(), sizeof mine);
    for (int q = 0; q < p; ++q) {
      const auto& s = all[static_cast<std::size_t>(q)];
      if (s.magic != detail::cuda_ipc::setup_magic ||
          s.version != detail::cuda_ipc::protocol_version)
        throw error(make_error_code(errc::protocol_error), "cuda_ipc_communicator", q,
                    "cuda_ipc_communicator: rank " + std::to_string(q) +
                        " speaks another CUDA IPC protocol (a different cohort build?)");
      if (s.status != 0) throw setup_error(q, "could not set up its device", s.status);
    }
    if (p == 1) return;
    // Open the peers' events, then agree that every rank could.
    std::int32_t opened = 0;
    for (int q = 0; q < p && opened == 0; ++q) {
      if (q == r) continue;
      const auto& s = all[static_cast<std::size_t>(q)];
      opened = peer_ready_[q].open_interprocess(s.ready_event);
      if (opened == 0) opened = peer_done_[q].open_interprocess(s.done_event);
    }
    std::vector<std::int32_t> statuses(static_cast<std::size_t>(p));
    exchange(&opened, statuses.data(), sizeof opened);
    for (int q = 0; q < p; ++q)
      if (statuses[static_cast<std::size_t>(q)] != 0)
        throw setup_error(q, "could not open its peers' IPC events",
                          statuses[static_cast<std::size_t>(q)]);
  }

  cuda_ipc_communicator(const cuda_ipc_communicator&) = delete;
  cuda_ipc_communicator& operator=(const cuda_ipc_communicator&) = delete;

  /// Waits for the device (kernels may still read peers' memory), then closes the mappings and
  /// destroys the events; after a failure it waits for nothing (a dead peer's event may never
  /// complete) and leaves the mappings to the end of the process. This rank's buffers are free
  /// to reuse or release as soon as its own stream has passed its last call: the peers' kernels
  /// that touch them are done by then.
  ~cuda_ipc_communicator() {
    if (device_ >= 0) cohort_cuda_set_device(device_);
    if (host_.last_failure() != nullptr)
      maps_.abandon();
    else if (size() > 1 && sequence_ > 0)
      cohort_cuda_device_synchronize();
  }

  /// This rank, as in the host communicator.
  int rank() const { return host_.rank(); }
  /// The number of ranks.
  int size() const { return host_.size(); }
  /// The CUDA device this rank's kernels run on.
  int device() const { return device_; }
  /// The host communicator carrying the control messages.
  Host& host() { return host_; }
  /// The first failure (the host communicator's), or null.
  const failure* last_failure() const { return host_.last_failure(); }
  /// True after a failure: later calls fail at once with `errc::poisoned`.
  bool poisoned() const { return host_.last_failure() != nullptr; }
  /// What the last call that reported through a `std::error_code` failed with (a bad
  /// argument's refusal too), or null while none has; as `basic_communicator::last_error`.
  const failure* last_error() const { return error_ ? &*error_ : nullptr; }
  /// Keeps `f` as `last_error()` (the collectives' business: `detail::error_code_for`).
  void note_error(failure&& f) noexcept { error_ = std::move(f); }

 private:
  template <class H, class T, class Op>
  friend failure detail::cuda_ipc::all_reduce(cuda_ipc_communicator<H>&, const T*, T*, std::size_t,
                                              const Op&, cuda::stream_t, const call_options&);

  int setup_local(int device, detail::cuda_ipc::setup_record& mine) {
    if (device < 0) {
      if (const int e = cohort_cuda_get_device(&device)) return e;
    }
    device_ = device;
    if (const int e = cohort_cuda_set_device(device)) return e;
    if (const int e = ready_.create_interprocess(mine.ready_event)) return e;
    return done_.create_interprocess(mine.done_event);
  }

  static std::vector<cuda::event> no_events(int count) {
    std::vector<cuda::event> v;
    v.reserve(static_cast<std::size_t>(count));
    for (int i = 0; i < count; ++i) v.emplace_back(nullptr);
    return v;
  }

  // all_gather of one record per rank over the host communicator; throws its failure.
  void exchange(const void* mine, void* all, std::size_t bytes) {
    const failure f = detail::all_gather(
        host_, static_cast<const std::uint8_t*>(mine), bytes, static_cast<std::uint8_t*>(all),
        bytes * static_cast<std::size_t>(host_.size()), call_options{});
    if (f.code)
      throw error(f.code, "cuda_ipc_communicator", f.peer, "cuda_ipc_communicator: " + f.what);
  }

  // Every rank learned of the failure from the same records and throws the same error, so the
  // host communicator stays usable (for host collectives) and is not poisoned.
  static error setup_error(int q, const std::string& what, int status) {
    const failure f = cuda::cuda_failure(
        status, "cuda_ipc_communicator: rank " + std::to_string(q) + " " + what, q);
    return error(f.code, "cuda_ipc_communicator", q, f.what);
  }

  Host& host_;
  int device_ = -1;
  std::uint64_t sequence_ = 0;
  detail::cuda_ipc::exports exports_;
  detail::cuda_ipc::mappings maps_;  // the peers' allocations mapped here
  cuda::event ready_{nullptr}, done_{nullptr};  // interprocess, this rank's
  std::vector<cuda::event> peer_ready_, peer_done_;  // the peers', opened here
  std::vector<detail::cuda_ipc::call_record> records_;  // reused by every call
  std::optional<failure> error_;
};

/// Reduces `n` elements of `in` across all ranks with `op`; every rank's `out` receives the
/// result. Device memory (from cudaMalloc) on every rank; `in` and `out` may be the same.
///
/// Every rank calls it with the same n, element type and op. Stream-ordered: returns once the
/// work is enqueued on `stream`; `out` holds the result, and both buffers are free again, when
/// `stream` passes this point on this rank. Schedule: one kernel per rank (see this file's
/// comment): rank r reads n/P elements from each of P inputs and writes n/P elements to each
/// of P outputs. Determinism: element i is combined in rank order 0..P-1 and rounded once, by
/// one rank, which writes the same bits to every output: results are bitwise identical across
/// ranks and runs (and equal to the host's reference `x_0 op x_1 op ... op x_{P-1}` in
/// `accumulator_t<T>`). T is float, double, fp16 or bf16; op a built-in (sum, prod, min, max,
/// avg). Throws `cohort::error`.
template <communicator Host, cuda::device_element T, cuda::device_reduction Op>
void all_reduce(cuda_ipc_communicator<Host>& comm, const T* in, T* out, std::size_t n, const Op& op,
                cuda::stream_t stream, const call_options& opts = {}) {
  detail::throw_if_failed(detail::cuda_ipc::all_reduce(comm, in, out, n, op, stream, opts),
                          "all_reduce");
}

/// As above; reports failure through `ec`, and its sentence through `comm.last_error()`
/// (a bad argument, `errc::invalid_argument`, included: it does not poison).
template <communicator Host, cuda::device_element T, cuda::device_reduction Op>
void all_reduce(cuda_ipc_communicator<Host>& comm, const T* in, T* out, std::size_t n, const Op& op,
                cuda::stream_t stream, const call_options& opts, std::error_code& ec) {
  ec = detail::error_code_for(comm, detail::cuda_ipc::all_reduce(comm, in, out, n, op, stream,
                                                                 opts));
}

/// Waits until `stream` is idle, for at most the call's deadline (the communicator's default
/// unless `opts` says otherwise): unlike `cudaStreamSynchronize` it cannot hang on a peer that
/// died with work pending. Throws `cohort::error`: `errc::timed_out` (poisoning the
/// communicator) or `errc::cuda_error`.
template <communicator Host>
void synchronize(cuda_ipc_communicator<Host>& comm, cuda::stream_t stream,
                 const call_options& opts = {}) {
  const auto limit = opts.timeout.count() > 0 ? opts.timeout : comm.host().timeout();
  const deadline until = deadline_after(limit);
  auto pause = std::chrono::microseconds(1);
  for (;;) {
    const int e = cohort_cuda_stream_query(stream);
    if (e == 0) return;
    if (e != 600)  // cudaErrorNotReady
      cuda::check(e, "synchronize", "cudaStreamQuery");
    if (clock::now() >= until) {
      const failure f{make_error_code(errc::timed_out), -1,
                      "synchronize: the stream did not drain within " +
                          std::to_string(limit.count()) +
                          " ms (did a peer die with work "
                          "pending? the stream cannot be used again)"};
      comm.host().fail(f);
      throw error(f.code, "synchronize", -1, f.what);
    }
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::microseconds(1000));
  }
}

}  // namespace cohort

#include <cohort/cuda/detail/ipc_all_reduce.hpp>
