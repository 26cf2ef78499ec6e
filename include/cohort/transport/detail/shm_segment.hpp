/// @file
/// The shared segment of one shm job: its layout, and how the ranks of a job find it, map it
/// and take it off the file system again.
///
/// One POSIX shared-memory object per job, named "/cohort-<job id>" (/dev/shm/cohort-<job id>
/// on Linux):
///
///     control block    ready word, shape, join counters, the abort word and message
///     rank slots       per rank: pid, state, futex word, sleeping flag
///     ring controls    per ordered pair (from, to): head and tail
///     ring data        per ordered pair: `ring_bytes` bytes of records
///
/// Joining: every rank tries `shm_open(O_CREAT | O_EXCL)`; the one that wins sizes the object
/// and initializes it, then stores the ready word; the others open it, wait for the size and
/// the ready word. Each rank claims its slot (compare-and-swap of its pid) and counts itself
/// in; the last one unlinks the name and wakes the others. So the name exists only while a job
/// is connecting: after that, a crash leaves nothing in /dev/shm. A segment left by a job that
/// died while connecting (a claimed slot whose process is gone) is unlinked and the join starts
/// over. Memory of rings no one writes is never touched, so never allocated.
#pragma once

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <new>
#include <string>
#include <string_view>
#include <system_error>
#include <thread>
#include <utility>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cohort/core/error.hpp>
#include <cohort/core/options.hpp>
#include <cohort/transport/detail/shm_ring.hpp>
#include <cohort/transport/detail/shm_sync.hpp>

namespace cohort::detail::shm {

inline constexpr std::uint32_t segment_magic = 0x314d5343;  // "CSM1"
inline constexpr std::uint32_t layout_version = 1;
inline constexpr std::size_t page = 4096;
/// The longest abort message kept; longer ones are cut.
inline constexpr std::size_t failure_text_bytes = 1024;

/// What a rank slot says about its rank.
enum slot_state : std::uint32_t { slot_free = 0, slot_joined = 1, slot_closed = 2 };

/// The segment's first page.
struct control_block {
  word ready;  ///< `segment_magic` once the creator has initialized the segment.
  std::uint32_t version;
  std::int32_t size;
  std::atomic<std::int32_t> creator_pid;  ///< Written first, so that a dead creator shows.
  std::uint64_t ring_bytes;
  std::uint64_t total_bytes;
  alignas(128) word joined;  ///< Ranks that claimed their slot.
  word unlinked;             ///< 1 once someone took the name off (exactly one does).
  word connected;            ///< 1 once every rank joined; futex word for the join wait.
  alignas(128) word abort_state;  ///< 0: none; 1: being written; 2: written.
  std::int32_t abort_rank;        ///< The rank that aborted.
  std::int32_t abort_value;       ///< The error code's value ...
  std::uint32_t abort_category;   ///< ... and its category (`category_tag`).
  std::uint32_t abort_length;     ///< Bytes of `abort_text`.
  char abort_text[failure_text_bytes];
};
static_assert(sizeof(control_block) <= page);

/// One rank's line: who it is, whether it is there, and how to wake it.
struct alignas(128) rank_slot {
  std::atomic<std::int32_t> pid;       ///< 0 until claimed.
  word state;                          ///< `slot_state`.
  word wake;                           ///< Futex word: bumped by whoever has news for the rank.
  word sleeping;                       ///< 1 while the rank sleeps (or is about to) on `wake`.
  std::atomic<std::uint64_t> pid_ns;   ///< Its PID namespace (`pid_namespace_id`).
};

/// Where everything lies in a segment for `size` ranks and `ring_bytes` per ring.
struct layout {
  layout(int size, std::size_t ring_bytes) noexcept
      : size(size), ring_bytes(ring_bytes),
        slots(page),
        rings(slots + round_up(sizeof(rank_slot) * static_cast<std::size_t>(size), page)),
        data(rings + round_up(sizeof(ring_control) * pairs(), page)),
        total(data + ring_bytes * pairs()) {}

