// Tensor storage, views and byte accounting.
#include "tensor/Tensor.h"

#include <cstdlib>
#include <iterator>
#include <map>
#include <mutex>
#include <numeric>

namespace dhelix {

size_t dtype_size(DType d) {
  switch (d) {
    case DType::kF32: return 4;
    case DType::kBF16: return 2;
    case DType::kF64: return 8;
    case DType::kI32: return 4;
    case DType::kI64: return 8;
    case DType::kU16: return 2;
  }
  return 0;
}

const char* dtype_name(DType d) {
  switch (d) {
    case DType::kF32: return "f32";
    case DType::kBF16: return "bf16";
    case DType::kF64: return "f64";
    case DType::kI32: return "i32";
    case DType::kI64: return "i64";
    case DType::kU16: return "u16";
  }
  return "?";
}

int64_t shape_numel(const Shape& s) {
  return std::accumulate(s.begin(), s.end(), int64_t{1}, std::multiplies<int64_t>());
}

std::string shape_str(const Shape& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) {  // two appends: g++ 12 -O3 warns (-Wrestrict) on `"," + string`
    if (i) out += ',';
    out += std::to_string(s[i]);
  }
  return out + "]";
}

namespace {

// Freed host blocks of kMinBytes and more, kept for reuse. glibc serves such blocks with mmap and
// gives them back with munmap, so without this every step page-faults its logits, their gradient
// and its activations in afresh (measured on the GPT-2 LM head: its 206 MB output written by the
// bf16 GEMM in 0.13 s into a used buffer, 0.55 s into a fresh one). A request takes the smallest
// cached block that is at least its size and wastes at most an eighth of it; beyond kCapBytes of
// free blocks the largest are released. Off under AddressSanitizer, which should see every free.
class HostBlockCache {
 public:
  static constexpr size_t kMinBytes = size_t{1} << 20;
  static constexpr size_t kCapBytes = size_t{2} << 30;
  static FreeBlocks<void (*)(void*)>& get() {
    // Never destroyed: tensors may outlive statics.
    static auto* c = new FreeBlocks<void (*)(void*)>(kCapBytes, [](void* p) { std::free(p); });
    return *c;
  }
  static bool enabled() {
#if defined(__SANITIZE_ADDRESS__)
    return false;
#else
    return true;
#endif
  }
};

}  // namespace

HostCacheStats host_cache_stats() { return HostBlockCache::get().stats(); }

Storage::Storage(size_t bytes, MemoryTracker* tracker, Device device, StreamHandle stream)
    : bytes_(bytes), tracker_(tracker), device_(device), stream_(stream) {
  capacity_ = bytes == 0 ? 64 : ((bytes + 63) / 64) * 64;
  if (!device.is_host()) {
    data_ = device_alloc(device, capacity_, stream);
    if (tracker_) tracker_->add(static_cast<int64_t>(bytes_));
    return;
  }
  const bool cached = capacity_ >= HostBlockCache::kMinBytes && HostBlockCache::enabled();
  if (cached) data_ = HostBlockCache::get().take(capacity_, &capacity_);
  if (data_ == nullptr) data_ = std::aligned_alloc(64, capacity_);
  DHX_CHECK(data_ != nullptr, Error, "out of host memory allocating {} bytes", bytes);
  if (tracker_) tracker_->add(static_cast<int64_t>(bytes_));
}

Storage::Storage(size_t bytes, Pinned) : bytes_(bytes) {
  data_ = pinned_alloc(bytes == 0 ? 1 : bytes, &capacity_);
  if (data_ != nullptr) {
    pinned_ = true;
    return;
  }
  capacity_ = bytes == 0 ? 64 : ((bytes + 63) / 64) * 64;
  data_ = std::aligned_alloc(64, capacity_);
  DHX_CHECK(data_ != nullptr, Error, "out of host memory allocating {} bytes", bytes);
}

