// Rotary embeddings (Hugging Face rotate_half layout). Oracles: closed forms (a rotation by
// pos * theta^(-2i/D) written out per pair; norms preserved; scores depend only on the position
// difference), rope_bwd as the exact inverse, and central finite differences.
#include <gtest/gtest.h>

#include "Oracle.h"
#include "kernels/cpu/Kernels.h"

namespace dhelix::test {
namespace {

constexpr double kTheta = 10000.0;

// Oracle: the rotation written out per pair (i, i + D/2), in double. Also: columns beyond H*D in
// a wider row (the stride) are left untouched. Tolerance 1e-14: same formula, rounding only.
TEST(Rope, ForwardMatchesPairRotation) {
  std::mt19937 rng(30);
  const int64_t B = 2, T = 5, H = 3, D = 8, stride = H * D + 4, off = 7;
  Vec x = randn(B * T * stride, rng), y = x;
  cpu::rope_fwd<double>(y.data(), B, T, H, D, stride, off, kTheta);
  Vec want = x;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t i = 0; i < D / 2; ++i) {
          const double ang = double(off + t) * std::pow(kTheta, -2.0 * i / D);
          const int64_t p = (b * T + t) * stride + h * D + i;
          want[p] = x[p] * std::cos(ang) - x[p + D / 2] * std::sin(ang);
          want[p + D / 2] = x[p + D / 2] * std::cos(ang) + x[p] * std::sin(ang);
        }
  expect_close("rope", y, want, 1e-14);
  for (int64_t bt = 0; bt < B * T; ++bt)
    for (int64_t c = H * D; c < stride; ++c) EXPECT_EQ(y[bt * stride + c], x[bt * stride + c]);
}

// Oracle: rotations preserve the norm of each pair, rope_bwd(rope_fwd(x)) = x, and
// <rope(q, m), rope(k, n)> depends only on m - n. Tolerances: rounding of a few operations on
// O(1) values (1e-13), and for positions ~1000, cos/sin of angles ~1e3 (1e-12).
TEST(Rope, PreservesNormsInvertsAndIsRelative) {
  std::mt19937 rng(31);
  const int64_t T = 6, D = 16;
  Vec x = randn(T * D, rng), y = x;
  cpu::rope_fwd<double>(y.data(), 1, T, 1, D, D, 3, kTheta);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t i = 0; i < D / 2; ++i) {
      const double* a = &x[t * D];
      const double* b = &y[t * D];
      EXPECT_NEAR(a[i] * a[i] + a[i + D / 2] * a[i + D / 2], b[i] * b[i] + b[i + D / 2] * b[i + D / 2], 1e-13);
    }
  cpu::rope_bwd<double>(y.data(), 1, T, 1, D, D, 3, kTheta);
  expect_close("bwd(fwd(x))", y, x, 1e-14);

  Vec q = randn(D, rng), k = randn(D, rng);
  auto score = [&](int64_t m, int64_t n) {
    Vec qr = q, kr = k;
    cpu::rope_fwd<double>(qr.data(), 1, 1, 1, D, D, m, kTheta);
    cpu::rope_fwd<double>(kr.data(), 1, 1, 1, D, D, n, kTheta);
    return dot(qr, kr);
  };
  EXPECT_NEAR(score(5, 2), score(1003, 1000), 1e-12);
  EXPECT_NEAR(score(0, 0), dot(q, k), 1e-14);  // position 0 is the identity
}

// Oracle: central finite differences of L = sum(rope(x) * r) (tolerance in Oracle.h).
// rope_bwd applied to r must be the gradient.
TEST(Rope, BackwardMatchesFiniteDifferences) {
  std::mt19937 rng(32);
  const int64_t B = 2, T = 3, H = 2, D = 6, stride = H * D + 2, off = 11;
  Vec x = randn(B * T * stride, rng), r = randn(B * T * stride, rng);
  auto loss = [&] {
    Vec y = x;
    cpu::rope_fwd<double>(y.data(), B, T, H, D, stride, off, kTheta);
    return dot(y, r);
  };
  const double L = loss();
  Vec dx = r;
  cpu::rope_bwd<double>(dx.data(), B, T, H, D, stride, off, kTheta);
  expect_grad_near("dx", dx, numeric_grad(x, loss), L);
}

// Oracle: the double kernel; cos/sin are computed in double then rounded, so float differs by
// a few fp32 roundings: 1e-6 normwise.
TEST(Rope, FloatAgreesWithDouble) {
  std::mt19937 rng(33);
  const int64_t B = 2, T = 40, H = 4, D = 64, off = 100;
  Vec x = randn(B * T * H * D, rng), y = x;
  auto yf = cast<float>(x);
  cpu::rope_fwd<double>(y.data(), B, T, H, D, H * D, off, kTheta);
  cpu::rope_fwd<float>(yf.data(), B, T, H, D, H * D, off, kTheta);
  expect_close("rope", yf, y, 1e-6);
}

}  // namespace
}  // namespace dhelix::test
