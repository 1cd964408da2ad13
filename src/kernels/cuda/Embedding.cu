// Token (+ learned position) embedding on the GPU (Ops.h), forward and a deterministic backward.
// Forward: a grid-stride loop over 8-bf16 (16-byte) units of y when C % 8 == 0 and the pointers are
// 16-byte aligned, else single elements. Backward without float atomics, in the CPU twin's order:
// CUB's stable radix sort of the positions bt by token, then one block per run of equal tokens, a
// thread per column summing the run's dy rows in bt order onto the old dwte row; dwpe by a thread
// per (t, c) summing b = 0..B-1 onto the old value. Bytes moved (BT = B*T): forward 4 BT C (+2 BT C
// with wpe); backward 2 BT C + 8 (distinct tokens) C for dwte, 2 BT C + 8 T C for dwpe, ~20 BT for
// the sort. A very frequent token serialises its run in one block (llm.c buckets to balance; a later
// step). Not yet timed on the H100.
#include <cub/device/device_radix_sort.cuh>

#include "kernels/cuda/Ops.h"

namespace dhelix::cuda {

namespace {

using ops_detail::BfVec;
using ops_detail::aligned16;
using ops_detail::stride_grid;

constexpr int kThreads = 256;

// Unit u covers y elements [u W, u W + W) of row bt = u W / C (W divides C).
template <int W>
__global__ void embedding_fwd_kernel(const int32_t* __restrict__ tokens, const bf16* __restrict__ wte,
                                     const bf16* __restrict__ wpe, bf16* __restrict__ y, int64_t T, int64_t C,
                                     int64_t V, int64_t pos_offset, int64_t units) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t u = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; u < units; u += stride) {
    const int64_t e = u * W, bt = e / C, c = e % C;
    const int64_t tok = tokens[bt];
    BfVec<W> o;
    if (tok < 0 || tok >= V) {
#pragma unroll
      for (int j = 0; j < W; ++j) o.v[j] = __float2bfloat16(__int_as_float(0x7fc00000));  // NaN
    } else {
      o = *reinterpret_cast<const BfVec<W>*>(wte + tok * C + c);
      if (wpe != nullptr) {
        const BfVec<W> p = *reinterpret_cast<const BfVec<W>*>(wpe + (pos_offset + bt % T) * C + c);
#pragma unroll
        for (int j = 0; j < W; ++j) o.v[j] = __float2bfloat16(__bfloat162float(o.v[j]) + __bfloat162float(p.v[j]));
      }
    }
    *reinterpret_cast<BfVec<W>*>(y + e) = o;
  }
}

__global__ void iota_kernel(int32_t* __restrict__ idx, int64_t n) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    idx[i] = static_cast<int32_t>(i);
}

// Block p of the sorted positions: if p starts a run of token v (stok[p-1] != v) and v is in [0, V),
// dwte[v, c] = ((old + dy[sidx[p], c]) + dy[sidx[p+1], c]) + ... over the run, sidx ascending
// within the run (the sort is stable): the CPU's order of additions. Other blocks return at once.
__global__ void embedding_bwd_wte_kernel(const int32_t* __restrict__ stok, const int32_t* __restrict__ sidx,
                                         const bf16* __restrict__ dy, float* __restrict__ dwte, int64_t BT,
                                         int64_t C, int64_t V) {
  const int64_t p = blockIdx.x;
  const int32_t v = stok[p];
  if ((p > 0 && stok[p - 1] == v) || v < 0 || v >= V) return;
  float* row = dwte + static_cast<int64_t>(v) * C;
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
    float acc = row[c];
    for (int64_t q = p; q < BT && stok[q] == v; ++q) acc += __bfloat162float(dy[static_cast<int64_t>(sidx[q]) * C + c]);
    row[c] = acc;
  }
}

// Thread (t, c): dwpe[pos_offset + t, c] = ((old + dy[t, c]) + dy[T + t, c]) + ..., b ascending.
__global__ void embedding_bwd_wpe_kernel(const bf16* __restrict__ dy, float* __restrict__ dwpe, int64_t B, int64_t T,
                                         int64_t C, int64_t pos_offset) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < T * C; i += stride) {
    const int64_t t = i / C, c = i % C;
    float* out = dwpe + (pos_offset + t) * C + c;
    float acc = *out;
    for (int64_t b = 0; b < B; ++b) acc += __bfloat162float(dy[(b * T + t) * C + c]);
    *out = acc;
  }
}

