/// @file
/// One collective call in flight: its deadline, the header check across ranks, waits that
/// turn transport errors into failures that name the operation and the peer.
#pragma once

#include <chrono>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <string_view>
#include <system_error>

#include <cohort/core/communicator.hpp>
#include <cohort/core/dtype.hpp>
#include <cohort/core/error.hpp>
#include <cohort/core/ops.hpp>
#include <cohort/core/options.hpp>

namespace cohort::detail {

enum class collective : std::uint8_t {
  all_reduce = 1, reduce_scatter, all_gather, broadcast, reduce, barrier
};

constexpr std::string_view collective_name(collective c) noexcept {
  switch (c) {
    case collective::all_reduce: return "all_reduce";
    case collective::reduce_scatter: return "reduce_scatter";
    case collective::all_gather: return "all_gather";
    case collective::broadcast: return "broadcast";
    case collective::reduce: return "reduce";
    case collective::barrier: return "barrier";
  }
  return "unknown collective";
}

/// What every rank announces to its right neighbour at the start of each call. Because each
/// rank compares with its left neighbour, and the ring closes, any disagreement anywhere is
/// seen by at least one rank, which then aborts the others.
struct call_header {
  static constexpr std::uint32_t magic_value = 0x43485254;  // "CHRT"
  std::uint32_t magic = magic_value;
  std::uint8_t kind = 0;        // collective
  std::uint8_t type = 0;        // dtype, 0xff for none
  std::uint16_t reserved = 0;
  std::uint64_t sequence = 0;
  std::uint64_t count = 0;      // elements each rank passes (see each collective)
  std::uint32_t op_tag = 0;     // reduction_tag<Op>(), 0 for none
  std::int32_t root = -1;       // -1 for none
};
static_assert(sizeof(call_header) == 32);
static_assert(unchecked_headers<int>::header_bytes == sizeof(call_header));

inline bool operator==(const call_header& a, const call_header& b) noexcept {
  return std::memcmp(&a, &b, sizeof a) == 0;
}

/// A transport whose sends of up to `T::eager_send_bytes` complete into buffers of its own,
/// without the receiver, even when the receiver posts nothing for a few calls
/// (`unchecked_headers::capacity` of them, each with its header) but takes what came before.
template <class T>
concept eager_send_transport = requires {
  { T::eager_send_bytes } -> std::convertible_to<std::size_t>;
};

/// A transport whose sends posted before a wait leave together, one handoff per peer: a call
/// header sent ahead of a payload costs no handoff of its own.
template <class T>
concept coalescing_transport = T::coalesces_sends;

/// A communicator that keeps call headers for later calls to compare, over such a transport:
/// there a rank whose part of a small call only sends returns without waiting for its left
/// neighbour's header, which the next call that waits compares first.
template <class C>
concept deferring_communicator = eager_send_transport<typename C::transport_type> &&
    requires(C& c) { c.unchecked_headers(); };

/// The most bytes a rank whose part of a call only sends can leave in the transport's buffers
/// and return (`call::only_sends`): the transport's `eager_send_bytes` where `Comm` defers,
/// otherwise 0.
template <class Comm>
inline constexpr std::size_t deferred_send_bytes = [] {
  if constexpr (deferring_communicator<Comm>)
    return static_cast<std::size_t>(Comm::transport_type::eager_send_bytes);
  else
    return std::size_t{0};
}();

// Error messages are built only on the paths that fail. Their functions are cold: the
// compiler optimizes them for size and keeps them out of line, so that each collective's code
// carries a call where it would carry the string operations (12 of the 50 KB of code that one
// all_reduce over loopback generated, and a tenth of the time to compile it at -O2).
inline void append_text(std::string& s, std::string_view v) { s += v; }
template <std::integral I>
void append_text(std::string& s, I v) { s += std::to_string(v); }

/// The parts, strings and whole numbers, joined: `text("root ", 5, " is not a rank")`.
template <class... Parts>
[[gnu::cold]] std::string text(const Parts&... parts) {
  std::string s;
  (append_text(s, parts), ...);
  return s;
}

/// "all_gather #17 with 4096 f32", "reduce #3 with 10 i32 sum to root 2".
[[gnu::cold]] inline std::string describe(const call_header& h) {
  if (h.magic != call_header::magic_value) return "a malformed call header";
  const auto kind = static_cast<collective>(h.kind);
  std::string s = text(collective_name(kind), " #", h.sequence);
  if (kind == collective::barrier) return s;
  const std::string_view type =
      h.type == 0xff ? std::string_view("?") : dtype_name(static_cast<dtype>(h.type));
  s += text(" with ", h.count, " ", type);
  if (const std::string_view op = builtin_reduction_name(h.op_tag); !op.empty())
    s += text(" ", op);
  else if (h.op_tag != 0)
    s += text(" user-defined op ", h.op_tag);
  if (h.root >= 0)
    s += text(kind == collective::broadcast ? " from root " : " to root ", h.root);
  return s;
}

/// The state of one call: built at entry, it checks arguments, exchanges headers and waits.
template <communicator Comm>
class call {
 public:
  using request = typename Comm::transport_type::request;

