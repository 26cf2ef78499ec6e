/// @file
/// The data path of the TCP transport: one connected, handshaken socket per peer, driven by the
/// calling thread inside `wait`. No Asio here: the sockets were set up with Asio (see
/// tcp_connect.hpp) and handed over as plain descriptors, so that this loop owns every syscall:
///
/// - `send` and `recv` only queue (no syscall), so that the sends a collective posts before it
///   waits leave in one `sendmsg` (the call header and a small payload share a segment).
/// - `wait` writes what is queued, reads what is ready, and repeats: busy-polling (`ppoll` with
///   a zero timeout) for `spin`, then blocking in `ppoll` until the deadline. Where ranks
///   outnumber cores (`yield`), each round of the busy-poll gives the core away, so that a peer
///   waiting for this core runs at once instead of after this rank blocks. Every connection
///   progresses in every `wait`, whichever request it waits for: full duplex on one thread.
/// - Payload goes straight from the socket into the posted receive buffer (`recvmsg`), with a
///   small tail into the connection's staging buffer to catch the next frame header; bytes that
///   arrive before their receive is posted wait in the staging buffer (64 KiB), then in the
///   kernel. Nothing is allocated per message.
/// - A read of 0 bytes or a socket error marks the connection lost: every pending and later
///   operation with that peer fails with `errc::peer_lost` once the staged bytes are used up.
/// - Before a wait fails for a reason of this rank's own (a lost peer, its deadline), it reads
///   the peers' last words: one look at every connection without blocking, and a lost one read
///   to its end (data nobody can receive any more discarded). A peer that aborted said why in an
///   abort frame, which may wait behind data or on another connection than the awaited one; a
///   rank that was stopped past its deadline (SIGSTOP) and continued learns that cause, not
///   "lost rank N" or a timeout of its own.
/// - `abort` drops every pending operation (the engine never touches their buffers again),
///   finishes a half-written frame with zeros, and sends an abort frame to every peer, waiting
///   at most `abort_linger` for the kernel to take it, and never past the deadline of the last
///   wait, or `abort_grace` from now where that has passed (a call that timed out returns at
///   most `abort_grace` after its deadline). A received abort frame (found even behind staged
///   data nobody asked for yet) fails every wait here with the sender's code.
#pragma once

#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <ctime>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

#include <cohort/core/error.hpp>
#include <cohort/core/options.hpp>
#include <cohort/detail/net/unique_fd.hpp>
#include <cohort/transport/detail/fifo.hpp>
#include <cohort/transport/detail/tcp_wire.hpp>

namespace cohort::detail::tcp {

using net::unique_fd;

/// Tuning of the data path.
struct engine_options {
  std::chrono::nanoseconds spin{std::chrono::microseconds(50)};  ///< busy-poll before blocking
  /// Give the core away (`sched_yield`) on every round of the busy-poll: for ranks that
  /// outnumber the cores, where the peer that would answer may be waiting for this one's core.
  bool yield = false;
  std::chrono::milliseconds abort_linger{1000};  ///< how long `abort` tries to deliver its frames
  /// How long `abort` may try past the deadline of the last wait (after a timeout): a peer that
  /// reads takes the frame at once, one that stopped reading would not take it in any time.
  std::chrono::milliseconds abort_grace{10};
  std::size_t staging_bytes = 64 * 1024;         ///< per connection
  std::function<void(std::string_view)> log;     ///< where problems are told; may be empty
};

/// Discards what `fd` holds unread, then shuts its sending side, so that closing it is a FIN
/// (which lets the peer read what was sent) rather than a reset.
inline void close_gently(int fd) noexcept {
  std::byte sink[4096];
  for (int i = 0; i < 64 && ::recv(fd, sink, sizeof sink, MSG_DONTWAIT) > 0; ++i) {
  }
  ::shutdown(fd, SHUT_WR);
}

/// For the sockets of a setup that failed after some handshakes: their peers may already run an
/// engine on them and wait in a call. Each gets an abort frame saying why this rank leaves (as
/// much as the kernel takes at once), so that a peer blames the cause, not this rank; then
/// each is closed gently.
inline void farewell(std::vector<unique_fd>& fds, int origin, const failure& f) noexcept {
  std::byte frame[frame_header_size + max_control_frame];
  const std::size_t n = encode_abort(frame, sizeof frame, origin, f);
  for (auto& fd : fds) {
    if (!fd) continue;
    (void)::send(fd.get(), frame, n, MSG_DONTWAIT | MSG_NOSIGNAL);
    close_gently(fd.get());
    fd.reset();
  }
}

/// One peer's socket and the state of both directions on it.
struct connection {
  struct out_item {
    const std::byte* data;
    std::size_t size;
  };
  struct in_item {
    std::byte* data;
    std::size_t size;
  };

