// Fuzz target: the TCP transport's frames, as the data path reads them.
//
// Input: 2 bytes of settings, then the bytes a peer sends after the handshake. The stream goes
// into one end of a socket pair; a real engine (tcp_engine.hpp) reads the other end into
// receives of sizes drawn from the settings. A reference parser, written from the wire table
// in tcp_wire.hpp, says which payload bytes a receiver may get: data frames in order up to the
// first malformed header or abort frame (a truncated last frame counts as far as it goes).
// Checks: every receive within those bytes completes with exactly them; every receive beyond
// them fails (protocol_error, peer_lost, timed_out or the abort's code), never succeeds; the
// engine never reads or writes outside the buffers (ASan), never hangs (libFuzzer -timeout).
// Also: the header and abort decoders alone, and encode/decode round trips.
#include <sys/socket.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include <cohort/transport/detail/tcp_engine.hpp>

namespace tcpd = cohort::detail::tcp;
using namespace std::chrono_literals;

namespace {

[[noreturn]] void fail(const char* what) {
  std::fprintf(stderr, "fuzz_frames: %s\n", what);
  std::abort();
}

// The payload bytes a receiver may get from `s`, by the wire table.
std::vector<std::byte> reference(std::span<const std::byte> s) {
  std::vector<std::byte> d;
  std::size_t at = 0;
  while (s.size() - at >= tcpd::frame_header_size) {
    const std::byte* h = s.data() + at;
    const auto length = tcpd::load_le<std::uint32_t>(h);
    const auto type = std::to_integer<std::uint8_t>(h[4]);
    if (std::to_integer<std::uint8_t>(h[5]) != 0xC7 || h[6] != std::byte{0} || h[7] != std::byte{0}) break;
    at += tcpd::frame_header_size;
    if (type == 1 && length >= 1 && length <= (1u << 20)) {
      const std::size_t n = std::min<std::size_t>(length, s.size() - at);
      d.insert(d.end(), s.begin() + static_cast<std::ptrdiff_t>(at), s.begin() + static_cast<std::ptrdiff_t>(at + n));
      at += n;
      continue;
    }
    if (type == 2 && length >= 16 && length <= 2048) {
      // An abort ends what can be trusted only if it is malformed; a valid one is remembered
      // and data after it still flows to receives already posted.
      if (s.size() - at < length) break;
      const std::byte* p = s.data() + at;
      const auto origin = static_cast<std::int32_t>(tcpd::load_le<std::uint32_t>(p));
      const auto value = static_cast<std::int32_t>(tcpd::load_le<std::uint32_t>(p + 4));
      const auto cat = std::to_integer<std::uint8_t>(p[8]);
      const auto text = tcpd::load_le<std::uint32_t>(p + 12);
      if (origin < 0 || origin >= 2 || cat > 2 || text != length - 16 || value == 0) break;
      at += length;
      continue;
    }
    break;
  }
  return d;
}

void check_decoders(std::span<const std::byte> s) {
  if (s.size() < tcpd::frame_header_size) return;
  const auto h = tcpd::decode_frame_header(s.data());
  if (!h) return;
  if (h->type == tcpd::frame_type::data && (h->length < 1 || h->length > tcpd::max_data_frame)) fail("data length out of range accepted");
  if (h->type != tcpd::frame_type::abort || s.size() - tcpd::frame_header_size < h->length) return;
  const auto f = tcpd::decode_abort(s.data() + tcpd::frame_header_size, h->length, 4);
  if (!f) return;
  if (f->peer < 0 || f->peer >= 4 || !f->code) fail("abort decoded with a bad origin or code");
  // Round trip: what we decode, we encode to the same meaning.
  std::vector<std::byte> out(tcpd::frame_header_size + tcpd::max_control_frame);
  out.resize(tcpd::encode_abort(out.data(), out.size(), f->peer, *f));
  const auto h2 = tcpd::decode_frame_header(out.data());
  if (!h2) fail("encoded abort header does not decode");
  const auto f2 = tcpd::decode_abort(out.data() + tcpd::frame_header_size, h2->length, 4);
  if (!f2 || f2->peer != f->peer || f2->code != f->code || f2->what != f->what) fail("abort round trip differs");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 2) return 0;
  const unsigned split = data[0], flags = data[1];
  std::span<const std::byte> stream(reinterpret_cast<const std::byte*>(data) + 2, size - 2);
  check_decoders(stream);

  int sv[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, sv) != 0) return 0;
  // What the socket takes now is the stream (the kernel's buffer bounds it; the rest is cut).
  std::size_t written = 0;
  while (written < stream.size()) {
    const ssize_t n = ::send(sv[1], stream.data() + written, stream.size() - written, MSG_NOSIGNAL);
    if (n <= 0) break;
    written += static_cast<std::size_t>(n);
  }
  stream = stream.first(written);
  if (flags & 1) ::shutdown(sv[1], SHUT_WR);  // then the end of the stream: peer_lost after it

  std::vector<cohort::detail::net::unique_fd> fds(2);
  fds[1].reset(sv[0]);
  tcpd::engine_options o;
  o.spin = 0ns;
  o.abort_linger = 0ms;
  o.staging_bytes = (flags & 2) ? 0 : 64 * 1024;  // 0: the smallest staging the engine allows
  tcpd::engine e(0, 2, std::move(fds), {"me", "peer"}, o);

  const std::vector<std::byte> ref = reference(stream);
  // Receives of sizes 1..2^(split % 17), together one byte more than the stream could hold.
  std::vector<std::vector<std::byte>> bufs;
  std::vector<tcpd::engine::request> reqs;
  std::uint32_t rng = split * 2654435761u + 1;
  std::size_t posted = 0;
  const std::size_t limit = ref.size() + 1;
  while (posted < limit) {
    rng = rng * 1664525u + 1013904223u;
    const std::size_t cap = std::size_t{1} << (split % 17);
    const std::size_t n = std::min<std::size_t>(1 + (rng >> 8) % cap, limit - posted);
    bufs.emplace_back(n, std::byte{0xEE});
    reqs.push_back(e.recv(1, bufs.back()));
    posted += n;
  }
  std::size_t at = 0;
  bool failed = false;
  for (std::size_t i = 0; i < reqs.size(); ++i) {
    std::error_code ec;
    // Everything is in the socket already: one pass reads it, a short deadline ends the rest.
    e.wait(reqs[i], cohort::clock::now() + ((flags & 4) ? 1ms : 0ms), ec);
    const std::size_t end = at + bufs[i].size();
    if (!ec) {
      if (failed) fail("a receive completed after an earlier one failed");
      if (end > ref.size()) fail("a receive completed beyond the bytes the stream carried");
      if (std::memcmp(bufs[i].data(), ref.data() + at, bufs[i].size()) != 0) fail("received bytes differ from the stream's payload");
    } else {
      if (end <= ref.size()) fail("a receive within the stream's payload failed");
      const bool known = ec == cohort::errc::protocol_error || ec == cohort::errc::peer_lost ||
                         ec == cohort::errc::timed_out || e.remote_failure() != nullptr;
      if (!known) fail("a receive failed with an unexpected code");
      failed = true;
    }
    at = end;
  }
  ::close(sv[1]);
  return 0;
}
