// Elementwise helpers: residual adds, scaling, and the sum of squares used for gradient-norm
// clipping (accumulated in double, per-thread partials combined in thread order so the result
// is deterministic for a given thread count).
#include <omp.h>

#include <vector>

#include "kernels/cpu/Kernels.h"
#include "kernels/cpu/Parallel.h"

namespace dhelix::cpu {

template <typename T> void add(const T* a, const T* b, T* y, int64_t n) {
#pragma omp parallel for simd num_threads(detail::threads_for(n)) schedule(static)
  for (int64_t i = 0; i < n; ++i) y[i] = a[i] + b[i];
}

template <typename T> void add_bias(const T* a, const T* b, const T* bias, T* y, int64_t N, int64_t C) {
#pragma omp parallel for num_threads(detail::threads_for(N * C)) schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    const T *ar = a + n * C, *br = b + n * C;
    T* yr = y + n * C;
#pragma omp simd
    for (int64_t c = 0; c < C; ++c) yr[c] = (ar[c] + br[c]) + bias[c];
  }
}

template <typename T> void add_inplace(T* y, const T* x, int64_t n) {
#pragma omp parallel for simd num_threads(detail::threads_for(n)) schedule(static)
  for (int64_t i = 0; i < n; ++i) y[i] += x[i];
}

template <typename T> void scale_inplace(T* y, T s, int64_t n) {
#pragma omp parallel for simd num_threads(detail::threads_for(n)) schedule(static)
  for (int64_t i = 0; i < n; ++i) y[i] *= s;
}

template <typename T> double sum_squares(const T* x, int64_t n) {
  const int nt = detail::threads_for(n);
  std::vector<double> parts(nt, 0.0);
#pragma omp parallel num_threads(nt)
  {
    const int t = omp_get_thread_num(), team = omp_get_num_threads();
    const int64_t lo = n * t / team, hi = n * (t + 1) / team;
    double s = 0;
#pragma omp simd reduction(+ : s)
    for (int64_t i = lo; i < hi; ++i) s += double(x[i]) * double(x[i]);
    parts[t] = s;
  }
  double total = 0;
  for (double p : parts) total += p;
  return total;
}

#define DHX_INSTANTIATE(T)                                    \
  template void add<T>(const T*, const T*, T*, int64_t);      \
  template void add_bias<T>(const T*, const T*, const T*, T*, int64_t, int64_t); \
  template void add_inplace<T>(T*, const T*, int64_t);        \
  template void scale_inplace<T>(T*, T, int64_t);             \
  template double sum_squares<T>(const T*, int64_t);
DHX_INSTANTIATE(float)
DHX_INSTANTIATE(double)
#undef DHX_INSTANTIATE

}  // namespace dhelix::cpu
