// The codecs on their own: error bounds per element, exact bits on both kernel paths, payload
// layouts, top-k selection, and the concepts and compositions proven at compile time.
#include "../support.hpp"

#include <algorithm>
#include <cmath>
#include <functional>
#include <numeric>
#include <string>
#include <vector>

#include "helpers.hpp"

namespace cc = cohort::compress;
namespace ct = cohort::test;

namespace {

// ---- Compile time: models and counter-models, compositions that do and do not compile ------

template <class A, class B>
concept pipeable = requires(const A& a, const B& b) { a | b; };

using f16_codec = cc::cast_codec<cohort::fp16>;
using b16_codec = cc::cast_codec<cohort::bf16>;

static_assert(cc::codec<f16_codec> && cc::summable_codec<f16_codec>);
static_assert(cc::codec<b16_codec> && cc::summable_codec<b16_codec>);
static_assert(cc::codec<cc::int8_codec<>> && cc::two_phase_codec<cc::int8_codec<>>);
static_assert(cc::codec<cc::top_k_codec<>> && cc::gather_codec<cc::top_k_codec<>>);
static_assert(cc::gather_codec<cc::top_k_codec<cohort::bf16>>);
static_assert(cc::codec<cc::error_feedback<cc::top_k_codec<>>>);
static_assert(!cc::codec<int> && !cc::codec<float>);
static_assert(!cc::summable_codec<cc::int8_codec<>> && !cc::two_phase_codec<b16_codec>);
static_assert(!cc::gather_codec<cc::int8_codec<>>);
static_assert(cc::aggregation_of<cc::error_feedback<cc::int8_codec<>>> ==
              cc::aggregation::two_phase);

// top_k | cast is the one composition; it sends the values in 16 bits.
static_assert(pipeable<cc::top_k_codec<float>, b16_codec>);
static_assert(pipeable<cc::top_k_codec<float>, f16_codec>);
static_assert(std::same_as<decltype(cc::top_k(0.01) | cc::bf16), cc::top_k_codec<cohort::bf16>>);
static_assert(cc::top_k_codec<cohort::bf16>::entry_bytes == 6);
static_assert((cc::top_k(0.25, cc::selection::exact) | cc::fp16).ratio == 0.25);
// Everything else is rejected at compile time.
static_assert(!pipeable<f16_codec, b16_codec>);                       // two casts
static_assert(!pipeable<b16_codec, cc::top_k_codec<float>>);          // sparsify after casting
static_assert(!pipeable<cc::int8_codec<>, b16_codec>);                // cast int8
static_assert(!pipeable<cc::top_k_codec<float>, cc::int8_codec<>>);   // quantize sparse values
static_assert(!pipeable<cc::top_k_codec<float>, cc::top_k_codec<float>>);
static_assert(!pipeable<cc::top_k_codec<cohort::bf16>, f16_codec>);   // cast twice
static_assert(!pipeable<cc::error_feedback<cc::top_k_codec<>>, b16_codec>);
static_assert(!pipeable<cc::top_k_codec<>, cc::error_feedback<b16_codec>>);
static_assert(!pipeable<int, b16_codec>);

// The collective takes sum and avg, and error feedback only as a named mutable object.
using ef_topk = cc::error_feedback<cc::top_k_codec<>>;
static_assert(cohort::detail::compressed_all_reduce_args<const b16_codec&, cohort::ops::sum_t>);
static_assert(cohort::detail::compressed_all_reduce_args<b16_codec, cohort::ops::avg_t>);
static_assert(!cohort::detail::compressed_all_reduce_args<b16_codec, cohort::ops::max_t>);
static_assert(cohort::detail::compressed_all_reduce_args<ef_topk&, cohort::ops::sum_t>);
static_assert(!cohort::detail::compressed_all_reduce_args<ef_topk, cohort::ops::sum_t>);
static_assert(!cohort::detail::compressed_all_reduce_args<const ef_topk&, cohort::ops::sum_t>);

// Each path, with the kernels capped at portable (0) and with the CPU's best (-1).
constexpr int isa_caps[] = {0, -1};

// Values spread over every binade of interest, both signs, plus specials.
std::vector<float> spread(int lo_exp, int hi_exp, std::size_t per_binade, std::uint64_t seed) {
  std::vector<float> v;
  for (int e = lo_exp; e <= hi_exp; ++e)
    for (std::size_t i = 0; i < per_binade; ++i) {
      const float m = 1.0f + static_cast<float>(ct::uniform(seed, v.size()));
      v.push_back((i % 2 ? -1.0f : 1.0f) * std::ldexp(m, e));
    }
  return v;
}

}  // namespace

