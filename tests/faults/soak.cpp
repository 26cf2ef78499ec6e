// soak: many collectives with random operation, size, element type, reduction and root, each
// checked against a serial reference on every rank, while resident memory is sampled.
//
// usage: soak [--transport shm|tcp] [--ranks P] [--ops N] [--seed S] [--max-elems M]
//             [--rss-slack-kib K] [--limit-s T]
//
// The program forks P ranks (shared memory: one job; TCP: 127.0.0.1, rank 0 hosts the store).
// Every rank draws the same sequence of calls from the seed; each call runs through the suite's
// checker (tests/collectives/suite.hpp): exact inputs, the rank's result compared with the
// serial reference, then an all_gather of result hashes (so N calls are 2N collectives). First
// every kind and type runs once at the largest size, so that buffers and the communicator's
// scratch reach their high-water mark. Then resident memory is sampled 64 times. It is flat
// when the highest sample of the second half is within --rss-slack-kib (4 MiB) of the highest
// of the first half (a leak grows with the number of calls; the allocator's own ups and downs,
// mmap thresholds and trimming, do not), and no sample is more than 8 x slack above the level
// after warm-up. Prints one summary line per rank and one for the job; exits 0 when every call
// was right and memory stayed flat, 1 otherwise. Under ASan or TSan resident memory is reported,
// not judged: their allocators hold freed memory back (ASan's quarantine grows to 256 MiB); under
// ASan, LeakSanitizer checks for leaks at the end of each rank instead.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include "process.hpp"
#include "../collectives/suite.hpp"

namespace cf = cohort::faults;
namespace ct = cohort::test;
using namespace std::chrono_literals;