  int peer = -1;
  unique_fd fd;
  std::string address;  // for messages

  // Sending: user buffers queued, framed on the fly.
  fifo<out_item> txq;
  std::size_t tx_head_off = 0;  // bytes of txq.front() written
  std::uint64_t tx_posted = 0;  // payload bytes ever queued
  std::uint64_t tx_done = 0;    // payload bytes ever written
  std::uint64_t tx_queued = 0;  // payload bytes queued, not written
  std::byte tx_hdr[frame_header_size]{};
  std::size_t tx_hdr_left = 0;    // header bytes of the current frame not yet written
  std::size_t tx_frame_left = 0;  // payload bytes of the current frame not yet written
  bool tx_pad = false;            // after abort: the current frame ends in zeros
  std::vector<std::byte> ctrl;    // a control frame to write at the next frame boundary
  std::size_t ctrl_off = 0;

  // Receiving: user buffers posted, and a staging buffer for bytes not yet asked for.
  fifo<in_item> rxq;
  std::uint64_t rx_posted = 0;
  std::uint64_t rx_done = 0;
  std::unique_ptr<std::byte[]> stage;
  std::size_t stage_cap = 0, rd = 0, wr = 0;
  std::size_t rx_frame_left = 0;  // payload bytes of the current data frame not yet delivered
  std::uint64_t abs_rd = 0;       // stream offset of stage[rd]
  std::uint64_t scan_abs = 0;     // stream offset of the next header the look-ahead reads

  std::error_code lost;  // peer_lost or protocol_error once the stream is unusable
  std::string why;       // what the kernel or the parser said when it was lost
  bool hup = false;      // the kernel reported hang-up or error; read to learn more
  bool drained = false;  // lost, and read to its end for an abort frame (last_words)

  bool has_tx() const noexcept {
    return !lost &&
           (tx_hdr_left > 0 || tx_frame_left > 0 || ctrl_off < ctrl.size() || tx_queued > 0);
  }
  bool wants_read() const noexcept { return !lost && (!rxq.empty() || rd == wr); }
};

/// The per-peer sockets of one rank and the loop that drives them.
class engine {
 public:
  struct request {
    int peer = -1;  // -1: complete
    bool is_send = false;
    std::uint64_t end = 0;
  };

  /// Takes the connected sockets: `fds[q]` talks to rank q (`fds[rank]` is empty).
  engine(int rank, int size, std::vector<unique_fd> fds, std::vector<std::string> addresses,
         engine_options opts)
      : rank_(rank),
        size_(size),
        opts_(std::move(opts)),
        conns_(static_cast<std::size_t>(size)),
        spin_(opts_.spin) {
    const std::size_t cap =
        std::max<std::size_t>(opts_.staging_bytes, 4 * (frame_header_size + max_control_frame));
    for (int q = 0; q < size; ++q) {
      auto& c = conns_[q];
      c.peer = q;
      if (q == rank) continue;
      c.fd = std::move(fds[q]);
      if (q < static_cast<int>(addresses.size())) c.address = std::move(addresses[q]);
      c.stage = std::make_unique<std::byte[]>(cap);
      c.stage_cap = cap;
      c.ctrl.reserve(frame_header_size + max_control_frame);
    }
    pfds_.reserve(static_cast<std::size_t>(size));
    pidx_.reserve(static_cast<std::size_t>(size));
  }