TEST_CASE("fp16 cast: the bits of cohort::fp16, within 2^-11 relative in range") {
  auto x = spread(-14, 14, 997, 1);
  for (float f : {32768.0f, 49151.0f, 65504.0f, 65519.0f}) x.push_back(f);  // below 65520
  x.push_back(0.0f);
  x.push_back(-0.0f);
  for (int cap : isa_caps) {
    ct::with_isa(cap, [&] {
      const auto bytes = ct::encode(cc::fp16, x);
      REQUIRE(bytes.size() == 2 * x.size());
      const auto d = ct::decoded(cc::fp16, bytes, x.size());
      for (std::size_t i = 0; i < x.size(); ++i) {
        std::uint16_t b;
        std::memcpy(&b, bytes.data() + 2 * i, 2);
        REQUIRE(b == cohort::fp16(x[i]).bits);
        REQUIRE(std::abs(x[i] - d[i]) <= std::abs(x[i]) * 0x1p-11f);
      }
    });
  }
  // Out of range: overflow is infinite, subnormals keep an absolute error of 2^-25.
  const std::vector<float> edge = {70000.0f, -1e9f, 3e-6f, -1e-7f, 1e-9f};
  const auto d = ct::decoded(cc::fp16, ct::encode(cc::fp16, edge), edge.size());
  CHECK(std::isinf(d[0]));
  CHECK(std::isinf(d[1]));
  for (std::size_t i = 2; i < edge.size(); ++i) CHECK(std::abs(edge[i] - d[i]) <= 0x1p-25f);
}

TEST_CASE("bf16 cast: the bits of cohort::bf16, within 2^-8 relative") {
  auto x = spread(-126, 127, 61, 2);
  for (int cap : isa_caps) {
    ct::with_isa(cap, [&] {
      const auto bytes = ct::encode(cc::bf16, x);
      const auto d = ct::decoded(cc::bf16, bytes, x.size());
      for (std::size_t i = 0; i < x.size(); ++i) {
        std::uint16_t b;
        std::memcpy(&b, bytes.data() + 2 * i, 2);
        REQUIRE(b == cohort::bf16(x[i]).bits);
        if (std::isfinite(d[i])) REQUIRE(std::abs(x[i] - d[i]) <= std::abs(x[i]) * 0x1p-8f);
      }
    });
  }
}

TEST_CASE("casts decode-add and decode-subtract as one float operation per element") {
  const auto x = ct::gradient(3, 1001);
  const auto acc0 = ct::gradient(4, 1001);
  for (int cap : isa_caps) {
    ct::with_isa(cap, [&] {
      for (auto mode : {cc::decode_mode::add, cc::decode_mode::subtract}) {
        std::vector<cohort::fp16> h(x.size());
        cc::fp16.encode(x, std::span(h));
        auto acc = acc0;
        cc::fp16.decode(std::span<const cohort::fp16>(h), acc, mode);
        for (std::size_t i = 0; i < x.size(); ++i) {
          const float v = static_cast<float>(h[i]);
          REQUIRE(ct::bits(acc[i]) ==
                  ct::bits(mode == cc::decode_mode::add ? acc0[i] + v : acc0[i] - v));
        }
      }
    });
  }
}

TEST_CASE("int8: layout, per-block error <= absmax/254, the same bytes on both paths") {
  for (std::size_t n : {0u, 1u, 255u, 256u, 257u, 1000u, 4099u}) {
    const auto x = ct::gradient(10 + n, n);
    const auto want_len = n + 4 * ((n + 255) / 256);
    std::vector<std::vector<std::byte>> out;
    for (int cap : isa_caps)
      ct::with_isa(cap, [&] { out.push_back(ct::encode(cc::int8, x)); });
    REQUIRE(out[0].size() == want_len);
    REQUIRE(out[0] == out[1]);
    const auto d = ct::decoded(cc::int8, out[0], n);
    for (std::size_t b = 0; b * 256 < n; ++b) {
      float absmax = 0.0f;
      for (std::size_t i = b * 256; i < std::min(n, b * 256 + 256); ++i)
        absmax = std::max(absmax, std::abs(x[i]));
      float scale;
      std::memcpy(&scale, out[0].data() + b * 260, 4);
      CHECK(scale == absmax / 127.0f);
      // absmax/254 up to the rounding of the scale and of q * scale (2^-13 relative).
      const float bound = absmax / 254.0f * (1.0f + 0x1p-13f);
      for (std::size_t i = b * 256; i < std::min(n, b * 256 + 256); ++i)
        REQUIRE(std::abs(x[i] - d[i]) <= bound);
    }
  }
}

