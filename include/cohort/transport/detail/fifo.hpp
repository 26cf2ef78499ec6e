/// @file
/// The queue of posted operations that every transport keeps per peer (loopback, shm and TCP
/// engines): first in, first out, with no allocation once warm.
///
/// A ring on a power-of-two vector that only grows, so its memory is bounded by the most
/// operations ever outstanding at once, even when the queue never drains. Items are plain
/// (a pointer and a size): trivially copyable, as the ring copies them when it grows.
#pragma once

#include <cstddef>
#include <type_traits>
#include <vector>

namespace cohort::detail {

/// A FIFO of trivially copyable items on a ring that only grows.
template <class T>
class fifo {
  static_assert(std::is_trivially_copyable_v<T>);

 public:
  bool empty() const noexcept { return count_ == 0; }
  std::size_t size() const noexcept { return count_; }
  /// The oldest item; the queue must not be empty.
  T& front() noexcept { return buf_[head_]; }
  /// The `i`-th oldest item; `i < size()`.
  T& operator[](std::size_t i) noexcept { return buf_[(head_ + i) & (buf_.size() - 1)]; }
  void push_back(const T& v) {
    if (count_ == buf_.size()) grow();
    buf_[(head_ + count_) & (buf_.size() - 1)] = v;
    ++count_;
  }
  /// Drops the oldest item; the queue must not be empty.
  void pop_front() noexcept {
    head_ = (head_ + 1) & (buf_.size() - 1);
    --count_;
  }
  /// Drops every item; keeps the capacity.
  void clear() noexcept { head_ = count_ = 0; }

 private:
  void grow() {
    std::vector<T> next(buf_.empty() ? 16 : buf_.size() * 2);
    for (std::size_t i = 0; i < count_; ++i) next[i] = (*this)[i];
    buf_.swap(next);
    head_ = 0;
  }
  std::vector<T> buf_;
  std::size_t head_ = 0, count_ = 0;
};

}  // namespace cohort::detail
