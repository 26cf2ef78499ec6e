// Fuzz target: the hello that opens every TCP connection (tcp_wire.hpp, check_hello).
//
// Input: one byte choosing what this rank expects (job id, world size, token), then up to 256
// bytes of a peer's hello (shorter inputs are padded with zeros, as a truncated hello would be
// read into a zeroed buffer). Checks: a hello is accepted only when magic, version, reserved
// bytes, token, job id, world size and rank all hold; what is accepted encodes back to a hello
// that is accepted the same way; a refusal always says why. Also the secret comparison, and the
// leaving answer (decode_leaving) on the same bytes, and the bytes after the first as a
// published address (parse_address).
#include <array>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <span>
#include <string>
#include <string_view>

#include <cohort/transport/detail/tcp_wire.hpp>

namespace tcpd = cohort::detail::tcp;

namespace {

[[noreturn]] void fail(const char* what) {
  std::fprintf(stderr, "fuzz_handshake: %s\n", what);
  std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 1) return 0;
  const unsigned choice = data[0];
  static const std::string jobs[] = {"job", "", std::string(128, 'j'), "torchrun-1234"};
  static const std::string tokens[] = {"secret", "", std::string(96, 't'), "s3cr3t-token-0123456789"};
  const std::string& job = jobs[choice & 3];
  const std::string& token = tokens[(choice >> 2) & 3];
  const int world = 1 + static_cast<int>((choice >> 4) & 7);

  std::array<std::byte, tcpd::hello_size> b{};
  std::memcpy(b.data(), data + 1, std::min(size - 1, b.size()));
  tcpd::hello peer;
  const std::string why = tcpd::check_hello(b, job, world, token, peer);
  const std::byte* p = b.data();
  const auto jl = tcpd::load_le<std::uint16_t>(p + 20), tl = tcpd::load_le<std::uint16_t>(p + 22);
  if (why.empty()) {
    if (tcpd::load_le<std::uint64_t>(p) != tcpd::hello_magic) fail("accepted a bad magic");
    if (tcpd::load_le<std::uint32_t>(p + 8) != tcpd::protocol_version) fail("accepted another version");
    if (tl != token.size() || std::memcmp(p + 32 + tcpd::max_job_id, token.data(), tl) != 0) fail("accepted a wrong token");
    if (jl != job.size() || std::memcmp(p + 32, job.data(), jl) != 0 || peer.job_id != job) fail("accepted a wrong job id");
    if (peer.size != world || peer.rank < 0 || peer.rank >= world) fail("accepted a rank or size out of range");
    for (int i = 24; i < 32; ++i)
      if (p[i] != std::byte{0}) fail("accepted reserved bytes that are not zero");
    if (!peer.token.empty()) fail("kept the peer's token");
    // What we accept, we would send the same way.
    const auto again = tcpd::encode_hello({peer.rank, world, job, token});
    tcpd::hello twice;
    if (!tcpd::check_hello(again, job, world, token, twice).empty() || twice.rank != peer.rank) fail("round trip refused");
  } else if (why.size() < 5) {
    fail("a refusal without a reason");
  }
  // The secret comparison agrees with ==, both ways.
  const std::string_view mine(token), theirs(reinterpret_cast<const char*>(p + 32 + tcpd::max_job_id), std::min<std::size_t>(tl, tcpd::max_token));
  if (tcpd::equal_secret(mine, theirs) != (mine == theirs) || tcpd::equal_secret(theirs, mine) != (mine == theirs))
    fail("equal_secret disagrees with ==");
  // A leaving answer is never a hello, and what it carries stays inside the 256 bytes and the
  // job's ranks; what is decoded encodes back to the same answer.
  if (const auto left = tcpd::decode_leaving(b, world)) {
    if (why.empty()) fail("a hello that is also a leaving answer");
    if (left->peer < 0 || left->peer >= world) fail("a leaving answer from a rank out of range");
    if (left->what.size() > tcpd::leaving_text_room) fail("a leaving answer's text past its end");
    if (!tcpd::decode_leaving(tcpd::encode_leaving(left->peer, *left), world)) fail("leaving round trip refused");
  }
  // An address is accepted only with a host without spaces or control bytes, a port and a size
  // in range, and formats back to text that parses the same.
  const std::string_view text(reinterpret_cast<const char*>(data + 1), size - 1);
  if (const auto a = tcpd::parse_address(text)) {
    if (a->host.empty()) fail("an address without a host");
    for (const char c : a->host)
      if (static_cast<unsigned char>(c) <= ' ' || c == 0x7f) fail("an address whose host has a space or a control byte");
    if (a->port < 1 || a->port > 65535 || a->size < 0) fail("an address with a port or size out of range");
    const auto twice = tcpd::parse_address(tcpd::format_address(*a));
    if (!twice || twice->host != a->host || twice->port != a->port || twice->size != a->size)
      fail("address round trip refused");
  }
  // What a rank would publish (a host of the input's bytes other than spaces and control bytes, a
  // port and a size from the choice byte) is read back as written.
  tcpd::published_address made{"", 1 + static_cast<int>(choice * 257u % 65535u), static_cast<int>(choice % 9)};
  for (const char c : text)
    if (static_cast<unsigned char>(c) > ' ' && c != 0x7f && made.host.size() < 64) made.host += c;
  if (made.host.empty()) made.host = "h";
  const auto back = tcpd::parse_address(tcpd::format_address(made));
  if (!back || back->host != made.host || back->port != made.port || back->size != made.size)
    fail("a well-formed address refused or misread");
  return 0;
}
