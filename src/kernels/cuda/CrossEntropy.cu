// Fused softmax cross-entropy over the vocabulary on the GPU (Ops.h), one block per row,
// probabilities never stored.
//
// Rows of 16-byte vectors (each row 16-byte aligned, 2048 <= ld <= 57344: a padded LM head's
// logits, GPT-2's 50304 columns) are read once and written once (2NV bytes forward only, 4NV with
// the gradient -- the least a fused kernel can): by default into shared memory (rows_smem_kernel,
// two rows an SM, below); or (cross_entropy_rows_in_registers, the kernel bench's comparison: the
// form before 2026-11-28) into registers, 1024 threads with at most 7 16-byte loads each. Either way
// the row max, then the sum of e^(x - max), are reduced by each warp to its lane 0 and then by every
// thread over the warps' values in warp order (the same bits in every thread and on every run), and
// the gradient (softmax - onehot) * dloss is written with 16-byte stores. Measured on the H100 at
// GPT-2's shapes: bench/gpu_kernels.
//
// Otherwise (unaligned rows: GPT-2's V = 50257 unpadded; small or very wide rows) the general
// kernel, llm.c's fused classifier: 512 threads, an online (max, sum) per thread over columns
// v = t, t + 512, ... merged by a fixed butterfly and then in warp order by every thread; pass 2
// re-reads the row (from L2) to write the gradient. 2-byte accesses; 6NV bytes with the gradient.
#include "kernels/cuda/Ops.h"

