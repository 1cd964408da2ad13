// GELU (tanh approximation) and SwiGLU. Oracles: the closed-form definitions evaluated with the
// standard library in double, central finite differences for the backward, and the double
// kernels for the float ones.
#include <gtest/gtest.h>

#include "Oracle.h"
#include "kernels/cpu/Kernels.h"

namespace dhelix::test {
namespace {

double gelu_ref(double x) {
  return 0.5 * x * (1 + std::tanh(std::sqrt(2 / M_PI) * (x + 0.044715 * x * x * x)));
}
double silu_ref(double a) { return a / (1 + std::exp(-a)); }

// Oracle: the GPT-2 formula with std::tanh; tolerance 1e-15 normwise (same formula, rounding).
TEST(Gelu, ForwardMatchesFormula) {
  std::mt19937 rng(20);
  Vec x = randn(1000, rng, 3.0), y(1000), want(1000);
  x[0] = 0, x[1] = 30, x[2] = -30;  // y(0) = 0, y(30) = 30, y(-30) = -0
  for (size_t i = 0; i < x.size(); ++i) want[i] = gelu_ref(x[i]);
  cpu::gelu_fwd<double>(x.data(), y.data(), int64_t(x.size()));
  expect_close("gelu", y, want, 1e-15);
  EXPECT_EQ(y[0], 0.0);
  EXPECT_NEAR(y[1], 30.0, 1e-12);
}

// Oracle: central finite differences (tolerance in Oracle.h).
TEST(Gelu, BackwardMatchesFiniteDifferences) {
  std::mt19937 rng(21);
  const int64_t n = 64;
  Vec x = randn(n, rng, 2.0), r = randn(n, rng);
  auto loss = [&] {
    Vec y(n);
    cpu::gelu_fwd<double>(x.data(), y.data(), n);
    return dot(y, r);
  };
  const double L = loss();
  Vec dx(n);
  cpu::gelu_bwd<double>(r.data(), x.data(), dx.data(), n);
  expect_grad_near("dx", dx, numeric_grad(x, loss), L);
}

// Oracle: silu(gate) * up with std::exp in double; gate = columns [0, F), up = [F, 2F).
TEST(Swiglu, ForwardMatchesFormula) {
  std::mt19937 rng(22);
  const int64_t N = 3, F = 10;
  Vec gu = randn(N * 2 * F, rng, 2.0), y(N * F), want(N * F);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t f = 0; f < F; ++f) want[n * F + f] = silu_ref(gu[n * 2 * F + f]) * gu[n * 2 * F + F + f];
  cpu::swiglu_fwd<double>(gu.data(), y.data(), N, F);
  expect_close("swiglu", y, want, 1e-15);
}

// Oracle: central finite differences (tolerance in Oracle.h).
TEST(Swiglu, BackwardMatchesFiniteDifferences) {
  std::mt19937 rng(23);
  const int64_t N = 3, F = 7;
  Vec gu = randn(N * 2 * F, rng, 2.0), r = randn(N * F, rng);
  auto loss = [&] {
    Vec y(N * F);
    cpu::swiglu_fwd<double>(gu.data(), y.data(), N, F);
    return dot(y, r);
  };
  const double L = loss();
  Vec dgu(N * 2 * F);
  cpu::swiglu_bwd<double>(r.data(), gu.data(), dgu.data(), N, F);
  expect_grad_near("dgu", dgu, numeric_grad(gu, loss), L);
}

// Oracle: the double kernels. Float uses a polynomial exp (relative error ~2e-7) inside tanh and
// the sigmoid; 2e-6 normwise covers that plus fp32 rounding of a handful of operations.
TEST(Activation, FloatAgreesWithDouble) {
  std::mt19937 rng(24);
  const int64_t N = 50, F = 300, n = N * F;
  Vec x = randn(n, rng, 3.0), dy = randn(n, rng), gu = randn(N * 2 * F, rng, 3.0);
  x[0] = 20, x[1] = -20, gu[0] = 20, gu[1] = -20;  // saturated: exp argument clamped in float
  Vec y(n), dx(n), sy(N * F), dgu(N * 2 * F);
  cpu::gelu_fwd<double>(x.data(), y.data(), n);
  cpu::gelu_bwd<double>(dy.data(), x.data(), dx.data(), n);
  cpu::swiglu_fwd<double>(gu.data(), sy.data(), N, F);
  cpu::swiglu_bwd<double>(dy.data(), gu.data(), dgu.data(), N, F);
  auto xf = cast<float>(x), dyf = cast<float>(dy), guf = cast<float>(gu);
  std::vector<float> yf(n), dxf(n), syf(N * F), dguf(N * 2 * F);
  cpu::gelu_fwd<float>(xf.data(), yf.data(), n);
  cpu::gelu_bwd<float>(dyf.data(), xf.data(), dxf.data(), n);
  cpu::swiglu_fwd<float>(guf.data(), syf.data(), N, F);
  cpu::swiglu_bwd<float>(dyf.data(), guf.data(), dguf.data(), N, F);
  expect_close("gelu y", yf, y, 2e-6);
  expect_close("gelu dx", dxf, dx, 2e-6);
  expect_close("swiglu y", syf, sy, 2e-6);
  expect_close("swiglu dgu", dguf, dgu, 2e-6);
}

}  // namespace
}  // namespace dhelix::test
