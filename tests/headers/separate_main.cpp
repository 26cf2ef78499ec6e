// COHORT_SEPARATE_COMPILATION, the user's side: this translation unit includes the TCP
// transport but no Boost header (check_layers.py checks that with the compiler); the setup it
// calls is compiled in examples/common/tcp_src.cpp. Two ranks as threads meet at a file store,
// connect over loopback and all-reduce, so the program proves that the split links and runs.

// First, so that this also proves that tcp.hpp compiles on its own under the macro.
#include <cohort/transport/tcp.hpp>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include <unistd.h>

#include <cohort/cohort.hpp>
#include <cohort/rendezvous/file_store.hpp>

#if !defined(COHORT_SEPARATE_COMPILATION)
#error "build this test with COHORT_SEPARATE_COMPILATION"
#endif
#if defined(BOOST_VERSION) || defined(BOOST_ASIO_VERSION)
#error "tcp.hpp pulled in Boost under COHORT_SEPARATE_COMPILATION"
#endif

int main() {
  const auto dir = std::filesystem::temp_directory_path() /
                   ("cohort-separate-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  constexpr int p = 2;
  std::vector<std::exception_ptr> errors(p);
  std::atomic<int> right{0};
  std::vector<std::thread> ranks;
  for (int r = 0; r < p; ++r)
    ranks.emplace_back([&, r] {
      try {
        cohort::launch_info info;
        info.rank = info.local_rank = r;
        info.size = info.local_size = p;
        info.job_id = "separate-" + std::to_string(::getpid());
        cohort::tcp_options opts;
        opts.interface = "lo";
        opts.connect_timeout = std::chrono::seconds(20);
        cohort::file_store store(dir.string());
        auto comm = cohort::make_tcp_communicator(info, store, opts);
        std::vector<float> v(1000, float(r + 1));
        cohort::all_reduce(comm, v, cohort::ops::sum);
        if (v.front() == 3.0f && v.back() == 3.0f) ++right;
      } catch (...) {
        errors[r] = std::current_exception();
      }
    });
  for (auto& t : ranks) t.join();
  std::filesystem::remove_all(dir);
  for (auto& e : errors)
    if (e) try {
        std::rethrow_exception(e);
      } catch (const std::exception& x) {
        std::fprintf(stderr, "separate compilation: %s\n", x.what());
        return 1;
      }
  if (right != p) {
    std::fprintf(stderr, "separate compilation: wrong all_reduce result\n");
    return 1;
  }
  // And P = 1, which needs no store: the other constructor, also compiled in tcp_src.cpp.
  auto one = cohort::make_tcp_communicator(cohort::launch_info{});
  std::vector<float> x(3, 2.0f);
  cohort::all_reduce(one, x, cohort::ops::sum);
  std::puts("COHORT_SEPARATE_COMPILATION: links, connects 2 ranks, all_reduce is right");
  return x[0] == 2.0f ? 0 : 1;
}