namespace dhelix::cuda {

namespace {

constexpr int kCeThreads = 512;

struct MaxSum {
  float m, s;  // running max and sum of exp(x - m); m = -inf: nothing seen yet
};
// (m1, s1) + (m2, s2) = (M, s1 e^(m1 - M) + s2 e^(m2 - M)), M = max: commutative bit for bit.
__device__ __forceinline__ MaxSum merge(MaxSum a, MaxSum b) {
  const float m = fmaxf(a.m, b.m);
  if (m == -INFINITY) return {m, 0.0f};
  return {m, (a.m == -INFINITY ? 0.0f : a.s * expf(a.m - m)) + (b.m == -INFINITY ? 0.0f : b.s * expf(b.m - m))};
}

// No __restrict__ on logits and dlogits: they may alias. Each element of the row is read and then
// written by the same thread; x[tgt] is read by thread 0 before the barrier that precedes any write.
__global__ void cross_entropy_kernel(const bf16* logits, const int32_t* __restrict__ targets,
                                     float* __restrict__ losses, bf16* dlogits, float dloss, int64_t V,
                                     int64_t ld) {
  __shared__ MaxSum warps[kCeThreads / 32];
  const int t = threadIdx.x;
  const int64_t n = blockIdx.x;
  const bf16* x = logits + n * ld;
  bf16* d = dlogits != nullptr ? dlogits + n * ld : nullptr;
  if (d != nullptr)  // padding columns [V, ld) (a padded LM head's): gradient 0
    for (int64_t v = V + t; v < ld; v += kCeThreads) d[v] = __float2bfloat16(0.0f);
  const int64_t tgt = targets[n];
  if (tgt < 0 || tgt >= V) {  // ignored (loss 0, gradient 0), or out of range (NaN: loud)
    const float fill = tgt < 0 ? 0.0f : __int_as_float(0x7fc00000);
    if (t == 0) losses[n] = fill;
    if (d != nullptr)
      for (int64_t v = t; v < V; v += kCeThreads) d[v] = __float2bfloat16(fill);
    return;
  }
  const float x_tgt = t == 0 ? __bfloat162float(x[tgt]) : 0.0f;
  MaxSum ms{-INFINITY, 0.0f};
  for (int64_t v = t; v < V; v += kCeThreads) {
    const float xv = __bfloat162float(x[v]);
    if (xv > ms.m) {
      ms.s = ms.s * expf(ms.m - xv) + 1.0f;  // ms.m = -inf: 0 * 0 + 1
      ms.m = xv;
    } else if (xv > -INFINITY) {  // then ms.m is finite
      ms.s += expf(xv - ms.m);
    }
  }
  for (int o = 16; o > 0; o >>= 1)
    ms = merge(ms, MaxSum{__shfl_xor_sync(0xffffffffu, ms.m, o), __shfl_xor_sync(0xffffffffu, ms.s, o)});
  if (t % 32 == 0) warps[t / 32] = ms;
  __syncthreads();
  MaxSum all = warps[0];
  for (int w = 1; w < kCeThreads / 32; ++w) all = merge(all, warps[w]);
  if (t == 0) losses[n] = all.m + logf(all.s) - x_tgt;
  if (d == nullptr) return;
  // d = (softmax - onehot) * dloss = e^(x - M) (dloss / S) - [v == tgt] dloss, as the CPU twin.
  const float k = dloss / all.s;
  for (int64_t v = t; v < V; v += kCeThreads) {
    const float g = expf(__bfloat162float(x[v]) - all.m) * k;
    d[v] = __float2bfloat16(v == tgt ? g - dloss : g);
  }
}

constexpr int kRowThreads = 1024;
constexpr int kRowMaxVecs = 7;  // 16-byte vectors per thread: rows up to 7 * 8 * 1024 = 57344 columns
constexpr float kLog2e = 1.4426950408889634f;

__device__ __forceinline__ float bf_lo(uint32_t w) { return __uint_as_float(w << 16); }
__device__ __forceinline__ float bf_hi(uint32_t w) { return __uint_as_float(w & 0xffff0000u); }

// Every thread gets the same fold of the block's values: each warp's lane 0 holds its warp's
// value (a fixed shuffle-down tree), the THREADS / 32 of them are folded in warp order by every
// thread.
template <int THREADS, typename F> __device__ __forceinline__ float block_fold(float v, float* red, F f) {
  for (int o = 16; o > 0; o >>= 1) v = f(v, __shfl_down_sync(0xffffffffu, v, o));
  if (threadIdx.x % 32 == 0) red[threadIdx.x / 32] = v;
  __syncthreads();
  float all = red[0];
#pragma unroll
  for (int w = 1; w < THREADS / 32; ++w) all = f(all, red[w]);
  return all;
}

// The gradient of columns c .. c + 7 (the 16-byte vector x8, bf16 in its four words) written to d + c:
// (softmax - onehot) * dloss = 2^(x log2e - mb) k - [v == ti] dloss, 0 past the vocabulary (Vi).
__device__ __forceinline__ void write_grad8(bf16* d, int c, uint4 x8, int Vi, int ti, float mb, float k, float dloss) {
  const uint32_t w[4] = {x8.x, x8.y, x8.z, x8.w};
  uint32_t o[4];
#pragma unroll
  for (int j = 0; j < 8; j += 2) {
    float g[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int v = c + j + h;
      const float xv = h ? bf_hi(w[j / 2]) : bf_lo(w[j / 2]);
      g[h] = v >= Vi ? 0.0f : exp2f(fmaf(xv, kLog2e, -mb)) * k - (v == ti ? dloss : 0.0f);
    }
    const __nv_bfloat162 b2 = __floats2bfloat162_rn(g[0], g[1]);
    o[j / 2] = *reinterpret_cast<const uint32_t*>(&b2);
  }
  *reinterpret_cast<uint4*>(d + c) = make_uint4(o[0], o[1], o[2], o[3]);
}

// No __restrict__ on logits and dlogits (they may alias): every load of the row and thread 0's
// read of x[tgt] come before the first barrier, every store after the last.
template <int VECS>
__global__ void __launch_bounds__(kRowThreads, 1)
    rows_kernel(const bf16* logits, const int32_t* __restrict__ targets, float* __restrict__ losses, bf16* dlogits,
                float dloss, int64_t V, int64_t ld) {
  __shared__ float red_max[kRowThreads / 32], red_sum[kRowThreads / 32];
  const int t = threadIdx.x;
  const int64_t n = blockIdx.x;
  const bf16* x = logits + n * ld;
  bf16* d = dlogits != nullptr ? dlogits + n * ld : nullptr;
  const int64_t tgt = targets[n];
  if (tgt < 0 || tgt >= V) {  // ignored (loss 0, gradient 0), or out of range (NaN: loud)
    const float fill = tgt < 0 ? 0.0f : __int_as_float(0x7fc00000);
    if (t == 0) losses[n] = fill;
    if (d != nullptr)
      for (int64_t v = t; v < ld; v += kRowThreads) d[v] = __float2bfloat16(v < V ? fill : 0.0f);
    return;
  }
  const float x_tgt = t == 0 ? __bfloat162float(x[tgt]) : 0.0f;
  const int Vi = static_cast<int>(V), ldi = static_cast<int>(ld), ti = static_cast<int>(tgt);  // < 2^16: 32-bit indices
  uint4 r[VECS];
#pragma unroll
  for (int i = 0; i < VECS; ++i) {
    const int c = (i * kRowThreads + t) * 8;
    r[i] = c < ldi ? *reinterpret_cast<const uint4*>(x + c) : make_uint4(0u, 0u, 0u, 0u);
  }
  // Column c + j of vector i holds word j / 2's low (j even) or high half.
  auto each = [&](auto fn) {
#pragma unroll
    for (int i = 0; i < VECS; ++i) {
      const int c = (i * kRowThreads + t) * 8;
      const uint32_t w[4] = {r[i].x, r[i].y, r[i].z, r[i].w};
#pragma unroll
      for (int j = 0; j < 8; ++j)
        if (c + j < Vi) fn(j % 2 ? bf_hi(w[j / 2]) : bf_lo(w[j / 2]));
    }
  };
  float m = -INFINITY;
  each([&](float v) { m = fmaxf(m, v); });
  const float M = block_fold<kRowThreads>(m, red_max, [](float a, float b) { return fmaxf(a, b); });
  const float mb = M == -INFINITY ? 0.0f : M * kLog2e;  // e^(x - M) = 2^(x log2e - M log2e)
  float s = 0.0f;
  each([&](float v) { s += exp2f(fmaf(v, kLog2e, -mb)); });
  const float S = block_fold<kRowThreads>(s, red_sum, [](float a, float b) { return a + b; });
  if (t == 0) losses[n] = M + logf(S) - x_tgt;
  if (d == nullptr) return;
  const float k = dloss / S;
#pragma unroll
  for (int i = 0; i < VECS; ++i) {
    const int c = (i * kRowThreads + t) * 8;
    if (c >= ldi) continue;
    write_grad8(d, c, r[i], Vi, ti, mb, k, dloss);
  }
}

// Rows in shared memory (rows_smem_kernel; the default for rows the registers kernel takes, since
// 2026-11-28): the registers kernel's 1024 threads at 64 registers leave one block, so one row, an
// SM, whose load, two block reductions and store run one after another (1.43 ms for GPT-2's 16384
// rows of 50304 on an H200: ~2.3 TB/s). Here a block of 512 threads copies its row into shared memory
// (cp.async, 16 bytes a piece; at most 57344 columns = 112 KiB) and two blocks share an SM, so one
// row's reductions run while the other's bytes move. The same expressions as the registers kernel;
// each thread visits vectors t, t + 512, ... (another order of the row's sum: other last bits, still
// fixed run to run). Not yet timed.
constexpr int kSmemThreads = 512;
constexpr int64_t kSmemRowMaxCols = 57344;  // 112 KiB of bf16: two blocks an SM within its 228 KiB

__device__ __forceinline__ void cp_async16(void* dst, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(static_cast<uint32_t>(__cvta_generic_to_shared(dst))),
               "l"(src));
}

// No __restrict__ on logits and dlogits (they may alias): the row is in shared memory (every copy
// waited for, then a barrier) before anything is stored.
__global__ void __launch_bounds__(kSmemThreads, 2)
    rows_smem_kernel(const bf16* logits, const int32_t* __restrict__ targets, float* __restrict__ losses,
                     bf16* dlogits, float dloss, int64_t V, int64_t ld) {
  extern __shared__ __align__(16) unsigned char smem_row[];  // ld bf16
  __shared__ float red_max[kSmemThreads / 32], red_sum[kSmemThreads / 32];
  uint4* row = reinterpret_cast<uint4*>(smem_row);
  const int t = threadIdx.x;
  const int64_t n = blockIdx.x;
  const bf16* x = logits + n * ld;
  bf16* d = dlogits != nullptr ? dlogits + n * ld : nullptr;
  const int64_t tgt = targets[n];
  if (tgt < 0 || tgt >= V) {  // the whole block: ignored (loss 0, gradient 0), or out of range (NaN)
    const float fill = tgt < 0 ? 0.0f : __int_as_float(0x7fc00000);
    if (t == 0) losses[n] = fill;
    if (d != nullptr)
      for (int64_t v = t; v < ld; v += kSmemThreads) d[v] = __float2bfloat16(v < V ? fill : 0.0f);
    return;
  }
  const int Vi = static_cast<int>(V), nv = static_cast<int>(ld / 8), ti = static_cast<int>(tgt);  // < 2^16
  for (int i = t; i < nv; i += kSmemThreads) cp_async16(row + i, x + 8 * static_cast<int64_t>(i));
  asm volatile("cp.async.commit_group;\n" ::: "memory");
  asm volatile("cp.async.wait_group 0;\n" ::: "memory");
  __syncthreads();  // every thread's pieces landed
  // Column 8 i + j of the row: vector i's word j / 2, low (j even) or high half.
  auto each = [&](auto fn) {
    for (int i = t; i < nv; i += kSmemThreads) {
      const uint4 r = row[i];
      const uint32_t w[4] = {r.x, r.y, r.z, r.w};
      const int c = 8 * i;
#pragma unroll
      for (int j = 0; j < 8; ++j)
        if (c + j < Vi) fn(j % 2 ? bf_hi(w[j / 2]) : bf_lo(w[j / 2]));
    }
  };
  float m = -INFINITY;
  each([&](float v) { m = fmaxf(m, v); });
  const float M = block_fold<kSmemThreads>(m, red_max, [](float a, float b) { return fmaxf(a, b); });
  const float mb = M == -INFINITY ? 0.0f : M * kLog2e;  // e^(x - M) = 2^(x log2e - M log2e)
  float sum = 0.0f;
  each([&](float v) { sum += exp2f(fmaf(v, kLog2e, -mb)); });
  const float S = block_fold<kSmemThreads>(sum, red_sum, [](float a, float b) { return a + b; });
  if (t == 0) losses[n] = M + logf(S) - __bfloat162float(reinterpret_cast<const bf16*>(smem_row)[ti]);
  if (d == nullptr) return;
  const float k = dloss / S;
  for (int i = t; i < nv; i += kSmemThreads) write_grad8(d, 8 * i, row[i], Vi, ti, mb, k, dloss);
}

template <int VECS>
void launch_rows(const bf16* logits, const int32_t* targets, float* losses, bf16* dlogits, float dloss, int64_t N,
                 int64_t V, int64_t ld, cudaStream_t s) {
  rows_kernel<VECS><<<static_cast<unsigned>(N), kRowThreads, 0, s>>>(logits, targets, losses, dlogits, dloss, V, ld);
  DHX_CUDA_LAUNCHED(rows_kernel);
}

// ---- vocabulary-parallel steps: one block of kVpThreads per row ----
constexpr int kVpThreads = 256;  // (block_fold above)

__global__ void xent_max_kernel(const bf16* __restrict__ logits, float* __restrict__ m, int64_t valid, int64_t ld) {
  __shared__ float red[kVpThreads / 32];
  const bf16* x = logits + blockIdx.x * ld;
  float v = -INFINITY;
  for (int64_t j = threadIdx.x; j < valid; j += kVpThreads) v = fmaxf(v, __bfloat162float(x[j]));
  const float all = block_fold<kVpThreads>(v, red, [](float a, float b) { return fmaxf(a, b); });
  if (threadIdx.x == 0) m[blockIdx.x] = all;
}

__global__ void xent_stats_kernel(const bf16* __restrict__ logits, const int32_t* __restrict__ targets,
                                  const float* __restrict__ m, float* __restrict__ stats, int64_t valid, int64_t ld,
                                  int64_t v0) {
  __shared__ float red[kVpThreads / 32];
  const int64_t n = blockIdx.x;
  const bf16* x = logits + n * ld;
  const float mx = m[n];
  float sum = 0.0f;
  for (int64_t j = threadIdx.x; j < valid; j += kVpThreads) sum += expf(__bfloat162float(x[j]) - mx);
  const float all = block_fold<kVpThreads>(sum, red, [](float a, float b) { return a + b; });
  if (threadIdx.x == 0) {
    const int64_t t = static_cast<int64_t>(targets[n]) - v0;
    stats[2 * n] = all;
    stats[2 * n + 1] = t >= 0 && t < valid ? __bfloat162float(x[t]) : 0.0f;
  }
}

// No __restrict__ on logits and dlogits (they may alias): each element is read, then written, by
// the same thread; the loss reads only m and stats.
__global__ void xent_finish_kernel(const bf16* logits, const int32_t* __restrict__ targets,
                                   const float* __restrict__ m, const float* __restrict__ stats,
                                   float* __restrict__ losses, bf16* dlogits, float dloss, int64_t valid, int64_t ld,
                                   int64_t v0, int64_t vocab) {
  const int64_t n = blockIdx.x;
  const float S = stats[2 * n], mx = m[n];
  const int64_t tgt = targets[n];
  bf16* d = dlogits + n * ld;
  if (tgt < 0 || tgt >= vocab) {  // ignored (loss 0, gradient 0), or out of range (NaN: loud)
    const float fill = tgt < 0 ? 0.0f : __int_as_float(0x7fc00000);
    if (threadIdx.x == 0) losses[n] = fill;
    const bf16 f = __float2bfloat16(fill);
    for (int64_t j = threadIdx.x; j < ld; j += kVpThreads) d[j] = j < valid ? f : __float2bfloat16(0.0f);
    return;
  }
  if (threadIdx.x == 0) losses[n] = logf(S) + mx - stats[2 * n + 1];
  const bf16* x = logits + n * ld;
  const int64_t t = tgt - v0;
  const float inv = 1.0f / S;
  for (int64_t j = threadIdx.x; j < ld; j += kVpThreads) {
    float g = 0.0f;
    if (j < valid) {
      g = expf(__bfloat162float(x[j]) - mx) * inv * dloss;
      if (j == t) g -= dloss;
    }
    d[j] = __float2bfloat16(g);
  }
}

void vp_check(int64_t N, int64_t valid, int64_t ld, const char* what) {
  DHX_CUDA_ASSERT(N >= 0 && N < (int64_t{1} << 31) && valid >= 0 && ld >= valid && ld >= 1, what, ": N=", N,
                  " valid=", valid, " ld=", ld, " (need 0 <= N < 2^31, 0 <= valid <= ld)");
}

}  // namespace

