// Fault injection with ranks as processes, generic over the process transports (shm, tcp).
//
// - `fault_transport<T>` wraps a transport and counts the operations the collectives post on it
//   (send, recv, wait, recv_view, recv_release). Armed in the victim, it SIGKILLs (or SIGSTOPs)
//   its own process just before operation k, or after handing the transport the first half of
//   a send (a chunk cut in the middle): kill points that are exact and repeatable.
// - `spawn` / `reap` run ranks as forked children with a wall-clock limit; every child reports
//   into a `report_board` (an anonymous shared mapping) that the parent reads after the reap.
// - Leak probes: open descriptors (/proc/self/fd), mappings of shm segments (/proc/self/maps),
//   names in /dev/shm, resident memory.
#pragma once

#include <dirent.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <netinet/in.h>
#include <arpa/inet.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "../scale.hpp"
#if defined(COHORT_TEST_ASAN)
#include <sanitizer/lsan_interface.h>
#endif

#include <cohort/cohort.hpp>
#include <cohort/rendezvous/file_store.hpp>
#include <cohort/rendezvous/tcp_store.hpp>
#include <cohort/transport/shm.hpp>
#include <cohort/transport/tcp.hpp>

#include "../ports.hpp"

namespace cohort::faults {

using namespace std::chrono_literals;
using steady = std::chrono::steady_clock;

// ---------------------------------------------------------------------------------------------
// Scale: sanitizer builds run fewer and smaller cases (COHORT_TEST_SCALE, a fraction in (0, 1]).

using cohort::test::sanitized;
using cohort::test::test_scale;

/// `n` scaled down (never below `floor`).
inline long scaled(long n, long floor = 1) {
  return std::max(floor, static_cast<long>(static_cast<double>(n) * test_scale()));
}

// ---------------------------------------------------------------------------------------------
// Leak probes

/// Open descriptors of this process (the directory's own descriptor not counted).
inline int open_fds() {
  DIR* d = ::opendir("/proc/self/fd");
  if (!d) return -1;
  int n = 0;
  const int own = ::dirfd(d);
  while (dirent* e = ::readdir(d))
    if (e->d_name[0] != '.' && std::atoi(e->d_name) != own) ++n;
  ::closedir(d);
  return n;
}

/// What each open descriptor points at ("3 -> socket:[1234]"), for messages.
inline std::string describe_fds() {
  std::string s;
  DIR* d = ::opendir("/proc/self/fd");
  if (!d) return s;
  const int own = ::dirfd(d);
  while (dirent* e = ::readdir(d)) {
    if (e->d_name[0] == '.' || std::atoi(e->d_name) == own) continue;
    char target[256] = {};
    const std::string link = std::string("/proc/self/fd/") + e->d_name;
    const ssize_t n = ::readlink(link.c_str(), target, sizeof target - 1);
    s += std::string(e->d_name) + "->" + (n > 0 ? std::string(target, static_cast<std::size_t>(n)) : "?") + " ";
  }
  ::closedir(d);
  return s;
}

/// Mappings of shared-memory segments of cohort jobs still in this process.
inline int shm_mappings() {
  std::ifstream maps("/proc/self/maps");
  std::string line;
  int n = 0;
  while (std::getline(maps, line))
    if (line.find("/cohort-") != std::string::npos) ++n;
  return n;
}

/// The names in /dev/shm of job `job`: "cohort-<job>", and anything else cohort may name after
/// it ("cohort-<job>.<suffix>").
inline std::vector<std::string> shm_names(const std::string& job) {
  std::vector<std::string> found;
  const std::string exact = "cohort-" + job, dotted = exact + ".";
  if (DIR* d = ::opendir("/dev/shm")) {
    while (dirent* e = ::readdir(d)) {
      const std::string_view name(e->d_name);
      if (name == exact || name.starts_with(dotted)) found.emplace_back(name);
    }
    ::closedir(d);
  }
  return found;
}

/// Resident memory of this process in KiB (VmRSS).
inline long rss_kib() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line))
    if (line.rfind("VmRSS:", 0) == 0) return std::atol(line.c_str() + 6);
  return -1;
}

