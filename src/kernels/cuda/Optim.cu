// AdamW on the GPU (Ops.h): one grid-stride launch over a flat fp32 parameter buffer, cpu::adamw_step's
// formula and evaluation order (torch.optim.AdamW's), with the gradient scaled first (clipping) and
// the step's bf16 copy of the weights written in the same pass. Scalars are formed in double on the
// host and rounded to fp32 once, as on the CPU. Bytes moved: 28n (p, m, v read and written, g read),
// +2n with the bf16 copy; ~15 FLOPs an element. 16-byte accesses where the buffers allow
// (adamw_vec_kernel, 2026-11-28, not yet timed).
#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/cuda/Ops.h"

namespace dhelix::cuda {

namespace {

struct AdamWScalars {
  float decay, one_m_b1, b2, one_m_b2, step_size, bc2_sqrt, eps, grad_scale;
};

// One element: cpu::adamw_step's expressions in its order, each rounding spelled out (the _rn
// intrinsics are never contracted or reordered by the compiler; the two moments' updates are written
// as fused multiply-adds, one rounding each), so an element gets the same bits in every kernel below
// and wherever a launch's range starts.
__device__ __forceinline__ void adamw_one(float& p, float g, float& m, float& v, const AdamWScalars& a) {
  const float gi = __fmul_rn(g, a.grad_scale);
  const float mi = __fmaf_rn(a.one_m_b1, __fsub_rn(gi, m), m);                     // m + (1 - b1)(g - m)
  const float vi = __fmaf_rn(v, a.b2, __fmul_rn(__fmul_rn(a.one_m_b2, gi), gi));   // v b2 + (1 - b2) g g
  const float denom = __fadd_rn(__fdiv_rn(__fsqrt_rn(vi), a.bc2_sqrt), a.eps);      // sqrt(v) / sqrt(bc2) + eps
  p = __fsub_rn(__fmul_rn(p, a.decay), __fmul_rn(a.step_size, __fdiv_rn(mi, denom)));  // p decay - lr' m / denom
  m = mi;
  v = vi;
}

// Element i of the buffers updated in place (and its bf16 copy written when there is one).
__device__ __forceinline__ void adamw_at(float* p, const float* g, float* m, float* v, bf16* p_bf16, int64_t i,
                                         const AdamWScalars& a) {
  float pi = p[i], mi = m[i], vi = v[i];
  adamw_one(pi, g[i], mi, vi, a);
  p[i] = pi;
  m[i] = mi;
  v[i] = vi;
  if (p_bf16 != nullptr) p_bf16[i] = __float2bfloat16(pi);
}

__global__ void adamw_kernel(float* __restrict__ p, const float* __restrict__ g, float* __restrict__ m,
                             float* __restrict__ v, bf16* __restrict__ p_bf16, int64_t n, AdamWScalars a) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    adamw_at(p, g, m, v, p_bf16, i, a);
}

// The same update with 16-byte accesses: elements [head, head + 4 units) four at a time (p, g, m, v
// 16-byte aligned there, p_bf16 8-byte), the `head` elements before and the tail after by single
// threads. (Scalar loads left the launch at ~3.3 TB/s on an H200: 9.9 ms for Llama-1B's 1.1B
// parameters, 2026-11-27.)
__global__ void adamw_vec_kernel(float* __restrict__ p, const float* __restrict__ g, float* __restrict__ m,
                                 float* __restrict__ v, bf16* __restrict__ p_bf16, int64_t n, int64_t head,
                                 int64_t units, AdamWScalars a) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  for (int64_t u = first; u < units; u += stride) {
    const int64_t i = head + 4 * u;
    float4 p4 = *reinterpret_cast<const float4*>(p + i), m4 = *reinterpret_cast<const float4*>(m + i),
           v4 = *reinterpret_cast<const float4*>(v + i);
    const float4 g4 = *reinterpret_cast<const float4*>(g + i);
    adamw_one(p4.x, g4.x, m4.x, v4.x, a);
    adamw_one(p4.y, g4.y, m4.y, v4.y, a);
    adamw_one(p4.z, g4.z, m4.z, v4.z, a);
    adamw_one(p4.w, g4.w, m4.w, v4.w, a);
    *reinterpret_cast<float4*>(p + i) = p4;
    *reinterpret_cast<float4*>(m + i) = m4;
    *reinterpret_cast<float4*>(v + i) = v4;
    if (p_bf16 != nullptr) {
      __nv_bfloat162* o = reinterpret_cast<__nv_bfloat162*>(p_bf16 + i);
      o[0] = __floats2bfloat162_rn(p4.x, p4.y);
      o[1] = __floats2bfloat162_rn(p4.z, p4.w);
    }
  }
  // The elements outside the units: [0, head) and [head + 4 units, n), at most 3 + 3.
  const int64_t tail = n - head - 4 * units;
  if (first < head + tail) {
    const int64_t i = first < head ? first : head + 4 * units + (first - head);
    adamw_at(p, g, m, v, p_bf16, i, a);
  }
}

