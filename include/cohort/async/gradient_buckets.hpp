/// @file
/// Gradient bucketing: pack many small gradients into buckets and all-reduce each bucket as
/// soon as its gradients are ready, so communication overlaps back-propagation.
#pragma once

#include <algorithm>
#include <cstddef>
#include <functional>
#include <future>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include <boost/asio/use_future.hpp>

#include <cohort/async/collectives.hpp>
#include <cohort/core/error.hpp>

namespace cohort {

/// How `gradient_buckets` groups and reduces.
template <communicator Comm>
struct bucket_options {
  /// Target bucket size: a bucket closes once it holds at least this many bytes (25 MiB, as
  /// PyTorch DDP). A tensor larger than this gets a bucket of its own.
  std::size_t bucket_bytes = 25u << 20;
  /// Reduce every `accumulate` micro-batches; in between, gradients add up in place.
  int accumulate = 1;
  /// Options of each bucket's collective.
  call_options call{};
  /// How a bucket is reduced to its mean over ranks, on the progress thread; replace it to
  /// compress. The default is `all_reduce(comm, bucket, ops::avg, call)`.
  std::function<void(Comm&, std::span<float>)> reduce{};
};

/// A DDP-style reducer over float gradients held by the caller.
///
/// Tensors are registered in forward order and grouped into buckets in reverse, the order in
/// which back-propagation produces them. Each rank must register the same tensors (same
/// sizes, same order) and call `ready` for every tensor of a synchronizing micro-batch.
/// Results are the mean over ranks (and over the `accumulate` micro-batches), bitwise
/// identical on every rank.
template <communicator Comm>
class gradient_buckets {
 public:
  /// Groups `grads` (forward order) into buckets; `p` and the tensors must outlive this.
  /// Throws `cohort::error` (`errc::invalid_argument`) when `opts.accumulate` < 1.
  gradient_buckets(progress_thread<Comm>& p, std::vector<std::span<float>> grads,
                   bucket_options<Comm> opts = {})
      : progress_(p), grads_(std::move(grads)), opts_(std::move(opts)),
        bucket_of_(grads_.size()) {
    if (opts_.accumulate < 1)
      invalid("gradient_buckets", "accumulate " + std::to_string(opts_.accumulate) + " < 1");
    if (!opts_.reduce)
      opts_.reduce = [call = opts_.call](Comm& c, std::span<float> b) {
        all_reduce(c, b, ops::avg, call);
      };
    std::size_t bytes = opts_.bucket_bytes;  // forces a new bucket for the first tensor
    for (std::size_t i = grads_.size(); i-- > 0;) {
      if (bytes >= opts_.bucket_bytes) {
        buckets_.emplace_back();
        bytes = 0;
      }
      buckets_.back().tensors.push_back(i);
      buckets_.back().flat_size += grads_[i].size();
      bytes += grads_[i].size_bytes();
      bucket_of_[i] = buckets_.size() - 1;
    }
    for (auto& b : buckets_) {
      if (const auto in_place = adjacent(b)) {
        b.view = *in_place;
      } else {
        b.flat.resize(b.flat_size);
        b.view = b.flat;
      }
    }
  }

  /// Number of buckets.
  std::size_t bucket_count() const { return buckets_.size(); }

  /// True when the current micro-batch reduces (every `accumulate`-th one).
  bool synchronizing() const { return (micro_batch_ + 1) % opts_.accumulate == 0; }

