/// @file
/// The byte ring that carries one ordered pair's stream through shared memory: one producer,
/// one consumer, two published counters, and the bytes in between cut into records.
///
/// Layout of a ring of `bytes` (a power of two) bytes, positions counted since the start and
/// taken modulo `bytes`:
///
///     head, inline copy (producer's block) | tail (consumer's block) | data: record ... record
///
/// A record is an 8-byte header {payload length, kind, payload offset} and its payload; each
/// record starts 8-byte aligned, payloads of 4 KiB and more start 64-byte aligned, and no
/// record runs past the end of the data (a `wrap` record fills the gap instead). The producer
/// writes records beyond `head` and then publishes them by storing `head` (release); the
/// consumer reads records below `head` and frees them by storing `tail`. A record stays in
/// place until the consumer has read all of it, which is what lets it lend views of the
/// payload. One send becomes one or more records: records split a send at multiples of 8 bytes,
/// so a view of one record never breaks an element of a size up to 8.
///
/// Tiny handoffs ride along with `head`: a batch of records of up to `inline_capacity` bytes
/// (a call header and a small payload are 56) is also copied next to `head`, in the block the
/// consumer must fetch anyway to see that `head` moved, so it never fetches the ring's line:
/// one cache-line transfer per handoff instead of two in a row. The copy is guarded like a
/// seqlock (`head` carries a busy bit while the copy is rewritten, and the consumer re-reads
/// `head` after copying); the records in the ring stay the reference, read whenever the copy
/// does not cover exactly what the consumer needs next.
#pragma once

#include <atomic>
#include <cassert>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include <cohort/core/detail/min.hpp>

namespace cohort::detail::shm {

/// The two published positions of one ring, each in its own 128-byte block (a cache line and
/// the neighbour the adjacent-line prefetcher fetches with it) so that producer and consumer
/// never write the same line; the producer's block also carries the inline copy.
struct ring_control {
  alignas(128) std::atomic<std::uint64_t> head;  ///< Bytes published by the producer, ever.
  std::atomic<std::uint64_t> inline_start;       ///< Ring bytes [inline_start, head) are ...
  std::byte inline_bytes[104];                   ///< ... copied here (`no_inline`: none).
  alignas(128) std::atomic<std::uint64_t> tail;  ///< Bytes freed by the consumer, ever.

  static constexpr std::uint64_t busy = std::uint64_t{1} << 63;  ///< In `head`: rewriting.
  static constexpr std::uint64_t no_inline = ~std::uint64_t{0};
  static constexpr std::size_t inline_capacity = sizeof inline_bytes;
};
static_assert(sizeof(ring_control) == 256);

/// The header in front of every record.
struct record_header {
  std::uint32_t bytes;           ///< Payload bytes (data records).
  std::uint16_t kind;            ///< `data` or `wrap` (skip to the start of the ring).
  std::uint16_t payload_offset;  ///< From the header to the payload: 8 to 64 bytes.
  static constexpr std::uint16_t data = 1, wrap = 2;
};
static_assert(sizeof(record_header) == 8);

inline constexpr std::size_t record_align = 8;
/// Payloads this long or longer start on a cache line: faster copies and reductions.
inline constexpr std::size_t line_aligned_payload = 4096;
/// A send is split at the end of the ring only if at least this much of it fits there; else
/// the end is skipped (a record this short is not worth its header).
inline constexpr std::size_t min_split = 256;

constexpr std::uint64_t round_up(std::uint64_t x, std::uint64_t a) { return (x + a - 1) / a * a; }

/// Copies `n` bytes with non-temporal stores where the target has them: the destination goes
/// to memory without being read first and without evicting the caches, which is faster for a
/// large buffer that will not be read again soon (about 1.5x here for DRAM-sized copies). Ends
/// with a store fence, so later ordinary stores and releases are ordered after the copy.
inline void stream_copy(std::byte* dst, const std::byte* src, std::size_t n) noexcept {
#if defined(__SSE2__)
  const std::size_t head = detail::min_of(n, static_cast<std::size_t>(
                                           (64 - reinterpret_cast<std::uintptr_t>(dst) % 64) % 64));
  std::memcpy(dst, src, head);
  dst += head, src += head, n -= head;
  std::size_t i = 0;
  for (; i + 64 <= n; i += 64) {
    const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i));
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i + 16));
    const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i + 32));
    const __m128i d = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i + 48));
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i), a);
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i + 16), b);
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i + 32), c);
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i + 48), d);
  }
  std::memcpy(dst + i, src + i, n - i);
  _mm_sfence();
