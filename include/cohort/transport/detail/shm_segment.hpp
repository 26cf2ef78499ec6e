/// @file
/// The shared segment of one shm job: its layout, and how the ranks of a job find it, map it
/// and take it off the file system again.
///
/// One POSIX shared-memory object per job, named "/cohort-<job id>" (/dev/shm/cohort-<job id>
/// on Linux):
///
///     control block    ready word, shape, join counters, the join's outcome, the abort word
///     rank slots       per rank: pid, state, futex word, sleeping flag
///     ring controls    per ordered pair (from, to): head and tail
///     ring data        per ordered pair: `ring_bytes` bytes of records
///
/// Joining: every rank tries `shm_open(O_CREAT | O_EXCL)` with mode 0600; the one that wins
/// locks the object (`flock`), sizes and initializes it, stores the ready word and lets the
/// lock go; the others open it, refuse it unless it is their own user's with mode 0600 (another
/// user who made it first could read and change the job's data: see `trusted`), and wait for
/// the ready word. Each rank claims its slot (compare-and-swap of its pid)
/// and counts itself in; the last one decides that the job connected, unlinks the name and
/// wakes the others. So the name exists only while a job is connecting: after that, a crash
/// leaves nothing in /dev/shm.
///
/// Stale segments. A segment that is not ready while nobody holds its lock was left by a
/// creator that died before it finished (the kernel drops the lock of a dead process): the
/// rank that takes the lock unlinks it and the join starts over. A segment with a claimed slot
/// whose process is gone (or that left) was left by a job that died while connecting: it is
/// abandoned, unlinked, and the join starts over. Connected or abandoned is decided once, by a
/// compare-and-swap on one word (`outcome`), so that every rank of a segment agrees on it: a
/// rank that sees a peer gone after the job connected stays, and meets the loss at its first
/// call. Memory of rings no one writes is never touched, so never allocated.
#pragma once

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <new>
#include <string>
#include <string_view>
#include <system_error>
#include <thread>
#include <utility>

#include <fcntl.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cohort/core/detail/min.hpp>
#include <cohort/core/error.hpp>
#include <cohort/core/options.hpp>
#include <cohort/transport/detail/shm_ring.hpp>
#include <cohort/transport/detail/shm_sync.hpp>

