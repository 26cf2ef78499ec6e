/// @file
/// The TCP transport: ranks on any hosts, one socket per pair of ranks, set up with Boost.Asio
/// and driven on the calling thread (no Asio on the data path).
///
/// ```cpp
/// auto comm = cohort::make_tcp_communicator(cohort::launch_info_from_env());
/// cohort::all_reduce(comm, grads, cohort::ops::sum);
/// ```
///
/// Setup (`make_tcp_communicator`): rank 0 hosts a `tcp_store_server` at MASTER_ADDR:MASTER_PORT
/// (or COHORT_STORE); every rank listens on the address of one interface, publishes it, waits
/// for every other rank's, then connects to each lower rank and accepts each higher one (a full
/// mesh, see detail/tcp_connect.hpp for why). Each connection opens with a handshake (magic,
/// protocol version, job id, rank, world size, shared token); a connection that fails it is
/// closed and logged, and the job goes on. Everything has a deadline (`connect_timeout` for the
/// whole, `handshake_timeout` per connection); connects retry with backoff.
///
/// Data path (detail/tcp_engine.hpp): frames of at most 1 MiB with their length checked before
/// use, full duplex, no allocation per message, no thread: `wait` spins briefly, then blocks in
/// `ppoll`, progressing every connection. A closed or reset connection fails the operations
/// with that peer with `errc::peer_lost`; `abort` sends an abort frame to every peer so that
/// their `remote_failure()` says who failed and why.
///
/// Environment (an option that is set wins over its variable):
/// | variable               | option          | meaning |
/// |------------------------|-----------------|---------|
/// | COHORT_SOCKET_IFNAME   | interface       | NCCL_SOCKET_IFNAME syntax: "eth0", "^lo,docker" |
/// | COHORT_SOCKET_FAMILY   | family          | AF_INET or AF_INET6 (also 4, 6) |
/// | COHORT_STORE           | store           | "host:port", "file:DIR", "redis://host:port" (1) |
/// | COHORT_TOKEN           | token           | the job's secret; unset: rank 0 makes one (2) |
/// | COHORT_INSECURE_STORE  |                 | 1: without a token, let anyone use the store (2) |
/// | COHORT_TCP_SPIN_US     | spin            | microseconds `wait` busy-polls before blocking |
/// | COHORT_SOCKET_SNDBUF   | send_buffer     | SO_SNDBUF bytes |
/// | COHORT_SOCKET_RCVBUF   | recv_buffer     | SO_RCVBUF bytes |
/// | COHORT_CONNECT_TIMEOUT | connect_timeout | seconds for the setup, if the option is at 60 s |
///
/// (1) "host:port" is a TCP store that rank 0 hosts; "redis://" needs COHORT_WITH_HIREDIS
/// defined and hiredis linked. (2) See "Who may join" below.
///
/// Who may join. The token keeps strangers and other jobs out: every connection between ranks
/// opens with it, and a TCP store that rank 0 hosts admits only clients that prove they know it
/// (a challenge and response with HMAC-SHA256: the token itself is never sent to the store, and
/// the store proves it knows the token too). Without COHORT_TOKEN, rank 0 makes a random token
/// and hands it out through the store, so the store must not admit strangers:
/// - on one host (the store on loopback, or every rank on this host: local_size == size), the
///   store admits only processes of the same user on that host (from the kernel's socket
///   tables), with no configuration;
/// - across hosts, setup fails with `invalid_argument` and says what to set: COHORT_TOKEN, the
///   same on every rank (e.g. `COHORT_TOKEN=$(openssl rand -hex 32)`), or COHORT_INSECURE_STORE=1
///   to let anyone who reaches the store join (only on a network where everyone is trusted).
///   A "redis://" store not on loopback is treated the same way; a "file:" store relies on the
///   directory's permissions.
/// The ranks' own handshakes carry the token in clear text, so it is no protection against
/// someone who can read the network between the ranks: use a network you trust (or a VPN).
///
/// Compile cost. Only the setup uses Asio (detail/tcp_setup.hpp, detail/tcp_connect.hpp),
/// and this header includes it last. With COHORT_SEPARATE_COMPILATION defined (in every
/// translation unit) this header only declares the setup and includes no Boost header; one
/// translation unit includes <cohort/impl/src.hpp>, which compiles it (see
/// <cohort/detail/config.hpp>; the figures are in bench/results/compile_time.md). The stores
/// (`tcp_store`, `file_store`) then come from their own headers in rendezvous/.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>

#include <cohort/core/communicator.hpp>
#include <cohort/core/concepts.hpp>
#include <cohort/core/error.hpp>
#include <cohort/core/options.hpp>
#include <cohort/detail/config.hpp>
#include <cohort/launch/env.hpp>
#include <cohort/rendezvous/store.hpp>
#include <cohort/transport/detail/tcp_engine.hpp>

