// Compile-time probe (c call): probe (c) in a translation unit that only calls all_reduce on a
// TCP communicator made elsewhere. Header-only, <cohort/transport/tcp.hpp> still brings the
// setup's Asio; with COHORT_SEPARATE_COMPILATION it brings no Boost header.
#include <span>

#include <cohort/cohort.hpp>
#include <cohort/transport/tcp.hpp>

void reduce_gradients(cohort::tcp_communicator& comm, std::span<float> grad) {
  cohort::all_reduce(comm, grad, cohort::ops::sum);
}
