/// @file
/// The server role of a parameter server: holds one shard of every key and serves the workers.
#pragma once

#include <algorithm>
#include <chrono>
#include <cohort/core/communicator.hpp>
#include <cohort/core/error.hpp>
#include <cohort/core/options.hpp>
#include <cohort/parameter_server/detail/protocol.hpp>
#include <cohort/parameter_server/options.hpp>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <limits>
#include <memory>
#include <span>
#include <string>
#include <system_error>
#include <thread>
#include <unordered_map>
#include <vector>

namespace cohort::ps {

/// Holds this rank's shard of every key and answers the workers' pushes and pulls until every
/// worker has finished (or, in async and ssp mode, finished or died).
///
/// Each server rank builds one over its communicator, then calls `serve`. It serves whichever
/// worker is ready: a receive for the next request is posted to every worker, and the loop
/// looks at each in turn, then waits on one for a short slice that grows while nothing comes
/// (20 us to 250 us; 300 ms, long enough for the transport to notice a dead process, after
/// 100 ms of silence while requests are held, or after 1 s of silence). Requests from one
/// worker are served in order; a request that must wait (a sync push of a later step, a pull
/// whose step or staleness bound is not met) holds that worker's stream until it can be
/// served. A push's payload is received while the other workers are served (a worker's bytes
/// may move only inside its own calls). Replies are copies of the shard taken when served, so
/// a later update never tears a pull. Memory: the shard, its state, in sync mode a sum, and
/// per worker one receive buffer and up to 8 queued replies.
///
/// Failures: a worker lost in sync mode fails the whole job with `errc::peer_lost` (through
/// the communicator's abort, so every worker's waits fail too) naming that worker; in async
/// and ssp mode it is dropped and the others go on. A request that does not fit this store
/// (unknown key, wrong shard size, a step out of order) is answered with an error status and
/// that worker is no longer served; the shard is not touched. No word from any worker for
/// `idle_timeout` fails with `errc::timed_out`. Replies to a worker that died may stay queued
/// in the transport after `serve` returns: keep the server alive as long as the communicator
/// is used (destroying both is fine).
template <communicator Comm>
class server {
 public:
  using request_type = typename Comm::transport_type::request;

  /// Takes this rank's shard of each of `keys` (zero weights; see `set`). Throws
  /// `cohort::error` (`errc::invalid_argument`, operation "ps::server") where this rank is not
  /// a server of `r`, the roles do not match the communicator, or a key repeats.
  server(Comm& comm, std::span<const key_spec> keys, roles r, server_options o = {})
      : comm_(comm), roles_(r), opts_(std::move(o)) {
    r.check("ps::server");
    if (r.size != comm.size() || !r.is_server(comm.rank()))
      throw error(errc::invalid_argument, "ps::server", comm.rank(),
                  "ps::server: rank " + std::to_string(comm.rank()) + " of " +
                      std::to_string(comm.size()) + " is not a server (ranks 0.." +
                      std::to_string(r.servers - 1) + " serve, of a job of " +
                      std::to_string(r.size) + ")");
    if (opts_.mode.staleness < 0)
      throw error(errc::invalid_argument, "ps::server", -1,
                  "ps::server: the ssp staleness bound must be >= 0");
    if (!opts_.update) opts_.update = sgd_momentum{};
    if (!opts_.compress.empty())
      decoder_ = std::make_unique<push_codec::slot>(opts_.compress.make_slot());
    for (const key_spec& k : keys) {
      const auto range = detail::shard_of(k.count, comm.rank(), r.servers);
      if (!index_.emplace(k.key, shards_.size()).second)
        throw error(errc::invalid_argument, "ps::server", -1,
                    "ps::server: key " + std::to_string(k.key) + " is declared twice");
      shard& s = shards_.emplace_back();
      s.key = k.key;
      s.offset = range.begin;
      s.w.assign(range.size(), 0.0f);
      s.state.assign(range.size(), 0.0f);
      if (opts_.mode.mode == consistency_mode::sync) s.sum.assign(range.size(), 0.0f);
      s.clock.assign(static_cast<std::size_t>(r.workers()), 0);
      max_shard_ = std::max(max_shard_, range.size());
    }
    for (int w = r.servers; w < r.size; ++w) peers_.emplace_back().rank = w;
  }

