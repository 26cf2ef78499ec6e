/// @file
/// The machinery behind `cohort::cuda_ipc_communicator`: the records ranks exchange over the
/// host communicator, the partition of a buffer among its owners, the caches of exported and
/// mapped allocations (the interprocess events are `cuda::event`). Plain C++: CUDA is reached
/// through cohort/cuda/detail/abi.hpp only.
#pragma once

#include <algorithm>
#include <cohort/core/buffer.hpp>
#include <cohort/core/dtype.hpp>
#include <cohort/core/ops.hpp>
#include <cohort/cuda/detail/abi.hpp>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

namespace cohort::detail::cuda_ipc {

inline constexpr std::uint32_t setup_magic = 0x43495053;  // "CIPS"
inline constexpr std::uint32_t call_magic = 0x43495043;   // "CIPC"
inline constexpr std::uint32_t protocol_version = 1;
inline constexpr std::size_t handle_bytes = 64;

/// What each rank tells every other when the communicator is built.
struct setup_record {
  std::uint32_t magic = setup_magic;
  std::uint32_t version = protocol_version;
  std::int32_t status = 0;  ///< cudaError_t of this rank's setup; 0 when it is ready.
  std::int32_t device = -1;
  std::byte ready_event[handle_bytes]{};  ///< Recorded when a call's buffers are ready.
  std::byte done_event[handle_bytes]{};   ///< Recorded when this rank's kernel is done.
};
static_assert(std::is_trivially_copyable_v<setup_record> && sizeof(setup_record) == 144);

/// Why a rank cannot take part in a call, besides a CUDA error.
enum class problem : std::int32_t {
  none = 0,
  not_device_memory = 1,  ///< The driver does not know the pointer (host memory, freed).
  not_shareable = 2,      ///< Device memory, but not from cudaMalloc (pools, managed, VMM).
  other_device = 3,       ///< Allocated on another device than the communicator's.
  cuda = 4,               ///< A CUDA call failed: `status` says which error.
};

/// One of a rank's buffers as its peers map it.
struct buffer_ref {
  std::uint64_t buffer_id = 0;    ///< The allocation's process-unique id; 0: no buffer (n == 0).
  std::uint64_t offset = 0;       ///< Of the buffer from the allocation's start.
  std::uint64_t alloc_bytes = 0;  ///< Size of the allocation.
  std::byte handle[handle_bytes]{};
};

/// What each rank announces at the start of a collective call: the call, for the check that
/// every rank called the same one, and where its buffers are.
struct call_record {
  std::uint32_t magic = call_magic;
  std::uint8_t kind = 1;  ///< 1: all_reduce.
  std::uint8_t type = 0;  ///< dtype
  std::uint16_t reserved = 0;
  std::uint64_t sequence = 0;
  std::uint64_t count = 0;
  std::uint32_t op_tag = 0;
  problem trouble = problem::none;
  std::int32_t status = 0;  ///< cudaError_t with problem::cuda
  std::int32_t which = 0;   ///< What `trouble` concerns: 0 input, 1 output, 2 stream
  buffer_ref in, out;
};
static_assert(std::is_trivially_copyable_v<call_record>);

/// Whether two records describe the same call (everything but the buffers and the status).
inline bool same_call(const call_record& a, const call_record& b) noexcept {
  return a.magic == b.magic && a.kind == b.kind && a.type == b.type && a.sequence == b.sequence &&
         a.count == b.count && a.op_tag == b.op_tag;
}

/// "all_reduce #3 with 1024 f32 sum".
inline std::string describe(const call_record& r) {
  if (r.magic != call_magic) return "a malformed CUDA IPC call record";
  std::string s = r.kind == 1 ? "all_reduce" : "collective " + std::to_string(r.kind);
  s += " #" + std::to_string(r.sequence) + " with " + std::to_string(r.count) + " ";
  s += dtype_name(static_cast<dtype>(r.type));
  s += " ";
  const std::string_view op = builtin_reduction_name(r.op_tag);
  s += op.empty() ? std::string_view("?") : op;
  return s;
}

/// Why a record's rank cannot take part ("" when it can); `cuda_text` renders a CUDA error.
template <class CudaText>
std::string trouble_text(const call_record& r, CudaText cuda_text) {
  const std::string which = r.which == 0 ? "input" : r.which == 1 ? "output" : "stream";
  switch (r.trouble) {
    case problem::none:
      return {};
    case problem::not_device_memory:
      return "its " + which + " is not device memory the CUDA driver knows";
    case problem::not_shareable:
      return "its " + which +
             " cannot be shared through CUDA IPC (allocate it with cudaMalloc; "
             "stream-ordered pools, managed and VMM memory cannot be)";
    case problem::other_device:
      return "its " + which + " lives on another device than its communicator";
    case problem::cuda:
      return "a CUDA call on its " + which + " failed: " + cuda_text(r.status);
  }
  return "an unknown problem";
}

/// Elements [begin, end) of n that `rank` of `size` reduces: near-equal parts in rank order,
/// cut at multiples of `unit` elements so that every part starts 16-byte aligned (when the
/// buffer does).
struct range {
  std::size_t begin = 0, end = 0;
};
inline range owned_range(std::size_t n, int size, int rank, std::size_t unit) noexcept {
  const std::size_t units = (n + unit - 1) / unit;
  const block b = block_of(units, size, rank);
  return {std::min(b.offset * unit, n), std::min((b.offset + b.count) * unit, n)};
}

/// The IPC handles of this rank's allocations, by buffer id (asking the driver once each).
class exports {
 public:
  explicit exports(std::size_t capacity) : capacity_(std::max<std::size_t>(capacity, 1)) {}