  std::size_t pairs() const noexcept {
    return static_cast<std::size_t>(size) * static_cast<std::size_t>(size - 1);
  }
  // Index of the ring from -> to (from != to).
  std::size_t pair(int from, int to) const noexcept {
    return static_cast<std::size_t>(from) * static_cast<std::size_t>(size - 1) +
           static_cast<std::size_t>(to < from ? to : to - 1);
  }

  int size;
  std::size_t ring_bytes, slots, rings, data, total;
};

/// Encodes an error category for another process: ours, generic, system; others read back
/// as `errc::aborted`.
inline std::uint32_t category_tag(const std::error_category& c) noexcept {
  if (c == error_category()) return 0;
  if (c == std::generic_category()) return 1;
  if (c == std::system_category()) return 2;
  return 3;
}
inline std::error_code code_from_tag(std::uint32_t tag, int value) noexcept {
  switch (tag) {
    case 0: return {value, error_category()};
    case 1: return {value, std::generic_category()};
    case 2: return {value, std::system_category()};
    default: return make_error_code(errc::aborted);
  }
}

/// A mapped segment of one job (move-only; unmaps on destruction).
class segment {
 public:
  segment() = default;
  segment(std::string name, int size, std::size_t ring_bytes) : name_(std::move(name)),
      layout_(size, ring_bytes) {}
  segment(segment&& o) noexcept
      : name_(std::move(o.name_)), layout_(o.layout_), base_(std::exchange(o.base_, nullptr)) {}
  segment& operator=(segment&& o) noexcept {
    std::swap(name_, o.name_);
    std::swap(layout_, o.layout_);
    std::swap(base_, o.base_);
    return *this;
  }
  ~segment() {
    if (base_ != nullptr) ::munmap(base_, layout_.total);
  }

  /// The shared-memory object's name, "/cohort-<job id>".
  const std::string& name() const noexcept { return name_; }
  const struct layout& shape() const noexcept { return layout_; }
  bool mapped() const noexcept { return base_ != nullptr; }

  control_block& control() const noexcept {
    return *std::launder(reinterpret_cast<control_block*>(base_));
  }
  rank_slot& slot(int r) const noexcept {
    return std::launder(reinterpret_cast<rank_slot*>(base_ + layout_.slots))[r];
  }
  ring_control& ring(int from, int to) const noexcept {
    return std::launder(reinterpret_cast<ring_control*>(base_ + layout_.rings))[layout_.pair(from, to)];
  }
  std::byte* ring_data(int from, int to) const noexcept {
    return base_ + layout_.data + layout_.ring_bytes * layout_.pair(from, to);
  }

  /// Takes the name off the file system, once per segment whoever asks (the first caller
  /// does it); later callers, and names that are already gone, are fine.
  void unlink() const noexcept {
    std::uint32_t expected = 0;
    if (control().unlinked.compare_exchange_strong(expected, 1, std::memory_order_acq_rel))
      ::shm_unlink(name_.c_str());
  }

  /// Maps `fd` (the object, already sized); false with errno set on failure.
  bool map(int fd) noexcept {
    void* p = ::mmap(nullptr, layout_.total, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) return false;
    base_ = static_cast<std::byte*>(p);
    return true;
  }

  /// The creator's part: builds the control block, slots and ring controls in the fresh
  /// (zero-filled) object, then stores the ready word.
  void initialize() noexcept {
    auto* c = std::construct_at(reinterpret_cast<control_block*>(base_));
    c->creator_pid.store(static_cast<std::int32_t>(::getpid()), std::memory_order_relaxed);
    c->version = layout_version;
    c->size = layout_.size;
    c->ring_bytes = layout_.ring_bytes;
    c->total_bytes = layout_.total;
    for (int r = 0; r < layout_.size; ++r)
      std::construct_at(reinterpret_cast<rank_slot*>(base_ + layout_.slots) + r);
    for (std::size_t i = 0; i < layout_.pairs(); ++i)
      std::construct_at(reinterpret_cast<ring_control*>(base_ + layout_.rings) + i)
          ->inline_start.store(ring_control::no_inline, std::memory_order_relaxed);
    c->ready.store(segment_magic, std::memory_order_release);
  }

