// cohort-run: starts N ranks of a program on this host, like a one-host mpirun or torchrun.
//
// Each rank runs in a process group that cohort-run owns (rank 0 leads it), with stdin from
// /dev/null and stdout/stderr through pipes; cohort-run prefixes every line with "[rank] ".
// Signals to cohort-run go to the group; the first failing rank ends the others (SIGTERM, then
// SIGKILL after the grace period). On Linux a rank also gets SIGKILL if cohort-run itself dies.
// Plain POSIX and one thread: no Asio.
#include <cohort/launch/env.hpp>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>
#ifdef __linux__
#include <sys/prctl.h>
#endif

#include <cerrno>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <optional>
#include <random>
#include <string>
#include <string_view>
#include <vector>

namespace {

using steady = std::chrono::steady_clock;

constexpr int max_ranks = 4096;
constexpr double default_grace_s = 3.0;
constexpr std::size_t max_line = 64 * 1024;  // longer lines are cut (a newline is inserted)
constexpr auto drain_limit = std::chrono::seconds(1);  // for output held open by leftovers

constexpr const char* usage_text =
    "usage: cohort-run -n N [--timeout SECONDS] [--grace SECONDS] [--job-id ID] [--] program "
    "[args...]\n"
    "\n"
    "Starts N ranks of program on this host. Each rank gets COHORT_RANK, COHORT_SIZE,\n"
    "COHORT_LOCAL_RANK, COHORT_LOCAL_SIZE and COHORT_JOB_ID, and MASTER_ADDR=127.0.0.1 and a\n"
    "free MASTER_PORT unless they are set. Output lines are prefixed with \"[rank] \".\n"
    "When a rank fails the others get SIGTERM, then SIGKILL after the grace period.\n"
    "\n"
    "  -n, --nproc N       number of ranks, 1 to 4096\n"
    "  --timeout SECONDS   end all ranks after this wall-clock time and exit 124\n"
    "  --grace SECONDS     time between SIGTERM and SIGKILL (default 3)\n"
    "  --job-id ID         job id of all ranks, 1 to 128 of [A-Za-z0-9_.-] (default: unique)\n"
    "  -h, --help          print this text\n"
    "\n"
    "Exit status: 0 when every rank exits 0; else the first failing rank's status (128+N for\n"
    "signal N), 124 on timeout, 128+N when cohort-run gets signal N, 127 when the program is\n"
    "not found, 126 when it cannot be run, 2 on bad arguments.\n";

struct options {
  int ranks = 0;
  std::optional<double> timeout_s;
  double grace_s = default_grace_s;
  std::string job_id;
  std::vector<char*> argv;  // the program and its arguments, null-terminated
};

[[noreturn]] void usage_error(const std::string& message) {
  std::fprintf(stderr, "cohort-run: %s\n%s", message.c_str(), usage_text);
  std::exit(2);
}

std::optional<int> parse_int(std::string_view text) {
  int value = 0;
  auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc{} || ptr != text.data() + text.size()) return std::nullopt;
  return value;
}

std::optional<double> parse_seconds(const std::string& text) {
  char* end = nullptr;
  errno = 0;
  double value = std::strtod(text.c_str(), &end);
  if (text.empty() || *end != '\0' || errno != 0 || !std::isfinite(value) || value <= 0 ||
      value > 1e9) {
    return std::nullopt;
  }
  return value;
}

options parse_args(int argc, char** argv) {
  options opts;
  int i = 1;
  for (; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--") {
      ++i;
      break;
    }
    if (arg.empty() || arg[0] != '-') break;  // the program
    std::string name = arg, value;
    bool has_value = false;
    if (auto eq = arg.find('='); arg.rfind("--", 0) == 0 && eq != std::string::npos) {
      name = arg.substr(0, eq);
      value = arg.substr(eq + 1);
      has_value = true;
    } else if (arg.size() > 2 && arg.rfind("-n", 0) == 0 && arg != "-np") {
      name = "-n";
      value = arg.substr(2);
      has_value = true;
    }
    auto take_value = [&]() {
      if (has_value) return value;
      if (i + 1 >= argc) usage_error(name + " needs a value");
      return std::string(argv[++i]);
    };
    if (name == "-h" || name == "--help") {
      std::fputs(usage_text, stdout);
      std::exit(0);
    } else if (name == "-n" || name == "-np" || name == "--nproc") {
      std::string text = take_value();
      auto n = parse_int(text);
      if (!n || *n < 1 || *n > max_ranks) {
        usage_error("-n needs a number of ranks from 1 to " + std::to_string(max_ranks) +
                    ", not '" + text + "'");
      }
      opts.ranks = *n;
    } else if (name == "--timeout" || name == "--grace") {
      std::string text = take_value();
      auto seconds = parse_seconds(text);
      if (!seconds) usage_error(name + " needs a positive number of seconds, not '" + text + "'");
      if (name == "--timeout") {
        opts.timeout_s = *seconds;
      } else {
        opts.grace_s = *seconds;
      }
    } else if (name == "--job-id") {
      opts.job_id = take_value();
      if (!cohort::detail::valid_job_id(opts.job_id)) {
        usage_error("--job-id needs 1 to 128 characters of [A-Za-z0-9_.-], not '" + opts.job_id +
                    "'");
      }
    } else {
      usage_error("unknown option '" + arg + "'");
    }
  }
  if (opts.ranks == 0) usage_error("say how many ranks to start with -n N");
  if (i >= argc) usage_error("no program to run");
  opts.argv.assign(argv + i, argv + argc);
  opts.argv.push_back(nullptr);
  return opts;
}

