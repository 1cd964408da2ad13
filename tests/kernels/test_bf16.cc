// bf16 GEMMs (kernels/cpu/Bf16.h). Oracles:
//  - rounding: closed forms (exact values, ties to even, NaN and infinity kept);
//  - gemm_bf16 against the exact product in double of the same fp32 inputs, within the bound of
//    bf16 rounding and fp32 accumulation: each operand is rounded with relative error <= u = 2^-8
//    (8 significant bits), a product of two bf16 values is exact in fp32 (16 <= 24 bits), so a term
//    carries relative error <= 2u + u^2, and summing K terms in fp32 adds at most
//    gamma_K = K u32 / (1 - K u32) (u32 = 2^-24, Higham, Accuracy and Stability, Lemma 3.1) of
//    sum|a||b|: |c - exact| <= (2u + u^2 + gamma_K (1 + 2u + u^2)) * sum_k |a_ik| |b_kj|;
//    beta * C adds one more fp32 rounding of the result (u32 (|beta C| + sum|a||b|), doubled; one
//    more per block where a long reduction runs in blocks);
//  - inputs exactly representable in bf16 (small integers) give the exact sums: every product and
//    partial sum is an integer below 2^24;
//  - that rounding happened at all (no silent fp32): on random inputs some element lies farther
//    from the exact product than fp32's own bound allows;
//  - bf16 attention (the tile products through the same matmul): the exact softmax attention in
//    double, within the bound that rounding q, k, v and the probabilities carries (derived beside
//    the test), and on bf16-exact inputs the fp32 kernel, within the rounding of the score tiles.
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
    EXPECT_NO_THROW(kernel_config(1, GemmPrecision::kBf16));
  } else {
    KernelConfig k;
    try {
      k = kernel_config(1, GemmPrecision::kBf16);
      ADD_FAILURE() << "bf16 accepted on a CPU without it";
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find("AVX512-BF16"), std::string::npos) << e.what();
    }
    EXPECT_EQ(k.precision, GemmPrecision::kFp32);
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
                        Case{false, true, 1, 96, 768, 1},
                        // An extent above 4096 runs as 2048-wide blocks (Bf16.cc): C's rows, C's
                        // columns, the reduction (its blocks each add one rounding of C, below).
                        Case{true, false, 5000, 9, 33, 1}, Case{false, true, 3, 4500, 20, 0},
                        Case{false, false, 2, 4400, 9, 1}, Case{false, false, 5, 7, 4300, 1},
                        Case{true, true, 4, 6, 4200, 1}}) {
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
    // beta * C is rounded once into the first block's result and once more by each later block's
    // addition onto C: 1 + blocks roundings of the running value (within |old| + mag).
    const double blocks = c.K > 4096 ? double((c.K + 2047) / 2048) : 1.0;
    for (int64_t i = 0; i < c.M; ++i)
      for (int64_t j = 0; j < c.N; ++j) {
        double exact = 0, mag = 0;
        for (int64_t k = 0; k < c.K; ++k) {
          const double a = c.ta ? A[k * lda + i] : A[i * lda + k], b = c.tb ? B[j * ldb + k] : B[k * ldb + j];
          exact += a * b, mag += std::abs(a * b);
        }
        const double old = c.beta * double(C0[i * ldc + j]);
        const double bound = (2 * kU + kU * kU + gamma * (1 + 2 * kU + kU * kU)) * mag +
                             (1 + blocks) * kU32 * (std::abs(old) + mag);
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

// The linear layer follows the GEMM precision it is given: bf16 rounds (differs from fp32 on random
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
  linear_fwd<float>(x.data(), w.data(), nullptr, y16.data(), N, I, O, GemmPrecision::kBf16);
  std::vector<double> xd(x.begin(), x.end()), wd(w.begin(), w.end()), yd(N * O), yd16(N * O);
  linear_fwd<double>(xd.data(), wd.data(), nullptr, yd16.data(), N, I, O, GemmPrecision::kBf16);
  linear_fwd<float>(x.data(), w.data(), nullptr, again.data(), N, I, O);
  linear_fwd<double>(xd.data(), wd.data(), nullptr, yd.data(), N, I, O);
  EXPECT_NE(y16, y32);
  EXPECT_EQ(again, y32);
  EXPECT_EQ(yd16, yd);
  for (float& v : x) v = from_bf16(to_bf16(v));
  for (float& v : w) v = from_bf16(to_bf16(v));
  linear_fwd<float>(x.data(), w.data(), nullptr, y32.data(), N, I, O);
  linear_fwd<float>(x.data(), w.data(), nullptr, y16.data(), N, I, O, GemmPrecision::kBf16);
  // Same exact products; only the fp32 summation orders differ: each within gamma_I sum|x||w|.
  const double gamma = I * kU32 / (1 - I * kU32);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t o = 0; o < O; ++o) {
      double mag = 0;
      for (int64_t k = 0; k < I; ++k) mag += std::abs(double(x[n * I + k]) * w[o * I + k]);
      EXPECT_LE(std::abs(double(y16[n * O + o]) - y32[n * O + o]), 2 * gamma * mag) << n << "," << o;
    }
}

