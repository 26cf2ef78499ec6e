/// @file
/// The transport concept: what the collectives need from whatever moves the bytes.
///
/// | expression                           | type                    | semantics |
/// |--------------------------------------|-------------------------|-----------|
/// | `t.rank()`, `t.size()`               | `int`                   | this rank, ranks in the group (fixed) |
/// | `T::request`                         | regular, trivially copyable | a handle; default-constructed is complete |
/// | `t.send(peer, bytes)`                | `T::request`            | starts sending; `bytes` must live until complete |
/// | `t.recv(peer, bytes)`                | `T::request`            | starts receiving exactly `bytes.size()` bytes |
/// | `t.wait(req, deadline, ec)`          | `void`                  | progresses every pending operation until `req` completes |
/// | `t.abort(failure)`                   | `void`, noexcept        | fails all pending and later operations here and at every peer |
/// | `t.remote_failure()`                 | `const failure*`        | what the peer that aborted said, or null |
///
/// Between each ordered pair of ranks the bytes form one FIFO stream: receives take the next
/// bytes in the order they were posted, whatever the sizes of the sends. Sends and receives to
/// different peers, and in both directions, proceed at the same time (full duplex). A transport
/// may buffer nothing: callers post every send of a step before they wait on its receives.
/// `wait` fails with `errc::timed_out` at the deadline, `errc::peer_lost` when the peer is gone,
/// or with the code a peer passed to `abort`. A failed collective returns with operations still
/// pending, after calling `abort`: once `abort` returns, no pending operation may read or write
/// the caller's memory again. Streams are FIFO, so completing a later request on a stream
/// completes the earlier ones; requests need not all be waited on.
#pragma once

#include <concepts>
#include <cstddef>
#include <span>
#include <system_error>
#include <type_traits>

#include <cohort/core/error.hpp>
#include <cohort/core/options.hpp>

namespace cohort {

/// Moves bytes between the ranks of a fixed group; knows nothing of types or algorithms.
template <class T>
concept transport =
    std::is_trivially_copyable_v<typename T::request> &&
    std::default_initializable<typename T::request> &&
    requires(T& t, const T& ct, int peer, std::span<const std::byte> out, std::span<std::byte> in,
             typename T::request& req, deadline d, std::error_code& ec, const failure& f) {
      { ct.rank() } -> std::same_as<int>;
      { ct.size() } -> std::same_as<int>;
      { t.send(peer, out) } -> std::same_as<typename T::request>;
      { t.recv(peer, in) } -> std::same_as<typename T::request>;
      { t.wait(req, d, ec) } -> std::same_as<void>;
      { t.abort(f) } noexcept -> std::same_as<void>;
      { ct.remote_failure() } -> std::same_as<const failure*>;
    };

/// A transport that can lend the bytes it received in place, so that a reduction reads them
/// straight from its staging memory instead of copying them out first.
///
/// | expression                                  | semantics |
/// |---------------------------------------------|-----------|
/// | `t.recv_view(peer, max, align, d, ec)`      | waits until bytes from `peer` are ready; returns a view of the next 1..`max` of them, a multiple of `align` long (never shorter than `align`: fewer bytes than that from a peer that died, closed or sent more after them end in `ec`); no receive from `peer` may be pending |
/// | `t.recv_release(peer, n)`                   | consumes the first `n` bytes of the last view |
///
/// The view holds as long as every send on that stream had a length that is a multiple of
/// `align`, and stays valid until it is released.
template <class T>
concept zero_copy_transport =
    transport<T> && requires(T& t, int peer, std::size_t n, deadline d, std::error_code& ec) {
      { t.recv_view(peer, n, n, d, ec) } -> std::same_as<std::span<const std::byte>>;
      { t.recv_release(peer, n) } -> std::same_as<void>;
    };

}  // namespace cohort