  /// Fills `ref` for `bytes` bytes at `p`, on `device`; returns the problem, if any.
  problem describe(const void* p, std::size_t bytes, int device, buffer_ref& ref, int& status) {
    cohort_cuda_pointer_info info{};
    status = cohort_cuda_pointer_get_info(p, &info);
    if (status != 0) return problem::not_device_memory;
    if (info.ipc_capable == 0) return problem::not_shareable;
    if (info.device != device) return problem::other_device;
    const auto at = reinterpret_cast<std::uintptr_t>(p);
    if (at < info.base || at - info.base + bytes > info.size) return problem::not_device_memory;
    ref.buffer_id = info.buffer_id;
    ref.offset = at - info.base;
    ref.alloc_bytes = info.size;
    for (const auto& e : entries_) {
      if (e.id == info.buffer_id) {
        std::memcpy(ref.handle, e.handle, handle_bytes);
        return problem::none;
      }
    }
    entry e{info.buffer_id, {}};
    status = cohort_cuda_ipc_get_mem_handle(e.handle, reinterpret_cast<const void*>(info.base));
    if (status != 0) return problem::cuda;
    if (entries_.size() >= capacity_) entries_.erase(entries_.begin());  // the oldest
    entries_.push_back(e);
    std::memcpy(ref.handle, e.handle, handle_bytes);
    return problem::none;
  }

 private:
  struct entry {
    std::uint64_t id;
    std::byte handle[handle_bytes];
  };
  std::vector<entry> entries_;
  std::size_t capacity_;
};

/// The peers' allocations mapped into this process, by (peer, buffer id), least recently used
/// evicted beyond `capacity` per peer. A mapping keeps the peer's memory alive until closed.
class mappings {
 public:
  mappings(int peers, std::size_t capacity)
      : peers_(static_cast<std::size_t>(peers)), capacity_(std::max<std::size_t>(capacity, 1)) {}
  mappings(const mappings&) = delete;
  mappings& operator=(const mappings&) = delete;
  /// Waits for the device (kernels may still read the mappings), then closes them all.
  ~mappings() {
    if (abandoned_) return;
    bool any = false;
    for (const auto& v : peers_) any = any || !v.empty();
    if (!any) return;
    cohort_cuda_device_synchronize();
    for (auto& v : peers_)
      for (const auto& e : v) cohort_cuda_ipc_close_mem_handle(e.base);
  }

  /// Forgets the mappings without waiting or closing them (they go with the process).
  void abandon() noexcept { abandoned_ = true; }

  /// The address of `ref` of `peer` in this process; opens the allocation on first sight.
  int open(int peer, const buffer_ref& ref, std::byte*& at) {
    auto& v = peers_[static_cast<std::size_t>(peer)];
    ++clock_;
    for (auto& e : v) {
      if (e.id == ref.buffer_id) {
        e.last_use = clock_;
        at = static_cast<std::byte*>(e.base) + ref.offset;
        return 0;
      }
    }
    if (v.size() >= capacity_) {
      // Rare: a peer cycles through more allocations than we keep. Kernels of earlier calls may
      // still read the mapping, so wait for the device before closing it.
      if (const int e = cohort_cuda_device_synchronize()) return e;
      auto lru = std::min_element(v.begin(), v.end(), [](const entry& a, const entry& b) {
        return a.last_use < b.last_use;
      });
      cohort_cuda_ipc_close_mem_handle(lru->base);
      v.erase(lru);
    }
    void* base = nullptr;
    if (const int e = cohort_cuda_ipc_open_mem_handle(&base, ref.handle)) return e;
    v.push_back({ref.buffer_id, base, clock_});
    at = static_cast<std::byte*>(base) + ref.offset;
    return 0;
  }

 private:
  struct entry {
    std::uint64_t id;
    void* base;
    std::uint64_t last_use;
  };
  std::vector<std::vector<entry>> peers_;
  std::size_t capacity_;
  std::uint64_t clock_ = 0;
  bool abandoned_ = false;
};

}  // namespace cohort::detail::cuda_ipc
