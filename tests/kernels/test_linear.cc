// GEMM and linear-layer kernels. Oracles: a naive triple loop in double (forward, all transpose
// combinations) and central finite differences in double (backward).
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <tuple>

#include "Oracle.h"
#include "kernels/cpu/Kernels.h"

namespace dhelix::test {
namespace {

using cpu::Accumulate;

// C = alpha op(A) op(B) + beta C, row-major, by definition.
Vec naive_gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, double alpha, const Vec& A, int64_t lda, const Vec& B,
               int64_t ldb, double beta, Vec C, int64_t ldc) {
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j) {
      double s = 0;
      for (int64_t k = 0; k < K; ++k) s += (ta ? A[k * lda + i] : A[i * lda + k]) * (tb ? B[j * ldb + k] : B[k * ldb + j]);
      C[i * ldc + j] = alpha * s + beta * C[i * ldc + j];
    }
  return C;
}

// Oracle: naive triple loop. Tolerance 1e-13 normwise: K = 7 products summed in a different order
// differ by a few ulps.
TEST(Gemm, AllTransposesWithPaddedLeadingDimsMatchNaive) {
  std::mt19937 rng(1);
  const int64_t M = 5, N = 6, K = 7;
  for (bool ta : {false, true})
    for (bool tb : {false, true}) {
      const int64_t lda = (ta ? M : K) + 3, ldb = (tb ? K : N) + 2, ldc = N + 1;
      Vec A = randn((ta ? K : M) * lda, rng), B = randn((tb ? N : K) * ldb, rng), C = randn(M * ldc, rng);
      Vec want = naive_gemm(ta, tb, M, N, K, 0.7, A, lda, B, ldb, -0.3, C, ldc);
      Vec got = C;
      cpu::gemm<double>(ta, tb, M, N, K, 0.7, A.data(), lda, B.data(), ldb, -0.3, got.data(), ldc);
      expect_close("gemm", got, want, 1e-13);
    }
}

// Oracle: closed form. K = 0 leaves beta * C.
// Oracle: naive triple loop, as above. With 2 threads these shapes are cut into slabs of C (rows
// when M >= N, else columns), the last slab partial; each slab is a serial BLAS call.
// Tolerance 1e-12 normwise: K = 300 products summed in a blocked order.
TEST(Gemm, ThreadSlabsOfRowsAndColumnsMatchNaive) {
  std::mt19937 rng(3);
  cpu::set_num_threads(2);
  const int64_t K = 300;
  for (auto [M, N] : {std::pair<int64_t, int64_t>{130, 70}, {70, 130}})
    for (bool ta : {false, true})
      for (bool tb : {false, true}) {
        const int64_t lda = (ta ? M : K) + 1, ldb = (tb ? K : N) + 2, ldc = N + 3;
        Vec A = randn((ta ? K : M) * lda, rng), B = randn((tb ? N : K) * ldb, rng), C = randn(M * ldc, rng);
        Vec want = naive_gemm(ta, tb, M, N, K, 1.5, A, lda, B, ldb, 0.5, C, ldc);
        Vec got = C;
        cpu::gemm<double>(ta, tb, M, N, K, 1.5, A.data(), lda, B.data(), ldb, 0.5, got.data(), ldc);
        expect_close(fmt::format("gemm M={} N={} ta={} tb={}", M, N, ta, tb).c_str(), got, want, 1e-12);
      }
  cpu::set_num_threads(1);
}

// Oracle: the serial row loops they replace (y = a + b, then y[n,:] += bias; db += dy[n,:] for
// n in order): bitwise, with 1 and 2 threads.
TEST(Linear, BiasAddAndBiasGradMatchRowLoopsBitwise) {
  std::mt19937 rng(4);
  const int64_t N = 300, C = 250;
  Vec a = randn(N * C, rng), b = randn(N * C, rng), bias = randn(C, rng), db0 = randn(C, rng);
  Vec want_y(N * C), want_db = db0;
  for (int64_t n = 0; n < N; ++n)
    for (int64_t c = 0; c < C; ++c) {
      want_y[n * C + c] = a[n * C + c] + b[n * C + c];
      want_y[n * C + c] += bias[c];
      want_db[c] += a[n * C + c];
    }
  for (int threads : {1, 2}) {
    cpu::set_num_threads(threads);
    Vec y(N * C), db = db0;
    cpu::add_bias<double>(a.data(), b.data(), bias.data(), y.data(), N, C);
    cpu::bias_grad<double>(a.data(), db.data(), N, C);
    EXPECT_EQ(y, want_y) << threads << " threads";
    EXPECT_EQ(db, want_db) << threads << " threads";
  }
  cpu::set_num_threads(1);
}