void xent_row_max(const bf16* logits, float* m, int64_t N, int64_t valid, int64_t ld, cudaStream_t s) {
  vp_check(N, valid, ld, "xent_row_max");
  if (N == 0) return;
  xent_max_kernel<<<static_cast<unsigned>(N), kVpThreads, 0, s>>>(logits, m, valid, ld);
  DHX_CUDA_LAUNCHED(xent_max_kernel);
}

void xent_row_stats(const bf16* logits, const int32_t* targets, const float* m, float* stats, int64_t N,
                    int64_t valid, int64_t ld, int64_t v0, cudaStream_t s) {
  vp_check(N, valid, ld, "xent_row_stats");
  if (N == 0) return;
  xent_stats_kernel<<<static_cast<unsigned>(N), kVpThreads, 0, s>>>(logits, targets, m, stats, valid, ld, v0);
  DHX_CUDA_LAUNCHED(xent_stats_kernel);
}

void xent_row_finish(const bf16* logits, const int32_t* targets, const float* m, const float* stats, float* losses,
                     bf16* dlogits, float dloss, int64_t N, int64_t valid, int64_t ld, int64_t v0, int64_t vocab,
                     cudaStream_t s) {
  vp_check(N, valid, ld, "xent_row_finish");
  DHX_CUDA_ASSERT(vocab >= v0 + valid, "xent_row_finish: vocab=", vocab, " ends before this shard's columns [", v0,
                  ", ", v0 + valid, ")");
  if (N == 0) return;
  xent_finish_kernel<<<static_cast<unsigned>(N), kVpThreads, 0, s>>>(logits, targets, m, stats, losses, dlogits,
                                                                     dloss, valid, ld, v0, vocab);
  DHX_CUDA_LAUNCHED(xent_finish_kernel);
}