  call(Comm& comm, collective kind, const call_options& opts)
      : comm_(comm), kind_(kind), sequence_(comm.next_sequence()),
        until_(deadline_after(opts.timeout.count() > 0 ? opts.timeout : comm.timeout())),
        rank_(comm.rank()), size_(comm.size()), timeout_(opts.timeout) {
    header_.kind = static_cast<std::uint8_t>(kind);
    header_.sequence = sequence_;
  }

  Comm& comm() { return comm_; }
  auto& transport() { return comm_.transport(); }
  int rank() const { return rank_; }
  int size() const { return size_; }
  int left() const { return (rank_ + size_ - 1) % size_; }
  int right() const { return (rank_ + 1) % size_; }
  deadline until() const { return until_; }
  const failure& result() const { return result_; }

  /// Describes the call in the header: element type, count, reduction, root.
  template <element T>
  void describe_data(std::size_t count) {
    header_.type = static_cast<std::uint8_t>(dtype_of<T>);
    header_.count = count;
  }
  template <class Op>
  void describe_op() { header_.op_tag = reduction_tag<Op>(); }
  void describe_root(int root) { header_.root = root; }

  /// Says, before `start()`, that this rank's part of the call only sends, `bytes` in all.
  /// Where the communicator can defer (`deferring_communicator`) and the bytes are few
  /// (the transport's `eager_send_bytes`), the left neighbour's header is then compared by a later
  /// call, so that the call costs this rank no wait for its neighbour: a disagreement is still
  /// seen in the call by the ranks that receive, and by this rank at its next call that waits
  /// (or once `capacity` calls are pending), which fails naming both calls.
  void only_sends(std::size_t bytes) {
    if constexpr (deferring_communicator<Comm>) defer_ = bytes <= deferred_send_bytes<Comm>;
  }

  /// Rejects bad arguments before anything is sent; does not poison.
  [[gnu::cold]] bool invalid(std::string what) {
    result_ = {make_error_code(errc::invalid_argument), -1, prefix() + std::move(what)};
    return false;
  }

  /// Fails at once if poisoned; otherwise posts this rank's header to the right and the
  /// receive of the left neighbour's. Post the first data sends, then `check_header()`.
  bool start() {
    if (timeout_.count() < 0) return negative_timeout();
    if (const failure* f = comm_.last_failure()) return poisoned(*f);
    if (size_ == 1) return true;
    header_send_ = transport().send(right(), std::as_bytes(std::span(&header_, 1)));
    if constexpr (deferring_communicator<Comm>) {
      if (defer_) {
        auto& u = comm_.unchecked_headers();
        if (u.count == u.capacity && !check_oldest()) return false;
        auto& e = u.entries[(u.first + u.count) % u.capacity];
        std::memcpy(e.mine, &header_, sizeof header_);
        e.recv = transport().recv(left(), std::span(e.theirs));
        ++u.count;
        checked_ = true;
        return true;
      }
    }
    header_recv_ = transport().recv(left(), std::as_writable_bytes(std::span(&theirs_, 1)));
    return true;
  }

  /// Waits for the left neighbour's header and fails with `errc::mismatch` unless it agrees;
  /// compares first the headers earlier calls left unchecked.
  bool check_header() {
    if (size_ == 1 || checked_) return true;
    checked_ = true;
    if constexpr (deferring_communicator<Comm>)
      while (comm_.unchecked_headers().count > 0)
        if (!check_oldest()) return false;
    if (!wait_for(header_recv_, left())) return false;
    return compare(theirs_, header_, left());
  }

  /// Sends this rank's header to `peer` on a stream that carries no ring header (not to the
  /// right neighbour), ahead of the data, for `check_header_from` there. Completes with the
  /// data sent after it (streams are FIFO).
  void send_header(int peer) { transport().send(peer, std::as_bytes(std::span(&header_, 1))); }

