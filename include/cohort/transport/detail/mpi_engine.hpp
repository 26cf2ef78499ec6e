/// @file
/// The machinery of `mpi_transport`: byte streams over MPI messages, and the abort channel.
///
/// MPI matches messages, the transport concept promises byte streams (a receive takes the next
/// bytes, whatever the sizes of the sends). So a receive is never posted blindly: the engine
/// probes the next message from the peer (`MPI_Improbe`, which also takes it out of the
/// matching queue, so order is kept) and receives it (`MPI_Imrecv`) straight into the posted
/// receive when it fits there, else into a staging buffer that is copied into the receives it
/// spans on completion; bytes beyond every posted receive wait in the staging buffer for the
/// next receive. Sends are cut into messages of at most `max_message` bytes (an MPI count is
/// an `int`). Data travels on one duplicate of the user's communicator and aborts on another,
/// so neither can match the other, nor the user's own messages.
#pragma once

// Without <mpi.h> on the include path (MPI not installed, or the program does not use MPI's
// compiler flags) this header declares nothing, so that a build that includes every header
// still compiles (using cohort::mpi_transport then fails to compile: build with MPI).
#if __has_include(<mpi.h>)

#ifndef OMPI_SKIP_MPICXX
#define OMPI_SKIP_MPICXX 1  // the C API only: Open MPI's C++ bindings warn under -Wextra
#endif
#include <mpi.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <climits>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <deque>
#include <optional>
#include <span>
#include <string>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

#include <cohort/core/error.hpp>
#include <cohort/core/options.hpp>

namespace cohort::detail::mpi {

/// A pending send or receive: complete once the stream with `peer` passed `end` bytes.
struct request {
  int peer = -1;  // -1: nothing pending
  bool is_send = false;
  std::uint64_t end = 0;
};

/// The text of an MPI error code, for messages.
inline std::string error_string(int code) {
  char text[MPI_MAX_ERROR_STRING] = {};
  int len = 0;
  if (MPI_Error_string(code, text, &len) != MPI_SUCCESS) return "MPI error " + std::to_string(code);
  return std::string(text, static_cast<std::size_t>(std::max(len, 0)));
}

// The abort message: the code (its category as a number), the rank whose failure it is (the
// sender, or the peer whose abort it passes on) and up to 1 KiB of text.
inline constexpr std::size_t abort_text_bytes = 1024;
struct abort_message {
  std::int32_t category = 0;  // 0 cohort, 1 generic, 2 system
  std::int32_t value = 0;
  std::int32_t rank = -1;
  std::uint32_t length = 0;
  char text[abort_text_bytes] = {};
};

inline int category_id(const std::error_category& c) {
  if (c == cohort::error_category()) return 0;
  if (c == std::generic_category()) return 1;
  if (c == std::system_category()) return 2;
  return -1;
}

class engine {
 public:
  engine(MPI_Comm user, std::size_t max_message, std::chrono::nanoseconds spin)
      : max_message_(max_message), spin_(spin) {
    const auto check = [](int rc, const char* what) {
      if (rc != MPI_SUCCESS)
        throw error(errc::invalid_argument, "mpi_transport", -1,
                    std::string("mpi_transport: ") + what + " failed: " + error_string(rc));
    };
    int initialized = 0, finalized = 0;
    MPI_Initialized(&initialized);
    MPI_Finalized(&finalized);
    if (!initialized || finalized)
      throw error(errc::invalid_argument, "mpi_transport", -1,
                  "mpi_transport: MPI is not initialized (call MPI_Init first) or already finalized");
    if (user == MPI_COMM_NULL)
      throw error(errc::invalid_argument, "mpi_transport", -1,
                  "mpi_transport: the communicator is MPI_COMM_NULL");
    int inter = 0;
    check(MPI_Comm_test_inter(user, &inter), "MPI_Comm_test_inter");
    if (inter)
      throw error(errc::invalid_argument, "mpi_transport", -1,
                  "mpi_transport: an intercommunicator; pass an intracommunicator");
    // Collective over `user`: every rank of it constructs its transport at the same point.
    check(MPI_Comm_dup(user, &data_), "MPI_Comm_dup");
    if (int rc = MPI_Comm_dup(user, &control_); rc != MPI_SUCCESS) {
      MPI_Comm_free(&data_);
      check(rc, "MPI_Comm_dup");
    }
    MPI_Comm_set_errhandler(data_, MPI_ERRORS_RETURN);
    MPI_Comm_set_errhandler(control_, MPI_ERRORS_RETURN);
    MPI_Comm_rank(data_, &rank_);
    MPI_Comm_size(data_, &size_);
    peers_.resize(static_cast<std::size_t>(size_));
    if (size_ > 1)
      MPI_Irecv(&incoming_, static_cast<int>(sizeof incoming_), MPI_BYTE, MPI_ANY_SOURCE, 0, control_, &control_recv_);
  }