TEST(Gemm, EmptyInnerDimensionScalesC) {
  Vec C = {1, 2, 3, 4};
  cpu::gemm<double>(false, false, 2, 2, 0, 1.0, nullptr, 1, nullptr, 2, 0.5, C.data(), 2);
  expect_close("C", C, Vec{0.5, 1, 1.5, 2}, 0.0);
}

// Oracle: naive y = x w^T + b. Tolerance as above.
TEST(Linear, ForwardMatchesNaive) {
  std::mt19937 rng(2);
  const int64_t N = 4, I = 9, O = 5;
  Vec x = randn(N * I, rng), w = randn(O * I, rng), b = randn(O, rng);
  Vec want(N * O);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t o = 0; o < O; ++o) {
      double s = b[o];
      for (int64_t i = 0; i < I; ++i) s += x[n * I + i] * w[o * I + i];
      want[n * O + o] = s;
    }
  Vec y(N * O, 99.0);
  cpu::linear_fwd<double>(x.data(), w.data(), b.data(), y.data(), N, I, O);
  expect_close("y", y, want, 1e-13);
  cpu::linear_fwd<double>(x.data(), w.data(), nullptr, y.data(), N, I, O);  // no bias
  for (int64_t n = 0; n < N; ++n)
    for (int64_t o = 0; o < O; ++o) want[n * O + o] -= b[o];
  expect_close("y (no bias)", y, want, 1e-13);
}

// Oracle: central finite differences of L = sum(y * r) (tolerance in Oracle.h). The accumulating
// outputs start from random values, which the check subtracts: this also checks "+=".
TEST(Linear, BackwardMatchesFiniteDifferences) {
  std::mt19937 rng(3);
  const int64_t N = 3, I = 5, O = 4;
  Vec x = randn(N * I, rng), w = randn(O * I, rng), b = randn(O, rng), r = randn(N * O, rng);
  auto loss = [&] {
    Vec y(N * O);
    cpu::linear_fwd<double>(x.data(), w.data(), b.data(), y.data(), N, I, O);
    return dot(y, r);
  };
  const double L = loss();
  Vec dx(N * I, 5.0), dw0 = randn(O * I, rng), db0 = randn(O, rng), dw = dw0, db = db0;
  cpu::linear_bwd_data<double>(r.data(), w.data(), dx.data(), N, I, O, Accumulate::kNo);
  cpu::linear_bwd_weight<double>(r.data(), x.data(), dw.data(), db.data(), N, I, O);
  for (size_t i = 0; i < dw.size(); ++i) dw[i] -= dw0[i];
  for (size_t i = 0; i < db.size(); ++i) db[i] -= db0[i];
  expect_grad_near("dx", dx, numeric_grad(x, loss), L);
  expect_grad_near("dw", dw, numeric_grad(w, loss), L);
  expect_grad_near("db", db, numeric_grad(b, loss), L);

  // Accumulate::kYes adds onto what is there.
  Vec dx2 = dx;
  cpu::linear_bwd_data<double>(r.data(), w.data(), dx2.data(), N, I, O, Accumulate::kYes);
  for (size_t i = 0; i < dx.size(); ++i) EXPECT_NEAR(dx2[i], 2 * dx[i], 1e-13 * (1 + std::abs(dx[i])));
}

