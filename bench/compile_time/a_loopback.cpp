// Compile-time probe (a): the umbrella header and one all_reduce over the in-process transport.
#include <vector>

#include <cohort/cohort.hpp>

int main() {
  cohort::run_loopback(2, [](cohort::loopback_communicator& comm) {
    std::vector<float> grad(1024, 1.0f);
    cohort::all_reduce(comm, grad, cohort::ops::sum);
  });
}
