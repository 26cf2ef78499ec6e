/// @file
/// The worker role of a parameter server: asynchronous push and pull of sharded tensors.
#pragma once

#include <chrono>
#include <cohort/core/communicator.hpp>
#include <cohort/core/error.hpp>
#include <cohort/core/options.hpp>
#include <cohort/parameter_server/detail/protocol.hpp>
#include <cohort/parameter_server/options.hpp>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <span>
#include <string>
#include <system_error>
#include <unordered_map>
#include <vector>

namespace cohort::ps {

/// A worker's handle on the store: `push` and `pull` start at once and return a ticket;
/// `wait(ticket)` completes one. Any number may be in flight; each server answers a worker's
/// requests in the order they were made, and tickets may be waited on in any order.
///
/// A push sends each server its slice of the gradient (the key's elements split evenly over
/// the servers): `count` f32 in all, plus a 40-byte header per server, and gets a 24-byte
/// acknowledgement from each. A pull sends a header per server and receives each slice
/// straight into the caller's buffer. Buffers must stay valid until their ticket completes.
/// What a pull returns depends on the servers' mode: in sync mode every step this worker
/// pushed for the key is applied; in ssp mode this worker is at most `staleness` pushes ahead
/// of the slowest live worker; in async mode, whatever the shard holds.
///
/// Errors: bad arguments (an unknown key, a buffer of the wrong size, a rank that is a server)
/// throw `cohort::error` with `errc::invalid_argument` before anything is sent. A lost server
/// fails the wait with `errc::peer_lost`, naming the server and the shard it held, and fails
/// the communicator (the job stops: part of every tensor is gone). Not thread-safe; one per
/// communicator, which it uses alone. Each push and pull allocates its bookkeeping (a few
/// dozen bytes per server; a compressed push also its encoding), freed once waited for; the
/// transport may read them until then, so destroy a worker with requests in flight only with
/// its communicator (or after a failure, which aborts them).
template <communicator Comm>
class worker {
 public:
  using request_type = typename Comm::transport_type::request;
  /// Identifies a started push or pull.
  using ticket = std::uint64_t;

  /// A worker over `comm` for `keys` (the same on every rank). Throws `cohort::error`
  /// (`errc::invalid_argument`, operation "ps::worker") where this rank is not a worker of `r`.
  worker(Comm& comm, std::span<const key_spec> keys, roles r, worker_options o = {})
      : comm_(comm), roles_(r), opts_(std::move(o)) {
    r.check("ps::worker");
    if (r.size != comm.size() || !r.is_worker(comm.rank()))
      throw error(errc::invalid_argument, "ps::worker", comm.rank(),
                  "ps::worker: rank " + std::to_string(comm.rank()) +
                      " is not a worker (ranks 0.." + std::to_string(r.servers - 1) + " serve, " +
                      std::to_string(r.servers) + ".." + std::to_string(r.size - 1) +
                      " work); only workers push and pull");
    for (const key_spec& k : keys)
      if (!keys_.emplace(k.key, key_state{k.count, 0}).second)
        throw error(errc::invalid_argument, "ps::worker", -1,
                    "ps::worker: key " + std::to_string(k.key) + " is declared twice");
    if (!opts_.compress.empty())
      for (auto& [key, k] : keys_)
        for (int s = 0; s < r.servers; ++s) k.slots.push_back(opts_.compress.make_slot());
  }

  worker(const worker&) = delete;
  worker& operator=(const worker&) = delete;

  /// Starts pushing `gradient` (all elements of `key`) to the servers.
  ticket push(std::uint64_t key, std::span<const float> gradient) {
    key_state& k = check("ps::push", key, gradient.size());
    op_state& o = start(detail::op::push, key, k);
    auto& t = comm_.transport();
    for (part& p : o.parts) {
      const auto slice = gradient.subspan(p.req.offset, p.req.count);
      std::span<const std::byte> payload = std::as_bytes(slice);
      if (!k.slots.empty()) {  // encoded, with this slice's own codec state
        auto& codec = k.slots[static_cast<std::size_t>(p.server)];
        const auto out = p.encoded.get(codec.max_encoded_bytes(slice.size()));
        const auto work = work_.get(codec.workspace_bytes(slice.size()));
        payload =
            out.first(codec.encode(slice, out, work, k.pushes * 1024 + std::uint64_t(p.server)));
        p.req.compressed = 1;
      }
      p.req.bytes = payload.size();
      bytes_pushed_ += sizeof(p.req) + payload.size();
      t.send(p.server, std::as_bytes(std::span(&p.req, 1)));
      t.send(p.server, payload);
      p.rep_req = t.recv(p.server, std::as_writable_bytes(std::span(&p.rep, 1)));
    }
    ++k.pushes;
    return last_ticket();
  }

