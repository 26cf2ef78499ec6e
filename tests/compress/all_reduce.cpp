// compressed_all_reduce on the loopback transport, at P = 1, 2, 3, 4, 7 and awkward sizes:
// every aggregation bitwise against a serial model of its reduction order, the bytes each
// rank sends against the formula, and the failure paths (mismatch, deadline, poison).
#include "../support.hpp"

#include <atomic>
#include <chrono>
#include <cmath>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "helpers.hpp"

#include <cohort/collectives/all_reduce.hpp>
#include <cohort/transport/loopback.hpp>

namespace cc = cohort::compress;
namespace ct = cohort::test;
using namespace std::chrono_literals;

namespace {

constexpr int rank_counts[] = {1, 2, 3, 4, 7};

std::vector<float> input(int call, int rank, std::size_t n) {
  return ct::gradient(static_cast<std::uint64_t>(7919 * call + 31 * rank + n), n);
}

// ---- Serial models: what every rank must end with, from each rank's encoding ---------------

// The ring: block j starts as rank j+1's values rounded to W; ranks j+2, ..., j each add
// their fp32 values to the partial sum in fp32 and round to W (avg: / P before the last).
template <class W>
std::vector<float> summable_model(const std::vector<std::vector<float>>& c, std::size_t n,
                                  bool avg) {
  const int p = static_cast<int>(c.size());
  std::vector<float> out(n);
  for (int j = 0; j < p; ++j) {
    const cohort::block b = cohort::block_of(n, p, j);
    for (std::size_t i = b.offset; i < b.offset + b.count; ++i) {
      W acc(c[(j + 1) % p][i]);
      for (int t = 2; t <= p; ++t) {
        float s = static_cast<float>(acc) + c[(j + t) % p][i];
        if (t == p && avg) s = s / static_cast<float>(p);
        acc = W(s);
      }
      out[i] = static_cast<float>(acc);
    }
  }
  return out;
}

// Two-phase: the owner of each chunk sums, in rank order in fp32, the other ranks' decoded
// contributions and its own fp32 values, quantizes once; everyone decodes that.
std::vector<float> two_phase_model(const std::vector<std::vector<std::byte>>& enc,
                                   const std::vector<std::vector<float>>& c, std::size_t n,
                                   bool avg) {
  const int p = static_cast<int>(enc.size());
  const cc::detail::two_phase_layout<cc::int8_codec<>> lay{n, p};
  std::vector<std::vector<float>> dec;
  for (int q = 0; q < p; ++q) dec.push_back(ct::decoded(cc::int8, enc[q], n));
  std::vector<float> acc(n);
  for (int j = 0; j < p; ++j) {
    const cohort::block el = lay.elements(j);
    for (std::size_t i = el.offset; i < el.offset + el.count; ++i) {
      float s = j == 0 ? c[0][i] : dec[0][i];
      for (int q = 1; q < p; ++q) s = s + (q == j ? c[q][i] : dec[q][i]);
      acc[i] = avg ? s / static_cast<float>(p) : s;
    }
  }
  return ct::decoded(cc::int8, ct::encode(cc::int8, acc), n);
}

// Gather: scatter-add the payloads in rank order.
template <class G>
std::vector<float> gather_model(const G& g, const std::vector<std::vector<std::byte>>& enc,
                                std::size_t n, bool avg) {
  const int p = static_cast<int>(enc.size());
  std::vector<float> out = ct::decoded(g, enc[0], n);
  for (int q = 1; q < p; ++q) g.decode(enc[q], out, cc::decode_mode::add);
  if (avg)
    for (float& v : out) v = v / static_cast<float>(p);
  return out;
}

// Bytes a ring reduce-scatter plus all-gather of `elem`-byte values sends from rank r.
std::uint64_t ring_bytes(std::size_t n, int p, int r, std::size_t elem) {
  std::uint64_t total = 0;
  for (int j = 0; j < p; ++j) {
    const std::size_t c = cohort::block_of(n, p, j).count * elem;
    if (j != r) total += c;
    if (j != (r + 1) % p) total += c;
  }
  return total;
}

constexpr std::uint64_t header = sizeof(cohort::detail::call_header);

struct expectation {
  std::vector<float> result;
  cc::aggregation used;
  std::vector<std::uint64_t> bytes;  // per rank
};

template <class Codec>
auto& feedback_of(Codec& c) {
  if constexpr (cc::detail::is_error_feedback<Codec>) {
    return c;
  } else {
    static cc::detail::no_feedback none;
    return none;
  }
}

template <class Codec>
const auto& wire_of(const Codec& c) {
  if constexpr (cc::detail::is_error_feedback<Codec>) return c.inner();
  else return c;
}

// What a call with `codecs[q]` (one per rank, state included) on inputs x[q] must give.
template <class Codec>
expectation expect(std::vector<Codec>& codecs, const std::vector<std::vector<float>>& x,
                   std::size_t n, bool avg) {
  using W = cc::wire_codec_t<Codec>;
  const int p = static_cast<int>(codecs.size());
  constexpr auto kind = cc::aggregation_of<W>;
  const W& w = wire_of(codecs[0]);
  bool dense = false;
  if constexpr (kind == cc::aggregation::gather) dense = w.max_encoded_bytes(n) > 4 * n / p;
  // Each rank corrects its gradient by its residual, encodes, and keeps what it dropped.
  std::vector<std::vector<float>> c(x);
  std::vector<std::vector<std::byte>> enc(p);
  for (int q = 0; q < p; ++q) {
    auto& fb = feedback_of(codecs[q]);
    const auto corrected = fb.correct(x[q]);
    c[q].assign(corrected.begin(), corrected.end());
    auto encode_first = [&](const auto& cast) {  // the block rank q starts in the ring
      const cohort::block f =
          p == 1 ? cohort::block{0, n} : cohort::block_of(n, p, (q + p - 1) % p);
      const auto bytes = ct::encode(cast, std::span(c[q]).subspan(f.offset, f.count));
      fb.absorb(cast, bytes, f.offset, f.count);
      fb.settle(0, f.offset);
      fb.settle(f.offset + f.count, n - f.offset - f.count);
    };
    if (dense) {
      encode_first(cc::bf16);
    } else if constexpr (kind == cc::aggregation::summable) {
      encode_first(w);
    } else if constexpr (kind == cc::aggregation::two_phase) {
      enc[q] = ct::encode(w, c[q]);  // every chunk but its own is sent; its own is exact
      const cc::detail::two_phase_layout<cc::int8_codec<>> lay{n, p};
      for (int j = 0; j < p; ++j) {
        const cohort::block el = lay.elements(j), e = lay.encoded(j);
        if (j == q) fb.settle(el.offset, el.count);
        else fb.absorb(w, std::span(enc[q]).subspan(e.offset, e.count), el.offset, el.count);
      }
    } else {
      enc[q] = ct::encode(w, c[q], cohort::detail::compression_salt(q));
      fb.absorb(w, enc[q], 0, n);
    }
  }
  expectation e;
  e.bytes.assign(p, 0);
  const std::uint64_t hdr = p > 1 ? header : 0;
  if (dense) {
    e.result = summable_model<cohort::bf16>(c, n, avg);
    e.used = cc::aggregation::dense_fallback;
    for (int r = 0; r < p; ++r) e.bytes[r] = hdr + 8 * (p - 1) + ring_bytes(n, p, r, 2);
  } else if constexpr (kind == cc::aggregation::summable) {
    e.result = summable_model<typename W::wire_type>(c, n, avg);
    e.used = kind;
    for (int r = 0; r < p; ++r) e.bytes[r] = hdr + ring_bytes(n, p, r, 2);
  } else if constexpr (kind == cc::aggregation::two_phase) {
    e.result = two_phase_model(enc, c, n, avg);
    e.used = kind;
    const cc::detail::two_phase_layout<cc::int8_codec<>> lay{n, p};
    const std::uint64_t all = cc::int8.encoded_bytes(n);
    for (int r = 0; r < p; ++r)
      e.bytes[r] = hdr + (all - lay.encoded(r).count) + (all - lay.encoded((r + 1) % p).count);
  } else {
    e.result = gather_model(w, enc, n, avg);
    e.used = kind;
    for (int r = 0; r < p; ++r) {
      e.bytes[r] = hdr + 8 * (p - 1);
      for (int i = 0; i < p; ++i)
        if (i != (r + 1) % p) e.bytes[r] += enc[i].size();
    }
  }
  return e;
}

// Runs `calls` compressed all_reduces with `prototype` (a copy per rank) and checks each rank's
// result bitwise against the model, the aggregation, and the bytes it sent.
template <class Codec>
void check_collective(const Codec& prototype, int p, std::size_t n, bool avg, int calls = 2) {
  std::vector<Codec> model_codecs(p, prototype);
  std::vector<expectation> want;
  for (int call = 0; call < calls; ++call) {
    std::vector<std::vector<float>> x;
    for (int q = 0; q < p; ++q) x.push_back(input(call, q, n));
    want.push_back(expect(model_codecs, x, n, avg));
  }
  INFO(prototype.name(), " P=", p, " n=", n, avg ? " avg" : " sum");
  std::mutex m;
  std::vector<std::string> problems;
  cohort::run_loopback(p, [&](auto& comm) {
    Codec mine = prototype;
    for (int call = 0; call < calls; ++call) {
      std::vector<float> data = input(call, comm.rank(), n);
      const cc::report rep = avg ? cohort::compressed_all_reduce(comm, data, mine, cohort::ops::avg)
                                 : cohort::compressed_all_reduce(comm, data, mine);
      const expectation& e = want[call];
      std::string why;
      if (!ct::same_bits(data, e.result)) why = "result differs from the serial model";
      else if (rep.used != e.used)
        why = "aggregation " + std::string(cc::aggregation_name(rep.used));
      else if (rep.bytes_sent != e.bytes[comm.rank()])
        why = "sent " + std::to_string(rep.bytes_sent) + " bytes, formula " +
              std::to_string(e.bytes[comm.rank()]);
      if (!why.empty()) {
        std::lock_guard lk(m);
        problems.push_back("call " + std::to_string(call) + " rank " +
                           std::to_string(comm.rank()) + ": " + why);
      }
    }
  });
  for (const auto& s : problems) FAIL_CHECK(s);
  CHECK(problems.empty());
}

template <class Codec>
void every_size(const Codec& codec, bool avg = false) {
  for (int p : rank_counts)
    for (std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t(p - 1), std::size_t{257},
                          std::size_t{1031}, std::size_t{4099}})
      check_collective(codec, p, n, avg);
}

}  // namespace

