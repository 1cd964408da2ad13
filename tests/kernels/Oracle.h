// Test oracles shared by the kernel tests: seeded random tensors, central finite differences of a
// scalar loss L = sum(y * r) in double precision, and comparisons with stated tolerances.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

namespace dhelix::test {

using Vec = std::vector<double>;

inline Vec randn(size_t n, std::mt19937& rng, double scale = 1.0) {
  std::normal_distribution<double> dist(0.0, scale);
  Vec v(n);
  for (auto& x : v) x = dist(rng);
  return v;
}

template <typename T> std::vector<T> cast(const Vec& v) { return std::vector<T>(v.begin(), v.end()); }

inline double dot(const Vec& a, const Vec& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

inline double max_abs(const Vec& v) {
  double m = 0;
  for (double x : v) m = std::max(m, std::abs(x));
  return m;
}

// Finite-difference step and tolerances (double precision):
//   truncation of the central difference is O(h^2 f''') ~ 1e-12 for our O(1) functions;
//   rounding is ~ eps * |L| / h = 2.2e-16 * |L| / 1e-6 ~ 2e-10 |L|.
// So |analytic - numeric| <= 1e-6 |numeric| + 1e-8 (1 + |L|) leaves a margin of ~50 over both,
// while any real mistake in a backward pass shows up as an O(1) relative error.
inline constexpr double kFdStep = 1e-6;
inline constexpr double kFdRel = 1e-6;
inline constexpr double kFdAbs = 1e-8;

// d loss / d x by central differences; x is perturbed in place and restored.
template <typename F> Vec numeric_grad(Vec& x, F&& loss) {
  Vec g(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    const double x0 = x[i];
    x[i] = x0 + kFdStep;
    const double lp = loss();
    x[i] = x0 - kFdStep;
    const double lm = loss();
    x[i] = x0;
    g[i] = (lp - lm) / (2 * kFdStep);
  }
  return g;
}

// Analytic gradient vs central differences, elementwise, with the tolerance derived above.
inline void expect_grad_near(const char* what, const Vec& analytic, const Vec& numeric, double loss_value) {
  ASSERT_EQ(analytic.size(), numeric.size()) << what;
  const double abs_tol = kFdAbs * (1.0 + std::abs(loss_value));
  int reported = 0;
  for (size_t i = 0; i < numeric.size(); ++i) {
    const double err = std::abs(analytic[i] - numeric[i]);
    if (err > kFdRel * std::abs(numeric[i]) + abs_tol && reported++ < 5)
      ADD_FAILURE() << what << "[" << i << "]: analytic " << analytic[i] << " vs finite difference " << numeric[i]
                    << " (|diff| " << err << ", L=" << loss_value << ")";
  }
}

// Normwise closeness: max_i |got_i - want_i| <= tol * max(max_i |want_i|, floor).
template <typename T> void expect_close(const char* what, const std::vector<T>& got, const Vec& want, double tol,
                                        double floor = 1.0) {
  ASSERT_EQ(got.size(), want.size()) << what;
  const double bound = tol * std::max(max_abs(want), floor);
  int reported = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    const double err = std::abs(double(got[i]) - want[i]);
    if (!(err <= bound) && reported++ < 5)
      ADD_FAILURE() << what << "[" << i << "]: got " << double(got[i]) << " want " << want[i] << " (|diff| " << err
                    << " > " << bound << ")";
  }
}

}  // namespace dhelix::test
