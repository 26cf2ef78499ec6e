/// @file
/// The in-process transport: P ranks as threads of one process.
///
/// It is the reference model of the `transport` concept and the test double for everything
/// above it. It buffers nothing: the receiver copies straight out of the sender's buffer, so a
/// send completes only when its bytes were taken. That makes it the strictest model: an
/// algorithm that waits on a receive before posting the sends its peer needs deadlocks here
/// (and times out) instead of passing by luck on a transport with slack.
#pragma once

#include <atomic>
#include <cassert>
#include <condition_variable>
#include <cstring>
#include <exception>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <cohort/core/communicator.hpp>
#include <cohort/core/concepts.hpp>
#include <cohort/core/detail/min.hpp>
#include <cohort/core/error.hpp>
#include <cohort/transport/detail/fifo.hpp>

namespace cohort {

namespace detail::loopback {

struct pending_send {
  const std::byte* data;
  std::size_t size;
};

// The byte stream from one rank to another: the sends waiting to be taken.
struct channel {
  std::mutex m;
  fifo<pending_send> sends;
  std::size_t head_taken = 0;           // bytes of sends.front() already taken
  std::atomic<std::uint64_t> taken{0};  // bytes taken since the start, ever growing
  std::atomic<bool> viewing{false};     // the receiver holds a view of sends.front()

  // Drops the sender's pending sends, then waits until the receiver no longer reads them.
  void withdraw() {
    { std::lock_guard lk(m); sends.clear(); head_taken = 0; }
    while (viewing.load(std::memory_order_acquire)) std::this_thread::yield();
  }
};

struct rank_state {
  std::mutex m;
  std::condition_variable cv;
  std::atomic<std::uint64_t> events{0};
  std::atomic<bool> alive{true};
};

/// `size`, or `errc::invalid_argument` naming `operation` unless it is at least 1.
inline int checked_size(int size, const char* operation) {
  if (size < 1)
    throw error(errc::invalid_argument, operation, -1,
                std::string(operation) + ": the rank count must be at least 1, not " +
                    std::to_string(size));
  return size;
}

}  // namespace detail::loopback

/// The shared state of one in-process group; every `loopback_transport` of it points here.
class loopback_world {
 public:
  /// A group of `size` ranks, none of them attached yet. Throws `cohort::error`
  /// (`errc::invalid_argument`) unless `size` is at least 1.
  explicit loopback_world(int size)
      : size_(detail::loopback::checked_size(size, "loopback_world")),
        channels_(static_cast<std::size_t>(size) * size), ranks_(size) {}

  /// The number of ranks.
  int size() const { return size_; }

 private:
  friend class loopback_transport;

  detail::loopback::channel& channel(int from, int to) { return channels_[from * size_ + to]; }
  void notify(int rank) {
    auto& r = ranks_[rank];
    { std::lock_guard lk(r.m); r.events.fetch_add(1); }
    r.cv.notify_all();
  }
  void notify_all() { for (int r = 0; r < size_; ++r) notify(r); }

  int size_;
  std::vector<detail::loopback::channel> channels_;
  std::vector<detail::loopback::rank_state> ranks_;
  std::mutex failure_m_;
  std::optional<failure> failure_;  // peer = the rank that aborted
  std::atomic<bool> aborted_{false};
};

/// One rank's end of a `loopback_world`; models `zero_copy_transport`.
class loopback_transport {
 public:
  /// A handle on a pending operation: complete once the stream passed `end`.
  struct request {
    int peer = -1;  // -1: nothing pending
    bool is_send = false;
    std::uint64_t end = 0;
  };

  /// Attaches as `rank` of `world`; each rank is attached once. Throws `cohort::error`
  /// (`errc::invalid_argument`) for a rank outside [0, world size).
  loopback_transport(std::shared_ptr<loopback_world> world, int rank)
      : world_(std::move(world)), rank_(checked_rank(*world_, rank)), posted_(world_->size()),
        recv_end_(world_->size()), send_end_(world_->size()) {}