#else
  std::memcpy(dst, src, n);
#endif
}

/// The producer's side of a ring (local state; only `head` is shared).
class tx_ring {
 public:
  tx_ring() = default;
  /// Attaches to a ring of `bytes` (a power of two) at `data`; records carry at most
  /// `record_max` payload bytes (a multiple of 8, at most a quarter of the ring).
  tx_ring(ring_control* ctl, std::byte* data, std::size_t bytes, std::size_t record_max) noexcept
      : ctl_(ctl), data_(data), bytes_(bytes), record_max_(record_max) {
    assert((bytes & (bytes - 1)) == 0 && record_max % record_align == 0 && 4 * record_max <= bytes);
  }

  /// Copies up to `n` bytes from `src` into new records, as far as the ring has room; returns
  /// how many it took (0 when the ring is full). Nothing is visible to the consumer before
  /// `publish()`.
  std::size_t write(const std::byte* src, std::size_t n) noexcept {
    std::size_t taken = 0;
    while (taken < n) {
      const std::uint64_t pos = head_ & (bytes_ - 1), to_end = bytes_ - pos;
      std::size_t len = detail::min_of<std::size_t>(n - taken, record_max_);
      std::uint64_t off = payload_offset(pos, len);
      if (off + len > to_end) {  // would run past the end: split there, or skip the end
        const std::uint64_t fit = to_end > off ? (to_end - off) / record_align * record_align : 0;
        if (fit >= min_split) {
          len = static_cast<std::size_t>(fit);
        } else {
          if (!room(to_end)) break;
          header_at(pos) = {0, record_header::wrap, 0};
          head_ += to_end;
          continue;
        }
      }
      if (!room(off + round_up(len, record_align))) {  // take what fits, if worth a record
        const std::uint64_t free = bytes_ - (head_ - tail_seen_);
        const std::uint64_t fit = free > off ? (free - off) / record_align * record_align : 0;
        if (fit < min_split) break;
        len = static_cast<std::size_t>(fit);
        off = payload_offset(pos, len);
        if (off + round_up(len, record_align) > free) break;
      }
      header_at(pos) = {static_cast<std::uint32_t>(len), record_header::data,
                        static_cast<std::uint16_t>(off)};
      std::memcpy(data_ + pos + off, src + taken, len);
      head_ += off + round_up(len, record_align);
      taken += len;
    }
    return taken;
  }

  /// True when records were written since the last `publish()`.
  bool dirty() const noexcept { return head_ != published_; }

  /// Makes every record written so far visible to the consumer.
  void publish() noexcept {
    const std::uint64_t batch = head_ - published_, pos = published_ & (bytes_ - 1);
    if (batch <= ring_control::inline_capacity && pos + batch <= bytes_) {
      ctl_->head.store(published_ | ring_control::busy, std::memory_order_relaxed);
      std::atomic_thread_fence(std::memory_order_release);  // busy before the rewrite
      std::memcpy(ctl_->inline_bytes, data_ + pos, batch);
      ctl_->inline_start.store(published_, std::memory_order_relaxed);
      inline_valid_ = true;
    } else if (inline_valid_) {
      ctl_->inline_start.store(ring_control::no_inline, std::memory_order_relaxed);
      inline_valid_ = false;
    }
    ctl_->head.store(head_, std::memory_order_release);
    published_ = head_;
  }

 private:
  static std::uint64_t payload_offset(std::uint64_t pos, std::size_t len) noexcept {
    if (len < line_aligned_payload) return sizeof(record_header);
    return round_up(pos + sizeof(record_header), 64) - pos;
  }
  record_header& header_at(std::uint64_t pos) noexcept {
    return *reinterpret_cast<record_header*>(data_ + pos);
  }
  // True when `need` bytes are free beyond head; looks at the consumer's tail only when the
  // last look said otherwise.
  bool room(std::uint64_t need) noexcept {
    if (bytes_ - (head_ - tail_seen_) >= need) return true;
    tail_seen_ = ctl_->tail.load(std::memory_order_acquire);
    return bytes_ - (head_ - tail_seen_) >= need;
  }

