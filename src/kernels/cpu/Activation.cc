// Pointwise activations: GELU (tanh approximation, GPT-2) and SwiGLU (Llama MLP), forward and
// backward. Loops are `parallel for simd`; tanh/exp come from FastMath.h so float vectorises.
#include <cmath>

#include "kernels/cpu/FastMath.h"
#include "kernels/cpu/Kernels.h"
#include "kernels/cpu/Parallel.h"

namespace dhelix::cpu {
namespace {
constexpr double kSqrt2OverPi = 0.7978845608028654;  // sqrt(2/pi)
constexpr double kGeluCubic = 0.044715;
}  // namespace

template <typename T> void gelu_fwd(const T* x, T* y, int64_t n) {
  const T k0 = T(kSqrt2OverPi), k1 = T(kGeluCubic);
#pragma omp parallel for simd num_threads(detail::threads_for(n)) schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    const T v = x[i];
    const T t = detail::tanh_k<T>(k0 * (v + k1 * v * v * v));
    y[i] = T(0.5) * v * (T(1) + t);
  }
}

// d/dx [x/2 (1 + tanh u)] = (1 + t)/2 + x/2 (1 - t^2) du/dx,  u = k0 (x + k1 x^3), du/dx = k0 (1 + 3 k1 x^2).
template <typename T> void gelu_bwd(const T* dy, const T* x, T* dx, int64_t n) {
  const T k0 = T(kSqrt2OverPi), k1 = T(kGeluCubic);
#pragma omp parallel for simd num_threads(detail::threads_for(n)) schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    const T v = x[i];
    const T t = detail::tanh_k<T>(k0 * (v + k1 * v * v * v));
    const T du = k0 * (T(1) + T(3) * k1 * v * v);
    dx[i] = dy[i] * (T(0.5) * (T(1) + t) + T(0.5) * v * (T(1) - t * t) * du);
  }
}

// y[n, f] = silu(a) u with a = gu[n, f], u = gu[n, F + f], silu(a) = a s, s = 1 / (1 + e^-a).
template <typename T> void swiglu_fwd(const T* gu, T* y, int64_t N, int64_t F) {
#pragma omp parallel for num_threads(detail::threads_for(N * F)) schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    const T* a = gu + n * 2 * F;
    const T* u = a + F;
    T* yr = y + n * F;
#pragma omp simd
    for (int64_t f = 0; f < F; ++f) yr[f] = a[f] / (T(1) + detail::exp_k<T>(-a[f])) * u[f];
  }
}

// d silu(a)/da = s (1 + a (1 - s)):  dgate = dy u s (1 + a (1 - s)),  dup = dy a s.
template <typename T> void swiglu_bwd(const T* dy, const T* gu, T* dgu, int64_t N, int64_t F) {
#pragma omp parallel for num_threads(detail::threads_for(N * F)) schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    const T* a = gu + n * 2 * F;
    const T* u = a + F;
    const T* dyr = dy + n * F;
    T* da = dgu + n * 2 * F;
    T* du = da + F;
#pragma omp simd
    for (int64_t f = 0; f < F; ++f) {
      const T s = T(1) / (T(1) + detail::exp_k<T>(-a[f]));
      da[f] = dyr[f] * u[f] * s * (T(1) + a[f] * (T(1) - s));
      du[f] = dyr[f] * a[f] * s;
    }
  }
}

#define DHX_INSTANTIATE(T)                                                  \
  template void gelu_fwd<T>(const T*, T*, int64_t);                         \
  template void gelu_bwd<T>(const T*, const T*, T*, int64_t);               \
  template void swiglu_fwd<T>(const T*, T*, int64_t, int64_t);              \
  template void swiglu_bwd<T>(const T*, const T*, T*, int64_t, int64_t);
DHX_INSTANTIATE(float)
DHX_INSTANTIATE(double)
#undef DHX_INSTANTIATE

}  // namespace dhelix::cpu
