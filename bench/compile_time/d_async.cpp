// Compile-time probe (d): (a) plus the async layer (Asio): one async_all_reduce to a future.
#include <vector>

#include <boost/asio/use_future.hpp>

#include <cohort/async.hpp>
#include <cohort/cohort.hpp>

int main() {
  cohort::run_loopback(2, [](cohort::loopback_communicator& comm) {
    cohort::progress_thread<cohort::loopback_communicator> progress(comm);
    std::vector<float> grad(1024, 1.0f);
    cohort::async_all_reduce(progress, grad, cohort::ops::sum, boost::asio::use_future).get();
  });
}
