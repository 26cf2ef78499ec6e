/// @file
/// What a compressed collective did on this rank: the aggregation it chose and the bytes it
/// sent.
#pragma once

#include <cstddef>
#include <cstdint>

#include <cohort/compress/codec.hpp>

namespace cohort::compress {

/// The account of one `compressed_all_reduce` on one rank.
struct report {
  /// The aggregation that ran: the codec's, or `dense_fallback` when a gather codec's payloads
  /// would have outweighed a dense bf16 ring all_reduce. The same on every rank.
  aggregation used = aggregation::summable;
  /// Every byte this rank handed to the transport: data, sizes, and the 32-byte call header
  /// (none at P = 1).
  std::uint64_t bytes_sent = 0;
  /// The bytes this rank encoded from its own contribution: the block it starts in the ring
  /// (summable), every chunk but its own (two-phase), its payload (gather).
  std::size_t encoded_bytes = 0;
  /// The fraction of elements this rank sent values for: 1 for dense encodings, m / n for a
  /// top-k payload of m entries (0 for an empty tensor).
  double density = 1.0;
};

}  // namespace cohort::compress