  /// Sets the shard from the whole tensor `values` of `key` (its slice is taken). Throws
  /// `cohort::error` (`errc::invalid_argument`, operation "ps::server::set") for an unknown
  /// key or a size that is not the key's.
  void set(std::uint64_t key, std::span<const float> values) {
    shard& s = find("ps::server::set", key);
    const auto r = detail::shard_of(values.size(), comm_.rank(), roles_.servers);
    if (r.begin != s.offset || r.size() != s.w.size())
      throw error(errc::invalid_argument, "ps::server::set", -1,
                  "ps::server::set: key " + std::to_string(key) + " got " +
                      std::to_string(values.size()) + " values, which is not its size");
    std::copy(values.begin() + static_cast<std::ptrdiff_t>(r.begin),
              values.begin() + static_cast<std::ptrdiff_t>(r.end), s.w.begin());
  }

  /// This server's shard of `key` (elements [offset, offset + size) of it).
  std::span<const float> weights(std::uint64_t key) { return find("ps::server", key).w; }
  /// Updates applied to this server's shard of `key`.
  std::uint64_t version(std::uint64_t key) { return find("ps::server", key).version; }
  /// Requests served so far.
  std::uint64_t pushes() const noexcept { return pushes_; }
  std::uint64_t pulls() const noexcept { return pulls_; }
  /// Workers dropped because they died (async and ssp) or sent requests that do not fit.
  int dropped() const noexcept { return dropped_; }

  /// Serves until every worker has finished or been dropped. Throws `cohort::error`.
  void serve() {
    std::error_code ec;
    serve(ec);
    if (ec)
      throw error(ec, "ps::serve", fail_peer_, fail_what_.empty() ? ec.message() : fail_what_);
  }

  /// As `serve()`, failing through `ec`.
  void serve(std::error_code& ec) {
    using namespace std::chrono;
    ec.clear();
    if (comm_.poisoned()) {
      ec = errc::poisoned;
      fail_what_ = "ps::serve: " + comm_.last_failure()->what;
      return;
    }
    active_ = 0;
    for (peer& p : peers_)
      if (p.active) {
        ++active_;
        post_header(p);
      }
    const milliseconds idle_limit =
        opts_.idle_timeout.count() > 0 ? opts_.idle_timeout : comm_.timeout();
    auto last_progress = clock::now();
    auto slice = microseconds(20);
    std::size_t turn = 0;
    while (active_ > 0) {
      bool progressed = false;
      for (peer& p : peers_) {
        if (!p.active) continue;
        if (listening(p)) {
          if (!look(p, clock::now(), ec)) continue;  // a deadline passed: one look
          progressed = true;
          if (ec) return;
          if (!p.active || !p.pending) continue;
        }
        if (serve_one(p)) progressed = true;
        if (ec) return;
      }
      const auto now = clock::now();
      if (progressed) {
        last_progress = now;
        slice = microseconds(20);
        continue;
      }
      if (now > later(last_progress, idle_limit)) {
        std::string who;
        for (const peer& p : peers_)
          if (p.active) who += (who.empty() ? "" : ", ") + std::to_string(p.rank);
        fail(errc::timed_out, -1,
             "ps::serve: server rank " + std::to_string(comm_.rank()) +
                 " heard from no worker for " + std::to_string(idle_limit.count()) +
                 " ms (still expecting worker ranks " + who + ")",
             ec);
        return;
      }
      // Nothing came: wait on one idle worker for a slice. A long wait (a probe) lets the
      // transport check that the worker's process lives (shm does so once per wait that lasts
      // its liveness interval); it is made when requests have been held for 100 ms (that
      // worker is what they wait for) or after 1 s of silence, so that workers that compute
      // for a while are not made to wait on it.
      peer* target = nullptr;
      bool held = false;
      for (std::size_t i = 0; i < peers_.size(); ++i) {
        peer& p = peers_[(turn + i) % peers_.size()];
        if (!p.active) continue;
        if (!listening(p))
          held = true;
        else if (target == nullptr)
          target = &p;
      }
      ++turn;
      const auto silent = now - last_progress;
      const bool probe = silent >= milliseconds(held ? 100 : 1000);
      const auto d = probe ? duration_cast<microseconds>(milliseconds(300)) : slice;
      slice = std::min(slice * 2, microseconds(250));
      if (target == nullptr) {
        std::this_thread::sleep_for(microseconds(200));  // every worker waits on a condition
        continue;
      }
      if (look(*target, now + d, ec)) {
        last_progress = clock::now();
        slice = microseconds(20);
      }
      if (ec) return;
    }
    // What is queued to the workers still has to leave before the transport may close.
    for (peer& p : peers_)
      while (!p.out.empty() && !p.gone) {
        std::error_code wec;
        retire_front(p, wec);
        if (wec) break;  // that worker left; the others still get theirs
      }
  }

