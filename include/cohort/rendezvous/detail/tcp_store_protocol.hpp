/// @file
/// The TCP store's wire protocol, shared by the server and the client.
///
/// A connection opens with four messages: the client's hello, the server's challenge, the
/// client's proof, the server's verdict. Every integer is little-endian.
///
/// | hello (client) | bytes | | challenge (server) | bytes | | verdict (server) | bytes |
/// |----------------|-------| |--------------------|-------| |------------------|-------|
/// | magic          | 8     | | magic              | 8     | | magic            | 8     |
/// | version        | 4     | | version            | 4     | | status           | 1     |
/// | zero           | 4     | | flags (1: token)   | 4     | | zero             | 7     |
/// | nonce          | 32    | | nonce              | 32    | | server's proof   | 32    |
///
/// The client's proof is 32 bytes. When the server has a token (flag 1), the client's proof is
/// HMAC-SHA256(token, "cohort store client" + client nonce + server nonce) and the server's is
/// the same with "cohort store server": each side shows that it knows the token, and the token
/// itself never crosses the wire. Without a token both proofs are zero and the server admits by
/// its access rule (`store_access`). A verdict other than `admitted` is followed by a close.
///
/// Then requests and replies alternate:
///
/// | request    | bytes | | reply    | bytes |
/// |------------|-------| |----------|-------|
/// | op         | 1     | | status   | 1     |
/// | zero       | 3     | | zero     | 3     |
/// | key length | 4     | | length   | 4     |
/// | value len  | 4     | | number   | 8     |
/// | zero       | 4     | | payload  | length|
/// | argument   | 8     | |          |       |
/// | key, value |       | |          |       |
///
/// Every length is checked against its limit before anything is stored.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <cohort/detail/net/byte_order.hpp>
#include <cohort/rendezvous/detail/hmac.hpp>

