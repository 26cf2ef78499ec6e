/// @file
/// The training state of an elastic job: buffers registered once, committed, restored, synced.
#pragma once

#include <cstdint>
#include <cstring>
#include <span>
#include <vector>

#include <cohort/collectives/all_reduce.hpp>
#include <cohort/collectives/broadcast.hpp>
#include <cohort/core/communicator.hpp>
#include <cohort/core/dtype.hpp>
#include <cohort/core/ops.hpp>

namespace cohort::elastic {

/// The buffers that make up a training state (model, optimizer moments, counters) and the
/// step they hold.
///
/// `commit(step)` copies every buffer into a snapshot (one memcpy of the registered bytes: the
/// only cost) and records `step`; `restore()` copies the snapshot back, undoing a step a
/// failure cut short; `sync(comm)` makes every rank hold the state of the lowest rank with the
/// highest committed step, to the bit (two one-integer all_reduces and one broadcast per
/// buffer). Not thread-safe. The buffers must outlive the state and keep their size.
class state {
 public:
  /// Registers `buffer` (its bytes are part of the state from now on).
  template <element T>
  void add(std::span<T> buffer) {
    const std::size_t bytes = buffer.size_bytes();
    buffers_.push_back({reinterpret_cast<std::uint8_t*>(buffer.data()), bytes,
                        std::vector<std::uint8_t>(bytes)});
    std::memcpy(buffers_.back().snapshot.data(), buffers_.back().data, bytes);
  }

  /// The step of the last commit (0 before any).
  std::int64_t step() const { return step_; }
  /// The number of registered bytes.
  std::size_t bytes() const {
    std::size_t n = 0;
    for (const auto& b : buffers_) n += b.bytes;
    return n;
  }

  /// Marks the buffers as the consistent state after `step` steps.
  void commit(std::int64_t step) {
    for (auto& b : buffers_) std::memcpy(b.snapshot.data(), b.data, b.bytes);
    step_ = step;
  }

  /// Puts the buffers back as they were at the last commit.
  void restore() {
    for (auto& b : buffers_) std::memcpy(b.data, b.snapshot.data(), b.bytes);
  }

  /// Collective over `comm`: every rank restores, then takes the state of the lowest rank
  /// with the highest committed step (its buffers and step, bitwise). Returns that rank.
  /// A rank that passes `source = false` (a newcomer, or a rank that was left out and came
  /// back: its state belongs to a history the others left) is never chosen, unless no rank
  /// may be (a job of all-new processes, as after a torchrun restart).
  template <communicator Comm>
  int sync(Comm& comm, bool source = true) {
    restore();
    std::vector<std::int64_t> mine{source ? step_ : -1}, best(1);
    all_reduce(comm, mine, best, ops::max);
    if (best[0] < 0) {
      source = true;
      mine[0] = step_;
      all_reduce(comm, mine, best, ops::max);
    }
    std::vector<std::int64_t> owner{source && step_ == best[0] ? comm.rank() : comm.size()},
        first(1);
    all_reduce(comm, owner, first, ops::min);
    const int root = static_cast<int>(first[0]);
    for (auto& b : buffers_) broadcast(comm, std::span<std::uint8_t>(b.data, b.bytes), root);
    commit(best[0]);
    return root;
  }

 private:
  struct buffer {
    std::uint8_t* data;
    std::size_t bytes;
    std::vector<std::uint8_t> snapshot;
  };
  std::vector<buffer> buffers_;
  std::int64_t step_ = 0;
};

}  // namespace cohort::elastic
