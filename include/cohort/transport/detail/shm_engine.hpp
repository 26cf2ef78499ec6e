/// @file
/// The machinery behind `cohort::shm_transport`: per-peer queues of posted sends and
/// receives, the progress loop that moves them through the rings, the wait that spins, yields
/// and then sleeps on a futex, and the abort word every rank watches.
///
/// Progress is made only inside calls on the transport (no thread). A send is copied into the
/// ring as far as there is room when it is posted (up to one record) and then by every later
/// call; it completes once all its bytes are in the ring. Small records are published lazily,
/// at the next wait, so that a call header and a small payload reach the peer in one handoff
/// (one store of `head`, one cache line for the peer to fetch). The consumer returns space
/// lazily too, every eighth of the ring (and before it sleeps): a producer needs only a
/// record's room to go on, so it is never held up by that, and small calls cost one
/// publication instead of three. Every publication checks, after a full fence, whether the
/// peer sleeps, and wakes it only then: spinning peers cost no system call.
#pragma once

#include <atomic>
#include <cassert>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <span>
#include <string>
#include <system_error>
#include <vector>

#include <sched.h>

#include <cohort/core/detail/min.hpp>
#include <cohort/core/error.hpp>
#include <cohort/core/options.hpp>
#include <cohort/transport/detail/fifo.hpp>
#include <cohort/transport/detail/shm_ring.hpp>
#include <cohort/transport/detail/shm_segment.hpp>
#include <cohort/transport/detail/shm_sync.hpp>

namespace cohort::detail::shm {

/// Sends shorter than this are published at the next wait rather than at once, so that they
/// travel with what follows them (a call header with its first data).
inline constexpr std::size_t pack_bytes = 2048;
/// Receives at least this long are copied out of the ring with non-temporal stores: a buffer
/// that large leaves the caches anyway, and skipping the read-for-ownership of every line
/// made the all-gather half of a 64 MiB all_reduce about 1 ms faster (of 18) here.
inline constexpr std::size_t stream_receive_bytes = std::size_t{4} << 20;

/// What an engine is built with (checked by `shm_transport`).
struct settings {
  std::size_t ring_bytes;                 ///< Per ordered pair; a power of two.
  std::size_t record_bytes;               ///< Largest record payload; pipelining unit.
  std::size_t pack_bytes;                 ///< Sends shorter than this wait for the next wait.
  std::size_t stream_bytes;               ///< Receives this long bypass the caches.
  std::chrono::nanoseconds spin;          ///< Busy polling before yielding.
  std::chrono::nanoseconds yield;         ///< Polling with `sched_yield` before sleeping.
  std::chrono::nanoseconds check_every;   ///< How often a waiting rank checks its peer lives.
  std::chrono::milliseconds connect_timeout;
};

/// A handle on a posted operation: complete once the stream with `peer` passed `end` bytes.
struct request {
  int peer = -1;  ///< -1: nothing pending.
  bool is_send = false;
  std::uint64_t end = 0;
};

/// Everything this rank keeps about one peer.
struct peer_link {
  struct pending_send {
    const std::byte* data;
    std::size_t size;
  };
  struct pending_recv {
    std::byte* data;
    std::size_t size;
    bool stream;  // large: copy in with non-temporal stores
  };
  tx_ring tx;  // this rank -> peer
  rx_ring rx;  // peer -> this rank
  fifo<pending_send> sends;
  fifo<pending_recv> recvs;
  std::uint64_t send_posted = 0, send_copied = 0;  // stream bytes to the peer
  std::uint64_t recv_posted = 0, recv_done = 0;    // stream bytes from the peer
  rank_slot* slot = nullptr;
  process_watch watch;
  bool dirty = false;  // listed in engine::dirty_
};

/// The number of CPUs this process may run on.
inline int usable_cpus() noexcept {
#if defined(__linux__)
  cpu_set_t set;
  if (::sched_getaffinity(0, sizeof set, &set) == 0) return CPU_COUNT(&set);
#endif
  long n = ::sysconf(_SC_NPROCESSORS_ONLN);
  return n > 0 ? static_cast<int>(n) : 1;
}

/// 1 + the CPU this thread runs on, or 0 where unknown (a memory read where the C library
/// keeps it in the restartable-sequences area).
inline std::uint32_t current_cpu() noexcept {
#if defined(__linux__)
  const int cpu = ::sched_getcpu();
  return cpu >= 0 ? static_cast<std::uint32_t>(cpu) + 1 : 0;
#else
  return 0;
#endif
}

/// One rank's end of a connected shm job.
class engine {
 public:
  /// Joins the job (see `join`); throws `cohort::error`.
  engine(const std::string& job, int rank, int size, const settings& s)
      : rank_(rank), size_(size), s_(s), links_(static_cast<std::size_t>(size)) {
    // Ranks outnumbering the cores: a spinning waiter would hold the core its peer needs, so
    // it yields after a few looks.
    if (size > usable_cpus()) {
      s_.spin = std::chrono::nanoseconds::zero();
      polls_ = 4;
    }
    if (size == 1) return;
    seg_ = join(job, rank, size, s.ring_bytes, s.connect_timeout);
    me_ = &seg_.slot(rank);
    const std::uint64_t ns = pid_namespace_id();
    for (int p = 0; p < size; ++p) {
      if (p == rank) continue;
      peer_link& l = links_[static_cast<std::size_t>(p)];
      l.tx = tx_ring(&seg_.ring(rank, p), seg_.ring_data(rank, p), s.ring_bytes, s.record_bytes);
      l.rx = rx_ring(&seg_.ring(p, rank), seg_.ring_data(p, rank), s.ring_bytes);
      l.slot = &seg_.slot(p);
      // A pid from another PID namespace names some other process here: do not watch it.
      if (ns != 0 && l.slot->pid_ns.load(std::memory_order_relaxed) == ns)
        l.watch = process_watch(l.slot->pid.load(std::memory_order_acquire));
    }
    dirty_.reserve(static_cast<std::size_t>(size));
  }

