// Typed folds behind reduce_buffers, combine_into and bf16_combine.
#include "comm/Reduce.h"

#include <algorithm>

namespace dhelix {
namespace {

template <typename T>
T apply(T a, T b, ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return static_cast<T>(a + b);
    case ReduceOp::kMax: return std::max(a, b);
    case ReduceOp::kMin: return std::min(a, b);
  }
  return a;
}

template <typename T>
void fold(const std::vector<const void*>& srcs, void* dst, int64_t n, ReduceOp op) {
  T* out = static_cast<T*>(dst);
  const T* first = static_cast<const T*>(srcs[0]);
  std::vector<T> acc(first, first + n);  // srcs may alias dst
  for (size_t s = 1; s < srcs.size(); ++s) {
    const T* in = static_cast<const T*>(srcs[s]);
    for (int64_t i = 0; i < n; ++i) acc[static_cast<size_t>(i)] = apply(acc[static_cast<size_t>(i)], in[i], op);
  }
  std::copy(acc.begin(), acc.end(), out);
}

void fold_bf16(const std::vector<const void*>& srcs, void* dst, int64_t n, ReduceOp op) {
  std::vector<float> acc(static_cast<size_t>(n));
  const uint16_t* first = static_cast<const uint16_t*>(srcs[0]);
  for (int64_t i = 0; i < n; ++i) acc[static_cast<size_t>(i)] = bf16_to_f32(first[i]);
  for (size_t s = 1; s < srcs.size(); ++s) {
    const uint16_t* in = static_cast<const uint16_t*>(srcs[s]);
    for (int64_t i = 0; i < n; ++i) acc[static_cast<size_t>(i)] = apply(acc[static_cast<size_t>(i)], bf16_to_f32(in[i]), op);
  }
  uint16_t* out = static_cast<uint16_t*>(dst);
  for (int64_t i = 0; i < n; ++i) out[i] = f32_to_bf16(acc[static_cast<size_t>(i)]);
}

template <typename T>
void combine(const void* in, void* inout, int64_t n, ReduceOp op) {
  const T* a = static_cast<const T*>(in);
  T* b = static_cast<T*>(inout);
  switch (op) {
    case ReduceOp::kSum:
      for (int64_t i = 0; i < n; ++i) b[i] = static_cast<T>(a[i] + b[i]);
      return;
    case ReduceOp::kMax:
      for (int64_t i = 0; i < n; ++i) b[i] = std::max(a[i], b[i]);
      return;
    case ReduceOp::kMin:
      for (int64_t i = 0; i < n; ++i) b[i] = std::min(a[i], b[i]);
      return;
  }
}

}  // namespace

void combine_into(const void* in, void* inout, int64_t n, DType dtype, ReduceOp op) {
  switch (dtype) {
    case DType::kF32: return combine<float>(in, inout, n, op);
    case DType::kF64: return combine<double>(in, inout, n, op);
    case DType::kI32: return combine<int32_t>(in, inout, n, op);
    case DType::kI64: return combine<int64_t>(in, inout, n, op);
    case DType::kU16: return combine<uint16_t>(in, inout, n, op);
    case DType::kBF16: return bf16_combine(static_cast<const uint16_t*>(in), static_cast<uint16_t*>(inout), n, op);
  }
}

void reduce_buffers(const std::vector<const void*>& srcs, void* dst, int64_t n, DType dtype, ReduceOp op) {
  DHX_ASSERT(!srcs.empty(), "reduce over no sources");
  switch (dtype) {
    case DType::kF32: return fold<float>(srcs, dst, n, op);
    case DType::kF64: return fold<double>(srcs, dst, n, op);
    case DType::kI32: return fold<int32_t>(srcs, dst, n, op);
    case DType::kI64: return fold<int64_t>(srcs, dst, n, op);
    case DType::kU16: return fold<uint16_t>(srcs, dst, n, op);
    case DType::kBF16: return fold_bf16(srcs, dst, n, op);
  }
}

void bf16_combine(const uint16_t* in, uint16_t* inout, int64_t n, ReduceOp op) {
  for (int64_t i = 0; i < n; ++i) inout[i] = f32_to_bf16(apply(bf16_to_f32(in[i]), bf16_to_f32(inout[i]), op));
}

}  // namespace dhelix