namespace {

struct settings {
  cf::kind transport = cf::kind::shm;
  int ranks = 4;
  long ops = 10'000;
  std::uint64_t seed = 1;
  std::size_t max_elems = std::size_t{1} << 18;
  long rss_slack_kib = 4 * 1024;
  long limit_s = 1200;
};

constexpr int samples = 64;

struct rank_summary {
  int written = 0;
  long ops = 0, wrong = 0, errors = 0;
  double seconds = 0;
  long rss_start = 0, rss_warm = 0, rss_max_after = 0, rss_end = 0;
  long rss[samples] = {};
  int nsamples = 0;
  std::uint64_t bytes = 0;  // payload bytes this rank passed in
  char first_problem[600] = {};
};

enum class elem { f32, f64, i32, f16, b16 };
enum class reduction { sum, prod, min, max, avg };

struct draw {
  ct::kind kind;
  elem type;
  reduction op;
  std::size_t n;
  int root;
};

draw pick(const settings& s, long i, int p) {
  std::uint64_t h = ct::mix(s.seed * 0x9e3779b97f4a7c15ull + static_cast<std::uint64_t>(i));
  auto next = [&](std::uint64_t m) {
    h = ct::mix(h);
    return h % m;
  };
  draw d;
  d.kind = ct::every_kind[next(std::size(ct::every_kind))];
  d.type = static_cast<elem>(next(5));
  d.op = static_cast<reduction>(next(5));
  if (d.type == elem::i32 && d.op == reduction::avg) d.op = reduction::sum;  // as the suite does
  // Log-uniform sizes from 0 to max_elems, with the awkward ones (0, 1, P-1) often.
  const double u = static_cast<double>(next(1u << 30)) / (1u << 30);
  d.n = static_cast<std::size_t>(std::exp(u * std::log(static_cast<double>(s.max_elems) + 1.0))) - 1;
  if (next(8) == 0) d.n = next(3) == 0 ? 0 : next(2) == 0 ? 1 : static_cast<std::size_t>(p - 1);
  d.root = static_cast<int>(next(static_cast<std::uint64_t>(p)));
  return d;
}

template <class T, class Comm>
void run_typed(Comm& comm, const draw& d, std::uint64_t seed) {
  switch (d.op) {
    case reduction::sum: ct::check<T>(comm, d.kind, cohort::ops::sum, d.n, d.root, seed); break;
    case reduction::prod: ct::check<T>(comm, d.kind, cohort::ops::prod, d.n, d.root, seed); break;
    case reduction::min: ct::check<T>(comm, d.kind, cohort::ops::min, d.n, d.root, seed); break;
    case reduction::max: ct::check<T>(comm, d.kind, cohort::ops::max, d.n, d.root, seed); break;
    case reduction::avg:
      if constexpr (std::is_integral_v<T>) ct::check<T>(comm, d.kind, cohort::ops::sum, d.n, d.root, seed);
      else ct::check<T>(comm, d.kind, cohort::ops::avg, d.n, d.root, seed);
      break;
  }
}

template <class Comm>
std::size_t run(Comm& comm, const draw& d, std::uint64_t seed) {
  switch (d.type) {
    case elem::f32: run_typed<float>(comm, d, seed); return d.n * 4;
    case elem::f64: run_typed<double>(comm, d, seed); return d.n * 8;
    case elem::i32: run_typed<std::int32_t>(comm, d, seed); return d.n * 4;
    case elem::f16: run_typed<cohort::fp16>(comm, d, seed); return d.n * 2;
    case elem::b16: run_typed<cohort::bf16>(comm, d, seed); return d.n * 2;
  }
  return 0;
}

std::string describe(const draw& d) {
  constexpr const char* types[] = {"f32", "f64", "i32", "fp16", "bf16"};
  constexpr const char* ops[] = {"sum", "prod", "min", "max", "avg"};
  return std::string(ct::kind_name(d.kind)) + " " + std::to_string(d.n) + " " +
         types[static_cast<int>(d.type)] + " " + ops[static_cast<int>(d.op)] + " root " + std::to_string(d.root);
}

template <class Comm>
void soak_rank(Comm& comm, const settings& s, rank_summary& out) {
  const int p = comm.size();
  comm.set_timeout(60s);
  out.rss_start = cf::rss_kib();
  // Warm-up: every kind and type once at the largest size.
  for (ct::kind k : ct::every_kind)
    for (int t = 0; t < 5; ++t)
      run(comm, {k, static_cast<elem>(t), reduction::sum, s.max_elems, 0}, 1);
  out.rss_warm = cf::rss_kib();
  const auto t0 = cf::steady::now();
  const long every = std::max(1L, s.ops / samples);
  for (long i = 0; i < s.ops; ++i) {
    const draw d = pick(s, i, p);
    try {
      out.bytes += run(comm, d, s.seed + static_cast<std::uint64_t>(i));
    } catch (const ct::check_failed& e) {
      ++out.wrong;
      if (!out.first_problem[0])
        cf::copy_text(out.first_problem, sizeof out.first_problem, "call " + std::to_string(i) + " (" + describe(d) + "): " + e.what());
      comm.abort("soak: wrong result");  // the others stop too
      break;
    } catch (const cohort::error& e) {
      ++out.errors;
      if (!out.first_problem[0])
        cf::copy_text(out.first_problem, sizeof out.first_problem, "call " + std::to_string(i) + " (" + describe(d) + "): " + e.what());
      break;
    }
    ++out.ops;
    if ((i + 1) % every == 0 && out.nsamples < samples) {
      const long rss = cf::rss_kib();
      out.rss[out.nsamples++] = rss;
      out.rss_max_after = std::max(out.rss_max_after, rss);
    }
  }
  out.seconds = std::chrono::duration<double>(cf::steady::now() - t0).count();
  out.rss_end = cf::rss_kib();
}

int usage() {
  std::fprintf(stderr, "usage: soak [--transport shm|tcp] [--ranks P] [--ops N] [--seed S] [--max-elems M] "
                       "[--rss-slack-kib K] [--limit-s T]\n");
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  settings s;
  for (int i = 1; i < argc; ++i) {
    const std::string_view a = argv[i];
    if (i + 1 >= argc) return usage();
    const char* v = argv[++i];
    if (a == "--transport") {
      if (std::string_view(v) == "shm") s.transport = cf::kind::shm;
      else if (std::string_view(v) == "tcp") s.transport = cf::kind::tcp;
      else return usage();
    } else if (a == "--ranks") s.ranks = std::atoi(v);
    else if (a == "--ops") s.ops = std::atol(v);
    else if (a == "--seed") s.seed = std::strtoull(v, nullptr, 10);
    else if (a == "--max-elems") s.max_elems = std::strtoull(v, nullptr, 10);
    else if (a == "--rss-slack-kib") s.rss_slack_kib = std::atol(v);
    else if (a == "--limit-s") s.limit_s = std::atol(v);
    else return usage();
  }
  if (s.ranks < 1 || s.ranks > 64 || s.ops < 0) return usage();

  cf::job_spec spec = cf::make_spec(s.transport, "soak", s.ranks);
  spec.connect_timeout = 60s;
  void* mem = ::mmap(nullptr, sizeof(rank_summary) * static_cast<std::size_t>(s.ranks), PROT_READ | PROT_WRITE,
                     MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (mem == MAP_FAILED) return 1;
  auto* sum = static_cast<rank_summary*>(mem);
  for (int r = 0; r < s.ranks; ++r) new (&sum[r]) rank_summary{};

  std::vector<pid_t> pids;
  const auto start = cf::steady::now();
  for (int r = 0; r < s.ranks; ++r)
    pids.push_back(cf::spawn(r, [&](int rank) -> int {
      cf::fault_plan plan;
      try {
        cf::with_comm(spec, rank, &plan, [&](auto& comm) { soak_rank(comm, s, sum[rank]); });
      } catch (const cohort::error& e) {
        cf::copy_text(sum[rank].first_problem, sizeof sum[rank].first_problem, std::string("setup: ") + e.what());
        ++sum[rank].errors;
      }
      if (cf::leak_check_failed()) {
        ++sum[rank].errors;
        cf::copy_text(sum[rank].first_problem, sizeof sum[rank].first_problem, "LeakSanitizer found leaks");
      }
      sum[rank].written = 1;
      return 0;
    }));
  const auto status = cf::reap(pids, std::chrono::seconds(s.limit_s));
  const double wall = std::chrono::duration<double>(cf::steady::now() - start).count();

  bool ok = true;
  long worst_growth = 0, worst_drift = 0;
  for (int r = 0; r < s.ranks; ++r) {
    const rank_summary& x = sum[r];
    const long growth_max = x.rss_max_after - x.rss_warm;
    long first = 0, second = 0;
    for (int i = 0; i < x.nsamples; ++i) (i < x.nsamples / 2 ? first : second) = std::max(i < x.nsamples / 2 ? first : second, x.rss[i]);
    const long drift = x.nsamples >= 2 ? second - first : 0;
    worst_growth = std::max(worst_growth, growth_max);
    worst_drift = std::max(worst_drift, drift);
    constexpr bool judge_rss = !cf::sanitized;
    const bool rank_ok = status[r] == 0 && x.written && x.ops == s.ops && x.wrong == 0 && x.errors == 0 &&
                         (!judge_rss || (drift <= s.rss_slack_kib && growth_max <= 8 * s.rss_slack_kib));
    ok = ok && rank_ok;
    std::printf("rank %d: %s, %ld of %ld calls in %.1f s, %ld wrong, %ld errors; RSS %ld KiB at start, %ld after "
                "warm-up, at most %ld after, %ld at the end%s%s\n",
                r, cf::status_text(status[r]).c_str(), x.ops, s.ops, x.seconds, x.wrong, x.errors, x.rss_start,
                x.rss_warm, x.rss_max_after, x.rss_end, x.first_problem[0] ? "; first problem: " : "", x.first_problem);
    if (r == 0 && x.nsamples > 0) {
      std::printf("rank 0 RSS samples (KiB):");
      for (int i = 0; i < x.nsamples; ++i) std::printf(" %ld", x.rss[i]);
      std::printf("\n");
    }
  }
#if defined(COHORT_TEST_ASAN)
  std::printf("(an ASan build: RSS is reported, not judged; LeakSanitizer checks for leaks)\n");
#elif defined(COHORT_TEST_TSAN)
  std::printf("(a TSan build: RSS is reported, not judged)\n");
#endif
  std::printf("soak %s P=%d seed %llu: %ld calls (each checked, plus an all_gather of hashes) with up to %zu "
              "elements, %.1f MB passed in per rank, %.1f s; RSS: second half vs first half %+ld KiB (limit %ld), "
              "at most %ld KiB above the level after warm-up (limit %ld): %s\n",
              cf::kind_name(s.transport), s.ranks, static_cast<unsigned long long>(s.seed), sum[0].ops, s.max_elems,
              static_cast<double>(sum[0].bytes) / 1e6, wall, worst_drift, s.rss_slack_kib, worst_growth,
              8 * s.rss_slack_kib, ok ? "PASS" : "FAIL");
  ::munmap(mem, sizeof(rank_summary) * static_cast<std::size_t>(s.ranks));
  if (!cf::shm_names(spec.job).empty()) {
    std::printf("left in /dev/shm: cohort-%s\n", spec.job.c_str());
    ok = false;
  }
  return ok ? 0 : 1;
}
