// The CUDA code that can be checked without a GPU: the kernels' per-element arithmetic and the
// top-k plan against cohort's host code (bit for bit), error reporting, argument checking, the
// partition and records of CUDA IPC, and the no-device path of the communicator.
#include <doctest/doctest.h>

#include <algorithm>
#include <bit>
#include <cohort/collectives/detail/kernels.hpp>
#include <cohort/compress/cast.hpp>
#include <cohort/compress/error_feedback.hpp>
#include <cohort/compress/quantize.hpp>
#include <cohort/compress/top_k.hpp>
#include <cohort/cuda/codecs.hpp>
#include <cohort/cuda/error.hpp>
#include <cohort/cuda/ipc.hpp>
#include <cohort/cuda/reduce.hpp>
#include <cohort/cuda/runtime.hpp>
#include <cohort/transport/loopback.hpp>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "model.hpp"

namespace m = cohort::cuda::detail;
namespace ct = cohort::cuda::test;
using cohort::bf16;
using cohort::fp16;

namespace {

std::uint32_t u(float f) { return std::bit_cast<std::uint32_t>(f); }
float f(std::uint32_t b) { return std::bit_cast<float>(b); }

// Calls fn(bits) for float bit patterns that exercise every rounding case of a conversion
// whose last kept bit is `keep` (13 for fp16 normals, 16 for bf16): every value of the bits
// above `keep - 1`, each with a set of low patterns (exact, just above/below half, half,
// all ones), plus random patterns (which reach the subnormal results' moving round bit).
template <class Fn>
void rounding_cases(int keep, Fn fn) {
  const std::uint32_t low_bits = keep - 1;  // round bit is bit keep-1
  const std::uint32_t lows[] = {0u,
                                1u,
                                (1u << (low_bits - 1)) - 1,
                                1u << (low_bits - 1),
                                (1u << (low_bits - 1)) + 1,
                                (1u << low_bits) - 1};
  const std::uint32_t highs = 1u << (32 - low_bits);
  for (std::uint32_t h = 0; h < highs; ++h)
    for (std::uint32_t lo : lows) fn((h << low_bits) | lo);
  for (std::uint64_t i = 0; i < 2'000'000; ++i) fn(static_cast<std::uint32_t>(ct::splitmix(i)));
}

}  // namespace

TEST_CASE("fp16 conversions match the host bit for bit") {
  std::size_t bad = 0;
  rounding_cases(13, [&](std::uint32_t b) {
    const float x = f(b);
    if (m::f32_to_f16(x) != cohort::detail::f32_to_f16_portable(x) ||
        m::f32_to_f16(x) != fp16(x).bits)
      if (++bad < 5)
        FAIL_CHECK("fp16(" << b << "): " << m::f32_to_f16(x) << " vs " << fp16(x).bits);
  });
  CHECK(bad == 0);
  for (std::uint32_t h = 0; h < 65536; ++h) {
    const auto bits16 = static_cast<std::uint16_t>(h);
    REQUIRE(u(m::f16_to_f32(bits16)) == u(float(fp16::from_bits(bits16))));
  }
}

TEST_CASE("bf16 conversions match the host bit for bit") {
  std::size_t bad = 0;
  rounding_cases(16, [&](std::uint32_t b) {
    const float x = f(b);
    if (m::f32_to_bf16(x) != bf16(x).bits)
      if (++bad < 5)
        FAIL_CHECK("bf16(" << b << "): " << m::f32_to_bf16(x) << " vs " << bf16(x).bits);
  });
  CHECK(bad == 0);
  for (std::uint32_t h = 0; h < 65536; ++h) {
    const auto bits16 = static_cast<std::uint16_t>(h);
    REQUIRE(u(m::bf16_to_f32(bits16)) == u(float(bf16::from_bits(bits16))));
  }
}