namespace cohort::detail::shm {

inline constexpr std::uint32_t segment_magic = 0x314d5343;  // "CSM1"
inline constexpr std::uint32_t layout_version = 3;
inline constexpr std::size_t page = 4096;
/// The longest abort message kept; longer ones are cut.
inline constexpr std::size_t failure_text_bytes = 1024;

/// Values of `control_block::outcome`: still connecting, every rank joined, or given up
/// (`join_abandoned` + the rank found gone; + size where none was, at a deadline).
inline constexpr std::uint32_t join_open = 0, join_connected = 1, join_abandoned = 2;
/// `control_block::outcome` when a rank found the segment made for another shape than its own
/// (`disagree_rank`, `disagree_size` and `disagree_ring` say what it asked for): every rank
/// fails at once, saying who disagrees.
inline constexpr std::uint32_t join_disagreed = 0x80000000u;
/// `control_block::unlinked` once the name is off the file system.
inline constexpr std::uint32_t unlink_done = ~std::uint32_t{0};

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
  word unlinked;             ///< The pid of the rank taking the name off, `unlink_done` after.
  word outcome;              ///< `join_open`, `join_connected` or `join_abandoned` + rank;
                             ///< set once (compare-and-swap); futex word for the join wait.
  std::int32_t disagree_rank;     ///< `join_disagreed`: the rank that asked for another shape,
  std::int32_t disagree_size;     ///< the number of ranks it says the job has,
  std::uint64_t disagree_ring;    ///< and its `ring_bytes`; written before `outcome`.
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
  /// 1 + the CPU the rank ran on when it last began to wait (0: unknown); on a line of its
  /// own, as it changes while the rest is read.
  alignas(64) word cpu;
};
static_assert(sizeof(rank_slot) == 128);

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
      : name_(std::move(o.name_)), layout_(o.layout_), base_(std::exchange(o.base_, nullptr)),
        dev_(o.dev_), ino_(o.ino_) {}
  segment& operator=(segment&& o) noexcept {
    std::swap(name_, o.name_);
    std::swap(layout_, o.layout_);
    std::swap(base_, o.base_);
    std::swap(dev_, o.dev_);
    std::swap(ino_, o.ino_);
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
  /// does it); later callers, and names that are already gone, are fine. A caller that died
  /// between claiming the task and doing it is taken over from by the next caller: until the
  /// task is done, the name is this segment's (nobody else takes off the name of a ready one).
  void unlink() const noexcept {
    word& u = control().unlinked;
    const auto self = static_cast<std::uint32_t>(::getpid());
    std::uint32_t seen = u.load(std::memory_order_acquire);
    for (;;) {
      if (seen == unlink_done || seen == self) return;
      if (seen != 0 && process_alive(static_cast<pid_t>(seen))) return;  // at it now
      if (u.compare_exchange_weak(seen, self, std::memory_order_acq_rel)) break;
    }
    // Taking over: the one that died may have got as far as the unlink, and the name may
    // belong to a new job's object by now.
    if (seen == 0 || names_this()) ::shm_unlink(name_.c_str());
    u.store(unlink_done, std::memory_order_release);
  }

  /// Remembers which object `fd` is, for `unlink`.
  void identify(int fd) noexcept {
    struct stat st {};
    if (::fstat(fd, &st) == 0) {
      dev_ = st.st_dev;
      ino_ = st.st_ino;
    }
  }

  /// True when the name still refers to this segment's object.
  bool names_this() const noexcept {
    const int fd = ::shm_open(name_.c_str(), O_RDONLY | O_CLOEXEC, 0);
    if (fd < 0) return false;
    struct stat st {};
    const bool same = ::fstat(fd, &st) == 0 && st.st_dev == dev_ && st.st_ino == ino_;
    ::close(fd);
    return same;
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
  dev_t dev_ = 0;  // the object (`identify`)
  ino_t ino_ = 0;
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

/// Why the last attempt started over, for the error at the deadline.
struct stale_note {
  int rank = -1;     ///< The rank found gone, -1 where none is known.
  std::string what;  ///< What was found: "rank 2 (process 4711) died while the job connected".
};

/// "rank 1 says the job has 3 ranks, this rank says 2" (or the same of ring_bytes).
inline std::string disagreement(int rank, int size, std::uint64_t ring, int my_size,
                                std::uint64_t my_ring) {
  if (size != my_size)
    return "rank " + std::to_string(rank) + " says the job has " + std::to_string(size) +
           " ranks, this rank says " + std::to_string(my_size);
  return "rank " + std::to_string(rank) + " uses ring_bytes " + std::to_string(ring) +
         ", this rank " + std::to_string(my_ring) + ": every rank must pass the same shm_options";
}

/// Tells the ranks waiting in the segment open as `fd` that `rank` asks for `size` ranks with
/// `ring` bytes per ring, which is not the segment's shape, so that they fail at once instead
/// of at their deadline. Maps only the control block; waits (briefly) for the creator to finish.
/// Returns the number of ranks the segment was made for, or 0 where it could not be read.
inline int tell_disagreement(int fd, int rank, int size, std::uint64_t ring, deadline until) {
  void* p = ::mmap(nullptr, page, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) return 0;
  auto* c = std::launder(reinterpret_cast<control_block*>(p));
  const deadline limit = detail::min_of(until, deadline_after(std::chrono::seconds(1)));
  while (c->ready.load(std::memory_order_acquire) != segment_magic && clock::now() < limit)
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  if (c->ready.load(std::memory_order_acquire) == segment_magic &&
      c->outcome.load(std::memory_order_acquire) == join_open) {
    c->disagree_rank = rank;
    c->disagree_size = size;
    c->disagree_ring = ring;
    std::uint32_t open = join_open;
    if (c->outcome.compare_exchange_strong(open, join_disagreed, std::memory_order_acq_rel))
      futex_wake(c->outcome);
  }
  const int made_for =
      c->ready.load(std::memory_order_acquire) == segment_magic ? c->size : 0;
  ::munmap(p, page);
  return made_for;
}

/// Takes the creator's lock (`flock`, exclusive) on the object open as `fd` unless another open
/// of it holds it. Returns 1 when taken, 0 when held elsewhere, -1 where the file system has
/// no such locks. A lock belongs to the open file description, and the kernel drops it when
/// the process holding it dies.
inline int try_lock(int fd) noexcept {
  while (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    if (errno == EINTR) continue;
    return errno == EWOULDBLOCK ? 0 : -1;
  }
  return 1;
}

/// Where the object named `name` shows on the file system (Linux): "/dev/shm/cohort-<job>".
inline std::string object_path(const std::string& name) { return "/dev/shm" + name; }

/// True when the object open as `fd` can only have been made by a rank of this job: a regular
/// object of this process's effective user that no other user may open (mode 0600 or
/// narrower), as every creator makes it. Ranks of one job run as one user; another user could
/// only have made the object to take the job over (the job id is predictable) and keeps it
/// writable. Otherwise `why` says what was found.
inline bool trusted(int fd, const std::string& name, std::string& why) {
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    why = "cannot fstat the shared-memory object: " + std::string(std::strerror(errno));
    return false;
  }
  const uid_t self = ::geteuid();
  if (S_ISREG(st.st_mode) && st.st_uid == self && (st.st_mode & 077) == 0) return true;
  char mode[8];
  std::snprintf(mode, sizeof mode, "%04o", static_cast<unsigned>(st.st_mode & 07777));
  why = "refusing " + object_path(name) + ", which belongs to uid " + std::to_string(st.st_uid) + " with mode " +
         mode + "; this rank runs as uid " + std::to_string(self) +
         " and a rank of this job makes it with mode 0600. Another user may have made it to "
         "take the job over: do not join it. Remove it (if no job of this id runs) or pick "
         "another job id";
  return false;
}

/// One attempt: opens or creates the object, maps it, claims the slot of `rank` and waits for
/// every rank. Returns `retry` when a stale segment was found (and unlinked), the job was given
/// up (`note` says why) or the name vanished; throws `cohort::error` otherwise.
inline join_result try_join(segment& seg, const std::string& job, int rank, int size,
                            deadline until, stale_note& note) {
  using namespace std::chrono_literals;
  const std::string& name = seg.name();
  const auto& shape = seg.shape();
  int fd = ::shm_open(name.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd >= 0) {
    // The lock is held until the ready word is stored. A joiner that opened the object before
    // it was taken may have found it unlocked and unfinished, and taken it for stale (it holds
    // the lock, or it has unlinked the name already): start over then, leaving the name to it.
    const int lock = try_lock(fd);
    struct stat st {};
    if (lock == 0 || (lock == 1 && ::fstat(fd, &st) == 0 && st.st_nlink == 0)) {
      ::close(fd);
      return join_result::retry;
    }
    const bool sized = ::ftruncate(fd, static_cast<off_t>(shape.total)) == 0;
    if (!sized || !seg.map(fd)) {
      auto e = system_connect_error(sized ? "mmap" : "ftruncate", name, job);
      ::shm_unlink(name.c_str());
      ::close(fd);
      throw e;
    }
    seg.initialize();
    seg.identify(fd);
    ::close(fd);  // lets the lock go
  } else if (errno == EEXIST) {
    fd = ::shm_open(name.c_str(), O_RDWR | O_NOFOLLOW | O_CLOEXEC, 0);
    if (fd < 0 && errno == ENOENT) return join_result::retry;  // unlinked meanwhile
    if (fd < 0) throw system_connect_error("shm_open", name, job);
    // Before anything of it is read or mapped: an object a rank of this job did not make is
    // refused, lest another user who guessed the job id (and made it first) see and change
    // what the ranks send.
    if (std::string why; !trusted(fd, name, why)) {
      ::close(fd);
      throw connect_error(std::make_error_code(std::errc::permission_denied), -1, job, why);
    }
    // Wait for the creator to size and initialize it. The lock is tried first, so that what is
    // seen while holding it cannot change any more: not ready then means the creator died.
    for (;;) {
      const int lock = try_lock(fd);
      struct stat st {};
      if (::fstat(fd, &st) != 0) {
        auto e = system_connect_error("fstat", name, job);
        ::close(fd);
        throw e;
      }
      const auto bytes = static_cast<std::size_t>(st.st_size);
      if (bytes != 0 && bytes != shape.total) {
        const int theirs = tell_disagreement(fd, rank, size, shape.ring_bytes, until);
        ::close(fd);
        if (theirs > 0 && theirs != size)
          throw connect_error(errc::invalid_argument, -1, job,
                              "the ranks that made " + name + " say the job has " +
                                  std::to_string(theirs) + " ranks, this rank (rank " +
                                  std::to_string(rank) + ") says " + std::to_string(size));
        throw connect_error(errc::invalid_argument, -1, job,
                            name + " has " + std::to_string(st.st_size) + " bytes where " +
                                std::to_string(size) + " ranks need " +
                                std::to_string(shape.total) +
                                ": do all ranks pass the same size and ring_bytes? (if no job "
                                "of this id runs, remove /dev/shm" + name + ")");
      }
      if (bytes == shape.total && !seg.mapped() && !seg.map(fd)) {
        auto e = system_connect_error("mmap", name, job);
        ::close(fd);
        throw e;
      }
      if (seg.mapped() && seg.control().ready.load(std::memory_order_acquire) == segment_magic)
        break;
      if (lock == 1) {  // unfinished, and nobody at work on it
        if (st.st_nlink > 0) ::shm_unlink(name.c_str());  // only lock holders unlink it now
        ::close(fd);
        note = {-1, name + " was left " + (bytes == 0 ? "unsized" : "uninitialized") +
                        " by a creator that died"};
        return join_result::retry;
      }
      if (lock < 0 && seg.mapped()) {  // no locks here: a dead creator shows by its pid
        const std::int32_t creator = seg.control().creator_pid.load(std::memory_order_relaxed);
        if (creator != 0 && !process_alive(creator)) {
          ::close(fd);
          seg.unlink();
          note = {-1, name + " was left uninitialized by a creator (process " +
                          std::to_string(creator) + ") that died"};
          return join_result::retry;
        }
      }
      if (clock::now() >= until) {
        ::close(fd);
        throw connect_error(errc::timed_out, -1, job,
                            name + " is still being " + (bytes == 0 ? "sized" : "initialized") +
                                " by its creator at the deadline");
      }
      std::this_thread::sleep_for(100us);
    }
    seg.identify(fd);
    ::close(fd);  // and the lock with it, if taken
  } else {
    throw system_connect_error("shm_open", name, job);
  }

  control_block& c = seg.control();
  if (c.version == layout_version && (c.size != size || c.ring_bytes != shape.ring_bytes)) {
    const int fd2 = ::shm_open(name.c_str(), O_RDWR | O_NOFOLLOW | O_CLOEXEC, 0);
    if (fd2 >= 0) {
      if (std::string why; trusted(fd2, name, why))
        tell_disagreement(fd2, rank, size, shape.ring_bytes, until);
      ::close(fd2);
    }
  }
  if (c.version != layout_version || c.size != size || c.ring_bytes != shape.ring_bytes)
    throw connect_error(errc::invalid_argument, -1, job,
                        name + " was made for " + std::to_string(c.size) + " ranks with " +
                            std::to_string(c.ring_bytes) + "-byte rings (layout " +
                            std::to_string(c.version) + "), this rank asks for " +
                            std::to_string(size) + " with " + std::to_string(shape.ring_bytes));

  // Decides the outcome of the join, unless another rank did first; true if this call did.
  const auto decide = [&](std::uint32_t outcome) {
    std::uint32_t open = join_open;
    if (!c.outcome.compare_exchange_strong(open, outcome, std::memory_order_acq_rel)) return false;
    futex_wake(c.outcome);
    return true;
  };
  const auto describe_gone = [&](int r) {
    const rank_slot& s = seg.slot(r);
    const std::int32_t pid = s.pid.load(std::memory_order_acquire);
    if (pid == 0) return "rank " + std::to_string(r) + " never joined";
    return "rank " + std::to_string(r) + " (process " + std::to_string(pid) + ") " +
           (s.state.load(std::memory_order_acquire) == slot_closed ? "left" : "died") +
           " while the job connected";
  };

  rank_slot& mine = seg.slot(rank);
  std::int32_t owner = 0;
  const auto self = static_cast<std::int32_t>(::getpid());
  if (!mine.pid.compare_exchange_strong(owner, self, std::memory_order_acq_rel)) {
    if (owner == self || process_alive(owner))
      throw connect_error(errc::invalid_argument, rank, job,
                          "rank " + std::to_string(rank) + " is already taken by process " +
                              std::to_string(owner));
    // A stale segment: its rank died before the job connected.
    decide(join_abandoned + static_cast<std::uint32_t>(rank));
    seg.unlink();
    note = {rank, describe_gone(rank)};
    return join_result::retry;
  }
  mine.pid_ns.store(pid_namespace_id(), std::memory_order_relaxed);
  mine.state.store(slot_joined, std::memory_order_release);

  // The first other rank whose process died or that left, or -1.
  const auto gone = [&] {
    for (int r = 0; r < size; ++r) {
      const rank_slot& s = seg.slot(r);
      const std::int32_t pid = s.pid.load(std::memory_order_acquire);
      if (r != rank && pid != 0 &&
          (s.state.load(std::memory_order_acquire) == slot_closed || !process_alive(pid)))
        return r;
    }
    return -1;
  };
  // The last rank to count itself in decides, unless a rank found gone decided first: a rank
  // that dies after this is met by the others at their first call, as any later death is.
  if (c.joined.fetch_add(1, std::memory_order_acq_rel) + 1 == static_cast<std::uint32_t>(size)) {
    const int r = gone();
    decide(r >= 0 ? join_abandoned + static_cast<std::uint32_t>(r) : join_connected);
  }

  for (;;) {
    const std::uint32_t outcome = c.outcome.load(std::memory_order_acquire);
    if (outcome == join_connected) {
      seg.unlink();  // every rank has it mapped: the name is no longer needed
      return join_result::joined;
    }
    if (outcome == join_disagreed) {  // a rank asked for another shape: nobody can go on
      mine.state.store(slot_closed, std::memory_order_release);
      seg.unlink();
      throw connect_error(errc::invalid_argument, c.disagree_rank, job,
                          disagreement(c.disagree_rank, c.disagree_size, c.disagree_ring, size,
                                       shape.ring_bytes) +
                              " (" + name + ")");
    }
    if (outcome != join_open) {  // given up: start over in a fresh segment
      mine.state.store(slot_closed, std::memory_order_release);
      seg.unlink();
      const auto r = static_cast<int>(outcome - join_abandoned);
      note = r < size ? stale_note{r, describe_gone(r)}
                      : stale_note{-1, "a rank reached its deadline"};
      return join_result::retry;
    }
    if (const int r = gone(); r >= 0) {
      decide(join_abandoned + static_cast<std::uint32_t>(r));
      continue;  // whatever was decided
    }
    const auto now = clock::now();
    if (now >= until) {
      std::string missing;
      int count = 0, first = -1;
      for (int r = 0; r < size; ++r) {
        if (seg.slot(r).pid.load(std::memory_order_acquire) != 0) continue;
        missing += (count++ ? ", " : "") + std::to_string(r);
        if (first < 0) first = r;
      }
      // Given up on account of the first missing rank, which the others then name too.
      if (!decide(join_abandoned + static_cast<std::uint32_t>(first >= 0 ? first : size))) continue;
      mine.state.store(slot_closed, std::memory_order_release);
      seg.unlink();  // nothing stays behind in /dev/shm
      // An earlier segment given up says which rank was missing first, or died.
      const std::string before = note.what.empty()
                                     ? std::string()
                                     : " (an earlier segment was given up: " + note.what + ")";
      throw connect_error(
          errc::timed_out, count == 1 ? first : note.rank, job,
          (count == 0 ? std::string("timed out waiting for the last rank to count itself in")
                      : "timed out waiting for rank" + std::string(count == 1 ? " " : "s ") +
                            missing + " of " + std::to_string(size) + " to join") +
              before);
    }
    futex_wait(c.outcome, join_open, detail::min_of<std::chrono::nanoseconds>(until - now, 50ms));
  }
}

/// Joins the job `job` as `rank` of `size`: returns the mapped segment once every rank has
/// mapped it (and its name is gone). Throws `cohort::error`: `errc::timed_out` naming the
/// ranks that never came (or the rank whose death made the last segment stale),
/// `errc::invalid_argument` for a taken rank or a segment of another shape, a system error code
/// when the system refuses.
inline segment join(const std::string& job, int rank, int size, std::size_t ring_bytes,
                    std::chrono::milliseconds timeout) {
  const deadline until = deadline_after(timeout);
  stale_note note;
  for (;;) {
    segment seg("/cohort-" + job, size, ring_bytes);
    if (try_join(seg, job, rank, size, until, note) == join_result::joined) return seg;
    if (clock::now() >= until)
      throw connect_error(
          errc::timed_out, note.rank, job,
          "found only stale segments until the deadline" +
              (note.what.empty() ? std::string() : "; the last was given up: " + note.what));
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

}  // namespace cohort::detail::shm
