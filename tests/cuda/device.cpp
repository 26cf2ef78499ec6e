// Device tests: the kernels against the host codecs, and CUDA IPC all_reduce with P processes
// on one GPU (or on P GPUs) against a host reference. Without a device: exit 77 (SKIP).
//
// usage: test_cuda_device CASE PROCS                        launcher: PROCS ranks of itself
//        test_cuda_device --rank R --size P --job ID CASE   one rank
// CASE: codecs (1 process), all_reduce, failures, peer_lost (2 processes).
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cohort/collectives/barrier.hpp>
#include <cohort/compress/cast.hpp>
#include <cohort/compress/compose.hpp>
#include <cohort/compress/error_feedback.hpp>
#include <cohort/compress/quantize.hpp>
#include <cohort/compress/top_k.hpp>
#include <cohort/cuda/codecs.hpp>
#include <cohort/cuda/ipc.hpp>
#include <cohort/cuda/reduce.hpp>
#include <cohort/cuda/runtime.hpp>
#include <cohort/transport/shm.hpp>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "model.hpp"

extern char** environ;

namespace cc = cohort::cuda;
namespace ct = cohort::cuda::test;
namespace cz = cohort::compress;
using cohort::bf16;
using cohort::fp16;
using namespace std::chrono_literals;

namespace {

int rank_ = 0;
int failures_ = 0;

#define EXPECT(cond, ...)                                                                       \
  do {                                                                                          \
    if (!(cond)) {                                                                              \
      ++failures_;                                                                              \
      if (failures_ < 20) {                                                                     \
        std::fprintf(stderr, "rank %d: %s:%d: failed: %s: ", rank_, __FILE__, __LINE__, #cond); \
        std::fprintf(stderr, __VA_ARGS__);                                                      \
        std::fprintf(stderr, "\n");                                                             \
      }                                                                                         \
    }                                                                                           \
  } while (0)

template <class T>
std::vector<T> to_host(const T* d, std::size_t n, cc::stream_t s) {
  std::vector<T> h(n);
  cc::copy(h.data(), d, n, s);
  cc::check(cohort_cuda_stream_synchronize(s), "test", "cudaStreamSynchronize");
  return h;
}

template <class T>
void to_device(T* d, const std::vector<T>& h, cc::stream_t s) {
  cc::copy(d, h.data(), h.size(), s);
  cc::check(cohort_cuda_stream_synchronize(s), "test", "cudaStreamSynchronize");
}

template <class T>
T from_float(float x, bool near_one) {
  if (near_one) x = 1.0f + x * 1e-3f;
  if constexpr (std::is_same_v<T, float>)
    return x;
  else if constexpr (std::is_same_v<T, double>)
    return static_cast<double>(x) * 1.000000119;
  else
    return T(x);
}

template <class T>
std::size_t first_difference(const std::vector<T>& a, const std::vector<T>& b) {
  for (std::size_t i = 0; i < a.size(); ++i)
    if (!ct::same_or_nan(a[i], b[i])) return i;
  return a.size();
}

std::size_t first_byte_difference(std::span<const std::byte> a, std::span<const std::byte> b) {
  if (a.size() != b.size()) return 0;
  for (std::size_t i = 0; i < a.size(); ++i)
    if (a[i] != b[i]) return i;
  return a.size();
}

// Gradient data with the awkward values sprinkled in (NaN optional).
std::vector<float> data(std::uint64_t seed, std::size_t n, bool specials) {
  auto v = ct::gradient(seed, n);
  if (specials) {
    const float s[] = {-0.0f, 1e-40f, INFINITY, -INFINITY, NAN, 65520.0f, 3e38f};
    for (std::size_t i = 5; i < n; i += 97) v[i] = s[i % std::size(s)];
  }
  return v;
}

// --- codecs (one process) --------------------------------------------------------------------

template <class W>
void check_casts(cc::stream& s) {
  const cz::cast_codec<W> host{};
  for (std::size_t n : {0u, 1u, 7u, 8u, 9u, 1000u, 1000003u}) {
    for (std::size_t off : {0u, 1u}) {
      const auto x = data(n + off, n, true);
      cc::device_buffer<float> dx(n + off + 1), dr(n + off + 1);
      cc::device_buffer<W> dw(n + off + 1);
      to_device(dx.data() + off, x, s);
      cc::cast_encode(dx.data() + off, dw.data() + off, n, s);
      std::vector<W> want(n);
      host.encode(x, want);
      const auto got = to_host(dw.data() + off, n, s);
      EXPECT(std::memcmp(want.data(), got.data(), n * sizeof(W)) == 0, "cast encode n=%zu off=%zu",
             n, off);
      for (int mode = 0; mode < 3; ++mode) {
        const auto start = data(n + 99, n, false);
        to_device(dr.data() + off, start, s);
        cc::cast_decode(dw.data() + off, dr.data() + off, n, static_cast<cz::decode_mode>(mode), s);
        auto ref = start;
        host.decode(std::span<const W>(want), ref, static_cast<cz::decode_mode>(mode));
        const auto dec = to_host(dr.data() + off, n, s);
        EXPECT(first_difference(dec, ref) == n, "cast decode n=%zu mode=%d", n, mode);
      }
    }
  }
  // Fused error feedback, three steps, against compress::error_feedback.
  const std::size_t n = 100003;
  cz::error_feedback ef(host);
  cc::device_buffer<float> g(n), r(n);
  cc::device_buffer<W> w(n);
  cc::check(cohort_cuda_memset(r.data(), 0xFF, r.bytes(), s), "test",
            "memset");  // NaN: never read on the first step
  for (std::uint64_t step = 0; step < 3; ++step) {
    const auto x = data(500 + step, n, false);
    to_device(g.data(), x, s);
    cc::cast_encode_feedback(g.data(), r.data(), w.data(), n, step == 0, s);
    std::vector<std::byte> want(n * sizeof(W));
    ef.encode(x, want, {}, 0);
    const auto got = to_host(w.data(), n, s);
    const auto res = to_host(r.data(), n, s);
    EXPECT(std::memcmp(want.data(), got.data(), want.size()) == 0, "cast feedback step %d",
           int(step));
    EXPECT(
        first_difference(res, std::vector<float>(ef.residual().begin(), ef.residual().end())) == n,
        "cast feedback residual step %d", int(step));
  }
}

void check_int8(cc::stream& s) {
  for (bool stochastic : {false, true}) {
    cc::int8_codec codec;
    codec.stochastic = stochastic;
    codec.seed = 99;
    for (std::size_t n : {1u, 255u, 256u, 257u, 70001u, 1u << 22}) {
      auto x = data(n, n, false);
      if (n > 600) x[513] = NAN;  // block 2 decodes to NaN
      const std::uint64_t salt = 1234 + n;
      cc::device_buffer<float> dx(n), dy(n);
      cc::device_buffer<std::byte> de(codec.encoded_bytes(n));
      to_device(dx.data(), x, s);
      cc::int8_encode(codec, dx.data(), de.data(), n, s, salt);
      std::vector<std::byte> want(codec.encoded_bytes(n));
      codec.encode(x, want, {}, salt);
      const auto got = to_host(de.data(), want.size(), s);
      EXPECT(first_byte_difference(want, got) == want.size(),
             "int8 encode n=%zu stochastic=%d at %zu", n, int(stochastic),
             first_byte_difference(want, got));
      for (int mode = 0; mode < 3; ++mode) {
        const auto start = data(7 + n, n, false);
        to_device(dy.data(), start, s);
        cc::int8_decode(de.data(), dy.data(), n, static_cast<cz::decode_mode>(mode), s);
        auto ref = start;
        codec.decode(want, ref, static_cast<cz::decode_mode>(mode));
        EXPECT(first_difference(to_host(dy.data(), n, s), ref) == n, "int8 decode n=%zu mode=%d", n,
               mode);
      }
    }
    const std::size_t n = 300001;
    cz::error_feedback ef(codec);
    cc::device_buffer<float> g(n), r(n);
    cc::device_buffer<std::byte> e(codec.encoded_bytes(n));
    cc::check(cohort_cuda_memset(r.data(), 0xFF, r.bytes(), s), "test",
              "memset");  // NaN: never read on the first step
    for (std::uint64_t step = 0; step < 3; ++step) {
      const auto x = data(900 + step, n, false);
      to_device(g.data(), x, s);
      cc::int8_encode_feedback(codec, g.data(), r.data(), e.data(), n, step == 0, s, step);
      std::vector<std::byte> want(codec.encoded_bytes(n));
      ef.encode(x, want, {}, step);
      EXPECT(to_host(e.data(), want.size(), s) == want, "int8 feedback step %d", int(step));
      EXPECT(first_difference(to_host(r.data(), n, s),
                              std::vector<float>(ef.residual().begin(), ef.residual().end())) == n,
             "int8 feedback residual step %d", int(step));
    }
  }
}

template <class V>
void check_top_k(cc::stream& s) {
  for (auto method : {cz::selection::exact, cz::selection::sampled}) {
    for (double ratio : {0.001, 0.01, 0.3, 1.0}) {
      const cz::top_k_codec<V> codec{ratio, method};
      for (std::size_t n : {1u, 1000u, 100003u, 1u << 20}) {
        const auto x = data(n + 5, n, true);
        const std::uint64_t salt = 42 + n;
        std::vector<std::uint32_t> out((codec.max_encoded_bytes(n) + 3) / 4 + 1);
        std::vector<std::uint32_t> work(codec.workspace_bytes(n) / 4 + 1);
        const std::size_t len = codec.encode(x, std::as_writable_bytes(std::span(out)),
                                             std::as_writable_bytes(std::span(work)), salt);
        const auto want = std::as_bytes(std::span(out)).first(len);
        cc::device_buffer<float> dx(n);
        cc::device_buffer<std::byte> dout(codec.max_encoded_bytes(n) + 4);
        const std::size_t wb = cc::top_k_workspace_bytes(codec, n);
        cc::device_buffer<std::byte> dwork(wb);
        to_device(dx.data(), x, s);
        const std::size_t got_len =
            cc::top_k_encode(codec, dx.data(), n, dout.data(), dwork.data(), wb, s, salt);
        const auto got = to_host(dout.data(), got_len, s);
        EXPECT(got_len == len && first_byte_difference(want, got) == len,
               "top_k %s ratio=%g n=%zu: %zu vs %zu bytes", codec.name().c_str(), ratio, n, got_len,
               len);
      }
    }
  }
  // Fused error feedback.
  const std::size_t n = 200003;
  const cz::top_k_codec<V> codec{0.01, cz::selection::sampled};
  cz::error_feedback ef(codec);
  cc::device_buffer<float> g(n), r(n);
  cc::device_buffer<std::byte> dout(codec.max_encoded_bytes(n) + 4);
  const std::size_t wb = cc::top_k_workspace_bytes(codec, n);
  cc::device_buffer<std::byte> dwork(wb);
  cc::check(cohort_cuda_memset(r.data(), 0xFF, r.bytes(), s), "test",
            "memset");  // NaN: never read on the first step
  for (std::uint64_t step = 0; step < 3; ++step) {
    const auto x = data(77 + step, n, false);
    to_device(g.data(), x, s);
    const std::size_t len = cc::top_k_encode_feedback(codec, g.data(), r.data(), step == 0, n,
                                                      dout.data(), dwork.data(), wb, s, step);
    std::vector<std::uint32_t> out((codec.max_encoded_bytes(n) + 3) / 4 + 1);
    std::vector<std::uint32_t> work(codec.workspace_bytes(n) / 4 + 1);
    const std::size_t want_len = ef.encode(x, std::as_writable_bytes(std::span(out)),
                                           std::as_writable_bytes(std::span(work)), step);
    const auto got = to_host(dout.data(), len, s);
    EXPECT(len == want_len &&
               first_byte_difference(std::as_bytes(std::span(out)).first(want_len), got) == len,
           "top_k feedback step %d", int(step));
    EXPECT(first_difference(to_host(r.data(), n, s),
                            std::vector<float>(ef.residual().begin(), ef.residual().end())) == n,
           "top_k feedback residual step %d", int(step));
  }
}

template <class T, class Op>
void check_combine(cc::stream& s, const Op& op) {
  const bool near_one = std::is_same_v<Op, cohort::ops::prod_t>;
  for (std::size_t n : {1u, 17u, 4099u, 1000003u}) {
    for (std::size_t off : {0u, 1u}) {
      const auto fa = data(n, n, true), fb = data(n + 1, n, true);
      std::vector<T> a(n), b(n);
      for (std::size_t i = 0; i < n; ++i)
        a[i] = from_float<T>(fa[i], near_one), b[i] = from_float<T>(fb[i], near_one);
      cc::device_buffer<T> da(n + 1), db(n + 1), dc(n + 1);
      to_device(da.data() + off, a, s);
      to_device(db.data(), b, s);
      cc::combine(da.data() + off, db.data(), dc.data() + off, n, op, s);
      std::vector<T> want(n);
      cohort::detail::combine(a.data(), b.data(), want.data(), n, op);
      EXPECT(first_difference(to_host(dc.data() + off, n, s), want) == n, "combine n=%zu off=%zu",
             n, off);
      // In place, finalized: the host's combine_last.
      const T* src[] = {da.data() + off, db.data()};
      T* const dst[] = {da.data() + off};
      cc::fold<T>(std::span<const T* const>(src), std::span<T* const>(dst), n, op, 3, s);
      cohort::detail::combine_last(a.data(), b.data(), want.data(), n, op, 3);
      EXPECT(first_difference(to_host(da.data() + off, n, s), want) == n, "fold in place n=%zu", n);
    }
  }
}

template <class T>
void check_combine_ops(cc::stream& s) {
  check_combine<T>(s, cohort::ops::sum);
  check_combine<T>(s, cohort::ops::prod);
  check_combine<T>(s, cohort::ops::min);
  check_combine<T>(s, cohort::ops::max);
  check_combine<T>(s, cohort::ops::avg);
}

int codecs() {
  cc::stream s;
  check_casts<fp16>(s);
  check_casts<bf16>(s);
  check_int8(s);
  check_top_k<float>(s);
  check_top_k<fp16>(s);
  check_top_k<bf16>(s);
  check_combine_ops<float>(s);
  check_combine_ops<double>(s);
  check_combine_ops<fp16>(s);
  check_combine_ops<bf16>(s);
  return failures_ == 0 ? 0 : 1;
}

// --- CUDA IPC all_reduce (P processes) -------------------------------------------------------

using gpu_comm = cohort::cuda_ipc_communicator<cohort::shm_communicator>;

template <class T, class Op>
void check_all_reduce(gpu_comm& gpu, cc::stream& s, const Op& op, std::size_t n, bool in_place,
                      std::size_t off, std::uint64_t seed) {
  const int p = gpu.size(), r = gpu.rank();
  const bool near_one = std::is_same_v<Op, cohort::ops::prod_t>;
  std::vector<std::vector<T>> x(static_cast<std::size_t>(p), std::vector<T>(n));
  for (int q = 0; q < p; ++q) {
    const auto v = data(seed * 1000 + static_cast<std::uint64_t>(q), n, false);
    for (std::size_t i = 0; i < n; ++i)
      x[static_cast<std::size_t>(q)][i] = from_float<T>(v[i], near_one);
  }
  std::vector<T> want(n);
  for (std::size_t i = 0; i < n; ++i) {
    cohort::accumulator_t<T> acc = cohort::widen(x[0][i]);
    for (int q = 1; q < p; ++q) acc = op(acc, cohort::widen(x[static_cast<std::size_t>(q)][i]));
    if constexpr (cohort::finalizing_reduction_for<Op, T>) acc = op.finalize(acc, p);
    want[i] = cohort::narrow<T>(acc);
  }
  cc::device_buffer<T> in(n + off + 1), out(n + off + 1);
  to_device(in.data() + off, x[static_cast<std::size_t>(r)], s);
  cc::check(cohort_cuda_memset(out.data(), 0xFF, out.bytes(), s), "test", "memset");
  T* dst = (in_place ? in.data() : out.data()) + off;
  cohort::all_reduce(gpu, in.data() + off, dst, n, op, s);
  cohort::synchronize(gpu, s);
  const auto got = to_host(dst, n, s);
  const std::size_t at = first_difference(got, want);
  EXPECT(at == n, "all_reduce %s %.*s n=%zu in_place=%d off=%zu: first difference at %zu",
         std::string(cohort::dtype_name(cohort::dtype_of<T>)).c_str(),
         int(cohort::detail::reduction_name<Op>().size()),
         cohort::detail::reduction_name<Op>().data(), n, int(in_place), off, at);
}

template <class T>
void check_all_reduce_ops(gpu_comm& gpu, cc::stream& s, std::uint64_t& seed) {
  for (std::size_t n : {0u, 1u, 3u, 7u, 1000u, 65541u}) {
    check_all_reduce<T>(gpu, s, cohort::ops::sum, n, false, 0, ++seed);
    check_all_reduce<T>(gpu, s, cohort::ops::prod, n, true, 0, ++seed);
    check_all_reduce<T>(gpu, s, cohort::ops::min, n, false, 1, ++seed);
    check_all_reduce<T>(gpu, s, cohort::ops::max, n, true, 1, ++seed);
    check_all_reduce<T>(gpu, s, cohort::ops::avg, n, false, 0, ++seed);
  }
}

int all_reduce_suite(cohort::shm_communicator& host) {
  gpu_comm gpu(host);
  cc::stream s;
  std::uint64_t seed = 0;
  check_all_reduce_ops<float>(gpu, s, seed);
  check_all_reduce_ops<double>(gpu, s, seed);
  check_all_reduce_ops<fp16>(gpu, s, seed);
  check_all_reduce_ops<bf16>(gpu, s, seed);
  for (std::size_t n : {std::size_t{1} << 20, std::size_t{3'000'017}}) {
    check_all_reduce<float>(gpu, s, cohort::ops::sum, n, true, 0, ++seed);
    check_all_reduce<float>(gpu, s, cohort::ops::avg, n, false, 1, ++seed);
    check_all_reduce<bf16>(gpu, s, cohort::ops::sum, n, false, 0, ++seed);
  }

  // Back to back, in place, alternating two buffers, no synchronization in between: any hole
  // in the event protocol shows as a wrong power of P.
  const int p = gpu.size(), r = gpu.rank();
  const std::size_t n = 65536 + 3;
  std::vector<float> a0(n), b0(n);
  for (std::size_t i = 0; i < n; ++i) a0[i] = float(i % 5 + r), b0[i] = float(i % 3 + 2 * r);
  cc::device_buffer<float> a(n), b(n);
  to_device(a.data(), a0, s);
  to_device(b.data(), b0, s);
  const int rounds = 16;
  for (int k = 0; k < rounds; ++k) {
    cohort::all_reduce(gpu, a.data(), a.data(), n, cohort::ops::sum, s);
    cohort::all_reduce(gpu, b.data(), b.data(), n, cohort::ops::sum, s);
  }
  cohort::synchronize(gpu, s);
  const auto ga = to_host(a.data(), n, s), gb = to_host(b.data(), n, s);
  double scale = 1;
  for (int k = 1; k < rounds; ++k) scale *= p;
  std::size_t bad = 0;
  for (std::size_t i = 0; i < n; ++i) {
    double sa = 0, sb = 0;
    for (int q = 0; q < p; ++q) sa += double(i % 5 + q), sb += double(i % 3 + 2 * q);
    bad += ga[i] != float(sa * scale) || gb[i] != float(sb * scale);
  }
  EXPECT(bad == 0, "back-to-back all_reduce: %zu wrong elements", bad);
  cohort::barrier(host);
  return failures_ == 0 ? 0 : 1;
}

int failures(cohort::shm_communicator& host) {
  gpu_comm gpu(host);
  cc::stream s;
  const int r = gpu.rank();
  std::error_code ec;
  // Host memory from rank 1: every rank is told, nobody is poisoned.
  cc::device_buffer<float> d(1000);
  std::vector<float> h(1000);
  const float* in = r == 1 ? h.data() : d.data();
  cohort::all_reduce(gpu, in, d.data(), 1000, cohort::ops::sum, s, {}, ec);
  EXPECT(ec == cohort::errc::invalid_argument, "host memory: %s", ec.message().c_str());
  EXPECT(!gpu.poisoned(), "host memory poisoned the communicator");
  std::uint64_t seed = 7;
  check_all_reduce<float>(gpu, s, cohort::ops::sum, 1000, false, 0, seed);  // still works
  // Different counts: a mismatch on every rank, naming both calls.
  try {
    cohort::all_reduce(gpu, d.data(), d.data(), r == 0 ? 100 : 101, cohort::ops::sum, s);
    EXPECT(false, "no mismatch reported");
  } catch (const cohort::error& e) {
    EXPECT(e.code() == cohort::errc::mismatch, "%s", e.what());
    EXPECT(std::string(e.what()).find("called all_reduce") != std::string::npos, "%s", e.what());
  }
  cohort::all_reduce(gpu, d.data(), d.data(), 10, cohort::ops::sum, s, {}, ec);
  EXPECT(ec == cohort::errc::poisoned, "after a mismatch: %s", ec.message().c_str());
  return failures_ == 0 ? 0 : 1;
}

int peer_lost(cohort::shm_communicator& host) {
  gpu_comm gpu(host);
  cc::stream s;
  std::uint64_t seed = 11;
  check_all_reduce<float>(gpu, s, cohort::ops::sum, 4096, false, 0, seed);
  cohort::barrier(host);
  if (gpu.rank() == 1) {
    std::fflush(stderr);
    std::_Exit(failures_ == 0 ? 0 : 1);  // dies without a word
  }
  std::this_thread::sleep_for(100ms);
  cc::device_buffer<float> d(4096);
  const auto start = std::chrono::steady_clock::now();
  std::error_code ec;
  cohort::all_reduce(gpu, d.data(), d.data(), 4096, cohort::ops::sum, s, {.timeout = 20s}, ec);
  const auto took = std::chrono::steady_clock::now() - start;
  EXPECT(ec == cohort::errc::peer_lost, "a dead peer gave %s", ec.message().c_str());
  EXPECT(
      took < 15s, "took %lld ms",
      static_cast<long long>(std::chrono::duration_cast<std::chrono::milliseconds>(took).count()));
  cohort::synchronize(gpu, s, {.timeout = 10s});
  return failures_ == 0 ? 0 : 1;
}

int run_rank(int rank, int size, const std::string& job, std::string_view what) {
  rank_ = rank;
  try {
    const int devices = cc::device_count();
    cc::set_device(rank % devices);
    if (what == "codecs") return codecs();
    cohort::shm_communicator host(std::in_place, job, rank, size);
    host.set_timeout(60s);
    if (what == "all_reduce") return all_reduce_suite(host);
    if (what == "failures") return failures(host);
    if (what == "peer_lost") return peer_lost(host);
    std::fprintf(stderr, "unknown case %.*s\n", int(what.size()), what.data());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "rank %d: %s\n", rank, e.what());
    return 1;
  }
}

// Runs `procs` ranks of this program and waits for all of them (with a deadline).
int launch(const char* self, const std::string& what, int procs) {
  std::string why;
  if (cc::device_count(&why) == 0) {
    std::fprintf(stderr, "SKIP: no CUDA device (%s)\n", why.c_str());
    return 77;
  }
  const std::string job = "cohort-cuda-test-" + std::to_string(::getpid()) + "-" + what;
  std::vector<pid_t> pids;
  for (int r = 0; r < procs; ++r) {
    const std::string rs = std::to_string(r), ps = std::to_string(procs);
    std::vector<char*> argv = {const_cast<char*>(self),
                               const_cast<char*>("--rank"),
                               const_cast<char*>(rs.c_str()),
                               const_cast<char*>("--size"),
                               const_cast<char*>(ps.c_str()),
                               const_cast<char*>("--job"),
                               const_cast<char*>(job.c_str()),
                               const_cast<char*>(what.c_str()),
                               nullptr};
    pid_t pid = 0;
    if (::posix_spawn(&pid, "/proc/self/exe", nullptr, nullptr, argv.data(), environ) != 0) {
      std::perror("posix_spawn");
      for (pid_t q : pids) ::kill(q, SIGKILL);
      return 1;
    }
    pids.push_back(pid);
  }
  const auto until = std::chrono::steady_clock::now() + 600s;
  int bad = 0;
  std::size_t left = pids.size();
  while (left > 0) {
    int status = 0;
    const pid_t done = ::waitpid(-1, &status, WNOHANG);
    if (done > 0) {
      --left;
      if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        ++bad;
        std::fprintf(stderr, "a rank (pid %d) ended with status %d\n", int(done), status);
      }
      continue;
    }
    if (std::chrono::steady_clock::now() > until) {
      std::fprintf(stderr, "ranks still running after 600 s: killed\n");
      for (pid_t q : pids) ::kill(q, SIGKILL);
      return 1;
    }
    std::this_thread::sleep_for(10ms);
  }
  std::printf("%s with %d process(es): %s\n", what.c_str(), procs, bad == 0 ? "passed" : "FAILED");
  return bad == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 8 && std::string_view(argv[1]) == "--rank")
    return run_rank(std::atoi(argv[2]), std::atoi(argv[4]), argv[6], argv[7]);
  if (argc != 3) {
    std::fprintf(stderr, "usage: %s codecs|all_reduce|failures|peer_lost PROCS\n", argv[0]);
    return 2;
  }
  return launch(argv[0], argv[1], std::atoi(argv[2]));
}