void check_embedding(const char* what, int64_t B, int64_t T, int64_t C, int64_t V, int64_t pos_offset) {
  DHX_CUDA_ASSERT(B >= 0 && T >= 0 && C >= 1 && V >= 1 && pos_offset >= 0, what, ": B=", B, " T=", T, " C=", C,
                  " V=", V, " pos_offset=", pos_offset, " (need B, T, pos_offset >= 0 and C, V >= 1)");
  DHX_CUDA_ASSERT(B * T < (int64_t{1} << 31) && V < (int64_t{1} << 31), what, ": B*T=", B * T, " or V=", V,
                  " does not fit int32 (token ids and positions are int32)");
}

constexpr size_t round_up(size_t n, size_t a) { return (n + a - 1) / a * a; }

}  // namespace

void embedding_fwd(const int32_t* tokens, const bf16* wte, const bf16* wpe, bf16* y, int64_t B, int64_t T, int64_t C,
                   int64_t V, int64_t pos_offset, cudaStream_t s) {
  check_embedding("embedding_fwd", B, T, C, V, pos_offset);
  const int64_t n = B * T * C;
  if (n == 0) return;
  if (C % 8 == 0 && aligned16(wte) && aligned16(wpe) && aligned16(y)) {
    embedding_fwd_kernel<8><<<stride_grid(n / 8, kThreads), kThreads, 0, s>>>(tokens, wte, wpe, y, T, C, V,
                                                                               pos_offset, n / 8);
  } else {
    embedding_fwd_kernel<1><<<stride_grid(n, kThreads), kThreads, 0, s>>>(tokens, wte, wpe, y, T, C, V, pos_offset,
                                                                           n);
  }
  DHX_CUDA_LAUNCHED(embedding_fwd_kernel);
}

void embedding_bwd(const int32_t* tokens, const bf16* dy, float* dwte, float* dwpe, int64_t B, int64_t T, int64_t C,
                   int64_t V, int64_t pos_offset, cudaStream_t s) {
  check_embedding("embedding_bwd", B, T, C, V, pos_offset);
  const int64_t BT = B * T;
  if (BT == 0) return;
  if (dwpe != nullptr) {
    embedding_bwd_wpe_kernel<<<stride_grid(T * C, kThreads), kThreads, 0, s>>>(dy, dwpe, B, T, C, pos_offset);
    DHX_CUDA_LAUNCHED(embedding_bwd_wpe_kernel);
  }
  // Scratch, one allocation: sorted tokens, sorted positions, positions 0..BT-1 [BT] int32 each,
  // then CUB's temporary storage. All 32 key bits are sorted: negative or too large tokens form
  // their own runs (skipped) and never split a valid token's run.
  const int num = static_cast<int>(BT);
  size_t cub_bytes = 0;
  DHX_CUDA(cub::DeviceRadixSort::SortPairs(nullptr, cub_bytes, static_cast<const int32_t*>(nullptr),
                                           static_cast<int32_t*>(nullptr), static_cast<const int32_t*>(nullptr),
                                           static_cast<int32_t*>(nullptr), num, 0, 32, s));
  const size_t ints = round_up(static_cast<size_t>(BT) * sizeof(int32_t), 256);
  char* scratch = nullptr;
  DHX_CUDA(cudaMallocAsync(reinterpret_cast<void**>(&scratch), 3 * ints + cub_bytes, s));
  auto* stok = reinterpret_cast<int32_t*>(scratch);
  auto* sidx = reinterpret_cast<int32_t*>(scratch + ints);
  auto* idx = reinterpret_cast<int32_t*>(scratch + 2 * ints);
  iota_kernel<<<stride_grid(BT, kThreads), kThreads, 0, s>>>(idx, BT);
  DHX_CUDA_LAUNCHED(iota_kernel);
  DHX_CUDA(cub::DeviceRadixSort::SortPairs(scratch + 3 * ints, cub_bytes, tokens, stok, idx, sidx, num, 0, 32, s));
  embedding_bwd_wte_kernel<<<static_cast<unsigned>(BT), 128, 0, s>>>(stok, sidx, dy, dwte, BT, C, V);
  DHX_CUDA_LAUNCHED(embedding_bwd_wte_kernel);
  DHX_CUDA(cudaFreeAsync(scratch, s));
}

}  // namespace dhelix::cuda