// Oracle: the double kernel. Float tolerance 1e-5 normwise: fp32 rounding (6e-8) grows with the
// inner dimension (64) to ~4e-6 in the worst case.
TEST(Linear, FloatAgreesWithDouble) {
  std::mt19937 rng(4);
  const int64_t N = 33, I = 64, O = 17;
  Vec x = randn(N * I, rng), w = randn(O * I, rng, 0.1), b = randn(O, rng), dy = randn(N * O, rng);
  Vec y(N * O), dx(N * I), dw(O * I, 0.0), db(O, 0.0);
  cpu::linear_fwd<double>(x.data(), w.data(), b.data(), y.data(), N, I, O);
  cpu::linear_bwd_data<double>(dy.data(), w.data(), dx.data(), N, I, O, Accumulate::kNo);
  cpu::linear_bwd_weight<double>(dy.data(), x.data(), dw.data(), db.data(), N, I, O);
  auto xf = cast<float>(x), wf = cast<float>(w), bf = cast<float>(b), dyf = cast<float>(dy);
  std::vector<float> yf(N * O), dxf(N * I), dwf(O * I, 0.f), dbf(O, 0.f);
  cpu::linear_fwd<float>(xf.data(), wf.data(), bf.data(), yf.data(), N, I, O);
  cpu::linear_bwd_data<float>(dyf.data(), wf.data(), dxf.data(), N, I, O, Accumulate::kNo);
  cpu::linear_bwd_weight<float>(dyf.data(), xf.data(), dwf.data(), dbf.data(), N, I, O);
  expect_close("y", yf, y, 1e-5);
  expect_close("dx", dxf, dx, 1e-5);
  expect_close("dw", dwf, dw, 1e-5);
  expect_close("db", dbf, db, 1e-5);
}


// A weight gradient cut into row pieces (linear_bwd_weight_rows, what a split wgrad op runs) equals
// the whole call (oracle: linear_bwd_weight on the same inputs): bitwise when the cut falls on a
// multiple of 96 rows, a whole row tile of every OpenBLAS sgemm kernel (measured: Haswell and Zen
// tile 24 rows, and a cut at 64 differs there; Prescott, the kernel OpenBLAS picks on a CPU it does
// not recognise, differs at 77), and otherwise within the rounding of a reordered sum of N products,
// |d| <= 2 N eps (sum_n |dy x| + |dw0|) per element (the gamma_N bound, doubled for the two sums).
// The shapes include a weight tall enough that gemm() slabs it over threads when there are several.
TEST(Linear, WeightGradientInRowPiecesEqualsTheWhole) {
  std::mt19937 rng(11);
  for (auto [N, I, O, cut] : {std::tuple<int64_t, int64_t, int64_t, int64_t>{33, 64, 17, 8},
                              {256, 96, 576, 288}, {64, 40, 130, 77}, {64, 40, 300, 96}, {64, 40, 300, 192}}) {
    auto dy = cast<float>(randn(N * O, rng)), x = cast<float>(randn(N * I, rng));
    auto dw0 = cast<float>(randn(O * I, rng)), db0 = cast<float>(randn(O, rng));
    std::vector<float> dw_whole = dw0, db_whole = db0, dw_split = dw0, db_split = db0;
    cpu::linear_bwd_weight<float>(dy.data(), x.data(), dw_whole.data(), db_whole.data(), N, I, O);
    cpu::linear_bwd_weight_rows<float>(dy.data(), x.data(), dw_split.data(), db_split.data(), N, I, O, cut, O);
    cpu::linear_bwd_weight_rows<float>(dy.data(), x.data(), dw_split.data(), db_split.data(), N, I, O, 0, cut);
    const std::string what = fmt::format("N={} I={} O={} cut={}", N, I, O, cut);
    if (cut % 96 == 0) {
      EXPECT_EQ(0, std::memcmp(dw_whole.data(), dw_split.data(), dw_whole.size() * sizeof(float))) << "dw " << what;
    } else {
      const double eps = std::numeric_limits<float>::epsilon();
      for (int64_t o = 0; o < O; ++o)
        for (int64_t i = 0; i < I; ++i) {
          double mag = std::fabs(dw0[o * I + i]);
          for (int64_t n = 0; n < N; ++n) mag += std::fabs(double(dy[n * O + o]) * x[n * I + i]);
          ASSERT_NEAR(dw_whole[o * I + i], dw_split[o * I + i], 2.0 * N * eps * mag) << "dw " << what;
        }
    }
    // The bias gradient is our own column sum: the same loop over rows for any cut.
    EXPECT_EQ(0, std::memcmp(db_whole.data(), db_split.data(), db_whole.size() * sizeof(float))) << "db " << what;
    // Rows outside the piece are untouched.
    std::vector<float> dw_part = dw0;
    cpu::linear_bwd_weight_rows<float>(dy.data(), x.data(), dw_part.data(), nullptr, N, I, O, 0, cut);
    EXPECT_EQ(0, std::memcmp(dw_part.data() + cut * I, dw0.data() + cut * I, (O - cut) * I * sizeof(float)));
  }
}

}  // namespace
}  // namespace dhelix::test
