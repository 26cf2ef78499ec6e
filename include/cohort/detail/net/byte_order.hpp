/// @file
/// Little-endian integers in byte buffers: how every cohort wire format (the TCP transport's
/// handshake and frames, the TCP store's protocol) writes its fields, whatever the host's
/// byte order. Part of the `cohort/detail/net/` layer (see socket.hpp): used by rendezvous and
/// transport alike, it includes neither.
#pragma once

#include <cstddef>

namespace cohort::detail::net {

/// Writes the `sizeof(U)` bytes of unsigned `v` at `p`, least significant first.
template <class U>
inline void store_le(std::byte* p, U v) noexcept {
  for (std::size_t i = 0; i < sizeof(U); ++i) p[i] = static_cast<std::byte>(v >> (8 * i));
}

/// Reads an unsigned `U` stored by `store_le` at `p`.
template <class U>
inline U load_le(const std::byte* p) noexcept {
  U v = 0;
  for (std::size_t i = 0; i < sizeof(U); ++i)
    v |= static_cast<U>(std::to_integer<U>(p[i]) << (8 * i));
  return v;
}

}  // namespace cohort::detail::net
