/// @file
/// Building the full mesh of the TCP transport with Asio: listen on the chosen address, publish
/// it in the store, wait for every rank's, then connect to each lower rank and accept each
/// higher one, with a handshake on every connection. Everything runs on one io_context on the
/// calling thread, under one deadline for the whole and one per handshake; connects retry with
/// backoff. The sockets leave as plain descriptors for the engine (tcp_engine.hpp).
///
/// Why a full mesh at setup rather than lazy connections: any pair may talk (schedules other
/// than the ring need it), an abort reaches every rank in one hop, a wrong token or an
/// unreachable rank shows at setup instead of in the middle of a collective, and the data path
/// never has to accept or connect. The cost, P-1 sockets per rank, is what Gloo's full mesh
/// pays too; it is small at data-parallel scales.
#pragma once

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/awaitable.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/read.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/write.hpp>

#include <algorithm>
#include <array>
#include <charconv>
#include <chrono>
#include <cstring>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <tuple>
#include <utility>
#include <vector>

#include <cohort/core/error.hpp>
#include <cohort/core/options.hpp>
#include <cohort/detail/net/socket.hpp>
#include <cohort/rendezvous/detail/tcp_store_protocol.hpp>
#include <cohort/rendezvous/store.hpp>
#include <cohort/transport/detail/tcp_net.hpp>
#include <cohort/transport/detail/tcp_wire.hpp>

// g++ 12 with sanitizers flags Asio's coroutine frame allocator as a new/delete mismatch
// (a false positive: awaitable_frame_base pairs its own operator new and delete).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
#endif

namespace cohort::detail::tcp {

namespace asio = boost::asio;
using asio::ip::tcp;

/// What the mesh needs to know.
struct mesh_config {
  int rank = 0, size = 1;
  std::string job_id, token, prefix;  // prefix: of the store keys
  interface_address local;
  deadline until;
  std::chrono::milliseconds handshake_timeout{5000};
  int send_buffer = 0, recv_buffer = 0;
  std::function<void(std::string_view)> log;
};

/// The mesh's outcome: a socket per peer, or what went wrong. On failure, `fds` holds every
/// socket whose peer may take it for handshaken (its handshake done, or this rank's half of it
/// sent), so that the caller can tell those peers why this rank leaves.
struct mesh {
  std::vector<net::unique_fd> fds;
  std::vector<std::string> addresses;
  failure error;  // error.code is clear on success
};

inline tcp::endpoint to_asio(const net::endpoint& e) {
  tcp::endpoint out;
  std::memcpy(out.data(), &e.addr, e.len);
  out.resize(e.len);
  return out;
}

inline std::string text_of(const tcp::endpoint& e) {
  return (e.address().is_v6() ? "[" + e.address().to_string() + "]" : e.address().to_string()) +
         ":" + std::to_string(e.port());
}

/// The state the coroutines share while the mesh is built.
class mesh_builder {
 public:
  mesh_builder(const mesh_config& cfg, store& s) : cfg_(cfg), store_(s), acceptor_(ioc_) {
    result_.fds.resize(static_cast<std::size_t>(cfg.size));
    result_.addresses.resize(static_cast<std::size_t>(cfg.size));
    in_handshake_.resize(static_cast<std::size_t>(cfg.size));
  }

  mesh run() {
    mesh m = build();
    if (m.error.code) leave(m);
    return m;
  }