 private:
  struct shard {
    std::uint64_t key = 0;
    std::size_t offset = 0;
    std::vector<float> w, state, sum;
    std::uint64_t version = 0, pushes = 0;
    int arrived = 0;                   // sync: pushes of the current step so far
    std::vector<std::uint64_t> clock;  // pushes per worker
  };
  struct outgoing {
    detail::reply_header h;
    std::vector<float> data;
    request_type hreq{}, dreq{};
  };
  struct peer {
    int rank = 0;
    bool active = true, pending = false, gone = false;
    bool receiving = false;  // a push's payload is being received
    request_type payload_req{};
    detail::request_header hdr{};
    request_type hdr_req{};
    std::deque<outgoing> out;
    std::vector<float> in;
    detail::aligned_bytes raw;  // a compressed push, before it is decoded
  };

  static constexpr std::size_t max_queued_replies = 8;

  shard& find(const char* what, std::uint64_t key) {
    const auto it = index_.find(key);
    if (it == index_.end())
      throw error(errc::invalid_argument, what, -1,
                  std::string(what) + ": key " + std::to_string(key) +
                      " is not one of the keys this store holds");
    return shards_[it->second];
  }
  std::size_t windex(const peer& p) const noexcept {
    return static_cast<std::size_t>(roles_.worker_index(p.rank));
  }
  deadline call_deadline() const { return deadline_after(comm_.timeout()); }

  // True while this server waits for bytes from `p`: its next request, or a push's payload.
  static bool listening(const peer& p) noexcept { return !p.pending || p.receiving; }

  // Waits until `until` for what `p` is listened to for; true if it came (or `p` failed) and
  // was handled: a request header is marked pending (serve_one serves it), a payload applied.
  bool look(peer& p, deadline until, std::error_code& ec) {
    std::error_code wec;
    comm_.transport().wait(p.receiving ? p.payload_req : p.hdr_req, until, wec);
    if (wec == errc::timed_out) return false;
    if (wec) {
      lost(p, wec, ec);
      return true;
    }
    if (p.receiving) {
      p.receiving = false;
      finish_push(p);
    } else {
      p.pending = true;
    }
    return true;
  }

  void post_header(peer& p) {
    p.pending = false;
    p.receiving = false;
    p.hdr_req = comm_.transport().recv(p.rank, std::as_writable_bytes(std::span(&p.hdr, 1)));
  }

  void fail(errc code, int peer_rank, std::string what, std::error_code& ec) {
    fail_peer_ = peer_rank;
    fail_what_ = what;
    comm_.fail({make_error_code(code), peer_rank, std::move(what)});
    ec = code;
  }

