// AdamW update on a flat parameter buffer, written in the order torch.optim.AdamW (single-tensor,
// non-capturable) evaluates it, so fp32 results track PyTorch closely:
//   p *= 1 - lr wd;  m = m + (1 - b1)(g - m);  v = b2 v + (1 - b2) g^2;
//   p -= (lr / (1 - b1^t)) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)
// Scalar factors are formed in double, then rounded to T once.
#include <cmath>

#include "base/Error.h"
#include "kernels/cpu/Kernels.h"
#include "kernels/cpu/Parallel.h"

namespace dhelix::cpu {

template <typename T> void adamw_step(T* p, const T* g, T* m, T* v, int64_t n, const AdamWParams& a) {
  DHX_CHECK(a.step >= 1, ConfigError, "adamw_step: step={} must be >= 1 (1-based)", a.step);
  const T decay = T(1.0 - a.lr * a.weight_decay);
  const T one_m_b1 = T(1.0 - a.beta1), b2 = T(a.beta2), one_m_b2 = T(1.0 - a.beta2);
  const T step_size = T(a.lr / (1.0 - std::pow(a.beta1, double(a.step))));
  const T bc2_sqrt = T(std::sqrt(1.0 - std::pow(a.beta2, double(a.step))));
  const T eps = T(a.eps);
#pragma omp parallel for simd num_threads(detail::threads_for(n)) schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    const T gi = g[i];
    const T mi = m[i] + one_m_b1 * (gi - m[i]);
    const T vi = v[i] * b2 + one_m_b2 * gi * gi;
    const T denom = std::sqrt(vi) / bc2_sqrt + eps;
    p[i] = p[i] * decay - step_size * (mi / denom);
    m[i] = mi;
    v[i] = vi;
  }
}

template void adamw_step<float>(float*, const float*, float*, float*, int64_t, const AdamWParams&);
template void adamw_step<double>(double*, const double*, double*, double*, int64_t, const AdamWParams&);

}  // namespace dhelix::cpu