  engine(const engine&) = delete;
  engine& operator=(const engine&) = delete;

  /// Leaves: what was written is published, then peers waiting on this rank see it closed.
  /// The name is taken off again in case the rank that took it off died doing so (a no-op
  /// otherwise).
  ~engine() {
    if (!seg_.mapped()) return;
    flush(true);
    me_->state.store(slot_closed, std::memory_order_release);
    wake_all();
    seg_.unlink();
  }

  int rank() const noexcept { return rank_; }
  int size() const noexcept { return size_; }
  const std::string& name() const noexcept { return seg_.name(); }

  request send(int peer, std::span<const std::byte> bytes) {
    assert(peer >= 0 && peer < size_ && peer != rank_);
    if (bytes.empty()) return {};
    peer_link& l = link(peer);
    l.send_posted += bytes.size();
    std::size_t taken = 0;
    if (l.sends.empty()) {  // copy at once what fits, one record at most
      taken = l.tx.write(bytes.data(), detail::min_of(bytes.size(), s_.record_bytes));
      l.send_copied += taken;
      if (taken > 0) mark_dirty(peer);
      if (taken >= s_.pack_bytes) flush();
    }
    if (taken < bytes.size()) {
      l.sends.push_back({bytes.data() + taken, bytes.size() - taken});
      ++pending_sends_;
    }
    return {peer, true, l.send_posted};
  }

  request recv(int peer, std::span<std::byte> bytes) {
    assert(peer >= 0 && peer < size_ && peer != rank_);
    if (bytes.empty()) return {};
    peer_link& l = link(peer);
    l.recv_posted += bytes.size();
    l.recvs.push_back({bytes.data(), bytes.size(), bytes.size() >= s_.stream_bytes});
    ++pending_recvs_;
    return {peer, false, l.recv_posted};
  }

  void wait(request& r, deadline until, std::error_code& ec) {
    block_until([&] { return complete(r); }, r.peer, until, ec);
    if (!ec) r = {};
  }

  std::span<const std::byte> recv_view(int peer, std::size_t max, std::size_t align,
                                       deadline until, std::error_code& ec) {
    peer_link& l = link(peer);
    assert(l.recvs.empty() && align > 0 && max >= align);
    progress();  // keep this rank's sends flowing while it reduces
    std::span<const std::byte> view;
    block_until([&] { return !(view = l.rx.peek()).empty(); }, peer, until, ec);
    if (ec) return {};
    if (view.size() < align) {
      // Less than an element is left in the record, and a record never grows: the peer stopped
      // in the middle of an element (it died while its send was being copied in), or sent a
      // length that is not a multiple of `align`. Wait for what tells which: its end
      // (peer_lost), an abort, the deadline, or a record after this one (protocol_error).
      block_until([&] { return l.rx.followed(); }, peer, until, ec);
      if (!ec) ec = make_error_code(errc::protocol_error);
      return {};
    }
    return view.first(detail::min_of(view.size(), max) / align * align);
  }

  void recv_release(int peer, std::size_t n) {
    peer_link& l = link(peer);
    l.recv_posted += n;  // receives posted later complete after these bytes
    l.recv_done += n;
    l.rx.consume(n);
    if (l.rx.unpublished() >= rx_publish_bytes()) {
      mark_dirty(peer);
      flush();
    }
  }

