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
/// above, the pipelined chain (P-1 hops, each rank sending once). Measured:
/// bench/RESULTS.md, "Broadcast: tree or chain". Defining COHORT_TREE_BROADCAST_BYTES moves
/// it (0: always the chain); every rank of a job must be built with the same value.
#ifdef COHORT_TREE_BROADCAST_BYTES
inline constexpr std::size_t tree_broadcast_bytes = COHORT_TREE_BROADCAST_BYTES;
#else
inline constexpr std::size_t tree_broadcast_bytes = 256 * 1024;
#endif

}  // namespace cohort::detail::tuning
