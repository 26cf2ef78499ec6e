// cohort-cuda-bench: the device kernels and the CUDA IPC all_reduce against the device's own
// copy bandwidth, measured in the same run (see bench/results/cuda.md for the model).
//
// usage: cohort-cuda-bench [--mib M] [--iters N] [--procs P] [--skip-kernels] [--skip-ipc]
//   kernels  one process: cudaMemcpy device-to-device, then each kernel on M MiB of fp32 input
//            (default 256), timed with events, median of N (default 20) after 3 warm-ups; the
//            copy is re-measured between kernels. "traffic" counts bytes read + written; the
//            copy's traffic rate (2 x copy bandwidth) is what a memory-bound kernel can reach.
//   ipc      P processes (default 2) on the device(s), each all_reduce (f32 sum, in place) of
//            M MiB per rank over cuda_ipc_communicator + shm; busbw = algbw * 2(P-1)/P, set
//            against the copy bandwidth measured by rank 0 in the same run.
// Without a CUDA device it prints why and exits 77.
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cohort/collectives/barrier.hpp>
#include <cohort/compress/top_k.hpp>
#include <cohort/cuda/codecs.hpp>
#include <cohort/cuda/ipc.hpp>
#include <cohort/cuda/reduce.hpp>
#include <cohort/cuda/runtime.hpp>
#include <cohort/transport/shm.hpp>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

extern char** environ;

namespace cc = cohort::cuda;
using namespace std::chrono_literals;

