// Fused softmax cross-entropy over a large vocabulary (GPT-2: V = 50257), forward and backward in
// one call. Per row: one pass for the max, one pass that writes e = exp(x - max) (into dlogits
// when wanted) and sums it, and one pass over the cache-resident row that scales e into the
// gradient. dlogits may alias logits. Rows are independent: OpenMP over rows.
#include <algorithm>
#include <cmath>
#include <limits>

#include "base/Error.h"
#include "kernels/cpu/FastMath.h"
#include "kernels/cpu/Kernels.h"
#include "kernels/cpu/Parallel.h"

namespace dhelix::cpu {

template <typename T>
void cross_entropy_fwd_bwd(const T* logits, const int32_t* targets, T* losses, T* dlogits, const T* dloss, int64_t N,
                           int64_t V) {
  for (int64_t n = 0; n < N; ++n)  // validate before the parallel region (no throwing inside it)
    DHX_CHECK(targets[n] < V, ConfigError, "cross_entropy: targets[{}] = {} is not below V={}", n, targets[n], V);
#pragma omp parallel for num_threads(detail::threads_for(N * V)) schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    const T* x = logits + n * V;
    const int32_t tgt = targets[n];
    if (tgt < 0) {  // ignored position: no loss, no gradient
      losses[n] = T(0);
      if (dlogits != nullptr) {
        T* d = dlogits + n * V;
#pragma omp simd
        for (int64_t v = 0; v < V; ++v) d[v] = T(0);
      }
      continue;
    }
    const T x_tgt = x[tgt];  // read before an aliasing dlogits overwrites the row
    T m = -std::numeric_limits<T>::infinity();
#pragma omp simd reduction(max : m)
    for (int64_t v = 0; v < V; ++v) m = x[v] > m ? x[v] : m;
    T s = 0;
    if (dlogits != nullptr) {
      T* d = dlogits + n * V;
#pragma omp simd reduction(+ : s)
      for (int64_t v = 0; v < V; ++v) {
        const T e = detail::exp_k<T>(x[v] - m);
        d[v] = e;
        s += e;
      }
      // d = (softmax - onehot) * dloss
      const T g = dloss != nullptr ? dloss[n] : T(1);
      const T k = g / s;
#pragma omp simd
      for (int64_t v = 0; v < V; ++v) d[v] *= k;
      d[tgt] -= g;
    } else {
#pragma omp simd reduction(+ : s)
      for (int64_t v = 0; v < V; ++v) s += detail::exp_k<T>(x[v] - m);
    }
    losses[n] = m + std::log(s) - x_tgt;
  }
}

void xent_row_max(const float* logits, float* m, int64_t N, int64_t V) {
  for (int64_t n = 0; n < N; ++n) {
    float mx = -std::numeric_limits<float>::infinity();
    const float* r = logits + n * V;
    for (int64_t j = 0; j < V; ++j) mx = std::max(mx, r[j]);
    m[n] = mx;
  }
}

void xent_row_stats(const float* logits, const int32_t* targets, const float* m, float* stats, int64_t N, int64_t V,
                    int64_t v0) {
  for (int64_t n = 0; n < N; ++n) {
    const float* r = logits + n * V;
    double sum = 0;
    for (int64_t j = 0; j < V; ++j) sum += std::exp(static_cast<double>(r[j] - m[n]));
    const int64_t t = targets[n] - v0;
    stats[2 * n] = static_cast<float>(sum);
    stats[2 * n + 1] = (t >= 0 && t < V) ? r[t] : 0.0f;
  }
}

void xent_row_finish(const float* logits, const int32_t* targets, const float* m, const float* stats, float* losses,
                     float* dlogits, float dloss, int64_t N, int64_t V, int64_t v0, int64_t vocab) {
  for (int64_t n = 0; n < N; ++n)  // before anything is written (dlogits may alias logits)
    DHX_CHECK(targets[n] < vocab, ConfigError, "cross_entropy: targets[{}] = {} is not below V={}", n, targets[n],
              vocab);
  for (int64_t n = 0; n < N; ++n) {
    const float* x = logits + n * V;
    float* d = dlogits + n * V;
    if (targets[n] < 0) {  // ignored position: no loss, no gradient (cross_entropy_fwd_bwd's rule)
      losses[n] = 0.0f;
      std::fill(d, d + V, 0.0f);
      continue;
    }
    const float S = stats[2 * n], mx = m[n];
    losses[n] = std::log(S) + mx - stats[2 * n + 1];
    const float inv = 1.0f / S;
    for (int64_t j = 0; j < V; ++j) d[j] = std::exp(x[j] - mx) * inv * dloss;
    const int64_t t = targets[n] - v0;
    if (t >= 0 && t < V) d[t] -= dloss;
  }
}

#define DHX_INSTANTIATE(T) \
  template void cross_entropy_fwd_bwd<T>(const T*, const int32_t*, T*, T*, const T*, int64_t, int64_t);
DHX_INSTANTIATE(float)
DHX_INSTANTIATE(double)
#undef DHX_INSTANTIATE

}  // namespace dhelix::cpu
