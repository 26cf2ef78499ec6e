/// @file
/// The bytes of the TCP transport on the wire: the handshake that opens every connection and
/// the frames that follow it, and the address a rank publishes at the store. No Asio, no
/// sockets: plain encoding and validation, so that it can be tested (and fuzzed) alone.
///
/// Connection: the connecting rank sends a `hello`; the accepting rank checks it and answers
/// with its own, or with a refusal (`encode_refusal`) before it closes, or, when it gives up on
/// the job itself, with why (`encode_leaving`); the connector checks the answer and closes on
/// any disagreement. So a connector tells a refusal (a wrong token, job id or world size) and a
/// peer that left for a cause from a peer that died during the handshake. Then each
/// direction is a sequence of frames, each an 8-byte header and a payload:
///
/// | field    | bytes | meaning |
/// |----------|-------|---------|
/// | length   | 4     | payload bytes, little-endian (limits: see below) |
/// | type     | 1     | 1 data, 2 abort |
/// | mark     | 1     | 0xC7, catches a stream out of step early |
/// | reserved | 2     | zero |
///
/// A data payload is 1 to `max_data_frame` bytes, an abort payload 16 to `max_control_frame`.
///
/// Data payloads concatenate into the byte stream the transport concept describes (a frame may
/// span several sends, and a send several frames). An abort payload says who failed and why.
/// Every length is checked against its limit before a byte of payload is stored.
#pragma once

#include <algorithm>
#include <array>
#include <bit>
#include <charconv>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <system_error>

#include <cohort/core/error.hpp>
#include <cohort/detail/net/byte_order.hpp>