namespace {

struct options {
  std::size_t mib = 256;
  int iters = 20;
  int procs = 2;
  bool kernels = true;
  bool ipc = true;
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

// Median milliseconds of `fn` enqueued on `s`, timed with events.
double time_ms(cc::stream& s, int iters, const std::function<void()>& fn) {
  cc::event start, stop;
  for (int i = 0; i < 3; ++i) fn();
  std::vector<double> ms;
  for (int i = 0; i < iters; ++i) {
    start.record(s);
    fn();
    stop.record(s);
    stop.synchronize();
    ms.push_back(stop.since(start));
  }
  return median(ms);
}

double copy_gbps(cc::stream& s, int iters, void* dst, const void* src, std::size_t bytes) {
  const double ms = time_ms(s, iters, [&] {
    cc::check(cohort_cuda_memcpy(dst, src, bytes, s), "bench", "cudaMemcpyAsync");
  });
  return static_cast<double>(bytes) / (ms * 1e6);
}

int kernels(const options& o) {
  const std::size_t n = o.mib * (std::size_t{1} << 20) / sizeof(float), bytes = n * sizeof(float);
  cc::stream s;
  cc::device_buffer<float> a(n), b(n), c(n), r(n);
  cc::device_buffer<std::byte> wire(bytes + 4 * (n / 256 + 1));
  cc::check(cohort_cuda_memset(a.data(), 0, bytes, s), "bench", "memset");
  cc::check(cohort_cuda_memset(b.data(), 0, bytes, s), "bench", "memset");
  cc::check(cohort_cuda_memset(r.data(), 0, bytes, s), "bench", "memset");
  const auto top_sampled = cohort::compress::top_k(0.01, cohort::compress::selection::sampled);
  const auto top_exact = cohort::compress::top_k(0.01, cohort::compress::selection::exact);
  const std::size_t wb =
      std::max(cc::top_k_workspace_bytes(top_exact, n), cc::top_k_workspace_bytes(top_sampled, n));
  cc::device_buffer<std::byte> work(wb);

  const double copy0 = copy_gbps(s, o.iters, c.data(), a.data(), bytes);
  std::printf("device-to-device cudaMemcpy of %zu MiB: %.1f GB/s copied (%.1f GB/s traffic)\n\n",
              o.mib, copy0, 2 * copy0);
  std::printf("%-34s %10s %10s %12s %9s\n", "kernel", "traffic", "ms", "traffic GB/s", "of copy");
  double copy_latest = copy0;
  const auto row = [&](const char* name, double traffic_bytes, const std::function<void()>& fn) {
    const double ms = time_ms(s, o.iters, fn);
    const double gbps = traffic_bytes / (ms * 1e6);
    copy_latest = copy_gbps(s, o.iters, c.data(), a.data(), bytes);  // same run, interleaved
    std::printf("%-34s %8.0fMB %10.3f %12.1f %8.0f%%\n", name, traffic_bytes / 1e6, ms, gbps,
                100.0 * gbps / (2 * copy_latest));
  };
  const auto B = static_cast<double>(bytes);
  auto* h = reinterpret_cast<cohort::bf16*>(wire.data());
  row("reduce f32 sum (a+b->c)", 3 * B,
      [&] { cc::combine(a.data(), b.data(), c.data(), n, cohort::ops::sum, s); });
  row("reduce f32 avg, finalize", 3 * B, [&] {
    const float* src[] = {a.data(), b.data()};
    float* const dst[] = {c.data()};
    cc::fold<float>(std::span<const float* const>(src), std::span<float* const>(dst), n,
                    cohort::ops::avg, 2, s);
  });
  auto* ha = reinterpret_cast<cohort::bf16*>(a.data());
  auto* hb = reinterpret_cast<cohort::bf16*>(b.data());
  auto* hc = reinterpret_cast<cohort::bf16*>(c.data());
  row("reduce bf16 sum (fp32 acc)", 3 * B,
      [&] { cc::combine(ha, hb, hc, 2 * n, cohort::ops::sum, s); });
  row("cast f32->bf16 encode", 1.5 * B, [&] { cc::cast_encode(a.data(), h, n, s); });
  row("cast bf16->f32 decode (assign)", 1.5 * B,
      [&] { cc::cast_decode(h, c.data(), n, cohort::compress::decode_mode::assign, s); });
  row("cast bf16->f32 decode (add)", 2.5 * B,
      [&] { cc::cast_decode(h, c.data(), n, cohort::compress::decode_mode::add, s); });
  row("cast bf16 + error feedback", 3.5 * B,
      [&] { cc::cast_encode_feedback(a.data(), r.data(), h, n, false, s); });
  row("int8 encode (block 256)", 1.25 * B,
      [&] { cc::int8_encode(cc::int8_codec{}, a.data(), wire.data(), n, s); });
  row("int8 decode (assign)", 1.25 * B,
      [&] { cc::int8_decode(wire.data(), c.data(), n, cohort::compress::decode_mode::assign, s); });
  row("int8 + error feedback", 3.25 * B, [&] {
    cc::int8_encode_feedback(cc::int8_codec{}, a.data(), r.data(), wire.data(), n, false, s);
  });
  row("top-k 1% exact (radix, synchronizes)", B,
      [&] { cc::top_k_encode(top_exact, a.data(), n, wire.data(), work.data(), wb, s); });
  row("top-k 1% sampled (synchronizes)", B,
      [&] { cc::top_k_encode(top_sampled, a.data(), n, wire.data(), work.data(), wb, s); });
  std::printf("\n(traffic counts one pass over the input for top-k; it makes several)\n");
  std::printf("copy bandwidth first/last: %.1f / %.1f GB/s\n", copy0, copy_latest);
  return 0;
}

// One rank of the IPC measurement.
int ipc_rank(const options& o, int rank, int size, const std::string& job) {
  const int devices = cc::device_count();
  cc::set_device(rank % devices);
  cohort::shm_communicator host(std::in_place, job, rank, size);
  cohort::cuda_ipc_communicator gpu(host);
  const std::size_t n = o.mib * (std::size_t{1} << 20) / sizeof(float), bytes = n * sizeof(float);
  cc::stream s;
  cc::device_buffer<float> x(n), y(n);
  cc::check(cohort_cuda_memset(x.data(), 0, bytes, s), "bench", "memset");
  double copy_before = 0, copy_after = 0;
  if (rank == 0) copy_before = copy_gbps(s, o.iters, y.data(), x.data(), bytes);
  cohort::barrier(host);
  std::vector<double> seconds;
  for (int i = 0; i < 3 + o.iters; ++i) {
    cohort::barrier(host);
    const auto t0 = std::chrono::steady_clock::now();
    cohort::all_reduce(gpu, x.data(), x.data(), n, cohort::ops::sum, s);
    cohort::synchronize(gpu, s);
    cohort::barrier(host);
    const std::chrono::duration<double> t = std::chrono::steady_clock::now() - t0;
    if (i >= 3) seconds.push_back(t.count());
  }
  if (rank == 0) copy_after = copy_gbps(s, o.iters, y.data(), x.data(), bytes);
  if (rank == 0) {
    const double t = median(seconds);
    const double algbw = static_cast<double>(bytes) / t / 1e9;
    const double busbw = algbw * 2.0 * (size - 1) / size;
    const double copy = (copy_before + copy_after) / 2;
    char name[256] = "?";
    cohort_cuda_device_name(rank % devices, name, sizeof name);
    std::printf(
        "CUDA IPC all_reduce f32 sum, %d processes on %d device(s) (%s), %zu MiB per rank:\n", size,
        std::min(devices, size), name, o.mib);
    std::printf("  median %.3f ms over %d iterations (host clock, barrier to barrier)\n", t * 1e3,
                o.iters);
    std::printf("  algbw %.1f GB/s, busbw %.1f GB/s\n", algbw, busbw);
    std::printf(
        "  device copy bandwidth (same run) %.1f GB/s: busbw is %.0f%% of it; the bound "
        "for P ranks on one GPU is 2(P-1)/P^2 = %.0f%%\n",
        copy, 100 * busbw / copy, 100.0 * 2 * (size - 1) / (size * size));
  }
  return 0;
}

int ipc(const char* self, const options& o) {
  const std::string job = "cohort-cuda-bench-" + std::to_string(::getpid());
  std::vector<pid_t> pids;
  for (int r = 0; r < o.procs; ++r) {
    const std::string rs = std::to_string(r), ps = std::to_string(o.procs),
                      ms = std::to_string(o.mib), is = std::to_string(o.iters);
    std::vector<char*> argv = {const_cast<char*>(self),        const_cast<char*>("--ipc-rank"),
                               const_cast<char*>(rs.c_str()),  const_cast<char*>(ps.c_str()),
                               const_cast<char*>(job.c_str()), const_cast<char*>(ms.c_str()),
                               const_cast<char*>(is.c_str()),  nullptr};
    pid_t pid = 0;
    if (::posix_spawn(&pid, "/proc/self/exe", nullptr, nullptr, argv.data(), environ) != 0) {
      std::perror("posix_spawn");
      return 1;
    }
    pids.push_back(pid);
  }
  int bad = 0;
  for (pid_t pid : pids) {
    int status = 0;
    ::waitpid(pid, &status, 0);
    bad += !WIFEXITED(status) || WEXITSTATUS(status) != 0;
  }
  return bad == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  options o;
  if (argc == 7 && std::string_view(argv[1]) == "--ipc-rank") {
    o.mib = std::strtoull(argv[5], nullptr, 10);
    o.iters = std::atoi(argv[6]);
    try {
      return ipc_rank(o, std::atoi(argv[2]), std::atoi(argv[3]), argv[4]);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "rank %s: %s\n", argv[2], e.what());
      return 1;
    }
  }
  for (int i = 1; i < argc; ++i) {
    const std::string_view a = argv[i];
    if (a == "--mib" && i + 1 < argc)
      o.mib = std::strtoull(argv[++i], nullptr, 10);
    else if (a == "--iters" && i + 1 < argc)
      o.iters = std::atoi(argv[++i]);
    else if (a == "--procs" && i + 1 < argc)
      o.procs = std::atoi(argv[++i]);
    else if (a == "--skip-kernels")
      o.kernels = false;
    else if (a == "--skip-ipc")
      o.ipc = false;
    else {
      std::fprintf(stderr,
                   "usage: %s [--mib M] [--iters N] [--procs P] [--skip-kernels] [--skip-ipc]\n",
                   argv[0]);
      return 2;
    }
  }
  std::string why;
  if (cc::device_count(&why) == 0) {
    std::fprintf(stderr, "cohort-cuda-bench: no CUDA device (%s): nothing to measure\n",
                 why.c_str());
    return 77;
  }
  if (o.mib == 0 || o.iters <= 0 || o.procs < 2) {
    std::fprintf(stderr,
                 "cohort-cuda-bench: --mib and --iters must be positive, --procs at least 2\n");
    return 2;
  }
  try {
    int rc = 0;
    if (o.kernels) rc |= kernels(o);
    if (o.ipc) rc |= ipc(argv[0], o);
    return rc;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "cohort-cuda-bench: %s\n", e.what());
    return 1;
  }
}