 private:
  mesh build() {
    started_ = std::chrono::system_clock::now();
    boost::system::error_code bec;
    if (!listen(bec)) return std::move(result_);
    const std::string prefix = cfg_.prefix + "addr/";
    const tcp::endpoint mine = acceptor_.local_endpoint(bec);
    std::error_code ec;
    const std::string host = host_of(cfg_.local.address, cfg_.local.name);
    store_.set(prefix + std::to_string(cfg_.rank), format_address({host, mine.port(), cfg_.size}),
               ec);
    if (ec)
      return fail(ec, -1, "rendezvous: cannot publish this rank's address: " + store_.last_error());
    // Waits in slices; between them, looks for a disagreement on the job's size.
    std::vector<int> missing;
    for (;;) {
      const deadline slice = std::min(cfg_.until, deadline_after(disagreement_poll));
      missing = wait_for_ranks(store_, prefix, cfg_.size, slice, ec);
      if (ec != errc::timed_out || clock::now() >= cfg_.until) break;
      if (told() || refused(missing) || gave_up(missing)) return std::move(result_);
      if (cfg_.rank != 0) {
        const auto v = poll(prefix + "0");
        const auto a = v ? parse_address(*v) : std::nullopt;
        if (a && a->size > 0 && a->size != cfg_.size) return disagree(0, a->size);
      }
    }
    if (ec == errc::timed_out && !missing.empty()) {
      // Said at the store, so that the ranks still waiting (whose deadlines may come a little
      // later) learn the same cause now, even when the store goes with this rank.
      std::error_code ig;
      store_.set(gave_up_key(), std::to_string(cfg_.rank), ig);
      return fail(ec, missing.front(),
                  "rendezvous: " + describe_ranks(missing) + " never arrived (" +
                      std::to_string(missing.size()) + " of " + std::to_string(cfg_.size) +
                      " ranks missing at the deadline)");
    }
    if (ec) return fail(ec, -1, "rendezvous: " + store_.last_error());
    std::vector<tcp::endpoint> peers(static_cast<std::size_t>(cfg_.rank));
    for (int q = 0; q < cfg_.rank; ++q) {
      const auto v = store_.try_get(prefix + std::to_string(q), ec);
      if (ec || !v)
        return fail(ec ? ec : make_error_code(errc::protocol_error), q,
                    "rendezvous: cannot read the address of rank " + std::to_string(q));
      const auto a = parse_address(*v);
      net::endpoint e;
      if (!a || !net::numeric_endpoint(a->host, a->port, e))
        return fail(make_error_code(errc::protocol_error), q,
                    "rendezvous: rank " + std::to_string(q) + " published a malformed address \"" +
                        *v + "\"");
      peers[q] = to_asio(e);
      if (a->size > 0 && a->size != cfg_.size) return disagree(q, a->size);
    }
    if (told()) return std::move(result_);
    connecting_ = true;
    asio::co_spawn(ioc_, watch_disagreement(), asio::detached);
    incoming_ = cfg_.size - 1 - cfg_.rank;
    if (incoming_ > 0)
      asio::co_spawn(ioc_, accept_loop(), asio::detached);
    else
      acceptor_.close(bec);
    for (int q = 0; q < cfg_.rank; ++q)
      asio::co_spawn(ioc_, connect_to(q, peers[q]), asio::detached);
    ioc_.run_until(cfg_.until);
    if (result_.error.code) return failed_mesh();
    std::vector<int> absent;
    for (int q = 0; q < cfg_.size; ++q)
      if (q != cfg_.rank && !result_.fds[q]) absent.push_back(q);
    if (!absent.empty()) {
      note(make_error_code(errc::timed_out), absent.front(),
           "rendezvous: no handshaken connection with " + describe_ranks(absent) +
               " by the deadline" +
               (last_problem_.empty() ? "" : " (last problem: " + last_problem_ + ")"));
      return failed_mesh();
    }
    return std::move(result_);
  }

  // Records the first failure and stops; `run` returns it.
  mesh fail(std::error_code ec, int peer, std::string what) {
    note(ec, peer, std::move(what));
    return std::move(result_);
  }
  void note(std::error_code ec, int peer, std::string what) {
    if (!result_.error.code) result_.error = {ec, peer, std::move(what)};
    ioc_.stop();
  }

