#include <cohort/core/dtype.hpp>

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "../support.hpp"

namespace {

using cohort::bf16;
using cohort::dtype;
using cohort::fp16;

std::uint32_t bits_of(float f) { return std::bit_cast<std::uint32_t>(f); }
float float_of(std::uint32_t b) { return std::bit_cast<float>(b); }

std::string hex(std::uint32_t v) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "0x%08X", static_cast<unsigned>(v));
  return buf;
}

// ---- Compile-time checks -------------------------------------------------------------------

static_assert(cohort::dtype_name(dtype::f32) == "f32");
static_assert(cohort::dtype_name(dtype::f64) == "f64");
static_assert(cohort::dtype_name(dtype::i32) == "i32");
static_assert(cohort::dtype_name(dtype::i64) == "i64");
static_assert(cohort::dtype_name(dtype::i8) == "i8");
static_assert(cohort::dtype_name(dtype::u8) == "u8");
static_assert(cohort::dtype_name(dtype::fp16) == "fp16");
static_assert(cohort::dtype_name(dtype::bf16) == "bf16");
static_assert(cohort::dtype_name(static_cast<dtype>(200)) == "unknown");
static_assert(cohort::dtype_size(static_cast<dtype>(200)) == 0);

template <class T, dtype D, std::size_t Size, class Acc>
constexpr bool element_is() {
  static_assert(cohort::element<T>);
  static_assert(cohort::dtype_of<T> == D);
  static_assert(cohort::dtype_size(D) == Size && sizeof(T) == Size);
  static_assert(std::is_same_v<cohort::accumulator_t<T>, Acc>);
  static_assert(std::is_same_v<decltype(cohort::widen(T{})), Acc>);
  static_assert(std::is_same_v<decltype(cohort::narrow<T>(Acc{})), T>);
  return true;
}
static_assert(element_is<float, dtype::f32, 4, float>());
static_assert(element_is<double, dtype::f64, 8, double>());
static_assert(element_is<std::int32_t, dtype::i32, 4, std::int32_t>());
static_assert(element_is<std::int64_t, dtype::i64, 8, std::int64_t>());
static_assert(element_is<std::int8_t, dtype::i8, 1, std::int8_t>());
static_assert(element_is<std::uint8_t, dtype::u8, 1, std::uint8_t>());
static_assert(element_is<fp16, dtype::fp16, 2, float>());
static_assert(element_is<bf16, dtype::bf16, 2, float>());

// Counter-models: pointers, cv-qualified and reference types, other integers, char.
static_assert(!cohort::element<char*>);
static_assert(!cohort::element<const float>);
static_assert(!cohort::element<float&>);
static_assert(!cohort::element<char>);
static_assert(!cohort::element<bool>);
static_assert(!cohort::element<std::uint16_t>);
static_assert(!cohort::element<std::uint32_t>);
static_assert(!cohort::element<std::uint64_t>);
static_assert(!cohort::element<long double>);
static_assert(!cohort::element<dtype>);
static_assert(!cohort::element<void>);

template <class T>
concept has_dtype_of = requires { cohort::dtype_of<T>; };
static_assert(has_dtype_of<fp16> && !has_dtype_of<std::uint16_t>);

static_assert(sizeof(fp16) == 2 && alignof(fp16) == 2 && std::is_trivially_copyable_v<fp16>);
static_assert(sizeof(bf16) == 2 && alignof(bf16) == 2 && std::is_trivially_copyable_v<bf16>);
static_assert(std::is_standard_layout_v<fp16> && std::is_standard_layout_v<bf16>);
static_assert(!std::is_convertible_v<float, fp16> && !std::is_convertible_v<fp16, float>);
static_assert(!std::is_convertible_v<float, bf16> && !std::is_convertible_v<bf16, float>);
static_assert(fp16{}.bits == 0 && bf16{}.bits == 0);