namespace {

// Awkward inputs for the reductions: signed zeros, subnormals, infinities, NaN, large values.
std::vector<float> special_floats(std::uint64_t seed, std::size_t n) {
  std::vector<float> v = ct::gradient(seed, n);
  const float specials[] = {0.0f,     -0.0f,     1e-40f, -1e-42f,  3.0e38f,  -3.0e38f,
                            INFINITY, -INFINITY, NAN,    65504.0f, 65520.0f, 1.0f};
  for (std::size_t i = 0; i < n; i += 7) v[i] = specials[(i / 7 + seed) % std::size(specials)];
  return v;
}

template <class T>
T from_float(float x) {
  if constexpr (std::is_same_v<T, float>)
    return x;
  else if constexpr (std::is_same_v<T, double>)
    return static_cast<double>(x) * 1.000000119;
  else
    return T(x);
}

template <class T>
struct type_of;
template <>
struct type_of<float> {
  using type = m::f32_type;
};
template <>
struct type_of<double> {
  using type = m::f64_type;
};
template <>
struct type_of<fp16> {
  using type = m::fp16_type;
};
template <>
struct type_of<bf16> {
  using type = m::bf16_type;
};

template <class T, class HostOp>
void check_fold(const HostOp& op) {
  // The device kernels know the op by its number; fold<Type, Op> runs their arithmetic.
  constexpr auto Op = cohort::detail::builtin_reduction_of<HostOp>;
  static_assert(Op != cohort::detail::builtin_reduction::none);
  using Type = typename type_of<T>::type;
  using S = typename Type::storage;
  const std::size_t n = 3001;
  for (int p : {1, 2, 3, 4, 7}) {
    std::vector<std::vector<T>> x(static_cast<std::size_t>(p), std::vector<T>(n));
    for (int q = 0; q < p; ++q) {
      const auto v = special_floats(100 + static_cast<std::uint64_t>(q), n);
      for (std::size_t i = 0; i < n; ++i)
        x[q][i] = from_float<T>(Op == cohort::detail::builtin_reduction::prod ? 1.0f + v[i] * 1e-3f : v[i]);
    }
    // The host reference: rank order, accumulator type, finalize, one rounding (gather_reduce).
    std::vector<T> want(n);
    for (std::size_t i = 0; i < n; ++i) {
      cohort::accumulator_t<T> acc = cohort::widen(x[0][i]);
      for (int q = 1; q < p; ++q) acc = op(acc, cohort::widen(x[q][i]));
      if constexpr (cohort::finalizing_reduction_for<HostOp, T>) acc = op.finalize(acc, p);
      want[i] = cohort::narrow<T>(acc);
    }
    std::vector<const S*> src;
    for (auto& v : x) src.push_back(reinterpret_cast<const S*>(v.data()));
    std::vector<T> got(n), got2(n);
    S* dst[] = {reinterpret_cast<S*>(got.data()), reinterpret_cast<S*>(got2.data())};
    ct::fold<Type, Op>(src, dst, n, Op == cohort::detail::builtin_reduction::avg ? p : 0);
    for (std::size_t i = 0; i < n; ++i) {
      REQUIRE(std::memcmp(&got[i], &want[i], sizeof(T)) == 0);
      REQUIRE(std::memcmp(&got2[i], &want[i], sizeof(T)) == 0);
    }
    if (p == 2) {  // the pairwise form is the host's combine / combine_last
      std::vector<T> c(n), cl(n);
      cohort::detail::combine(x[0].data(), x[1].data(), c.data(), n, op);
      cohort::detail::combine_last(x[0].data(), x[1].data(), cl.data(), n, op, 2);
      const S* s2[] = {src[0], src[1]};
      std::vector<T> mc(n);
      S* d1[] = {reinterpret_cast<S*>(mc.data())};
      ct::fold<Type, Op>(s2, d1, n, 0);
      CHECK(std::memcmp(mc.data(), c.data(), n * sizeof(T)) == 0);
      CHECK(std::memcmp(got.data(), cl.data(), n * sizeof(T)) == 0);
    }
  }
}

template <class T>
void check_all_ops() {
  check_fold<T>(cohort::ops::sum);
  check_fold<T>(cohort::ops::prod);
  check_fold<T>(cohort::ops::min);
  check_fold<T>(cohort::ops::max);
  check_fold<T>(cohort::ops::avg);
}

}  // namespace

