/// @file
/// Building a hierarchical communicator (<cohort/hierarchical.hpp>) from a world communicator:
/// shared memory inside each host (`split_shm`), TCP between hosts (`split_tcp`, one rail per
/// local rank). Its own header because the TCP setup needs Boost.Asio.
///
/// ```cpp
/// auto world = cohort::make_tcp_communicator(info, store);
/// auto hier = cohort::make_hierarchical_communicator(world, store);
/// cohort::all_reduce(hier, grads, cohort::ops::sum);
/// ```
///
/// Hosts are told apart by `detail::host_id()` (hostname and boot id), or by the environment
/// variable COHORT_HOST where it is set: processes with the same value count as one host
/// (which is how tests fake several hosts on one machine).
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <random>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

#include <cohort/collectives/all_gather.hpp>
#include <cohort/collectives/barrier.hpp>
#include <cohort/collectives/broadcast.hpp>
#include <cohort/core/communicator.hpp>
#include <cohort/core/error.hpp>
#include <cohort/hierarchical.hpp>
#include <cohort/launch/env.hpp>
#include <cohort/rendezvous/store.hpp>
#include <cohort/rendezvous/tcp_store.hpp>
#include <cohort/rendezvous/tcp_store_server.hpp>
#include <cohort/split.hpp>
#include <cohort/split_tcp.hpp>
#include <cohort/transport/shm.hpp>
#include <cohort/transport/tcp.hpp>

