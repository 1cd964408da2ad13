// LayerNorm and RMSNorm over the last dimension C of [N, C] rows, forward and backward.
// One OpenMP pass over rows; the parameter gradients dg/db are summed into per-thread partials
// and then reduced in thread order (deterministic for a given thread count, no atomics).
#include <omp.h>

#include <cmath>
#include <vector>

#include "kernels/cpu/Kernels.h"
#include "kernels/cpu/Parallel.h"

namespace dhelix::cpu {
namespace {

// parts[nt, K] -> out[K] += sum over threads, in thread order.
template <typename T> void reduce_partials(const std::vector<T>& parts, int nt, int64_t K, T* out, int64_t stride,
                                           int64_t offset) {
  for (int t = 0; t < nt; ++t) {
    const T* p = parts.data() + t * stride + offset;
#pragma omp simd
    for (int64_t c = 0; c < K; ++c) out[c] += p[c];
  }
}

}  // namespace

template <typename T>
void layernorm_fwd(const T* x, const T* g, const T* b, T* y, T* mean, T* rstd, int64_t N, int64_t C, T eps) {
#pragma omp parallel for num_threads(detail::threads_for(N * C)) schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    const T* xr = x + n * C;
    T* yr = y + n * C;
    T s = 0;
#pragma omp simd reduction(+ : s)
    for (int64_t c = 0; c < C; ++c) s += xr[c];
    const T mu = s / T(C);
    T v = 0;  // two-pass variance: no cancellation for rows with a large mean
#pragma omp simd reduction(+ : v)
    for (int64_t c = 0; c < C; ++c) v += (xr[c] - mu) * (xr[c] - mu);
    const T rs = T(1) / std::sqrt(v / T(C) + eps);
    if (b != nullptr) {
#pragma omp simd
      for (int64_t c = 0; c < C; ++c) yr[c] = (xr[c] - mu) * rs * g[c] + b[c];
    } else {
#pragma omp simd
      for (int64_t c = 0; c < C; ++c) yr[c] = (xr[c] - mu) * rs * g[c];
    }
    mean[n] = mu;
    rstd[n] = rs;
  }
}

// With xh = (x - mean) rstd and dxh = dy g:  dx = rstd (dxh - mean(dxh) - xh mean(dxh xh)).
template <typename T>
void layernorm_bwd(const T* dy, const T* x, const T* g, const T* mean, const T* rstd, T* dx, T* dg, T* db, int64_t N,
                   int64_t C) {
  const int nt = detail::threads_for(N * C);
  std::vector<T> parts(static_cast<size_t>(nt) * 2 * C, T(0));  // per thread: dg[C], db[C]
#pragma omp parallel num_threads(nt)
  {
    T* pdg = parts.data() + static_cast<int64_t>(omp_get_thread_num()) * 2 * C;
    T* pdb = pdg + C;
#pragma omp for schedule(static)
    for (int64_t n = 0; n < N; ++n) {
      const T* xr = x + n * C;
      const T* dyr = dy + n * C;
      T* dxr = dx + n * C;
      const T mu = mean[n], rs = rstd[n];
      T a = 0, bb = 0;
#pragma omp simd reduction(+ : a, bb)
      for (int64_t c = 0; c < C; ++c) {
        const T dxh = dyr[c] * g[c];
        a += dxh;
        bb += dxh * (xr[c] - mu) * rs;
      }
      a /= T(C);
      bb /= T(C);
#pragma omp simd
      for (int64_t c = 0; c < C; ++c) {
        const T xh = (xr[c] - mu) * rs;
        dxr[c] = rs * (dyr[c] * g[c] - a - xh * bb);
        pdg[c] += dyr[c] * xh;
        pdb[c] += dyr[c];
      }
    }
  }
  reduce_partials(parts, nt, C, dg, 2 * C, 0);
  if (db != nullptr) reduce_partials(parts, nt, C, db, 2 * C, C);
}

template <typename T> void rmsnorm_fwd(const T* x, const T* g, T* y, T* rstd, int64_t N, int64_t C, T eps) {
#pragma omp parallel for num_threads(detail::threads_for(N * C)) schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    const T* xr = x + n * C;
    T* yr = y + n * C;
    T s = 0;
#pragma omp simd reduction(+ : s)
    for (int64_t c = 0; c < C; ++c) s += xr[c] * xr[c];
    const T rs = T(1) / std::sqrt(s / T(C) + eps);
#pragma omp simd
    for (int64_t c = 0; c < C; ++c) yr[c] = xr[c] * rs * g[c];
    rstd[n] = rs;
  }
}

// y = x r g with r = (mean(x^2) + eps)^(-1/2), dr/dx = -r^3 x / C:
// dx = r (dy g) - x r^3 mean(dy g x).
template <typename T>
void rmsnorm_bwd(const T* dy, const T* x, const T* g, const T* rstd, T* dx, T* dg, int64_t N, int64_t C) {
  const int nt = detail::threads_for(N * C);
  std::vector<T> parts(static_cast<size_t>(nt) * C, T(0));  // per thread: dg[C]
#pragma omp parallel num_threads(nt)
  {
    T* pdg = parts.data() + static_cast<int64_t>(omp_get_thread_num()) * C;
#pragma omp for schedule(static)
    for (int64_t n = 0; n < N; ++n) {
      const T* xr = x + n * C;
      const T* dyr = dy + n * C;
      T* dxr = dx + n * C;
      const T rs = rstd[n];
      T a = 0;
#pragma omp simd reduction(+ : a)
      for (int64_t c = 0; c < C; ++c) a += dyr[c] * g[c] * xr[c];
      const T k = rs * rs * rs * a / T(C);
#pragma omp simd
      for (int64_t c = 0; c < C; ++c) {
        dxr[c] = rs * dyr[c] * g[c] - xr[c] * k;
        pdg[c] += dyr[c] * xr[c] * rs;
      }
    }
  }
  reduce_partials(parts, nt, C, dg, C, 0);
}

#define DHX_INSTANTIATE(T)                                                                                   \
  template void layernorm_fwd<T>(const T*, const T*, const T*, T*, T*, T*, int64_t, int64_t, T);            \
  template void layernorm_bwd<T>(const T*, const T*, const T*, const T*, const T*, T*, T*, T*, int64_t,      \
                                 int64_t);                                                                   \
  template void rmsnorm_fwd<T>(const T*, const T*, T*, T*, int64_t, int64_t, T);                             \
  template void rmsnorm_bwd<T>(const T*, const T*, const T*, const T*, T*, T*, int64_t, int64_t);
DHX_INSTANTIATE(float)
DHX_INSTANTIATE(double)
#undef DHX_INSTANTIATE

}  // namespace dhelix::cpu