Storage::~Storage() {
  if (pinned_) {
    pinned_free(data_, capacity_);
    return;
  }
  if (!device_.is_host()) {
    try {
      device_free(device_, data_, stream_, capacity_);
    } catch (const Error&) {  // a destructor must not throw; the pool keeps the block
    }
    if (tracker_) tracker_->sub(static_cast<int64_t>(bytes_));
    return;
  }
  if (capacity_ >= HostBlockCache::kMinBytes && HostBlockCache::enabled())
    HostBlockCache::get().give(data_, capacity_);
  else
    std::free(data_);
  if (tracker_) tracker_->sub(static_cast<int64_t>(bytes_));
}

Tensor Tensor::empty(const Shape& shape, DType dtype, MemoryTracker* tracker, Device device, StreamHandle stream) {
  for (int64_t d : shape) DHX_CHECK(d >= 0, InternalError, "negative extent in shape {}", shape_str(shape));
  Tensor t;
  t.shape_ = shape;
  t.dtype_ = dtype;
  t.storage_ =
      std::make_shared<Storage>(static_cast<size_t>(shape_numel(shape)) * dtype_size(dtype), tracker, device, stream);
  return t;
}

Tensor Tensor::empty_pinned(const Shape& shape, DType dtype) {
  for (int64_t d : shape) DHX_CHECK(d >= 0, InternalError, "negative extent in shape {}", shape_str(shape));
  Tensor t;
  t.shape_ = shape;
  t.dtype_ = dtype;
  t.storage_ = std::make_shared<Storage>(static_cast<size_t>(shape_numel(shape)) * dtype_size(dtype), Storage::Pinned{});
  return t;
}

Tensor Tensor::zeros(const Shape& shape, DType dtype, MemoryTracker* tracker) {
  Tensor t = empty(shape, dtype, tracker);
  t.zero_();
  return t;
}

Tensor Tensor::view(const Shape& shape) const {
  DHX_CHECK(shape_numel(shape) == numel(), InternalError, "view {} of {} changes the element count",
            shape_str(shape), describe());
  Tensor t = *this;
  t.shape_ = shape;
  return t;
}

Tensor Tensor::narrow0(int64_t start, int64_t len) const {
  DHX_CHECK(ndim() >= 1 && start >= 0 && len >= 0 && start + len <= shape_[0], InternalError,
            "narrow0({}, {}) out of range for {}", start, len, describe());
  int64_t row = numel() / (shape_[0] == 0 ? 1 : shape_[0]);
  Tensor t = *this;
  t.shape_[0] = len;
  t.offset_bytes_ += static_cast<size_t>(start * row) * dtype_size(dtype_);
  return t;
}

Tensor Tensor::clone(MemoryTracker* tracker) const {
  Tensor t = empty(shape_, dtype_, tracker, device(), storage_ ? storage_->stream() : nullptr);
  t.copy_from(*this);
  return t;
}

Tensor Tensor::to(Device d, MemoryTracker* tracker, StreamHandle stream) const {
  if (d == device()) return *this;
  Tensor t = empty(shape_, dtype_, tracker, d, stream);
  t.copy_from(*this);
  return t;
}

void Tensor::zero_() {
  if (!nbytes()) return;
  if (device().is_host()) std::memset(raw(), 0, nbytes());
  else device_zero(device(), raw(), nbytes(), storage_->stream());
}

void Tensor::copy_from(const Tensor& src) {
  DHX_CHECK(src.numel() == numel() && src.dtype() == dtype_, InternalError, "copy {} into {}",
            src.describe(), describe());
  if (!nbytes()) return;
  if (device().is_host() && src.device().is_host()) std::memcpy(raw(), src.raw(), nbytes());
  else device_copy(raw(), device(), src.raw(), src.device(), nbytes(),
                   device().is_host() ? src.storage_->stream() : storage_->stream());
}

}  // namespace dhelix
