/// @file
/// `async_push` and `async_pull`: a worker's requests through a progress thread, completed
/// through an Asio completion token (`use_future`, `use_awaitable`, a callback), as the
/// `async_` collectives are (<cohort/async/collectives.hpp>).
///
/// Each hands `push` (or `pull`) and its `wait` to the progress thread, which runs them after
/// every operation started before; the token completes with `void(std::exception_ptr)`: null,
/// or the `cohort::error` the blocking form throws (bad arguments included). While a progress
/// thread drives the communicator, every use of the worker goes through it (`finish` too:
/// `p.start([&](auto&) { w.finish(); }, token)`). The buffer must stay valid until completion.
/// For requests in flight without a thread, use the worker's tickets.
#pragma once

#include <cohort/async/progress_thread.hpp>
#include <cohort/parameter_server/worker.hpp>
#include <cstdint>
#include <span>
#include <utility>

namespace cohort::ps {

/// `w.wait(w.push(key, gradient))` on the progress thread.
template <communicator Comm, class CompletionToken>
auto async_push(progress_thread<Comm>& p, worker<Comm>& w, std::uint64_t key,
                std::span<const float> gradient, CompletionToken&& token) {
  return p.start([&w, key, gradient](Comm&) { w.wait(w.push(key, gradient)); },
                 std::forward<CompletionToken>(token));
}

/// `w.wait(w.pull(key, into))` on the progress thread.
template <communicator Comm, class CompletionToken>
auto async_pull(progress_thread<Comm>& p, worker<Comm>& w, std::uint64_t key, std::span<float> into,
                CompletionToken&& token) {
  return p.start([&w, key, into](Comm&) { w.wait(w.pull(key, into)); },
                 std::forward<CompletionToken>(token));
}

}  // namespace cohort::ps
