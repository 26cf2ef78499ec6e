/// @file
/// The progress thread: runs a communicator's collectives in the background, in order.
///
/// Asio lives here and in the async headers only; `cohort.hpp` does not include them, so code
/// that nvcc compiles never sees Asio.
#pragma once

#include <chrono>
#include <exception>
#include <optional>
#include <thread>
#include <utility>

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/associated_executor.hpp>
#include <boost/asio/async_result.hpp>
#include <boost/asio/dispatch.hpp>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>

#include <cohort/core/communicator.hpp>

namespace cohort {

namespace detail {
/// A communicator whose transport's waits busy-poll for a settable time before they block
/// (`tcp_transport`). Communicators of several transports (hierarchical) keep their own.
template <class C>
concept spin_settable = requires(C& c, std::chrono::nanoseconds d) { c.transport().set_spin(d); };
}  // namespace detail

/// How a `progress_thread` drives its communicator.
struct progress_options {
  /// The time the transport's waits busy-poll before they block, set once when the thread
  /// starts, on transports that have `set_spin(std::chrono::nanoseconds)`; others keep their
  /// own settings (give `shm_transport` `shm_options{.spin = {}, .yield = {}}`). Default 0:
  /// while a wait spins it holds a core that back-propagation wants, which is what overlap
  /// is meant to give back; spinning pays only where every rank has a spare core for its
  /// progress thread. `std::nullopt` leaves the transport as it is (e.g. COHORT_TCP_SPIN_US).
  /// The setting stays after the thread ends.
  std::optional<std::chrono::nanoseconds> spin = std::chrono::nanoseconds::zero();
};

/// A thread that owns the right to call collectives on `comm` and runs the operations handed
/// to it one after the other, in the order they were started.
///
/// This is how communication overlaps computation (NCCL's proxy thread, Horovod's background
/// thread): the caller starts `async_all_reduce` and goes on computing. While a progress
/// thread exists, start every collective on `comm` through it; the communicator itself is not
/// thread-safe. The destructor waits for the operations already started. `Comm` is any
/// communicator: one transport's (`communicator`), or one made of several
/// (`hierarchical_communicator`); the operations are what call it.
template <class Comm>
class progress_thread {
 public:
  /// Starts the thread; `comm` must outlive this object.
  explicit progress_thread(Comm& comm, const progress_options& opts = {})
      : comm_(comm), work_(boost::asio::make_work_guard(context_)) {
    if constexpr (detail::spin_settable<Comm>)
      if (opts.spin) comm_.transport().set_spin(*opts.spin);
    thread_ = std::thread([this] { context_.run(); });
  }

  progress_thread(const progress_thread&) = delete;
  progress_thread& operator=(const progress_thread&) = delete;

  /// Finishes the operations already started, then joins the thread.
  ~progress_thread() {
    work_.reset();
    thread_.join();
  }

  /// The communicator the operations run on.
  Comm& comm() { return comm_; }

  /// Starts `fn(comm)` on the thread after every operation started before it, and completes
  /// `token` with `void(std::exception_ptr)`: null on success, else what `fn` threw (a
  /// `cohort::error` from a collective). The handler runs on its associated executor (the
  /// progress thread for a plain callback; the caller's executor for `use_awaitable`).
  template <class Fn, class CompletionToken>
  auto start(Fn fn, CompletionToken&& token) {
    return boost::asio::async_initiate<CompletionToken, void(std::exception_ptr)>(
        [this](auto handler, Fn f) {
          auto work = boost::asio::make_work_guard(boost::asio::get_associated_executor(handler));
          boost::asio::post(context_, [this, f = std::move(f), handler = std::move(handler),
                                       work = std::move(work)]() mutable {
            std::exception_ptr failure;
            try {
              f(comm_);
            } catch (...) {
              failure = std::current_exception();
            }
            // The guard keeps the handler's executor running until the handler is handed over.
            boost::asio::dispatch(work.get_executor(),
                                  [handler = std::move(handler), failure]() mutable {
                                    std::move(handler)(failure);
                                  });
            work.reset();
          });
        },
        token, std::move(fn));
  }

 private:
  Comm& comm_;
  boost::asio::io_context context_{1};
  boost::asio::executor_work_guard<boost::asio::io_context::executor_type> work_;
  std::thread thread_;
};

}  // namespace cohort
