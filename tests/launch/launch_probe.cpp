// launch_probe: prints where its launcher put it as one line, then misbehaves on request.
//
//   rank=R size=S local_rank=LR local_size=LS source=NAME job=ID pid=PID master=ADDR:PORT
//
// Options (R is a rank; the others act on every rank):
//   --fail-rank R [--code C]     rank R exits with C (default 1) at once
//   --signal-rank R [--signal N] rank R kills itself with signal N (default SIGKILL)
//   --sleep SECONDS              sleep before exiting
//   --sleep-rank R SECONDS       only rank R sleeps
//   --ignore-term                ignore SIGTERM (to test the escalation to SIGKILL)
//   --stderr                     also print a line to stderr
//   --partial TEXT               end stdout with TEXT and no newline
//   --echo ARG                   print "echo=ARG" (to check that arguments pass through)
//   --barrier DIR                after printing, create DIR/RANK and wait (30 s at most) until
//                                DIR holds a file per rank, so that every rank is set up
//                                before any misbehaves
// Exit status 3 when the launch environment is garbage, 2 on bad options.
#include <cohort/launch/env.hpp>

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <string>
#include <vector>

namespace {

void sleep_for(double seconds) {
  timespec left{
      static_cast<time_t>(seconds),
      static_cast<long>((seconds - static_cast<double>(static_cast<time_t>(seconds))) * 1e9)};
  while (nanosleep(&left, &left) != 0 && errno == EINTR) {
  }
}

int count_entries(const std::string& dir) {
  int count = 0;
  if (DIR* d = ::opendir(dir.c_str())) {
    while (dirent* e = ::readdir(d)) count += e->d_name[0] != '.';
    ::closedir(d);
  }
  return count;
}

void barrier(const std::string& dir, int rank, int size) {
  int fd = ::open((dir + "/" + std::to_string(rank)).c_str(), O_CREAT | O_WRONLY | O_CLOEXEC, 0644);
  if (fd >= 0) ::close(fd);
  for (int waited_ms = 0; count_entries(dir) < size && waited_ms < 30000; waited_ms += 10) {
    sleep_for(0.01);
  }
}

}  // namespace

int main(int argc, char** argv) {
  int fail_rank = -1, code = 1, signal_rank = -1, signal_number = SIGKILL, sleep_rank = -1;
  double sleep_all = 0, sleep_one = 0;
  bool ignore_term = false, to_stderr = false;
  const char* partial = nullptr;
  const char* barrier_dir = nullptr;
  std::vector<const char*> echoes;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    auto value = [&]() -> const char* {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "launch_probe: %s needs a value\n", arg.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (arg == "--fail-rank") {
      fail_rank = std::atoi(value());
    } else if (arg == "--code") {
      code = std::atoi(value());
    } else if (arg == "--signal-rank") {
      signal_rank = std::atoi(value());
    } else if (arg == "--signal") {
      signal_number = std::atoi(value());
    } else if (arg == "--sleep") {
      sleep_all = std::atof(value());
    } else if (arg == "--sleep-rank") {
      sleep_rank = std::atoi(value());
      sleep_one = std::atof(value());
    } else if (arg == "--ignore-term") {
      ignore_term = true;
    } else if (arg == "--stderr") {
      to_stderr = true;
    } else if (arg == "--partial") {
      partial = value();
    } else if (arg == "--echo") {
      echoes.push_back(value());
    } else if (arg == "--barrier") {
      barrier_dir = value();
    } else {
      std::fprintf(stderr, "launch_probe: unknown option %s\n", arg.c_str());
      return 2;
    }
  }
  if (ignore_term) ::signal(SIGTERM, SIG_IGN);  // before the line: tests signal once they see it

  cohort::launch_info info;
  try {
    info = cohort::launch_info_from_env();
  } catch (const cohort::error& e) {
    std::fprintf(stderr, "launch_probe: %s\n", e.what());
    return 3;
  }
  std::printf("rank=%d size=%d local_rank=%d local_size=%d source=%s job=%s pid=%d master=%s:%d\n",
              info.rank, info.size, info.local_rank, info.local_size,
              std::string(cohort::launcher_name(info.source)).c_str(), info.job_id.c_str(),
              static_cast<int>(::getpid()), info.master_addr.c_str(), info.master_port);
  for (const char* echo : echoes) std::printf("echo=%s\n", echo);
  if (to_stderr) std::fprintf(stderr, "stderr line from rank %d\n", info.rank);
  if (partial != nullptr) std::fputs(partial, stdout);
  std::fflush(stdout);  // a pipe is fully buffered and a killed rank flushes nothing
  std::fflush(stderr);
  if (barrier_dir != nullptr) barrier(barrier_dir, info.rank, info.size);

  if (info.rank == fail_rank) return code;
  if (info.rank == signal_rank) {
    ::raise(signal_number);
    return 99;  // the signal did not end us
  }
  if (info.rank == sleep_rank) sleep_for(sleep_one);
  if (sleep_all > 0) sleep_for(sleep_all);
  return 0;
}