  // The failed mesh once the connections were under way: a handshake stopped half-way may be
  // done for the peer (it adopts the socket once it has this rank's hello, or sent its own),
  // which then runs an engine on it and must hear why this rank left, not find it gone.
  mesh failed_mesh() {
    for (int q = 0; q < cfg_.size; ++q) {
      if (!in_handshake_[q] || result_.fds[q]) continue;
      boost::system::error_code ig;
      const int fd = in_handshake_[q]->release(ig);
      if (fd >= 0) result_.fds[q].reset(fd);
    }
    return std::move(result_);
  }

  // The socket of a handshake with `q` whose half from this rank may have reached it, from
  // just before this rank writes its hello until the handshake ends (the first of two that
  // claim the same rank: the second is refused).
  struct handshake_mark {
    std::vector<tcp::socket*>& marks;
    int q;
    bool mine;
    handshake_mark(std::vector<tcp::socket*>& m, int peer, tcp::socket& s)
        : marks(m), q(peer), mine(!m[peer]) {
      if (mine) marks[q] = &s;
    }
    ~handshake_mark() {
      if (mine) marks[q] = nullptr;
    }
    handshake_mark(const handshake_mark&) = delete;
    handshake_mark& operator=(const handshake_mark&) = delete;
  };

  // How often a waiting rank looks for a rank that says the job has another size.
  static constexpr std::chrono::milliseconds disagreement_poll{100};

  std::string disagreement_key() const { return cfg_.prefix + "disagree"; }

  // Rank `q` says the job has `theirs` ranks: says so at the store, for every rank to see, and
  // fails.
  mesh disagree(int q, int theirs) {
    std::error_code ig;
    store_.set(disagreement_key(), std::to_string(cfg_.rank) + " " + std::to_string(cfg_.size),
               ig);
    return fail(make_error_code(errc::invalid_argument), q,
                "rendezvous: rank " + std::to_string(q) + " says the job has " +
                    std::to_string(theirs) + " ranks, this rank says " +
                    std::to_string(cfg_.size));
  }

  std::string gave_up_key() const { return cfg_.prefix + "gaveup"; }

  // How long a look at the store may take once the connections are being made. The
  // coroutines share one thread: a look that waited out the store's own timeout (a store that
  // left: rank 0 stops hosting it once every rank handshook with it) would hold every
  // handshake and watchdog.
  static constexpr std::chrono::milliseconds store_poll_bound{1000};

  // The value of `key` now, or nullopt when it is absent or the store did not answer. While
  // the connections are made, a look is bounded by `store_poll_bound`, and after a failed one
  // the store is not asked again: it went away, and then every rank agrees on the job already
  // (each handshook with rank 0), or it is unreachable, and the peers' deadlines say the rest.
  std::optional<std::string> poll(const std::string& key) {
    if (store_gone_) return std::nullopt;
    std::error_code ec;
    auto v = store_.try_get(
        key, connecting_ ? std::min(cfg_.until, deadline_after(store_poll_bound)) : cfg_.until, ec);
    if (ec && connecting_) store_gone_ = true;
    return v;
  }

  // True (and failed, timed_out naming the first rank still missing) when another rank gave up
  // waiting for the missing ranks at its deadline.
  bool gave_up(const std::vector<int>& missing) {
    const auto v = poll(gave_up_key());
    if (!v || missing.empty()) return false;
    note(make_error_code(errc::timed_out), missing.front(),
         "rendezvous: " + describe_ranks(missing) + " never arrived (" +
             std::to_string(missing.size()) + " of " + std::to_string(cfg_.size) +
             " ranks missing when rank " + *v + " gave up waiting at its deadline)");
    return true;
  }

  // True (and failed) when another rank said at the store that it disagrees on the size.
  bool told() {
    const auto v = poll(disagreement_key());
    if (!v) return false;
    int r = -1, n = 0;
    const auto space = v->find(' ');
    if (space == std::string::npos) return false;
    std::from_chars(v->data(), v->data() + space, r);
    std::from_chars(v->data() + space + 1, v->data() + v->size(), n);
    if (r < 0 || r == cfg_.rank || n <= 0) return false;
    note(make_error_code(errc::invalid_argument), r < cfg_.size ? r : -1,
         "rendezvous: rank " + std::to_string(r) + " says the job has " + std::to_string(n) +
             " ranks, this rank says " + std::to_string(cfg_.size));
    return true;
  }