  /// Starts pulling `key` into `into` (all its elements).
  ticket pull(std::uint64_t key, std::span<float> into) {
    key_state& k = check("ps::pull", key, into.size());
    op_state& o = start(detail::op::pull, key, k);
    auto& t = comm_.transport();
    for (part& p : o.parts) {
      t.send(p.server, std::as_bytes(std::span(&p.req, 1)));
      p.rep_req = t.recv(p.server, std::as_writable_bytes(std::span(&p.rep, 1)));
      p.data_req =
          t.recv(p.server, std::as_writable_bytes(into.subspan(p.req.offset, p.req.count)));
    }
    return last_ticket();
  }

  /// Waits until `t` completed. Throws `cohort::error`.
  void wait(ticket t) {
    std::error_code ec;
    wait(t, ec);
    if (ec) throw error(ec, what_op_, fail_peer_, fail_what_);
  }

  /// As `wait(t)`, failing through `ec`.
  void wait(ticket t, std::error_code& ec) {
    ec.clear();
    if (t < first_) return;  // completed earlier
    if (t >= first_ + ops_.size()) {
      ec = errc::invalid_argument;
      what_op_ = "ps::wait";
      fail_peer_ = -1;
      fail_what_ = "ps::wait: ticket " + std::to_string(t) + " was never issued";
      return;
    }
    op_state& o = ops_[static_cast<std::size_t>(t - first_)];
    if (!o.done) complete(o, ec);
    if (ec) return;
    while (!ops_.empty() && ops_.front().done) {
      ops_.pop_front();
      ++first_;
    }
  }

  /// Waits for every started push and pull.
  void wait_all() {
    for (ticket t = first_; t < first_ + ops_.size(); ++t) wait(t);
  }

  /// Pushes and pulls started and not yet waited for.
  std::size_t in_flight() const noexcept { return ops_.size(); }
  /// Pushes of `key` so far (the step the next push of it carries).
  std::uint64_t pushes(std::uint64_t key) const { return keys_.at(key).pushes; }
  /// Bytes handed to the transport by pushes so far, headers included.
  std::uint64_t bytes_pushed() const noexcept { return bytes_pushed_; }

  /// Completes what is in flight and tells every server this worker is done. Call it once, at
  /// the end; the servers' `serve` returns when every worker has. Throws `cohort::error`.
  void finish() {
    wait_all();
    auto& t = comm_.transport();
    bye_.kind = detail::op::bye;
    std::vector<request_type> sends;
    for (int s = 0; s < roles_.servers; ++s)
      sends.push_back(t.send(s, std::as_bytes(std::span(&bye_, 1))));
    for (int s = 0; s < roles_.servers; ++s) {
      std::error_code ec;
      t.wait(sends[static_cast<std::size_t>(s)], deadline_after(comm_.timeout()), ec);
      if (ec) {
        what_op_ = "ps::finish";
        transport_failed(s, ec, "ps::finish", "server rank " + std::to_string(s));
        throw error(ec, what_op_, fail_peer_, fail_what_);
      }
    }
  }

 private:
  struct key_state {
    std::size_t count = 0;
    std::uint64_t pushes = 0;
    std::vector<push_codec::slot> slots = {};  // one per server, when compressing
  };
  struct part {
    int server = 0;
    detail::request_header req{};
    detail::reply_header rep{};
    request_type rep_req{}, data_req{};
    detail::aligned_bytes encoded{};  // a compressed push's payload, until it completes
  };
  struct op_state {
    detail::op kind = detail::op::push;
    std::uint64_t key = 0;
    std::vector<part> parts;
    bool done = false;
  };

  ticket last_ticket() const noexcept { return first_ + ops_.size() - 1; }

