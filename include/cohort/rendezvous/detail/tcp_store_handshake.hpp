/// @file
/// Both halves of the four messages that open a TCP store connection (hello, challenge, proof,
/// verdict; see tcp_store_protocol.hpp): the server's, driven by the bytes its poll loop reads,
/// and the client's, on a socket with a deadline.
#pragma once

#include <unistd.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <system_error>

#include <cohort/core/error.hpp>
#include <cohort/core/options.hpp>
#include <cohort/rendezvous/detail/hmac.hpp>
#include <cohort/rendezvous/detail/peer_uid.hpp>
#include <cohort/detail/net/socket.hpp>
#include <cohort/rendezvous/detail/tcp_store_protocol.hpp>

namespace cohort::detail::store_wire {

/// A server's nonces: HMACs of a counter under a random key, so unique for the server's life
/// and unpredictable to a client, without a system call per connection.
class nonce_source {
 public:
  nonce_source() {
    if (!net::random_bytes(key_.data(), key_.size())) {  // still unique per server
      const auto t = clock::now().time_since_epoch().count();
      const pid_t pid = ::getpid();
      std::memcpy(key_.data(), &t, sizeof t);
      std::memcpy(key_.data() + sizeof t, &pid, sizeof pid);
    }
  }

  nonce next() {
    const std::uint64_t n = count_++;
    return crypto::hmac_sha256(
        std::string_view(reinterpret_cast<const char*>(key_.data()), key_.size()),
        std::string_view(reinterpret_cast<const char*>(&n), sizeof n));
  }

 private:
  std::array<std::uint8_t, 32> key_{};
  std::uint64_t count_ = 0;
};

/// Whom a server admits: with a token, the clients that prove they know it; without one, the
/// processes of this host run by the server's user (`local_user_only`), or anyone.
struct admission_rule {
  std::string token;
  bool local_user_only = true;
};

/// The server's half of one connection's handshake.
class server_handshake {
 public:
  enum class state { hello, proof, admitted, refused };

  bool admitted() const noexcept { return at_ == state::admitted; }

  /// Bytes the next message still needs when `have` are buffered: reading no more than this,
  /// a stranger's bytes cost the server nothing. 0 once admitted or refused.
  std::size_t wanted(std::size_t have) const noexcept {
    const std::size_t want = at_ == state::hello   ? hello_size
                             : at_ == state::proof ? proof_size
                                                   : 0;
    return have < want ? want - have : 0;
  }

  /// Takes the complete messages at the front of `in` (erasing them) and appends the answers to
  /// `out`; `fd` is the connection (for the peer's user). Fields are checked as soon as they
  /// arrive, so that a stranger or an older client is told at once. On `refused`, `why` says
  /// why (for the log), and `out` holds what the client may be told (a verdict, or nothing).
  state step(std::string& in, std::string& out, const admission_rule& rule, nonce_source& nonces,
             int fd, std::string& why) {
    auto* b = reinterpret_cast<const std::byte*>(in.data());
    if (at_ == state::hello) {
      if (in.size() >= 8 && load_le<std::uint64_t>(b) != magic)
        return refuse("not a cohort store client (bad magic)", why);
      if (in.size() >= 12 && load_le<std::uint32_t>(b + 8) != version)
        return refuse("store protocol version " + std::to_string(load_le<std::uint32_t>(b + 8)) +
                          ", expected " + std::to_string(version) + " (another version of cohort?)",
                      why);
      if (in.size() < hello_size) return at_;
      if (load_le<std::uint32_t>(b + 12) != 0) return refuse("malformed hello", why);
      client_ = nonce_of(b);
      server_ = nonces.next();
      std::byte h[hello_size];
      encode_hello(h, rule.token.empty() ? 0 : flag_token, server_);
      out.append(reinterpret_cast<const char*>(h), sizeof h);
      in.erase(0, hello_size);
      at_ = state::proof;
    }
    if (at_ != state::proof || in.size() < proof_size) return at_;
    crypto::digest proof;
    std::memcpy(proof.data(), in.data(), proof.size());
    in.erase(0, proof_size);
    if (!rule.token.empty()) {
      if (!crypto::equal_digest(proof, client_proof(rule.token, client_, server_)))
        return refuse_with(out, verdict::wrong_token, "wrong token", why);
    } else if (rule.local_user_only) {
      const auto owner = net::peer_uid(fd);
      const uid_t me = ::geteuid();
      if (owner.what == net::peer_owner::kind::unknown)
        return refuse_with(out, verdict::not_local_user,
                           "cannot tell which user it is (are /proc/net/tcp and tcp6 readable?); "
                           "the store has no token, so it admits only this user's processes",
                           why);
      if (owner.what == net::peer_owner::kind::not_local)
        return refuse_with(out, verdict::not_local_user,
                           "not a process of this host; the store has no token, so it admits "
                           "only this user's processes on this host (set COHORT_TOKEN on every "
                           "rank to admit other hosts)",
                           why);
      if (owner.uid != me)
        return refuse_with(out, verdict::not_local_user,
                           "a process of user " + std::to_string(owner.uid) + ", not of user " +
                               std::to_string(me) +
                               "; the store has no token, so it admits only its own user's",
                           why);
    }
    std::byte h[verdict_size];
    encode_verdict(h, verdict::admitted, server_proof(rule.token, client_, server_));
    out.append(reinterpret_cast<const char*>(h), sizeof h);
    return at_ = state::admitted;
  }

