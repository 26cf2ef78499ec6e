/// @file
/// The waiting primitives of the shared-memory transport: a pause for spinning, a full fence,
/// a futex on a word in the shared segment, and a watch on another process's life.
#pragma once

#include <atomic>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cstdint>
#include <cstdio>
#include <ctime>
#include <utility>

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>
#if defined(__linux__)
#include <linux/futex.h>
#include <sys/syscall.h>
#endif

#include <cohort/core/detail/min.hpp>

namespace cohort::detail::shm {

/// A 32-bit word in shared memory; futexes wait on these.
using word = std::atomic<std::uint32_t>;
static_assert(sizeof(word) == 4 && word::is_always_lock_free);
static_assert(std::atomic<std::uint64_t>::is_always_lock_free);

/// Tells the core that this is a spin-wait loop (saves power, yields to the sibling thread).
inline void cpu_relax() noexcept {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield" ::: "memory");
#endif
}

/// A sequentially consistent fence: orders a store before a later load of another word (the
/// store-then-check handshake between a sleeper and its wakers).
inline void full_fence() noexcept {
#if defined(__SANITIZE_THREAD__)
  // ThreadSanitizer does not model fences; a seq_cst read-modify-write is a full barrier on
  // every target we build for, and it understands those.
  static std::atomic<int> barrier{0};
  barrier.fetch_add(0, std::memory_order_seq_cst);
#else
  std::atomic_thread_fence(std::memory_order_seq_cst);
#endif
}

/// Sleeps while `w` holds `expected`, for at most `timeout`; returns early when woken, on a
/// signal, or at once if `w` already differs. The word may be in memory shared between
/// processes (no FUTEX_PRIVATE_FLAG).
inline void futex_wait(word& w, std::uint32_t expected, std::chrono::nanoseconds timeout) noexcept {
  if (timeout <= std::chrono::nanoseconds::zero()) return;
#if defined(__linux__)
  const auto s = std::chrono::duration_cast<std::chrono::seconds>(timeout);
  timespec ts{static_cast<time_t>(s.count()), static_cast<long>((timeout - s).count())};
  ::syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(&w), FUTEX_WAIT, expected, &ts, nullptr,
            0);
#else
  // Without futexes: a short nap, then the caller looks again.
  if (w.load(std::memory_order_acquire) != expected) return;
  timespec ts{0, static_cast<long>(detail::min_of<std::chrono::nanoseconds>(
                     timeout, std::chrono::microseconds(50)).count())};
  ::nanosleep(&ts, nullptr);
#endif
}

/// Wakes every process sleeping in `futex_wait` on `w`.
inline void futex_wake(word& w) noexcept {
#if defined(__linux__)
  ::syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(&w), FUTEX_WAKE, INT_MAX, nullptr,
            nullptr, 0);
#else
  (void)w;
#endif
}

/// An identifier of this process's PID namespace (0 where unknown): a pid recorded by a
/// process in another namespace means nothing here.
inline std::uint64_t pid_namespace_id() noexcept {
  struct stat st {};
  if (::stat("/proc/self/ns/pid", &st) != 0) return 0;
  return static_cast<std::uint64_t>(st.st_ino);
}

/// True unless process `pid` has certainly exited. A zombie (exited, not yet reaped by its
/// parent) counts as exited.
inline bool process_alive(pid_t pid) noexcept {
  if (pid <= 0) return true;
  if (::kill(pid, 0) != 0) return errno == EPERM;
#if defined(__linux__)
  char path[64];
  std::snprintf(path, sizeof path, "/proc/%d/stat", static_cast<int>(pid));
  int fd = ::open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return true;
  char buf[512];
  ssize_t n = ::read(fd, buf, sizeof buf - 1);
  ::close(fd);
  if (n <= 0) return true;
  buf[n] = '\0';
  // "pid (comm) S ...": the state follows the last ')'.
  const char* p = nullptr;
  for (const char* q = buf; *q; ++q)
    if (*q == ')') p = q;
  return !(p && p[1] == ' ' && (p[2] == 'Z' || p[2] == 'X'));
#else
  return true;
#endif
}

/// Watches another process: `alive()` turns false once it exits. Uses a pidfd where the
/// kernel has them (immune to pid reuse), else `kill(pid, 0)` plus a zombie check. A watch
/// on pid 0 (unknown) always says alive.
class process_watch {
 public:
  process_watch() = default;
  explicit process_watch(pid_t pid) noexcept : pid_(pid) {
#if defined(__linux__) && defined(SYS_pidfd_open)
    if (pid > 0) {
      fd_ = static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
      if (fd_ < 0 && errno == ESRCH) fd_ = -2;  // already gone
    }
#endif
  }
  process_watch(process_watch&& o) noexcept
      : pid_(std::exchange(o.pid_, 0)), fd_(std::exchange(o.fd_, -1)) {}
  process_watch& operator=(process_watch&& o) noexcept {
    std::swap(pid_, o.pid_);
    std::swap(fd_, o.fd_);
    return *this;
  }
  ~process_watch() {
    if (fd_ >= 0) ::close(fd_);
  }

  /// The process watched (0 for none).
  pid_t pid() const noexcept { return pid_; }

  /// False once the process has exited; a cheap system call, so call it a few times a second
  /// at most.
  bool alive() const noexcept {
    if (pid_ <= 0) return true;
    if (fd_ == -2) return false;
    if (fd_ >= 0) {
      pollfd p{fd_, POLLIN, 0};
      return ::poll(&p, 1, 0) == 0;  // readable once the process has exited
    }
    return process_alive(pid_);
  }

 private:
  pid_t pid_ = 0;
  int fd_ = -1;
};

}  // namespace cohort::detail::shm