  engine(const engine&) = delete;
  engine& operator=(const engine&) = delete;

  /// Closes every connection: unread bytes are discarded first, so that the close is a FIN
  /// (which lets the peer read what was sent) rather than a reset.
  ~engine() {
    for (auto& c : conns_)
      if (c.fd) close_gently(c.fd.get());
  }

  int rank() const noexcept { return rank_; }
  int size() const noexcept { return size_; }
  const std::string& address(int peer) const { return conns_[peer].address; }
  void set_spin(std::chrono::nanoseconds s) noexcept { opts_.spin = spin_ = s; }

  request send(int peer, std::span<const std::byte> bytes) {
    if (bytes.empty()) return {};
    auto& c = conns_[peer];
    c.tx_posted += bytes.size();
    if (!aborted_ && !c.lost) {
      c.txq.push_back({bytes.data(), bytes.size()});
      c.tx_queued += bytes.size();
    }
    return {peer, true, c.tx_posted};
  }

  request recv(int peer, std::span<std::byte> bytes) {
    if (bytes.empty()) return {};
    auto& c = conns_[peer];
    c.rx_posted += bytes.size();
    if (!aborted_) c.rxq.push_back({bytes.data(), bytes.size()});
    return {peer, false, c.rx_posted};
  }

  void wait(request& req, deadline until, std::error_code& ec) {
    ec.clear();
    last_until_ = until;
    if (req.peer < 0) return;
    auto& c = conns_[req.peer];
    const auto spin_end = deadline_after(spin_);
    bool spun = false, blocked = false;
    unsigned rounds = 0;
    for (;;) {
      if (!aborted_) {
        flush_all();
        if (!req.is_send) pump_rx(c);
      }
      if (done(c, req)) {
        req = {};
        adapt_spin(spun, blocked);
        return;
      }
      if (failed(c, ec)) {
        if (!remote_ && !aborted_) {  // the peer's end: did a peer say why?
          last_words();
          ec.clear();
          failed(c, ec);
        }
        return;
      }
      if (c.hup) {  // the kernel said the socket is dead, and what it held did not complete req
        lose(c, errc::peer_lost, "connection reset");
        continue;
      }
      const auto now = clock::now();
      if (now >= until) {
        // What arrived meanwhile still counts (this rank may have been stopped past its
        // deadline): a peer's abort frame, or what completes req.
        if (!aborted_) {
          last_words();
          if (done(c, req)) {
            req = {};
            return;
          }
          if (failed(c, ec)) return;
        }
        ec = errc::timed_out;
        return;
      }
      if (now < spin_end) {
        // The loop's top already tries the awaited socket; a ppoll every few rounds keeps the
        // other connections going without a second syscall per round.
        if (++rounds % 8 == 0 || req.is_send) poll_once(clock::duration::zero());
        if (opts_.yield) ::sched_yield();
        spun = true;
      } else {
        blocked = true;
        poll_once(until - now);
      }
    }
  }

  void abort(const failure& f) noexcept {
    if (aborted_) return;
    aborted_ = true;
    const failure* cause = remote_ ? &*remote_ : &f;
    const int origin = remote_ ? remote_->peer : rank_;
    for (auto& c : conns_) {
      if (!c.fd || c.lost) continue;
      c.txq.clear();
      c.tx_queued = 0;
      c.tx_head_off = 0;
      c.tx_pad = c.tx_frame_left > 0;
      c.rxq.clear();
      c.ctrl.resize(c.ctrl.capacity());  // reserved at construction: no allocation
      c.ctrl.resize(encode_abort(c.ctrl.data(), c.ctrl.size(), origin, *cause));
      c.ctrl_off = 0;
    }
    // The caller's deadline holds: a call that failed before it lingers until then at most,
    // one that timed out only for the grace.
    const auto now = clock::now();
    const auto until = std::min(later(now, opts_.abort_linger),
                                std::max(last_until_, later(now, opts_.abort_grace)));
    for (;;) {
      flush_all();
      bool pending = false;
      for (auto& c : conns_) pending = pending || c.has_tx();
      const auto now = clock::now();
      if (!pending || now >= until) break;
      poll_once(until - now);
    }
  }