/// Runs LeakSanitizer now where the build has it (children end with _exit, which skips it);
/// true when it found leaks.
inline bool leak_check_failed() {
#if defined(COHORT_TEST_ASAN)
  return __lsan_do_recoverable_leak_check() != 0;
#else
  return false;
#endif
}

// ---------------------------------------------------------------------------------------------
// The fault plan and the transport wrapper

enum class fault_action { none, kill, stop };

/// Where the victim fails, resolved against its own dry run of the same call.
struct kill_point {
  enum class where { op, send, fraction, after } kind = where::op;
  double value = 0;   // op or send index, or fraction of the call's operations
  bool half = false;  // at a send: hand over its first half, then fail
  const char* name = "";
};

/// What the victim's transport does; shared by the wrapper and the test.
struct fault_plan {
  fault_action action = fault_action::none;
  long at_op = -1;     // fail before this operation (counted from arm())
  long at_send = -1;   // ... or before this send
  bool half = false;
  std::size_t odd_half = 0;  // > 0: hand over this many bytes of the send (not a whole element)
  long ops = 0, sends = 0;  // counted since arm() or reset()
  // Written just before failing, for the report.
  char* note = nullptr;
  std::size_t note_size = 0;

  void reset() { ops = sends = 0; }
};

inline const char* op_name(int k) {
  constexpr const char* names[] = {"send", "recv", "wait", "recv_view", "recv_release"};
  return names[k];
}

/// A transport that forwards to `Inner` and fails its own process where the plan says.
template <transport Inner>
class fault_transport {
 public:
  using request = typename Inner::request;

  fault_transport(Inner inner, fault_plan* plan) : inner_(std::move(inner)), plan_(plan) {}

  int rank() const { return inner_.rank(); }
  int size() const { return inner_.size(); }

  request send(int peer, std::span<const std::byte> bytes) {
    if (hit(0, peer, bytes.size(), true)) {
      auto r = inner_.send(peer, bytes.first(half_of(bytes.size())));
      std::error_code ec;
      inner_.wait(r, clock::now() + 5s, ec);
      fail_now();
    }
    return inner_.send(peer, bytes);
  }
  request recv(int peer, std::span<std::byte> bytes) {
    hit(1, peer, bytes.size(), false);
    return inner_.recv(peer, bytes);
  }
  void wait(request& r, deadline until, std::error_code& ec) {
    hit(2, -1, 0, false);
    inner_.wait(r, until, ec);
  }
  std::span<const std::byte> recv_view(int peer, std::size_t max, std::size_t align, deadline until,
                                       std::error_code& ec)
    requires zero_copy_transport<Inner>
  {
    hit(3, peer, max, false);
    return inner_.recv_view(peer, max, align, until, ec);
  }
  void recv_release(int peer, std::size_t n)
    requires zero_copy_transport<Inner>
  {
    hit(4, peer, n, false);
    inner_.recv_release(peer, n);
  }
  void abort(const failure& f) noexcept { inner_.abort(f); }
  const failure* remote_failure() const { return inner_.remote_failure(); }

  Inner& inner() { return inner_; }

  /// The part of a send handed over before failing: half, cut at a multiple of 64 bytes (so at
  /// an element boundary, as a record boundary is), or `odd_half` bytes when the plan says.
  std::size_t half_of(std::size_t n) const {
    if (n < 2) return 0;
    if (plan_->odd_half > 0) return std::min(n - 1, plan_->odd_half);
    return n / 2 / 64 * 64;
  }