// The conversions are constant expressions (the portable path).
static_assert(fp16(1.0f).bits == 0x3C00 && fp16(-2.0f).bits == 0xC000);
static_assert(fp16(65504.0f).bits == 0x7BFF && fp16(65520.0f).bits == 0x7C00);
static_assert(fp16(0x1p-24f).bits == 0x0001 && fp16(0x1p-25f).bits == 0x0000);
static_assert(fp16(std::numeric_limits<float>::quiet_NaN()).bits == 0x7E00);
static_assert(static_cast<float>(fp16::from_bits(0x3555)) == 0x1.554p-2f);
static_assert(static_cast<float>(fp16::from_bits(0x0001)) == 0x1p-24f);
static_assert(bf16(1.0f).bits == 0x3F80 && bf16(-3.0f).bits == 0xC040);
static_assert(static_cast<float>(bf16::from_bits(0x4049)) == 3.140625f);
static_assert(cohort::widen(fp16::from_bits(0x3E00)) == 1.5f);
static_assert(cohort::narrow<bf16>(1.5f) == bf16::from_bits(0x3FC0));
static_assert(cohort::widen(std::int8_t{-7}) == -7 && cohort::narrow<std::int64_t>(-7) == -7);
static_assert(fp16::from_bits(0x0000) != fp16::from_bits(0x8000));  // bitwise, not IEEE

// ---- Slow, obviously-correct references ----------------------------------------------------

// Magnitude of the positive 16-bit pattern b, in double; the infinity pattern stands for the
// power of two an unbounded exponent would give (2^16 for fp16, 2^128 for bf16), so that
// rounding to it means overflow.
double fp16_magnitude(std::uint16_t b) {
  const int e = b >> 10, m = b & 0x3FF;
  return e == 0 ? std::ldexp(m, -24) : std::ldexp(1024 + m, e - 25);
}
double bf16_magnitude(std::uint16_t b) {
  const int e = b >> 7, m = b & 0x7F;
  return e == 0 ? std::ldexp(m, -133) : std::ldexp(128 + m, e - 134);
}

// Ascending magnitudes of the patterns 0 .. inf_bits.
std::vector<double> ladder(std::uint16_t inf_bits, double (*magnitude)(std::uint16_t)) {
  std::vector<double> v;
  for (std::uint32_t b = 0; b <= inf_bits; ++b) {
    v.push_back(magnitude(static_cast<std::uint16_t>(b)));
  }
  return v;
}
const std::vector<double>& fp16_ladder() {
  static const std::vector<double> v = ladder(0x7C00, fp16_magnitude);
  return v;
}
const std::vector<double>& bf16_ladder() {
  static const std::vector<double> v = ladder(0x7F80, bf16_magnitude);
  return v;
}

// Nearest pattern to |x| on the ladder, ties to the even pattern; beyond the top: infinity.
std::uint16_t round_on(const std::vector<double>& lad, double ax) {
  const auto top = static_cast<std::uint16_t>(lad.size() - 1);
  if (ax >= lad.back()) return top;
  // lo: the last value <= ax; hi = lo + 1 is the first value > ax.
  const auto lo =
      static_cast<std::uint16_t>(std::upper_bound(lad.begin(), lad.end(), ax) - lad.begin() - 1);
  const auto hi = static_cast<std::uint16_t>(lo + 1);
  const double below = ax - lad[lo], above = lad[hi] - ax;  // exact in double
  if (below < above) return lo;
  if (above < below) return hi;
  return (lo & 1) ? hi : lo;
}

std::uint16_t reference_fp16(float x) {
  const std::uint32_t u = bits_of(x);
  const auto sign = static_cast<std::uint16_t>((u >> 16) & 0x8000);
  // NaN: quiet, keeping the top ten payload bits (what F16C's VCVTPS2PH does).
  if (std::isnan(x)) return static_cast<std::uint16_t>(sign | 0x7E00 | ((u >> 13) & 0x3FF));
  return static_cast<std::uint16_t>(sign | round_on(fp16_ladder(), std::fabs(double{x})));
}

std::uint16_t reference_bf16(float x) {
  const std::uint32_t u = bits_of(x);
  const auto sign = static_cast<std::uint16_t>((u >> 16) & 0x8000);
  if (std::isnan(x)) return static_cast<std::uint16_t>((u >> 16) | 0x0040);
  return static_cast<std::uint16_t>(sign | round_on(bf16_ladder(), std::fabs(double{x})));
}

