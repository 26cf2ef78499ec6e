// Parameter server push + pull against all_reduce, one host, ranks as processes.
//
//   ps_bench --transport shm|tcp --bytes N [--iters K] [--servers S] [--ranks P]
//            [--mode sync|async] [--repeats R]
//
// Runs P ranks (default 4) twice per repeat, interleaved: S servers + (P - S) workers, each
// worker doing `push(key, grad); pull(key, weights); wait_all()` on one key of N bytes K times
// (one training round: the gradient in, the updated weights out); then P ranks calling
// all_reduce(avg) on N bytes K times. Prints the median time per round and per all_reduce of
// each repeat, and algbw = N / time.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cohort/cohort.hpp>
#include <cohort/launch/env.hpp>
#include <cohort/parameter_server.hpp>
#include <cohort/transport/shm.hpp>
#include <cohort/transport/tcp.hpp>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

namespace ps = cohort::ps;
using clock_type = std::chrono::steady_clock;

namespace {

struct settings {
  std::string transport = "shm", mode = "sync";
  std::size_t bytes = 1 << 20;
  int iters = 20, servers = 2, ranks = 4, repeats = 3;
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

// Rank body; writes the median seconds per iteration into *out (rank `reporter` only).
template <class Comm>
void body(Comm& comm, const settings& s, bool parameter_server, double* out) {
  const std::size_t n = s.bytes / sizeof(float);
  std::vector<double> times;
  if (parameter_server) {
    const ps::roles roles{s.servers, comm.size()};
    const std::vector<ps::key_spec> keys = {{0, n}};
    if (roles.is_server(comm.rank())) {
      ps::server_options o;
      o.mode = s.mode == "async" ? ps::consistency::async() : ps::consistency::sync();
      ps::server srv(comm, keys, roles, o);
      srv.serve();
      return;
    }
    ps::worker wk(comm, keys, roles);
    std::vector<float> g(n, 1e-3f), w(n);
    for (int i = 0; i < s.iters + 2; ++i) {
      const auto t0 = clock_type::now();
      wk.push(0, g);
      wk.pull(0, w);
      wk.wait_all();
      if (i >= 2) times.push_back(std::chrono::duration<double>(clock_type::now() - t0).count());
    }
    wk.finish();
    if (comm.rank() == s.servers) *out = median(times);
  } else {
    std::vector<float> g(n, 1e-3f);
    for (int i = 0; i < s.iters + 2; ++i) {
      const auto t0 = clock_type::now();
      cohort::all_reduce(comm, std::span(g), cohort::ops::avg);
      if (i >= 2) times.push_back(std::chrono::duration<double>(clock_type::now() - t0).count());
    }
    if (comm.rank() == 0) *out = median(times);
  }
}

int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  const bool ok = fd >= 0 && ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 &&
                  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0;
  if (fd >= 0) ::close(fd);
  return ok ? ntohs(a.sin_port) : 29500;
}

// Runs one job of s.ranks processes; returns the reporter's median seconds, or -1.
double run_job(const settings& s, bool parameter_server) {
  static int counter = 0;
  cohort::launch_info info;
  info.size = info.local_size = s.ranks;
  info.job_id = "psb-" + std::to_string(::getpid()) + "-" + std::to_string(++counter);
  info.master_addr = "127.0.0.1";
  info.master_port = free_port();
  int pipefd[2];
  if (::pipe(pipefd) != 0) return -1;
  std::vector<pid_t> pids;
  for (int r = 0; r < s.ranks; ++r) {
    const pid_t pid = ::fork();
    if (pid == 0) {
      info.rank = info.local_rank = r;
      double result = -1;
      int code = 0;
      try {
        if (s.transport == "tcp") {
          auto comm = cohort::make_tcp_communicator(info);
          body(comm, s, parameter_server, &result);
        } else {
          auto comm = cohort::make_shm_communicator(info);
          body(comm, s, parameter_server, &result);
        }
      } catch (const std::exception& e) {
        std::fprintf(stderr, "rank %d: %s\n", r, e.what());
        code = 1;
      }
      if (result >= 0) (void)!::write(pipefd[1], &result, sizeof result);
      std::fflush(nullptr);
      ::_exit(code);
    }
    pids.push_back(pid);
  }
  ::close(pipefd[1]);
  double result = -1;
  if (::read(pipefd[0], &result, sizeof result) != sizeof result) result = -1;
  ::close(pipefd[0]);
  for (pid_t p : pids) {
    int st = 0;
    ::waitpid(p, &st, 0);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) result = -1;
  }
  return result;
}

}  // namespace

int main(int argc, char** argv) {
  settings s;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i], v = argv[i + 1];
    if (a == "--transport")
      s.transport = v;
    else if (a == "--bytes")
      s.bytes = std::stoull(v);
    else if (a == "--iters")
      s.iters = std::stoi(v);
    else if (a == "--servers")
      s.servers = std::stoi(v);
    else if (a == "--ranks")
      s.ranks = std::stoi(v);
    else if (a == "--mode")
      s.mode = v;
    else if (a == "--repeats")
      s.repeats = std::stoi(v);
    else {
      std::fprintf(stderr, "ps_bench: unknown option %s\n", a.c_str());
      return 2;
    }
  }
  std::vector<double> ps_t, ar_t;
  for (int r = 0; r < s.repeats; ++r) {
    const double p = run_job(s, true), a = run_job(s, false);
    if (p < 0 || a < 0) return 1;
    ps_t.push_back(p);
    ar_t.push_back(a);
  }
  const auto report = [&](const char* what, std::vector<double> t) {
    std::sort(t.begin(), t.end());
    const double m = t[t.size() / 2];
    std::printf("%-10s %s %9zu B  %9.3f ms  (%.3f..%.3f)  algbw %6.2f GB/s\n", what,
                s.transport.c_str(), s.bytes, m * 1e3, t.front() * 1e3, t.back() * 1e3,
                double(s.bytes) / m / 1e9);
  };
  std::printf(
      "P = %d: parameter server %d servers + %d workers (%s), all_reduce over %d ranks;"
      " median of %d repeats of the median of %d iterations\n",
      s.ranks, s.servers, s.ranks - s.servers, s.mode.c_str(), s.ranks, s.repeats, s.iters);
  report("push+pull", ps_t);
  report("all_reduce", ar_t);
  return 0;
}
