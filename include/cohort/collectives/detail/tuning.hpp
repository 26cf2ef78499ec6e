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

/// Recursive doubling instead of the ring, where P is a power of two and the transport
/// coalesces sends (`coalescing_transport`: the call header it adds on edges off the ring rides
/// with the data): log2(P) hops instead of P-1, for the same bytes. all_gather (and barrier)
/// runs it up to `doubling_all_gather_bytes` per rank. all_reduce and reduce_scatter gather
/// every rank's whole buffer that way and reduce locally, up to `doubling_all_reduce_bytes` and
/// `doubling_reduce_scatter_bytes` (reduce_scatter's ring moves only 1/P of the buffer per hop,
/// so the gather pays less long). Measured at P = 4 over TCP on 2 cpus, time over the ring's
/// (bench/RESULTS.md, "Recursive doubling"): all_gather 0.64 to 0.87x from 4 B to 64 KiB per
/// rank; all_reduce 0.76 to 0.88x up to 4 KiB, 0.45 to 0.64x from 8 to 32 KiB, 0.69 to 0.94x
/// at 64 KiB; reduce_scatter 0.73 to 0.99x up to 4 KiB, 1.07x at 8 and 16 KiB, 1.6x at 32 KiB.
/// Over shared memory, where each header is a handoff of its own, all_gather ran 1.1 to 1.5x
/// the ring's time, so shm keeps the ring.
inline constexpr std::size_t doubling_all_gather_bytes = 64 * 1024;
inline constexpr std::size_t doubling_all_reduce_bytes = 32 * 1024;
inline constexpr std::size_t doubling_reduce_scatter_bytes = 4 * 1024;

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