TEST_CASE("summable: fp16 and bf16 rings against the serial model") {
  every_size(cc::fp16);
  every_size(cc::bf16);
  every_size(cc::bf16, true);
  check_collective(cc::fp16, 3, 300007, false, 1);  // several pipeline chunks per block
}

TEST_CASE("two-phase: int8 against the serial model") {
  every_size(cc::int8);
  every_size(cc::int8, true);
  check_collective(cc::int8, 4, 100003, false, 1);
}

TEST_CASE("gather: top-k against the serial model") {
  every_size(cc::top_k(0.01, cc::selection::exact));
  every_size(cc::top_k(0.02) | cc::bf16, true);
  check_collective(cc::top_k(0.01), 4, 100003, false, 1);  // sampled selection
}

TEST_CASE("gather falls back to dense bf16 above about 1/(2P)") {
  every_size(cc::top_k(0.3, cc::selection::exact));  // dense from P = 2 on
  for (int p : rank_counts) check_collective(cc::top_k(0.9 / (2 * p)), p, 5000, false, 1);
  for (int p : {2, 3}) check_collective(cc::top_k(1.1 / (2 * p)), p, 5000, false, 1);
}

TEST_CASE("error feedback through every aggregation") {
  for (int p : {1, 2, 3, 7}) {
    check_collective(cc::error_feedback{cc::bf16}, p, 1031, false, 3);
    check_collective(cc::error_feedback{cc::int8}, p, 1031, true, 3);
    check_collective(cc::error_feedback{cc::top_k(0.01) | cc::bf16}, p, 4099, false, 3);
    check_collective(cc::error_feedback{cc::top_k(0.4, cc::selection::exact)}, p, 1031, false, 3);
  }
}