TEST_CASE("int8: zero, tiny and non-finite blocks") {
  std::vector<float> x(768, 0.0f);                    // block 0: zeros
  x[300] = 1e-29f;                                    // block 1: small, above 2^-100
  x[301] = -3e-30f;
  for (std::size_t i = 512; i < 768; ++i) x[i] = 1e-31f * static_cast<float>(i % 7);  // < 2^-100
  const auto d = ct::decoded(cc::int8, ct::encode(cc::int8, x), x.size());
  for (std::size_t i = 0; i < 256; ++i) CHECK(d[i] == 0.0f);
  CHECK(std::abs(d[300] - x[300]) <= x[300] / 254.0f * 1.001f);
  CHECK(std::abs(d[301] - x[301]) <= x[300] / 254.0f * 1.001f);
  for (std::size_t i = 512; i < 768; ++i) CHECK(d[i] == 0.0f);  // sent as zeros
  std::vector<float> bad(300, 1.0f);
  bad[7] = INFINITY;
  const auto db = ct::decoded(cc::int8, ct::encode(cc::int8, bad), bad.size());
  CHECK(std::isnan(db[0]));
  CHECK(std::isnan(db[255]));
  CHECK(db[256] == 1.0f);  // the next block is unaffected
}

TEST_CASE("int8 stochastic rounding: error < absmax/127, unbiased, reproducible") {
  cc::int8_codec<> sr{.stochastic = true, .seed = 7};
  CHECK(sr.name() == "int8(stochastic)");
  const auto x = ct::gradient(21, 5000);
  std::vector<std::vector<std::byte>> out;
  for (int cap : isa_caps) ct::with_isa(cap, [&] { out.push_back(ct::encode(sr, x, 99)); });
  REQUIRE(out[0] == out[1]);
  CHECK(ct::encode(sr, x, 98) != out[0]);  // another salt, other noise
  const auto d = ct::decoded(sr, out[0], x.size());
  for (std::size_t b = 0; b * 256 < x.size(); ++b) {
    float absmax = 0.0f;
    const std::size_t end = std::min(x.size(), b * 256 + 256);
    for (std::size_t i = b * 256; i < end; ++i) absmax = std::max(absmax, std::abs(x[i]));
    for (std::size_t i = b * 256; i < end; ++i)
      REQUIRE(std::abs(x[i] - d[i]) < absmax / 127.0f * (1.0f + 0x1p-13f));
  }
  // Blocks of [127, 0.3, 0.3, ...]: scale 1, so 0.3 is sent as 0 or 1 and averages 0.3.
  std::vector<float> y(256 * 400, 0.3f);
  for (std::size_t b = 0; b < 400; ++b) y[b * 256] = 127.0f;
  const auto dy = ct::decoded(sr, ct::encode(sr, y, 5), y.size());
  double sum = 0.0;
  std::size_t count = 0;
  for (std::size_t i = 0; i < y.size(); ++i)
    if (i % 256 != 0) {
      REQUIRE((dy[i] == 0.0f || dy[i] == 1.0f));
      sum += dy[i];
      ++count;
    }
  CHECK(std::abs(sum / static_cast<double>(count) - 0.3) < 0.005);  // sigma is 0.0009
}

TEST_CASE("int8 decode modes") {
  const auto x = ct::gradient(31, 700);
  const auto bytes = ct::encode(cc::int8, x);
  const auto d = ct::decoded(cc::int8, bytes, x.size());
  auto acc = ct::gradient(32, 700);
  const auto acc0 = acc;
  cc::int8.decode(bytes, acc, cc::decode_mode::add);
  for (std::size_t i = 0; i < x.size(); ++i) REQUIRE(ct::bits(acc[i]) == ct::bits(acc0[i] + d[i]));
  cc::int8.decode(bytes, acc, cc::decode_mode::subtract);
  for (std::size_t i = 0; i < x.size(); ++i)
    REQUIRE(ct::bits(acc[i]) == ct::bits((acc0[i] + d[i]) - d[i]));
}