  const failure* remote_failure() const noexcept { return remote_ ? &*remote_ : nullptr; }

  /// Why the connection to `peer` failed, or "" while it is healthy.
  const std::string& lost_reason(int peer) const { return conns_[peer].why; }

 private:
  // Spinning pays only while the peer runs on another core. When the scheduler puts both
  // ranks on one core (wake-affine placement on a busy host), the peer cannot answer until this
  // rank blocks, and every spin is lost: halve the spin after each wait that had to block,
  // restore it after one that spinning served, and try it again every 32 waits.
  void adapt_spin(bool spun, bool blocked) noexcept {
    if (blocked)
      spin_ = spin_ / 2 < std::chrono::microseconds(1) ? clock::duration::zero() : spin_ / 2;
    else if (spun)
      spin_ = opts_.spin;
    if (spin_ == clock::duration::zero() && ++probe_ % 32 == 0) spin_ = opts_.spin;
  }

  static bool done(const connection& c, const request& r) noexcept {
    return r.is_send ? c.tx_done >= r.end : c.rx_done >= r.end;
  }

  bool failed(const connection& c, std::error_code& ec) const noexcept {
    if (remote_)
      ec = remote_->code;
    else if (aborted_)
      ec = errc::aborted;
    else if (c.lost)
      ec = c.lost;
    return static_cast<bool>(ec);
  }

  void lose(connection& c, errc e, std::string_view why) {
    if (c.lost) return;
    c.lost = e;
    try {
      c.why = why;
    } catch (...) {
    }
    c.txq.clear();
    c.tx_queued = 0;
    c.ctrl_off = c.ctrl.size();
    if (e == errc::protocol_error && opts_.log)
      opts_.log("rank " + std::to_string(rank_) + ": protocol error from rank " +
                std::to_string(c.peer) + " (" + c.address + "): " + std::string(why));
  }

  void lose_errno(connection& c, int err) {
    lose(c, errc::peer_lost, std::generic_category().message(err));
  }

  // A send failed: the peer reset or closed. Its last words (an abort frame) may still wait
  // on the receiving side; read them before the connection is written off (and the rest of
  // the stream, when a wait fails: last_words).
  void lose_sending(connection& c, int err) {
    if (!aborted_) pump_rx(c);
    lose_errno(c, err);
  }

  // Before a wait fails for a reason of this rank's own: what the peers still have to say. A
  // peer that aborted sent an abort frame saying why; it may wait on another connection than
  // the one that failed, or behind data on a lost one. One look at every connection without
  // blocking (as far as staging goes: the data of live connections is kept), then every lost
  // connection read to its end. Sets remote_ when an abort frame is found.
  void last_words() {
    if (remote_ || aborted_) return;
    poll_once(clock::duration::zero());
    for (auto& c : conns_) {
      if (remote_) return;
      if (!c.fd) continue;
      if (c.hup && !c.lost) pump_rx(c);
      if (c.lost == errc::peer_lost && !c.drained) drain_lost(c);
    }
  }

