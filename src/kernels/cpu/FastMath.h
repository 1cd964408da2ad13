// Vectorisable elementwise math for the CPU kernels (internal, not part of Kernels.h).
// The build has no -ffast-math, so glibc's vector exp/tanh are not offered to the vectoriser;
// these inline, branch-free versions let `#pragma omp simd` loops vectorise. float uses a
// polynomial exp (relative error ~2e-7); double uses std::exp so finite-difference tests in
// double see the exact function.
#pragma once
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>

namespace dhelix::cpu::detail {

// exp(x) = 2^k * exp(r), k = round(x / ln2), r = x - k ln2 in [-ln2/2, ln2/2].
// exp(r) by its Taylor series to r^7: truncation |r|^8/8! <= 5e-9. k is rounded with the
// 1.5*2^23 trick (exact without fast-math), 2^k is built from the exponent bits.
inline float exp_fast(float x) {
  x = std::min(std::max(x, -87.0f), 88.0f);  // keeps 2^k a normal float; exp(-87) ~ 1.6e-38
  constexpr float kLog2e = 1.44269504088896341f;
  constexpr float kLn2Hi = 0.693145751953125f;     // ln2 split so k*kLn2Hi is exact for |k| < 2^9
  constexpr float kLn2Lo = 1.428606765330187e-06f;
  constexpr float kMagic = 12582912.0f;            // 1.5 * 2^23
  const float kf = (x * kLog2e + kMagic) - kMagic;
  const float r = (x - kf * kLn2Hi) - kf * kLn2Lo;
  float p = 1.0f / 5040.0f;
  p = p * r + 1.0f / 720.0f;
  p = p * r + 1.0f / 120.0f;
  p = p * r + 1.0f / 24.0f;
  p = p * r + 1.0f / 6.0f;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  const int32_t bits = (static_cast<int32_t>(kf) + 127) << 23;
  return p * std::bit_cast<float>(bits);
}

template <typename T> inline T exp_k(T x);
template <> inline float exp_k<float>(float x) { return exp_fast(x); }
template <> inline double exp_k<double>(double x) { return std::exp(x); }

// tanh(u) = 1 - 2 / (1 + exp(2u)): saturates cleanly to +-1 (exp overflow -> 2/inf = 0).
template <typename T> inline T tanh_k(T u);
template <> inline float tanh_k<float>(float u) { return 1.0f - 2.0f / (1.0f + exp_fast(2.0f * u)); }
template <> inline double tanh_k<double>(double u) { return std::tanh(u); }

}  // namespace dhelix::cpu::detail