 private:
  std::string name_;
  struct layout layout_ {1, 0};
  std::byte* base_ = nullptr;
};

/// Builds the exception the constructor of `shm_transport` throws.
inline error connect_error(std::error_code code, int peer, const std::string& job,
                           const std::string& what) {
  return error(code, "shm_transport", peer, "shm_transport (job \"" + job + "\"): " + what);
}
inline error connect_error(errc code, int peer, const std::string& job, const std::string& what) {
  return connect_error(make_error_code(code), peer, job, what);
}
inline error system_connect_error(const char* call, const std::string& name, const std::string& job) {
  const int e = errno;
  return connect_error(std::error_code(e, std::system_category()), -1, job,
                       std::string(call) + "(" + name + ") failed: " + std::strerror(e));
}

/// What happened to one attempt at joining.
enum class join_result { joined, retry };

/// One attempt: opens or creates the object, maps it, claims the slot of `rank` and waits for
/// every rank. Returns `retry` when a stale segment was found (and unlinked) or the name
/// vanished; throws `cohort::error` otherwise.
inline join_result try_join(segment& seg, const std::string& job, int rank, int size,
                            deadline until) {
  using namespace std::chrono_literals;
  const std::string& name = seg.name();
  const auto& shape = seg.shape();
  bool created = false;
  int fd = ::shm_open(name.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd >= 0) {
    created = true;
    if (::ftruncate(fd, static_cast<off_t>(shape.total)) != 0) {
      auto e = system_connect_error("ftruncate", name, job);
      ::close(fd);
      ::shm_unlink(name.c_str());
      throw e;
    }
  } else if (errno == EEXIST) {
    fd = ::shm_open(name.c_str(), O_RDWR | O_CLOEXEC, 0);
    if (fd < 0 && errno == ENOENT) return join_result::retry;  // unlinked meanwhile
    if (fd < 0) throw system_connect_error("shm_open", name, job);
    for (;;) {  // the creator sizes the object right after creating it
      struct stat st {};
      if (::fstat(fd, &st) != 0) {
        auto e = system_connect_error("fstat", name, job);
        ::close(fd);
        throw e;
      }
      if (static_cast<std::size_t>(st.st_size) == shape.total) break;
      if (st.st_size != 0) {
        ::close(fd);
        throw connect_error(errc::invalid_argument, -1, job,
                            name + " has " + std::to_string(st.st_size) + " bytes where " +
                                std::to_string(size) + " ranks need " +
                                std::to_string(shape.total) +
                                ": do all ranks pass the same size and ring_bytes? (if no job "
                                "of this id runs, remove /dev/shm" + name + ")");
      }
      if (clock::now() >= until) {
        ::close(fd);
        throw connect_error(errc::timed_out, -1, job, name + " was created but never sized");
      }
      std::this_thread::sleep_for(100us);
    }
  } else {
    throw system_connect_error("shm_open", name, job);
  }
  if (!seg.map(fd)) {
    auto e = system_connect_error("mmap", name, job);
    ::close(fd);
    if (created) ::shm_unlink(name.c_str());
    throw e;
  }
  ::close(fd);

  control_block& c = seg.control();
  if (created) {
    seg.initialize();
  } else {
    while (c.ready.load(std::memory_order_acquire) != segment_magic) {
      const std::int32_t creator = c.creator_pid.load(std::memory_order_relaxed);
      if (creator != 0 && !process_alive(creator)) {  // left by a job that died connecting
        seg.unlink();
        return join_result::retry;
      }
      if (clock::now() >= until)
        throw connect_error(errc::timed_out, -1, job, "the creator of " + name + " never finished");
      std::this_thread::sleep_for(100us);
    }
    if (c.version != layout_version || c.size != size || c.ring_bytes != shape.ring_bytes)
      throw connect_error(errc::invalid_argument, -1, job,
                          name + " was made for " + std::to_string(c.size) + " ranks with " +
                              std::to_string(c.ring_bytes) + "-byte rings (layout " +
                              std::to_string(c.version) + "), this rank asks for " +
                              std::to_string(size) + " with " + std::to_string(shape.ring_bytes));
  }

  rank_slot& mine = seg.slot(rank);
  std::int32_t owner = 0;
  const auto self = static_cast<std::int32_t>(::getpid());
  if (!mine.pid.compare_exchange_strong(owner, self, std::memory_order_acq_rel)) {
    if (owner == self || process_alive(owner))
      throw connect_error(errc::invalid_argument, rank, job,
                          "rank " + std::to_string(rank) + " is already taken by process " +
                              std::to_string(owner));
    seg.unlink();  // a stale segment: its rank died before the job connected
    return join_result::retry;
  }
  mine.pid_ns.store(pid_namespace_id(), std::memory_order_relaxed);
  mine.state.store(slot_joined, std::memory_order_release);

  // A joined rank that died means a stale segment or a crash, and one that left means it found
  // so: start over (a crashed rank then shows as missing at the deadline).
  const auto someone_gone = [&] {
    for (int r = 0; r < size; ++r) {
      const rank_slot& s = seg.slot(r);
      const std::int32_t pid = s.pid.load(std::memory_order_acquire);
      if (r != rank && pid != 0 &&
          (s.state.load(std::memory_order_acquire) == slot_closed || !process_alive(pid)))
        return true;
    }
    return false;
  };
  const auto leave = [&] {
    mine.state.store(slot_closed, std::memory_order_release);
    seg.unlink();
    futex_wake(c.connected);  // waiters look at the slots again
    return join_result::retry;
  };
  if (c.joined.fetch_add(1, std::memory_order_acq_rel) + 1 == static_cast<std::uint32_t>(size)) {
    if (someone_gone()) return leave();
    seg.unlink();  // every rank has it mapped: the name is no longer needed
    c.connected.store(1, std::memory_order_release);
    futex_wake(c.connected);
    return join_result::joined;
  }

  for (;;) {
    if (c.connected.load(std::memory_order_acquire) != 0) return join_result::joined;
    const auto now = clock::now();
    if (someone_gone()) return leave();
    if (now >= until) {
      mine.state.store(slot_closed, std::memory_order_release);
      seg.unlink();  // nothing stays behind in /dev/shm
      std::string missing;
      int count = 0;
      for (int r = 0; r < size; ++r) {
        if (seg.slot(r).pid.load(std::memory_order_acquire) != 0) continue;
        missing += (count++ ? ", " : "") + std::to_string(r);
      }
      throw connect_error(errc::timed_out, -1, job,
                          "timed out waiting for rank" + std::string(count == 1 ? " " : "s ") +
                              missing + " of " + std::to_string(size) + " to join");
    }
    futex_wait(c.connected, 0, std::min<std::chrono::nanoseconds>(until - now, 50ms));
  }
}

/// Joins the job `job` as `rank` of `size`: returns the mapped segment once every rank has
/// mapped it (and its name is gone). Throws `cohort::error`: `errc::timed_out` naming the
/// ranks that never came, `errc::invalid_argument` for a taken rank or a segment of another
/// shape, a system error code when the system refuses.
inline segment join(const std::string& job, int rank, int size, std::size_t ring_bytes,
                    std::chrono::milliseconds timeout) {
  const deadline until = clock::now() + timeout;
  for (;;) {
    segment seg("/cohort-" + job, size, ring_bytes);
    if (try_join(seg, job, rank, size, until) == join_result::joined) return seg;
    if (clock::now() >= until)
      throw connect_error(errc::timed_out, -1, job, "found only stale segments until the deadline");
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

}  // namespace cohort::detail::shm
