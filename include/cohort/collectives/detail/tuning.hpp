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

/// At most this many bytes sent by a rank whose part of a rooted call only sends (the root of a
/// broadcast, the first rank of a chain reduce) let it return without waiting for its left
/// neighbour's call header, on transports whose sends complete without the receiver: the call
/// then costs it one handoff. Small enough that the calls it may run ahead (see
/// `unchecked_headers::capacity`) fit the smallest shm ring (64 KiB) with their headers (over
/// TCP, sends the socket buffers cannot take yet wait for the receiver, as any send does).
inline constexpr std::size_t unchecked_send_bytes = 8 * 1024;

}  // namespace cohort::detail::tuning
