// Every options struct can be written with designated initializers that name only what they
// change, as the README's examples do: each member has a default member initializer, so g++'s
// -Wmissing-field-initializers (part of -Wextra) stays quiet in the user's build. This unit is
// compiled with -Werror=missing-field-initializers: a member added without a default breaks the
// build of test_headers.
#include <chrono>

#include <cohort/core/options.hpp>
#include <cohort/elastic/membership.hpp>
#include <cohort/launch/env.hpp>
#include <cohort/parameter_server/options.hpp>
#include <cohort/split.hpp>
#include <cohort/transport/loopback.hpp>
#include <cohort/transport/shm.hpp>
#if defined(COHORT_TEST_BOOST)
#include <cohort/async/gradient_buckets.hpp>
#include <cohort/async/progress_thread.hpp>
#include <cohort/rendezvous/tcp_store.hpp>
#include <cohort/rendezvous/tcp_store_server.hpp>
#include <cohort/transport/tcp.hpp>
#endif

namespace {

using namespace std::chrono_literals;

// Each names one member, the last where it can, so that every member before it is left to its
// default; `accumulate` is a middle member, as tests/async writes it. The copy is the one clang 14
// could not make (see `headers clang` in meson.build).
[[maybe_unused]] void designated_options() {
  [[maybe_unused]] cohort::call_options call{.timeout = 1s};
  [[maybe_unused]] cohort::split_options split{.timeout = 1s};
  [[maybe_unused]] cohort::shm_options shm{.liveness_interval = 100ms};
  [[maybe_unused]] cohort::ps::server_options server{.compress = {}};
  [[maybe_unused]] cohort::ps::worker_options worker{.compress = {}};
  [[maybe_unused]] cohort::ps::server_options server_copy = server;
  [[maybe_unused]] cohort::elastic::options elastic{.max_generations = 10};
  [[maybe_unused]] cohort::launch_info info{.source = cohort::launcher::explicit_args};
#if defined(COHORT_TEST_BOOST)
  [[maybe_unused]] cohort::progress_options progress{.spin = 0ns};
  [[maybe_unused]] cohort::tcp_options tcp{.spin = 0us};
  [[maybe_unused]] cohort::tcp_store_options store{.timeout = 1s};
  [[maybe_unused]] cohort::tcp_store_server_options server_store{.hello_timeout = 1s};
  [[maybe_unused]] cohort::bucket_options<cohort::loopback_communicator> buckets{
      .reduce = nullptr};
  [[maybe_unused]] cohort::bucket_options<cohort::loopback_communicator> accumulate{
      .accumulate = 2};
#endif
}

}  // namespace
