// LayerNorm and RMSNorm. Oracles: closed-form properties of the forward (zero mean / unit
// variance, unit mean square), central finite differences in double for the backward, and the
// double kernel for the float one.
#include <gtest/gtest.h>

#include "Oracle.h"
#include "kernels/cpu/Kernels.h"

namespace dhelix::test {
namespace {

// Oracle: with g = 1, b = 0 and eps -> 0 every row of y has mean 0 and variance 1 (up to
// eps / var ~ 1e-12 and rounding ~ C eps_64).
TEST(LayerNorm, ForwardRowsAreStandardised) {
  std::mt19937 rng(10);
  const int64_t N = 7, C = 48;
  Vec x = randn(N * C, rng, 3.0);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t c = 0; c < C; ++c) x[n * C + c] += 10.0 * n;  // rows with large means
  Vec g(C, 1.0), b(C, 0.0), y(N * C), mean(N), rstd(N);
  cpu::layernorm_fwd<double>(x.data(), g.data(), b.data(), y.data(), mean.data(), rstd.data(), N, C, 1e-12);
  for (int64_t n = 0; n < N; ++n) {
    double m = 0, v = 0, xm = 0;
    for (int64_t c = 0; c < C; ++c) m += y[n * C + c], xm += x[n * C + c];
    m /= C;
    for (int64_t c = 0; c < C; ++c) v += (y[n * C + c] - m) * (y[n * C + c] - m);
    EXPECT_NEAR(m, 0.0, 1e-12) << "row " << n;
    EXPECT_NEAR(v / C, 1.0, 1e-10) << "row " << n;
    EXPECT_NEAR(mean[n], xm / C, 1e-12 * (1 + std::abs(xm / C))) << "row " << n;
  }
  // g and b act per column: y' = y g + b.
  Vec g2 = randn(C, rng), b2 = randn(C, rng), y2(N * C);
  cpu::layernorm_fwd<double>(x.data(), g2.data(), b2.data(), y2.data(), mean.data(), rstd.data(), N, C, 1e-12);
  for (int64_t i = 0; i < N * C; ++i) EXPECT_NEAR(y2[i], y[i] * g2[i % C] + b2[i % C], 1e-12);
}

// Oracle: central finite differences of L = sum(y * r) (tolerance in Oracle.h). dg, db start
// from random values that are subtracted afterwards (checks "+=").
TEST(LayerNorm, BackwardMatchesFiniteDifferences) {
  std::mt19937 rng(11);
  const int64_t N = 4, C = 13;
  Vec x = randn(N * C, rng), g = randn(C, rng), b = randn(C, rng), r = randn(N * C, rng);
  Vec mean(N), rstd(N);
  auto loss = [&] {
    Vec y(N * C);
    cpu::layernorm_fwd<double>(x.data(), g.data(), b.data(), y.data(), mean.data(), rstd.data(), N, C, 1e-5);
    return dot(y, r);
  };
  const double L = loss();  // leaves mean, rstd of the unperturbed x
  Vec dx(N * C, 7.0), dg0 = randn(C, rng), db0 = randn(C, rng), dg = dg0, db = db0;
  cpu::layernorm_bwd<double>(r.data(), x.data(), g.data(), mean.data(), rstd.data(), dx.data(), dg.data(), db.data(), N,
                             C);
  for (int64_t c = 0; c < C; ++c) dg[c] -= dg0[c], db[c] -= db0[c];
  expect_grad_near("dx", dx, numeric_grad(x, loss), L);
  expect_grad_near("dg", dg, numeric_grad(g, loss), L);
  expect_grad_near("db", db, numeric_grad(b, loss), L);
}

// Oracle: with g = 1, mean(y^2) = mean(x^2) / (mean(x^2) + eps) = 1 - O(eps).
TEST(RmsNorm, ForwardRowsHaveUnitMeanSquare) {
  std::mt19937 rng(12);
  const int64_t N = 5, C = 40;
  Vec x = randn(N * C, rng, 2.0), g(C, 1.0), y(N * C), rstd(N);
  cpu::rmsnorm_fwd<double>(x.data(), g.data(), y.data(), rstd.data(), N, C, 1e-12);
  for (int64_t n = 0; n < N; ++n) {
    double ms = 0, xs = 0;
    for (int64_t c = 0; c < C; ++c) ms += y[n * C + c] * y[n * C + c], xs += x[n * C + c] * x[n * C + c];
    EXPECT_NEAR(ms / C, 1.0, 1e-10) << "row " << n;
    EXPECT_NEAR(rstd[n], 1.0 / std::sqrt(xs / C), 1e-10 * rstd[n]) << "row " << n;
  }
}

// Oracle: central finite differences (tolerance in Oracle.h); dg accumulates.
TEST(RmsNorm, BackwardMatchesFiniteDifferences) {
  std::mt19937 rng(13);
  const int64_t N = 4, C = 11;
  Vec x = randn(N * C, rng), g = randn(C, rng), r = randn(N * C, rng), rstd(N);
  auto loss = [&] {
    Vec y(N * C);
    cpu::rmsnorm_fwd<double>(x.data(), g.data(), y.data(), rstd.data(), N, C, 1e-6);
    return dot(y, r);
  };
  const double L = loss();
  Vec dx(N * C, 3.0), dg0 = randn(C, rng), dg = dg0;
  cpu::rmsnorm_bwd<double>(r.data(), x.data(), g.data(), rstd.data(), dx.data(), dg.data(), N, C);
  for (int64_t c = 0; c < C; ++c) dg[c] -= dg0[c];
  expect_grad_near("dx", dx, numeric_grad(x, loss), L);
  expect_grad_near("dg", dg, numeric_grad(g, loss), L);
}

// Oracle: the double kernels. Float tolerance 1e-5 normwise: row sums over C = 768 in fp32
// (6e-8 per operation, vectorised partial sums) stay within ~1e-6 relative; dg/db sum N = 96 rows.
TEST(Norm, FloatAgreesWithDouble) {
  std::mt19937 rng(14);
  const int64_t N = 96, C = 768;
  Vec x = randn(N * C, rng), g = randn(C, rng), b = randn(C, rng), dy = randn(N * C, rng);
  Vec y(N * C), mean(N), rstd(N), dx(N * C), dg(C, 0.0), db(C, 0.0);
  cpu::layernorm_fwd<double>(x.data(), g.data(), b.data(), y.data(), mean.data(), rstd.data(), N, C, 1e-5);
  cpu::layernorm_bwd<double>(dy.data(), x.data(), g.data(), mean.data(), rstd.data(), dx.data(), dg.data(), db.data(),
                             N, C);
  auto xf = cast<float>(x), gf = cast<float>(g), bf = cast<float>(b), dyf = cast<float>(dy);
  std::vector<float> yf(N * C), meanf(N), rstdf(N), dxf(N * C), dgf(C, 0.f), dbf(C, 0.f);
  cpu::layernorm_fwd<float>(xf.data(), gf.data(), bf.data(), yf.data(), meanf.data(), rstdf.data(), N, C, 1e-5f);
  cpu::layernorm_bwd<float>(dyf.data(), xf.data(), gf.data(), meanf.data(), rstdf.data(), dxf.data(), dgf.data(),
                            dbf.data(), N, C);
  expect_close("layernorm y", yf, y, 1e-5);
  expect_close("layernorm dx", dxf, dx, 1e-5);
  expect_close("layernorm dg", dgf, dg, 1e-5);
  expect_close("layernorm db", dbf, db, 1e-5);

  Vec ry(N * C), rrstd(N), rdx(N * C), rdg(C, 0.0);
  cpu::rmsnorm_fwd<double>(x.data(), g.data(), ry.data(), rrstd.data(), N, C, 1e-6);
  cpu::rmsnorm_bwd<double>(dy.data(), x.data(), g.data(), rrstd.data(), rdx.data(), rdg.data(), N, C);
  std::vector<float> ryf(N * C), rrstdf(N), rdxf(N * C), rdgf(C, 0.f);
  cpu::rmsnorm_fwd<float>(xf.data(), gf.data(), ryf.data(), rrstdf.data(), N, C, 1e-6f);
  cpu::rmsnorm_bwd<float>(dyf.data(), xf.data(), gf.data(), rrstdf.data(), rdxf.data(), rdgf.data(), N, C);
  expect_close("rmsnorm y", ryf, ry, 1e-5);
  expect_close("rmsnorm dx", rdxf, rdx, 1e-5);
  expect_close("rmsnorm dg", rdgf, rdg, 1e-5);
}

}  // namespace
}  // namespace dhelix::test