  engine(const engine&) = delete;
  engine& operator=(const engine&) = delete;

  ~engine() {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (finalized) return;  // MPI took everything with it
    if (control_recv_ != MPI_REQUEST_NULL) {
      MPI_Cancel(&control_recv_);
      MPI_Wait(&control_recv_, MPI_STATUS_IGNORE);
    }
    // Sends still pending (never waited on, or cut off by an abort) finish in the background;
    // staged receives own their buffers, so they are waited for, briefly.
    const deadline until = deadline_after(std::chrono::milliseconds(200));
    for (auto& p : peers_) {
      for (auto& s : p.sends)
        if (s.req != MPI_REQUEST_NULL) MPI_Request_free(&s.req);
      for (auto& r : p.inflight) {
        for (int done = 0; !done && r.req != MPI_REQUEST_NULL && clock::now() < until;)
          MPI_Test(&r.req, &done, MPI_STATUS_IGNORE);
        if (r.req != MPI_REQUEST_NULL) MPI_Request_free(&r.req);
      }
    }
    for (auto& r : abort_sends_)
      if (r != MPI_REQUEST_NULL) MPI_Request_free(&r);
    MPI_Comm_free(&data_);
    MPI_Comm_free(&control_);
  }

  int rank() const { return rank_; }
  int size() const { return size_; }

  request send(int peer, std::span<const std::byte> bytes) {
    if (bytes.empty()) return {};
    auto& p = peers_[static_cast<std::size_t>(peer)];
    for (std::size_t off = 0; off < bytes.size(); off += max_message_) {
      const std::size_t n = std::min(max_message_, bytes.size() - off);
      pending_send s{MPI_REQUEST_NULL, n};
      if (!failed_) {
        const int rc = MPI_Isend(bytes.data() + off, static_cast<int>(n), MPI_BYTE, peer, 0, data_,
                                 &s.req);
        if (rc != MPI_SUCCESS) note_mpi_error(rc, peer, "MPI_Isend");
      }
      p.sends.push_back(s);
    }
    p.send_end += bytes.size();
    return {peer, true, p.send_end};
  }

  request recv(int peer, std::span<std::byte> bytes) {
    if (bytes.empty()) return {};
    auto& p = peers_[static_cast<std::size_t>(peer)];
    p.recv_end += bytes.size();
    // Bytes that came beyond the earlier receives go first (nothing else is in flight then).
    const std::size_t early = std::min(p.leftover.size() - p.leftover_taken, bytes.size());
    if (early > 0) {
      std::memcpy(bytes.data(), p.leftover.data() + p.leftover_taken, early);
      p.leftover_taken += early;
      p.recv_done += early;
      if (p.leftover_taken == p.leftover.size()) {
        p.leftover.clear();
        p.leftover_taken = 0;
      }
    }
    if (early < bytes.size()) p.posted.push_back({bytes.data() + early, bytes.size() - early});
    return {peer, false, p.recv_end};
  }

  void wait(request& req, deadline until, std::error_code& ec) {
    ec.clear();
    const auto start = clock::now();
    for (;;) {
      progress();
      if (complete(req)) break;
      if (failed_) {
        ec = failure_code();
        return;
      }
      const auto now = clock::now();
      if (now >= until) {
        ec = errc::timed_out;
        return;
      }
      if (now - start > spin_) std::this_thread::yield();  // leave the core to the peers
    }
    req = {};
  }