TEST_CASE("stochastic int8: identical on every rank, within the two-quantization bound") {
  const cc::int8_codec<> sr{.stochastic = true};
  for (int p : {2, 3, 4}) {
    const std::size_t n = 3000;
    std::vector<std::vector<float>> results(p);
    cohort::run_loopback(p, [&](auto& comm) {
      std::vector<float> data = input(0, comm.rank(), n);
      cohort::compressed_all_reduce(comm, data, sr);
      results[comm.rank()] = data;
    });
    for (int q = 1; q < p; ++q) CHECK(ct::same_bits(results[q], results[0]));
    // Each contribution errs by < absmax/127 of its block, the sum by < absmax(sum)/127.
    for (std::size_t b = 0; b * 256 < n; ++b) {
      const std::size_t end = std::min(n, b * 256 + 256);
      double bound = 0.0, sum_max = 0.0;
      std::vector<double> exact(end - b * 256, 0.0);
      for (int q = 0; q < p; ++q) {
        const auto x = input(0, q, n);
        double m = 0.0;
        for (std::size_t i = b * 256; i < end; ++i) {
          m = std::max(m, std::abs(static_cast<double>(x[i])));
          exact[i - b * 256] += x[i];
        }
        bound += m / 127.0;
      }
      for (double v : exact) sum_max = std::max(sum_max, std::abs(v));
      bound += (sum_max + bound) / 127.0;
      for (std::size_t i = b * 256; i < end; ++i)
        REQUIRE(std::abs(results[0][i] - exact[i - b * 256]) <= bound * 1.001);
    }
  }
}

