/// @file
/// The parameter server's vocabulary: roles, keys, consistency modes and update rules.
#pragma once

#include <chrono>
#include <cohort/core/error.hpp>
#include <cohort/parameter_server/compression.hpp>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <span>
#include <string>

namespace cohort::ps {

/// Who serves in a job of `size` ranks: ranks [0, servers) are servers, the rest workers.
struct roles {
  int servers = 1;  ///< S, at least 1.
  int size = 0;     ///< Ranks in the job; W = size - S, at least 1.

  /// Reads S from `COHORT_PS_SERVERS` when set, else `fallback`.
  static roles from_env(int size, int fallback = 1) {
    int s = fallback;
    if (const char* v = std::getenv("COHORT_PS_SERVERS"); v != nullptr && *v != '\0')
      s = std::atoi(v);
    return {s, size};
  }
  int workers() const noexcept { return size - servers; }
  bool is_server(int rank) const noexcept { return rank >= 0 && rank < servers; }
  bool is_worker(int rank) const noexcept { return rank >= servers && rank < size; }
  /// The worker index of `rank`, in [0, W).
  int worker_index(int rank) const noexcept { return rank - servers; }

  /// Throws `cohort::error` (`errc::invalid_argument`, operation `what`) unless S >= 1, W >= 1.
  void check(const char* what) const {
    if (servers < 1 || servers >= size)
      throw error(errc::invalid_argument, what, -1,
                  std::string(what) +
                      ": a parameter server job needs at least one server and "
                      "one worker; got " +
                      std::to_string(servers) + " server(s) among " + std::to_string(size) +
                      " ranks");
  }
};

/// A tensor the store holds: a key and its number of f32 elements. Every rank of the job
/// declares the same keys, in any order.
struct key_spec {
  std::uint64_t key = 0;
  std::size_t count = 0;
};

/// When a server applies pushes and answers pulls.
enum class consistency_mode {
  sync,   ///< A step is applied once every worker pushed it; a pull waits for the worker's step.
  async,  ///< Each push is applied on arrival; a pull answers at once.
  ssp,    ///< As async, but a worker's pull waits while it is more than `staleness` pushes
          ///< ahead of the slowest live worker (stale synchronous parallel).
};

/// A consistency mode and, for `ssp`, its bound.
struct consistency {
  consistency_mode mode = consistency_mode::sync;
  int staleness = 0;
  static consistency sync() { return {consistency_mode::sync, 0}; }
  static consistency async() { return {consistency_mode::async, 0}; }
  static consistency ssp(int s) { return {consistency_mode::ssp, s}; }
};

/// What an update rule is told besides the tensors.
struct update_context {
  std::uint64_t key = 0;    ///< The key.
  std::size_t offset = 0;   ///< The shard's first element within the key.
  std::uint64_t round = 0;  ///< Rounds applied before this one: sync steps, or pushes / W.
};

/// A server-side update: changes `weights` (the shard) from `gradient` (the mean over the
/// workers in sync mode; one worker's gradient divided by W in the others, so that W pushes
/// move the weights as one sync step does). `state` is a zero-initialized buffer of the
/// shard's size that the server keeps for the rule (momentum, say).
using update_rule = std::function<void(const update_context&, std::span<float> weights,
                                       std::span<float> state, std::span<const float> gradient)>;

/// SGD with momentum, as most optimizers write it: v = momentum * v + g; w -= lr * scale * v,
/// where scale is `schedule(round)` (1 without a schedule).
struct sgd_momentum {
  float lr = 0.01f;
  float momentum = 0.9f;
  std::function<float(std::uint64_t round)> schedule;

  void operator()(const update_context& c, std::span<float> w, std::span<float> v,
                  std::span<const float> g) const {
    const float step = lr * (schedule ? schedule(c.round) : 1.0f);
    for (std::size_t i = 0; i < w.size(); ++i) {
      v[i] = momentum * v[i] + g[i];
      w[i] -= step * v[i];
    }
  }
};

/// Settings of a `server`.
struct server_options {
  consistency mode{};
  update_rule update = sgd_momentum{};
  /// How long a server waits without hearing from any worker before it fails with
  /// `errc::timed_out`; zero: the communicator's timeout.
  std::chrono::milliseconds idle_timeout{0};
  /// The codec the workers push with (the same on every rank); empty: f32 pushes only.
  push_codec compress{};
};

/// Settings of a `worker`.
struct worker_options {
  /// Encodes every push (see `push_codec`); empty: pushes go as f32.
  push_codec compress{};
};

}  // namespace cohort::ps