namespace {

// The reference top-k: indices of the k largest |x| (ties to the lower index), ascending.
std::vector<std::uint32_t> reference_top_k(const std::vector<float>& x, std::size_t k) {
  std::vector<std::uint32_t> idx(x.size());
  std::iota(idx.begin(), idx.end(), 0u);
  std::stable_sort(idx.begin(), idx.end(), [&](std::uint32_t a, std::uint32_t b) {
    return (ct::bits(x[a]) & 0x7FFFFFFFu) > (ct::bits(x[b]) & 0x7FFFFFFFu);
  });
  idx.resize(std::min(k, x.size()));
  std::sort(idx.begin(), idx.end());
  return idx;
}

template <class V>
std::vector<std::uint32_t> payload_indices(std::span<const std::byte> bytes) {
  const std::size_t m = bytes.size() / (4 + sizeof(V));
  std::vector<std::uint32_t> idx(m);
  if (m > 0) std::memcpy(idx.data(), bytes.data(), 4 * m);
  return idx;
}

}  // namespace

TEST_CASE("top-k exact: the k largest magnitudes, ties to the lower index") {
  for (std::size_t n : {0u, 1u, 7u, 100u, 5000u, 100000u}) {
    auto x = ct::gradient(40 + n, n);
    for (std::size_t i = 0; i < n; i += 3) x[i] = (i % 2 ? -0.5f : 0.5f);  // many ties
    for (double ratio : {0.001, 0.01, 0.3, 1.0}) {
      const auto codec = cc::top_k(ratio, cc::selection::exact);
      const std::size_t k = codec.max_entries(n);
      CHECK(k == std::min<std::size_t>(n, static_cast<std::size_t>(std::ceil(ratio * n))));
      const auto bytes = ct::encode(codec, x);
      REQUIRE(bytes.size() == k * 8);
      REQUIRE(codec.valid(bytes, n));
      REQUIRE(payload_indices<float>(bytes) == reference_top_k(x, k));
      const auto d = ct::decoded(codec, bytes, n);
      std::size_t nonzero = 0;
      for (std::size_t i = 0; i < n; ++i) nonzero += d[i] != 0.0f;
      for (std::uint32_t i : payload_indices<float>(bytes)) REQUIRE(d[i] == x[i]);
      CHECK(nonzero <= k);
    }
  }
}

TEST_CASE("top-k sampled: the m <= k largest, usually exactly k, same on both paths") {
  const std::size_t n = 200000;
  const auto x = ct::gradient(50, n);
  const auto codec = cc::top_k(0.01);  // sampled by default
  const std::size_t k = codec.max_entries(n);
  std::vector<std::vector<std::byte>> out;
  for (int cap : isa_caps) ct::with_isa(cap, [&] { out.push_back(ct::encode(codec, x, 3)); });
  REQUIRE(out[0] == out[1]);
  const auto idx = payload_indices<float>(out[0]);
  CHECK(idx.size() <= k);
  CHECK(idx.size() >= k * 9 / 10);
  // A prefix of the sorted order: exactly the reference top-m.
  CHECK(idx == reference_top_k(x, idx.size()));
  // Over many salts the sampled selection almost always returns exactly k.
  int exact = 0;
  for (std::uint64_t salt = 0; salt < 20; ++salt)
    exact += ct::encode(codec, x, salt).size() == k * 8;
  CHECK(exact >= 15);
}

TEST_CASE("top-k collecting pass: the same candidates on both paths, however much room is left") {
  const std::size_t n = 10007;  // not a multiple of the vector loop's 32
  const auto x = ct::gradient(61, n);
  std::vector<std::uint32_t> keys(n);
  for (std::size_t i = 0; i < n; ++i) keys[i] = cc::detail::magnitude_key(x[i]);
  std::nth_element(keys.begin(), keys.begin() + 500, keys.end(), std::greater<>());
  const std::uint32_t t = keys[500];  // 501 pass
  struct found {
    std::size_t m;
    std::vector<std::uint32_t> idx;
    std::vector<float> vals, r;
  };
  // Plain, then corrected from a residual (fresh: none yet), on each path.
  auto collect = [&](int isa, std::size_t cap, int input) {
    found f{0, std::vector<std::uint32_t>(cap + 1), std::vector<float>(cap + 1), {}};
    ct::with_isa(isa, [&] {
      if (input == 0) {
        f.m = cc::detail::collect_at_least(x.data(), n, t, f.idx.data(), f.vals.data(), cap);
      } else {
        const auto g = ct::gradient(62, n);
        f.r.assign(x.begin(), x.end());
        for (std::size_t i = 0; i < n; ++i) f.r[i] = x[i] - g[i];
        cc::detail::corrected_input in{g.data(), f.r.data(), input == 2};
        f.m = in.collect(n, t, f.idx.data(), f.vals.data(), cap);
      }
    });
    f.idx.resize(std::min(f.m, cap));
    f.vals.resize(std::min(f.m, cap));
    return f;
  };
  for (int input : {0, 1, 2}) {
    for (std::size_t cap : {0, 1, 7, 8, 9, 100, 490, 494, 495, 496, 497, 500, 501, 502, 1000}) {
      INFO("input ", input, " cap ", cap);
      const found a = collect(0, cap, input), b = collect(-1, cap, input);
      CHECK(a.m == b.m);
      CHECK(a.idx == b.idx);
      CHECK(ct::same_bits(a.vals, b.vals));
      CHECK(ct::same_bits(a.r, b.r));
      if (input == 0) CHECK(a.m == 501);
    }
  }
}

