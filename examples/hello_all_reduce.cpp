// Four ranks average their gradients: the smallest complete cohort program.
#include <cstdio>
#include <vector>

#include <cohort/cohort.hpp>

int main() {
  cohort::run_loopback(4, [](cohort::loopback_communicator& comm) {  // ranks as threads
    std::vector<float> grad(1'000'000, float(comm.rank() + 1));     // rank r holds r+1
    cohort::all_reduce(comm, grad, cohort::ops::avg);               // ring, in place
    if (comm.rank() == 0)
      std::printf("%d ranks averaged %zu floats: grad[0] = %.2f, grad[999999] = %.2f\n",
                  comm.size(), grad.size(), grad[0], grad[999'999]);
  });
}
