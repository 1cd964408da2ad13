// Token (+ learned position) embedding on the GPU (Ops.h), forward and a deterministic backward.
// Forward: a grid-stride loop over 8-bf16 (16-byte) units of y when C % 8 == 0 and the pointers are
// 16-byte aligned, else single elements. Backward without float atomics, in the CPU twin's order:
// CUB's stable radix sort of the positions bt by token, then a block per run of equal tokens and
// 128-column slice, a thread per column summing the run's dy rows in bt order onto the old dwte row
// (the rows' loads issued 8 ahead of the adds, which keep their order); dwpe by a thread per (t, c)
// summing b = 0..B-1 onto the old value. Bytes moved (BT = B*T): forward 4 BT C (+2 BT C with wpe);
// backward 2 BT C + 8 (distinct tokens) C for dwte, 2 BT C + 8 T C for dwpe, ~20 BT for the sort. A
// very frequent token's run is still one block a slice (llm.c buckets to balance). The vocabulary-parallel twins (tp > 1) run the same kernels with the shard's first row v0;
// learned positions on a sequence shard (position_add, position_grad) index rows by (row0 + i) mod T.
#include <cub/device/device_radix_sort.cuh>

#include "kernels/cuda/Ops.h"

namespace dhelix::cuda {

namespace {

using ops_detail::BfVec;
using ops_detail::aligned16;
using ops_detail::stride_grid;

constexpr int kThreads = 256;

// Unit u covers y elements [u W, u W + W) of row bt = u W / C (W divides C). The table holds rows
// [v0, v0 + V) of the vocabulary; a token outside them gives NaN (kShard false: one table, so the
// token is bad) or zeros (kShard: another rank's shard holds it; the tp reduce sums the rows).
template <int W, bool kShard>
__global__ void embedding_fwd_kernel(const int32_t* __restrict__ tokens, const bf16* __restrict__ wte,
                                     const bf16* __restrict__ wpe, bf16* __restrict__ y, int64_t T, int64_t C,
                                     int64_t V, int64_t v0, int64_t pos_offset, int64_t units) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t u = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; u < units; u += stride) {
    const int64_t e = u * W, bt = e / C, c = e % C;
    const int64_t tok = tokens[bt] - v0;
    BfVec<W> o;
    if (tok < 0 || tok >= V) {
      const float fill = kShard ? 0.0f : __int_as_float(0x7fc00000);  // NaN: loud
#pragma unroll
      for (int j = 0; j < W; ++j) o.v[j] = __float2bfloat16(fill);
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

// Row i of the sequence shard (Megatron's sequence parallelism: global rows row0 + i): y[i] = e[i] +
// wpe[(row0 + i) mod T], the sum in fp32 rounded once (as embedding_fwd's).
template <int W>
__global__ void position_add_kernel(const bf16* e, const bf16* __restrict__ wpe, bf16* y,  // e, y may alias
                                    int64_t C, int64_t T, int64_t row0, int64_t units) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t u = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; u < units; u += stride) {
    const int64_t at = u * W, i = at / C, c = at % C;
    const BfVec<W> a = *reinterpret_cast<const BfVec<W>*>(e + at);
    const BfVec<W> p = *reinterpret_cast<const BfVec<W>*>(wpe + ((row0 + i) % T) * C + c);
    BfVec<W> o;
#pragma unroll
    for (int j = 0; j < W; ++j) o.v[j] = __float2bfloat16(__bfloat162float(a.v[j]) + __bfloat162float(p.v[j]));
    *reinterpret_cast<BfVec<W>*>(y + at) = o;
  }
}

// Thread (t, c): dwpe[t, c] = ((old + dy[i0, c]) + dy[i0 + T, c]) + ... over the shard's rows i with
// (row0 + i) mod T == t, i ascending (the CPU twin's order: it adds row by row).
__global__ void position_grad_kernel(const bf16* __restrict__ dy, float* __restrict__ dwpe, int64_t rows, int64_t C,
                                     int64_t T, int64_t row0) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t k = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; k < T * C; k += stride) {
    const int64_t t = k / C, c = k % C;
    const int64_t first = ((t - row0 % T) % T + T) % T;  // the least i >= 0 with (row0 + i) mod T == t
    if (first >= rows) continue;
    float acc = dwpe[k];
    for (int64_t i = first; i < rows; i += T) acc += __bfloat162float(dy[i * C + c]);
    dwpe[k] = acc;
  }
}

__global__ void iota_kernel(int32_t* __restrict__ idx, int64_t n) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    idx[i] = static_cast<int32_t>(i);
}

