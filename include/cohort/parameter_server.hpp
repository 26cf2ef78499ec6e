/// @file
/// A sharded parameter server over any communicator: S server ranks hold the tensors, W
/// worker ranks push gradients and pull weights, in sync, async or ssp(s) mode.
///
/// ```
/// const cohort::ps::roles roles{.servers = 1, .size = comm.size()};
/// const std::vector<cohort::ps::key_spec> keys = {{0, weights.size()}};
/// if (roles.is_server(comm.rank())) {
///   cohort::ps::server server(comm, keys, roles, {.mode = cohort::ps::consistency::sync()});
///   server.set(0, weights);
///   server.serve();                    // until every worker called finish()
/// } else {
///   cohort::ps::worker worker(comm, keys, roles);
///   for (int step = 0; step < steps; ++step) {
///     worker.wait(worker.pull(0, weights));
///     compute_gradient(weights, grad);
///     worker.push(0, grad);            // completes at the next wait / wait_all
///   }
///   worker.finish();
/// }
/// ```
///
/// Every key is split over every server in even contiguous ranges (as BytePS partitions large
/// tensors), so each server holds and moves an even share of the bytes. The update rule runs
/// on the servers (SGD with momentum unless `server_options::update` says otherwise).
#pragma once

#include <cohort/parameter_server/options.hpp>
#include <cohort/parameter_server/server.hpp>
#include <cohort/parameter_server/worker.hpp>