  // True (and failed) when the store refused a process of this user for a wrong token since
  // this rank started: most likely one of the ranks still `missing`, started with another
  // COHORT_TOKEN (the store notes only its own user's processes: strangers cannot stop a job).
  bool refused(const std::vector<int>& missing) {
    const auto v = poll(std::string(store_wire::refusal_key));
    if (!v || missing.empty()) return false;
    long long ns = 0;
    std::from_chars(v->data(), v->data() + v->size(), ns);
    const auto at = std::chrono::system_clock::time_point(std::chrono::nanoseconds(ns));
    if (at + std::chrono::seconds(1) < started_) return false;  // an earlier job's
    const auto space = v->find(' ');
    const std::string from = space == std::string::npos ? std::string("?") : v->substr(space + 1);
    note(make_error_code(errc::invalid_argument), missing.size() == 1 ? missing.front() : -1,
         "rendezvous: " +
             (missing.size() == 1 ? "rank " + std::to_string(missing.front()) + " was refused"
                                  : describe_ranks(missing) + " never arrived, and a rank was "
                                                              "refused") +
             ": wrong token (the store refused a process of this user at " + from +
             " that does not know this job's token: is COHORT_TOKEN the same on every rank?)");
    return true;
  }

  // Looks for a disagreement while the mesh forms: a rank that waits for a peer that failed on
  // it learns why within `disagreement_poll`.
  asio::awaitable<void> watch_disagreement() {
    asio::steady_timer t(ioc_);
    for (;;) {
      t.expires_after(disagreement_poll);
      auto [e] = co_await t.async_wait(asio::as_tuple(asio::use_awaitable));
      if (e || told() || store_gone_) co_return;
    }
  }

  void log(const std::string& s) const {
    if (cfg_.log) cfg_.log("rank " + std::to_string(cfg_.rank) + ": " + s);
  }

  template <class Socket>
  void set_buffers(Socket& s) {
    boost::system::error_code ig;
    if (cfg_.send_buffer > 0)
      s.set_option(asio::socket_base::send_buffer_size(cfg_.send_buffer), ig);
    if (cfg_.recv_buffer > 0)
      s.set_option(asio::socket_base::receive_buffer_size(cfg_.recv_buffer), ig);
  }

  bool listen(boost::system::error_code& bec) {
    const tcp::endpoint at = to_asio(cfg_.local.address);
    acceptor_.open(at.protocol(), bec);
    if (!bec) acceptor_.set_option(tcp::acceptor::reuse_address(true), bec);
    if (!bec) set_buffers(acceptor_);  // accepted sockets inherit them (and the window scale)
    if (!bec) acceptor_.bind(at, bec);
    if (!bec) acceptor_.listen(std::max(cfg_.size, 128), bec);
    if (bec) {
      note(std::error_code(bec.value(), std::generic_category()), -1,
           "rendezvous: cannot listen on " + text_of(at) + " (interface " + cfg_.local.name +
               "): " + bec.message());
      return false;
    }
    return true;
  }

  // Hands a handshaken socket to the result.
  void adopt(int q, tcp::socket& s) {
    boost::system::error_code ig;
    s.set_option(tcp::no_delay(true), ig);
    const auto remote = s.remote_endpoint(ig);
    const int fd = s.release(ig);
    ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
    result_.fds[q].reset(fd);
    result_.addresses[q] = text_of(remote);
    // Every peer is here: stop now, even if a stranger's handshake is still pending.
    int have = 0;
    for (const auto& f : result_.fds) have += static_cast<bool>(f);
    if (have == cfg_.size - 1) ioc_.stop();
  }