TEST_CASE("top-k sampled falls back to exact selection on flat data") {
  std::vector<float> x(100000, 1.0f);
  x[77] = 5.0f;
  const auto codec = cc::top_k(0.01);
  const auto bytes = ct::encode(codec, x);
  CHECK(payload_indices<float>(bytes) == reference_top_k(x, 1000));
}

TEST_CASE("top-k sampled on fewer floats than one sample run selects exactly") {
  // Below 16 floats there is no whole run to sample: the codec selects exactly, as the device.
  for (std::size_t n : {2u, 5u, 15u, 16u, 63u}) {
    const auto x = ct::gradient(80 + n, n);
    const auto codec = cc::top_k(0.3);
    const std::size_t k = codec.max_entries(n);
    REQUIRE(k < n);
    const auto bytes = ct::encode(codec, x, 7);
    REQUIRE(bytes.size() == k * 8);
    CHECK(payload_indices<float>(bytes) == reference_top_k(x, k));
  }
}

TEST_CASE("top-k | bf16 sends 16-bit values; payload validation") {
  const auto x = ct::gradient(60, 3000);
  const auto codec = cc::top_k(0.05, cc::selection::exact) | cc::bf16;
  CHECK(codec.name() == "top_k(0.05,exact)|bf16");
  CHECK((cc::top_k(0.01) | cc::fp16).name() == "top_k(0.01)|fp16");
  const auto bytes = ct::encode(codec, x);
  REQUIRE(bytes.size() == 150 * 6);
  const auto d = ct::decoded(codec, bytes, x.size());
  for (std::uint32_t i : payload_indices<cohort::bf16>(bytes))
    REQUIRE(ct::bits(d[i]) == ct::bits(static_cast<float>(cohort::bf16(x[i]))));
  CHECK(codec.valid(bytes, 3000));
  CHECK_FALSE(codec.valid(bytes, 2000));                                  // index out of range
  CHECK_FALSE(codec.valid(std::span(bytes).first(bytes.size() - 1), 3000));  // partial entry
  auto swapped = bytes;
  std::swap_ranges(swapped.begin(), swapped.begin() + 4, swapped.begin() + 4);
  CHECK_FALSE(codec.valid(swapped, 3000));                                // not increasing
}

TEST_CASE("top-k rejects a ratio outside (0, 1] with cohort::error, naming the operation") {
  for (double ratio : {0.0, -0.5, 1.5, std::nan("")}) {
    INFO("ratio " << ratio);
    try {
      (void)cc::top_k(ratio);
      FAIL("accepted ratio");
    } catch (const cohort::error& e) {
      CHECK(e.code() == cohort::errc::invalid_argument);
      CHECK(e.operation() == "compress::top_k");
      CHECK(std::string(e.what()).find("ratio must be in (0, 1]") != std::string::npos);
    }
  }
  CHECK_NOTHROW((void)cc::top_k(1.0));
}

TEST_CASE_TEMPLATE("one ring hop: W(float(partial) + mine), divided before rounding", W,
                   cohort::fp16, cohort::bf16) {
  const auto a = ct::gradient(70, 1037), mine = ct::gradient(71, 1037);
  std::vector<W> partial(a.size());
  for (std::size_t i = 0; i < a.size(); ++i) partial[i] = W(a[i]);
  for (float divisor : {0.0f, 3.0f}) {
    for (int cap : isa_caps) {
      ct::with_isa(cap, [&] {
        std::vector<W> out(a.size());
        cc::detail::cast_accumulate(partial.data(), mine.data(), out.data(), out.size(), divisor);
        for (std::size_t i = 0; i < a.size(); ++i) {
          float s = static_cast<float>(partial[i]) + mine[i];
          if (divisor != 0.0f) s = s / divisor;
          REQUIRE(out[i].bits == W(s).bits);
        }
      });
    }
  }
}