namespace cohort::detail::store_wire {

using net::load_le;
using net::store_le;

inline constexpr std::uint64_t magic = 0x524f545354524843ull;  // "CHRTSTOR"
inline constexpr std::uint32_t version = 2;
inline constexpr std::size_t nonce_size = 32;
inline constexpr std::size_t hello_size = 16 + nonce_size;  // also the challenge's size
inline constexpr std::size_t proof_size = 32;
inline constexpr std::size_t verdict_size = 16 + proof_size;
inline constexpr std::uint32_t flag_token = 1;  // challenge: the server wants a proof
inline constexpr std::size_t request_size = 24;
inline constexpr std::size_t reply_size = 16;
inline constexpr std::size_t max_key = 4096;
inline constexpr std::size_t max_value = 16u << 20;
/// The key under which a server notes that a process of its own user on its host was refused
/// for a wrong token: "<wall-clock ns since the epoch> <address>" of the last one.
inline constexpr std::string_view refusal_key = "cohort/store/refused-wrong-token";
inline constexpr std::size_t max_wait_keys = 65536;

enum class op : std::uint8_t { set = 1, get = 2, add = 3, wait = 4 };
enum class status : std::uint8_t { ok = 0, missing = 1, timed_out = 2, bad_request = 3 };
/// What the server says to a proof.
enum class verdict : std::uint8_t { admitted = 0, wrong_token = 1, not_local_user = 2 };

using nonce = std::array<std::uint8_t, nonce_size>;

/// A hello (client) or a challenge (server): magic, version, flags, nonce.
inline void encode_hello(std::byte* p, std::uint32_t flags, const nonce& n) {
  store_le<std::uint64_t>(p, magic);
  store_le<std::uint32_t>(p + 8, version);
  store_le<std::uint32_t>(p + 12, flags);
  std::memcpy(p + 16, n.data(), n.size());
}

inline nonce nonce_of(const std::byte* hello) {
  nonce n;
  std::memcpy(n.data(), hello + 16, n.size());
  return n;
}

/// What a client sends to prove it knows `token` (zero without one).
inline crypto::digest client_proof(std::string_view token, const nonce& client,
                                   const nonce& server) {
  if (token.empty()) return {};
  return crypto::hmac_sha256(token, std::string_view("cohort store client"), client, server);
}

/// What the server sends to prove it knows `token` (zero without one).
inline crypto::digest server_proof(std::string_view token, const nonce& client,
                                   const nonce& server) {
  if (token.empty()) return {};
  return crypto::hmac_sha256(token, std::string_view("cohort store server"), client, server);
}

inline void encode_verdict(std::byte* p, verdict v, const crypto::digest& proof) {
  std::memset(p, 0, verdict_size);
  store_le<std::uint64_t>(p, magic);
  p[8] = static_cast<std::byte>(v);
  std::memcpy(p + 16, proof.data(), proof.size());
}

struct request {
  op kind = op::set;
  std::uint32_t key_length = 0, value_length = 0;
  std::int64_t arg = 0;
};

inline void encode_request(std::byte* p, op kind, std::size_t key, std::size_t value,
                           std::int64_t arg) {
  p[0] = static_cast<std::byte>(kind);
  p[1] = p[2] = p[3] = std::byte{0};
  store_le<std::uint32_t>(p + 4, static_cast<std::uint32_t>(key));
  store_le<std::uint32_t>(p + 8, static_cast<std::uint32_t>(value));
  store_le<std::uint32_t>(p + 12, 0);
  store_le<std::uint64_t>(p + 16, static_cast<std::uint64_t>(arg));
}

/// The request header at `p`, or nullopt when the op is unknown or a length over its limit.
inline std::optional<request> decode_request(const std::byte* p) {
  request r;
  const auto kind = std::to_integer<std::uint8_t>(p[0]);
  if (kind < 1 || kind > 4 || p[1] != std::byte{0} || p[2] != std::byte{0} || p[3] != std::byte{0})
    return std::nullopt;
  r.kind = static_cast<op>(kind);
  r.key_length = load_le<std::uint32_t>(p + 4);
  r.value_length = load_le<std::uint32_t>(p + 8);
  r.arg = static_cast<std::int64_t>(load_le<std::uint64_t>(p + 16));
  if (load_le<std::uint32_t>(p + 12) != 0 || r.key_length > max_key || r.value_length > max_value)
    return std::nullopt;
  if (r.kind == op::wait && r.key_length != 0) return std::nullopt;
  if (r.kind != op::wait && (r.key_length == 0 || (r.kind != op::set && r.value_length != 0)))
    return std::nullopt;
  return r;
}

inline void encode_reply(std::byte* p, status s, std::size_t length, std::int64_t number) {
  p[0] = static_cast<std::byte>(s);
  p[1] = p[2] = p[3] = std::byte{0};
  store_le<std::uint32_t>(p + 4, static_cast<std::uint32_t>(length));
  store_le<std::uint64_t>(p + 8, static_cast<std::uint64_t>(number));
}

/// A list of keys as bytes: count 4, then each key's length 4 and bytes.
inline std::string encode_keys(std::span<const std::string> keys) {
  std::string out(4, '\0');
  store_le<std::uint32_t>(reinterpret_cast<std::byte*>(out.data()),
                          static_cast<std::uint32_t>(keys.size()));
  for (const auto& k : keys) {
    char len[4];
    store_le<std::uint32_t>(reinterpret_cast<std::byte*>(len),
                            static_cast<std::uint32_t>(k.size()));
    out.append(len, 4);
    out += k;
  }
  return out;
}

/// The keys of `bytes`, or nullopt when it is malformed or over the limits.
inline std::optional<std::vector<std::string>> decode_keys(std::string_view bytes) {
  auto* p = reinterpret_cast<const std::byte*>(bytes.data());
  if (bytes.size() < 4) return std::nullopt;
  const auto count = load_le<std::uint32_t>(p);
  if (count > max_wait_keys || count > (bytes.size() - 4) / 4) return std::nullopt;
  std::vector<std::string> keys;
  keys.reserve(count);
  std::size_t at = 4;
  for (std::uint32_t i = 0; i < count; ++i) {
    if (bytes.size() - at < 4) return std::nullopt;
    const auto len = load_le<std::uint32_t>(p + at);
    at += 4;
    if (len > max_key || bytes.size() - at < len) return std::nullopt;
    keys.emplace_back(bytes.substr(at, len));
    at += len;
  }
  if (at != bytes.size()) return std::nullopt;
  return keys;
}

}  // namespace cohort::detail::store_wire
