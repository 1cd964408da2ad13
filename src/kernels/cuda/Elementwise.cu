// Elementwise kernels of the GPU step (Ops.h): residual adds on bf16, the fp32 <-> bf16 casts,
// context parallelism's column copy (cudaMemcpy2DAsync) and last backward sum (cp_ring_finish: 12
// bytes read, 2 written per element), and the deterministic sum of squares of the global gradient norm. Adds are grid-stride loops with
// 16-byte accesses (8 bf16) when n % 8 == 0 and the pointers are 16-byte aligned, else 2-byte ones;
// casts are 4-byte-per-thread coalesced loops. Bytes moved: add 6n, add_inplace 6n (fp32: 12n), casts 6n,
// sum_squares 4n (+ 8 KiB of partials); sum_squares_many 4n over all its items in two launches
// (+ 8 B a 64Ki-element chunk). All bandwidth-bound. Not yet timed on the H100.
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

// ---- sum_squares_many: a batch of up to kManyItems items passed by value (CUDA 12.1+ kernel
// parameters up to 32 KiB), so nothing is copied to the device first ----
constexpr int kManyItems = 256;
constexpr int kManyThreads = 256;                                  // stage 1: a block a chunk
static_assert(kSumSquaresChunk % kManyThreads == 0, "a chunk is whole strides of the block");
struct ManyBatch {
  const float* x[kManyItems];
  int64_t n[kManyItems];
  int64_t chunk0[kManyItems + 1];  // item k's chunks: [chunk0[k], chunk0[k + 1]) of the batch's
  // The batch's distinct slots in order of first use; slot j's items: item[first[j] .. first[j + 1]),
  // in item order.
  int64_t slot[kManyItems];
  int16_t item[kManyItems];
  int16_t first[kManyItems + 1];
  int items, slots;
};
static_assert(sizeof(ManyBatch) < 32000, "kernel parameters are at most 32764 bytes");

// Block b: the chunk b of the batch; its item by binary search of chunk0. Thread i sums x[c0 + i +
// kManyThreads j] (256 elements a thread in a whole chunk) in double, then the block's fixed tree:
// part[b].
__global__ void __launch_bounds__(kManyThreads) sum_squares_many_partial(const __grid_constant__ ManyBatch m,
                                                                          double* __restrict__ part) {
  const int64_t b = blockIdx.x;
  const int lo = ops_detail::chunk_owner(m.chunk0, m.items, b);
  const int64_t c0 = (b - m.chunk0[lo]) * kSumSquaresChunk;
  const int64_t end = c0 + kSumSquaresChunk < m.n[lo] ? c0 + kSumSquaresChunk : m.n[lo];
  const float* x = m.x[lo];
  double acc = 0.0;
  for (int64_t i = c0 + threadIdx.x; i < end; i += kManyThreads) {
    const double v = x[i];
    acc += v * v;
  }
  acc = ops_detail::block_sum(acc);
  if (threadIdx.x == 0) part[b] = acc;
}

// One block: warp w sums the chunks of items w, w + 8, ... (lanes stride the item's chunks, then the
// fixed butterfly) into shared memory; then thread j adds slot j's items' sums to out[slot], in item
// order.
constexpr int kManyFinalThreads = 256;
__global__ void __launch_bounds__(kManyFinalThreads) sum_squares_many_final(const __grid_constant__ ManyBatch m,
                                                                           const double* __restrict__ part,
                                                                           double* __restrict__ out) {
  __shared__ double total[kManyItems];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  for (int k = warp; k < m.items; k += kManyFinalThreads / 32) {
    double acc = 0.0;
    for (int64_t c = m.chunk0[k] + lane; c < m.chunk0[k + 1]; c += 32) acc += part[c];
    acc = ops_detail::warp_sum(acc);
    if (lane == 0) total[k] = acc;
  }
  __syncthreads();
  for (int j = threadIdx.x; j < m.slots; j += kManyFinalThreads) {
    double v = out[m.slot[j]];
    for (int q = m.first[j]; q < m.first[j + 1]; ++q) v += total[m.item[q]];
    out[m.slot[j]] = v;
  }
}
static_assert(kManyItems <= 32767, "item indices are int16");

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

void sum_squares_many(const std::vector<SumSquaresItem>& items, double* out, cudaStream_t s) {
  // Batches of up to kManyItems items with n > 0, in item order: a slot's adds keep their order
  // across batches too (the stream orders the batches).
  size_t next = 0;
  while (next < items.size()) {
    ManyBatch m{};
    std::vector<int64_t> slots;  // the batch items' slots, in item order
    int64_t chunks = 0;
    for (; next < items.size() && m.items < kManyItems; ++next) {
      const SumSquaresItem& it = items[next];
      DHX_CUDA_ASSERT(it.n >= 0 && it.slot >= 0, "sum_squares_many: item ", next, " n=", it.n, " slot=", it.slot,
                      " (need n >= 0, slot >= 0)");
      if (it.n == 0) continue;
      m.x[m.items] = it.x;
      m.n[m.items] = it.n;
      m.chunk0[m.items] = chunks;
      chunks += cdiv(it.n, kSumSquaresChunk);
      slots.push_back(it.slot);
      ++m.items;
    }
    if (m.items == 0) continue;
    m.chunk0[m.items] = chunks;
    DHX_CUDA_ASSERT(chunks < (int64_t{1} << 31), "sum_squares_many: ", chunks, " chunks exceed the grid");
    // The distinct slots in order of first use, each followed by its items in item order.
    std::vector<int64_t> distinct;
    for (int64_t sl : slots)
      if (std::find(distinct.begin(), distinct.end(), sl) == distinct.end()) distinct.push_back(sl);
    int q = 0;
    for (size_t j = 0; j < distinct.size(); ++j) {
      m.slot[j] = distinct[j];
      m.first[j] = static_cast<int16_t>(q);
      for (int k = 0; k < m.items; ++k)
        if (slots[static_cast<size_t>(k)] == distinct[j]) m.item[q++] = static_cast<int16_t>(k);
    }
    m.slots = static_cast<int>(distinct.size());
    m.first[m.slots] = static_cast<int16_t>(q);
    double* part = nullptr;
    scratch_malloc(&part, static_cast<size_t>(chunks) * sizeof(double), s);
    sum_squares_many_partial<<<static_cast<unsigned>(chunks), kManyThreads, 0, s>>>(m, part);
    DHX_CUDA_LAUNCHED(sum_squares_many_partial);
    sum_squares_many_final<<<1, kManyFinalThreads, 0, s>>>(m, part, out);
    DHX_CUDA_LAUNCHED(sum_squares_many_final);
    DHX_CUDA(cudaFreeAsync(part, s));
  }
}

void sum_squares(const float* x, int64_t n, double* out, Accumulate acc, cudaStream_t s) {
  DHX_CUDA_ASSERT(n >= 0, "sum_squares: n=", n, " is negative");
  double* part = nullptr;
  scratch_malloc(&part, kSsBlocks * sizeof(double), s);
  sum_squares_partial<<<kSsBlocks, kThreads, 0, s>>>(x, n, part);
  DHX_CUDA_LAUNCHED(sum_squares_partial);
  sum_squares_final<<<1, kSsBlocks, 0, s>>>(part, out, acc == Accumulate::kYes);
  DHX_CUDA_LAUNCHED(sum_squares_final);
  DHX_CUDA(cudaFreeAsync(part, s));
}

}  // namespace dhelix::cuda