namespace cohort {

class tcp_store_server;  // rendezvous/tcp_store_server.hpp, which the setup includes

/// Which IP family the transport listens and connects with.
enum class tcp_family { any, v4, v6 };

/// How `make_tcp_communicator` sets up the TCP transport. Empty and negative values mean "from
/// the environment, else the default" (see the file comment).
struct tcp_options {
  std::string interface{};  ///< Interfaces to choose from; default: that of the default route
                            ///< (lo when the store is on loopback).
  tcp_family family = tcp_family::any;  ///< any: IPv4 where the interface has it, else IPv6.
  std::string store{};                  ///< Where ranks meet; default: MASTER_ADDR:MASTER_PORT.
  std::string token{};                  ///< Shared secret of the job.
  int send_buffer = 0;                  ///< SO_SNDBUF in bytes; 0 keeps the kernel's autotuning.
  int recv_buffer = 0;                  ///< SO_RCVBUF in bytes; 0 keeps the kernel's autotuning.
  std::chrono::milliseconds connect_timeout{
      60'000};  ///< The whole setup: store, resolve, connect, accept.
  std::chrono::milliseconds handshake_timeout{5'000};  ///< Each connection's handshake.
  std::chrono::microseconds spin{
      -1};  ///< Busy-polling in `wait`; negative: 50 us, or 200 us when ranks outnumber cores
            ///< (a rank that outnumbers gives its core away on every round of it).
  std::function<void(std::string_view)>
      log{};  ///< Refused connections and the like; default: stderr.
};

/// The TCP transport; models `cohort::transport`. Movable; not thread-safe.
class tcp_transport {
 public:
  /// A pending send or receive; default-constructed is complete.
  using request = detail::tcp::engine::request;

  /// Sends complete once the kernel took them, without the receiver (as long as it takes what
  /// came before): a rank whose part of a call of at most this many bytes only sends (the root
  /// of a broadcast, the first rank of a chain reduce) returns without waiting for its left
  /// neighbour's call header, at a cost of one handoff. Small enough that the calls it may run
  /// ahead (`unchecked_headers::capacity`, 4) fit, with their headers, in what a receiver holds
  /// without posting a receive (its 64 KiB staging buffer, then the kernel's socket buffer), as
  /// two ranks that both think they are the root must, to see their disagreement rather than
  /// wait for their deadline.
  static constexpr std::size_t eager_send_bytes = 16 * 1024;

  /// Sends posted before a wait leave together, one `sendmsg` per peer: a call header sent
  /// ahead of a payload costs no handoff of its own, so schedules with edges off the ring
  /// (recursive doubling) pay for their extra headers in bytes only.
  static constexpr bool coalesces_sends = true;

  /// Sets up rank `info.rank` of `info.size` through store `s` (see the file comment); rank 0
  /// does not host anything here. Throws `cohort::error` (timed_out naming the ranks that never
  /// arrived, protocol_error, invalid_argument...).
  COHORT_DECL tcp_transport(const launch_info& info, store& s, tcp_options opts = {});

  /// As above, with the store that `opts.store`, COHORT_STORE or MASTER_ADDR:MASTER_PORT name;
  /// rank 0 hosts it when it is a TCP store.
  COHORT_DECL explicit tcp_transport(const launch_info& info, tcp_options opts = {});

  COHORT_DECL tcp_transport(tcp_transport&&) noexcept;
  COHORT_DECL tcp_transport& operator=(tcp_transport&&) noexcept;
  COHORT_DECL ~tcp_transport();

  int rank() const noexcept { return rank_; }
  int size() const noexcept { return size_; }

  /// Starts sending `bytes` to `peer`; they must stay alive until the request completes.
  request send(int peer, std::span<const std::byte> bytes) {
    return engine_ ? engine_->send(peer, bytes) : request{};
  }
  /// Starts receiving exactly `bytes.size()` bytes from `peer`.
  request recv(int peer, std::span<std::byte> bytes) {
    return engine_ ? engine_->recv(peer, bytes) : request{};
  }
  /// Progresses every connection until `req` completes, fails, or `until` passes.
  void wait(request& req, deadline until, std::error_code& ec) {
    if (!engine_) {
      ec.clear();
      req = {};
      return;
    }
    engine_->wait(req, until, ec);
  }
  /// Fails every pending and later operation here, and tells every peer.
  void abort(const failure& f) noexcept {
    if (engine_) engine_->abort(f);
  }
  /// What the first peer that aborted said (its rank in `peer`), or null.
  const failure* remote_failure() const noexcept {
    return engine_ ? engine_->remote_failure() : nullptr;
  }

  /// "10.0.0.2:41234": the address of `peer`'s end of the connection, for messages.
  std::string peer_address(int peer) const {
    return engine_ ? engine_->address(peer) : std::string();
  }
  /// The busy-poll time of `wait` (see `tcp_options::spin`).
  void set_spin(std::chrono::nanoseconds spin) noexcept {
    if (engine_) engine_->set_spin(spin);
  }

 private:
  COHORT_DECL void setup(const launch_info& info, store& s, tcp_options opts);

  int rank_ = 0, size_ = 1;
  std::unique_ptr<tcp_store_server> server_;  // rank 0, when it hosts the store
  std::unique_ptr<detail::tcp::engine> engine_;
};

static_assert(transport<tcp_transport>);

/// The communicator over TCP.
using tcp_communicator = basic_communicator<tcp_transport>;

/// Sets up a TCP communicator for this process (see the file comment). Throws `cohort::error`.
inline tcp_communicator make_tcp_communicator(const launch_info& info, tcp_options opts = {}) {
  return tcp_communicator(std::in_place, info, std::move(opts));
}

/// Sets up a TCP communicator meeting the other ranks at `s`. Throws `cohort::error`.
inline tcp_communicator make_tcp_communicator(const launch_info& info, store& s,
                                              tcp_options opts = {}) {
  return tcp_communicator(std::in_place, info, s, std::move(opts));
}

}  // namespace cohort

#if !defined(COHORT_SEPARATE_COMPILATION)
#include <cohort/transport/detail/tcp_setup.hpp>
#endif
