// Fused softmax cross-entropy over the vocabulary on the GPU (Ops.h), llm.c's fused classifier:
// one block of 512 threads per row. Pass 1: each thread keeps an online (max, sum of exp) over
// columns v = t, t + 512, ...; the pairs merge by a fixed warp butterfly, then every thread folds the
// 16 warps' pairs in warp order (the same bits in every thread). Pass 2 (when dlogits is wanted)
// re-reads the row (from L2) and writes (softmax - onehot) * dloss, never storing probabilities.
// 2-byte accesses: GPT-2's V = 50257 leaves rows unaligned. Bytes moved: 2NV forward only, 6NV
// with the gradient (+ 8N). ~3 exp per logit. Not yet timed on the H100.
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

}  // namespace

void cross_entropy_fwd_bwd(const bf16* logits, const int32_t* targets, float* losses, bf16* dlogits, float dloss,
                           int64_t N, int64_t V, cudaStream_t s) {
  cross_entropy_fwd_bwd_strided(logits, targets, losses, dlogits, dloss, N, V, V, s);
}

void cross_entropy_fwd_bwd_strided(const bf16* logits, const int32_t* targets, float* losses, bf16* dlogits,
                                   float dloss, int64_t N, int64_t V, int64_t ld, cudaStream_t s) {
  DHX_CUDA_ASSERT(N >= 0 && N < (int64_t{1} << 31) && V >= 1 && ld >= V, "cross_entropy_fwd_bwd: N=", N, " V=", V,
                  " ld=", ld, " (need 0 <= N < 2^31, 1 <= V <= ld)");
  if (N == 0) return;
  cross_entropy_kernel<<<static_cast<unsigned>(N), kCeThreads, 0, s>>>(logits, targets, losses, dlogits, dloss, V,
                                                                       ld);
  DHX_CUDA_LAUNCHED(cross_entropy_kernel);
}

}  // namespace dhelix::cuda
