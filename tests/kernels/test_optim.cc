// AdamW, the elementwise helpers and the thread setting. Oracles: hand-computed updates (the
// textbook Adam form with bias-corrected moments), closed forms, and one-thread runs.
#include <gtest/gtest.h>

#include "Oracle.h"
#include "base/Error.h"
#include "kernels/cpu/Kernels.h"

namespace dhelix::test {
namespace {

// Oracle: one step from m = v = 0 by hand: m = 0.1 g, v = 0.001 g^2, mhat = g, vhat = g^2,
// p' = p (1 - lr wd) - lr g / (|g| + eps). Tolerance: a few double roundings (1e-15).
TEST(AdamW, FirstStepMatchesHandComputation) {
  const cpu::AdamWParams a{0.1, 0.9, 0.999, 1e-8, 0.01, 1};
  Vec p = {1.0, -2.0, 0.5}, g = {0.5, -0.25, 0.0}, m(3, 0.0), v(3, 0.0);
  const Vec p0 = p;
  cpu::adamw_step<double>(p.data(), g.data(), m.data(), v.data(), 3, a);
  for (int i = 0; i < 3; ++i) {
    const double want = p0[i] * (1 - 0.1 * 0.01) - 0.1 * g[i] / (std::abs(g[i]) + 1e-8);
    EXPECT_NEAR(p[i], want, 1e-15) << i;
    EXPECT_NEAR(m[i], 0.1 * g[i], 1e-16) << i;
    EXPECT_NEAR(v[i], 0.001 * g[i] * g[i], 1e-18) << i;
  }
}

// Oracle: the textbook AdamW (Loshchilov & Hutter, torch.optim.AdamW) at step 5 from arbitrary
// moments: mhat = m/(1-b1^t), vhat = v/(1-b2^t), p = p(1 - lr wd) - lr mhat/(sqrt(vhat)+eps).
// Tolerance 1e-14 relative: the kernel groups the same operations differently (torch's order).
TEST(AdamW, LaterStepMatchesTextbookForm) {
  std::mt19937 rng(70);
  const cpu::AdamWParams a{3e-4, 0.9, 0.95, 1e-8, 0.1, 5};
  const int64_t n = 100;
  Vec p = randn(n, rng), g = randn(n, rng), m = randn(n, rng, 0.1), v = randn(n, rng, 0.1);
  for (auto& x : v) x = x * x;
  Vec want_p(n), want_m(n), want_v(n);
  for (int64_t i = 0; i < n; ++i) {
    want_m[i] = a.beta1 * m[i] + (1 - a.beta1) * g[i];
    want_v[i] = a.beta2 * v[i] + (1 - a.beta2) * g[i] * g[i];
    const double mhat = want_m[i] / (1 - std::pow(a.beta1, 5)), vhat = want_v[i] / (1 - std::pow(a.beta2, 5));
    want_p[i] = p[i] * (1 - a.lr * a.weight_decay) - a.lr * mhat / (std::sqrt(vhat) + a.eps);
  }
  cpu::adamw_step<double>(p.data(), g.data(), m.data(), v.data(), n, a);
  expect_close("p", p, want_p, 1e-14);
  expect_close("m", m, want_m, 1e-14);
  expect_close("v", v, want_v, 1e-14);
}

// Oracle: the double kernel; fp32 rounding of ~10 operations per element: 1e-6 normwise.
TEST(AdamW, FloatAgreesWithDouble) {
  std::mt19937 rng(71);
  const cpu::AdamWParams a{1e-3, 0.9, 0.999, 1e-8, 0.1, 3};
  const int64_t n = 50000;
  Vec p = randn(n, rng), g = randn(n, rng), m = randn(n, rng, 0.1), v = randn(n, rng, 0.1);
  for (auto& x : v) x = x * x;
  auto pf = cast<float>(p), gf = cast<float>(g), mf = cast<float>(m), vf = cast<float>(v);
  cpu::adamw_step<double>(p.data(), g.data(), m.data(), v.data(), n, a);
  cpu::adamw_step<float>(pf.data(), gf.data(), mf.data(), vf.data(), n, a);
  expect_close("p", pf, p, 1e-6);
  expect_close("m", mf, m, 1e-6);
  expect_close("v", vf, v, 1e-6);
}

// Oracle: closed forms; sum_{i=1..n} i^2 = n(n+1)(2n+1)/6 is exact in double for n = 100000
// (all partial sums are integers below 2^53).
TEST(Elementwise, ClosedForms) {
  const int64_t n = 100000;
  std::vector<float> a(n), b(n), y(n);
  for (int64_t i = 0; i < n; ++i) a[i] = float(i + 1), b[i] = float(2 * i);
  cpu::add<float>(a.data(), b.data(), y.data(), n);
  for (int64_t i = 0; i < n; i += 999) EXPECT_EQ(y[i], float(3 * i + 1));
  cpu::add_inplace<float>(y.data(), a.data(), n);
  cpu::scale_inplace<float>(y.data(), 0.5f, n);
  for (int64_t i = 0; i < n; i += 999) EXPECT_EQ(y[i], float(2 * i + 1));
  const double want = double(n) * (n + 1) * (2 * n + 1) / 6;
  EXPECT_EQ(cpu::sum_squares<float>(a.data(), n), want);
  cpu::set_num_threads(2);
  EXPECT_EQ(cpu::sum_squares<float>(a.data(), n), want);
  cpu::set_num_threads(1);
}

// Oracle: the one-thread run. Norm backward with 2 threads sums dg/db in two partials, so it
// differs by rounding only (1e-12 normwise in double); pointwise kernels agree bitwise.
TEST(Threads, TwoThreadsAgreeWithOne) {
  std::mt19937 rng(72);
  const int64_t N = 256, C = 200;
  Vec x = randn(N * C, rng), g = randn(C, rng), dy = randn(N * C, rng), mean(N), rstd(N);
  auto run = [&](int threads) {
    cpu::set_num_threads(threads);
    EXPECT_EQ(cpu::num_threads(), threads);
    Vec y(N * C), dx(N * C), dg(C, 0.0), db(C, 0.0), gy(N * C);
    cpu::layernorm_fwd<double>(x.data(), g.data(), g.data(), y.data(), mean.data(), rstd.data(), N, C, 1e-5);
    cpu::layernorm_bwd<double>(dy.data(), x.data(), g.data(), mean.data(), rstd.data(), dx.data(), dg.data(), db.data(),
                               N, C);
    cpu::gelu_fwd<double>(x.data(), gy.data(), N * C);
    cpu::set_num_threads(1);
    return std::vector<Vec>{y, dx, dg, db, gy};
  };
  auto one = run(1), two = run(2);
  EXPECT_EQ(one[0], two[0]);
  EXPECT_EQ(one[1], two[1]);
  expect_close("dg", two[2], one[2], 1e-12);
  expect_close("db", two[3], one[3], 1e-12);
  EXPECT_EQ(one[4], two[4]);
}

// Oracle: the contract in Kernels.h / STYLE.md: bad input throws a typed error naming the value,
// and changes nothing (the count is what it was: 1 under scripts/test's OMP_NUM_THREADS=1, the
// machine's cores under a bare ctest, whose tests get only the first variable of the ENVIRONMENT
// list gtest_discover_tests is given).
TEST(Threads, RejectsNonPositiveCount) {
  const int before = cpu::num_threads();
  EXPECT_THROW(cpu::set_num_threads(0), ConfigError);
  EXPECT_EQ(cpu::num_threads(), before);
}

}  // namespace
}  // namespace dhelix::test
