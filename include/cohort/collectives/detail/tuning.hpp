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

}  // namespace cohort::detail::tuning
