// bf16 GEMMs (kernels/cpu/Bf16.h). Oracles:
//  - rounding: closed forms (exact values, ties to even, NaN and infinity kept);
//  - gemm_bf16 against the exact product in double of the same fp32 inputs, within the bound of
//    bf16 rounding and fp32 accumulation: each operand is rounded with relative error <= u = 2^-8
//    (8 significant bits), a product of two bf16 values is exact in fp32 (16 <= 24 bits), so a term
//    carries relative error <= 2u + u^2, and summing K terms in fp32 adds at most
//    gamma_K = K u32 / (1 - K u32) (u32 = 2^-24, Higham, Accuracy and Stability, Lemma 3.1) of
//    sum|a||b|: |c - exact| <= (2u + u^2 + gamma_K (1 + 2u + u^2)) * sum_k |a_ik| |b_kj|;
//    beta * C adds one more fp32 rounding of the result (u32 (|beta C| + sum|a||b|), doubled);
//  - inputs exactly representable in bf16 (small integers) give the exact sums: every product and
//    partial sum is an integer below 2^24;
//  - that rounding happened at all (no silent fp32): on random inputs some element lies farther
//    from the exact product than fp32's own bound allows.
// Skipped, with the reason, on a CPU without AMX-BF16 or AVX512-BF16.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "base/Error.h"
#include "kernels/cpu/Bf16.h"
#include "kernels/cpu/Kernels.h"

namespace dhelix::cpu {
namespace {

constexpr double kU = 1.0 / 256, kU32 = 1.0 / 16777216;

#define NEED_BF16()                                                                                      \
  if (!bf16_support().usable()) GTEST_SKIP() << "this CPU has neither AMX-BF16 nor AVX512-BF16 (cpuid)"

TEST(Bf16, RoundingClosedForms) {
  EXPECT_EQ(to_bf16(1.0f), 0x3f80);
  EXPECT_EQ(from_bf16(0x3f80), 1.0f);
  EXPECT_EQ(from_bf16(to_bf16(-2.5f)), -2.5f);
  // Spacing at 1 is 2^-7: 1 + 2^-8 is a tie between 1 (even) and 1 + 2^-7 (odd) -> 1;
  // 1 + 3 * 2^-8 is a tie between 1 + 2^-7 (odd) and 1 + 2^-6 (even) -> 1 + 2^-6.
  EXPECT_EQ(from_bf16(to_bf16(1.0f + 0x1p-8f)), 1.0f);
  EXPECT_EQ(from_bf16(to_bf16(1.0f + 3 * 0x1p-8f)), 1.0f + 0x1p-6f);
  EXPECT_EQ(from_bf16(to_bf16(1.0f + 0x1p-8f + 0x1p-12f)), 1.0f + 0x1p-7f);  // above the tie: up
  EXPECT_TRUE(std::isnan(from_bf16(to_bf16(std::numeric_limits<float>::quiet_NaN()))));
  EXPECT_EQ(from_bf16(to_bf16(std::numeric_limits<float>::infinity())), std::numeric_limits<float>::infinity());
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> d(-1e3f, 1e3f);
  for (int i = 0; i < 10000; ++i) {
    const float x = d(rng);
    EXPECT_LE(std::abs(from_bf16(to_bf16(x)) - x), kU * std::abs(x)) << x;
  }
}

TEST(Bf16, RefusedWithoutTheCpuFeature) {
  if (bf16_support().usable()) {
    EXPECT_NO_THROW(set_gemm_precision(GemmPrecision::kBf16));
    set_gemm_precision(GemmPrecision::kFp32);
  } else {
    try {
      set_gemm_precision(GemmPrecision::kBf16);
      ADD_FAILURE() << "bf16 accepted on a CPU without it";
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find("AVX512-BF16"), std::string::npos) << e.what();
    }
    EXPECT_EQ(gemm_precision(), GemmPrecision::kFp32);
  }
}

struct Case {
  bool ta, tb;
  int64_t M, N, K;
  float beta;
};

TEST(Bf16, GemmWithinTheRoundingBound) {
  NEED_BF16();
  std::mt19937 rng(11);
  std::normal_distribution<float> d(0.0f, 1.0f);
  bool rounded = false;
  for (const Case& c : {Case{false, false, 37, 50, 300, 0}, Case{false, true, 64, 33, 129, 0},
                        Case{true, false, 20, 71, 256, 1}, Case{true, true, 45, 17, 77, 0},
                        Case{false, true, 1, 96, 768, 1}}) {
    SCOPED_TRACE(testing::Message() << "ta=" << c.ta << " tb=" << c.tb << " M=" << c.M << " N=" << c.N << " K=" << c.K
                                    << " beta=" << c.beta);
    // Stored shapes with padded leading dimensions (a block of a larger buffer).
    const int64_t ar = c.ta ? c.K : c.M, ac = c.ta ? c.M : c.K, br = c.tb ? c.N : c.K, bc = c.tb ? c.K : c.N;
    const int64_t lda = ac + 3, ldb = bc + 5, ldc = c.N + 2;
    std::vector<float> A(static_cast<size_t>(ar * lda)), B(static_cast<size_t>(br * ldb)), C(static_cast<size_t>(c.M * ldc));
    for (float& x : A) x = d(rng);
    for (float& x : B) x = d(rng);
    for (float& x : C) x = d(rng);
    const std::vector<float> C0 = C;
    gemm_bf16(c.ta, c.tb, c.M, c.N, c.K, 1.0f, A.data(), lda, B.data(), ldb, c.beta, C.data(), ldc);
    const double gamma = c.K * kU32 / (1 - c.K * kU32);
    for (int64_t i = 0; i < c.M; ++i)
      for (int64_t j = 0; j < c.N; ++j) {
        double exact = 0, mag = 0;
        for (int64_t k = 0; k < c.K; ++k) {
          const double a = c.ta ? A[k * lda + i] : A[i * lda + k], b = c.tb ? B[j * ldb + k] : B[k * ldb + j];
          exact += a * b, mag += std::abs(a * b);
        }
        const double old = c.beta * double(C0[i * ldc + j]);
        const double bound = (2 * kU + kU * kU + gamma * (1 + 2 * kU + kU * kU)) * mag +
                             2 * kU32 * (std::abs(old) + mag);
        const double err = std::abs(double(C[i * ldc + j]) - (exact + old));
        ASSERT_LE(err, bound) << "i=" << i << " j=" << j;
        if (err > (gamma + kU32) * mag + 2 * kU32 * std::abs(old)) rounded = true;
      }
    for (int64_t i = 0; i < c.M; ++i)  // the padding of C is untouched
      for (int64_t j = c.N; j < ldc; ++j) ASSERT_EQ(C[i * ldc + j], C0[i * ldc + j]);
  }
  EXPECT_TRUE(rounded) << "no element beyond fp32's own error: the operands were not rounded to bf16";
}

TEST(Bf16, IntegersAreExact) {
  NEED_BF16();
  const int64_t M = 19, N = 23, K = 200;
  std::vector<float> A(M * K), B(K * N), C(M * N);
  for (int64_t i = 0; i < M * K; ++i) A[i] = float((i * 7) % 17 - 8);   // |a| <= 8: exact in bf16
  for (int64_t i = 0; i < K * N; ++i) B[i] = float((i * 5) % 13 - 6);
  gemm_bf16(false, false, M, N, K, 1.0f, A.data(), K, B.data(), N, 0.0f, C.data(), N);
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j) {
      double e = 0;
      for (int64_t k = 0; k < K; ++k) e += double(A[i * K + k]) * B[k * N + j];
      ASSERT_EQ(double(C[i * N + j]), e);
    }
}