// ---- adamw_step_many's shared launch: up to kManyRuns runs passed by value ----
constexpr int kManyRuns = 256;
constexpr int kManyThreads = 256;
constexpr int64_t kManyChunk = 4096;  // elements a block: 16 a thread
struct ManyRuns {
  float* p[kManyRuns];
  const float* g[kManyRuns];
  float* m[kManyRuns];
  float* v[kManyRuns];
  bf16* p_bf16[kManyRuns];
  int64_t n[kManyRuns];
  int64_t chunk0[kManyRuns + 1];  // run k's chunks: [chunk0[k], chunk0[k + 1])
  uint8_t decay[kManyRuns];
  int runs;
};
static_assert(sizeof(ManyRuns) < 32000, "kernel parameters are at most 32764 bytes");

// Block b: chunk b of the batch (its run by binary search of chunk0), one element a thread a step.
__global__ void __launch_bounds__(kManyThreads) adamw_many_kernel(const __grid_constant__ ManyRuns r,
                                                                  AdamWScalars decayed, AdamWScalars plain) {
  const int64_t b = blockIdx.x;
  const int lo = ops_detail::chunk_owner(r.chunk0, r.runs, b);
  const AdamWScalars& a = r.decay[lo] ? decayed : plain;
  const int64_t c0 = (b - r.chunk0[lo]) * kManyChunk;
  const int64_t end = c0 + kManyChunk < r.n[lo] ? c0 + kManyChunk : r.n[lo];
  float* p = r.p[lo];
  const float* g = r.g[lo];
  float* m = r.m[lo];
  float* v = r.v[lo];
  bf16* p16 = r.p_bf16[lo];
  for (int64_t i = c0 + threadIdx.x; i < end; i += kManyThreads) adamw_at(p, g, m, v, p16, i, a);
}

// The float index of a pointer modulo 4 (its 4-byte word within a 16-byte line); bf16: 2-byte units
// modulo 4 within 8 bytes.
int phase4(const void* ptr, int unit) {
  return static_cast<int>(reinterpret_cast<uintptr_t>(ptr) / static_cast<uintptr_t>(unit) % 4);
}

// The update's fp32 scalars, formed in double and rounded once (as on the CPU).
AdamWScalars scalars(const AdamWParams& a, float grad_scale) {
  return AdamWScalars{static_cast<float>(1.0 - a.lr * a.weight_decay),
                      static_cast<float>(1.0 - a.beta1),
                      static_cast<float>(a.beta2),
                      static_cast<float>(1.0 - a.beta2),
                      static_cast<float>(a.lr / (1.0 - std::pow(a.beta1, static_cast<double>(a.step)))),
                      static_cast<float>(std::sqrt(1.0 - std::pow(a.beta2, static_cast<double>(a.step)))),
                      static_cast<float>(a.eps),
                      grad_scale};
}
}  // namespace