// ---- Inputs --------------------------------------------------------------------------------

float next_up(float f) { return std::nextafter(f, std::numeric_limits<float>::infinity()); }
float next_down(float f) { return std::nextafter(f, -std::numeric_limits<float>::infinity()); }

std::vector<float> hand_picked() {
  using lim = std::numeric_limits<float>;
  std::vector<float> v = {0.0f, 1.0f, 1.5f, 0.1f, 1.0f / 3.0f, 3.14159265f, 1e-3f, 1e3f,
                          2047.0f, 2049.0f, 4097.0f,  // fp16 ties between integers
                          65504.0f, 65519.0f, next_down(65520.0f), 65520.0f, next_up(65520.0f),
                          65536.0f, 1e5f, 1e30f, lim::max(), lim::infinity(),
                          0x1p-14f, next_down(0x1p-14f), 0x1.ffcp-15f, 0x1.ffep-15f,  // edge
                          0x1p-24f, 0x1p-25f, next_up(0x1p-25f), next_down(0x1p-25f),
                          0x1.8p-24f, 0x1.8p-25f, 0x1p-26f, lim::min(), lim::denorm_min(),
                          0x1.fep127f, 0x1.ff8p127f, next_down(0x1.ff8p127f),  // bf16 overflow
                          0x1.01p0f, 0x1.03p0f, next_up(0x1.01p0f), next_down(0x1.03p0f),
                          lim::quiet_NaN(), lim::signaling_NaN(), float_of(0x7F800001),
                          float_of(0x7FBFFFFF), float_of(0x7FFFFFFF), float_of(0x7F802000),
                          float_of(0x7F808000), float_of(0x7FC00001)};
  const std::size_t n = v.size();
  for (std::size_t i = 0; i < n; ++i) v.push_back(-v[i]);
  return v;
}

