/// @file
/// Every tuning constant of the collectives, in one place.
#pragma once

#include <cstddef>

namespace cohort::detail::tuning {

/// Pipeline chunk: receives are reduced (and chains forwarded) this many bytes at a time, so
/// that the transfer of the next chunk overlaps the work on this one.
inline constexpr std::size_t chunk_bytes = 256 * 1024;

/// At or below this many bytes per rank, all_reduce gathers every contribution and reduces
/// locally (P-1 latency steps instead of the ring's 2(P-1)).
inline constexpr std::size_t small_all_reduce_bytes = 4 * 1024;

/// Broadcast runs the binomial tree (ceil(log2 P) hops, the root sending ceil(log2 P) times) at
/// four ranks or more, above the bytes a root may leave in the transport and return (below
/// them the chain's calls overlap, each rank sending once per call) and up to this many;
/// elsewhere, the pipelined chain (P-1 hops, each rank sending once). Measured:
/// bench/RESULTS.md, "Broadcast: tree or chain".
inline constexpr std::size_t tree_broadcast_bytes = 256 * 1024;

/// The schedule broadcast runs: chosen by the rule above, or always one of the two, which
/// only measurements of the two want (bench/collectives/tree_or_chain.py). Defining
/// COHORT_BROADCAST_SCHEDULE to 1 forces the tree, to 2 the chain; every rank of a job must be
/// built alike.
enum class broadcast_schedule { by_size, tree, chain };
#ifdef COHORT_BROADCAST_SCHEDULE
inline constexpr auto broadcast_choice = static_cast<broadcast_schedule>(COHORT_BROADCAST_SCHEDULE);
#else
inline constexpr auto broadcast_choice = broadcast_schedule::by_size;
#endif

}  // namespace cohort::detail::tuning