// Block (p, y) of the sorted positions and 128-column slices: if p starts a run of token v
// (stok[p-1] != v) and v is in [v0, v0 + V), thread x adds column c = 128 y + x of the run's rows:
// dwte[v - v0, c] = ((old + dy[sidx[p], c]) + dy[sidx[p+1], c]) + ... , sidx ascending within the
// run (the sort is stable): the CPU's order of additions. Other blocks return at once. The run's
// end is found first (a block-wide integer min), so the loads of kAhead rows are issued together
// while the adds keep their order: a frequent token's long run was a chain of one dependent load
// after another per column (a run of ~800, a token at 5% of 16K rows: ~5000 serial loads for a
// column pass), and the column slices spread it over more SMs.
constexpr int kWteCols = 128;  // columns a block of embedding_bwd_wte_kernel adds (one a thread)
__global__ void embedding_bwd_wte_kernel(const int32_t* __restrict__ stok, const int32_t* __restrict__ sidx,
                                         const bf16* __restrict__ dy, float* __restrict__ dwte, int64_t BT,
                                         int64_t C, int64_t V, int64_t v0) {
  const int64_t p = blockIdx.x;
  const int32_t v = stok[p];
  if ((p > 0 && stok[p - 1] == v) || v < v0 || v >= v0 + V) return;  // the whole block
  // The run's end: the first position after p holding another token (BT if none), a stripe of
  // blockDim positions at a time.
  __shared__ unsigned long long end_s;
  if (threadIdx.x == 0) end_s = static_cast<unsigned long long>(BT);
  __syncthreads();
  for (int64_t base = p + 1; base < BT; base += blockDim.x) {
    const int64_t q = base + threadIdx.x;
    if (q < BT && stok[q] != v) atomicMin(&end_s, static_cast<unsigned long long>(q));
    __syncthreads();
    const bool found = end_s < static_cast<unsigned long long>(BT);
    __syncthreads();  // every thread has read end_s before any thread's next stripe may lower it
    if (found) break;
  }
  const int64_t end = static_cast<int64_t>(end_s);
  const int64_t c = static_cast<int64_t>(blockIdx.y) * blockDim.x + threadIdx.x;
  if (c >= C) return;
  float* at = dwte + (static_cast<int64_t>(v) - v0) * C + c;
  float acc = *at;
  constexpr int kAhead = 8;
  int64_t q = p;
  for (; q + kAhead <= end; q += kAhead) {
    float x[kAhead];
#pragma unroll
    for (int j = 0; j < kAhead; ++j) x[j] = __bfloat162float(dy[static_cast<int64_t>(sidx[q + j]) * C + c]);
#pragma unroll
    for (int j = 0; j < kAhead; ++j) acc += x[j];  // q ascending, one add at a time: the CPU's order
  }
  for (; q < end; ++q) acc += __bfloat162float(dy[static_cast<int64_t>(sidx[q]) * C + c]);
  *at = acc;
}

void check_embedding(const char* what, int64_t B, int64_t T, int64_t C, int64_t V, int64_t pos_offset) {
  DHX_CUDA_ASSERT(B >= 0 && T >= 0 && C >= 1 && V >= 1 && pos_offset >= 0, what, ": B=", B, " T=", T, " C=", C,
                  " V=", V, " pos_offset=", pos_offset, " (need B, T, pos_offset >= 0 and C, V >= 1)");
  DHX_CUDA_ASSERT(B * T < (int64_t{1} << 31) && V < (int64_t{1} << 31), what, ": B*T=", B * T, " or V=", V,
                  " does not fit int32 (token ids and positions are int32)");
}

constexpr size_t round_up(size_t n, size_t a) { return (n + a - 1) / a * a; }

}  // namespace

