/// @file
/// Splitting a communicator into TCP communicators that meet at a store (see
/// <cohort/split.hpp> for the semantics of a split). Its own header because the TCP transport's
/// setup needs Boost.Asio, which <cohort/split.hpp> does not.
///
/// ```cpp
/// cohort::tcp_store st("10.0.0.1", 29500, {.token = token});   // reachable from every rank
/// auto leaders = cohort::split_tcp(world, local_rank == 0 ? 0 : cohort::split_none,
///                                  world.rank(), st);
/// ```
#pragma once

#include <memory>
#include <utility>

#include <cohort/core/communicator.hpp>
#include <cohort/launch/env.hpp>
#include <cohort/rendezvous/store.hpp>
#include <cohort/split.hpp>
#include <cohort/transport/tcp.hpp>

namespace cohort {

/// Splits `parent` into TCP communicators whose ranks meet at `s` (under keys of the new job
/// id, so that one store serves every color and every split). Null for a negative color.
/// Collective over `parent`. Throws as `plan_split` and `make_tcp_communicator`.
template <communicator Comm>
std::unique_ptr<tcp_communicator> split_tcp(Comm& parent, int color, int key, store& s,
                                            tcp_options tcp = {}, const split_options& opts = {}) {
  return split(parent, color, key, [&](const split_info& si) {
    launch_info info;
    info.rank = si.rank;
    info.size = si.size;
    info.local_rank = si.local_rank;
    info.local_size = si.local_size;
    info.job_id = si.job_id;
    return std::make_unique<tcp_communicator>(std::in_place, info, s, std::move(tcp));
  }, opts);
}

}  // namespace cohort