namespace cohort::detail::tcp {

inline constexpr std::uint64_t hello_magic = 0x3150435454524843ull;  // "CHRTTCP1"
inline constexpr std::uint32_t protocol_version = 1;
inline constexpr std::size_t max_job_id = 128;
inline constexpr std::size_t max_token = 96;
inline constexpr std::size_t hello_size = 256;

inline constexpr std::size_t frame_header_size = 8;
inline constexpr std::uint32_t max_data_frame = 1u << 20;
inline constexpr std::uint32_t max_control_frame = 2048;
inline constexpr std::size_t max_abort_text = max_control_frame - 16;
inline constexpr std::uint8_t frame_mark = 0xC7;

enum class frame_type : std::uint8_t { data = 1, abort = 2 };

using net::load_le;
using net::store_le;

/// What each end of a connection says about itself before anything else.
struct hello {
  int rank = -1;
  int size = 0;
  std::string job_id;
  std::string token;
};

/// The 256 bytes of `h`: magic 8, version 4, rank 4, size 4, job length 2, token length 2,
/// reserved 8, job id 128, token 96. `h` must fit (see `hello_fits`).
inline std::array<std::byte, hello_size> encode_hello(const hello& h) noexcept {
  std::array<std::byte, hello_size> b{};
  std::byte* p = b.data();
  store_le<std::uint64_t>(p, hello_magic);
  store_le<std::uint32_t>(p + 8, protocol_version);
  store_le<std::uint32_t>(p + 12, static_cast<std::uint32_t>(h.rank));
  store_le<std::uint32_t>(p + 16, static_cast<std::uint32_t>(h.size));
  const std::size_t jl = std::min(h.job_id.size(), max_job_id),
                    tl = std::min(h.token.size(), max_token);
  store_le<std::uint16_t>(p + 20, static_cast<std::uint16_t>(jl));
  store_le<std::uint16_t>(p + 22, static_cast<std::uint16_t>(tl));
  std::memcpy(p + 32, h.job_id.data(), jl);
  std::memcpy(p + 32 + max_job_id, h.token.data(), tl);
  return b;
}

/// True when the job id and token of `h` fit in a hello.
inline bool hello_fits(const hello& h) noexcept {
  return h.job_id.size() <= max_job_id && h.token.size() <= max_token;
}

/// Compares without an early exit, so that the time taken says nothing about the token.
inline bool equal_secret(std::string_view a, std::string_view b) noexcept {
  unsigned diff = a.size() == b.size() ? 0u : 1u;
  const std::size_t n = std::max(a.size(), b.size());
  for (std::size_t i = 0; i < n; ++i) {
    const unsigned x = i < a.size() ? static_cast<unsigned char>(a[i]) : 0u;
    const unsigned y = i < b.size() ? static_cast<unsigned char>(b[i]) : 0u;
    diff |= x ^ y;
  }
  return diff == 0;
}

/// The rank field of a refusal (-1) and of a leaving answer (-2): no rank of any job.
inline constexpr std::uint32_t refusal_rank = 0xffffffffu;
inline constexpr std::uint32_t leaving_rank = 0xfffffffeu;

/// The answer to a hello that is refused: a hello with the magic, the version and rank -1,
/// nothing else (no reason, no job id, no token), so that it tells a stranger nothing the
/// source code does not. `check_hello` never accepts it.
inline std::array<std::byte, hello_size> encode_refusal() noexcept {
  std::array<std::byte, hello_size> b{};
  store_le<std::uint64_t>(b.data(), hello_magic);
  store_le<std::uint32_t>(b.data() + 8, protocol_version);
  store_le<std::uint32_t>(b.data() + 12, refusal_rank);
  return b;
}

/// True when `b` is a refusal (see `encode_refusal`).
inline bool is_refusal(std::span<const std::byte, hello_size> b) noexcept {
  const auto r = encode_refusal();
  return std::memcmp(b.data(), r.data(), hello_size) == 0;
}

/// Checks a received hello against this job; on success fills `peer` and returns "".
/// Otherwise returns why it was refused (for the log; the peer is told only that it was).
inline std::string check_hello(std::span<const std::byte, hello_size> b, std::string_view job_id,
                               int size, std::string_view token, hello& peer) {
  const std::byte* p = b.data();
  if (load_le<std::uint64_t>(p) != hello_magic) return "not a cohort connection (bad magic)";
  if (const auto v = load_le<std::uint32_t>(p + 8); v != protocol_version)
    return "protocol version " + std::to_string(v) + ", expected " +
           std::to_string(protocol_version);
  const auto jl = load_le<std::uint16_t>(p + 20), tl = load_le<std::uint16_t>(p + 22);
  if (jl > max_job_id || tl > max_token) return "malformed hello (field lengths)";
  for (int i = 24; i < 32; ++i)
    if (p[i] != std::byte{0}) return "malformed hello (reserved bytes)";
  const std::string_view their_job(reinterpret_cast<const char*>(p + 32), jl);
  const std::string_view their_token(reinterpret_cast<const char*>(p + 32 + max_job_id), tl);
  // The token first, so that a stranger learns nothing from which check failed.
  if (!equal_secret(their_token, token)) return "wrong token";
  if (their_job != job_id)
    return "job id \"" + std::string(their_job) + "\", expected \"" + std::string(job_id) + "\"";
  const auto their_size = static_cast<std::int32_t>(load_le<std::uint32_t>(p + 16));
  const auto their_rank = static_cast<std::int32_t>(load_le<std::uint32_t>(p + 12));
  if (their_size != size)
    return "world size " + std::to_string(their_size) + ", expected " + std::to_string(size);
  if (their_rank < 0 || their_rank >= size)
    return "rank " + std::to_string(their_rank) + " out of range";
  peer.rank = their_rank;
  peer.size = their_size;
  peer.job_id = their_job;
  peer.token.clear();
  return {};
}

/// A frame header as read off the wire.
struct frame_header {
  frame_type type = frame_type::data;
  std::uint32_t length = 0;
};

inline void encode_frame_header(std::byte* p, frame_type t, std::uint32_t length) noexcept {
  store_le<std::uint32_t>(p, length);
  p[4] = static_cast<std::byte>(t);
  p[5] = static_cast<std::byte>(frame_mark);
  p[6] = p[7] = std::byte{0};
}

/// Decodes and checks a header: nullopt unless the type is known, the mark right and the
/// length within the limit of its type.
inline std::optional<frame_header> decode_frame_header(const std::byte* p) noexcept {
  const auto length = load_le<std::uint32_t>(p);
  const auto type = std::to_integer<std::uint8_t>(p[4]);
  if (std::to_integer<std::uint8_t>(p[5]) != frame_mark || p[6] != std::byte{0} ||
      p[7] != std::byte{0})
    return std::nullopt;
  if (type == static_cast<std::uint8_t>(frame_type::data) && length >= 1 &&
      length <= max_data_frame)
    return frame_header{frame_type::data, length};
  if (type == static_cast<std::uint8_t>(frame_type::abort) && length >= 16 &&
      length <= max_control_frame)
    return frame_header{frame_type::abort, length};
  return std::nullopt;
}

/// Error categories an abort can carry across the wire; anything else travels as `aborted`.
enum class wire_category : std::uint8_t { cohort = 0, generic = 1, system = 2 };

/// The payload of an abort saying that `origin` failed with `f`, its text cut to `max_text`;
/// returns its size. Payload: origin 4, code 4, category 1, reserved 3, text length 4, text.
inline std::size_t encode_abort_payload(std::byte* p, std::size_t max_text, int origin,
                                        const failure& f) noexcept {
  wire_category cat = wire_category::cohort;
  int value = f.code.value();
  if (f.code.category() == std::generic_category())
    cat = wire_category::generic;
  else if (f.code.category() == std::system_category())
    cat = wire_category::system;
  else if (f.code.category() != error_category())
    value = static_cast<int>(errc::aborted);
  const std::size_t text = std::min(f.what.size(), max_text);
  store_le<std::uint32_t>(p, static_cast<std::uint32_t>(origin));
  store_le<std::uint32_t>(p + 4, static_cast<std::uint32_t>(value));
  p[8] = static_cast<std::byte>(cat);
  p[9] = p[10] = p[11] = std::byte{0};
  store_le<std::uint32_t>(p + 12, static_cast<std::uint32_t>(text));
  std::memcpy(p + 16, f.what.data(), text);
  return 16 + text;
}

/// An abort frame (header and payload) saying that `origin` failed with `f`; returns its size.
inline std::size_t encode_abort(std::byte* out, std::size_t capacity, int origin,
                                const failure& f) noexcept {
  const std::size_t n = encode_abort_payload(
      out + frame_header_size, std::min(max_abort_text, capacity - frame_header_size - 16),
      origin, f);
  encode_frame_header(out, frame_type::abort, static_cast<std::uint32_t>(n));
  return frame_header_size + n;
}

/// Decodes an abort payload of `length` bytes (already checked by `decode_frame_header`) from
/// a peer of a group of `size`; nullopt when it does not hold together.
inline std::optional<failure> decode_abort(const std::byte* p, std::uint32_t length, int size) {
  const auto origin = static_cast<std::int32_t>(load_le<std::uint32_t>(p));
  const auto value = static_cast<std::int32_t>(load_le<std::uint32_t>(p + 4));
  const auto cat = std::to_integer<std::uint8_t>(p[8]);
  const auto text = load_le<std::uint32_t>(p + 12);
  if (origin < 0 || origin >= size || cat > 2 || text != length - 16 || value == 0)
    return std::nullopt;
  failure f;
  f.peer = origin;
  if (cat == 0)
    f.code = make_error_code(static_cast<errc>(value));
  else if (cat == 1)
    f.code = std::error_code(value, std::generic_category());
  else
    f.code = std::error_code(value, std::system_category());
  f.what.assign(reinterpret_cast<const char*>(p + 16), text);
  return f;
}

/// Room for a leaving answer's text: the hello less the refusal's header (16 bytes: magic,
/// version, rank) and the abort payload's (16).
inline constexpr std::size_t leaving_text_room = hello_size - 32;

/// The answer of a rank that gives up on the job while a peer's hello waits for its answer: a
/// refusal (magic, version) whose rank field is -2, then, from byte 16, an abort payload saying
/// that `origin` failed and why (its text cut to `leaving_text_room`, 224 bytes). The peer then
/// learns the cause instead of finding the connection closed (or reset, its hello unread) and
/// taking `origin` for dead. Sent only to a hello that carried the job's token.
inline std::array<std::byte, hello_size> encode_leaving(int origin, const failure& f) noexcept {
  auto b = encode_refusal();
  store_le<std::uint32_t>(b.data() + 12, leaving_rank);
  encode_abort_payload(b.data() + 16, leaving_text_room, origin, f);
  return b;
}

/// The failure a leaving answer (see `encode_leaving`) from a peer of a group of `size` carries;
/// nullopt when `b` is not one or does not hold together. `check_hello` never accepts it.
inline std::optional<failure> decode_leaving(std::span<const std::byte, hello_size> b, int size) {
  const std::byte* p = b.data();
  if (load_le<std::uint64_t>(p) != hello_magic ||
      load_le<std::uint32_t>(p + 8) != protocol_version ||
      load_le<std::uint32_t>(p + 12) != leaving_rank)
    return std::nullopt;
  const auto text = load_le<std::uint32_t>(p + 16 + 12);
  if (text > leaving_text_room) return std::nullopt;
  return decode_abort(p + 16, 16 + text, size);
}

/// A rank's listening address as it publishes it at the store for the TCP setup: "host port
/// size". The size lets every rank see at once that another says the job has a different number
/// of ranks (else each would wait for ranks that never come).
struct published_address {
  std::string host;
  int port = 0;
  int size = 0;  ///< 0 where the address carries none
};

/// The text of `a`, the size left out where it is 0.
inline std::string format_address(const published_address& a) {
  std::string v = a.host + " " + std::to_string(a.port);
  if (a.size > 0) v += " " + std::to_string(a.size);
  return v;
}

/// The address `v` holds; nullopt unless it is a host without spaces or control characters, a
/// port of 1 to 65535 and, optionally, a size of at least 1, in decimal, separated by single
/// spaces (whether the host is an address is checked where it is resolved; bytes past ASCII may
/// name the interface of a link-local IPv6 address).
inline std::optional<published_address> parse_address(std::string_view v) {
  const auto number = [](std::string_view t, int& out) {
    const auto [end, e] = std::from_chars(t.data(), t.data() + t.size(), out);
    return !t.empty() && e == std::errc{} && end == t.data() + t.size();
  };
  const auto first = v.find(' ');
  if (first == 0 || first == std::string_view::npos) return std::nullopt;
  const auto host = v.substr(0, first);
  const auto plain = [](char c) { return static_cast<unsigned char>(c) > ' ' && c != 0x7f; };
  if (!std::all_of(host.begin(), host.end(), plain))
    return std::nullopt;
  published_address a;
  a.host.assign(host);
  const auto rest = v.substr(first + 1);
  const auto second = rest.find(' ');
  if (!number(rest.substr(0, second), a.port) || a.port < 1 || a.port > 65535) return std::nullopt;
  if (second != std::string_view::npos && (!number(rest.substr(second + 1), a.size) || a.size < 1))
    return std::nullopt;
  return a;
}

}  // namespace cohort::detail::tcp