// A job id no other run shares: random bits, with the pid and the time in case there are none.
std::string make_job_id() {
  std::uint64_t bits = static_cast<std::uint64_t>(steady::now().time_since_epoch().count()) ^
                       (static_cast<std::uint64_t>(::getpid()) << 40);
  try {
    std::random_device device;
    bits ^= (static_cast<std::uint64_t>(device()) << 32) | device();
  } catch (...) {
  }
  char text[32];
  std::snprintf(text, sizeof text, "cr-%016llx", static_cast<unsigned long long>(bits));
  return text;
}

// `port` (the kernel's pick where 0) if it could be bound on 127.0.0.1 just now, else 0.
int bindable_port(int port) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return 0;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<std::uint16_t>(port));
  socklen_t len = sizeof addr;
  int got = 0;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
    got = ntohs(addr.sin_port);
  }
  ::close(fd);
  return got;
}

// A TCP port that was free on 127.0.0.1 a moment ago, or 0. Taken below the kernel's ephemeral
// range (ip_local_port_range) where there is room: a port in that range may go to any process's
// outgoing connection before rank 0 listens on it (it did, beside a busy test suite); one below
// it is taken only by another bind.
int free_port() {
  int ephemeral_low = 32768;
  if (std::FILE* f = std::fopen("/proc/sys/net/ipv4/ip_local_port_range", "r")) {
    int low = 0, high = 0;
    if (std::fscanf(f, "%d %d", &low, &high) == 2 && low > 0) ephemeral_low = low;
    std::fclose(f);
  }
  constexpr int lowest = 10000;
  if (ephemeral_low > lowest + 1) {
    std::minstd_rand pick(static_cast<std::uint32_t>(std::hash<std::string>{}(make_job_id())));
    for (int attempt = 0; attempt < 32; ++attempt) {
      const auto span = static_cast<unsigned>(ephemeral_low - lowest);
      const int port = lowest + static_cast<int>(pick() % span);
      if (bindable_port(port) == port) return port;
    }
  }
  return bindable_port(0);
}

std::string signal_name(int sig) {
  switch (sig) {
    case SIGHUP: return "SIGHUP";
    case SIGINT: return "SIGINT";
    case SIGQUIT: return "SIGQUIT";
    case SIGILL: return "SIGILL";
    case SIGTRAP: return "SIGTRAP";
    case SIGABRT: return "SIGABRT";
    case SIGBUS: return "SIGBUS";
    case SIGFPE: return "SIGFPE";
    case SIGKILL: return "SIGKILL";
    case SIGUSR1: return "SIGUSR1";
    case SIGSEGV: return "SIGSEGV";
    case SIGUSR2: return "SIGUSR2";
    case SIGPIPE: return "SIGPIPE";
    case SIGALRM: return "SIGALRM";
    case SIGTERM: return "SIGTERM";
    case SIGXCPU: return "SIGXCPU";
    case SIGXFSZ: return "SIGXFSZ";
    case SIGSYS: return "SIGSYS";
  }
  return "signal " + std::to_string(sig);
}

// Writes all of `text` to `fd`; false when the reader is gone (the output is dropped then).
bool write_all(int fd, std::string_view text) {
  while (!text.empty()) {
    ssize_t n = ::write(fd, text.data(), text.size());
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    text.remove_prefix(static_cast<std::size_t>(n));
  }
  return true;
}

void report(const std::string& message) { write_all(2, "cohort-run: " + message + "\n"); }

// The signal handler's only job: wake the poll loop through a pipe.
int wake_fd = -1;
void on_signal(int sig) {
  int saved = errno;
  unsigned char byte = static_cast<unsigned char>(sig);
  [[maybe_unused]] ssize_t n = ::write(wake_fd, &byte, 1);
  errno = saved;
}