  void abort(const failure& f) noexcept {
    if (local_abort_ || size_ == 1) {
      local_abort_ = true;
      return;
    }
    local_abort_ = true;
    if (!failed_) failed_ = f.code ? f.code : make_error_code(errc::aborted);
    // A rank that fails because a peer aborted passes that peer's abort on, naming it: the
    // others may hear this rank before they hear the peer (messages from two sources are not
    // ordered), and must blame the same rank for the same cause.
    const failure& cause = remote_ ? *remote_ : f;
    outgoing_.category = category_id(cause.code.category());
    outgoing_.value =
        outgoing_.category < 0 ? static_cast<int>(errc::aborted) : cause.code.value();
    if (outgoing_.category < 0) outgoing_.category = 0;
    outgoing_.rank = remote_ ? remote_->peer : rank_;
    outgoing_.length = static_cast<std::uint32_t>(std::min(cause.what.size(), abort_text_bytes));
    std::memcpy(outgoing_.text, cause.what.data(), outgoing_.length);
    const int bytes = static_cast<int>(offsetof(abort_message, text) + outgoing_.length);
    abort_sends_.assign(static_cast<std::size_t>(size_), MPI_REQUEST_NULL);
    for (int q = 0; q < size_; ++q)
      if (q != rank_)
        MPI_Isend(&outgoing_, bytes, MPI_BYTE, q, 0, control_, &abort_sends_[static_cast<std::size_t>(q)]);
    // Let what is in flight finish where it can: a receive into the caller's memory that MPI
    // already matched cannot be withdrawn, nor can a send (MPI_Cancel of sends is deprecated).
    // The peers stop matching this rank's messages once they see the abort.
    const deadline until = deadline_after(drain_time);
    while (clock::now() < until) {
      bool busy = false;
      for (auto& p : peers_) {
        for (auto& s : p.sends)
          if (s.req != MPI_REQUEST_NULL) {
            int done = 0;
            MPI_Test(&s.req, &done, MPI_STATUS_IGNORE);
            busy = busy || !done;
          }
        for (auto& r : p.inflight)
          if (r.req != MPI_REQUEST_NULL) {
            int done = 0;
            MPI_Test(&r.req, &done, MPI_STATUS_IGNORE);
            busy = busy || !done;
          }
      }
      int sent = 0;
      MPI_Testall(static_cast<int>(abort_sends_.size()), abort_sends_.data(), &sent,
                  MPI_STATUSES_IGNORE);
      if (!busy && sent) break;
      std::this_thread::yield();
    }
  }

  const failure* remote_failure() const { return remote_ && remote_first_ ? &*remote_ : nullptr; }

  /// What MPI said when one of its calls failed, or empty.
  const std::string& mpi_error() const { return mpi_error_; }

  /// How long `abort` lets matched operations finish.
  static constexpr std::chrono::milliseconds drain_time{100};

 private:
  struct pending_send {
    MPI_Request req;
    std::size_t size;
  };
  struct segment {
    std::byte* data;
    std::size_t size;
  };
  // One message being received: straight into a receive, or staged and copied on completion.
  struct incoming {
    MPI_Request req = MPI_REQUEST_NULL;
    std::size_t size = 0;          // bytes of posted receives it fills
    std::vector<std::byte> stage;  // empty when received in place
    std::vector<segment> targets;  // where the staged bytes go
  };
  struct peer_state {
    std::deque<pending_send> sends;
    std::uint64_t send_end = 0, send_done = 0;
    std::deque<segment> posted;  // receive space no message was assigned to yet
    std::deque<incoming> inflight;
    std::uint64_t recv_end = 0, recv_done = 0;
    std::vector<std::byte> leftover;  // bytes received beyond every posted receive
    std::size_t leftover_taken = 0;
    bool overflowing = false;  // a staged message runs past the posted receives
  };

  // The code a wait fails with: the first aborting peer's, errc::aborted where this rank
  // aborted first, else what MPI reported.
  std::error_code failure_code() const {
    if (remote_ && remote_first_) return remote_->code;
    if (local_abort_) return make_error_code(errc::aborted);
    return failed_;
  }

  void note_mpi_error(int rc, int peer, const char* what) {
    if (failed_) return;
    failed_ = make_error_code(errc::peer_lost);
    mpi_error_ = std::string(what) + " with rank " + std::to_string(peer) + ": " + error_string(rc);
  }

  bool complete(const request& r) const {
    if (r.peer < 0) return true;
    const auto& p = peers_[static_cast<std::size_t>(r.peer)];
    return (r.is_send ? p.send_done : p.recv_done) >= r.end;
  }

