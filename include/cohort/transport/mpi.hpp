/// @file
/// The MPI transport: the transport concept over MPI point-to-point messages, for jobs that
/// already run under MPI (an optional dependency: this header needs `<mpi.h>` and the program
/// must link MPI; nothing else in cohort does).
///
/// ```cpp
/// MPI_Init(&argc, &argv);
/// {
///   auto comm = cohort::make_mpi_communicator(MPI_COMM_WORLD);
///   cohort::all_reduce(comm, grads, cohort::ops::sum);   // mpirun -np 4 ./train
/// }  // destroy it before MPI_Finalize
/// MPI_Finalize();
/// ```
///
/// **Setup.** The constructor duplicates the communicator it is given twice (`MPI_Comm_dup`,
/// collective over it: every rank constructs its transport at the same point), one for data and
/// one for aborts, so cohort's messages never match the application's and an abort never
/// matches data. Ranks and size are those of the given communicator. Errors of MPI calls on the
/// duplicates are returned, not fatal (`MPI_ERRORS_RETURN`).
///
/// **Data path** (detail/mpi_engine.hpp). `send` posts `MPI_Isend`s of at most
/// `mpi_options::max_message_bytes` each (256 KiB, the collectives' chunk). Receives keep the
/// concept's byte-stream semantics whatever the sizes of the sends: the next message from the
/// peer is probed (`MPI_Improbe`) and received (`MPI_Imrecv`) in place when it fits in the
/// posted receive, else through a staging buffer (one allocation and one copy; with the
/// default message size the collectives' messages line up with their receives). `wait` polls `MPI_Test` until the request completes
/// or the deadline passes (`errc::timed_out`): it busy-polls for `spin`, then yields the core
/// between polls. Progress happens only inside calls.
///
/// **Failures.** `abort` sends the failure (code, rank, up to 1 KiB of text) to every peer on
/// the abort communicator; their waits then fail with that code and their `remote_failure()`
/// returns it. A rank that fails because a peer aborted passes that abort on unchanged (its
/// rank and words), so every rank blames the rank that aborted first. MPI cannot withdraw a send (or a receive it already matched), so `abort` lets the
/// operations in flight finish for up to 100 ms; the peers stop matching this rank's messages
/// once they see its abort. MPI offers no portable way to learn that a peer died: under
/// `mpirun` a rank that dies ends the job, and a peer that stops answering shows as
/// `errc::timed_out`. An MPI call that fails fails the wait with `errc::peer_lost`.
///
/// **Threads.** One thread uses a transport at a time. The async collectives run calls on a
/// progress thread: initialize MPI with `MPI_Init_thread` and at least
/// `MPI_THREAD_SERIALIZED` then (`MPI_THREAD_MULTIPLE` if the application uses MPI meanwhile).
#pragma once

// Without <mpi.h> on the include path (MPI not installed, or the program does not use MPI's
// compiler flags) this header declares nothing, so that a build that includes every header
// still compiles (using cohort::mpi_transport then fails to compile: build with MPI).
#if __has_include(<mpi.h>)

#ifndef OMPI_SKIP_MPICXX
#define OMPI_SKIP_MPICXX 1  // the C API only: Open MPI's C++ bindings warn under -Wextra
#endif
#include <mpi.h>

#include <chrono>
#include <climits>
#include <cstddef>
#include <memory>
#include <span>
#include <string>
#include <system_error>
#include <utility>

#include <cohort/core/communicator.hpp>
#include <cohort/core/concepts.hpp>
#include <cohort/core/error.hpp>
#include <cohort/core/options.hpp>
#include <cohort/transport/detail/mpi_engine.hpp>

namespace cohort {

/// Settings of `mpi_transport`.
struct mpi_options {
  /// The largest MPI message a send is cut into: 1 to INT_MAX bytes (an MPI count is an
  /// `int`). The default is the collectives' pipeline chunk (collectives/detail/tuning.hpp):
  /// they send a block whole and receive it chunk by chunk, and messages that line up with
  /// those receives land in place instead of through the staging buffer.
  std::size_t max_message_bytes = std::size_t{256} << 10;
  /// How long `wait` busy-polls before it yields the core between polls.
  std::chrono::microseconds spin{50};
};

/// One rank's end of a group of MPI processes; models `cohort::transport`.
///
/// Movable, not copyable; a moved-from transport may only be destroyed or assigned to. Destroy
/// it before `MPI_Finalize`.
class mpi_transport {
 public:
  /// A pending send or receive; default-constructed is complete.
  using request = detail::mpi::request;

  /// Joins the group of `comm` (duplicating it twice; collective over `comm`). Throws
  /// `cohort::error` (operation "mpi_transport", `errc::invalid_argument`) when MPI is not
  /// initialized, `comm` is null or an intercommunicator, the options are out of range, or
  /// `MPI_Comm_dup` fails.
  explicit mpi_transport(MPI_Comm comm, mpi_options opts = {}) {
    if (opts.max_message_bytes < 1 || opts.max_message_bytes > std::size_t{INT_MAX} ||
        opts.spin.count() < 0)
      throw error(errc::invalid_argument, "mpi_transport", -1,
                  "mpi_transport: max_message_bytes " + std::to_string(opts.max_message_bytes) +
                      " is not in [1, INT_MAX], or spin is negative");
    engine_ = std::make_unique<detail::mpi::engine>(comm, opts.max_message_bytes, opts.spin);
  }

  mpi_transport(mpi_transport&&) noexcept = default;
  mpi_transport& operator=(mpi_transport&&) noexcept = default;

  /// Frees the duplicated communicators; sends still pending finish in the background.
  ~mpi_transport() = default;

  /// This rank in the communicator, in [0, size()).
  int rank() const { return engine_->rank(); }
  /// The number of ranks of the communicator.
  int size() const { return engine_->size(); }

  /// Starts sending `bytes` to `peer`; they must stay alive until the request completes.
  request send(int peer, std::span<const std::byte> bytes) { return engine_->send(peer, bytes); }

  /// Starts receiving exactly `bytes.size()` bytes from `peer`, the next ones of its stream.
  request recv(int peer, std::span<std::byte> bytes) { return engine_->recv(peer, bytes); }

  /// Progresses every pending operation until `req` completes; then resets it. Fails with
  /// `errc::timed_out` at `until`, the code a peer passed to `abort` (`errc::aborted` where
  /// this rank aborted first), or `errc::peer_lost` when an MPI call failed (`mpi_error()`).
  void wait(request& req, deadline until, std::error_code& ec) { engine_->wait(req, until, ec); }

  /// Fails the pending and later operations here and at every peer with `f.code`.
  void abort(const failure& f) noexcept {
    if (engine_) engine_->abort(f);
  }

  /// What the first peer that aborted said (its rank in `peer`), or null when none did or this
  /// rank aborted first.
  const failure* remote_failure() const { return engine_->remote_failure(); }

  /// What MPI said when one of its calls failed, or empty.
  const std::string& mpi_error() const { return engine_->mpi_error(); }

 private:
  std::unique_ptr<detail::mpi::engine> engine_;
};

static_assert(transport<mpi_transport>);

/// The communicator over MPI.
using mpi_communicator = basic_communicator<mpi_transport>;

/// A communicator over the ranks of `comm` (see `mpi_transport`; collective over `comm`).
/// Throws `cohort::error` as `mpi_transport`'s constructor.
inline mpi_communicator make_mpi_communicator(MPI_Comm comm, mpi_options opts = {}) {
  return mpi_communicator(std::in_place, comm, opts);
}

}  // namespace cohort

#endif  // __has_include(<mpi.h>)
