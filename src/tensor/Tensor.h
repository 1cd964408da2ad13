// Tensor: a typed, contiguous, row-major view into shared storage. Storage may be charged to a
// MemoryTracker, which then accounts every live byte (current and peak) — this is how the
// activation arena reports peak activation memory with and without Strand Interleaving.
// Every tensor knows its Device (Device.h): host memory, or a GPU's through the caching device
// allocator of a CUDA build (DeviceMemory.h; a build without CUDA answers DeviceError). A device
// tensor's bytes are read by kernels on its device only; copy_from and to() move bytes between
// devices. Not here: autograd, strides.
#pragma once
#include <atomic>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "base/Error.h"
#include "tensor/Device.h"
#include "tensor/BlockCache.h"
#include "tensor/DeviceMemory.h"

namespace dhelix {

enum class DType { kF32, kBF16, kF64, kI32, kI64, kU16 };

size_t dtype_size(DType d);
const char* dtype_name(DType d);

using Shape = std::vector<int64_t>;
int64_t shape_numel(const Shape& s);
std::string shape_str(const Shape& s);

// Counts live bytes of the storages charged to it; thread-safe.
class MemoryTracker {
 public:
  explicit MemoryTracker(std::string name = "memory") : name_(std::move(name)) {}
  void add(int64_t bytes) {
    int64_t now = current_.fetch_add(bytes) + bytes;
    int64_t p = peak_.load();
    while (now > p && !peak_.compare_exchange_weak(p, now)) {}
  }
  void sub(int64_t bytes) { current_.fetch_sub(bytes); }
  int64_t current() const { return current_.load(); }
  int64_t peak() const { return peak_.load(); }
  void reset_peak() { peak_.store(current_.load()); }
  const std::string& name() const { return name_; }

 private:
  std::string name_;
  std::atomic<int64_t> current_{0};
  std::atomic<int64_t> peak_{0};
};

// 64-byte aligned host buffer; releases its bytes from the tracker on destruction. Buffers of
// 1 MiB and more are recycled (Tensor.cc, HostBlockCache): freed into a process-wide cache, reused
// by the next allocation of about their size, so a training step does not page-fault its large
// tensors in again every step.
// On a GPU, the bytes come from the device allocator ordered on `stream` (the stream that first
// uses them) and go back to it ordered on the same stream.
class Storage {
 public:
  Storage(size_t bytes, MemoryTracker* tracker, Device device = Device::host(), StreamHandle stream = nullptr);
  // Host bytes, page-locked where pinned_alloc can give them (pinned() says), else ordinary.
  struct Pinned {};
  Storage(size_t bytes, Pinned);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;
  void* data() { return data_; }
  size_t bytes() const { return bytes_; }
  Device device() const { return device_; }
  StreamHandle stream() const { return stream_; }
  bool pinned() const { return pinned_; }

 private:
  void* data_ = nullptr;
  size_t bytes_ = 0, capacity_ = 0;  // asked for; allocated (64-byte multiple, or a cached block's)
  MemoryTracker* tracker_ = nullptr;
  Device device_;
  StreamHandle stream_ = nullptr;
  bool pinned_ = false;  // data_ is pinned_alloc's
};

// The host block cache's figures, for tests and benchmarks.
// (hits, misses: allocations of >= 1 MiB served from the cache / from malloc; cached_bytes: free.)
using HostCacheStats = BlockCacheStats;
HostCacheStats host_cache_stats();

class Tensor {
 public:
  Tensor() = default;
  // On `device` (DeviceError for one this build or machine cannot allocate on); a GPU tensor's
  // bytes are ordered on `stream` (DeviceMemory.h).
  static Tensor empty(const Shape& shape, DType dtype = DType::kF32, MemoryTracker* tracker = nullptr,
                      Device device = Device::host(), StreamHandle stream = nullptr);
  static Tensor zeros(const Shape& shape, DType dtype = DType::kF32, MemoryTracker* tracker = nullptr);
  // A host tensor for staging copies to and from a GPU: page-locked where the machine allows
  // (pinned_alloc; is_pinned()), else an ordinary host tensor. Not charged to a tracker.
  static Tensor empty_pinned(const Shape& shape, DType dtype);
  bool is_pinned() const { return storage_ && storage_->pinned(); }

  bool defined() const { return storage_ != nullptr; }
  Device device() const { return storage_ ? storage_->device() : Device::host(); }
  const Shape& shape() const { return shape_; }
  int64_t dim(int i) const { return shape_.at(i < 0 ? shape_.size() + i : i); }
  int ndim() const { return static_cast<int>(shape_.size()); }
  int64_t numel() const { return shape_numel(shape_); }
  DType dtype() const { return dtype_; }
  size_t nbytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype_); }

  void* raw() const { return static_cast<char*>(storage_->data()) + offset_bytes_; }
  template <typename T> T* data() const { return static_cast<T*>(raw()); }
  float* f32() const { check_dtype(DType::kF32); return data<float>(); }

  // Same storage, new shape with the same element count.
  Tensor view(const Shape& shape) const;
  // Rows [start, start+len) along dimension 0 (contiguous), sharing storage.
  Tensor narrow0(int64_t start, int64_t len) const;
  // Deep copy on the same device (charged to `tracker`).
  Tensor clone(MemoryTracker* tracker = nullptr) const;
  // A copy on `device` (this tensor itself when it is there already).
  Tensor to(Device device, MemoryTracker* tracker = nullptr, StreamHandle stream = nullptr) const;
  void zero_();
  // Bytes of src (same dtype and element count), from any device to any device.
  void copy_from(const Tensor& src);
  // Storage identity, for debugging aliasing.
  const void* storage_id() const { return storage_.get(); }

  std::string describe() const { return fmt::format("{}{}", dtype_name(dtype_), shape_str(shape_)); }

 private:
  void check_dtype(DType d) const {
    DHX_CHECK(dtype_ == d, InternalError, "tensor {} accessed as {}", describe(), dtype_name(d));
  }
  std::shared_ptr<Storage> storage_;
  size_t offset_bytes_ = 0;
  Shape shape_;
  DType dtype_ = DType::kF32;
};

// bf16 <-> f32 (round to nearest even).
inline uint16_t f32_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);  // NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}
inline float bf16_to_f32(uint16_t h) {
  uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

}  // namespace dhelix