TEST_CASE("ranks may differ in top-k ratio: they agree on the aggregation from the sizes") {
  for (int p : {2, 3, 4}) {
    std::vector<cc::aggregation> used(p);
    std::vector<std::vector<float>> results(p);
    cohort::run_loopback(p, [&](auto& comm) {
      std::vector<float> data = input(0, comm.rank(), 8000);
      // Rank 1 alone asks for a density that does not pay: everyone goes dense.
      const double ratio = comm.rank() == 1 ? 0.9 : 0.01;
      used[comm.rank()] = cohort::compressed_all_reduce(comm, data, cc::top_k(ratio)).used;
      results[comm.rank()] = data;
    });
    for (int q = 0; q < p; ++q) {
      CHECK(used[q] == cc::aggregation::dense_fallback);
      CHECK(ct::same_bits(results[q], results[0]));
    }
  }
}

TEST_CASE("mismatched calls fail with errc::mismatch, naming the codec") {
  std::vector<std::error_code> codes(3);
  std::vector<std::string> what(3);
  cohort::run_loopback(3, [&](auto& comm) {
    std::vector<float> data(100, 1.0f);
    try {
      if (comm.rank() == 1) cohort::compressed_all_reduce(comm, data, cc::fp16);
      else cohort::compressed_all_reduce(comm, data, cc::bf16);
    } catch (const cohort::error& e) {
      codes[comm.rank()] = e.code();
      what[comm.rank()] = e.what();
    }
  });
  int mismatches = 0;
  for (int r = 0; r < 3; ++r) {
    CHECK(codes[r]);
    mismatches += codes[r] == cohort::errc::mismatch;
  }
  CHECK(mismatches >= 1);

  // A plain all_reduce against a compressed one; and another count.
  for (int variant = 0; variant < 2; ++variant) {
    std::vector<std::error_code> ec2(2);
    std::vector<std::string> msg(2);
    cohort::run_loopback(2, [&](auto& comm) {
      std::vector<float> data(variant == 1 && comm.rank() == 1 ? 99 : 100, 1.0f);
      std::error_code ec;
      if (variant == 0 && comm.rank() == 1) {
        cohort::all_reduce(comm, data, cohort::ops::sum, ec);
      } else {
        cc::error_feedback ef{cc::int8};
        cohort::compressed_all_reduce(comm, data, ef, {}, ec);
        if (ec == cohort::errc::mismatch) {
          try {
            cohort::compressed_all_reduce(comm, data, cc::int8);  // poisoned now: throws
          } catch (const cohort::error& e) {
            CHECK(e.code() == cohort::errc::poisoned);
            CHECK(e.operation() == "compressed_all_reduce");
          }
        }
      }
      ec2[comm.rank()] = ec;
      if (comm.last_failure()) msg[comm.rank()] = comm.last_failure()->what;
    });
    CHECK((ec2[0] == cohort::errc::mismatch || ec2[1] == cohort::errc::mismatch));
    CHECK((ec2[0] && ec2[1]));
  }
  // The exception of a rank that saw the mismatch says which codec it used.
  for (int r = 0; r < 3; ++r) {
    INFO(what[r]);
    if (codes[r] == cohort::errc::mismatch)
      CHECK(what[r].find(r == 1 ? "compressed_all_reduce with fp16"
                                : "compressed_all_reduce with bf16") != std::string::npos);
  }
}

