// Token (+ learned position) embedding lookup and its backward scatter-add.
// The backward parallelises over column blocks, so repeated tokens never race and the sum order
// (row order) is fixed: deterministic for any thread count.
#include <algorithm>

#include "base/Error.h"
#include "kernels/cpu/Kernels.h"
#include "kernels/cpu/Parallel.h"

namespace dhelix::cpu {
namespace {

void check_tokens(const int32_t* tokens, int64_t n) {
  int64_t bad = -1;
  for (int64_t i = 0; i < n && bad < 0; ++i)
    if (tokens[i] < 0) bad = i;
  DHX_CHECK(bad < 0, ConfigError, "embedding: token[{}] = {} is negative", bad, bad < 0 ? 0 : tokens[bad]);
}

}  // namespace

template <typename T>
void embedding_fwd(const int32_t* tokens, const T* wte, const T* wpe, T* y, int64_t B, int64_t T_, int64_t C,
                   int64_t pos_offset) {
  check_tokens(tokens, B * T_);
#pragma omp parallel for num_threads(detail::threads_for(B * T_ * C)) schedule(static)
  for (int64_t bt = 0; bt < B * T_; ++bt) {
    const T* e = wte + int64_t(tokens[bt]) * C;
    T* yr = y + bt * C;
    if (wpe != nullptr) {
      const T* p = wpe + (pos_offset + bt % T_) * C;
#pragma omp simd
      for (int64_t c = 0; c < C; ++c) yr[c] = e[c] + p[c];
    } else {
      std::copy(e, e + C, yr);
    }
  }
}

template <typename T>
void embedding_bwd(const int32_t* tokens, const T* dy, T* dwte, T* dwpe, int64_t B, int64_t T_, int64_t C,
                   int64_t pos_offset) {
  check_tokens(tokens, B * T_);
  const int nt = detail::threads_for(B * T_ * C);
  const int64_t block = std::max<int64_t>(16, (C + nt - 1) / nt);
#pragma omp parallel for num_threads(nt) schedule(static)
  for (int64_t c0 = 0; c0 < C; c0 += block) {
    const int64_t c1 = std::min(C, c0 + block);
    for (int64_t bt = 0; bt < B * T_; ++bt) {
      const T* g = dy + bt * C;
      T* e = dwte + int64_t(tokens[bt]) * C;
#pragma omp simd
      for (int64_t c = c0; c < c1; ++c) e[c] += g[c];
      if (dwpe != nullptr) {
        T* p = dwpe + (pos_offset + bt % T_) * C;
#pragma omp simd
        for (int64_t c = c0; c < c1; ++c) p[c] += g[c];
      }
    }
  }
}

#define DHX_INSTANTIATE(T)                                                                                 \
  template void embedding_fwd<T>(const int32_t*, const T*, const T*, T*, int64_t, int64_t, int64_t, int64_t); \
  template void embedding_bwd<T>(const int32_t*, const T*, T*, T*, int64_t, int64_t, int64_t, int64_t);
DHX_INSTANTIATE(float)
DHX_INSTANTIATE(double)
#undef DHX_INSTANTIATE

}  // namespace dhelix::cpu