  void abort(const failure& f) noexcept {
    if (!seg_.mapped()) return;
    control_block& c = seg_.control();
    std::uint32_t expected = 0;
    if (c.abort_state.compare_exchange_strong(expected, 1, std::memory_order_acq_rel)) {
      c.abort_rank = rank_;
      c.abort_value = f.code.value();
      c.abort_category = category_tag(f.code.category());
      const std::size_t n = detail::min_of(f.what.size(), failure_text_bytes);
      std::memcpy(c.abort_text, f.what.data(), n);
      c.abort_length = static_cast<std::uint32_t>(n);
      c.abort_state.store(2, std::memory_order_release);
    }
    wake_all();
  }

  const failure* remote_failure() const {
    if (!seg_.mapped() || seg_.control().abort_state.load(std::memory_order_acquire) == 0)
      return nullptr;
    const failure& f = shared_failure();
    return f.peer == rank_ ? nullptr : &f;
  }

 private:
  peer_link& link(int peer) noexcept { return links_[static_cast<std::size_t>(peer)]; }
  std::uint64_t rx_publish_bytes() const noexcept { return s_.ring_bytes / 8; }

  bool complete(const request& r) const noexcept {
    if (r.peer < 0) return true;
    const peer_link& l = links_[static_cast<std::size_t>(r.peer)];
    return (r.is_send ? l.send_copied : l.recv_done) >= r.end;
  }

  void mark_dirty(int peer) {
    peer_link& l = link(peer);
    if (!l.dirty) {
      l.dirty = true;
      dirty_.push_back(peer);
    }
  }

  // Publishes the ring positions that moved (all freed space when `all`, else only that past
  // the lazy threshold), then wakes the peers that sleep. The fence pairs with the one a
  // sleeper makes between raising `sleeping` and its last look.
  void flush(bool all = false) noexcept {
    if (all)
      for (int p = 0; p < size_; ++p)
        if (p != rank_ && link(p).rx.unpublished() > 0) mark_dirty(p);
    if (dirty_.empty()) return;
    for (int p : dirty_) {
      peer_link& l = link(p);
      if (l.tx.dirty()) l.tx.publish();
      if (l.rx.unpublished() >= (all ? 1 : rx_publish_bytes())) l.rx.publish();
    }
    full_fence();
    for (int p : dirty_) {
      peer_link& l = link(p);
      l.dirty = false;
      if (l.slot->sleeping.load(std::memory_order_relaxed) != 0) wake(*l.slot);
    }
    dirty_.clear();
  }

  static void wake(rank_slot& s) noexcept {
    s.wake.fetch_add(1, std::memory_order_release);
    futex_wake(s.wake);
  }
  void wake_all() noexcept {
    for (int p = 0; p < size_; ++p)
      if (p != rank_) wake(seg_.slot(p));
  }

  // Copies pending sends to `peer` into its ring, about `budget` bytes; true if any moved.
  bool push(int peer, std::size_t budget) {
    peer_link& l = link(peer);
    std::size_t moved = 0;
    while (!l.sends.empty() && moved < budget) {
      auto& s = l.sends.front();
      const std::size_t k = l.tx.write(s.data, detail::min_of(s.size, budget - moved));
      if (k == 0) break;
      s.data += k;
      s.size -= k;
      l.send_copied += k;
      moved += k;
      if (s.size == 0) {
        l.sends.pop_front();
        --pending_sends_;
      }
    }
    if (moved > 0) mark_dirty(peer);
    return moved > 0;
  }

  // Copies what `peer` sent into the receives posted for it, about `budget` bytes.
  bool deliver(int peer, std::size_t budget) {
    peer_link& l = link(peer);
    std::size_t moved = 0;
    while (!l.recvs.empty() && moved < budget) {
      const auto v = l.rx.peek();
      if (v.empty()) break;
      auto& r = l.recvs.front();
      const std::size_t k = detail::min_of(v.size(), r.size);
      if (r.stream) stream_copy(r.data, v.data(), k);
      else std::memcpy(r.data, v.data(), k);
      l.rx.consume(k);
      r.data += k;
      r.size -= k;
      l.recv_done += k;
      moved += k;
      if (r.size == 0) {
        l.recvs.pop_front();
        --pending_recvs_;
      }
    }
    if (l.rx.unpublished() >= rx_publish_bytes()) mark_dirty(peer);
    return moved > 0;
  }

  // One pass over every pending operation, a record's worth per peer and direction so that
  // sending and receiving interleave finely; true if anything moved.
  bool progress() {
    bool moved = false;
    if (pending_sends_ > 0)
      for (int p = 0; p < size_; ++p)
        if (!link(p).sends.empty()) moved |= push(p, s_.record_bytes);
    if (pending_recvs_ > 0)
      for (int p = 0; p < size_; ++p)
        if (!link(p).recvs.empty()) moved |= deliver(p, s_.record_bytes);
    flush();
    return moved;
  }

