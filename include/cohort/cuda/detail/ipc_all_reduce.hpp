/// @file
/// all_reduce over `cuda_ipc_communicator`: the call records, the event protocol and the one
/// kernel per rank (see cuda/ipc.hpp for the design and its invariants).
#pragma once

#include <cohort/collectives/all_gather.hpp>
#include <cohort/collectives/barrier.hpp>
#include <cohort/core/buffer.hpp>
#include <cohort/core/error.hpp>
#include <cohort/core/ops.hpp>
#include <cohort/cuda/detail/ipc_protocol.hpp>
#include <cohort/cuda/error.hpp>
#include <cohort/cuda/ipc.hpp>
#include <cohort/cuda/reduce.hpp>
#include <cstddef>
#include <cstdint>
#include <string>

namespace cohort::detail::cuda_ipc {

/// Restores the calling thread's device when a call ends.
struct device_restore {
  int previous = -1;
  ~device_restore() {
    if (previous >= 0) cohort_cuda_set_device(previous);
  }
};

// Invariants the event protocol keeps (P >= 2, n > 0):
//  - a peer waits on my `ready` only after the all_gather that follows my recording it, and on
//    my `done` only after the barrier that follows my recording it;
//  - I record `ready` again (next call) only after that barrier, which every peer enters after
//    it enqueued its waits on my `ready`; I record `done` again only after the next call's
//    all_gather, which every peer enters after it enqueued its waits on my `done`.
//  So no wait can ever see a later record than the one it was meant for.
template <class Host, class T, class Op>
failure all_reduce(cuda_ipc_communicator<Host>& comm, const T* in, T* out, std::size_t n, const Op&,
                   cuda::stream_t stream, const call_options& opts) {
  Host& host = comm.host_;
  const int p = host.size(), r = host.rank();
  const std::uint64_t sequence = comm.sequence_++;
  const std::string prefix = "all_reduce (CUDA IPC) #" + std::to_string(sequence) + ": ";
  const auto result = [&](errc e, int peer, const std::string& what) {
    return failure{make_error_code(e), peer, prefix + what};
  };
  // Poisons the host communicator and aborts it, so that peers waiting in it stop at once.
  const auto fail = [&](failure f) {
    host.fail(f);
    return f;
  };
  const auto cuda_fail = [&](int code, const std::string& what, int peer = -1) {
    return fail(cuda::cuda_failure(code, prefix + what, peer));
  };

  if (const failure* f = host.last_failure())
    return result(errc::poisoned, f->peer,
                  "the communicator failed earlier and must be rebuilt: " + f->what);
  if (n > 0 && (in == nullptr || out == nullptr))
    return result(errc::invalid_argument, -1,
                  "a null device pointer for " + std::to_string(n) + " elements");
  if (partly_overlap(in, n, static_cast<const T*>(out), n))
    return result(errc::invalid_argument, -1,
                  "input and output overlap without being the same buffer");

  device_restore restore;
  if (const int e = cohort_cuda_get_device(&restore.previous)) return cuda_fail(e, "cudaGetDevice");
  if (restore.previous != comm.device_) {
    if (const int e = cohort_cuda_set_device(comm.device_)) return cuda_fail(e, "cudaSetDevice");
  }

  const int type = static_cast<int>(dtype_of<T>);
  constexpr builtin_reduction tag = builtin_reduction_of<Op>;
  constexpr int op = static_cast<int>(tag);
  const int ranks = tag == builtin_reduction::avg ? p : 0;  // avg divides by P once
  if (p == 1) {
    if (n == 0 || (in == out && ranks == 0)) return {};
    const void* src[] = {in};
    void* const dst[] = {out};
    if (const int e = cohort_cuda_reduce(type, op, src, 1, dst, 1, n, ranks, stream))
      return cuda_fail(e, "reduce kernel");
    return {};
  }

  // 1. Describe the call and this rank's buffers; mark them ready on the stream.
  call_record mine;
  mine.type = static_cast<std::uint8_t>(type);
  mine.sequence = sequence;
  mine.count = n;
  mine.op_tag = static_cast<std::uint32_t>(tag);
  if (n > 0) {
    const std::size_t bytes = n * sizeof(T);
    int status = 0;
    problem trouble = comm.exports_.describe(in, bytes, comm.device_, mine.in, status);
    if (trouble == problem::none) {
      mine.which = 1;
      trouble = comm.exports_.describe(out, bytes, comm.device_, mine.out, status);
    }
    if (trouble == problem::none) {
      mine.which = 2;
      status = cohort_cuda_event_record(comm.ready_.get(), stream);
      if (status != 0) trouble = problem::cuda;
    }
    mine.trouble = trouble;
    mine.status = trouble == problem::none ? 0 : status;
  }

  // 2. Every rank learns every call record.
  auto& records = comm.records_;
  records.resize(static_cast<std::size_t>(p));
  const failure gathered = cohort::detail::all_gather(
      host, reinterpret_cast<const std::uint8_t*>(&mine), sizeof mine,
      reinterpret_cast<std::uint8_t*>(records.data()), sizeof mine * records.size(), opts);
  if (gathered.code) return {gathered.code, gathered.peer, prefix + gathered.what};
  for (int q = 0; q < p; ++q) {
    const call_record& rec = records[static_cast<std::size_t>(q)];
    if (!same_call(rec, mine))
      return fail(result(errc::mismatch, q,
                         "rank " + std::to_string(q) + " called " + describe(rec) + ", rank " +
                             std::to_string(r) + " called " + describe(mine)));
  }
  for (int q = 0; q < p; ++q) {
    const call_record& rec = records[static_cast<std::size_t>(q)];
    if (rec.trouble == problem::none) continue;
    const std::string what = "rank " + std::to_string(q) + " cannot take part: " +
                             trouble_text(rec, [](int code) { return cuda::error_text(code); });
    // Every rank read the same records and stops here alike: a CUDA failure poisons, a bad
    // buffer is an invalid argument and leaves the communicator usable.
    if (rec.trouble == problem::cuda) return fail(result(errc::cuda_error, q, what));
    return result(errc::invalid_argument, q, what);
  }
  if (n == 0) return {};

  // 3. Map the peers' buffers (cached), wait until they are ready, reduce my part into all.
  const std::size_t bytes = n * sizeof(T);
  const void* src[COHORT_CUDA_MAX_OPERANDS];
  void* dst[COHORT_CUDA_MAX_OPERANDS];
  const range mine_range = owned_range(n, p, r, 16 / sizeof(T) > 0 ? 16 / sizeof(T) : 1);
  const std::size_t skip = mine_range.begin * sizeof(T);
  for (int q = 0; q < p; ++q) {
    std::byte* at_in = reinterpret_cast<std::byte*>(const_cast<T*>(in));
    std::byte* at_out = reinterpret_cast<std::byte*>(out);
    if (q != r) {
      const call_record& rec = records[static_cast<std::size_t>(q)];
      if (rec.in.offset + bytes > rec.in.alloc_bytes ||
          rec.out.offset + bytes > rec.out.alloc_bytes)
        return fail(
            result(errc::protocol_error, q,
                   "rank " + std::to_string(q) + " announced buffers smaller than the call"));
      if (const int e = comm.maps_.open(q, rec.in, at_in))
        return cuda_fail(e, "mapping rank " + std::to_string(q) + "'s input (cudaIpcOpenMemHandle)",
                         q);
      if (const int e = comm.maps_.open(q, rec.out, at_out))
        return cuda_fail(
            e, "mapping rank " + std::to_string(q) + "'s output (cudaIpcOpenMemHandle)", q);
      if (const int e = cohort_cuda_stream_wait_event(stream, comm.peer_ready_[q].get()))
        return cuda_fail(e, "waiting for rank " + std::to_string(q) + " (cudaStreamWaitEvent)", q);
    }
    src[q] = at_in + skip;
    dst[q] = at_out + skip;
  }
  if (mine_range.end > mine_range.begin) {
    if (const int e = cohort_cuda_reduce(type, op, src, p, dst, p,
                                         mine_range.end - mine_range.begin, ranks, stream))
      return cuda_fail(e, "reduce kernel");
  }
  if (const int e = cohort_cuda_event_record(comm.done_.get(), stream))
    return cuda_fail(e, "recording the done event (cudaEventRecord)");

  // 4. Every rank recorded `done` after its kernel; this stream goes on once all of them ran.
  const failure met = cohort::detail::barrier(host, opts);
  if (met.code) return {met.code, met.peer, prefix + met.what};
  for (int q = 0; q < p; ++q) {
    if (q == r) continue;
    if (const int e = cohort_cuda_stream_wait_event(stream, comm.peer_done_[q].get()))
      return cuda_fail(e, "waiting for rank " + std::to_string(q) + " (cudaStreamWaitEvent)", q);
  }
  return {};
}

}  // namespace cohort::detail::cuda_ipc