  /// Marks tensor `i`'s gradient final for this micro-batch. On a synchronizing micro-batch,
  /// the last tensor of a bucket starts the bucket's reduction on the progress thread; from
  /// then until `finish` returns, the bucket's tensors belong to it (neither read nor write
  /// them). A bucket whose tensors lie end to end in memory (as layers of one flat gradient
  /// buffer do) is reduced in place; any other is packed into a copy first. Throws
  /// `cohort::error` (`errc::invalid_argument`) for a tensor that was not registered.
  void ready(std::size_t i) {
    if (i >= grads_.size())
      invalid("gradient_buckets::ready", "tensor " + std::to_string(i) + " of " +
                                             std::to_string(grads_.size()) + " registered");
    if (!synchronizing()) return;
    bucket& b = buckets_[bucket_of_[i]];
    if (++b.ready < b.tensors.size()) return;
    if (!b.flat.empty()) {
      std::size_t offset = 0;
      for (std::size_t t : b.tensors) {
        std::copy(grads_[t].begin(), grads_[t].end(), b.flat.begin() + offset);
        offset += grads_[t].size();
      }
    }
    b.done = progress_.start([reduce = opts_.reduce, view = b.view](Comm& c) {
      reduce(c, view);
    }, boost::asio::use_future);
    bytes_started_ += b.view.size_bytes();
  }

  /// Ends the micro-batch. On a synchronizing one, waits for every bucket and writes the
  /// means back into the gradients, then returns true; rethrows the first failure. Otherwise
  /// returns false and leaves the gradients to accumulate. Throws `cohort::error`
  /// (`errc::invalid_argument`) when a tensor of a synchronizing micro-batch was never marked
  /// ready.
  bool finish() {
    const bool sync = synchronizing();
    ++micro_batch_;
    if (!sync) return false;
    std::exception_ptr first;
    const float scale = 1.0f / static_cast<float>(opts_.accumulate);
    for (auto& b : buckets_) {
      if (b.ready != b.tensors.size())
        invalid("gradient_buckets::finish", "a tensor was never marked ready");
      b.ready = 0;
      try {
        b.done.get();
      } catch (...) {
        if (!first) first = std::current_exception();
        continue;
      }
      if (b.flat.empty()) {
        if (opts_.accumulate != 1)
          for (float& g : b.view) g *= scale;
        continue;
      }
      std::size_t offset = 0;
      for (std::size_t t : b.tensors) {
        for (std::size_t k = 0; k < grads_[t].size(); ++k)
          grads_[t][k] = opts_.accumulate == 1 ? b.flat[offset + k] : b.flat[offset + k] * scale;
        offset += grads_[t].size();
      }
    }
    if (first) std::rethrow_exception(first);
    return true;
  }

  /// Bytes of gradient handed to reductions so far (before any compression).
  std::size_t bytes_reduced() const { return bytes_started_; }

 private:
  [[noreturn]] static void invalid(const char* operation, const std::string& what) {
    throw error(make_error_code(errc::invalid_argument), operation, -1,
                std::string(operation) + ": " + what);
  }

  struct bucket {
    std::vector<std::size_t> tensors;  // reverse forward order
    std::size_t flat_size = 0;
    std::vector<float> flat;  // the packed copy; empty when the bucket is reduced in place
    std::span<float> view;    // what the reduction works on: the tensors themselves, or flat
    std::size_t ready = 0;
    std::future<void> done;
  };

  // The memory the bucket's tensors cover when they tile it without gaps or overlaps.
  std::optional<std::span<float>> adjacent(const bucket& b) const {
    std::vector<std::span<float>> parts;
    for (std::size_t t : b.tensors)
      if (!grads_[t].empty()) parts.push_back(grads_[t]);
    if (parts.empty()) return std::span<float>();
    std::sort(parts.begin(), parts.end(), [](std::span<float> x, std::span<float> y) {
      return std::less<const float*>()(x.data(), y.data());
    });
    for (std::size_t k = 1; k < parts.size(); ++k)
      if (parts[k - 1].data() + parts[k - 1].size() != parts[k].data()) return std::nullopt;
    return std::span<float>(parts.front().data(), b.flat_size);
  }

  progress_thread<Comm>& progress_;
  std::vector<std::span<float>> grads_;
  bucket_options<Comm> opts_;
  std::vector<std::size_t> bucket_of_;
  std::vector<bucket> buckets_;
  long micro_batch_ = 0;
  std::size_t bytes_started_ = 0;
};

}  // namespace cohort