  // A wait on worker `p` failed with `wec`.
  void lost(peer& p, std::error_code wec, std::error_code& ec) {
    auto& t = comm_.transport();
    if (const failure* f = t.remote_failure()) {
      fail_peer_ = f->peer;
      fail_what_ = "ps::serve: rank " + std::to_string(f->peer) + " stopped the job: " + f->what;
      ec = f->code;
      comm_.fail(*f);
      return;
    }
    const std::string who = "worker rank " + std::to_string(p.rank);
    if (wec == errc::peer_lost && opts_.mode.mode != consistency_mode::sync) {
      drop(p, true);
      return;
    }
    if (wec == errc::peer_lost)
      fail(errc::peer_lost, p.rank,
           "ps::serve: " + who + " was lost (it crashed or closed its end); server rank " +
               std::to_string(comm_.rank()) +
               " runs in sync mode, where every step needs every "
               "worker, so the job stops",
           ec);
    else
      fail(static_cast<errc>(wec.value()), p.rank,
           "ps::serve: waiting on " + who + ": " + wec.message(), ec);
  }

  void drop(peer& p, bool gone, bool count = true) {
    p.active = false;
    p.gone = gone;
    --active_;
    if (count) ++dropped_;
  }

  // Answers a request that does not fit this store, then stops serving that worker: its stream
  // can no longer be followed.
  void refuse(peer& p, errc code) {
    send(p, enqueue(p, p.hdr.kind, code, 0));
    drop(p, false);
    if (opts_.mode.mode == consistency_mode::sync)
      for (shard& s : shards_) maybe_apply_sync(s);
  }

  outgoing& enqueue(peer& p, detail::op kind, errc status, std::uint64_t version) {
    while (p.out.size() >= max_queued_replies) {
      std::error_code wec;
      retire_front(p, wec);
      // That worker is gone (its lost stream shows at its next look): the transport may still
      // hold the replies' bytes, so they stay queued.
      if (wec) break;
    }
    outgoing& o = p.out.emplace_back();
    o.h.status = static_cast<std::uint32_t>(status);
    o.h.kind = kind;
    o.h.version = version;
    return o;
  }
  void send(peer& p, outgoing& o) {
    auto& t = comm_.transport();
    o.hreq = t.send(p.rank, std::as_bytes(std::span(&o.h, 1)));
    if (!o.data.empty()) o.dreq = t.send(p.rank, std::as_bytes(std::span(o.data)));
  }
  void retire_front(peer& p, std::error_code& wec) {
    outgoing& o = p.out.front();
    comm_.transport().wait(o.data.empty() ? o.hreq : o.dreq, call_deadline(), wec);
    if (!wec) p.out.pop_front();
  }

  void apply(shard& s, std::span<const float> g) {
    opts_.update(update_context{s.key, s.offset, s.version}, s.w, s.state, g);
    ++s.version;
  }
  void maybe_apply_sync(shard& s) {
    // Every live worker pushed this step (a worker that finished or was refused after its
    // push still counts in the mean).
    if (s.arrived == 0) return;
    for (const peer& p : peers_)
      if (p.active && s.clock[windex(p)] <= s.version) return;
    const float k = 1.0f / static_cast<float>(s.arrived);
    for (float& x : s.sum) x *= k;
    apply(s, s.sum);
    std::fill(s.sum.begin(), s.sum.end(), 0.0f);
    s.arrived = 0;
  }
  std::uint64_t slowest(const shard& s) const {
    std::uint64_t m = std::numeric_limits<std::uint64_t>::max();
    for (const peer& p : peers_)
      if (p.active) m = std::min(m, s.clock[windex(p)]);
    return m;
  }