  asio::awaitable<void> accept_loop() {
    while (incoming_ > 0) {
      auto [e, s] = co_await acceptor_.async_accept(asio::as_tuple(asio::use_awaitable));
      if (e == asio::error::operation_aborted || !acceptor_.is_open()) co_return;
      if (e) continue;
      asio::co_spawn(ioc_, handshake_in(std::move(s)), asio::detached);
    }
  }

  // Closes `s` at `t` unless cancelled first: the deadline of an Asio operation.
  static void watchdog(asio::steady_timer& w, tcp::socket& s, deadline t) {
    w.expires_at(t);
    w.async_wait([&s](boost::system::error_code e) {
      boost::system::error_code ig;
      if (!e) s.close(ig);
    });
  }

  asio::awaitable<void> handshake_in(tcp::socket accepted) {
    boost::system::error_code ig;
    const auto from = accepted.remote_endpoint(ig);
    incoming h{std::move(accepted)};
    tcp::socket& s = h.s;
    asio::steady_timer w(ioc_);
    watchdog(w, s, std::min(cfg_.until, deadline_after(cfg_.handshake_timeout)));
    const boost::system::error_code e = co_await read_hello(h);
    const std::array<std::byte, hello_size>& in = h.in;
    if (e) {
      reject(from, e == asio::error::operation_aborted || e == asio::error::bad_descriptor
                       ? "no hello within the handshake timeout"
                       : "closed during the handshake: " + e.message());
      co_return;
    }
    hello peer;
    std::string why = check_hello(in, cfg_.job_id, cfg_.size, cfg_.token, peer);
    if (why.empty() && peer.rank <= cfg_.rank)
      why = "rank " + std::to_string(peer.rank) + " should not connect to rank " +
            std::to_string(cfg_.rank);
    if (why.empty() && result_.fds[peer.rank])
      why = "rank " + std::to_string(peer.rank) + " is connected already";
    if (!why.empty()) {
      reject(from, why);
      // Say so before closing: the connector then tells a refusal from a crash.
      const auto no = encode_refusal();
      co_await asio::async_write(s, asio::buffer(no), asio::as_tuple(asio::use_awaitable));
      co_return;
    }
    const auto out = encode_hello({cfg_.rank, cfg_.size, cfg_.job_id, cfg_.token});
    handshake_mark mark(in_handshake_, peer.rank, s);
    auto [we, wn] =
        co_await asio::async_write(s, asio::buffer(out), asio::as_tuple(asio::use_awaitable));
    w.cancel();
    if (we || !s.is_open() || result_.fds[peer.rank]) {
      reject(from, "lost during the handshake");
      co_return;
    }
    adopt(peer.rank, s);
    if (--incoming_ == 0) acceptor_.close(ig);
  }

  // A hello being read by `handshake_in`. Listed in `reading_` until it is whole, so that a rank
  // that gives up can read the rest and answer it (see `leave`).
  struct incoming {
    tcp::socket s;
    std::array<std::byte, hello_size> in{};
    std::size_t got = 0;

    // Takes what the socket holds of the rest of the hello, without blocking (the socket is
    // non-blocking); `e` is `would_block` when nothing more has come yet.
    void read_available(boost::system::error_code& e) {
      got += s.read_some(asio::buffer(in.data() + got, hello_size - got), e);
    }
  };

  // Reads the rest of `h`'s hello: a wait for readability, then a read that does not block, so
  // that `h.got` counts every byte taken off the socket even when the context stops with this
  // coroutine suspended (an Asio read may have taken bytes whose completion never runs).
  asio::awaitable<boost::system::error_code> read_hello(incoming& h) {
    struct listed {
      std::vector<incoming*>& all;
      incoming* h;
      ~listed() { std::erase(all, h); }
    } entry{reading_, &h};
    reading_.push_back(&h);
    boost::system::error_code e;
    h.s.non_blocking(true, e);
    while (!e && h.got < hello_size) {
      std::tie(e) =
          co_await h.s.async_wait(tcp::socket::wait_read, asio::as_tuple(asio::use_awaitable));
      if (e) break;
      h.read_available(e);
      if (e == asio::error::would_block) e = {};
    }
    co_return e;
  }