  ring_control* ctl_ = nullptr;
  std::byte* data_ = nullptr;
  std::uint64_t bytes_ = 0, record_max_ = 0;
  std::uint64_t head_ = 0, published_ = 0, tail_seen_ = 0;
  bool inline_valid_ = false;  // ctl_->inline_start names a batch
};

/// The consumer's side of a ring (local state; only `tail` is shared).
class rx_ring {
 public:
  rx_ring() = default;
  /// Attaches to a ring of `bytes` (a power of two) at `data`.
  rx_ring(ring_control* ctl, const std::byte* data, std::size_t bytes) noexcept
      : ctl_(ctl), data_(data), bytes_(bytes) {}

  /// The unread payload of the oldest record, or an empty span while none has arrived. It
  /// stays valid and in place until `consume()` reaches its end.
  std::span<const std::byte> peek() noexcept {
    if (current_ == nullptr && !next()) return {};
    return {reinterpret_cast<const std::byte*>(current_) + current_->payload_offset + offset_,
            current_->bytes - offset_};
  }

  /// Consumes the first `n` bytes of what `peek()` returned; frees the record once it is all
  /// read (for the producer to see after `publish()`).
  void consume(std::size_t n) noexcept {
    assert(current_ != nullptr && offset_ + n <= current_->bytes);
    offset_ += static_cast<std::uint32_t>(n);
    if (offset_ == current_->bytes) {
      tail_ += current_->payload_offset + round_up(current_->bytes, record_align);
      current_ = nullptr;
      offset_ = 0;
    }
  }

  /// True when the producer has published bytes past the record `peek()` returned last (a
  /// record never grows once published: what follows it comes in later records).
  bool followed() const noexcept {
    if (current_ == nullptr) return false;
    const std::uint64_t end =
        tail_ + current_->payload_offset + round_up(current_->bytes, record_align);
    return (ctl_->head.load(std::memory_order_acquire) & ~ring_control::busy) > end;
  }

  /// Bytes freed since the last `publish()`.
  std::uint64_t unpublished() const noexcept { return tail_ - published_; }

  /// Returns the freed records to the producer.
  void publish() noexcept {
    ctl_->tail.store(tail_, std::memory_order_release);
    published_ = tail_;
  }

 private:
  // Finds the next data record, skipping wraps; false when the producer published no more.
  bool next() noexcept {
    for (;;) {
      if (tail_ == head_seen_) {
        const std::uint64_t head = ctl_->head.load(std::memory_order_acquire);
        // While busy, `head` holds the last position published before, with the bit set.
        head_seen_ = head & ~ring_control::busy;
        if (head_seen_ == tail_) return false;
        if (head == head_seen_) take_inline();
      }
      const std::uint64_t pos = tail_ & (bytes_ - 1);
      const auto* h = reinterpret_cast<const record_header*>(
          tail_ < shadow_end_ ? shadow_ + (tail_ - shadow_begin_) : data_ + pos);
      if (h->kind == record_header::wrap) {
        tail_ += bytes_ - pos;
        continue;
      }
      assert(h->kind == record_header::data && h->bytes > 0);
      current_ = h;
      return true;
    }
  }

  // Copies the inline batch into the shadow if it is exactly [tail_, head_seen_) and was not
  // rewritten while we copied; else the records are read from the ring.
  void take_inline() noexcept {
    const std::uint64_t n = head_seen_ - tail_;
    if (n > ring_control::inline_capacity ||
        ctl_->inline_start.load(std::memory_order_relaxed) != tail_)
      return;
    std::memcpy(shadow_, ctl_->inline_bytes, n);
    std::atomic_thread_fence(std::memory_order_acquire);  // the copy before the re-check
    if (ctl_->head.load(std::memory_order_relaxed) != head_seen_) return;
    shadow_begin_ = tail_;
    shadow_end_ = head_seen_;
  }

  ring_control* ctl_ = nullptr;
  const std::byte* data_ = nullptr;
  std::uint64_t bytes_ = 0;
  std::uint64_t tail_ = 0, published_ = 0, head_seen_ = 0;
  const record_header* current_ = nullptr;
  std::uint32_t offset_ = 0;  // payload bytes of *current_ already consumed
  std::uint64_t shadow_begin_ = 0, shadow_end_ = 0;  // ring bytes held in shadow_
  alignas(64) std::byte shadow_[ring_control::inline_capacity];
};

}  // namespace cohort::detail::shm