namespace {

template <bool kShard>
void embedding_fwd_any(const char* what, const int32_t* tokens, const bf16* wte, const bf16* wpe, bf16* y, int64_t B,
                       int64_t T, int64_t C, int64_t V, int64_t v0, int64_t pos_offset, cudaStream_t s) {
  check_embedding(what, B, T, C, V, pos_offset);
  const int64_t n = B * T * C;
  if (n == 0) return;
  if (C % 8 == 0 && aligned16(wte) && aligned16(wpe) && aligned16(y)) {
    embedding_fwd_kernel<8, kShard><<<stride_grid(n / 8, kThreads), kThreads, 0, s>>>(tokens, wte, wpe, y, T, C, V, v0,
                                                                                      pos_offset, n / 8);
  } else {
    embedding_fwd_kernel<1, kShard><<<stride_grid(n, kThreads), kThreads, 0, s>>>(tokens, wte, wpe, y, T, C, V, v0,
                                                                                  pos_offset, n);
  }
  DHX_CUDA_LAUNCHED(embedding_fwd_kernel);
}

// dwte's part: rows [v0, v0 + V) of the vocabulary.
void embedding_bwd_rows(const int32_t* tokens, const bf16* dy, float* dwte, int64_t BT, int64_t C, int64_t V,
                        int64_t v0, cudaStream_t s) {
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
  scratch_malloc(&scratch, 3 * ints + cub_bytes, s);
  auto* stok = reinterpret_cast<int32_t*>(scratch);
  auto* sidx = reinterpret_cast<int32_t*>(scratch + ints);
  auto* idx = reinterpret_cast<int32_t*>(scratch + 2 * ints);
  iota_kernel<<<stride_grid(BT, kThreads), kThreads, 0, s>>>(idx, BT);
  DHX_CUDA_LAUNCHED(iota_kernel);
  DHX_CUDA(cub::DeviceRadixSort::SortPairs(scratch + 3 * ints, cub_bytes, tokens, stok, idx, sidx, num, 0, 32, s));
  const int64_t slices = (C + kWteCols - 1) / kWteCols;
  DHX_CUDA_ASSERT(slices <= 65535, "embedding backward: C=", C, " needs ", slices, " column slices of ", kWteCols,
                  " (the grid's y holds at most 65535)");
  embedding_bwd_wte_kernel<<<dim3(static_cast<unsigned>(BT), static_cast<unsigned>(slices)), kWteCols, 0, s>>>(
      stok, sidx, dy, dwte, BT, C, V, v0);
  DHX_CUDA_LAUNCHED(embedding_bwd_wte_kernel);
  DHX_CUDA(cudaFreeAsync(scratch, s));
}

void check_positions(const char* what, int64_t rows, int64_t C, int64_t T, int64_t row0) {
  DHX_CUDA_ASSERT(rows >= 0 && C >= 1 && T >= 1 && row0 >= 0, what, ": rows=", rows, " C=", C, " T=", T,
                  " row0=", row0, " (need rows, row0 >= 0 and C, T >= 1)");
}

}  // namespace

void embedding_fwd(const int32_t* tokens, const bf16* wte, const bf16* wpe, bf16* y, int64_t B, int64_t T, int64_t C,
                   int64_t V, int64_t pos_offset, cudaStream_t s) {
  embedding_fwd_any<false>("embedding_fwd", tokens, wte, wpe, y, B, T, C, V, 0, pos_offset, s);
}

void embedding_shard_fwd(const int32_t* tokens, const bf16* wte, bf16* y, int64_t N, int64_t C, int64_t V, int64_t v0,
                         cudaStream_t s) {
  DHX_CUDA_ASSERT(v0 >= 0, "embedding_shard_fwd: v0=", v0, " (need >= 0)");
  embedding_fwd_any<true>("embedding_shard_fwd", tokens, wte, nullptr, y, 1, N, C, V, v0, 0, s);
}

void embedding_bwd(const int32_t* tokens, const bf16* dy, float* dwte, float* dwpe, int64_t B, int64_t T, int64_t C,
                   int64_t V, int64_t pos_offset, cudaStream_t s) {
  check_embedding("embedding_bwd", B, T, C, V, pos_offset);
  const int64_t BT = B * T;
  if (BT == 0) return;
  // dwpe[pos_offset + t] += sum_b dy[b T + t], b ascending: the positions of B*T rows from row 0.
  if (dwpe != nullptr) position_grad(dy, dwpe + pos_offset * C, BT, C, T, 0, s);
  embedding_bwd_rows(tokens, dy, dwte, BT, C, V, 0, s);
}

void embedding_shard_bwd(const int32_t* tokens, const bf16* dy, float* dwte, int64_t N, int64_t C, int64_t V,
                         int64_t v0, cudaStream_t s) {
  check_embedding("embedding_shard_bwd", 1, N, C, V, 0);
  DHX_CUDA_ASSERT(v0 >= 0, "embedding_shard_bwd: v0=", v0, " (need >= 0)");
  if (N > 0) embedding_bwd_rows(tokens, dy, dwte, N, C, V, v0, s);
}

void position_add(const bf16* e, const bf16* wpe, bf16* y, int64_t rows, int64_t C, int64_t T, int64_t row0,
                  cudaStream_t s) {
  check_positions("position_add", rows, C, T, row0);
  const int64_t n = rows * C;
  if (n == 0) return;
  if (C % 8 == 0 && aligned16(e) && aligned16(wpe) && aligned16(y)) {
    position_add_kernel<8><<<stride_grid(n / 8, kThreads), kThreads, 0, s>>>(e, wpe, y, C, T, row0, n / 8);
  } else {
    position_add_kernel<1><<<stride_grid(n, kThreads), kThreads, 0, s>>>(e, wpe, y, C, T, row0, n);
  }
  DHX_CUDA_LAUNCHED(position_add_kernel);
}

void position_grad(const bf16* dy, float* dwpe, int64_t rows, int64_t C, int64_t T, int64_t row0, cudaStream_t s) {
  check_positions("position_grad", rows, C, T, row0);
  if (rows == 0) return;
  position_grad_kernel<<<stride_grid(T * C, kThreads), kThreads, 0, s>>>(dy, dwpe, rows, C, T, row0);
  DHX_CUDA_LAUNCHED(position_grad_kernel);
}

}  // namespace dhelix::cuda