 private:
  state refuse(std::string reason, std::string& why) {
    why = std::move(reason);
    return at_ = state::refused;
  }
  // Tells the client why (it learns nothing it did not know).
  state refuse_with(std::string& out, verdict v, std::string reason, std::string& why) {
    std::byte h[verdict_size];
    encode_verdict(h, v, {});
    out.append(reinterpret_cast<const char*>(h), sizeof h);
    return refuse(std::move(reason), why);
  }

  state at_ = state::hello;
  nonce client_{}, server_{};
};

/// The client's half on connected non-blocking `fd`, by `until`, with `token` (empty: none),
/// at the server `where` ("host:port", for messages). False when it fails: `ec` is
/// `peer_lost` when the server closed (a full server, one restarting: worth another try),
/// `timed_out`, or `invalid_argument` / `protocol_error` for a refusal or a server that is not
/// the job's store (trying again would not help); `why` is the sentence.
inline bool client_handshake(int fd, std::string_view token, const std::string& where,
                             deadline until, std::error_code& ec, std::string& why) {
  auto fail = [&](errc e, std::string s) {
    ec = make_error_code(e);
    why = std::move(s);
    return false;
  };
  auto lost = [&] {
    if (ec == errc::timed_out)
      return fail(errc::timed_out, "the store at " + where + " did not answer the hello in time");
    return fail(errc::peer_lost, "the store at " + where +
                                     " closed the connection during the hello (is COHORT_TOKEN "
                                     "the same on every rank? the same version of cohort?)");
  };
  nonce mine{};
  if (!net::random_bytes(mine.data(), mine.size())) {
    const auto t = clock::now().time_since_epoch().count();
    std::memcpy(mine.data(), &t, sizeof t);
  }
  std::byte hello[hello_size], challenge[hello_size], answer[verdict_size];
  encode_hello(hello, 0, mine);
  net::send_all(fd, hello, sizeof hello, until, ec);
  if (!ec) net::recv_all(fd, challenge, sizeof challenge, until, ec);
  if (ec) return lost();
  if (load_le<std::uint64_t>(challenge) != magic ||
      load_le<std::uint32_t>(challenge + 8) != version)
    return fail(errc::protocol_error, "the server at " + where +
                                          " is not a cohort store of this version (it answered "
                                          "the hello with something else)");
  const bool wants_token = load_le<std::uint32_t>(challenge + 12) & flag_token;
  if (wants_token && token.empty())
    return fail(errc::invalid_argument,
                "the store at " + where +
                    " wants the job's token and this rank has none: set COHORT_TOKEN (or "
                    "tcp_options::token) to the same secret on every rank");
  if (!wants_token && !token.empty())
    return fail(errc::invalid_argument,
                "the store at " + where +
                    " wants no token, but this rank has one (COHORT_TOKEN): rank 0, which hosts "
                    "the store, must have the same COHORT_TOKEN");
  const nonce theirs = nonce_of(challenge);
  const auto proof = client_proof(token, mine, theirs);
  net::send_all(fd, proof.data(), proof.size(), until, ec);
  if (!ec) net::recv_all(fd, answer, sizeof answer, until, ec);
  if (ec) return lost();
  crypto::digest their_proof;
  std::memcpy(their_proof.data(), answer + 16, their_proof.size());
  const auto v = std::to_integer<std::uint8_t>(answer[8]);
  if (load_le<std::uint64_t>(answer) != magic)
    return fail(errc::protocol_error, "the store at " + where + " sent a malformed verdict");
  if (v == static_cast<std::uint8_t>(verdict::wrong_token))
    return fail(errc::invalid_argument,
                "the store at " + where +
                    " refused this rank's token: is COHORT_TOKEN the same on every rank?");
  if (v == static_cast<std::uint8_t>(verdict::not_local_user))
    return fail(errc::invalid_argument,
                "the store at " + where +
                    " has no token, so it admits only processes of its own user on its own host, "
                    "and this is not one (its log says why): set COHORT_TOKEN to the same secret "
                    "on every rank");
  if (v != static_cast<std::uint8_t>(verdict::admitted) ||
      !crypto::equal_digest(their_proof, server_proof(token, mine, theirs)))
    return fail(errc::protocol_error, "the store at " + where +
                                          " does not know this rank's token (wrong "
                                          "COHORT_TOKEN, or not the job's store)");
  ec.clear();
  return true;
}

}  // namespace cohort::detail::store_wire