void cross_entropy_fwd_bwd(const bf16* logits, const int32_t* targets, float* losses, bf16* dlogits, float dloss,
                           int64_t N, int64_t V, cudaStream_t s) {
  cross_entropy_fwd_bwd_strided(logits, targets, losses, dlogits, dloss, N, V, V, s);
}

namespace {
// Which kernel a row takes: rows of 16-byte vectors (ld % 8 == 0, both pointers 16-byte aligned)
// from 2048 to 57344 columns go to shared memory (or, registers: the registers kernel, the kernel
// bench's comparison); the rest to the general kernel.
void xent_dispatch(const bf16* logits, const int32_t* targets, float* losses, bf16* dlogits, float dloss, int64_t N,
                   int64_t V, int64_t ld, bool registers, cudaStream_t s) {
  DHX_CUDA_ASSERT(N >= 0 && N < (int64_t{1} << 31) && V >= 1 && ld >= V, "cross_entropy_fwd_bwd: N=", N, " V=", V,
                  " ld=", ld, " (need 0 <= N < 2^31, 1 <= V <= ld)");
  if (N == 0) return;
  const bool aligned = ld % 8 == 0 && reinterpret_cast<uintptr_t>(logits) % 16 == 0 &&
                       reinterpret_cast<uintptr_t>(dlogits) % 16 == 0;
  const int64_t vecs = (ld / 8 + kRowThreads - 1) / kRowThreads;
  static_assert(kSmemRowMaxCols == int64_t{kRowMaxVecs} * 8 * kRowThreads, "the two row kernels take the same rows");
  if (aligned && ld >= 2048 && vecs <= kRowMaxVecs) {
    if (!registers) {
      const size_t smem = static_cast<size_t>(ld) * sizeof(bf16);
      // The kernel's most, the same on every call (two threads with different ld cannot race the
      // limit below either's need).
      DHX_CUDA(cudaFuncSetAttribute(rows_smem_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    static_cast<int>(kSmemRowMaxCols * sizeof(bf16))));
      rows_smem_kernel<<<static_cast<unsigned>(N), kSmemThreads, smem, s>>>(logits, targets, losses, dlogits, dloss,
                                                                            V, ld);
      DHX_CUDA_LAUNCHED(rows_smem_kernel);
      return;
    }
    switch (vecs) {
      case 1: return launch_rows<1>(logits, targets, losses, dlogits, dloss, N, V, ld, s);
      case 2: return launch_rows<2>(logits, targets, losses, dlogits, dloss, N, V, ld, s);
      case 3: return launch_rows<3>(logits, targets, losses, dlogits, dloss, N, V, ld, s);
      case 4: return launch_rows<4>(logits, targets, losses, dlogits, dloss, N, V, ld, s);
      case 5: return launch_rows<5>(logits, targets, losses, dlogits, dloss, N, V, ld, s);
      case 6: return launch_rows<6>(logits, targets, losses, dlogits, dloss, N, V, ld, s);
      default: return launch_rows<7>(logits, targets, losses, dlogits, dloss, N, V, ld, s);
    }
  }
  cross_entropy_kernel<<<static_cast<unsigned>(N), kCeThreads, 0, s>>>(logits, targets, losses, dlogits, dloss, V,
                                                                       ld);
  DHX_CUDA_LAUNCHED(cross_entropy_kernel);
}
}  // namespace

void cross_entropy_fwd_bwd_strided(const bf16* logits, const int32_t* targets, float* losses, bf16* dlogits,
                                   float dloss, int64_t N, int64_t V, int64_t ld, cudaStream_t s) {
  xent_dispatch(logits, targets, losses, dlogits, dloss, N, V, ld, false, s);
}

void cross_entropy_rows_in_registers(const bf16* logits, const int32_t* targets, float* losses, bf16* dlogits,
                                     float dloss, int64_t N, int64_t V, int64_t ld, cudaStream_t s) {
  xent_dispatch(logits, targets, losses, dlogits, dloss, N, V, ld, true, s);
}

}  // namespace dhelix::cuda