  // How long a rank that gives up waits for the rest of the hellos it answers.
  static constexpr std::chrono::milliseconds leave_bound{200};

  // The mesh failed: answers every hello that waits for an answer, those being read and those of
  // connections still in the listen queue, with why this rank leaves (`encode_leaving`). A
  // socket closed with its hello unread sends a reset, and the peer would take this rank for
  // dead, though it left because of another rank. A hello that is not the job's gets no answer
  // (no refusal either: it may come from a rank of another job that found this rank's port where
  // its own dead peer's was, and a refusal would tell it a configuration is wrong); its socket
  // is closed with nothing unread. Waits for the rest of a hello for up to `leave_bound`, never
  // past the deadline.
  void leave(const mesh& m) {
    boost::system::error_code ig;
    std::vector<incoming*> open;
    for (incoming* h : reading_)
      if (h->s.is_open()) open.push_back(h);
    std::vector<std::unique_ptr<incoming>> queued;
    if (acceptor_.is_open()) {
      acceptor_.non_blocking(true, ig);
      for (int i = 0; !ig && i < cfg_.size + 64; ++i) {
        auto h = std::make_unique<incoming>(incoming{tcp::socket(ioc_)});
        acceptor_.accept(h->s, ig);
        if (ig) break;
        h->s.non_blocking(true, ig);
        open.push_back(h.get());
        queued.push_back(std::move(h));
      }
      acceptor_.close(ig);
    }
    const deadline until = std::min(cfg_.until, deadline_after(leave_bound));
    for (int round = 0; round < 1000; ++round) {
      std::vector<pollfd> fds;
      std::vector<incoming*> who;
      for (incoming* h : open)
        if (h->s.is_open() && h->got < hello_size) {
          fds.push_back({h->s.native_handle(), POLLIN, 0});
          who.push_back(h);
        }
      if (fds.empty()) break;
      if (::poll(fds.data(), fds.size(), net::poll_ms(until)) <= 0) break;
      for (std::size_t i = 0; i < fds.size(); ++i) {
        if (fds[i].revents == 0) continue;
        incoming& h = *who[i];
        h.read_available(ig);
        if (ig && ig != asio::error::would_block) h.s.close(ig);
      }
    }
    const failure why{m.error.code, cfg_.rank, m.error.what};
    for (incoming* h : open) {
      if (!h->s.is_open() || h->got < hello_size) continue;
      hello peer;
      const bool ours = check_hello(h->in, cfg_.job_id, cfg_.size, cfg_.token, peer).empty() &&
                        peer.rank > cfg_.rank && !m.fds[peer.rank];
      if (ours) {
        const auto answer = encode_leaving(cfg_.rank, why);
        (void)::send(h->s.native_handle(), answer.data(), answer.size(),
                     MSG_DONTWAIT | MSG_NOSIGNAL);
        log("answered the hello of rank " + std::to_string(peer.rank) + " with why it leaves");
      }
      h->s.shutdown(tcp::socket::shutdown_send, ig);  // nothing unread: closing is a FIN
    }
  }

  void reject(const tcp::endpoint& from, const std::string& why) {
    last_problem_ = "refused " + text_of(from) + ": " + why;
    log("refused a connection from " + text_of(from) + ": " + why);
  }

