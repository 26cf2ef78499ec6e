/// @file
/// The parameter server's wire format and shard layout (internal).
///
/// Between each worker and each server the transport carries one FIFO stream each way. The
/// worker sends requests (a 56-byte header, then for a push the shard's gradient as f32 or in the
/// push codec's encoding); the server answers every push and every pull, in the order they came,
/// with a 24-byte reply (for a pull followed by the shard's weights as f32, only when the status is
/// ok). A worker leaving sends `bye` and gets no reply.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace cohort::ps::detail {

inline constexpr std::uint32_t request_magic = 0x50534331;  // "PSC1"

enum class op : std::uint32_t { push = 1, pull = 2, bye = 3 };

/// A request header; `count` is the number of f32 elements of the shard that follow (push) or
/// that the worker expects back (pull). `step` is the worker's count of earlier pushes of `key`.
struct request_header {
  std::uint32_t magic = request_magic;
  op kind = op::bye;
  std::uint64_t key = 0;
  std::uint64_t step = 0;
  std::uint64_t offset = 0;  ///< First element of the shard within the key.
  std::uint64_t count = 0;
  std::uint32_t compressed = 0;  ///< 1: a push's payload is `bytes` of the codec's encoding.
  std::uint32_t reserved = 0;
  std::uint64_t bytes = 0;  ///< Payload bytes that follow (a push; count * 4 uncompressed).
};
static_assert(sizeof(request_header) == 56);

/// A reply header. `status` is a `cohort::errc` value (0: ok); `version` is the number of
/// updates applied to the shard so far.
struct reply_header {
  std::uint32_t status = 0;
  op kind = op::push;
  std::uint64_t version = 0;
  std::uint64_t count = 0;
};
static_assert(sizeof(reply_header) == 24);

/// The elements of a `count`-element key that server `s` of `servers` holds: [begin, end).
/// Every key is split in contiguous, even ranges over every server (sizes differ by at most
/// one element), so each server holds an even share of the bytes of every tensor.
struct shard_range {
  std::size_t begin = 0, end = 0;
  std::size_t size() const noexcept { return end - begin; }
};
inline shard_range shard_of(std::size_t count, int s, int servers) noexcept {
  const auto n = static_cast<std::size_t>(servers);
  const auto i = static_cast<std::size_t>(s);
  return {count * i / n, count * (i + 1) / n};
}

inline const char* op_name(op o) noexcept {
  switch (o) {
    case op::push:
      return "push";
    case op::pull:
      return "pull";
    case op::bye:
      return "finish";
  }
  return "request";
}

}  // namespace cohort::ps::detail