TEST_CASE_TEMPLATE("reductions match the host", T, float, double, fp16, bf16) {
  check_all_ops<T>();
}

TEST_CASE("int8 encoding matches compress::int8 byte for byte") {
  const std::size_t sizes[] = {0, 1, 255, 256, 257, 1000, 4099, 70001};
  for (bool stochastic : {false, true}) {
    cohort::compress::int8_codec<256> codec;
    codec.stochastic = stochastic;
    codec.seed = 0x1234;
    for (std::size_t n : sizes) {
      for (std::uint64_t seed : {1u, 2u}) {
        auto x = special_floats(seed, n);
        // Whole special blocks: zeros, below the floor, one NaN, one infinity, one huge.
        for (std::size_t i = 0; i < n; ++i) {
          const std::size_t b = i / 256;
          if (b % 9 == 3) x[i] = 0.0f;
          if (b % 9 == 4) x[i] = 1e-33f * static_cast<float>(i % 7);
          if (b % 9 == 5 && i % 256 == 9) x[i] = NAN;
          if (b % 9 == 6 && i % 256 == 200) x[i] = -INFINITY;
          if (b % 9 == 7) x[i] = x[i] * 1e30f;
          if (b % 9 == 8)
            x[i] =
                1.2e-30f * static_cast<float>(static_cast<int>(i % 3) - 1);  // just above the floor
          if (b % 9 == 0 && i % 256 != 0) x[i] = std::isfinite(x[i]) ? x[i] : 0.5f;
        }
        for (std::size_t i = 0; i < n; ++i)
          if (i / 256 % 9 != 5 && i / 256 % 9 != 6 && !std::isfinite(x[i])) x[i] = 3.0f;
        const std::uint64_t salt = 77 + seed;
        std::vector<std::byte> want(codec.encoded_bytes(n) + 4), got(want.size());
        const std::size_t len = codec.encode(x, want, {}, salt);
        ct::int8_encode(x.data(), nullptr, false, got.data(), n, stochastic,
                        stochastic ? salt ^ codec.seed : 0);
        REQUIRE(std::memcmp(want.data(), got.data(), len) == 0);
        for (int mode = 0; mode < 3; ++mode) {
          std::vector<float> a(n, 0.25f), b(n, 0.25f);
          codec.decode(std::span(want).first(len), a,
                       static_cast<cohort::compress::decode_mode>(mode));
          if (mode == 0) ct::int8_decode<0>(got.data(), b.data(), n);
          if (mode == 1) ct::int8_decode<1>(got.data(), b.data(), n);
          if (mode == 2) ct::int8_decode<2>(got.data(), b.data(), n);
          REQUIRE(std::memcmp(a.data(), b.data(), n * sizeof(float)) == 0);
        }
      }
    }
  }
}

TEST_CASE("fused error feedback matches compress::error_feedback") {
  const std::size_t n = 5003;
  SUBCASE("int8") {
    for (bool stochastic : {false, true}) {
      cohort::compress::int8_codec<256> codec;
      codec.stochastic = stochastic;
      cohort::compress::error_feedback ef(codec);
      std::vector<float> residual(n, 0.0f);
      for (std::uint64_t step = 0; step < 4; ++step) {
        const auto g = ct::gradient(10 + step, n);
        std::vector<std::byte> want(codec.encoded_bytes(n)), got(want.size());
        ef.encode(g, want, {}, step);
        ct::int8_encode(g.data(), residual.data(), step == 0, got.data(), n, stochastic,
                        stochastic ? step ^ codec.seed : 0);
        REQUIRE(want == got);
        REQUIRE(std::memcmp(ef.residual().data(), residual.data(), n * sizeof(float)) == 0);
      }
    }
  }
  SUBCASE("bf16 and fp16") {
    cohort::compress::error_feedback ef16(cohort::compress::fp16);
    cohort::compress::error_feedback efb(cohort::compress::bf16);
    std::vector<float> r16(n, 0.0f), rb(n, 0.0f);
    for (std::uint64_t step = 0; step < 3; ++step) {
      const auto g = ct::gradient(20 + step, n);
      std::vector<std::byte> w16(2 * n), wb(2 * n);
      ef16.encode(g, w16, {}, 0);
      efb.encode(g, wb, {}, 0);
      for (std::size_t i = 0; i < n; ++i) {  // the cast_feedback_kernel step
        const float c16 = step == 0 ? g[i] : m::add_rn(g[i], r16[i]);
        const float cb = step == 0 ? g[i] : m::add_rn(g[i], rb[i]);
        const std::uint16_t h = m::f32_to_f16(c16), b = m::f32_to_bf16(cb);
        r16[i] = m::sub_rn(c16, m::f16_to_f32(h));
        rb[i] = m::sub_rn(cb, m::bf16_to_f32(b));
        REQUIRE(std::memcmp(&w16[2 * i], &h, 2) == 0);
        REQUIRE(std::memcmp(&wb[2 * i], &b, 2) == 0);
      }
      REQUIRE(std::memcmp(ef16.residual().data(), r16.data(), n * sizeof(float)) == 0);
      REQUIRE(std::memcmp(efb.residual().data(), rb.data(), n * sizeof(float)) == 0);
    }
  }
}

