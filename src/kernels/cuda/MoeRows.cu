// MoE dispatch and combine on the GPU (Moe.h): gathers of bf16 rows into expert order and the
// gate-weighted sums back, forward and backward. One block of 128 threads per output row, a thread
// per column stride (coalesced 2-byte accesses; 16-byte vector accesses are a later step), sums in
// fp32 in the CPU twin's order (j ascending) and rounded once: deterministic. Bytes moved (P = N*k
// rows of C): dispatch 4PC, dispatch_bwd 2PC + 2NC (+2NC accumulating), combine 2PC + 2NC,
// combine_bwd 6PC (dy and eo read, deo written), plus 4 bytes per row for slot, gate, dgate; FLOPs
// negligible (bandwidth-bound). Not yet timed on the H100.
#include "kernels/cuda/Moe.h"

namespace dhelix::cuda {

namespace {

constexpr int kRowThreads = 128;  // a power of two (combine_bwd's tree reduction)

// xs[p,:] = x[order[p] / k, :], block p.
__global__ void dispatch_kernel(const bf16* __restrict__ x, const int32_t* __restrict__ order, bf16* __restrict__ xs,
                                int64_t k, int64_t C) {
  const int64_t p = blockIdx.x;
  const bf16* src = x + (static_cast<int64_t>(order[p]) / k) * C;
  bf16* dst = xs + p * C;
  for (int64_t c = threadIdx.x; c < C; c += kRowThreads) dst[c] = src[c];
}

// dx[n,:] = (dx[n,:] if accumulate) + sum_j dxs[slot[n*k + j], :], block n.
__global__ void dispatch_bwd_kernel(const bf16* __restrict__ dxs, const int32_t* __restrict__ slot,
                                    bf16* __restrict__ dx, int64_t k, int64_t C, bool accumulate) {
  const int64_t n = blockIdx.x;
  const int32_t* sl = slot + n * k;
  bf16* d = dx + n * C;
  for (int64_t c = threadIdx.x; c < C; c += kRowThreads) {
    float acc = accumulate ? __bfloat162float(d[c]) : 0.0f;
    for (int64_t j = 0; j < k; ++j) acc += __bfloat162float(dxs[static_cast<int64_t>(sl[j]) * C + c]);
    d[c] = __float2bfloat16(acc);
  }
}

// y[n,:] = sum_j gate[n*k + j] * eo[slot[n*k + j], :], block n.
__global__ void combine_kernel(const bf16* __restrict__ eo, const int32_t* __restrict__ slot,
                               const float* __restrict__ gate, bf16* __restrict__ y, int64_t k, int64_t C) {
  const int64_t n = blockIdx.x;
  const int32_t* sl = slot + n * k;
  const float* g = gate + n * k;
  bf16* out = y + n * C;
  for (int64_t c = threadIdx.x; c < C; c += kRowThreads) {
    float acc = 0.0f;
    for (int64_t j = 0; j < k; ++j) acc += g[j] * __bfloat162float(eo[static_cast<int64_t>(sl[j]) * C + c]);
    out[c] = __float2bfloat16(acc);
  }
}

// Block a = n*k + j: deo[slot[a], :] = gate[a] * dy[n, :]; dgate[a] = dy[n, :] . eo[slot[a], :], each
// thread summing columns c = t, t + 128, ... in order, then a fixed tree over the 128 partial sums.
__global__ void combine_bwd_kernel(const bf16* __restrict__ dy, const bf16* __restrict__ eo,
                                   const int32_t* __restrict__ slot, const float* __restrict__ gate,
                                   bf16* __restrict__ deo, float* __restrict__ dgate, int64_t k, int64_t C) {
  __shared__ float part[kRowThreads];
  const int t = threadIdx.x;
  const int64_t a = blockIdx.x, row = slot[a];
  const float g = gate[a];
  const bf16* d = dy + (a / k) * C;
  const bf16* e = eo + row * C;
  bf16* de = deo + row * C;
  float dot = 0.0f;
  for (int64_t c = t; c < C; c += kRowThreads) {
    const float dc = __bfloat162float(d[c]);
    de[c] = __float2bfloat16(g * dc);
    dot += dc * __bfloat162float(e[c]);
  }
  part[t] = dot;
  __syncthreads();
  for (int half = kRowThreads / 2; half > 0; half >>= 1) {
    if (t < half) part[t] += part[t + half];
    __syncthreads();
  }
  if (t == 0) dgate[a] = part[0];
}

// One block per row: the row count must fit the grid's x dimension.
unsigned row_grid(const char* what, int64_t rows) {
  DHX_CUDA_ASSERT(rows > 0 && rows < (int64_t{1} << 31), what, ": ", rows, " rows do not fit a grid of 2^31 - 1");
  return static_cast<unsigned>(rows);
}

}  // namespace

void moe_dispatch(const bf16* x, const int32_t* order, bf16* xs, int64_t P, int64_t k, int64_t C, cudaStream_t s) {
  DHX_CUDA_ASSERT(k >= 1 && C >= 1, "moe_dispatch P=", P, " k=", k, " C=", C);
  if (P == 0) return;
  dispatch_kernel<<<row_grid("moe_dispatch", P), kRowThreads, 0, s>>>(x, order, xs, k, C);
  DHX_CUDA_LAUNCHED(dispatch_kernel);
}

void moe_dispatch_bwd(const bf16* dxs, const int32_t* slot, bf16* dx, int64_t N, int64_t k, int64_t C, Accumulate acc,
                      cudaStream_t s) {
  DHX_CUDA_ASSERT(k >= 1 && C >= 1, "moe_dispatch_bwd N=", N, " k=", k, " C=", C);
  if (N == 0) return;
  dispatch_bwd_kernel<<<row_grid("moe_dispatch_bwd", N), kRowThreads, 0, s>>>(dxs, slot, dx, k, C,
                                                                               acc == Accumulate::kYes);
  DHX_CUDA_LAUNCHED(dispatch_bwd_kernel);
}

void moe_combine(const bf16* eo, const int32_t* slot, const float* gate, bf16* y, int64_t N, int64_t k, int64_t C,
                 cudaStream_t s) {
  DHX_CUDA_ASSERT(k >= 1 && C >= 1, "moe_combine N=", N, " k=", k, " C=", C);
  if (N == 0) return;
  combine_kernel<<<row_grid("moe_combine", N), kRowThreads, 0, s>>>(eo, slot, gate, y, k, C);
  DHX_CUDA_LAUNCHED(combine_kernel);
}

void moe_combine_bwd(const bf16* dy, const bf16* eo, const int32_t* slot, const float* gate, bf16* deo, float* dgate,
                     int64_t N, int64_t k, int64_t C, cudaStream_t s) {
  DHX_CUDA_ASSERT(k >= 1 && C >= 1, "moe_combine_bwd N=", N, " k=", k, " C=", C);
  if (N == 0) return;
  combine_bwd_kernel<<<row_grid("moe_combine_bwd", N * k), kRowThreads, 0, s>>>(dy, eo, slot, gate, deo, dgate, k,
                                                                                 C);
  DHX_CUDA_LAUNCHED(combine_bwd_kernel);
}

}  // namespace dhelix::cuda
