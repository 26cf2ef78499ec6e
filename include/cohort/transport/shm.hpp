/// @file
/// The shared-memory transport: the ranks of one host as processes, bytes passed through a
/// POSIX shared-memory segment (`shm_open` + `mmap`).
///
/// ```cpp
/// auto comm = cohort::make_shm_communicator(cohort::launch_info_from_env());
/// cohort::all_reduce(comm, grads, cohort::ops::sum);   // cohort-run -n 4 ./train
/// ```
///
/// **Staging.** Between each ordered pair of ranks a single-producer single-consumer byte ring
/// (`shm_options::ring_bytes`) carries the stream as records: the sender copies its bytes in
/// and publishes a counter; the receiver reads them and publishes its own. A large send is cut
/// into records of `chunk_bytes`, so the receiver works on one record while the sender writes
/// the next. Receives that reduce do not copy at all: `recv_view` lends the record in the ring
/// and the reduction reads straight from it (`zero_copy_transport`). Small sends are packed: a
/// 32-byte call header and a small payload reach the peer in one handoff, and a handoff of up
/// to 104 bytes travels inside the block that holds the counter announcing it, so the peer
/// fetches one cache line, not two. Receives of 4 MiB and more are copied out with
/// non-temporal stores. Measured against Open MPI in bench/results/shm.md.
///
/// **Waiting.** A wait polls the rings for `spin`, then polls with `sched_yield` for `yield`,
/// then sleeps on a futex in the segment that the peers wake when they publish to a sleeper.
/// When the job has more ranks than this process has cores the busy polling is skipped: a
/// spinning rank would hold the core its peer needs. So it is when the peer last waited on
/// the CPU this rank runs on (the neighbours' work put both on one core): there the peer runs
/// only once this rank yields. Every wait ends by its deadline.
///
/// **Failures.** Each rank records its pid in the segment; a waiting rank checks the peer it
/// waits on every `liveness_interval` (a pidfd where available), so a crashed peer makes waits
/// fail with `errc::peer_lost`; a rank that closes its transport is reported the same way to
/// peers that wait on it (after they took what it had sent). `abort` writes the failure (code,
/// rank, text up to 1 KiB) into the segment and wakes every rank, whose waits then fail with
/// that code and whose `remote_failure()` returns it.
///
/// **The segment.** One per job, named "/cohort-<job_id>"; the first rank creates it
/// (`O_EXCL`, mode 0600), the others open it, refuse it unless it is their user's and closed
/// to others (job ids are predictable: another user could make it first and so read and change
/// the job's data), and wait for its ready word; the last rank to map it unlinks
/// the name, so once the constructor returns nothing of the job is left in /dev/shm, whatever
/// happens next. A segment left by a job that died while connecting is recognised and
/// replaced: one whose creator died before it was ready (the creator holds a lock on it until
/// then, which the kernel drops with the process), or one with a claimed rank whose process is
/// gone. Whether the job connected is decided once for all its ranks. Memory: `ring_bytes`
/// per ordered pair of ranks in address space, but only the rings actually written take
/// memory (ring schedules write P of the P(P-1)).
///
/// Linux: futexes, pidfds and /proc are used; other POSIX systems poll instead of sleeping.
/// The ranks must share /dev/shm and a PID namespace (else peers' deaths show only as
/// timeouts).
#pragma once

#include <chrono>
#include <cstddef>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>

#include <cohort/core/communicator.hpp>
#include <cohort/core/concepts.hpp>
#include <cohort/core/detail/min.hpp>
#include <cohort/core/error.hpp>
#include <cohort/core/options.hpp>
#include <cohort/launch/env.hpp>
#include <cohort/transport/detail/shm_engine.hpp>