// The linear layer follows the process's GEMM precision: bf16 rounds (differs from fp32 on random
// data, equals it on bf16-exact data), fp32 again after switching back; double is never rounded.
TEST(Bf16, LinearLayerFollowsThePrecision) {
  NEED_BF16();
  const int64_t N = 16, I = 64, O = 32;
  std::mt19937 rng(3);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> x(N * I), w(O * I), y32(N * O), y16(N * O), again(N * O);
  for (float& v : x) v = d(rng);
  for (float& v : w) v = d(rng);
  linear_fwd<float>(x.data(), w.data(), nullptr, y32.data(), N, I, O);
  set_gemm_precision(GemmPrecision::kBf16);
  linear_fwd<float>(x.data(), w.data(), nullptr, y16.data(), N, I, O);
  std::vector<double> xd(x.begin(), x.end()), wd(w.begin(), w.end()), yd(N * O), yd16(N * O);
  linear_fwd<double>(xd.data(), wd.data(), nullptr, yd16.data(), N, I, O);
  set_gemm_precision(GemmPrecision::kFp32);
  linear_fwd<float>(x.data(), w.data(), nullptr, again.data(), N, I, O);
  linear_fwd<double>(xd.data(), wd.data(), nullptr, yd.data(), N, I, O);
  EXPECT_NE(y16, y32);
  EXPECT_EQ(again, y32);
  EXPECT_EQ(yd16, yd);
  for (float& v : x) v = from_bf16(to_bf16(v));
  for (float& v : w) v = from_bf16(to_bf16(v));
  linear_fwd<float>(x.data(), w.data(), nullptr, y32.data(), N, I, O);
  set_gemm_precision(GemmPrecision::kBf16);
  linear_fwd<float>(x.data(), w.data(), nullptr, y16.data(), N, I, O);
  set_gemm_precision(GemmPrecision::kFp32);
  // Same exact products; only the fp32 summation orders differ: each within gamma_I sum|x||w|.
  const double gamma = I * kU32 / (1 - I * kU32);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t o = 0; o < O; ++o) {
      double mag = 0;
      for (int64_t k = 0; k < I; ++k) mag += std::abs(double(x[n * I + k]) * w[o * I + k]);
      EXPECT_LE(std::abs(double(y16[n * O + o]) - y32[n * O + o]), 2 * gamma * mag) << n << "," << o;
    }
}

}  // namespace
}  // namespace dhelix::cpu