// Floats whose bits are i * 65537, hand-picked values, every halfway point between neighbouring
// fp16 and bf16 values with the floats just below and above it, and random floats (all bit
// patterns, and ones with exponents around the fp16 range).
const std::vector<float>& sample() {
  static const std::vector<float> v = [] {
    std::vector<float> s = hand_picked();
    for (std::uint32_t i = 0; i < 65536; ++i) s.push_back(float_of(i * 65537u));
    auto add_around = [&s](float mid) {
      for (float f : {mid, next_down(mid), next_up(mid)}) {
        s.push_back(f);
        s.push_back(-f);
      }
    };
    for (std::uint16_t b = 0; b < 0x7C00; ++b) {
      const auto next = static_cast<std::uint16_t>(b + 1);
      add_around(static_cast<float>((fp16_magnitude(b) + fp16_magnitude(next)) / 2));
    }
    for (std::uint32_t b = 0; b < 0x7F80; ++b) add_around(float_of((b << 16) | 0x8000));
    std::mt19937 rng(20240601);
    for (int i = 0; i < 100000; ++i) s.push_back(float_of(static_cast<std::uint32_t>(rng())));
    for (int i = 0; i < 100000; ++i) {
      const std::uint32_t r = static_cast<std::uint32_t>(rng());
      const std::uint32_t exp = 98 + (r >> 23) % 48;  // 2^-29 .. 2^18
      s.push_back(float_of((r & 0x807F'FFFFu) | (exp << 23)));
    }
    return s;
  }();
  return v;
}

// Counts failures and remembers the first, so that a broken conversion reports one line.
struct mismatches {
  std::size_t count = 0;
  std::string first;
  void add(std::uint32_t input, std::uint32_t got, std::uint32_t want) {
    if (count++ == 0) first = "input " + hex(input) + ": got " + hex(got) + ", want " + hex(want);
  }
};

}  // namespace

// ---- Exhaustive round trips -----------------------------------------------------------------

TEST_CASE("every fp16 converts to float exactly and back bit for bit") {
  mismatches value, round_trip, portable;
  for (std::uint32_t b = 0; b < 65536; ++b) {
    const auto h = fp16::from_bits(static_cast<std::uint16_t>(b));
    const float f = static_cast<float>(h);
    const bool nan = (b & 0x7C00) == 0x7C00 && (b & 0x03FF) != 0;
    if (nan) {
      // A NaN stays NaN with its payload; a signalling one comes back quiet.
      const std::uint32_t want = ((b & 0x8000u) << 16) | 0x7FC0'0000u | ((b & 0x3FFu) << 13);
      if (bits_of(f) != want) value.add(b, bits_of(f), want);
      if (fp16(f).bits != (b | 0x0200)) round_trip.add(b, fp16(f).bits, b | 0x0200);
    } else {
      const double want =
          (b & 0x8000 ? -1 : 1) * fp16_magnitude(static_cast<std::uint16_t>(b & 0x7FFF));
      const bool inf = (b & 0x7FFF) == 0x7C00;
      const bool ok = inf ? std::isinf(f) && std::signbit(f) == ((b & 0x8000) != 0)
                          : double{f} == want && std::signbit(f) == ((b & 0x8000) != 0);
      if (!ok) value.add(b, bits_of(f), bits_of(static_cast<float>(want)));
      if (fp16(f).bits != b) round_trip.add(b, fp16(f).bits, b);
    }
    // The portable path gives the same bits as the one in use (F16C where compiled in).
    const float p = cohort::detail::f16_to_f32_portable(static_cast<std::uint16_t>(b));
    if (bits_of(p) != bits_of(f)) portable.add(b, bits_of(p), bits_of(f));
  }
  INFO("value: " << value.first);
  CHECK(value.count == 0);
  INFO("round trip: " << round_trip.first);
  CHECK(round_trip.count == 0);
  INFO("portable: " << portable.first);
  CHECK(portable.count == 0);
}

TEST_CASE("every bf16 converts to float exactly and back bit for bit") {
  mismatches value, round_trip;
  for (std::uint32_t b = 0; b < 65536; ++b) {
    const auto h = bf16::from_bits(static_cast<std::uint16_t>(b));
    const float f = static_cast<float>(h);
    if (bits_of(f) != b << 16) value.add(b, bits_of(f), b << 16);
    const bool nan = (b & 0x7F80) == 0x7F80 && (b & 0x007F) != 0;
    const std::uint32_t want = nan ? (b | 0x0040) : b;  // NaN stays NaN, made quiet
    if (bf16(f).bits != want) round_trip.add(b, bf16(f).bits, want);
  }
  INFO("value: " << value.first);
  CHECK(value.count == 0);
  INFO("round trip: " << round_trip.first);
  CHECK(round_trip.count == 0);
}

// ---- Rounding against the reference ---------------------------------------------------------

// The bulk path is the one the collectives reduce with: with F16C where the CPU has it, in a
// build without -mf16c too, and portable under kernel_cap 0; both must round as the reference.
TEST_CASE("float to fp16 rounds to nearest even like the reference") {
  const std::vector<float>& in = sample();
  std::vector<fp16> on_cpu(in.size()), on_portable(in.size());
  cohort::to_fp16(in, on_cpu);
  {
    const cohort::test::kernel_cap_guard capped(0);
    cohort::to_fp16(in, on_portable);
  }
  mismatches scalar, portable, narrowed, bulk, bulk_portable;
  for (std::size_t i = 0; i < in.size(); ++i) {
    const float x = in[i];
    const std::uint16_t want = reference_fp16(x);
    if (on_cpu[i].bits != want) bulk.add(bits_of(x), on_cpu[i].bits, want);
    if (on_portable[i].bits != want) bulk_portable.add(bits_of(x), on_portable[i].bits, want);
    if (fp16(x).bits != want) scalar.add(bits_of(x), fp16(x).bits, want);
    const std::uint16_t p = cohort::detail::f32_to_f16_portable(x);
    if (p != want) portable.add(bits_of(x), p, want);
    const std::uint16_t n = cohort::narrow<fp16>(x).bits;
    if (n != want) narrowed.add(bits_of(x), n, want);
  }
  CHECK(in.size() > 500000);
  INFO("fp16(float): " << scalar.first);
  CHECK(scalar.count == 0);
  INFO("portable path: " << portable.first);
  CHECK(portable.count == 0);
  INFO("narrow<fp16>: " << narrowed.first);
  CHECK(narrowed.count == 0);
  const std::string f16c = cohort::detail::detected_cpu().f16c ? "F16C" : "no F16C here";
  INFO("to_fp16 (" << f16c << "): " << bulk.first);
  CHECK(bulk.count == 0);
  INFO("to_fp16, portable: " << bulk_portable.first);
  CHECK(bulk_portable.count == 0);
}

TEST_CASE("float to bf16 rounds to nearest even like the reference") {
  mismatches scalar, narrowed;
  for (float x : sample()) {
    const std::uint16_t want = reference_bf16(x);
    if (bf16(x).bits != want) scalar.add(bits_of(x), bf16(x).bits, want);
    const std::uint16_t n = cohort::narrow<bf16>(x).bits;
    if (n != want) narrowed.add(bits_of(x), n, want);
  }
  INFO("bf16(float): " << scalar.first);
  CHECK(scalar.count == 0);
  INFO("narrow<bf16>: " << narrowed.first);
  CHECK(narrowed.count == 0);
}

TEST_CASE("the reference itself rounds the textbook cases") {
  // Guards the reference against sharing a mistake with the code under test.
  CHECK(reference_fp16(1.0f) == 0x3C00);
  CHECK(reference_fp16(0x1.002p0f) == 0x3C00);  // halfway, down to even
  CHECK(reference_fp16(0x1.006p0f) == 0x3C02);  // halfway, up to even
  CHECK(reference_fp16(65519.0f) == 0x7BFF);
  CHECK(reference_fp16(65520.0f) == 0x7C00);
  CHECK(reference_fp16(0x1p-25f) == 0x0000);
  CHECK(reference_fp16(0x1.8p-24f) == 0x0002);
  CHECK(reference_bf16(0x1.01p0f) == 0x3F80);
  CHECK(reference_bf16(0x1.03p0f) == 0x3F82);
  CHECK(reference_bf16(std::numeric_limits<float>::max()) == 0x7F80);
}

// ---- Specials and error bounds --------------------------------------------------------------

TEST_CASE_TEMPLATE("infinities, NaN and negative zero survive", H, fp16, bf16) {
  using lim = std::numeric_limits<float>;
  const float inf = lim::infinity();
  CHECK(static_cast<float>(H(inf)) == inf);
  CHECK(static_cast<float>(H(-inf)) == -inf);
  CHECK(static_cast<float>(H(lim::max())) == inf);  // overflow
  CHECK(static_cast<float>(H(-lim::max())) == -inf);
  CHECK(std::isnan(static_cast<float>(H(lim::quiet_NaN()))));
  CHECK(std::isnan(static_cast<float>(H(-lim::quiet_NaN()))));
  CHECK(std::isnan(static_cast<float>(H(lim::signaling_NaN()))));
  CHECK(std::isnan(static_cast<float>(H(float_of(0x7F80'0001)))));  // payload only in low bits
  CHECK(std::isnan(static_cast<float>(H(float_of(0xFFFF'FFFF)))));  // would carry into Inf
  const float nz = static_cast<float>(H(-0.0f));
  CHECK(nz == 0.0f);
  CHECK(std::signbit(nz));
  CHECK_FALSE(std::signbit(static_cast<float>(H(0.0f))));
  CHECK(std::signbit(static_cast<float>(H(-lim::denorm_min()))));  // underflow keeps the sign
  // Bitwise equality: -0 differs from +0, a NaN equals itself.
  CHECK(H(0.0f) != H(-0.0f));
  CHECK(H(lim::quiet_NaN()) == H(lim::quiet_NaN()));
  CHECK(H(1.0f) == H(1.0f));
}

TEST_CASE("relative rounding error is at most 2^-11 for fp16 and 2^-8 for bf16") {
  std::size_t checked16 = 0, checked_b = 0;
  mismatches f16_err, bf_err;
  for (float x : sample()) {
    const double ax = std::fabs(double{x});
    if (!std::isfinite(x)) continue;
    if (ax >= 0x1p-14 && ax <= 65504.0) {
      ++checked16;
      const double err = std::fabs(double{static_cast<float>(fp16(x))} - x);
      if (err > 0x1p-11 * ax) f16_err.add(bits_of(x), bits_of(static_cast<float>(fp16(x))), 0);
    }
    if (ax >= 0x1p-126 && ax <= 0x1.fep127) {
      ++checked_b;
      const double err = std::fabs(double{static_cast<float>(bf16(x))} - x);
      if (err > 0x1p-8 * ax) bf_err.add(bits_of(x), bits_of(static_cast<float>(bf16(x))), 0);
    }
  }
  CHECK(checked16 > 100000);
  CHECK(checked_b > 100000);
  INFO("fp16: " << f16_err.first);
  CHECK(f16_err.count == 0);
  INFO("bf16: " << bf_err.first);
  CHECK(bf_err.count == 0);
}

TEST_CASE("compile-time and run-time conversions agree") {
  // Constant evaluation always takes the portable path; run time may take F16C.
  static constexpr std::array<float, 12> in = {
      1.0f, -0.0f, 0x1.002p0f, 0x1.006p0f, 65519.0f, 65520.0f, 0x1p-25f, 0x1.8p-24f,
      0x1.ffep-15f, std::numeric_limits<float>::signaling_NaN(),
      -std::numeric_limits<float>::infinity(), 0x1.01p0f};
  static constexpr auto f16 = [] {
    std::array<std::uint16_t, in.size()> out{};
    for (std::size_t i = 0; i < in.size(); ++i) out[i] = fp16(in[i]).bits;
    return out;
  }();
  static constexpr auto b16 = [] {
    std::array<std::uint16_t, in.size()> out{};
    for (std::size_t i = 0; i < in.size(); ++i) out[i] = bf16(in[i]).bits;
    return out;
  }();
  for (std::size_t i = 0; i < in.size(); ++i) {
    volatile float x = in[i];  // keep it a run-time conversion
    CAPTURE(i);
    CHECK(fp16(x).bits == f16[i]);
    CHECK(bf16(x).bits == b16[i]);
    CHECK(f16[i] == reference_fp16(in[i]));
  }
}

// ---- Bulk conversions -----------------------------------------------------------------------

TEST_CASE("bulk conversions match the scalar ones bit for bit") {
  const std::vector<float> special = hand_picked();
  std::mt19937 rng(7);
  for (const std::size_t n : std::array<std::size_t, 10>{0, 1, 7, 8, 9, 15, 16, 17, 31, 1001}) {
    CAPTURE(n);
    std::vector<float> in(n);
    for (std::size_t i = 0; i < n; ++i) {
      // Specials at the front and in the vector body, random bits elsewhere.
      in[i] = i % 3 == 0 ? special[(i / 3) % special.size()]
                         : float_of(static_cast<std::uint32_t>(rng()));
    }
    std::vector<fp16> h(n);
    std::vector<bf16> b(n);
    cohort::to_fp16(in, h);
    cohort::to_bf16(in, b);
    std::vector<float> back16(n), back_b(n);
    cohort::from_fp16(h, back16);
    cohort::from_bf16(b, back_b);
    std::size_t bad = 0;
    for (std::size_t i = 0; i < n; ++i) {
      bad += h[i].bits != fp16(in[i]).bits;
      bad += b[i].bits != bf16(in[i]).bits;
      bad += bits_of(back16[i]) != bits_of(static_cast<float>(h[i]));
      bad += bits_of(back_b[i]) != bits_of(static_cast<float>(b[i]));
    }
    CHECK(bad == 0);
  }
}

TEST_CASE("bulk conversions of every 16-bit pattern match the scalar ones, on every path") {
  // 65535 patterns (odd), read back from a misaligned start to exercise unaligned loads; on
  // the CPU's kernels and then on the portable paths only (kernel_cap 0).
  std::vector<fp16> h(65536);
  std::vector<bf16> b(65536);
  for (std::uint32_t i = 0; i < 65536; ++i) {
    h[i] = fp16::from_bits(static_cast<std::uint16_t>(i));
    b[i] = bf16::from_bits(static_cast<std::uint16_t>(i));
  }
  const std::span<const fp16> hs = std::span<const fp16>(h).subspan(1);
  const std::span<const bf16> bs = std::span<const bf16>(b).subspan(1);
  for (const int cap : {-1, 0}) {
    CAPTURE(cap);
    const cohort::test::kernel_cap_guard capped(cap);
    std::vector<float> f16(hs.size()), fb(bs.size());
    cohort::from_fp16(hs, f16);
    cohort::from_bf16(bs, fb);
    std::vector<fp16> h2(hs.size());
    std::vector<bf16> b2(bs.size());
    cohort::to_fp16(f16, h2);
    cohort::to_bf16(fb, b2);
    std::size_t bad = 0;
    for (std::size_t i = 0; i < hs.size(); ++i) {
      bad += bits_of(f16[i]) != bits_of(static_cast<float>(hs[i]));
      bad += bits_of(fb[i]) != bits_of(static_cast<float>(bs[i]));
      bad += h2[i].bits != fp16(f16[i]).bits;
      bad += b2[i].bits != bf16(fb[i]).bits;
    }
    CHECK(bad == 0);
  }
}

// The kernels above are only as good as the detection that chooses them: a detection that
// found nothing would leave every test on the portable path and still pass.
TEST_CASE("the CPU's features are found as the compiler's own detection finds them") {
  const cohort::detail::cpu_features& found = cohort::detail::detected_cpu();
  CHECK((!found.avx2 || found.f16c));
#if COHORT_CPU_X86 && defined(__GNUC__) && !defined(__clang__)  // clang 14 lacks "f16c"
  __builtin_cpu_init();
  CHECK(found.f16c == (__builtin_cpu_supports("f16c") && __builtin_cpu_supports("avx")));
  CHECK(found.avx2 == (__builtin_cpu_supports("avx2") && found.f16c));
#endif
  const cohort::test::kernel_cap_guard capped(0);
  CHECK_FALSE(cohort::detail::cpu().f16c);
  CHECK_FALSE(cohort::detail::cpu().avx2);
}

// ---- widen / narrow -------------------------------------------------------------------------

TEST_CASE_TEMPLATE("widen then narrow gives back the element", T, float, double, std::int32_t,
                   std::int64_t, std::int8_t, std::uint8_t, fp16, bf16) {
  static_assert(cohort::dtype_size(cohort::dtype_of<T>) == sizeof(T));
  std::vector<T> values;
  if constexpr (std::is_same_v<T, fp16> || std::is_same_v<T, bf16>) {
    for (const std::uint16_t b : std::array<std::uint16_t, 8>{0x0000, 0x8000, 0x0001, 0x3C00,
                                                              0x7BFF, 0x7C00, 0xFC00, 0x4248}) {
      values.push_back(T::from_bits(b));
    }
  } else {
    values = {T(0), T(1), T(100), std::numeric_limits<T>::max(), std::numeric_limits<T>::lowest()};
  }
  for (T v : values) {
    const auto w = cohort::widen(v);
    CHECK(cohort::narrow<T>(w) == v);
    if constexpr (std::is_same_v<T, fp16> || std::is_same_v<T, bf16>) {
      CHECK(bits_of(w) == bits_of(static_cast<float>(v)));
    } else {
      CHECK(w == v);
    }
  }
}

TEST_CASE("a reduction in the accumulator type rounds once") {
  // 2048 + 1 is not an fp16; summing in float and narrowing once keeps the right answer.
  const fp16 a(2048.0f), b(1.0f), c(1.0f);
  const float sum = cohort::widen(a) + cohort::widen(b) + cohort::widen(c);
  CHECK(static_cast<float>(cohort::narrow<fp16>(sum)) == 2050.0f);
  const fp16 step = cohort::narrow<fp16>(cohort::widen(a) + cohort::widen(b));
  CHECK(static_cast<float>(step) == 2048.0f);  // tie to even
}