TEST_CASE("deadline, poison and invalid arguments") {
  std::atomic<bool> done{false};
  cohort::run_loopback(2, [&](auto& comm) {
    std::vector<float> data(1000, 1.0f);
    if (comm.rank() == 1) {  // stays alive but never calls: rank 0 times out
      while (!done) std::this_thread::sleep_for(1ms);
      return;
    }
    std::error_code ec;
    const auto t0 = std::chrono::steady_clock::now();
    cohort::compressed_all_reduce(comm, data, cc::top_k(0.01), {.timeout = 100ms}, ec);
    CHECK(ec == cohort::errc::timed_out);
    CHECK(std::chrono::steady_clock::now() - t0 < 5s);
    CHECK_THROWS_AS(cohort::compressed_all_reduce(comm, data, cc::bf16), cohort::error);
    done = true;
  });
  cohort::run_loopback(1, [&](auto& comm) {
    cc::error_feedback ef{cc::bf16};
    std::vector<float> a(10, 1.0f), b(11, 1.0f);
    cohort::compressed_all_reduce(comm, a, ef);
    std::error_code ec;
    cohort::compressed_all_reduce(comm, b, ef, {}, ec);
    CHECK(ec == cohort::errc::invalid_argument);
    CHECK_FALSE(comm.poisoned());  // refused before anything was sent
    REQUIRE(comm.last_error() != nullptr);  // and says why
    CHECK(comm.last_error()->what.find("a tensor of 10 floats, not 11") != std::string::npos);
  });
}

TEST_CASE("every aggregation on the portable kernels gives the same bits") {
  ct::with_isa(0, [] {
    for (int p : {1, 3, 4}) {
      check_collective(cc::fp16, p, 4099, true);
      check_collective(cc::bf16, p, 1031, false);
      check_collective(cc::error_feedback{cc::int8}, p, 4099, false);
      check_collective(cc::top_k(0.01) | cc::fp16, p, 100003, false, 1);
    }
  });
}