TEST_CASE("the device top-k plan selects what the host codec selects") {
  namespace cd = cohort::compress::detail;
  const std::size_t sizes[] = {1, 2, 10, 1000, 4096, 20000, 100003, 300000};
  const double ratios[] = {0.0001, 0.001, 0.01, 0.1, 0.5, 1.0};
  for (std::size_t n : sizes) {
    for (std::uint64_t seed : {3u, 4u}) {
      auto x = ct::gradient(seed, n);
      if (seed == 4)  // heavy ties: a few distinct magnitudes
        for (std::size_t i = 0; i < n; ++i)
          x[i] = static_cast<float>(static_cast<int>(ct::splitmix(i) % 5) - 2);
      if (n > 10) x[n / 3] = NAN;
      for (double ratio : ratios) {
        const auto codec = cohort::compress::top_k(ratio);
        const std::size_t k = codec.max_entries(n);
        for (bool sampled : {false, true}) {
          // The host codec's payload: m indices (ascending), then m values.
          const auto host = cohort::compress::top_k(
              ratio, sampled ? cohort::compress::selection::sampled
                             : cohort::compress::selection::exact);
          std::vector<std::uint32_t> payload(2 * k + 2), work(host.workspace_bytes(n) / 4 + 1);
          const std::size_t mw = host.encode(x, std::as_writable_bytes(std::span(payload)),
                                             std::as_writable_bytes(std::span(work)), seed * 31) /
                                 host.entry_bytes;
          const auto& want = payload;
          ct::cpu_top_k b{x.data(), n, {}, {}, {}};
          std::size_t got = 0;
          REQUIRE(m::top_k_plan(b, n, k, sampled, seed * 31, &got) == 0);
          INFO("n=" << n << " k=" << k << " sampled=" << sampled << " seed=" << seed);
          REQUIRE(got == mw);
          REQUIRE(b.out.size() == got);
          REQUIRE(std::equal(b.out.begin(), b.out.end(), want.begin()));
          // Where the host sampled, it left its sample (reordered) at the start of `work`:
          // the same keys as the plan's, so the positions agree, not only the outcome.
          const std::size_t s = cd::top_k_tuning::sample_length(n, k);
          if (sampled && k < n && cd::top_k_tuning::sampling_pays(n, s)) {
            std::vector<std::uint32_t> host_sample(work.begin(), work.begin() + s);
            auto mine = b.sample_keys;
            std::sort(host_sample.begin(), host_sample.end());
            std::sort(mine.begin(), mine.end());
            REQUIRE(mine == host_sample);
          }
        }
      }
    }
  }
}