// The linear layer's forward with a bias in bf16 adds it in the primitive's epilogue. Oracle: the
// bias-free bf16 forward of the same inputs plus the bias in fp32 -- bitwise, since both add the
// bias once to the same fp32 accumulator value (the bias-free result is that value unrounded
// further) -- and the bias-free result differs from it (the bias was added at all).
TEST(Bf16, LinearBiasInTheEpilogueEqualsAddingIt) {
  NEED_BF16();
  const int64_t N = 37, I = 96, O = 70;
  std::mt19937 rng(5);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> x(N * I), w(O * I), b(O), with(N * O), without(N * O);
  for (float& v : x) v = d(rng);
  for (float& v : w) v = d(rng);
  for (float& v : b) v = d(rng);
  linear_fwd<float>(x.data(), w.data(), b.data(), with.data(), N, I, O, GemmPrecision::kBf16);
  linear_fwd<float>(x.data(), w.data(), nullptr, without.data(), N, I, O, GemmPrecision::kBf16);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t o = 0; o < O; ++o) ASSERT_EQ(with[n * O + o], without[n * O + o] + b[o]) << n << "," << o;
  EXPECT_NE(with, without);
}

// The linear layer with its weight already in bf16 (a step's weight copy) against the float calls
// that round the weight themselves: bitwise, forward with and without a bias, input gradient
// written and accumulated.
TEST(Bf16, LinearWithBf16WeightsEqualsRoundingThem) {
  NEED_BF16();
  const int64_t N = 29, I = 80, O = 52;
  std::mt19937 rng(9);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> x(N * I), w(O * I), b(O), dy(N * O);
  for (auto* v : {&x, &w, &b, &dy})
    for (float& e : *v) e = d(rng);
  std::vector<uint16_t> w16(w.size());
  round_to_bf16(w.data(), w16.data(), static_cast<int64_t>(w.size()));
  for (const float* bias : {static_cast<const float*>(nullptr), static_cast<const float*>(b.data())}) {
    std::vector<float> a(N * O), c(N * O);
    linear_fwd<float>(x.data(), w.data(), bias, a.data(), N, I, O, GemmPrecision::kBf16);
    linear_fwd_bf16w(x.data(), w16.data(), bias, c.data(), N, I, O);
    EXPECT_EQ(a, c) << (bias ? "with bias" : "without bias");
  }
  for (Accumulate acc : {Accumulate::kNo, Accumulate::kYes}) {
    std::vector<float> a(N * I, 0.5f), c(N * I, 0.5f);
    linear_bwd_data<float>(dy.data(), w.data(), a.data(), N, I, O, acc, GemmPrecision::kBf16);
    linear_bwd_data_bf16w(dy.data(), w16.data(), c.data(), N, I, O, acc);
    EXPECT_EQ(a, c) << (acc == Accumulate::kYes ? "accumulated" : "written");
  }
}

// ---- attention ----

struct AttnCase {
  AttnDims d;
  float scale;
  std::vector<float> q, k, v, dout;
};

