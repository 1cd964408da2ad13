// Tensor storage, views and byte accounting.
#include "tensor/Tensor.h"

#include <cstdlib>
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

Storage::Storage(size_t bytes, MemoryTracker* tracker) : bytes_(bytes), tracker_(tracker) {
  size_t rounded = ((bytes + 63) / 64) * 64;
  data_ = std::aligned_alloc(64, rounded == 0 ? 64 : rounded);
  DHX_CHECK(data_ != nullptr, Error, "out of host memory allocating {} bytes", bytes);
  if (tracker_) tracker_->add(static_cast<int64_t>(bytes_));
}

Storage::~Storage() {
  std::free(data_);
  if (tracker_) tracker_->sub(static_cast<int64_t>(bytes_));
}

Tensor Tensor::empty(const Shape& shape, DType dtype, MemoryTracker* tracker) {
  for (int64_t d : shape) DHX_CHECK(d >= 0, InternalError, "negative extent in shape {}", shape_str(shape));
  Tensor t;
  t.shape_ = shape;
  t.dtype_ = dtype;
  t.storage_ = std::make_shared<Storage>(static_cast<size_t>(shape_numel(shape)) * dtype_size(dtype), tracker);
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
  Tensor t = empty(shape_, dtype_, tracker);
  std::memcpy(t.raw(), raw(), nbytes());
  return t;
}

void Tensor::zero_() {
  if (nbytes()) std::memset(raw(), 0, nbytes());
}

void Tensor::copy_from(const Tensor& src) {
  DHX_CHECK(src.numel() == numel() && src.dtype() == dtype_, InternalError, "copy {} into {}",
            src.describe(), describe());
  if (nbytes()) std::memcpy(raw(), src.raw(), nbytes());
}

}  // namespace dhelix