  /// Receives the header `peer` sent with `send_header` and fails with `errc::mismatch` unless
  /// it agrees; take no data from `peer` before it.
  bool check_header_from(int peer) {
    call_header theirs;
    auto req = transport().recv(peer, std::as_writable_bytes(std::span(&theirs, 1)));
    return wait(req, peer) && compare(theirs, header_, peer);
  }

  /// Completes the call: the header send must have been taken too.
  bool finish() {
    if (size_ == 1) return true;
    return check_header() && wait(header_send_, right());
  }

  /// Waits for `r` (an operation with `peer`), turning a transport error into a failure.
  /// The first wait of a call checks the header first: two ranks that disagree may both be
  /// waiting on sends the other never receives, and only the header tells them why.
  bool wait(request& r, int peer) {
    if (!checked_ && !check_header()) return false;
    return wait_for(r, peer);
  }

  /// Fails with what the transport reported about an operation with `peer`.
  [[gnu::cold]] bool fail_transport(std::error_code ec, int peer) {
    if (const failure* remote = transport().remote_failure())
      return fail(remote->code, remote->peer,
                  text("rank ", remote->peer, " failed: ", remote->what));
    if (ec == errc::timed_out)
      return fail(ec, peer, text("timed out waiting for rank ", peer,
                                 " (is it stuck, or did it skip this call?)"));
    if (ec == errc::peer_lost)
      return fail(ec, peer, text("lost rank ", peer,
                                 " (it exited, crashed or closed its connection)"));
    return fail(ec, peer, text("rank ", peer, ": ", ec.message()));
  }

  /// Records a failure, poisons the communicator and aborts the peers.
  [[gnu::cold]] bool fail(std::error_code code, int peer, std::string what) {
    result_ = {code, peer, prefix() + std::move(what)};
    comm_.fail(result_);
    return false;
  }

 private:
  // Waits for `r`, without the header check.
  bool wait_for(request& r, int peer) {
    std::error_code ec;
    transport().wait(r, until_, ec);
    if (!ec) return true;
    return fail_transport(ec, peer);
  }

  bool compare(const call_header& theirs, const call_header& mine, int peer) {
    return theirs == mine || mismatch(theirs, mine, peer);
  }

  [[gnu::cold]] bool mismatch(const call_header& theirs, const call_header& mine, int peer) {
    return fail(errc::mismatch, peer, text("rank ", peer, " called ", describe(theirs),
                                           ", rank ", rank_, " called ", describe(mine)));
  }

  [[gnu::cold]] bool negative_timeout() {
    return invalid(text("the call's timeout is ", timeout_.count(),
                        " ms; it must be positive, or zero for the communicator's default"));
  }

  [[gnu::cold]] bool poisoned(const failure& f) {
    result_ = {make_error_code(errc::poisoned), f.peer,
               prefix() + "the communicator failed earlier and must be rebuilt: " + f.what};
    return false;
  }

  // Waits for the oldest header an earlier call left unchecked and compares it.
  bool check_oldest() {
    auto& u = comm_.unchecked_headers();
    auto& e = u.entries[u.first];
    if (!wait_for(e.recv, left())) return false;
    u.first = (u.first + 1) % u.capacity;
    --u.count;
    call_header theirs, mine;
    std::memcpy(&theirs, e.theirs, sizeof theirs);
    std::memcpy(&mine, e.mine, sizeof mine);
    return compare(theirs, mine, left());
  }

  [[gnu::cold]] std::string prefix() const {
    return text(collective_name(kind_), " #", sequence_, ": ");
  }

  Comm& comm_;
  collective kind_;
  std::uint64_t sequence_;
  deadline until_;
  int rank_, size_;
  std::chrono::milliseconds timeout_;
  call_header header_{}, theirs_{};
  request header_send_{}, header_recv_{};
  bool checked_ = false;
  bool defer_ = false;  // see only_sends()
  failure result_{};
};

/// Ends a call for the throwing overloads: throws `cohort::error` if it failed.
inline void throw_if_failed(const failure& f, std::string_view operation) {
  if (f.code) throw error(f.code, std::string(operation), f.peer, f.what);
}

/// Ends a call for the `std::error_code` overloads: returns the failure's code, and keeps the
/// failure, sentence and all, as `comm.last_error()` where the communicator has one.
template <class Comm>
std::error_code error_code_for(Comm& comm, failure&& f) noexcept {
  const std::error_code ec = f.code;
  if constexpr (requires { comm.note_error(std::move(f)); })
    if (ec) comm.note_error(std::move(f));
  return ec;
}

}  // namespace cohort::detail