constexpr int handled_signals[] = {SIGINT, SIGTERM, SIGHUP, SIGCHLD};

// One rank's output stream: its pipe, a partial line, and where lines go (1 or 2).
struct stream {
  int fd = -1;
  int target = 1;
  std::string partial;
};

struct rank_process {
  pid_t pid = -1;
  bool running = false;
  stream out, err;
};

class job {
 public:
  explicit job(options opts) : opts_(std::move(opts)), ranks_(opts_.ranks) {}

  int run() {
    if (!setup()) return 1;
    launch();
    loop();
    return exit_code_.value_or(0);
  }

 private:
  bool setup() {
    int fds[2];
    if (::pipe2(fds, O_CLOEXEC | O_NONBLOCK) != 0) {
      report(std::string("cannot create a pipe: ") + std::strerror(errno));
      return false;
    }
    wake_read_ = fds[0];
    wake_fd = fds[1];
    struct sigaction action {};
    action.sa_handler = on_signal;
    sigemptyset(&action.sa_mask);
    action.sa_flags = SA_RESTART;
    for (int sig : handled_signals) ::sigaction(sig, &action, nullptr);
    ::signal(SIGPIPE, SIG_IGN);  // a closed stdout must not kill us while ranks run

    std::string job_id = opts_.job_id.empty() ? make_job_id() : opts_.job_id;
    std::string size = std::to_string(opts_.ranks);
    ::setenv("COHORT_SIZE", size.c_str(), 1);
    ::setenv("COHORT_LOCAL_SIZE", size.c_str(), 1);
    ::setenv("COHORT_JOB_ID", job_id.c_str(), 1);
    ::setenv("MASTER_ADDR", "127.0.0.1", 0);
    if (std::getenv("MASTER_PORT") == nullptr || *std::getenv("MASTER_PORT") == '\0') {
      if (int port = free_port(); port != 0) {
        ::setenv("MASTER_PORT", std::to_string(port).c_str(), 1);
      }
    }
    return true;
  }

  // Starts the ranks one after another, each known to have exec'd before the next starts.
  void launch() {
    sigset_t blocked, old;
    sigemptyset(&blocked);
    for (int sig : handled_signals) sigaddset(&blocked, sig);
    ::sigprocmask(SIG_BLOCK, &blocked, &old);  // handled once all ranks are in the table
    for (int r = 0; r < opts_.ranks; ++r) {
      if (!start(r, old)) {
        if (running_ > 0) begin_teardown(SIGTERM);
        break;
      }
    }
    ::sigprocmask(SIG_SETMASK, &old, nullptr);
  }

  bool start(int r, const sigset_t& child_mask) {
    int out[2], err[2], status[2];
    if (::pipe2(out, O_CLOEXEC) != 0 || ::pipe2(err, O_CLOEXEC) != 0 ||
        ::pipe2(status, O_CLOEXEC) != 0) {
      int e = errno;
      report("cannot create pipes for rank " + std::to_string(r) + ": " + std::strerror(e) +
             (e == EMFILE ? " (raise 'ulimit -n')" : ""));
      exit_code_ = exit_code_.value_or(1);
      return false;  // the fds made so far are closed at exit
    }
    const pid_t parent = ::getpid();
    pid_t pid = ::fork();
    if (pid < 0) {
      int e = errno;
      report("cannot start rank " + std::to_string(r) + ": " + std::strerror(e));
      exit_code_ = exit_code_.value_or(1);
      return false;
    }
    if (pid == 0) exec_child(r, parent, out[1], err[1], status[1], child_mask);

    ::setpgid(pid, pgid_ == 0 ? pid : pgid_);  // the child does the same; one of them wins
    if (pgid_ == 0) pgid_ = pid;
    ::close(out[1]);
    ::close(err[1]);
    ::close(status[1]);
    rank_process& p = ranks_[r];
    p.pid = pid;
    p.running = true;
    ++running_;
    p.out = {out[0], 1, {}};
    p.err = {err[0], 2, {}};
    ::fcntl(out[0], F_SETFL, O_NONBLOCK);
    ::fcntl(err[0], F_SETFL, O_NONBLOCK);

    int exec_errno = 0;
    ssize_t n;
    do {
      n = ::read(status[0], &exec_errno, sizeof exec_errno);
    } while (n < 0 && errno == EINTR);
    ::close(status[0]);
    if (n != static_cast<ssize_t>(sizeof exec_errno)) return true;  // EOF: exec succeeded
    std::string program = opts_.argv[0];
    bool not_found = exec_errno == ENOENT || exec_errno == ENOTDIR;
    report("cannot run '" + program + "': " +
           (not_found && program.find('/') == std::string::npos ? "not found in PATH"
                                                                : std::strerror(exec_errno)));
    exit_code_ = exit_code_.value_or(not_found ? 127 : 126);
    teardown_ = true;  // its own exit is no news; ranks started before it are ended
    return false;
  }

