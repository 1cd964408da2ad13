// AdamW on the GPU (Ops.h): one grid-stride launch over a flat fp32 parameter buffer, cpu::adamw_step's
// formula and evaluation order (torch.optim.AdamW's), with the gradient scaled first (clipping) and
// the step's bf16 copy of the weights written in the same pass. Scalars are formed in double on the
// host and rounded to fp32 once, as on the CPU. Bytes moved: 28n (p, m, v read and written, g read),
// +2n with the bf16 copy; ~15 FLOPs an element. Not yet timed on the H100.
#include <cmath>

#include "kernels/cuda/Ops.h"

namespace dhelix::cuda {

namespace {

struct AdamWScalars {
  float decay, one_m_b1, b2, one_m_b2, step_size, bc2_sqrt, eps, grad_scale;
};

__global__ void adamw_kernel(float* __restrict__ p, const float* __restrict__ g, float* __restrict__ m,
                             float* __restrict__ v, bf16* __restrict__ p_bf16, int64_t n, AdamWScalars a) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const float gi = g[i] * a.grad_scale;
    const float mi = m[i] + a.one_m_b1 * (gi - m[i]);
    const float vi = v[i] * a.b2 + a.one_m_b2 * gi * gi;
    const float denom = sqrtf(vi) / a.bc2_sqrt + a.eps;
    const float pi = p[i] * a.decay - a.step_size * (mi / denom);
    p[i] = pi;
    m[i] = mi;
    v[i] = vi;
    if (p_bf16 != nullptr) p_bf16[i] = __float2bfloat16(pi);
  }
}

}  // namespace

void adamw_step(float* p, const float* g, float* m, float* v, bf16* p_bf16, int64_t n, const AdamWParams& a,
                float grad_scale, cudaStream_t s) {
  DHX_CUDA_ASSERT(n >= 0 && a.step >= 1, "adamw_step: n=", n, " step=", a.step,
                  " (need n >= 0 and a 1-based step)");
  if (n == 0) return;
  const AdamWScalars k{static_cast<float>(1.0 - a.lr * a.weight_decay),
                       static_cast<float>(1.0 - a.beta1),
                       static_cast<float>(a.beta2),
                       static_cast<float>(1.0 - a.beta2),
                       static_cast<float>(a.lr / (1.0 - std::pow(a.beta1, static_cast<double>(a.step)))),
                       static_cast<float>(std::sqrt(1.0 - std::pow(a.beta2, static_cast<double>(a.step)))),
                       static_cast<float>(a.eps),
                       grad_scale};
  constexpr int kThreads = 256;
  adamw_kernel<<<ops_detail::stride_grid(n, kThreads), kThreads, 0, s>>>(p, g, m, v, p_bf16, n, k);
  DHX_CUDA_LAUNCHED(adamw_kernel);
}

}  // namespace dhelix::cuda