namespace cohort {

/// The hierarchical communicator of shared memory inside a host and TCP between hosts.
using hierarchical_tcp_communicator = hierarchical_communicator<shm_communicator, tcp_communicator>;

/// Where a rank sits in the host-major layout, from every world rank's host id.
struct host_layout {
  int host = 0;        ///< This rank's host: hosts are numbered by their lowest world rank.
  int hosts = 0;       ///< The number of hosts.
  int local_rank = 0;  ///< This rank among its host's ranks, in world rank order.
  int local_size = 0;  ///< The ranks of each host.
};

/// Exchanges host ids over `world` (one `all_gather`; collective) and returns this rank's place
/// in the host-major layout. Throws `cohort::error`: `errc::invalid_argument` (operation
/// "make_hierarchical_communicator") on every rank when the hosts have different numbers of
/// ranks, else as `all_gather`.
template <communicator Comm>
host_layout plan_hosts(Comm& world, const split_options& opts = {}) {
  const auto mine = static_cast<std::int64_t>(detail::host_id());
  std::vector<std::int64_t> all(static_cast<std::size_t>(world.size()));
  all_gather(world, std::span<const std::int64_t>(&mine, 1), all, {.timeout = opts.timeout});
  std::vector<std::int64_t> ids;  // in order of each host's lowest world rank
  std::vector<int> counts;
  host_layout h;
  for (int q = 0; q < world.size(); ++q) {
    const auto id = all[static_cast<std::size_t>(q)];
    const auto at = std::ranges::find(ids, id) - ids.begin();
    if (at == static_cast<std::ptrdiff_t>(ids.size())) {
      ids.push_back(id);
      counts.push_back(0);
    }
    if (q == world.rank()) {
      h.host = static_cast<int>(at);
      h.local_rank = counts[static_cast<std::size_t>(at)];
    }
    ++counts[static_cast<std::size_t>(at)];
  }
  h.hosts = static_cast<int>(ids.size());
  h.local_size = counts[static_cast<std::size_t>(h.host)];
  if (std::ranges::any_of(counts, [&](int c) { return c != counts[0]; })) {
    std::string list;
    for (std::size_t k = 0; k < counts.size(); ++k)
      list += (k ? ", " : "") + std::to_string(counts[k]);
    throw error(errc::invalid_argument, "make_hierarchical_communicator", -1,
                "make_hierarchical_communicator: the hosts have different numbers of ranks (" +
                    list + ", by host in order of their lowest rank); every host needs the same");
  }
  return h;
}

/// Splits `world` into a hierarchical communicator: shared memory among the ranks of this host
/// (in world rank order), TCP on each rail, meeting at store `s`. Collective over `world`
/// (three all_gathers, then the setups); `world` stays usable and need not outlive the result.
/// The result's rank is host * L + local rank, which is `world.rank()` when the world is
/// host-major already. Throws `cohort::error` as `plan_hosts`, `split_shm` and `split_tcp`.
template <communicator Comm>
hierarchical_tcp_communicator make_hierarchical_communicator(Comm& world, store& s,
                                                             tcp_options tcp = {},
                                                             shm_options shm = {},
                                                             const split_options& opts = {}) {
  const host_layout h = plan_hosts(world, opts);
  auto local = split_shm(world, h.host, world.rank(), shm, opts);
  auto rail = split_tcp(world, h.local_rank, h.host, s, std::move(tcp), opts);
  return hierarchical_tcp_communicator(std::move(local), std::move(rail));
}

/// As above from the launcher's numbers: sets up a TCP world through `s` first (dropped once
/// the split is done). Throws as `make_tcp_communicator` and the overload above.
inline hierarchical_tcp_communicator make_hierarchical_communicator(const launch_info& info,
                                                                    store& s,
                                                                    tcp_options tcp = {},
                                                                    shm_options shm = {}) {
  auto world = make_tcp_communicator(info, s, tcp);
  return make_hierarchical_communicator(world, s, std::move(tcp), shm);
}

/// From the launcher's numbers alone, as `make_tcp_communicator(info)`:
///
/// ```cpp
/// auto hier = cohort::make_hierarchical_communicator(cohort::launch_info_from_env());
/// ```
///
/// The TCP world meets at the store rank 0 hosts on MASTER_ADDR:MASTER_PORT (gone once the
/// world connected); the rails then meet at a store rank 0 hosts on a free port of MASTER_ADDR
/// for the time of the split, whose port and a fresh token every rank receives over the world
/// (so only the job's ranks can use it, with or without COHORT_TOKEN). Collective; throws as
/// `make_tcp_communicator` and the overloads above, or `errc::invalid_argument` without
/// MASTER_ADDR.
inline hierarchical_tcp_communicator make_hierarchical_communicator(const launch_info& info,
                                                                    tcp_options tcp = {},
                                                                    shm_options shm = {}) {
  auto world = make_tcp_communicator(info, tcp);
  if (info.master_addr.empty())
    throw error(errc::invalid_argument, "make_hierarchical_communicator", -1,
                "make_hierarchical_communicator: the rails meet at a store on MASTER_ADDR, and "
                "the launcher gave none (or pass a store of the job's)");
  // Rank 0 says where the rails meet: the port, then the token's four random words.
  std::array<std::int64_t, 5> meeting{};
  const auto token_of = [&] {
    char t[33];
    std::snprintf(t, sizeof t, "%08x%08x%08x%08x", static_cast<unsigned>(meeting[1]),
                  static_cast<unsigned>(meeting[2]), static_cast<unsigned>(meeting[3]),
                  static_cast<unsigned>(meeting[4]));
    return std::string(t);
  };
  std::unique_ptr<tcp_store_server> server;
  if (world.rank() == 0) {
    std::random_device rd;
    for (std::size_t i = 1; i < meeting.size(); ++i) meeting[i] = rd();
    tcp_store_server_options so;
    so.token = token_of();
    so.log = [](std::string_view) {};
    try {
      server = std::make_unique<tcp_store_server>(info.master_addr, 0, so);
    } catch (const error& e) {
      // MASTER_ADDR is not an address of this host (NAT, a proxy's name): every address.
      if (e.code() != std::error_code(EADDRNOTAVAIL, std::generic_category())) throw;
      server = std::make_unique<tcp_store_server>("", 0, so);
    }
    meeting[0] = server->port();
  }
  broadcast(world, std::span(meeting), 0);
  const int port = static_cast<int>(meeting[0]);
  const std::string token = token_of();
  tcp_store st(info.master_addr, port, {.token = token, .timeout = tcp.connect_timeout});
  auto hier = make_hierarchical_communicator(world, st, std::move(tcp), shm);
  st.disconnect();
  barrier(world);  // every rail has met: rank 0's store may go
  return hier;
}

}  // namespace cohort