  loopback_transport(loopback_transport&&) noexcept = default;
  loopback_transport& operator=(loopback_transport&&) = delete;

  /// Detaches: peers waiting on this rank fail with `errc::peer_lost`.
  ~loopback_transport() {
    if (!world_) return;
    withdraw_sends();  // the buffers die with this rank
    world_->ranks_[rank_].alive = false;
    world_->notify_all();
  }

  int rank() const { return rank_; }
  int size() const { return world_->size(); }

  request send(int peer, std::span<const std::byte> bytes) {
    assert(peer >= 0 && peer < size() && peer != rank_);
    if (bytes.empty()) return {};
    auto& ch = world_->channel(rank_, peer);
    {
      std::lock_guard lk(ch.m);
      ch.sends.push_back({bytes.data(), bytes.size()});
    }
    send_end_[peer] += bytes.size();
    world_->notify(peer);
    return {peer, true, send_end_[peer]};
  }

  request recv(int peer, std::span<std::byte> bytes) {
    assert(peer >= 0 && peer < size() && peer != rank_);
    if (bytes.empty()) return {};
    posted_[peer].push_back({bytes.data(), bytes.size()});
    ++posted_count_;
    recv_end_[peer] += bytes.size();
    return {peer, false, recv_end_[peer]};
  }

  void wait(request& req, deadline until, std::error_code& ec) {
    ec.clear();
    block_until([&] { return complete(req); }, req.peer, until, ec);
    if (!ec) req = {};
  }

  std::span<const std::byte> recv_view(int peer, std::size_t max, std::size_t align,
                                       deadline until, std::error_code& ec) {
    assert(posted_[peer].empty() && align > 0 && max >= align);
    std::span<const std::byte> view;
    auto& ch = world_->channel(peer, rank_);
    block_until([&] {
      std::lock_guard lk(ch.m);
      if (ch.sends.empty()) return false;
      const auto& s = ch.sends.front();
      std::size_t n = detail::min_of(s.size - ch.head_taken, max) / align * align;
      assert(n > 0 && "sends on this stream were not multiples of align");
      view = {s.data + ch.head_taken, n};
      ch.viewing.store(true, std::memory_order_release);
      return true;
    }, peer, until, ec);
    return ec ? std::span<const std::byte>{} : view;
  }

  void recv_release(int peer, std::size_t n) {
    recv_end_[peer] += n;  // receives posted later complete after these bytes
    auto& ch = world_->channel(peer, rank_);
    {
      std::lock_guard lk(ch.m);
      if (!ch.sends.empty()) take(ch, n);  // else the sender withdrew them
    }
    ch.viewing.store(false, std::memory_order_release);
    world_->notify(peer);
  }

  /// Fails every pending operation here and at the peers; this rank's pending sends are
  /// withdrawn, so no peer reads the caller's buffers after `abort` returns.
  void abort(const failure& f) noexcept {
    withdraw_sends();
    {
      std::lock_guard lk(world_->failure_m_);
      if (!world_->failure_) {
        try {
          world_->failure_ = failure{f.code, rank_, f.what};
        } catch (...) {
          world_->failure_ = failure{f.code, rank_, {}};
        }
      }
      world_->aborted_ = true;
    }
    world_->notify_all();
  }

  const failure* remote_failure() const {
    if (!world_->aborted_) return nullptr;
    std::lock_guard lk(world_->failure_m_);
    return world_->failure_->peer == rank_ ? nullptr : &*world_->failure_;
  }

 private:
  struct posted_recv {
    std::byte* data;
    std::size_t size;
  };

  static int checked_rank(const loopback_world& world, int rank) {
    if (rank < 0 || rank >= world.size())
      throw error(errc::invalid_argument, "loopback_transport", -1,
                  "loopback_transport: rank " + std::to_string(rank) + " of " +
                      std::to_string(world.size()) + " ranks");
    return rank;
  }