 private:
  // Counts the operation; fails here unless the plan wants half a send first (returns true).
  bool hit(int kind, int peer, std::size_t bytes, bool is_send) {
    fault_plan& p = *plan_;
    const long op = p.ops++;
    const long send = is_send ? p.sends++ : -1;
    if (p.action == fault_action::none) return false;
    const bool here = (p.at_op >= 0 && op == p.at_op) || (p.at_send >= 0 && send == p.at_send);
    if (!here) return false;
    const bool part = is_send && p.half && half_of(bytes) > 0;
    if (p.note)
      std::snprintf(p.note, p.note_size, "%s%s #%ld (op %ld) to/from rank %d, %zu bytes",
                    part ? "in the middle of " : "before ", op_name(kind), is_send ? send : op, op,
                    peer, bytes);
    if (part) return true;
    fail_now();
    return false;
  }

  void fail_now() {
    std::fflush(nullptr);
    if (plan_->action == fault_action::kill) {
      ::raise(SIGKILL);
    } else {
      plan_->action = fault_action::none;  // once continued (never, in these tests), go on
      ::raise(SIGSTOP);
    }
  }

  Inner inner_;
  fault_plan* plan_;
};

static_assert(zero_copy_transport<fault_transport<shm_transport>>);
static_assert(transport<fault_transport<tcp_transport>> &&
              !zero_copy_transport<fault_transport<tcp_transport>>);
static_assert(zero_copy_transport<fault_transport<loopback_transport>>);

template <class Inner>
using fault_communicator = basic_communicator<fault_transport<Inner>>;

/// A store that forwards to another and fails its own process before operation k (set, try_get,
/// add, wait): the rendezvous kill points of the TCP transport.
class fault_store final : public store {
 public:
  fault_store(store& inner, fault_plan* plan) : inner_(inner), plan_(plan) {}

 protected:
  void do_set(std::string_view key, std::string_view value, std::error_code& ec) override {
    hit("set", key);
    inner_.set(key, value, ec);
    if (ec) fail(ec, ec, inner_.last_error());
  }
  std::optional<std::string> do_try_get(std::string_view key, std::error_code& ec) override {
    hit("try_get", key);
    auto v = inner_.try_get(key, ec);
    if (ec) fail(ec, ec, inner_.last_error());
    return v;
  }
  std::optional<std::string> do_try_get_until(std::string_view key, deadline until,
                                              std::error_code& ec) override {
    hit("try_get", key);
    auto v = inner_.try_get(key, until, ec);
    if (ec) fail(ec, ec, inner_.last_error());
    return v;
  }
  std::int64_t do_add(std::string_view key, std::int64_t n, std::error_code& ec) override {
    hit("add", key);
    auto v = inner_.add(key, n, ec);
    if (ec) fail(ec, ec, inner_.last_error());
    return v;
  }
  std::vector<std::string> do_wait(std::span<const std::string> keys, deadline until,
                                   std::error_code& ec) override {
    hit("wait", keys.empty() ? std::string_view() : std::string_view(keys.front()));
    auto v = inner_.wait(keys, until, ec);
    if (ec) fail(ec, ec, inner_.last_error());
    return v;
  }

 private:
  void hit(const char* what, std::string_view key) {
    const long op = plan_->ops++;
    if (plan_->action == fault_action::none || op != plan_->at_op) return;
    if (plan_->note)
      std::snprintf(plan_->note, plan_->note_size, "before store.%s(\"%.*s\") (store op %ld)", what,
                    static_cast<int>(std::min<std::size_t>(key.size(), 60)), key.data(), op);
    std::fflush(nullptr);
    ::raise(plan_->action == fault_action::kill ? SIGKILL : SIGSTOP);
  }

  store& inner_;
  fault_plan* plan_;
};

// ---------------------------------------------------------------------------------------------
// Jobs: which transport, and how each rank builds its communicator.

enum class kind { shm, tcp };
inline const char* kind_name(kind k) { return k == kind::shm ? "shm" : "tcp"; }

using cohort::test::free_port;  // a port held for the job until it listens (tests/ports.hpp)

/// A job id unique to this process and call.
inline std::string unique_job(const std::string& what) {
  static std::atomic<int> n{0};
  return "flt-" + what + "-" + std::to_string(::getpid()) + "-" + std::to_string(n++);
}

