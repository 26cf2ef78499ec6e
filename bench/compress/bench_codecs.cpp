// Codec throughput on one core, in GB/s of fp32 input, against memcpy measured in the same
// rounds: every contender runs once per round, rounds repeat, medians are reported with their
// spread. Run pinned to one core (taskset -c 1, chrt -f 1 as root shields it from neighbours).
//
//   bench_codecs [--mib 64] [--rounds 11] [--portable 1]
#include <cohort/compress/all_reduce.hpp>

#include <functional>
#include <string>
#include <vector>

#include "common.hpp"

namespace cc = cohort::compress;
namespace cb = cohort::bench;

namespace {

struct contender {
  std::string name;
  std::function<void()> run;
  int kernel_cap;  // -1: the CPU's best kernels; 0: portable
  std::vector<double> seconds;
};

}  // namespace

int main(int argc, char** argv) {
  const auto mib = static_cast<std::size_t>(std::atof(cb::option(argc, argv, "mib", "64").c_str()));
  const int rounds = std::atoi(cb::option(argc, argv, "rounds", "11").c_str());
  const bool portable = cb::option(argc, argv, "portable", "1") != "0";
  const std::size_t n = mib * (1u << 20) / 4;

  const std::vector<float> x = cb::gradient(n, 1);
  std::vector<float> y(n);
  std::vector<std::byte> out(4 * n + 64), work(4 * n + 64);
  const auto topk_s = cc::top_k(0.01), topk_e = cc::top_k(0.01, cc::selection::exact);
  const auto topk_b = cc::top_k(0.01) | cc::bf16;
  std::size_t topk_len = 0;
  auto enc = [&](const auto& c) { return c.encode(x, out, work, 7); };
  auto bytes = [&](std::size_t len) { return std::span<const std::byte>(out.data(), len); };

  std::vector<contender> cs;
  auto add = [&](std::string name, std::function<void()> f, bool both_paths) {
    cs.push_back({name, f, -1, {}});
    if (both_paths && portable) cs.push_back({name + " (portable)", f, 0, {}});
  };
  add("memcpy", [&] { std::memcpy(y.data(), x.data(), 4 * n); }, false);
  add("fp16 encode", [&] { enc(cc::fp16); }, true);
  add("fp16 decode", [&] { cc::fp16.decode(bytes(2 * n), y, cc::decode_mode::assign); }, true);
  add("bf16 encode", [&] { enc(cc::bf16); }, true);
  add("bf16 decode", [&] { cc::bf16.decode(bytes(2 * n), y, cc::decode_mode::assign); }, true);
  add("int8 encode", [&] { enc(cc::int8); }, true);
  add("int8 decode", [&] {
    cc::int8.decode(bytes(cc::int8.encoded_bytes(n)), y, cc::decode_mode::assign);
  }, true);
  add("top_k 1% sampled encode", [&] { topk_len = enc(topk_s); }, true);
  add("top_k 1% sampled|bf16 encode", [&] { enc(topk_b); }, false);
  add("top_k 1% decode",
      [&] { topk_s.decode(bytes(topk_len), y, cc::decode_mode::assign); }, false);
  add("top_k 1% exact encode", [&] { enc(topk_e); }, false);

  for (int round = 0; round < rounds + 1; ++round) {  // round 0 warms up
    for (auto& c : cs) {
      cohort::detail::kernel_cap.store(c.kernel_cap);
      const auto t0 = std::chrono::steady_clock::now();
      c.run();
      const double s = cb::seconds(std::chrono::steady_clock::now() - t0).count();
      if (round > 0) c.seconds.push_back(s);
    }
  }
  cohort::detail::kernel_cap.store(-1);

  const cb::summary mem = cb::summarize(cs[0].seconds);
  const double gb = 4.0 * static_cast<double>(n) / 1e9;
  std::printf("%zu MiB of fp32 per pass, %d rounds, kernels: %s\n\n", mib, rounds,
              cc::detail::active_isa() == cc::detail::isa::avx2 ? "AVX2+F16C" : "portable");
  std::printf("| codec | GB/s of input, median | min - max | vs memcpy |\n");
  std::printf("|---|---|---|---|\n");
  for (const auto& c : cs) {
    const cb::summary s = cb::summarize(c.seconds);
    std::vector<double> ratio;
    for (std::size_t i = 0; i < c.seconds.size(); ++i)
      ratio.push_back(cs[0].seconds[i] / c.seconds[i]);
    std::printf("| %s | %.2f | %.2f - %.2f | %.0f%% |\n", c.name.c_str(), gb / s.median,
                gb / s.max, gb / s.min, 100.0 * cb::summarize(ratio).median);
  }
  std::printf("\nmemcpy median %.2f GB/s (%.2f ms per pass)\n", gb / mem.median, 1e3 * mem.median);
  return 0;
}
