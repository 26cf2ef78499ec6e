// async_push / async_pull through a progress thread, with use_future and a callback; errors
// arrive through the token.
#include <doctest/doctest.h>

#include <atomic>
#include <boost/asio/use_future.hpp>
#include <cohort/parameter_server.hpp>
#include <cohort/async/parameter_server.hpp>
#include <cohort/transport/loopback.hpp>
#include <future>
#include <memory>
#include <string>
#include <thread>
#include <vector>

namespace ps = cohort::ps;
using comm_type = cohort::basic_communicator<cohort::loopback_transport>;

TEST_CASE("ps async_push and async_pull complete through use_future and callbacks") {
  const ps::roles roles{1, 3};
  const std::vector<ps::key_spec> keys = {{1, 257}};
  auto world = std::make_shared<cohort::loopback_world>(3);
  std::atomic<int> failures{0}, callbacks{0};
  std::vector<std::thread> threads;
  for (int r = 0; r < 3; ++r)
    threads.emplace_back([&, r] {
      comm_type comm(cohort::loopback_transport(world, r));
      comm.set_timeout(std::chrono::milliseconds(5000));
      try {
        if (r == 0) {
          ps::server_options o;
          o.update = ps::sgd_momentum{1.0f, 0.0f, {}};
          ps::server srv(comm, keys, roles, o);
          srv.serve();
          return;
        }
        ps::worker wk(comm, keys, roles);
        cohort::progress_thread progress(comm);
        std::vector<float> g(257, 1.0f), w(257), wrong(3);
        for (int t = 0; t < 3; ++t) {
          ps::async_pull(progress, wk, 1, w, boost::asio::use_future).get();
          if (w[0] != -float(t)) ++failures;  // sync: the mean of 1 and 1, every step
          auto pushed = ps::async_push(progress, wk, 1, g, boost::asio::use_future);
          ps::async_push(progress, wk, 1, wrong, [&](std::exception_ptr e) {
            try {
              if (e) std::rethrow_exception(e);
            } catch (const cohort::error& err) {
              if (err.code() == cohort::errc::invalid_argument) ++callbacks;
            }
          });
          pushed.get();
        }
        progress.start([&](comm_type&) { wk.finish(); }, boost::asio::use_future).get();
      } catch (const std::exception& e) {
        MESSAGE(e.what());
        ++failures;
      }
    });
  for (auto& t : threads) t.join();
  CHECK(failures == 0);
  CHECK(callbacks == 6);  // 2 workers x 3 refused pushes of the wrong size
}