AttnCase attn_case(unsigned seed, bool bf16_exact) {
  // T = 600: two of the bf16 path's 512-wide key tiles and five 128-row query tiles (each last one ragged).
  AttnCase c{AttnDims{1, 600, 4, 2, 64, 4 * 64, 2 * 64, 4 * 64}, 0.125f, {}, {}, {}, {}};
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  auto fill = [&](std::vector<float>& x, int64_t n) {
    x.resize(static_cast<size_t>(n));
    for (float& e : x) e = bf16_exact ? from_bf16(to_bf16(nd(rng))) : nd(rng);
  };
  fill(c.q, c.d.B * c.d.T * c.d.q_stride);
  fill(c.k, c.d.B * c.d.T * c.d.kv_stride);
  fill(c.v, c.d.B * c.d.T * c.d.kv_stride);
  fill(c.dout, c.d.B * c.d.T * c.d.o_stride);
  return c;
}

// The exact probabilities p[b, h, t, s] (s <= t) in double.
std::vector<double> exact_probs(const AttnCase& c) {
  const AttnDims& d = c.d;
  std::vector<double> p(static_cast<size_t>(d.B * d.H * d.T * d.T), 0.0);
  for (int64_t b = 0; b < d.B; ++b)
    for (int64_t h = 0; h < d.H; ++h)
      for (int64_t t = 0; t < d.T; ++t) {
        double* row = p.data() + ((b * d.H + h) * d.T + t) * d.T;
        double m = -1e300, l = 0;
        for (int64_t s = 0; s <= t; ++s) {
          double acc = 0;
          for (int64_t e = 0; e < d.D; ++e)
            acc += double(c.q[(b * d.T + t) * d.q_stride + h * d.D + e]) *
                   c.k[(b * d.T + s) * d.kv_stride + (h / (d.H / d.Hkv)) * d.D + e];
          row[s] = c.scale * acc;
          m = std::max(m, row[s]);
        }
        for (int64_t s = 0; s <= t; ++s) l += (row[s] = std::exp(row[s] - m));
        for (int64_t s = 0; s <= t; ++s) row[s] /= l;
      }
  return p;
}

