// Times all_reduce (f32 sum) over the shm transport: P forked ranks, or the ranks of a launcher
// (cohort-run, mpirun) when its environment is set. Also times single-thread memcpy.
//
//   shm_bench_all_reduce -n 2 [--sizes 4,1024,...] [--reps 7] [--chunk B] [--ring B]
//   shm_bench_all_reduce --memcpy [--sizes ...]
//
// --check verifies every result (each element must equal P) and exits 1 otherwise; with it the
// program is also a smoke test under a launcher (cohort-run -n 3 shm_bench_all_reduce --check).
//
// Prints one line per size: bytes, median us, min us, max us (over the repetitions), algbw and
// busbw (GB/s, nccl-tests convention: busbw = algbw * 2(P-1)/P). Each repetition times enough
// back-to-back calls to last about 50 ms (at least 3), after a barrier; rank 0 reports.
#include <cohort/cohort.hpp>
#include <cohort/transport/shm.hpp>

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {

using seconds = std::chrono::duration<double>;

std::vector<std::size_t> parse_sizes(const char* s) {
  std::vector<std::size_t> v;
  for (const char* p = s; *p;) {
    char* end = nullptr;
    v.push_back(std::strtoull(p, &end, 10));
    p = *end == ',' ? end + 1 : end;
  }
  return v;
}

struct stats {
  double median, min, max;
};
stats summarize(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return {v[v.size() / 2], v.front(), v.back()};
}

void print(std::size_t bytes, stats s, double bus_factor) {
  const double algbw = static_cast<double>(bytes) / s.median / 1e3;  // us -> GB/s
  std::printf("%10zu %12.3f %12.3f %12.3f %9.3f %9.3f\n", bytes, s.median, s.min, s.max, algbw,
              algbw * bus_factor);
  std::fflush(stdout);
}

bool check_results = false;

template <class Comm>
void run(Comm& comm, const std::vector<std::size_t>& sizes, int reps) {
  const int p = comm.size();
  if (comm.rank() == 0)
    std::printf("# all_reduce f32 sum, P=%d: bytes median_us min_us max_us algbw busbw\n", p);
  for (std::size_t bytes : sizes) {
    const std::size_t n = std::max<std::size_t>(1, bytes / sizeof(float));
    std::vector<float> x(n, 1.0f), y(n);
    for (int i = 0; i < 3; ++i) cohort::all_reduce(comm, x, y, cohort::ops::sum);  // warm up
    // Calibrate: enough calls for ~50 ms per repetition; rank 0 decides for everyone.
    cohort::barrier(comm);
    auto t0 = std::chrono::steady_clock::now();
    cohort::all_reduce(comm, x, y, cohort::ops::sum);
    double one = seconds(std::chrono::steady_clock::now() - t0).count();
    cohort::broadcast(comm, std::span(&one, 1), 0);
    const int iters = std::clamp(static_cast<int>(0.05 / std::max(one, 1e-7)), 3, 200000);
    std::vector<double> us;
    for (int r = 0; r < reps; ++r) {
      cohort::barrier(comm);
      t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < iters; ++i) cohort::all_reduce(comm, x, y, cohort::ops::sum);
      us.push_back(seconds(std::chrono::steady_clock::now() - t0).count() * 1e6 / iters);
    }
    if (check_results && std::any_of(y.begin(), y.end(), [&](float v) { return v != static_cast<float>(p); })) {
      std::fprintf(stderr, "rank %d: wrong all_reduce result at %zu bytes\n", comm.rank(), bytes);
      std::exit(1);
    }
    if (comm.rank() == 0) print(n * sizeof(float), summarize(us), 2.0 * (p - 1) / p);
  }
}

void run_memcpy(const std::vector<std::size_t>& sizes, int reps) {
  std::printf("# memcpy, one thread: bytes median_us min_us max_us GB/s GB/s\n");
  for (std::size_t bytes : sizes) {
    std::vector<char> a(bytes, 1), b(bytes, 2);
    const int iters = static_cast<int>(std::clamp<std::size_t>((std::size_t{1} << 30) / bytes, 3, 1000000));
    std::vector<double> us;
    for (int r = 0; r < reps; ++r) {
      auto t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < iters; ++i) {
        std::memcpy(b.data(), a.data(), bytes);
        asm volatile("" ::"r"(b.data()) : "memory");
      }
      us.push_back(seconds(std::chrono::steady_clock::now() - t0).count() * 1e6 / iters);
    }
    print(bytes, summarize(us), 1.0);
  }
}

}  // namespace

int main(int argc, char** argv) {
  int p = 2, reps = 7;
  bool memcpy_only = false;
  std::vector<std::size_t> sizes = {4, 1024, 65536, 1 << 20, 16 << 20, 64 << 20};
  cohort::shm_options opts;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&] { return i + 1 < argc ? argv[++i] : (std::fprintf(stderr, "%s needs a value\n", a.c_str()), std::exit(2), nullptr); };
    if (a == "-n") p = std::atoi(next());
    else if (a == "--sizes") sizes = parse_sizes(next());
    else if (a == "--reps") reps = std::atoi(next());
    else if (a == "--chunk") opts.chunk_bytes = std::strtoull(next(), nullptr, 10);
    else if (a == "--ring") opts.ring_bytes = std::strtoull(next(), nullptr, 10);
    else if (a == "--spin-us") opts.spin = std::chrono::microseconds(std::atoi(next()));
    else if (a == "--yield-us") opts.yield = std::chrono::microseconds(std::atoi(next()));
    else if (a == "--memcpy") memcpy_only = true;
    else if (a == "--check") check_results = true;
    else {
      std::fprintf(stderr, "unknown argument %s\n", a.c_str());
      return 2;
    }
  }
  if (memcpy_only) {
    run_memcpy(sizes, reps);
    return 0;
  }
  if (std::getenv("COHORT_RANK") || std::getenv("OMPI_COMM_WORLD_RANK")) {  // under a launcher
    auto comm = cohort::make_shm_communicator(cohort::launch_info_from_env(), opts);
    run(comm, sizes, reps);
    return 0;
  }
  const std::string job = "bench-" + std::to_string(::getpid());
  std::vector<pid_t> kids;
  for (int r = 0; r < p; ++r) {
    const pid_t pid = ::fork();
    if (pid == 0) {
      int status = 0;
      try {
        cohort::shm_communicator comm(std::in_place, job, r, p, opts);
        run(comm, sizes, reps);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "rank %d: %s\n", r, e.what());
        status = 1;
      }
      std::fflush(stdout);
      ::_exit(status);
    }
    kids.push_back(pid);
  }
  int failed = 0;
  for (pid_t k : kids) {
    int st = 0;
    ::waitpid(k, &st, 0);
    failed += !(WIFEXITED(st) && WEXITSTATUS(st) == 0);
  }
  return failed == 0 ? 0 : 1;
}