  // Serves p's received request if it can be served now; true if it was.
  bool serve_one(peer& p) {
    const detail::request_header& h = p.hdr;
    const auto mode = opts_.mode.mode;
    if (h.magic != detail::request_magic ||
        (h.kind != detail::op::push && h.kind != detail::op::pull && h.kind != detail::op::bye)) {
      refuse(p, errc::protocol_error);
      return true;
    }
    if (h.kind == detail::op::bye) {
      drop(p, false, false);
      if (mode == consistency_mode::sync)
        for (shard& s : shards_) maybe_apply_sync(s);
      return true;
    }
    const auto it = index_.find(h.key);
    if (it == index_.end()) {
      refuse(p, errc::invalid_argument);
      return true;
    }
    shard& s = shards_[it->second];
    std::uint64_t& clk = s.clock[windex(p)];
    if (h.offset != s.offset || h.count != s.w.size() || s.w.empty() ||
        (h.kind == detail::op::push && h.step != clk)) {
      refuse(p, errc::mismatch);
      return true;
    }
    if (h.kind == detail::op::pull) {
      const bool ready = mode == consistency_mode::async ||
                         (mode == consistency_mode::sync && s.version >= h.step) ||
                         (mode == consistency_mode::ssp &&
                          h.step <= slowest(s) + static_cast<std::uint64_t>(opts_.mode.staleness));
      if (!ready) return false;
      outgoing& o = enqueue(p, detail::op::pull, errc::ok, s.version);
      o.h.count = s.w.size();
      o.data.assign(s.w.begin(), s.w.end());
      send(p, o);
      ++pulls_;
      post_header(p);
      return true;
    }
    // The payload's length is checked before anything is received.
    const bool compressed = h.compressed != 0;
    if (compressed ? (decoder_ == nullptr || h.bytes > decoder_->max_encoded_bytes(h.count))
                   : h.bytes != h.count * sizeof(float)) {
      refuse(p, errc::mismatch);
      return true;
    }
    if (mode == consistency_mode::sync && h.step > s.version) return false;  // a later step
    // The payload is received while the other workers are served (look, then finish_push).
    p.in.resize(s.w.size());
    const auto raw = compressed ? p.raw.get(h.bytes) : std::as_writable_bytes(std::span(p.in));
    p.payload_req = comm_.transport().recv(p.rank, raw);
    p.receiving = true;
    return true;
  }

  // A push's payload arrived in full: decodes it if it is compressed, applies it, answers.
  void finish_push(peer& p) {
    const detail::request_header& h = p.hdr;
    shard& s = shards_[index_.find(h.key)->second];
    std::uint64_t& clk = s.clock[windex(p)];
    const auto mode = opts_.mode.mode;
    if (h.compressed != 0) {
      const auto raw = p.raw.get(h.bytes);
      if (!decoder_->acceptable(raw, p.in.size())) {
        refuse(p, errc::protocol_error);  // a malformed encoding is never decoded
        return;
      }
      decoder_->decode(raw, p.in);
    }
    ++clk;
    ++pushes_;
    if (mode == consistency_mode::sync) {
      for (std::size_t i = 0; i < p.in.size(); ++i) s.sum[i] += p.in[i];
      ++s.arrived;
      maybe_apply_sync(s);
    } else {
      const float k = 1.0f / static_cast<float>(roles_.workers());
      for (float& x : p.in) x *= k;
      opts_.update(
          update_context{s.key, s.offset, s.pushes / static_cast<std::uint64_t>(roles_.workers())},
          s.w, s.state, p.in);
      ++s.pushes;
      ++s.version;
    }
    outgoing& o = enqueue(p, detail::op::push, errc::ok, s.version);
    send(p, o);
    post_header(p);
  }

  Comm& comm_;
  roles roles_;
  server_options opts_;
  std::vector<shard> shards_;
  std::unordered_map<std::uint64_t, std::size_t> index_;
  std::vector<peer> peers_;
  std::size_t max_shard_ = 0;
  std::unique_ptr<push_codec::slot> decoder_;
  int active_ = 0, dropped_ = 0;
  std::uint64_t pushes_ = 0, pulls_ = 0;
  int fail_peer_ = -1;
  std::string fail_what_;
};

}  // namespace cohort::ps