TEST_CASE("CUDA errors carry the runtime's text") {
  const std::string text = cohort::cuda::error_text(1);
  CHECK(text.find("cudaErrorInvalidValue") != std::string::npos);
  try {
    cohort::cuda::check(2, "cuda::thing", "cudaMalloc of 8 bytes");
    FAIL("no throw");
  } catch (const cohort::error& e) {
    CHECK(e.code() == cohort::errc::cuda_error);
    CHECK(e.operation() == "cuda::thing");
    CHECK(std::string(e.what()).find("cudaErrorMemoryAllocation") != std::string::npos);
  }
  const auto fl = cohort::cuda::cuda_failure(100, "setup", 3);
  CHECK(fl.code == cohort::errc::cuda_error);
  CHECK(fl.peer == 3);
  CHECK(fl.what.find("cudaErrorNoDevice") != std::string::npos);
}

TEST_CASE("device discovery says why there is no device") {
  std::string why;
  const int count = cohort::cuda::device_count(&why);
  CHECK(count >= 0);
  if (count == 0) {
    MESSAGE("no CUDA device here: " << why);
    CHECK(!why.empty());
  }
}

TEST_CASE("kernel wrappers reject bad arguments before any CUDA call") {
  namespace cc = cohort::cuda;
  const auto invalid = [](auto fn) {
    try {
      fn();
    } catch (const cohort::error& e) {
      return e.code() == cohort::errc::invalid_argument;
    }
    return false;
  };
  CHECK(invalid([] { cc::cast_encode<bf16>(nullptr, nullptr, 10, nullptr); }));
  CHECK(invalid([] {
    cc::cast_decode<fp16>(nullptr, nullptr, 10, cohort::compress::decode_mode::add, nullptr);
  }));
  alignas(256) std::byte buf[64];  // so that buf + 16 is never 256-byte aligned
  float fl[4];
  CHECK(invalid([&] { cc::int8_encode(cc::int8_codec{}, fl, buf + 1, 4, nullptr); }));
  CHECK(invalid(
      [&] { cc::int8_decode(buf + 2, fl, 4, cohort::compress::decode_mode::assign, nullptr); }));
  CHECK(invalid([&] {
    cc::top_k_encode(cohort::compress::top_k(0.5), fl, std::size_t{1} << 32, buf, buf, 64, nullptr);
  }));
  CHECK(invalid(
      [&] { cc::top_k_encode(cohort::compress::top_k(0.5), fl, 4, buf, buf + 16, 64, nullptr); }));
  std::vector<const float*> src(33, fl);
  float* dst[] = {fl};
  CHECK(invalid([&] {
    cc::fold<float>(std::span<const float* const>(src), std::span<float* const>(dst), 4,
                    cohort::ops::sum, 0, nullptr);
  }));
  std::error_code ec;
  cc::fold<float>(std::span<const float* const>(src), std::span<float* const>(dst), 4,
                  cohort::ops::sum, 0, nullptr, ec);
  CHECK(ec == cohort::errc::invalid_argument);
  // n = 0 launches nothing and succeeds, with or without a device.
  CHECK_NOTHROW(cc::cast_encode<bf16>(nullptr, nullptr, 0, nullptr));
}

TEST_CASE("one event type: empty until an interprocess event is made, CUDA failures as codes") {
  cohort::cuda::event none{nullptr};
  CHECK(none.get() == nullptr);
  cohort::cuda::event moved = std::move(none);
  CHECK(moved.get() == nullptr);
  if (cohort::cuda::device_count() > 0) {
    std::byte handle[64]{};
    REQUIRE(moved.create_interprocess(handle) == 0);
    CHECK(moved.get() != nullptr);
    return;
  }
  // No device: the runtime's error comes back as a number, nothing is held, nothing throws.
  std::byte handle[64]{};
  CHECK(moved.create_interprocess(handle) != 0);
  CHECK(moved.get() == nullptr);
  CHECK(moved.open_interprocess(handle) != 0);
  CHECK_THROWS_AS(cohort::cuda::event(), cohort::error);  // a timing event needs a device
}

