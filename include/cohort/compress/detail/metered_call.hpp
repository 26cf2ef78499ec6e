/// @file
/// A collective call that counts the bytes it sends: `detail::call` (deadline, header check,
/// failures that name the operation and the peer) seen through a transport that adds up the
/// length of every send. The schedules of collectives/detail run on it unchanged.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <system_error>

#include <cohort/collectives/detail/call.hpp>
#include <cohort/core/communicator.hpp>
#include <cohort/core/concepts.hpp>

namespace cohort::compress::detail {

/// Forwards to a transport and counts the bytes passed to `send`. Lends views exactly when the
/// transport underneath does, so that the schedules pick the same path through it.
template <transport T>
class counting_transport {
 public:
  using request = typename T::request;

  explicit counting_transport(T& t) noexcept : t_(&t) {}

  int rank() const { return t_->rank(); }
  int size() const { return t_->size(); }
  request send(int peer, std::span<const std::byte> bytes) {
    sent_ += bytes.size();
    return t_->send(peer, bytes);
  }
  request recv(int peer, std::span<std::byte> bytes) { return t_->recv(peer, bytes); }
  void wait(request& r, deadline d, std::error_code& ec) { t_->wait(r, d, ec); }
  void abort(const failure& f) noexcept { t_->abort(f); }
  const failure* remote_failure() const { return t_->remote_failure(); }

  std::span<const std::byte> recv_view(int peer, std::size_t max, std::size_t align, deadline d,
                                       std::error_code& ec)
    requires zero_copy_transport<T>
  {
    return t_->recv_view(peer, max, align, d, ec);
  }
  void recv_release(int peer, std::size_t n)
    requires zero_copy_transport<T>
  {
    t_->recv_release(peer, n);
  }

  /// Bytes handed to `send` so far.
  std::uint64_t bytes_sent() const noexcept { return sent_; }

 private:
  T* t_;
  std::uint64_t sent_ = 0;
};

/// `cohort::detail::call` whose `transport()` counts sends; what the schedules take as `Call`.
template <communicator Comm>
class metered_call {
  using base_call = cohort::detail::call<Comm>;

 public:
  using request = typename Comm::transport_type::request;

  metered_call(Comm& comm, const call_options& opts)
      : call_(comm, cohort::detail::collective::all_reduce, opts), meter_(comm.transport()) {}

  Comm& comm() { return call_.comm(); }
  counting_transport<typename Comm::transport_type>& transport() { return meter_; }
  int rank() const { return call_.rank(); }
  int size() const { return call_.size(); }
  int left() const { return call_.left(); }
  int right() const { return call_.right(); }
  deadline until() const { return call_.until(); }
  const failure& result() const { return call_.result(); }

  template <element T>
  void describe_data(std::size_t count) { call_.template describe_data<T>(count); }
  template <class Op>
  void describe_op() { call_.template describe_op<Op>(); }

  bool invalid(std::string what) { return call_.invalid(std::move(what)); }
  bool start() {
    started_ = call_.start();
    return started_;
  }
  bool check_header() { return call_.check_header(); }
  bool finish() { return call_.finish(); }
  bool wait(request& r, int peer) { return call_.wait(r, peer); }
  bool fail_transport(std::error_code ec, int peer) { return call_.fail_transport(ec, peer); }
  bool fail(std::error_code code, int peer, std::string what) {
    return call_.fail(code, peer, std::move(what));
  }

  /// Every byte this call sent: the data counted here plus the call header that
  /// `detail::call::start` posts to the right neighbour itself (none when alone).
  std::uint64_t bytes_sent() const noexcept {
    const bool header = started_ && call_.size() > 1;
    return meter_.bytes_sent() + (header ? sizeof(cohort::detail::call_header) : 0);
  }

 private:
  base_call call_;
  counting_transport<typename Comm::transport_type> meter_;
  bool started_ = false;
};

}  // namespace cohort::compress::detail