void adamw_step(float* p, const float* g, float* m, float* v, bf16* p_bf16, int64_t n, const AdamWParams& a,
                float grad_scale, cudaStream_t s) {
  DHX_CUDA_ASSERT(n >= 0 && a.step >= 1, "adamw_step: n=", n, " step=", a.step,
                  " (need n >= 0 and a 1-based step)");
  if (n == 0) return;
  const AdamWScalars k = scalars(a, grad_scale);
  constexpr int kThreads = 256;
  // 16-byte accesses when p, g, m, v (and the copy) sit at the same offset within their lines, as
  // the flat buffers' runs do: a head of 0-3 elements brings them to a line's start together.
  const int ph = phase4(p, 4);
  const bool in_phase = reinterpret_cast<uintptr_t>(p) % 4 == 0 && reinterpret_cast<uintptr_t>(g) % 4 == 0 &&
                        reinterpret_cast<uintptr_t>(m) % 4 == 0 && reinterpret_cast<uintptr_t>(v) % 4 == 0 &&
                        phase4(g, 4) == ph && phase4(m, 4) == ph && phase4(v, 4) == ph &&
                        (p_bf16 == nullptr || (reinterpret_cast<uintptr_t>(p_bf16) % 2 == 0 && phase4(p_bf16, 2) == ph));
  const int64_t head = std::min<int64_t>((4 - ph) % 4, n), units = (n - head) / 4;
  if (in_phase && units > 0) {
    adamw_vec_kernel<<<ops_detail::stride_grid(units, kThreads), kThreads, 0, s>>>(p, g, m, v, p_bf16, n, head, units,
                                                                                    k);
    DHX_CUDA_LAUNCHED(adamw_vec_kernel);
    return;
  }
  adamw_kernel<<<ops_detail::stride_grid(n, kThreads), kThreads, 0, s>>>(p, g, m, v, p_bf16, n, k);
  DHX_CUDA_LAUNCHED(adamw_kernel);
}

void adamw_step_many(const std::vector<AdamWRun>& runs, const AdamWParams& a, float grad_scale, cudaStream_t s) {
  DHX_CUDA_ASSERT(a.step >= 1, "adamw_step_many: step=", a.step, " (need a 1-based step)");
  AdamWParams plain_params = a;
  plain_params.weight_decay = 0.0;
  const AdamWScalars decayed = scalars(a, grad_scale), plain = scalars(plain_params, grad_scale);
  ManyRuns batch{};
  int64_t chunks = 0;
  auto launch = [&] {
    if (batch.runs == 0) return;
    batch.chunk0[batch.runs] = chunks;
    adamw_many_kernel<<<static_cast<unsigned>(chunks), kManyThreads, 0, s>>>(batch, decayed, plain);
    DHX_CUDA_LAUNCHED(adamw_many_kernel);
    batch = ManyRuns{};
    chunks = 0;
  };
  for (const AdamWRun& r : runs) {
    DHX_CUDA_ASSERT(r.n >= 0, "adamw_step_many: a run of n=", r.n, " elements");
    if (r.n == 0) continue;
    if (r.n >= kAdamWManyAlone) {  // alone, with adamw_step's 16-byte accesses (the same bits)
      adamw_step(r.p, r.g, r.m, r.v, r.p_bf16, r.n, r.decay ? a : plain_params, grad_scale, s);
      continue;
    }
    const int k = batch.runs;
    batch.p[k] = r.p, batch.g[k] = r.g, batch.m[k] = r.m, batch.v[k] = r.v, batch.p_bf16[k] = r.p_bf16;
    batch.n[k] = r.n;
    batch.decay[k] = r.decay ? 1 : 0;
    batch.chunk0[k] = chunks;
    chunks += cdiv(r.n, kManyChunk);
    if (++batch.runs == kManyRuns) launch();
  }
  launch();
}

}  // namespace dhelix::cuda