namespace cohort {

/// Settings of `shm_transport`. Every rank of a job must pass the same `ring_bytes`.
struct shm_options {
  /// Staging bytes per ordered pair of ranks: a power of two, at least 64 KiB.
  std::size_t ring_bytes = std::size_t{4} << 20;
  /// How long the constructor waits for every rank to appear.
  std::chrono::milliseconds connect_timeout{30'000};
  /// The largest record a send is cut into: a multiple of 64, from 1 KiB to ring_bytes / 4
  /// (and 1 GiB). Smaller records pipeline sooner; larger ones cost fewer handoffs.
  std::size_t chunk_bytes = std::size_t{256} << 10;
  /// How long a wait busy-polls before it starts yielding the core (skipped when the job has
  /// more ranks than this process has cores, or the peer waited last on this rank's CPU).
  std::chrono::microseconds spin{50};
  /// How long a wait then polls with `sched_yield` before it sleeps on a futex.
  std::chrono::microseconds yield{1000};
  /// How often a waiting rank checks that the process of the peer it waits on still lives
  /// (one cheap system call each time).
  std::chrono::milliseconds liveness_interval{200};
};

/// One rank's end of a group of processes on one host; models `zero_copy_transport`.
///
/// Movable, not copyable; a moved-from transport may only be destroyed or assigned to. Not
/// thread-safe (one thread uses a transport at a time, like a communicator). Progress happens
/// inside its calls: a send posted and never waited on moves only during later calls.
class shm_transport {
 public:
  /// A handle on a posted operation; default-constructed is complete.
  using request = detail::shm::request;

  /// Joins job `job_id` as `rank` of `size` ranks on this host; returns once every rank has
  /// joined. Throws `cohort::error` (operation "shm_transport"): `errc::invalid_argument` for
  /// a job id that is not 1-128 of [A-Za-z0-9_.-], a rank outside [0, size), options out of
  /// range, a rank another live process already took, or a segment of another shape;
  /// `errc::timed_out` after `connect_timeout`, naming the ranks that never came;
  /// `std::errc::permission_denied` for a segment of this job id that another user made, or
  /// that others may open (naming its path, owner and mode); a system error code when the
  /// system refuses (e.g. /dev/shm full).
  shm_transport(std::string_view job_id, int rank, int size, shm_options opts = {}) {
    const auto bad = [&](const std::string& what) {
      return error(errc::invalid_argument, "shm_transport", -1, "shm_transport: " + what);
    };
    if (!detail::valid_job_id(job_id))
      throw bad("job id \"" + std::string(job_id) + "\" is not 1 to 128 of [A-Za-z0-9_.-]");
    if (size < 1 || rank < 0 || rank >= size)
      throw bad("rank " + std::to_string(rank) + " of " + std::to_string(size) + " ranks");
    const std::size_t ring = opts.ring_bytes, chunk = opts.chunk_bytes;
    if (ring < (std::size_t{64} << 10) || (ring & (ring - 1)) != 0 || ring > (std::size_t{1} << 40))
      throw bad("ring_bytes " + std::to_string(ring) + " is not a power of two from 64 KiB");
    if (chunk < 1024 || chunk % 64 != 0 || chunk > ring / 4 || chunk > (std::size_t{1} << 30))
      throw bad("chunk_bytes " + std::to_string(chunk) + " is not a multiple of 64 from 1 KiB "
                "to ring_bytes / 4 (and 1 GiB)");
    if (static_cast<double>(size) * (size - 1) * static_cast<double>(ring) > 0x1p46)
      throw bad("ring_bytes " + std::to_string(ring) + " is too large for " +
                std::to_string(size) + " ranks");
    if (opts.spin.count() < 0 || opts.yield.count() < 0 || opts.liveness_interval.count() <= 0 ||
        opts.connect_timeout.count() < 0)
      throw bad("negative durations, or a liveness_interval that is not positive");
    const detail::shm::settings s{ring,
                                  chunk,
                                  detail::min_of(chunk, detail::shm::pack_bytes),
                                  detail::shm::stream_receive_bytes,
                                  opts.spin,
                                  opts.yield,
                                  opts.liveness_interval,
                                  opts.connect_timeout};
    engine_ = std::make_unique<detail::shm::engine>(std::string(job_id), rank, size, s);
  }

  shm_transport(shm_transport&&) noexcept = default;
  shm_transport& operator=(shm_transport&&) noexcept = default;