  void check_control() {
    if (control_recv_ == MPI_REQUEST_NULL) return;
    int done = 0;
    MPI_Status st;
    MPI_Test(&control_recv_, &done, &st);
    if (!done) return;
    control_recv_ = MPI_REQUEST_NULL;
    const auto& m = incoming_;
    std::error_code code = make_error_code(errc::aborted);
    if (m.category == 0) code = std::error_code(m.value, cohort::error_category());
    if (m.category == 1) code = std::error_code(m.value, std::generic_category());
    if (m.category == 2) code = std::error_code(m.value, std::system_category());
    if (!code) code = make_error_code(errc::aborted);
    // The rank whose failure it is: the sender, or the rank whose abort the sender passes on.
    const int origin = m.rank >= 0 && m.rank < size_ ? m.rank : st.MPI_SOURCE;
    try {
      remote_ = failure{code, origin,
                        std::string(m.text, std::min<std::size_t>(m.length, abort_text_bytes))};
    } catch (...) {
      remote_ = failure{code, origin, {}};
    }
    remote_first_ = !local_abort_;
    if (!failed_) failed_ = code;
  }

  void progress() {
    check_control();
    if (failed_) return;
    for (int q = 0; q < size_; ++q) {
      if (q == rank_) continue;
      auto& p = peers_[static_cast<std::size_t>(q)];
      while (!p.sends.empty()) {
        int done = 0;
        if (int rc = MPI_Test(&p.sends.front().req, &done, MPI_STATUS_IGNORE); rc != MPI_SUCCESS)
          return note_mpi_error(rc, q, "MPI_Isend");
        if (!done) break;
        p.send_done += p.sends.front().size;
        p.sends.pop_front();
      }
      while (!p.inflight.empty()) {
        auto& in = p.inflight.front();
        int done = 0;
        if (int rc = MPI_Test(&in.req, &done, MPI_STATUS_IGNORE); rc != MPI_SUCCESS)
          return note_mpi_error(rc, q, "MPI_Imrecv");
        if (!done) break;
        if (!in.stage.empty()) {
          std::size_t off = 0;
          for (const auto& t : in.targets) {
            std::memcpy(t.data, in.stage.data() + off, t.size);
            off += t.size;
          }
          if (off < in.stage.size()) {  // the rest waits for later receives
            in.stage.erase(in.stage.begin(), in.stage.begin() + static_cast<std::ptrdiff_t>(off));
            p.leftover = std::move(in.stage);
            p.leftover_taken = 0;
            p.overflowing = false;
          }
        }
        p.recv_done += in.size;
        p.inflight.pop_front();
      }
      while (!p.posted.empty() && !p.overflowing) {
        int found = 0;
        MPI_Message msg;
        MPI_Status st;
        if (int rc = MPI_Improbe(q, 0, data_, &found, &msg, &st); rc != MPI_SUCCESS)
          return note_mpi_error(rc, q, "MPI_Improbe");
        if (!found) break;
        int count = 0;
        MPI_Get_count(&st, MPI_BYTE, &count);
        assign(p, q, msg, static_cast<std::size_t>(count));
        if (failed_) return;
      }
    }
  }

  // Receives the message `msg` of `n` bytes into the posted receives of `p`.
  void assign(peer_state& p, int q, MPI_Message& msg, std::size_t n) {
    incoming in;
    auto& front = p.posted.front();
    void* into = nullptr;
    if (n <= front.size) {  // in place
      into = front.data;
      in.size = n;
      front.data += n;
      front.size -= n;
      if (front.size == 0) p.posted.pop_front();
    } else {
      in.stage.resize(n);
      into = in.stage.data();
      while (in.size < n && !p.posted.empty()) {
        auto& s = p.posted.front();
        const std::size_t take = std::min(s.size, n - in.size);
        in.targets.push_back({s.data, take});
        in.size += take;
        s.data += take;
        s.size -= take;
        if (s.size == 0) p.posted.pop_front();
      }
      p.overflowing = in.size < n;
    }
    const int rc = MPI_Imrecv(into, static_cast<int>(n), MPI_BYTE, &msg, &in.req);
    if (rc != MPI_SUCCESS) return note_mpi_error(rc, q, "MPI_Imrecv");
    p.inflight.push_back(std::move(in));
  }

  MPI_Comm data_ = MPI_COMM_NULL, control_ = MPI_COMM_NULL;
  int rank_ = 0, size_ = 1;
  std::size_t max_message_;
  std::chrono::nanoseconds spin_;
  std::vector<peer_state> peers_;
  MPI_Request control_recv_ = MPI_REQUEST_NULL;
  abort_message incoming_{}, outgoing_{};
  std::vector<MPI_Request> abort_sends_;
  std::error_code failed_;
  bool local_abort_ = false, remote_first_ = false;
  std::optional<failure> remote_;
  std::string mpi_error_;
};

}  // namespace cohort::detail::mpi

#endif  // __has_include(<mpi.h>)