// The forward in bf16 against exact softmax attention. Derivation, per query row (b, h, t):
//   score s_j = scale q.k_j from bf16(q), bf16(k): |error| <= delta_j = scale (2u + u^2 + gamma_D
//   (1 + 2u + u^2)) sum_e |q_e k_je| (the GEMM bound above); so each exp(s_j - m) and the fp32
//   normaliser l are within a factor e^(+-delta) (delta = max_j delta_j, times (1 + gamma_T) for
//   l's sum), and the weight exp/l within e^(+-2 delta) (1 +- gamma_T). The P V product rounds
//   the weight and v to bf16 (factor (1 +- u) each, their product exact in fp32) and sums T terms
//   (gamma_T). So |o_c - exact| <= ((1 + u)^2 (1 + gamma_T)^2 e^(2 delta) - 1) sum_j p_j |v_jc|,
//   and |lse - exact| <= delta + gamma_T. Beside that, the fp32 kernel's own error (polynomial
//   exp, fp32 max and scaling): test_attention.cc's FloatAgreesWithDouble tolerance, 2e-5 of the
//   same magnitude.
TEST(Bf16, AttentionForwardWithinTheRoundingBound) {
  NEED_BF16();
  const AttnCase c = attn_case(21, false);
  const AttnDims& d = c.d;
  const std::vector<double> p = exact_probs(c);
  std::vector<float> o32(c.dout.size()), lse32(d.B * d.H * d.T), o16(o32.size()), lse16(lse32.size());
  cpu::attention_fwd<float>(c.q.data(), c.k.data(), c.v.data(), o32.data(), lse32.data(), d, c.scale);
  cpu::attention_fwd<float>(c.q.data(), c.k.data(), c.v.data(), o16.data(), lse16.data(), d, c.scale, GemmPrecision::kBf16);
  const double gD = d.D * kU32 / (1 - d.D * kU32), gT = d.T * kU32 / (1 - d.T * kU32), kFp32Tol = 2e-5;
  const int64_t G = d.H / d.Hkv;
  bool rounded = false;
  for (int64_t b = 0; b < d.B; ++b)
    for (int64_t h = 0; h < d.H; ++h)
      for (int64_t t = 0; t < d.T; ++t) {
        const double* row = p.data() + ((b * d.H + h) * d.T + t) * d.T;
        double delta = 0, lse_exact = 0, m = -1e300;
        std::vector<double> s(static_cast<size_t>(t + 1));
        for (int64_t j = 0; j <= t; ++j) {
          double mag = 0, acc = 0;
          for (int64_t e = 0; e < d.D; ++e) {
            const double x = double(c.q[(b * d.T + t) * d.q_stride + h * d.D + e]) *
                             c.k[(b * d.T + j) * d.kv_stride + (h / G) * d.D + e];
            acc += x, mag += std::abs(x);
          }
          s[j] = c.scale * acc, m = std::max(m, s[j]);
          delta = std::max(delta, c.scale * (2 * kU + kU * kU + gD * (1 + 2 * kU + kU * kU)) * mag);
        }
        for (int64_t j = 0; j <= t; ++j) lse_exact += std::exp(s[j] - m);
        lse_exact = m + std::log(lse_exact);
        const double lse_got = lse16[(b * d.H + h) * d.T + t];
        ASSERT_LE(std::abs(lse_got - lse_exact), delta + gT + kFp32Tol * std::max(1.0, std::abs(lse_exact)))
            << "lse b=" << b << " h=" << h << " t=" << t;
        const double factor = (1 + kU) * (1 + kU) * (1 + gT) * (1 + gT) * std::exp(2 * delta) - 1;
        for (int64_t e = 0; e < d.D; ++e) {
          double exact = 0, mag = 0;
          for (int64_t j = 0; j <= t; ++j) {
            const double vj = c.v[(b * d.T + j) * d.kv_stride + (h / G) * d.D + e];
            exact += row[j] * vj, mag += row[j] * std::abs(vj);
          }
          const size_t i = static_cast<size_t>((b * d.T + t) * d.o_stride + h * d.D + e);
          const double err = std::abs(double(o16[i]) - exact);
          ASSERT_LE(err, (factor + kFp32Tol) * mag) << "o b=" << b << " h=" << h << " t=" << t << " e=" << e;
          if (err > 4 * std::abs(double(o32[i]) - exact) + kFp32Tol * mag) rounded = true;
        }
      }
  EXPECT_TRUE(rounded) << "bf16 attention no farther from exact than fp32 anywhere: nothing was rounded";
}