  /// Leaves the job: peers waiting on this rank fail with `errc::peer_lost` once they have
  /// taken what it sent. Sends not yet in the ring are dropped (wait for them first).
  ~shm_transport() = default;

  /// Sends complete once in the ring, without the receiver (as long as it takes what came
  /// before): a rank whose part of a call of at most this many bytes only sends (the root of a
  /// broadcast, the first rank of a chain reduce) returns without waiting for its left
  /// neighbour's call header, at a cost of one handoff. Small enough that the calls it may run
  /// ahead (`unchecked_headers::capacity`, 4) fit the smallest ring (64 KiB) with their headers.
  static constexpr std::size_t eager_send_bytes = 8 * 1024;

  /// This rank, in [0, size()).
  int rank() const { return engine_->rank(); }
  /// The number of ranks.
  int size() const { return engine_->size(); }

  /// Starts sending `bytes` to `peer` (copying into the ring what fits now); they must live
  /// until the request completes, which is when all of them are in the ring.
  request send(int peer, std::span<const std::byte> bytes) { return engine_->send(peer, bytes); }

  /// Starts receiving exactly `bytes.size()` bytes from `peer`, the next ones of its stream.
  request recv(int peer, std::span<std::byte> bytes) { return engine_->recv(peer, bytes); }

  /// Progresses every pending operation until `req` completes; then resets it. Fails with
  /// `errc::timed_out` at `until`, `errc::peer_lost` when the peer died or left, or the code a
  /// rank passed to `abort` (`errc::aborted` where this rank aborted).
  void wait(request& req, deadline until, std::error_code& ec) { engine_->wait(req, until, ec); }

  /// Waits for bytes from `peer` and lends the next 1..`max` of them (a multiple of `align`)
  /// in place in the ring; valid until released. No receive from `peer` may be pending. Fails
  /// as `wait` does; a stream that breaks off within an element fails with `errc::peer_lost`
  /// once the peer is seen gone, or `errc::protocol_error` if the peer sends on after it.
  std::span<const std::byte> recv_view(int peer, std::size_t max, std::size_t align,
                                       deadline until, std::error_code& ec) {
    return engine_->recv_view(peer, max, align, until, ec);
  }

  /// Consumes the first `n` bytes of the last view from `peer`; they count as received.
  void recv_release(int peer, std::size_t n) { engine_->recv_release(peer, n); }

  /// Fails the pending and later operations here and at every peer with `f.code` (the first
  /// abort in a job wins; its text is kept up to 1 KiB).
  void abort(const failure& f) noexcept {
    if (engine_) engine_->abort(f);
  }

  /// What the rank that aborted the job said (`peer` is that rank), or null when none did or
  /// this rank did.
  const failure* remote_failure() const { return engine_->remote_failure(); }

  /// The name of the job's shared-memory object ("/cohort-<job_id>"; empty for one rank). It
  /// is unlinked by the time the constructor returns.
  const std::string& segment_name() const { return engine_->name(); }

 private:
  std::unique_ptr<detail::shm::engine> engine_;
};

static_assert(zero_copy_transport<shm_transport>);

/// The communicator over the shared-memory transport.
using shm_communicator = basic_communicator<shm_transport>;

/// Joins the job described by `info` (from `launch_info_from_env()`: cohort-run, torchrun,
/// mpirun, srun), every rank on this host. Throws `cohort::error`: `errc::unsupported` when the
/// launcher says some ranks are on other hosts, else as `shm_transport`'s constructor.
inline shm_communicator make_shm_communicator(const launch_info& info, shm_options opts = {}) {
  if (info.local_size != info.size)
    throw error(errc::unsupported, "make_shm_communicator", -1,
                "make_shm_communicator: the launcher (" + std::string(launcher_name(info.source)) +
                    ") puts " + std::to_string(info.local_size) + " of " +
                    std::to_string(info.size) +
                    " ranks on this host; shared memory needs all of them here");
  return shm_communicator(std::in_place, info.job_id, info.rank, info.size, opts);
}

}  // namespace cohort