  void withdraw_sends() {
    for (int p = 0; p < size(); ++p)
      if (p != rank_) world_->channel(rank_, p).withdraw();
  }

  bool complete(const request& r) const {
    if (r.peer < 0) return true;
    const auto& ch = r.is_send ? world_->channel(rank_, r.peer) : world_->channel(r.peer, rank_);
    return ch.taken.load(std::memory_order_acquire) >= r.end;
  }

  static void take(detail::loopback::channel& ch, std::size_t n) {
    ch.head_taken += n;
    if (ch.head_taken == ch.sends.front().size) {
      ch.sends.pop_front();
      ch.head_taken = 0;
    }
    ch.taken.fetch_add(n, std::memory_order_release);
  }

  // Copies whatever the peers have sent into the receives posted here.
  void progress() {
    if (posted_count_ == 0) return;
    for (int p = 0; p < size(); ++p) {
      auto& q = posted_[p];
      if (q.empty()) continue;
      auto& ch = world_->channel(p, rank_);
      bool moved = false;
      {
        std::lock_guard lk(ch.m);
        while (!q.empty() && !ch.sends.empty()) {
          const auto& s = ch.sends.front();
          std::size_t n = detail::min_of(s.size - ch.head_taken, q.front().size);
          std::memcpy(q.front().data, s.data + ch.head_taken, n);
          take(ch, n);
          q.front().data += n;
          q.front().size -= n;
          if (q.front().size == 0) {
            q.pop_front();
            --posted_count_;
          }
          moved = true;
        }
      }
      if (moved) world_->notify(p);
    }
  }

  // Progresses until done() or a failure: an abort, a lost peer, the deadline.
  template <class Done>
  void block_until(Done done, int peer, deadline until, std::error_code& ec) {
    auto& me = world_->ranks_[rank_];
    for (;;) {
      std::uint64_t seen = me.events.load();
      progress();
      if (done()) return;
      if (world_->aborted_) {
        std::lock_guard lk(world_->failure_m_);
        ec = world_->failure_->peer == rank_ ? make_error_code(errc::aborted)
                                             : world_->failure_->code;
        return;
      }
      if (peer >= 0 && !world_->ranks_[peer].alive) {
        progress();
        if (done()) return;
        ec = errc::peer_lost;
        return;
      }
      std::unique_lock lk(me.m);
      if (!me.cv.wait_until(lk, until, [&] { return me.events.load() != seen; })) {
        lk.unlock();
        progress();
        if (done()) return;
        ec = errc::timed_out;
        return;
      }
    }
  }

  std::shared_ptr<loopback_world> world_;
  int rank_;
  std::vector<detail::fifo<posted_recv>> posted_;  // receives posted here, per source
  std::size_t posted_count_ = 0;
  std::vector<std::uint64_t> recv_end_;  // bytes posted for receiving, per source
  std::vector<std::uint64_t> send_end_;  // bytes posted for sending, per destination
};

/// The communicator over the in-process transport.
using loopback_communicator = basic_communicator<loopback_transport>;

/// Runs `fn(comm)` on `ranks` threads, one `loopback_communicator` each, and joins them.
/// Rethrows the first exception a rank threw (after every thread ended). `Transport` may be a
/// class derived from `loopback_transport` that declares other traits (such as
/// `coalesces_sends`), so that the schedules chosen for them run between threads too.
template <class Transport = loopback_transport, class Fn>
void run_loopback(int ranks, Fn&& fn) {
  detail::loopback::checked_size(ranks, "run_loopback");
  auto world = std::make_shared<loopback_world>(ranks);
  std::vector<std::exception_ptr> errors(ranks);
  std::vector<std::thread> threads;
  threads.reserve(ranks);
  for (int r = 0; r < ranks; ++r) {
    threads.emplace_back([&, r] {
      try {
        basic_communicator<Transport> comm(Transport(world, r));
        fn(comm);
      } catch (...) {
        errors[r] = std::current_exception();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
}

}  // namespace cohort