TEST_CASE("CUDA IPC splits a buffer into aligned, balanced, covering parts") {
  namespace ci = cohort::detail::cuda_ipc;
  for (std::size_t n : {0u, 1u, 3u, 4u, 5u, 17u, 1000u, 4099u, 1u << 20}) {
    for (int p : {1, 2, 3, 4, 7, 32}) {
      for (std::size_t unit : {1u, 2u, 4u, 8u}) {
        std::size_t at = 0, smallest = n, largest = 0;
        for (int r = 0; r < p; ++r) {
          const ci::range g = ci::owned_range(n, p, r, unit);
          REQUIRE(g.begin == at);
          REQUIRE(g.end >= g.begin);
          if (g.end > g.begin) REQUIRE(g.begin % unit == 0);
          smallest = std::min(smallest, g.end - g.begin);
          largest = std::max(largest, g.end - g.begin);
          at = g.end;
        }
        REQUIRE(at == n);
        REQUIRE(largest - smallest <= 2 * unit);  // the last part also loses n % unit
      }
    }
  }
}

TEST_CASE("CUDA IPC call records name both calls of a mismatch") {
  namespace ci = cohort::detail::cuda_ipc;
  ci::call_record a, b;
  a.type = static_cast<std::uint8_t>(cohort::dtype::bf16);
  a.sequence = 3;
  a.count = 1024;
  a.op_tag = 5;
  b = a;
  CHECK(ci::same_call(a, b));
  b.count = 1000;
  CHECK_FALSE(ci::same_call(a, b));
  CHECK(ci::describe(a) == "all_reduce #3 with 1024 bf16 avg");
  b = a;
  b.trouble = ci::problem::not_shareable;
  b.which = 1;
  CHECK(ci::trouble_text(b, [](int) { return std::string(); }).find("output cannot be shared") !=
        std::string::npos);
  b.trouble = ci::problem::cuda;
  b.which = 2;
  b.status = 700;
  CHECK(ci::trouble_text(b, [](int c) { return std::to_string(c); }) ==
        "a CUDA call on its stream failed: 700");
}

TEST_CASE("a CUDA IPC communicator without a device fails on every rank alike, at once") {
  if (cohort::cuda::device_count() > 0) {
    // With a device, one rank builds (two ranks need two processes: tests/cuda/device.cpp).
    auto world = std::make_shared<cohort::loopback_world>(1);
    cohort::basic_communicator<cohort::loopback_transport> host(
        cohort::loopback_transport(world, 0));
    cohort::cuda_ipc_communicator gpu(host);
    CHECK(gpu.size() == 1);
    float* none = nullptr;
    std::error_code ec;
    cohort::all_reduce(gpu, none, none, 4, cohort::ops::sum, nullptr, {}, ec);
    CHECK(ec == cohort::errc::invalid_argument);
    CHECK_FALSE(gpu.poisoned());
    return;
  }
  for (int p : {1, 2, 3}) {
    auto world = std::make_shared<cohort::loopback_world>(p);
    std::vector<std::string> messages(static_cast<std::size_t>(p));
    std::vector<std::error_code> codes(static_cast<std::size_t>(p));
    std::vector<std::thread> threads;
    for (int r = 0; r < p; ++r) {
      threads.emplace_back([&, r] {
        cohort::basic_communicator<cohort::loopback_transport> host(
            cohort::loopback_transport(world, r));
        host.set_timeout(std::chrono::milliseconds(20'000));
        try {
          cohort::cuda_ipc_communicator gpu(host);
        } catch (const cohort::error& e) {
          codes[static_cast<std::size_t>(r)] = e.code();
          messages[static_cast<std::size_t>(r)] = e.what();
        }
        // The host communicator stays usable: every rank learned the same thing.
        if (host.poisoned())
          codes[static_cast<std::size_t>(r)] = cohort::errc::poisoned;
        else
          cohort::barrier(host);
      });
    }
    for (auto& t : threads) t.join();
    for (int r = 0; r < p; ++r) {
      INFO("rank " << r << ": " << messages[static_cast<std::size_t>(r)]);
      CHECK(codes[static_cast<std::size_t>(r)] == cohort::errc::cuda_error);
      CHECK(messages[static_cast<std::size_t>(r)].find("rank 0 could not set up its device") !=
            std::string::npos);
      CHECK(messages[static_cast<std::size_t>(r)] == messages[0]);
    }
  }
}
