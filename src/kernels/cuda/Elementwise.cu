// Elementwise kernels of the GPU step (Ops.h): residual adds on bf16, the fp32 <-> bf16 casts,
// context parallelism's column copy (cudaMemcpy2DAsync) and last backward sum (cp_ring_finish: 12
// bytes read, 2 written per element), and the deterministic sum of squares of the global gradient norm. Adds are grid-stride loops with
// 16-byte accesses (8 bf16) when n % 8 == 0 and the pointers are 16-byte aligned, else 2-byte ones;
// casts are 4-byte-per-thread coalesced loops. Bytes moved: add 6n, add_inplace 6n (fp32: 12n), casts 6n,
// sum_squares 4n (+ 8 KiB of partials). All bandwidth-bound. Not yet timed on the H100.
#include "kernels/cuda/Ops.h"

#include <algorithm>

namespace dhelix::cuda {

namespace {

using ops_detail::stride_grid;

struct AddOp {
  __device__ float operator()(float a, float b) const { return a + b; }
};

constexpr int kThreads = 256;

__global__ void cast_f32_to_bf16_kernel(const float* __restrict__ x, bf16* __restrict__ y, int64_t n) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    y[i] = __float2bfloat16(x[i]);
}
__global__ void add_f32_inplace_kernel(float* __restrict__ y, const float* __restrict__ x, int64_t n) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) y[i] += x[i];
}
__global__ void cast_bf16_to_f32_kernel(const bf16* __restrict__ x, float* __restrict__ y, int64_t n) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    y[i] = __bfloat162float(x[i]);
}

// Stage 1: a FIXED grid (kSsBlocks x kThreads, never the device's size), thread i summing x[j]^2
// for j = i, i + stride, ... in double, then a block's fixed tree: part[kSsBlocks]. Stage 2: one
// block sums the partials in a fixed tree. The same bits for the same n everywhere.
constexpr int kSsBlocks = 1024;
__global__ void sum_squares_partial(const float* __restrict__ x, int64_t n, double* __restrict__ part) {
  const int64_t stride = static_cast<int64_t>(kSsBlocks) * kThreads;
  double acc = 0.0;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; i < n; i += stride) {
    const double v = x[i];
    acc += v * v;
  }
  acc = ops_detail::block_sum(acc);
  if (threadIdx.x == 0) part[blockIdx.x] = acc;
}
__global__ void sum_squares_final(const double* __restrict__ part, double* __restrict__ out, bool accumulate) {
  const double total = ops_detail::block_sum(part[threadIdx.x]);  // kSsBlocks threads, one partial each
  if (threadIdx.x == 0) out[0] = accumulate ? out[0] + total : total;
}
static_assert(kSsBlocks <= 1024 && kSsBlocks % 32 == 0, "sum_squares_final is one block, a thread a partial");

}  // namespace

namespace {
__global__ void add_bias_kernel(const bf16* a, const bf16* b, const float* __restrict__ bias, bf16* y, int64_t N,
                                int64_t C) {
  const int64_t n = static_cast<int64_t>(N) * C, stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    y[i] = __float2bfloat16(__bfloat162float(a[i]) + __bfloat162float(b[i]) + bias[i % C]);
}
}  // namespace

void add_bias(const bf16* a, const bf16* b, const float* bias, bf16* y, int64_t N, int64_t C, cudaStream_t s) {
  DHX_CUDA_ASSERT(N >= 0 && C > 0, "add_bias: N=", N, " C=", C);
  if (N == 0) return;
  const int64_t n = N * C;
  const unsigned blocks = static_cast<unsigned>(std::min<int64_t>(cdiv(n, 256), 4096));
  add_bias_kernel<<<blocks, 256, 0, s>>>(a, b, bias, y, N, C);
  DHX_CUDA_LAUNCHED(add_bias_kernel);
}

void add(const bf16* a, const bf16* b, bf16* y, int64_t n, cudaStream_t s) { ops_detail::map2("add", a, b, y, n, AddOp{}, s); }

void add_inplace(bf16* y, const bf16* x, int64_t n, cudaStream_t s) {
  ops_detail::map2("add_inplace", y, x, y, n, AddOp{}, s);
}

