// Compile-time probe (b): (a) plus the shared-memory transport.
#include <vector>

#include <cohort/cohort.hpp>
#include <cohort/transport/shm.hpp>

int main() {
  auto comm = cohort::make_shm_communicator(cohort::launch_info_from_env());
  std::vector<float> grad(1024, 1.0f);
  cohort::all_reduce(comm, grad, cohort::ops::sum);
}