  // Reads a lost connection to its end, looking for an abort frame past what was parsed: the
  // staged bytes first, then what the kernel holds. Data payloads are skipped (no receive can
  // get them any more; the staged bytes stay for those already posted or posted later).
  void drain_lost(connection& c) {
    c.drained = true;
    std::byte frame[frame_header_size + max_control_frame];
    std::size_t have = 0, need = frame_header_size;
    std::uint64_t skip = 0;  // payload bytes of a data frame still to pass over
    // A whole header or control frame is in `frame`; false once there is nothing more to find.
    const auto parsed = [&]() -> bool {
      const auto h = decode_frame_header(frame);
      if (!h) return false;  // not a stream this engine can follow
      if (need == frame_header_size) {
        if (h->type == frame_type::data) {
          skip = h->length;
          have = 0;
        } else {
          need = frame_header_size + h->length;  // at most max_control_frame: checked
        }
        return true;
      }
      control(c, *h, frame + frame_header_size);
      have = 0;
      need = frame_header_size;
      return !remote_;
    };
    const auto feed = [&](const std::byte* p, std::size_t n) -> bool {
      while (n > 0) {
        if (skip > 0) {
          const std::size_t k = static_cast<std::size_t>(std::min<std::uint64_t>(skip, n));
          skip -= k;
          p += k;
          n -= k;
          continue;
        }
        const std::size_t k = std::min(need - have, n);
        std::memcpy(frame + have, p, k);
        have += k;
        p += k;
        n -= k;
        if (have == need && !parsed()) return false;
      }
      return true;
    };
    // The first frame header not parsed yet: at rd, or past the current data frame and what the
    // look-ahead read beyond it.
    const std::uint64_t staged_end = c.abs_rd + (c.wr - c.rd);
    const std::uint64_t next =
        c.rx_frame_left == 0 ? c.abs_rd : std::max(c.scan_abs, c.abs_rd + c.rx_frame_left);
    if (next < staged_end) {
      if (!feed(c.stage.get() + c.rd + (next - c.abs_rd), staged_end - next)) return;
    } else {
      skip = next - staged_end;
    }
    std::byte sink[65536];
    std::uint64_t budget = std::uint64_t{256} << 20;  // more than a kernel holds for a socket
    while (!remote_ && budget > 0) {
      const bool skipping = skip > 0;
      const std::size_t want =
          skipping ? static_cast<std::size_t>(std::min<std::uint64_t>(skip, sizeof sink))
                   : need - have;
      const ssize_t n = ::recv(c.fd.get(), skipping ? sink : frame + have, want, MSG_DONTWAIT);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return;  // the end, an error, or nothing more for now
      budget -= std::min<std::uint64_t>(budget, static_cast<std::uint64_t>(n));
      if (skipping) {
        skip -= static_cast<std::uint64_t>(n);
      } else {
        have += static_cast<std::size_t>(n);
        if (have == need && !parsed()) return;
      }
    }
  }

  void flush_all() {
    for (auto& c : conns_)
      if (c.has_tx()) flush(c);
  }