void add_inplace(float* y, const float* x, int64_t n, cudaStream_t s) {
  DHX_CUDA_ASSERT(n >= 0, "add_inplace (fp32): n=", n, " is negative");
  if (n == 0) return;
  add_f32_inplace_kernel<<<stride_grid(n, kThreads), kThreads, 0, s>>>(y, x, n);
  DHX_CUDA_LAUNCHED(add_f32_inplace_kernel);
}

void cast_f32_to_bf16(const float* x, bf16* y, int64_t n, cudaStream_t s) {
  DHX_CUDA_ASSERT(n >= 0, "cast_f32_to_bf16: n=", n, " is negative");
  if (n == 0) return;
  cast_f32_to_bf16_kernel<<<stride_grid(n, kThreads), kThreads, 0, s>>>(x, y, n);
  DHX_CUDA_LAUNCHED(cast_f32_to_bf16_kernel);
}

namespace {
// Thread i of N * W: column c of row n; the q columns from dq, the key/value columns own + came.
__global__ void cp_ring_finish_kernel(const float* __restrict__ dq, const float* __restrict__ own,
                                      const float* __restrict__ came, bf16* __restrict__ out, int64_t N, int64_t W,
                                      int64_t qc) {
  const int64_t kvw = W - qc, n_all = N * W, stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n_all; i += stride) {
    const int64_t n = i / W, c = i % W;
    const float v = c < qc ? dq[i] : own[n * kvw + c - qc] + came[n * kvw + c - qc];
    out[i] = __float2bfloat16(v);
  }
}
}  // namespace

void copy_cols(const bf16* x, int64_t ldx, bf16* y, int64_t ldy, int64_t N, int64_t cols, cudaStream_t s) {
  DHX_CUDA_ASSERT(N >= 0 && cols >= 0 && cols <= ldx && cols <= ldy, "copy_cols: N=", N, " cols=", cols, " ldx=", ldx,
                  " ldy=", ldy, " (need 0 <= cols <= both row strides)");
  if (N == 0 || cols == 0) return;
  DHX_CUDA(cudaMemcpy2DAsync(y, static_cast<size_t>(ldy) * sizeof(bf16), x, static_cast<size_t>(ldx) * sizeof(bf16),
                             static_cast<size_t>(cols) * sizeof(bf16), static_cast<size_t>(N),
                             cudaMemcpyDeviceToDevice, s));
}

void cp_ring_finish(const float* dq, const float* own, const float* came, bf16* dqkv, int64_t N, int64_t W,
                    int64_t q_cols, cudaStream_t s) {
  DHX_CUDA_ASSERT(N >= 0 && q_cols >= 0 && q_cols < W, "cp_ring_finish: N=", N, " W=", W, " q_cols=", q_cols,
                  " (need 0 <= q_cols < W)");
  if (N == 0) return;
  cp_ring_finish_kernel<<<stride_grid(N * W, kThreads), kThreads, 0, s>>>(dq, own, came, dqkv, N, W, q_cols);
  DHX_CUDA_LAUNCHED(cp_ring_finish_kernel);
}

void cast_bf16_to_f32(const bf16* x, float* y, int64_t n, cudaStream_t s) {
  DHX_CUDA_ASSERT(n >= 0, "cast_bf16_to_f32: n=", n, " is negative");
  if (n == 0) return;
  cast_bf16_to_f32_kernel<<<stride_grid(n, kThreads), kThreads, 0, s>>>(x, y, n);
  DHX_CUDA_LAUNCHED(cast_bf16_to_f32_kernel);
}

void sum_squares(const float* x, int64_t n, double* out, Accumulate acc, cudaStream_t s) {
  DHX_CUDA_ASSERT(n >= 0, "sum_squares: n=", n, " is negative");
  double* part = nullptr;
  DHX_CUDA(cudaMallocAsync(reinterpret_cast<void**>(&part), kSsBlocks * sizeof(double), s));
  sum_squares_partial<<<kSsBlocks, kThreads, 0, s>>>(x, n, part);
  DHX_CUDA_LAUNCHED(sum_squares_partial);
  sum_squares_final<<<1, kSsBlocks, 0, s>>>(part, out, acc == Accumulate::kYes);
  DHX_CUDA_LAUNCHED(sum_squares_final);
  DHX_CUDA(cudaFreeAsync(part, s));
}

}  // namespace dhelix::cuda