struct job_spec {
  faults::kind transport = kind::shm;
  std::string job;
  int size = 3;
  int master_port = 0;  // tcp: rank 0 hosts the store here
  std::chrono::milliseconds connect_timeout{20'000};
  std::chrono::milliseconds liveness{200};  // shm liveness_interval
};

inline job_spec make_spec(kind t, const std::string& what, int size) {
  job_spec s;
  s.transport = t;
  s.job = unique_job(what);
  s.size = size;
  if (t == kind::tcp) s.master_port = free_port();
  return s;
}

inline tcp_options tcp_test_options(std::chrono::milliseconds connect_timeout) {
  tcp_options o;
  o.interface = "lo";
  o.family = tcp_family::v4;
  o.connect_timeout = connect_timeout;
  o.handshake_timeout = std::min<std::chrono::milliseconds>(connect_timeout, 5s);
  o.spin = 0us;  // ranks outnumber the cores here
  o.log = [](std::string_view) {};
  return o;
}

inline launch_info info_for(const job_spec& s, int rank) {
  launch_info info;
  info.rank = rank;
  info.size = s.size;
  info.local_rank = rank;
  info.local_size = s.size;
  info.job_id = s.job;
  info.master_addr = "127.0.0.1";
  info.master_port = s.master_port;
  return info;
}

/// Builds this rank's communicator of `s`, wrapped in a fault_transport driven by `plan`, and
/// calls fn(comm). TCP meets at the store rank 0 hosts (the launcher path), unless `st` is given.
template <class Fn>
void with_comm(const job_spec& s, int rank, fault_plan* plan, Fn&& fn, store* st = nullptr) {
  if (s.transport == kind::shm) {
    shm_options o;
    o.connect_timeout = s.connect_timeout;
    o.liveness_interval = s.liveness;
    fault_communicator<shm_transport> comm(std::in_place, shm_transport(s.job, rank, s.size, o), plan);
    fn(comm);
  } else {
    auto o = tcp_test_options(s.connect_timeout);
    const launch_info info = info_for(s, rank);
    if (st) {
      fault_communicator<tcp_transport> comm(std::in_place, tcp_transport(info, *st, o), plan);
      fn(comm);
    } else {
      fault_communicator<tcp_transport> comm(std::in_place, tcp_transport(info, o), plan);
      fn(comm);
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Processes and their reports

/// What one rank says about itself; lives in memory shared with the parent.
struct rank_report {
  int written = 0;        // 1 once the rank filled it in
  int code = 0;           // the error the rank ended with (cohort category), 0 for none
  int foreign = 0;        // 1 if that error was of another category (a bug)
  int peer = -2;
  int poisoned_ok = 0;    // a later call failed at once with errc::poisoned
  int completed = 0;      // the target call completed (with correct data)
  int wrong_data = 0;     // a call returned with data that is not the reference (never allowed)
  int fds_before = -1, fds_after = -1, maps_after = -1, leaks = 0;
  long elapsed_ms = -1;   // from the start of the target call to the error
  long ops = -1;          // the victim's: operations in its dry run
  long value = 0;         // free for the test
  char where[160] = {};   // the victim's: where it failed
  char what[640] = {};    // the error's text
  char fds_text[480] = {};
};

/// An anonymous shared mapping with one report per rank.
class report_board {
 public:
  explicit report_board(int ranks) : n_(static_cast<std::size_t>(ranks)) {
    void* p = ::mmap(nullptr, bytes(), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) throw std::runtime_error("mmap of the report board failed");
    reports_ = static_cast<rank_report*>(p);
    for (std::size_t i = 0; i < n_; ++i) new (&reports_[i]) rank_report{};
  }
  ~report_board() { ::munmap(reports_, bytes()); }
  report_board(const report_board&) = delete;
  report_board& operator=(const report_board&) = delete;
  rank_report& operator[](int r) { return reports_[r]; }

 private:
  std::size_t bytes() const { return std::max<std::size_t>(n_ * sizeof(rank_report), 4096); }
  std::size_t n_;
  rank_report* reports_;
};

inline void copy_text(char* dst, std::size_t cap, std::string_view s) {
  const std::size_t n = std::min(cap - 1, s.size());
  std::memcpy(dst, s.data(), n);
  dst[n] = '\0';
}

/// Records an error code into a report.
inline void record(rank_report& rep, std::error_code ec, int peer, std::string_view what) {
  rep.code = ec.category() == error_category() ? ec.value() : 0;
  rep.foreign = ec && ec.category() != error_category();
  if (rep.foreign) rep.code = -ec.value();
  rep.peer = peer;
  copy_text(rep.what, sizeof rep.what, what);
}

/// Starts a child running body(rank); it exits with what body returns (0: fine); an exception
/// is printed and exits 1.
/// The child is killed when the thread that spawned it ends (every test here spawns from its
/// main thread, so: when the test program exits): a test that fails between a spawn and its reap
/// leaves no process behind to hold the program's output open, which the test runner would
/// wait on until its timeout.
template <class Body>
pid_t spawn(int rank, Body&& body) {
  std::fflush(nullptr);
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid < 0) throw std::runtime_error("fork failed");
  if (pid == 0) {
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(1);
    int code = 1;
    try {
      code = body(rank);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "[rank %d] uncaught: %s\n", rank, e.what());
    } catch (...) {
      std::fprintf(stderr, "[rank %d] uncaught exception\n", rank);
    }
    std::fflush(nullptr);
    ::_exit(code);
  }
  return pid;
}

inline constexpr int killed_at_limit = -1000;
inline constexpr int still_stopped = -2000;

/// Waits for `pids` until `limit`; kills what is left. Statuses: exit code, -N for signal N,
/// killed_at_limit. Processes listed in `stopped` may stay stopped: they are killed once the
/// others are done, and reported as still_stopped.
inline std::vector<int> reap(const std::vector<pid_t>& pids, steady::duration limit,
                             std::vector<bool> stopped = {}) {
  stopped.resize(pids.size(), false);
  std::vector<int> status(pids.size(), killed_at_limit);
  std::vector<bool> done(pids.size(), false);
  const auto until = steady::now() + limit;
  for (std::size_t left = pids.size(); left > 0;) {
    std::size_t running = 0;
    for (std::size_t i = 0; i < pids.size(); ++i) {
      if (done[i]) continue;
      int st = 0;
      if (::waitpid(pids[i], &st, WNOHANG) == pids[i]) {
        status[i] = WIFEXITED(st) ? WEXITSTATUS(st) : -WTERMSIG(st);
        done[i] = true;
        --left;
      } else if (!stopped[i]) {
        ++running;
      }
    }
    if (left > 0 && running == 0) {  // only stopped processes are left
      for (std::size_t i = 0; i < pids.size(); ++i)
        if (!done[i]) {
          ::kill(pids[i], SIGKILL);
          ::waitpid(pids[i], nullptr, 0);
          status[i] = still_stopped;
        }
      break;
    }
    if (left > 0 && steady::now() > until) {
      for (std::size_t i = 0; i < pids.size(); ++i)
        if (!done[i]) {
          ::kill(pids[i], SIGKILL);
          ::waitpid(pids[i], nullptr, 0);
        }
      break;
    }
    if (left > 0) std::this_thread::sleep_for(1ms);
  }
  return status;
}

inline std::string status_text(int s) {
  if (s == killed_at_limit) return "hung (killed at the test's limit)";
  if (s == still_stopped) return "stopped until the others finished";
  if (s < 0) return "killed by signal " + std::to_string(-s);
  return "exit " + std::to_string(s);
}

inline std::string code_name(int code) {
  if (code < 0) return "foreign error " + std::to_string(-code);
  if (code == 0) return "ok";
  return make_error_code(static_cast<errc>(code)).message();
}

}  // namespace cohort::faults
