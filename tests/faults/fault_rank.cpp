// One rank of a TCP job for the network-fault tests (netns_faults.py): it reads where it sits
// from torchrun's variables, sets up with make_tcp_communicator, then runs COUNT collectives of
// random kinds, types and sizes (the same draw on every rank), each checked against the serial
// reference by the suite's checker.
//
// usage: fault_rank COUNT MAX_ELEMS TIMEOUT_MS
// Prints "rank R: progress I" after each call, and at the end one of
//   "rank R: ok N calls in T ms"                            exit 0
//   "rank R: error CODE peer=P after=MS ms in call I: TEXT"  exit 3 (a clean failure)
//   "rank R: WRONG in call I: TEXT"                          exit 1 (a wrong result: never allowed)
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>

#include <cohort/cohort.hpp>
#include <cohort/launch/env.hpp>
#include <cohort/transport/tcp.hpp>

#include "../collectives/suite.hpp"

namespace ct = cohort::test;
using namespace std::chrono_literals;
using steady = std::chrono::steady_clock;

namespace {

const char* code_name(std::error_code ec) {
  if (ec.category() != cohort::error_category()) return "other";
  switch (static_cast<cohort::errc>(ec.value())) {
    case cohort::errc::timed_out: return "timed_out";
    case cohort::errc::peer_lost: return "peer_lost";
    case cohort::errc::mismatch: return "mismatch";
    case cohort::errc::protocol_error: return "protocol_error";
    case cohort::errc::aborted: return "aborted";
    case cohort::errc::poisoned: return "poisoned";
    default: return "other";
  }
}

template <class Comm>
void one(Comm& comm, long i, std::size_t max_elems) {
  std::uint64_t h = ct::mix(0xC0FFEE + static_cast<std::uint64_t>(i));
  auto next = [&](std::uint64_t m) {
    h = ct::mix(h);
    return h % m;
  };
  const ct::kind k = ct::every_kind[next(std::size(ct::every_kind))];
  const double u = static_cast<double>(next(1u << 20)) / (1u << 20);
  const auto n = static_cast<std::size_t>(std::exp(u * std::log(static_cast<double>(max_elems) + 1.0))) - 1;
  const int root = static_cast<int>(next(static_cast<std::uint64_t>(comm.size())));
  const std::uint64_t seed = 1000 + static_cast<std::uint64_t>(i);
  switch (next(4)) {
    case 0: ct::check<float>(comm, k, cohort::ops::sum, n, root, seed); break;
    case 1: ct::check<double>(comm, k, cohort::ops::max, n, root, seed); break;
    case 2: ct::check<std::int32_t>(comm, k, cohort::ops::sum, n, root, seed); break;
    default: ct::check<cohort::bf16>(comm, k, cohort::ops::sum, n, root, seed); break;
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: fault_rank COUNT MAX_ELEMS TIMEOUT_MS\n");
    return 2;
  }
  const long count = std::atol(argv[1]);
  const std::size_t max_elems = std::strtoull(argv[2], nullptr, 10);
  const auto timeout = std::chrono::milliseconds(std::atol(argv[3]));
  const cohort::launch_info info = cohort::launch_info_from_env();
  const auto t0 = steady::now();
  long i = -1;
  auto since = [&] { return static_cast<long long>(std::chrono::duration_cast<std::chrono::milliseconds>(steady::now() - t0).count()); };
  try {
    cohort::tcp_options o;
    o.connect_timeout = 60s;
    o.log = [](std::string_view) {};
    auto comm = cohort::make_tcp_communicator(info, o);
    comm.set_timeout(timeout);
    for (i = 0; i < count; ++i) {
      const auto c0 = steady::now();
      try {
        one(comm, i, max_elems);
      } catch (const cohort::error& e) {
        const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(steady::now() - c0).count();
        std::printf("rank %d: error %s peer=%d after=%lld ms in call %ld: %s\n", info.rank, code_name(e.code()),
                    e.peer(), static_cast<long long>(ms), i, e.what());
        return 3;
      }
      std::printf("rank %d: progress %ld\n", info.rank, i);
      std::fflush(stdout);
    }
  } catch (const ct::check_failed& e) {
    std::printf("rank %d: WRONG in call %ld: %s\n", info.rank, i, e.what());
    return 1;
  } catch (const cohort::error& e) {
    std::printf("rank %d: error %s peer=%d after=%lld ms in call %ld: %s\n", info.rank, code_name(e.code()), e.peer(),
                since(), i, e.what());
    return 3;
  }
  std::printf("rank %d: ok %ld calls in %lld ms\n", info.rank, count, since());
  return 0;
}
