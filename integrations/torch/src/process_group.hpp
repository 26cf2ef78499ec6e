/// @file
/// The "cohort" process group of torch.distributed: what the Python module binds.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

#include <ATen/ATen.h>
#include <c10/util/intrusive_ptr.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

namespace cohort_torch {

/// Makes the process group of `size` ranks that meet at `store` (what
/// `torch.distributed.Backend.register_backend` calls). The transport is shared memory when
/// every rank runs on this host, TCP otherwise; COHORT_TRANSPORT=shm|tcp decides instead.
/// Every collective's deadline is `timeout`.
c10::intrusive_ptr<c10d::ProcessGroup> create_process_group(
    const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
    std::chrono::milliseconds timeout);

/// Averages the float32 `bucket` in place across the ranks of `pg` (a cohort group) through
/// the codec `codec` ("fp16", "bf16", "int8", "top_k"; `ratio` for top_k), on the group's
/// progress thread. With `error_feedback`, the residual of bucket `index` is kept across calls.
/// The work's future completes with [bucket].
c10::intrusive_ptr<c10d::Work> compressed_allreduce(const c10::intrusive_ptr<c10d::ProcessGroup>& pg,
                                                    at::Tensor bucket, const std::string& codec,
                                                    double ratio, bool error_feedback,
                                                    std::int64_t index);

/// The transport the group runs on ("shm" or "tcp").
std::string transport_name(const c10::intrusive_ptr<c10d::ProcessGroup>& pg);

}  // namespace cohort_torch
