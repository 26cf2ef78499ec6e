// Compile-time probe (c): (a) plus the TCP transport. Measured header-only (the default) and
// with COHORT_SEPARATE_COMPILATION, where c_tcp_src.cpp holds the setup.
#include <vector>

#include <cohort/cohort.hpp>
#include <cohort/transport/tcp.hpp>

int main() {
  auto comm = cohort::make_tcp_communicator(cohort::launch_info_from_env());
  std::vector<float> grad(1024, 1.0f);
  cohort::all_reduce(comm, grad, cohort::ops::sum);
}