  asio::awaitable<void> connect_to(int q, tcp::endpoint at) {
    auto backoff = std::chrono::milliseconds(5);
    for (;;) {
      tcp::socket s(ioc_);
      boost::system::error_code e;
      s.open(at.protocol(), e);
      if (!e) set_buffers(s);
      asio::steady_timer w(ioc_);
      if (!e) {
        watchdog(w, s, std::min(cfg_.until, deadline_after(std::chrono::seconds(5))));
        std::tie(e) = co_await s.async_connect(at, asio::as_tuple(asio::use_awaitable));
        w.cancel();
      }
      if (!e && s.is_open()) {
        co_await handshake_out(q, at, s);
        co_return;
      }
      // Kept at every failed try: the deadline's error says what the last one met.
      last_problem_ = "connecting to rank " + std::to_string(q) + " at " + text_of(at) + ": " +
                      (e ? e.message() : "timed out");
      if (deadline_after(backoff) >= cfg_.until) co_return;
      asio::steady_timer pause(ioc_, backoff);
      co_await pause.async_wait(asio::as_tuple(asio::use_awaitable));
      backoff = std::min(backoff * 2, std::chrono::milliseconds(500));
    }
  }

  asio::awaitable<void> handshake_out(int q, const tcp::endpoint& at, tcp::socket& s) {
    asio::steady_timer w(ioc_);
    watchdog(w, s, std::min(cfg_.until, deadline_after(cfg_.handshake_timeout)));
    const auto out = encode_hello({cfg_.rank, cfg_.size, cfg_.job_id, cfg_.token});
    std::array<std::byte, hello_size> in{};
    handshake_mark mark(in_handshake_, q, s);
    auto [we, wn] =
        co_await asio::async_write(s, asio::buffer(out), asio::as_tuple(asio::use_awaitable));
    boost::system::error_code re = we;
    if (!we)
      std::tie(re, std::ignore) =
          co_await asio::async_read(s, asio::buffer(in), asio::as_tuple(asio::use_awaitable));
    w.cancel();
    const std::string who = "rank " + std::to_string(q) + " at " + text_of(at);
    if (re && !s.is_open()) {  // the watchdog closed it
      note(make_error_code(errc::timed_out), q,
           "rendezvous: " + who +
               " accepted the connection but did not answer the handshake in time (is it "
               "stuck?)");
      co_return;
    }
    if (re) {  // a refusal is answered, so this is a crash, an exit or a reset
      note(make_error_code(errc::peer_lost), q,
           "rendezvous: lost " + who + " during the handshake (" + re.message() +
               "): it exited, crashed or closed the connection");
      co_return;
    }
    if (const auto left = decode_leaving(in, cfg_.size); left && left->peer == q) {
      std::string_view why = left->what;
      if (why.starts_with("rendezvous: ")) why.remove_prefix(12);
      note(left->code, q, "rendezvous: " + who + " gave up on the job: " + std::string(why));
      co_return;
    }
    if (is_refusal(in)) {
      note(make_error_code(errc::protocol_error), q,
           "rendezvous: " + who +
               " refused the handshake; does it have the same COHORT_TOKEN, job id and world "
               "size? (its log says why)");
      co_return;
    }
    hello peer;
    std::string why = check_hello(in, cfg_.job_id, cfg_.size, cfg_.token, peer);
    if (why.empty() && peer.rank != q) why = "it says it is rank " + std::to_string(peer.rank);
    if (!why.empty()) {
      note(make_error_code(errc::protocol_error), q,
           "rendezvous: the handshake with " + who + " failed: " + why);
      co_return;
    }
    adopt(q, s);
  }

  const mesh_config& cfg_;
  store& store_;
  // Per peer, see handshake_mark. Declared before ioc_: the coroutine frames that ioc_ destroys
  // still clear their marks.
  std::vector<tcp::socket*> in_handshake_;
  std::vector<incoming*> reading_;  // see `incoming`
  asio::io_context ioc_{1};
  tcp::acceptor acceptor_;
  mesh result_;
  int incoming_ = 0;
  std::chrono::system_clock::time_point started_{};
  std::string last_problem_;
  bool connecting_ = false;  // the coroutines run: looks at the store are bounded
  bool store_gone_ = false;
};

/// Builds the mesh (see the file comment); on failure `error` says what and names the ranks.
inline mesh connect_mesh(const mesh_config& cfg, store& s) { return mesh_builder(cfg, s).run(); }

}  // namespace cohort::detail::tcp

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif
