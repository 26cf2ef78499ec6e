/// @file
/// The little of the CUDA runtime that cohort's device code and its users need, with no CUDA
/// header: device discovery, device memory, streams and events, all as RAII types that throw
/// `cohort::error` (`errc::cuda_error`, with the CUDA text). The CUDA IPC communicator
/// (cuda/ipc.hpp) uses the same `event` for its interprocess events.
///
/// ```cpp
/// if (cohort::cuda::device_count() == 0) return;        // no GPU: nothing to do
/// cohort::cuda::stream s;
/// cohort::cuda::device_buffer<float> grads(n);         // cudaMalloc, freed by the destructor
/// cohort::cuda::copy(grads.data(), host.data(), n, s); // any direction, stream-ordered
/// ```
/// Link `cohort_cuda_dep`.
#pragma once

#include <cohort/cuda/detail/abi.hpp>
#include <cohort/cuda/error.hpp>
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>

namespace cohort::cuda {

/// A CUDA stream as the kernels take it (`cudaStream_t`; nullptr is the legacy default stream).
using stream_t = CUstream_st*;

/// The number of CUDA devices this process can use: 0 where there is none, or no driver (then
/// `why`, when given, receives the CUDA runtime's reason). Never throws.
inline int device_count(std::string* why = nullptr) noexcept {
  int count = 0;
  const int e = cohort_cuda_device_count(&count);
  if (e != 0 && why != nullptr) {
    try {
      *why = error_text(e);
    } catch (...) {
    }
  }
  return e != 0 ? 0 : count;
}

/// The calling thread's current device.
inline int current_device() {
  int d = 0;
  check(cohort_cuda_get_device(&d), "cuda::current_device", "cudaGetDevice");
  return d;
}

/// Makes `device` current for the calling thread.
inline void set_device(int device) {
  check(cohort_cuda_set_device(device), "cuda::set_device", "cudaSetDevice");
}

/// Makes a device current for a scope and restores the previous one after it.
class device_scope {
 public:
  /// Switches to `device` (no-op when it is already current).
  explicit device_scope(int device) : previous_(current_device()) {
    if (device != previous_) set_device(device);
  }
  ~device_scope() { cohort_cuda_set_device(previous_); }
  device_scope(const device_scope&) = delete;
  device_scope& operator=(const device_scope&) = delete;

 private:
  int previous_;
};

/// `n` elements of device memory from `cudaMalloc` (so CUDA IPC can share it); move-only.
template <class T>
class device_buffer {
 public:
  /// No memory.
  device_buffer() = default;
  /// Allocates `n` elements on the current device (uninitialized).
  explicit device_buffer(std::size_t n) : size_(n) {
    if (n == 0) return;
    void* p = nullptr;
    check(cohort_cuda_malloc(&p, n * sizeof(T)), "cuda::device_buffer",
          "cudaMalloc of " + std::to_string(n * sizeof(T)) + " bytes");
    data_ = static_cast<T*>(p);
  }
  device_buffer(device_buffer&& o) noexcept
      : data_(std::exchange(o.data_, nullptr)), size_(std::exchange(o.size_, 0)) {}
  device_buffer& operator=(device_buffer&& o) noexcept {
    std::swap(data_, o.data_);
    std::swap(size_, o.size_);
    return *this;
  }
  /// Frees (cudaFree waits for the device to be done with it).
  ~device_buffer() {
    if (data_ != nullptr) cohort_cuda_free(data_);
  }

  /// The device pointer.
  T* data() const noexcept { return data_; }
  /// Elements.
  std::size_t size() const noexcept { return size_; }
  /// Bytes.
  std::size_t bytes() const noexcept { return size_ * sizeof(T); }

 private:
  T* data_ = nullptr;
  std::size_t size_ = 0;
};

/// A non-blocking CUDA stream on the current device; move-only.
class stream {
 public:
  /// Creates the stream.
  stream() { check(cohort_cuda_stream_create(&s_), "cuda::stream", "cudaStreamCreateWithFlags"); }
  stream(stream&& o) noexcept : s_(std::exchange(o.s_, nullptr)) {}
  stream& operator=(stream&& o) noexcept {
    std::swap(s_, o.s_);
    return *this;
  }
  ~stream() {
    if (s_ != nullptr) cohort_cuda_stream_destroy(s_);
  }
  /// The `cudaStream_t`.
  stream_t get() const noexcept { return s_; }
  operator stream_t() const noexcept { return s_; }  // NOLINT: used where a cudaStream_t goes
  /// Waits until every operation on it has finished.
  void synchronize() const {
    check(cohort_cuda_stream_synchronize(s_), "cuda::stream", "cudaStreamSynchronize");
  }

 private:
  stream_t s_ = nullptr;
};

/// A CUDA event; move-only. The default constructor makes one that can time; the CUDA IPC
/// communicator makes interprocess ones (`create_interprocess`, `open_interprocess`).
class event {
 public:
  /// Creates an event that can time.
  event() { check(cohort_cuda_event_create(&e_, 1), "cuda::event", "cudaEventCreate"); }
  /// Holds no event yet: `create_interprocess` or `open_interprocess` makes one.
  explicit event(std::nullptr_t) noexcept {}
  event(const event&) = delete;
  event& operator=(const event&) = delete;
  event(event&& o) noexcept : e_(std::exchange(o.e_, nullptr)) {}
  event& operator=(event&& o) noexcept {
    std::swap(e_, o.e_);
    return *this;
  }
  ~event() { reset(); }

  /// Replaces the event by an interprocess one (no timing) and writes its 64-byte handle
  /// (cudaIpcEventHandle_t) to `handle64`. Returns the cudaError_t value, 0 on success: the
  /// CUDA IPC setup exchanges every rank's outcome before any rank throws.
  int create_interprocess(std::byte* handle64) noexcept {
    reset();
    return cohort_cuda_ipc_event_create(&e_, handle64);
  }
  /// Replaces the event by a peer's interprocess event, from its handle. Returns as above.
  int open_interprocess(const std::byte* handle64) noexcept {
    reset();
    return cohort_cuda_ipc_event_open(&e_, handle64);
  }

  /// The `cudaEvent_t`, or null when there is none.
  void* get() const noexcept { return e_; }
  /// Records it on `s`.
  void record(stream_t s) {
    check(cohort_cuda_event_record(e_, s), "cuda::event", "cudaEventRecord");
  }
  /// Waits for it.
  void synchronize() const {
    check(cohort_cuda_event_synchronize(e_), "cuda::event", "cudaEventSynchronize");
  }
  /// Milliseconds from `start` to this event (both recorded and complete; both timing events).
  float since(const event& start) const {
    float ms = 0;
    check(cohort_cuda_event_elapsed_ms(&ms, start.e_, e_), "cuda::event", "cudaEventElapsedTime");
    return ms;
  }

 private:
  void reset() noexcept {
    if (e_ != nullptr) cohort_cuda_event_destroy(std::exchange(e_, nullptr));
  }
  void* e_ = nullptr;
};

/// Copies `n` elements from `src` to `dst` (host or device, either way) in stream order.
template <class T>
void copy(T* dst, const T* src, std::size_t n, stream_t s) {
  check(cohort_cuda_memcpy(dst, src, n * sizeof(T), s), "cuda::copy", "cudaMemcpyAsync");
}

/// Waits for every operation on every stream of the current device.
inline void synchronize_device() {
  check(cohort_cuda_device_synchronize(), "cuda::synchronize_device", "cudaDeviceSynchronize");
}

}  // namespace cohort::cuda