  key_state& check(const char* what, std::uint64_t key, std::size_t size) {
    if (comm_.poisoned())
      throw error(
          errc::poisoned, what, comm_.last_failure()->peer,
          std::string(what) + ": the communicator failed earlier: " + comm_.last_failure()->what);
    const auto it = keys_.find(key);
    if (it == keys_.end())
      throw error(errc::invalid_argument, what, -1,
                  std::string(what) + ": key " + std::to_string(key) + " is not one of the " +
                      std::to_string(keys_.size()) + " keys this store was built with");
    if (size != it->second.count)
      throw error(errc::invalid_argument, what, -1,
                  std::string(what) + " of key " + std::to_string(key) + ": the buffer has " +
                      std::to_string(size) + " elements, the key has " +
                      std::to_string(it->second.count));
    return it->second;
  }

  op_state& start(detail::op kind, std::uint64_t key, const key_state& k) {
    op_state& o = ops_.emplace_back();
    o.kind = kind;
    o.key = key;
    for (int s = 0; s < roles_.servers; ++s) {
      const auto r = detail::shard_of(k.count, s, roles_.servers);
      if (r.size() == 0) continue;
      part& p = o.parts.emplace_back();
      p.server = s;
      p.req.kind = kind;
      p.req.key = key;
      p.req.step = k.pushes;
      p.req.offset = r.begin;
      p.req.count = r.size();
    }
    if (o.parts.empty()) o.done = true;  // an empty key: nothing to move
    return o;
  }

  void complete(op_state& o, std::error_code& ec) {
    auto& t = comm_.transport();
    what_op_ = std::string("ps::") + detail::op_name(o.kind);
    for (part& p : o.parts) {
      t.wait(p.rep_req, deadline_after(comm_.timeout()), ec);
      if (ec)
        return transport_failed(p.server, ec, what_op_ + " of key " + std::to_string(o.key),
                                describe(p));
      if (p.rep.status != 0) {
        ec = static_cast<errc>(p.rep.status);
        fail_peer_ = p.server;
        fail_what_ = what_op_ + " of key " + std::to_string(o.key) + ": server rank " +
                     std::to_string(p.server) + " refused it (" + ec.message() +
                     "): the ranks were built with different keys or sizes";
        comm_.fail({ec, p.server, fail_what_});
        return;
      }
      if (o.kind == detail::op::pull) {
        t.wait(p.data_req, deadline_after(comm_.timeout()), ec);
        if (ec)
          return transport_failed(p.server, ec, what_op_ + " of key " + std::to_string(o.key),
                                  describe(p));
      }
    }
    o.done = true;
  }

  std::string describe(const part& p) const {
    return "server rank " + std::to_string(p.server) + ", which holds shard " +
           std::to_string(p.server) + " of " + std::to_string(roles_.servers) + " (elements [" +
           std::to_string(p.req.offset) + ", " + std::to_string(p.req.offset + p.req.count) +
           ") of this key and its share of every "
           "other key)";
  }

  // A wait of `op` on `server` (described by `who`) failed with `ec`: records why and fails the
  // communicator, which tells every rank.
  void transport_failed(int server, std::error_code& ec, const std::string& op,
                        const std::string& who) {
    const failure* remote = comm_.transport().remote_failure();
    if (remote != nullptr) {
      ec = remote->code;
      fail_peer_ = remote->peer;
      fail_what_ =
          op + ": rank " + std::to_string(remote->peer) + " stopped the job: " + remote->what;
      comm_.fail(*remote);
      return;
    }
    fail_peer_ = server;
    if (ec == errc::peer_lost)
      fail_what_ = op + ": " + who + ", was lost: it crashed or closed its end";
    else if (ec == errc::timed_out)
      fail_what_ = op + ": " + who + ", did not answer within " +
                   std::to_string(comm_.timeout().count()) +
                   " ms (in sync or ssp mode it waits for the slowest worker)";
    else
      fail_what_ = op + ": " + who + ": " + ec.message();
    comm_.fail({ec, server, fail_what_});
  }

  Comm& comm_;
  roles roles_;
  worker_options opts_;
  detail::aligned_bytes work_;
  std::uint64_t bytes_pushed_ = 0;
  std::unordered_map<std::uint64_t, key_state> keys_;
  std::deque<op_state> ops_;
  ticket first_ = 0;
  detail::request_header bye_{};
  std::string what_op_, fail_what_;
  int fail_peer_ = -1;
};

}  // namespace cohort::ps