  // Writes what is queued on `c` until the kernel takes no more.
  void flush(connection& c) {
    static constexpr std::byte zeros[4096]{};
    constexpr int max_iov = 64;
    while (c.has_tx()) {
      if (c.tx_hdr_left == 0 && c.tx_frame_left == 0) {
        if (c.ctrl_off < c.ctrl.size()) {
          const ssize_t n = ::send(c.fd.get(), c.ctrl.data() + c.ctrl_off,
                                   c.ctrl.size() - c.ctrl_off, MSG_NOSIGNAL | MSG_DONTWAIT);
          if (n < 0) {
            if (errno == EINTR) continue;
            if (errno != EAGAIN && errno != EWOULDBLOCK) lose_sending(c, errno);
            return;
          }
          c.ctrl_off += static_cast<std::size_t>(n);
          continue;
        }
        const auto len =
            static_cast<std::uint32_t>(std::min<std::uint64_t>(max_data_frame, c.tx_queued));
        encode_frame_header(c.tx_hdr, frame_type::data, len);
        c.tx_hdr_left = frame_header_size;
        c.tx_frame_left = len;
      }
      iovec iov[max_iov];
      int k = 0;
      if (c.tx_hdr_left > 0)
        iov[k++] = {c.tx_hdr + frame_header_size - c.tx_hdr_left, c.tx_hdr_left};
      std::size_t want = c.tx_frame_left;
      if (c.tx_pad) {
        while (want > 0 && k < max_iov) {
          const std::size_t n = std::min(want, sizeof zeros);
          iov[k++] = {const_cast<std::byte*>(zeros), n};
          want -= n;
        }
      } else {
        std::size_t off = c.tx_head_off;
        for (std::size_t i = 0; i < c.txq.size() && want > 0 && k < max_iov; ++i) {
          const auto& item = c.txq[i];
          const std::size_t n = std::min(item.size - off, want);
          iov[k++] = {const_cast<std::byte*>(item.data + off), n};
          want -= n;
          off = 0;
        }
      }
      msghdr msg{};
      msg.msg_iov = iov;
      msg.msg_iovlen = static_cast<std::size_t>(k);
      const ssize_t n = ::sendmsg(c.fd.get(), &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (n < 0) {
        if (errno == EINTR) continue;
        if (errno != EAGAIN && errno != EWOULDBLOCK) lose_sending(c, errno);
        return;
      }
      advance_tx(c, static_cast<std::size_t>(n));
    }
  }

  static void advance_tx(connection& c, std::size_t n) noexcept {
    const std::size_t h = std::min(n, c.tx_hdr_left);
    c.tx_hdr_left -= h;
    n -= h;
    c.tx_frame_left -= n;
    if (c.tx_pad) {
      if (c.tx_frame_left == 0) c.tx_pad = false;
      return;
    }
    c.tx_done += n;
    c.tx_queued -= n;
    while (n > 0) {
      auto& item = c.txq.front();
      const std::size_t take = std::min(n, item.size - c.tx_head_off);
      c.tx_head_off += take;
      n -= take;
      if (c.tx_head_off == item.size) {
        c.txq.pop_front();
        c.tx_head_off = 0;
      }
    }
  }

  // Reads what `c` has for us: straight into the posted receive while one waits in the middle
  // of a data frame, else into staging; then hands staged bytes to posted receives.
  void pump_rx(connection& c) {
    constexpr std::size_t tail = 4096;  // read past a direct receive: the next header and more
    for (;;) {
      consume(c);  // staged bytes still count after the stream ended
      if (c.lost) return;
      if (c.rd == c.wr) c.rd = c.wr = 0;
      iovec iov[2];
      int k = 0;
      const bool direct = c.rd == c.wr && c.rx_frame_left > 0 && !c.rxq.empty();
      if (direct) {
        auto& item = c.rxq.front();
        iov[k++] = {item.data, std::min(item.size, c.rx_frame_left)};
        iov[k++] = {c.stage.get() + c.wr, std::min(tail, c.stage_cap - c.wr)};
      } else {
        // Bytes nobody asked for stay in the kernel, except one read to watch for an abort
        // frame or the end of the stream while staging is empty.
        if (c.rxq.empty() && c.rd != c.wr) return;
        if (c.wr == c.stage_cap && c.rd > 0) {
          std::memmove(c.stage.get(), c.stage.get() + c.rd, c.wr - c.rd);
          c.wr -= c.rd;
          c.rd = 0;
        }
        if (c.wr == c.stage_cap) return;
        // A small read: enough for a header and a small message; bulk payload then goes
        // straight to its receive instead of through here.
        iov[k++] = {c.stage.get() + c.wr, std::min(c.stage_cap - c.wr, tail + frame_header_size)};
      }
      msghdr msg{};
      msg.msg_iov = iov;
      msg.msg_iovlen = static_cast<std::size_t>(k);
      const ssize_t n = ::recvmsg(c.fd.get(), &msg, MSG_DONTWAIT);
      if (n < 0) {
        if (errno == EINTR) continue;
        if (errno != EAGAIN && errno != EWOULDBLOCK) lose_errno(c, errno);
        return;
      }
      if (n == 0) {
        lose(c, errc::peer_lost, "connection closed");
        return;
      }
      std::size_t got = static_cast<std::size_t>(n);
      if (direct) {
        const std::size_t d = std::min(got, iov[0].iov_len);
        deliver(c, d);
        got -= d;
      }
      c.wr += got;
    }
  }

  // `n` bytes of the current data frame reached the front receive (directly or from staging).
  static void deliver(connection& c, std::size_t n) noexcept {
    auto& item = c.rxq.front();
    item.data += n;
    item.size -= n;
    if (item.size == 0) c.rxq.pop_front();
    c.rx_done += n;
    c.rx_frame_left -= n;
    c.abs_rd += n;
  }

  // Hands staged bytes to posted receives and handles control frames, as far as they go.
  void consume(connection& c) {
    while (c.rd < c.wr) {
      std::byte* p = c.stage.get() + c.rd;
      const std::size_t avail = c.wr - c.rd;
      if (c.rx_frame_left == 0) {
        if (avail < frame_header_size) break;
        const auto h = decode_frame_header(p);
        if (!h) return lose(c, errc::protocol_error, "malformed frame header");
        if (h->type == frame_type::data) {
          c.rx_frame_left = h->length;
          c.rd += frame_header_size;
          c.abs_rd += frame_header_size;
          continue;
        }
        if (avail < frame_header_size + h->length) break;
        control(c, *h, p + frame_header_size);
        if (c.lost) return;
        c.rd += frame_header_size + h->length;
        c.abs_rd += frame_header_size + h->length;
        continue;
      }
      if (c.rxq.empty()) break;
      const std::size_t n = std::min({avail, c.rx_frame_left, c.rxq.front().size});
      std::memcpy(c.rxq.front().data, p, n);
      c.rd += n;
      deliver(c, n);
    }
    if (c.rd < c.wr && c.rxq.empty() && c.rx_frame_left > 0) look_ahead(c);
  }

  // Reads the headers of staged frames past the data nobody has asked for yet, so that an
  // abort frame behind them is seen now; each byte is looked at once.
  void look_ahead(connection& c) {
    const std::uint64_t end = c.abs_rd + (c.wr - c.rd);
    std::uint64_t pos = std::max(c.scan_abs, c.abs_rd + c.rx_frame_left);
    while (pos + frame_header_size <= end) {
      const std::byte* p = c.stage.get() + c.rd + (pos - c.abs_rd);
      const auto h = decode_frame_header(p);
      if (!h) return lose(c, errc::protocol_error, "malformed frame header");
      if (h->type != frame_type::data) {
        if (pos + frame_header_size + h->length > end) break;
        control(c, *h, p + frame_header_size);
        if (c.lost) return;
      }
      pos += frame_header_size + h->length;
    }
    c.scan_abs = pos;
  }

  void control(connection& c, const frame_header& h, const std::byte* payload) {
    auto f = decode_abort(payload, h.length, size_);
    if (!f) return lose(c, errc::protocol_error, "malformed abort frame");
    if (!remote_ && f->peer != rank_) remote_ = std::move(*f);
  }

  // Waits up to `timeout` for any connection to be ready, and progresses the ready ones.
  void poll_once(clock::duration timeout) {
    pfds_.clear();
    pidx_.clear();
    for (auto& c : conns_) {
      if (!c.fd || c.lost || c.hup) continue;
      short ev = 0;
      if (c.has_tx()) ev |= POLLOUT;
      if (!aborted_ && c.wants_read()) ev |= POLLIN;
      if (ev == 0) continue;
      pfds_.push_back({c.fd.get(), ev, 0});
      pidx_.push_back(c.peer);
    }
    if (pfds_.empty()) {
      // Nothing can make progress on a socket; sleep briefly rather than spin.
      timeout = std::min<clock::duration>(timeout, std::chrono::milliseconds(10));
    }
    const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(timeout).count();
    timespec ts{static_cast<time_t>(ns / 1'000'000'000), static_cast<long>(ns % 1'000'000'000)};
    const int ready = ::ppoll(pfds_.data(), pfds_.size(), &ts, nullptr);
    if (ready <= 0) return;
    for (std::size_t i = 0; i < pfds_.size(); ++i) {
      const short re = pfds_[i].revents;
      if (re == 0) continue;
      auto& c = conns_[pidx_[i]];
      if (re & POLLOUT) flush(c);
      if (re & (POLLIN | POLLHUP | POLLERR)) pump_rx(c);
      if ((re & (POLLHUP | POLLERR)) && !c.lost) c.hup = true;
    }
  }

  int rank_, size_;
  engine_options opts_;
  std::vector<connection> conns_;
  bool aborted_ = false;
  deadline last_until_ = deadline::max();  // of the last wait: the call's, while one runs
  std::optional<failure> remote_;
  clock::duration spin_;  // the current spin, at most opts_.spin
  unsigned probe_ = 0;
  std::vector<pollfd> pfds_;
  std::vector<int> pidx_;
};

}  // namespace cohort::detail::tcp