  [[noreturn]] void exec_child(int r, pid_t parent, int out, int err, int status,
                               const sigset_t& mask) {
    for (int sig : handled_signals) ::signal(sig, SIG_DFL);
    ::signal(SIGPIPE, SIG_DFL);  // ignored dispositions survive exec
    ::setpgid(0, pgid_);         // 0 for rank 0: it leads the group
#ifdef __linux__
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(127);  // cohort-run died before prctl
#endif
    int null = ::open("/dev/null", O_RDONLY);
    if (null >= 0) ::dup2(null, 0);
    ::dup2(out, 1);
    ::dup2(err, 2);
    ::sigprocmask(SIG_SETMASK, &mask, nullptr);
    std::string rank = std::to_string(r);
    ::setenv("COHORT_RANK", rank.c_str(), 1);  // one thread: setenv after fork is fine
    ::setenv("COHORT_LOCAL_RANK", rank.c_str(), 1);
    ::execvp(opts_.argv[0], opts_.argv.data());
    int e = errno;
    [[maybe_unused]] ssize_t n = ::write(status, &e, sizeof e);
    ::_exit(127);
  }

  void loop() {
    std::optional<steady::time_point> timeout_at, drain_until;
    if (opts_.timeout_s) {
      timeout_at = started_ + std::chrono::duration_cast<steady::duration>(
                                  std::chrono::duration<double>(*opts_.timeout_s));
    }
    std::vector<pollfd> fds;
    std::vector<stream*> streams;
    for (;;) {
      reap();
      auto now = steady::now();
      if (running_ == 0 && !drain_until) {
        // Whatever the ranks left behind in their group goes too; their output is drained.
        if (pgid_ != 0) ::kill(-pgid_, SIGKILL);
        drain_until = now + drain_limit;
      }
      if (timeout_at && now >= *timeout_at && running_ > 0) {
        timeout_at.reset();
        if (!teardown_) {
          report("timed out after " + format_seconds(*opts_.timeout_s) + " s; ending " +
                 std::to_string(running_) + " running rank(s)");
          exit_code_ = exit_code_.value_or(124);
          begin_teardown(SIGTERM);
        }
      }
      if (kill_at_ && now >= *kill_at_) {
        kill_at_.reset();
        kill_all();
      }
      fds.clear();
      streams.clear();
      fds.push_back({wake_read_, POLLIN, 0});
      for (auto& p : ranks_) {
        for (stream* s : {&p.out, &p.err}) {
          if (s->fd >= 0) {
            fds.push_back({s->fd, POLLIN, 0});
            streams.push_back(s);
          }
        }
      }
      if (running_ == 0 && (streams.empty() || now >= *drain_until)) break;
      std::optional<steady::time_point> next = drain_until;
      for (const auto& t : {timeout_at, kill_at_}) {
        if (t && (!next || *t < *next)) next = t;
      }
      int wait_ms = -1;
      if (next) {
        auto left = std::chrono::ceil<std::chrono::milliseconds>(*next - now).count();
        wait_ms = static_cast<int>(std::max<long long>(0, std::min<long long>(left, 60000)));
      }
      int ready = ::poll(fds.data(), fds.size(), wait_ms);
      if (ready < 0 && errno != EINTR) {
        report(std::string("poll failed: ") + std::strerror(errno));
        kill_all();
        ::sleep(1);  // SIGKILL is quick; then reap what it ended and stop
        reap();
        break;
      }
      if (ready <= 0) continue;
      if (fds[0].revents != 0) take_signals();
      for (std::size_t i = 1; i < fds.size(); ++i) {
        if (fds[i].revents != 0) read_stream(*streams[i - 1], rank_of(*streams[i - 1]));
      }
    }
    for (std::size_t r = 0; r < ranks_.size(); ++r) {
      for (stream* s : {&ranks_[r].out, &ranks_[r].err}) close_stream(*s, static_cast<int>(r));
    }
  }

  int rank_of(const stream& s) const {
    for (std::size_t r = 0; r < ranks_.size(); ++r) {
      if (&ranks_[r].out == &s || &ranks_[r].err == &s) return static_cast<int>(r);
    }
    return -1;
  }

