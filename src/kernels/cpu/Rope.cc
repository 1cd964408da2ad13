// Rotary position embeddings, Hugging Face "rotate_half" layout: within each head the pair
// (i, i + D/2) is rotated by angle pos * theta^(-2i/D). In place on [B, T, row_stride] rows.
// The backward is the inverse rotation (the Jacobian of a rotation is its transpose).
// Angles and their cos/sin are computed in double once per call, then rounded to T.
#include <cmath>
#include <vector>

#include "base/Error.h"
#include "kernels/cpu/Kernels.h"
#include "kernels/cpu/Parallel.h"

namespace dhelix::cpu {
namespace {

// sign = +1: x1' = x1 cos - x2 sin, x2' = x2 cos + x1 sin;  sign = -1: the inverse rotation.
template <typename T>
void rope_apply(T* x, int64_t B, int64_t T_, int64_t H, int64_t D, int64_t row_stride, int64_t pos_offset,
                double theta, T sign) {
  DHX_CHECK(D % 2 == 0 && D > 0, ConfigError, "rope: head dim D={} must be even and positive", D);
  DHX_CHECK(H * D <= row_stride, ConfigError, "rope: H={} x D={} exceeds row_stride={}", H, D, row_stride);
  const int64_t half = D / 2;
  std::vector<T> cs(static_cast<size_t>(T_ * half)), sn(static_cast<size_t>(T_ * half));  // [T, D/2] each
  for (int64_t i = 0; i < half; ++i) {
    const double inv_freq = std::pow(theta, -2.0 * double(i) / double(D));
    for (int64_t t = 0; t < T_; ++t) {
      const double angle = double(pos_offset + t) * inv_freq;
      cs[t * half + i] = T(std::cos(angle));
      sn[t * half + i] = T(sign) * T(std::sin(angle));
    }
  }
#pragma omp parallel for num_threads(detail::threads_for(B * T_ * H * D)) schedule(static)
  for (int64_t bt = 0; bt < B * T_; ++bt) {
    const int64_t t = bt % T_;
    const T* c = cs.data() + t * half;
    const T* s = sn.data() + t * half;
    for (int64_t h = 0; h < H; ++h) {
      T* x1 = x + bt * row_stride + h * D;
      T* x2 = x1 + half;
#pragma omp simd
      for (int64_t i = 0; i < half; ++i) {
        const T a = x1[i], b = x2[i];
        x1[i] = a * c[i] - b * s[i];
        x2[i] = b * c[i] + a * s[i];
      }
    }
  }
}

}  // namespace

template <typename T>
void rope_fwd(T* x, int64_t B, int64_t T_, int64_t H, int64_t D, int64_t row_stride, int64_t pos_offset,
              double theta) {
  rope_apply(x, B, T_, H, D, row_stride, pos_offset, theta, T(1));
}

template <typename T>
void rope_bwd(T* dx, int64_t B, int64_t T_, int64_t H, int64_t D, int64_t row_stride, int64_t pos_offset,
              double theta) {
  rope_apply(dx, B, T_, H, D, row_stride, pos_offset, theta, T(-1));
}

#define DHX_INSTANTIATE(T)                                                                  \
  template void rope_fwd<T>(T*, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, double); \
  template void rope_bwd<T>(T*, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, double);
DHX_INSTANTIATE(float)
DHX_INSTANTIATE(double)
#undef DHX_INSTANTIATE

}  // namespace dhelix::cpu