// The backward in bf16 against the fp32 kernel on bf16-exact q, k, v and dout (same o and lse for
// both): every product of two such operands is exact in fp32, so the two runs differ by the
// rounding of the probability and score-gradient tiles P and dS to bf16 (relative u each) plus
// each run's fp32 summation order. Per element:
//   |dV_jc| <= u sum_i P_ij |dO_ic|,  |dK_jc| <= u sum_i |dS_ij| |Q_ic|,  |dQ_ic| <= u sum_j |dS_ij| |K_jc|
// (P, dS exact in double), plus twice the fp32 kernel's normwise tolerance against double (2e-5,
// FloatAgreesWithDouble: once for each fp32-accumulating run).
TEST(Bf16, AttentionBackwardWithinTheTileRounding) {
  NEED_BF16();
  const AttnCase c = attn_case(22, true);
  const AttnDims& d = c.d;
  const std::vector<double> p = exact_probs(c);
  std::vector<float> o(c.dout.size()), lse(d.B * d.H * d.T);
  cpu::attention_fwd<float>(c.q.data(), c.k.data(), c.v.data(), o.data(), lse.data(), d, c.scale);
  auto bwd = [&](GemmPrecision prec) {
    std::vector<float> dq(c.q.size()), dk(c.k.size()), dv(c.v.size());
    cpu::attention_bwd<float>(c.q.data(), c.k.data(), c.v.data(), o.data(), lse.data(), c.dout.data(), dq.data(),
                              dk.data(), dv.data(), d, c.scale, prec);
    return std::vector<std::vector<float>>{dq, dk, dv};
  };
  const auto g32 = bwd(GemmPrecision::kFp32), g16 = bwd(GemmPrecision::kBf16);
  // Magnitudes from the exact P and dS = scale P (dO.V - dO.O) in double.
  std::vector<double> mq(c.q.size()), mk(c.k.size()), mv(c.v.size());
  const int64_t G = d.H / d.Hkv;
  auto at = [&](const std::vector<float>& x, int64_t b, int64_t t, int64_t stride, int64_t col) {
    return double(x[(b * d.T + t) * stride + col]);
  };
  for (int64_t b = 0; b < d.B; ++b)
    for (int64_t h = 0; h < d.H; ++h) {
      const int64_t g = h / G;
      for (int64_t t = 0; t < d.T; ++t) {
        const double* row = p.data() + ((b * d.H + h) * d.T + t) * d.T;
        double Di = 0;
        for (int64_t e = 0; e < d.D; ++e) {
          double oe = 0;
          for (int64_t j = 0; j <= t; ++j) oe += row[j] * at(c.v, b, j, d.kv_stride, g * d.D + e);
          Di += at(c.dout, b, t, d.o_stride, h * d.D + e) * oe;
        }
        for (int64_t j = 0; j <= t; ++j) {
          double dp = 0;
          for (int64_t e = 0; e < d.D; ++e)
            dp += at(c.dout, b, t, d.o_stride, h * d.D + e) * at(c.v, b, j, d.kv_stride, g * d.D + e);
          const double ds = std::abs(c.scale * row[j] * (dp - Di));
          for (int64_t e = 0; e < d.D; ++e) {
            mv[(b * d.T + j) * d.kv_stride + g * d.D + e] += row[j] * std::abs(at(c.dout, b, t, d.o_stride, h * d.D + e));
            mk[(b * d.T + j) * d.kv_stride + g * d.D + e] += ds * std::abs(at(c.q, b, t, d.q_stride, h * d.D + e));
            mq[(b * d.T + t) * d.q_stride + h * d.D + e] += ds * std::abs(at(c.k, b, j, d.kv_stride, g * d.D + e));
          }
        }
      }
    }
  const char* names[] = {"dq", "dk", "dv"};
  const std::vector<double>* mags[] = {&mq, &mk, &mv};
  bool rounded = false;
  for (int w = 0; w < 3; ++w) {
    double ref_max = 0;
    for (float x : g32[w]) ref_max = std::max(ref_max, double(std::abs(x)));
    const double floor = 2 * 2e-5 * ref_max;
    for (size_t i = 0; i < g32[w].size(); ++i) {
      const double err = std::abs(double(g16[w][i]) - g32[w][i]);
      ASSERT_LE(err, kU * (*mags[w])[i] + floor) << names[w] << "[" << i << "]";
      if (err > floor) rounded = true;
    }
  }
  EXPECT_TRUE(rounded) << "bf16 backward within fp32's own error everywhere: the tiles were not rounded";
}

// Two threads against one, bitwise: each (b, h, query tile) and (b, kv head) item is computed the
// same way on whichever thread runs it, with the product on the calling thread.
TEST(Bf16, AttentionTwoThreadsEqualOneBitwise) {
  NEED_BF16();
  const AttnCase c = attn_case(23, false);
  auto run = [&](int threads) {
    cpu::set_num_threads(threads);
    std::vector<float> o(c.dout.size()), lse(c.d.B * c.d.H * c.d.T), dq(c.q.size()), dk(c.k.size()), dv(c.v.size());
    cpu::attention_fwd<float>(c.q.data(), c.k.data(), c.v.data(), o.data(), lse.data(), c.d, c.scale, GemmPrecision::kBf16);
    cpu::attention_bwd<float>(c.q.data(), c.k.data(), c.v.data(), o.data(), lse.data(), c.dout.data(), dq.data(),
                              dk.data(), dv.data(), c.d, c.scale, GemmPrecision::kBf16);
    cpu::set_num_threads(1);
    return std::vector<std::vector<float>>{o, lse, dq, dk, dv};
  };
  const auto one = run(1), two = run(2);
  for (size_t i = 0; i < one.size(); ++i) EXPECT_EQ(one[i], two[i]) << "output " << i;
}

}  // namespace
}  // namespace dhelix::cpu