  void read_stream(stream& s, int rank) {
    char buffer[65536];
    ssize_t n = ::read(s.fd, buffer, sizeof buffer);
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) return;
    if (n <= 0) {
      close_stream(s, rank);
      return;
    }
    s.partial.append(buffer, static_cast<std::size_t>(n));
    std::string lines;
    std::size_t start = 0;
    for (;;) {
      std::size_t end = s.partial.find('\n', start);
      if (end == std::string::npos && s.partial.size() - start >= max_line) {
        end = start + max_line;  // a line that never ends is cut, so memory stays bounded
      }
      if (end == std::string::npos) break;
      append_line(lines, rank, std::string_view(s.partial).substr(start, end - start));
      start = end < s.partial.size() && s.partial[end] == '\n' ? end + 1 : end;
    }
    s.partial.erase(0, start);
    emit(s.target, lines);
  }

  // Flushes a partial last line and closes the pipe.
  void close_stream(stream& s, int rank) {
    if (s.fd < 0) return;
    if (!s.partial.empty()) {
      std::string line;
      append_line(line, rank, s.partial);
      emit(s.target, line);
      s.partial.clear();
    }
    ::close(s.fd);
    s.fd = -1;
  }

  static void append_line(std::string& out, int rank, std::string_view line) {
    out += '[';
    out += std::to_string(rank);
    out += "] ";
    out += line;
    out += '\n';
  }

  void emit(int target, const std::string& text) {
    bool& dead = target == 1 ? stdout_dead_ : stderr_dead_;
    if (!text.empty() && !dead && !write_all(target, text)) dead = true;
  }

  void reap() {
    for (;;) {
      int status = 0;
      pid_t pid = ::waitpid(-1, &status, WNOHANG);
      if (pid <= 0) return;
      for (std::size_t r = 0; r < ranks_.size(); ++r) {
        if (ranks_[r].pid == pid && ranks_[r].running) {
          ranks_[r].running = false;
          --running_;
          ended(static_cast<int>(r), status);
        }
      }
    }
  }

  void ended(int rank, int status) {
    if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return;
    if (teardown_) return;  // ended by us, or after the failure that is already reported
    std::string how = WIFEXITED(status)
                          ? "exited with status " + std::to_string(WEXITSTATUS(status))
                          : "killed by signal " + signal_name(WTERMSIG(status));
    exit_code_ = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    report("rank " + std::to_string(rank) + " " + how +
           (running_ > 0 ? "; ending the other " + std::to_string(running_) + " running rank(s)"
                         : ""));
    begin_teardown(SIGTERM);
  }

  void take_signals() {
    unsigned char signals[64];
    ssize_t n;
    while ((n = ::read(wake_read_, signals, sizeof signals)) > 0) {
      for (ssize_t i = 0; i < n; ++i) {
        int sig = signals[i];
        if (sig == SIGCHLD) continue;  // reap() runs every turn
        if (running_ == 0) continue;
        if (!teardown_) {
          report("got " + signal_name(sig) + "; passing it to " + std::to_string(running_) +
                 " running rank(s)");
          exit_code_ = 128 + sig;
          begin_teardown(sig);
        } else {
          report("got " + signal_name(sig) + " again; killing the ranks");
          exit_code_ = exit_code_.value_or(128 + sig);
          kill_at_.reset();
          kill_all();
        }
      }
    }
  }

  // Sends `sig` to every rank, then SIGKILL to what is left after the grace period.
  void begin_teardown(int sig) {
    teardown_ = true;
    signal_all(sig);
    kill_at_ = steady::now() + std::chrono::duration_cast<steady::duration>(
                                   std::chrono::duration<double>(opts_.grace_s));
  }

  void kill_all() { signal_all(SIGKILL); }

  void signal_all(int sig) {
    if (pgid_ != 0) ::kill(-pgid_, sig);
    for (const auto& p : ranks_) {  // ranks that left the group themselves
      if (p.running && ::getpgid(p.pid) != pgid_) ::kill(p.pid, sig);
    }
  }

  static std::string format_seconds(double s) {
    char text[32];
    std::snprintf(text, sizeof text, "%g", s);
    return text;
  }

  options opts_;
  std::vector<rank_process> ranks_;
  steady::time_point started_ = steady::now();
  pid_t pgid_ = 0;
  int running_ = 0;
  int wake_read_ = -1;
  bool teardown_ = false;
  bool stdout_dead_ = false, stderr_dead_ = false;
  std::optional<steady::time_point> kill_at_;
  std::optional<int> exit_code_;
};

}  // namespace

int main(int argc, char** argv) { return job(parse_args(argc, argv)).run(); }