  // The failure some rank wrote into the segment (call once abort_state != 0).
  const failure& shared_failure() const {
    if (failure_) return *failure_;
    const control_block& c = seg_.control();
    // The writer is between its two stores for a few instructions, unless it died there.
    for (int i = 0; i < 10'000 && c.abort_state.load(std::memory_order_acquire) != 2; ++i)
      sched_yield();
    if (c.abort_state.load(std::memory_order_acquire) == 2)
      failure_ = failure{code_from_tag(c.abort_category, c.abort_value), c.abort_rank,
                         std::string(c.abort_text, c.abort_length)};
    else
      failure_ = failure{make_error_code(errc::aborted), -1, "a rank aborted and died saying why"};
    return *failure_;
  }

  // True when the wait must end with `ec`: an abort, or `peer` gone with nothing left to read.
  template <class Done>
  bool failed(int peer, Done& done, bool peer_dead, std::error_code& ec) {
    if (seg_.control().abort_state.load(std::memory_order_acquire) != 0) {
      const failure& f = shared_failure();
      ec = f.peer == rank_ ? make_error_code(errc::aborted) : f.code;
      return true;
    }
    if (peer < 0) return false;
    if (!peer_dead && link(peer).slot->state.load(std::memory_order_acquire) != slot_closed)
      return false;
    while (progress())  // take what it left
      if (done()) return false;
    if (done()) return false;
    ec = make_error_code(errc::peer_lost);
    return true;
  }

  // Progresses until done(), a failure, or the deadline. Waiting: busy polls for `spin` (not
  // at all when `peer` last waited on this rank's CPU), then polls with sched_yield for
  // `yield`, then sleeps on this rank's futex word, checking `peer`'s process every
  // `check_every`.
  template <class Done>
  void block_until(Done&& done, int peer, deadline until, std::error_code& ec) {
    ec.clear();
    flush();
    if (done()) return;
    const std::uint32_t polls_before_clock = polls_;
    std::uint32_t idle = 0;
    clock::time_point idle_since{}, next_check{};
    std::chrono::nanoseconds spin = s_.spin;
    for (;;) {
      const bool moved = progress();
      if (done() || failed(peer, done, false, ec)) return;
      if (moved) {
        idle = 0;
        continue;
      }
      if (++idle < polls_before_clock) {
        if (idle > polls_before_clock / 2) cpu_relax();  // the first polls answer fastest bare
        continue;
      }
      const auto now = clock::now();
      if (idle == polls_before_clock) {
        idle_since = now;
        next_check = now + s_.check_every;
        // Where this rank waits, for its peers to see; and whether the peer it waits on last
        // waited on this same CPU: then it cannot run while this rank spins (the neighbours'
        // work or a shared core put both here), so the core is yielded at once.
        const std::uint32_t cpu = current_cpu();
        if (me_ != nullptr && me_->cpu.load(std::memory_order_relaxed) != cpu)
          me_->cpu.store(cpu, std::memory_order_relaxed);
        spin = cpu != 0 && peer >= 0 &&
                       link(peer).slot->cpu.load(std::memory_order_relaxed) == cpu
                   ? std::chrono::nanoseconds::zero()
                   : s_.spin;
      }
      if (now >= until) {
        if (progress(), done()) return;
        ec = make_error_code(errc::timed_out);
        return;
      }
      if (now >= next_check) {
        next_check = now + s_.check_every;
        if (peer >= 0 && !link(peer).watch.alive() && failed(peer, done, true, ec)) return;
      }
      const auto idle_for = now - idle_since;
      if (idle_for < spin) {
        for (int i = 0; i < 16; ++i) cpu_relax();
      } else if (idle_for < spin + s_.yield) {
        sched_yield();
      } else {
        // Raise the flag, fence, then look once more: a peer publishing after our look sees
        // the flag (the fences order the two) and wakes us; one publishing before is seen.
        flush(true);
        me_->sleeping.store(1, std::memory_order_relaxed);
        full_fence();
        const std::uint32_t seen = me_->wake.load(std::memory_order_acquire);
        const bool news = progress();
        if (!news && !done() && !failed(peer, done, false, ec) && !done())
          futex_wait(me_->wake, seen, detail::min_of(until, next_check) - now);
        me_->sleeping.store(0, std::memory_order_relaxed);
        if (ec) return;
      }
      if (idle > (1u << 30)) idle = polls_before_clock + 1;  // never wraps back to 0
    }
  }

  int rank_, size_;
  settings s_;
  std::uint32_t polls_ = 64;  // idle looks before the clock is read and the waiting phases begin
  segment seg_;
  rank_slot* me_ = nullptr;
  std::vector<peer_link> links_;
  std::vector<int> dirty_;  // peers whose ring positions moved since the last flush
  std::size_t pending_sends_ = 0, pending_recvs_ = 0;
  mutable std::optional<failure> failure_;  // the shared failure, once read
};

}  // namespace cohort::detail::shm
