/// @file
/// `async_` forms of the collectives: start now, complete through an Asio completion token.
///
/// Each takes a `progress_thread` and a completion token, returns what the token makes of
/// `void(std::exception_ptr)` (a `std::future<void>` for `use_future`, an awaitable for
/// `use_awaitable`, nothing for a callback), and otherwise means exactly what the blocking
/// form means: same arguments, deadlines and errors. Several may be in flight; they run and
/// complete in the order they were started. Buffers must stay valid until completion.
#pragma once

#include <span>

#include <cohort/async/progress_thread.hpp>
#include <cohort/collectives/all_gather.hpp>
#include <cohort/collectives/all_reduce.hpp>
#include <cohort/collectives/barrier.hpp>
#include <cohort/collectives/broadcast.hpp>
#include <cohort/collectives/reduce.hpp>
#include <cohort/collectives/reduce_scatter.hpp>

namespace cohort {

/// `all_reduce(comm, data, op, opts)` in place, on the progress thread.
template <communicator Comm, mutable_buffer Data, class Op, class CompletionToken>
  requires reduction_for<Op, buffer_element_t<Data>>
auto async_all_reduce(progress_thread<Comm>& p, Data&& data, Op op, call_options opts,
                      CompletionToken&& token) {
  return p.start([d = std::span(data), op, opts](Comm& c) { all_reduce(c, d, op, opts); },
                 std::forward<CompletionToken>(token));
}

/// `all_reduce(comm, data, op)` in place, on the progress thread, default deadline.
template <communicator Comm, mutable_buffer Data, class Op, class CompletionToken>
  requires reduction_for<Op, buffer_element_t<Data>>
auto async_all_reduce(progress_thread<Comm>& p, Data&& data, Op op, CompletionToken&& token) {
  return async_all_reduce(p, std::forward<Data>(data), op, call_options{},
                          std::forward<CompletionToken>(token));
}

/// `reduce_scatter(comm, in, out, op, opts)` on the progress thread.
template <communicator Comm, class In, class Out, class Op, class CompletionToken>
  requires detail::reduce_scatter_args<In, Out, Op>
auto async_reduce_scatter(progress_thread<Comm>& p, const In& in, Out&& out, Op op,
                          call_options opts, CompletionToken&& token) {
  return p.start([i = std::span(in), o = std::span(out), op, opts](Comm& c) {
    reduce_scatter(c, i, o, op, opts);
  }, std::forward<CompletionToken>(token));
}

/// `all_gather(comm, in, out, opts)` on the progress thread.
template <communicator Comm, class In, class Out, class CompletionToken>
  requires detail::buffer_pair<In, Out>
auto async_all_gather(progress_thread<Comm>& p, const In& in, Out&& out, call_options opts,
                      CompletionToken&& token) {
  return p.start([i = std::span(in), o = std::span(out), opts](Comm& c) {
    all_gather(c, i, o, opts);
  }, std::forward<CompletionToken>(token));
}

/// `broadcast(comm, data, root, opts)` on the progress thread.
template <communicator Comm, mutable_buffer Data, class CompletionToken>
auto async_broadcast(progress_thread<Comm>& p, Data&& data, int root, call_options opts,
                     CompletionToken&& token) {
  return p.start([d = std::span(data), root, opts](Comm& c) { broadcast(c, d, root, opts); },
                 std::forward<CompletionToken>(token));
}

/// `reduce(comm, data, op, root, opts)` in place, on the progress thread.
template <communicator Comm, mutable_buffer Data, class Op, class CompletionToken>
  requires reduction_for<Op, buffer_element_t<Data>>
auto async_reduce(progress_thread<Comm>& p, Data&& data, Op op, int root, call_options opts,
                  CompletionToken&& token) {
  return p.start([d = std::span(data), op, root, opts](Comm& c) { reduce(c, d, op, root, opts); },
                 std::forward<CompletionToken>(token));
}

/// `barrier(comm, opts)` on the progress thread.
template <communicator Comm, class CompletionToken>
auto async_barrier(progress_thread<Comm>& p, call_options opts, CompletionToken&& token) {
  return p.start([opts](Comm& c) { barrier(c, opts); }, std::forward<CompletionToken>(token));
}

}  // namespace cohort
