// Embedding lookup and fused softmax cross-entropy. Oracles: the definitions (row copies, a naive
// logsumexp in double), closed forms (uniform logits give log V), central finite differences, and
// the double kernels for float.
#include <gtest/gtest.h>

#include <limits>
#include <string>

#include "Oracle.h"
#include "base/Error.h"
#include "kernels/cpu/Kernels.h"

namespace dhelix::test {
namespace {

// Oracle: definition, exact (one addition per element).
TEST(Embedding, ForwardIsRowLookupPlusPosition) {
  std::mt19937 rng(60);
  const int64_t B = 2, T = 3, C = 5, V = 7, off = 2;
  std::vector<int32_t> tok = {3, 0, 6, 3, 3, 1};
  Vec wte = randn(V * C, rng), wpe = randn((off + T) * C, rng), y(B * T * C);
  cpu::embedding_fwd<double>(tok.data(), wte.data(), wpe.data(), y.data(), B, T, C, off);
  for (int64_t bt = 0; bt < B * T; ++bt)
    for (int64_t c = 0; c < C; ++c) EXPECT_EQ(y[bt * C + c], wte[tok[bt] * C + c] + wpe[(off + bt % T) * C + c]);
  cpu::embedding_fwd<double>(tok.data(), wte.data(), nullptr, y.data(), B, T, C, off);
  for (int64_t bt = 0; bt < B * T; ++bt)
    for (int64_t c = 0; c < C; ++c) EXPECT_EQ(y[bt * C + c], wte[tok[bt] * C + c]);
}

// Oracle: central finite differences (tolerance in Oracle.h); repeated tokens must sum their
// gradients; dwte/dwpe accumulate onto random prior values.
TEST(Embedding, BackwardMatchesFiniteDifferences) {
  std::mt19937 rng(61);
  const int64_t B = 2, T = 3, C = 4, V = 5, off = 1;
  std::vector<int32_t> tok = {2, 2, 0, 4, 2, 1};
  Vec wte = randn(V * C, rng), wpe = randn((off + T) * C, rng), r = randn(B * T * C, rng);
  auto loss = [&] {
    Vec y(B * T * C);
    cpu::embedding_fwd<double>(tok.data(), wte.data(), wpe.data(), y.data(), B, T, C, off);
    return dot(y, r);
  };
  Vec dwte0 = randn(V * C, rng), dwpe0 = randn((off + T) * C, rng), dwte = dwte0, dwpe = dwpe0;
  cpu::embedding_bwd<double>(tok.data(), r.data(), dwte.data(), dwpe.data(), B, T, C, off);
  for (size_t i = 0; i < dwte.size(); ++i) dwte[i] -= dwte0[i];
  for (size_t i = 0; i < dwpe.size(); ++i) dwpe[i] -= dwpe0[i];
  const double L = loss();
  expect_grad_near("dwte", dwte, numeric_grad(wte, loss), L);
  expect_grad_near("dwpe", dwpe, numeric_grad(wpe, loss), L);
}

// Oracle: closed form. Uniform logits over V = 50257 (GPT-2) give loss log V and gradient
// 1/V - onehot. Tolerances: float sums 50257 exp(0) = 1 terms exactly (integers < 2^24), so the
// loss is log V to fp32 rounding of log (1e-6 relative); double to 1e-12.
TEST(CrossEntropy, UniformLogitsGiveLogV) {
  const int64_t N = 3, V = 50257;
  std::vector<int32_t> tgt = {0, 50256, 1234};
  std::vector<float> lf(N * V, 0.25f), lossf(N);
  Vec ld(N * V, -3.0), lossd(N), dld(N * V);
  cpu::cross_entropy_fwd_bwd<float>(lf.data(), tgt.data(), lossf.data(), lf.data(), nullptr, N, V);  // in place
  cpu::cross_entropy_fwd_bwd<double>(ld.data(), tgt.data(), lossd.data(), dld.data(), nullptr, N, V);
  for (int64_t n = 0; n < N; ++n) {
    EXPECT_NEAR(lossf[n], std::log(double(V)), 1e-6 * std::log(double(V)));
    EXPECT_NEAR(lossd[n], std::log(double(V)), 1e-12);
    for (int64_t v = 0; v < V; v += 997) {
      const double want = 1.0 / V - (v == tgt[n] ? 1.0 : 0.0);
      EXPECT_NEAR(dld[n * V + v], want, 1e-15);
      EXPECT_NEAR(lf[n * V + v], want, 1e-6 * std::abs(want));
    }
    EXPECT_NEAR(dld[n * V + tgt[n]], 1.0 / V - 1.0, 1e-15);
    EXPECT_NEAR(lf[n * V + tgt[n]], 1.0 / V - 1.0, 1e-7);
  }
}

// Oracle: naive logsumexp(x) - x[target] in double with a shift for stability. Logits around
// +1000 check the max shift; target -1 is ignored (loss 0, zero gradient row). Tolerance 1e-13.
TEST(CrossEntropy, ForwardMatchesNaiveAndIgnoresNegativeTargets) {
  std::mt19937 rng(62);
  const int64_t N = 4, V = 37;
  Vec x = randn(N * V, rng, 3.0), loss(N), dx(N * V, 5.0);
  for (int64_t v = 0; v < V; ++v) x[2 * V + v] += 1000.0;
  std::vector<int32_t> tgt = {5, -1, 36, 0};
  cpu::cross_entropy_fwd_bwd<double>(x.data(), tgt.data(), loss.data(), dx.data(), nullptr, N, V);
  for (int64_t n = 0; n < N; ++n) {
    if (tgt[n] < 0) {
      EXPECT_EQ(loss[n], 0.0);
      for (int64_t v = 0; v < V; ++v) EXPECT_EQ(dx[n * V + v], 0.0);
      continue;
    }
    double m = -1e300, s = 0;
    for (int64_t v = 0; v < V; ++v) m = std::max(m, x[n * V + v]);
    for (int64_t v = 0; v < V; ++v) s += std::exp(x[n * V + v] - m);
    EXPECT_NEAR(loss[n], m + std::log(s) - x[n * V + tgt[n]], 1e-13 * (1 + std::abs(m)));
  }
}

// Oracle: central finite differences of L = sum_n loss[n] * dloss[n] (tolerance in Oracle.h):
// the gradient written with dloss must be dL/dlogits. Also in place (dlogits aliasing logits)
// must give the same bits as out of place.
TEST(CrossEntropy, BackwardMatchesFiniteDifferences) {
  std::mt19937 rng(63);
  const int64_t N = 3, V = 11;
  Vec x = randn(N * V, rng, 2.0), dloss = randn(N, rng);
  std::vector<int32_t> tgt = {4, 10, -1};
  auto loss_fn = [&] {
    Vec l(N);
    cpu::cross_entropy_fwd_bwd<double>(x.data(), tgt.data(), l.data(), nullptr, nullptr, N, V);
    return dot(l, dloss);
  };
  Vec l(N), dx(N * V);
  cpu::cross_entropy_fwd_bwd<double>(x.data(), tgt.data(), l.data(), dx.data(), dloss.data(), N, V);
  const double L = loss_fn();
  expect_grad_near("dlogits", dx, numeric_grad(x, loss_fn), L);
  Vec inplace = x, l2(N);
  cpu::cross_entropy_fwd_bwd<double>(inplace.data(), tgt.data(), l2.data(), inplace.data(), dloss.data(), N, V);
  EXPECT_EQ(inplace, dx);
  EXPECT_EQ(l2, l);
}

// Oracle: the double kernel. float: max and exp-sum over V = 50257 with the polynomial exp
// (2e-7 relative per term) and 16-lane partial sums; 2e-6 normwise on losses (~10) and on
// gradients (max |g| ~ 1).
TEST(CrossEntropy, FloatAgreesWithDouble) {
  std::mt19937 rng(64);
  const int64_t N = 8, V = 50257;
  Vec x = randn(N * V, rng, 2.0), dloss(N, 1.0 / N), loss(N), dx(N * V);
  std::vector<int32_t> tgt(N);
  for (int64_t n = 0; n < N; ++n) tgt[n] = int32_t((n * 7919) % V);
  cpu::cross_entropy_fwd_bwd<double>(x.data(), tgt.data(), loss.data(), dx.data(), dloss.data(), N, V);
  auto xf = cast<float>(x), dlf = cast<float>(dloss);
  std::vector<float> lossf(N);
  cpu::cross_entropy_fwd_bwd<float>(xf.data(), tgt.data(), lossf.data(), xf.data(), dlf.data(), N, V);
  expect_close("loss", lossf, loss, 2e-6);
  expect_close("dlogits", xf, dx, 2e-6, 0.0);
}

// The vocabulary-parallel steps (xent_row_max / _stats / _finish) over k shards of the columns, the
// group's reductions done here as the tp all-reduces do them (max; sums in rank order, in float as
// the wire does). Oracle: cross_entropy_fwd_bwd<double> on the whole rows. Bound: 1e-5 normwise on
// losses and gradients (float logits and stats: the exp-sums rounded to float once per shard and
// added in float; libm exp, ~1e-7 relative a term). Row 1's target is -1: ignored, loss and
// gradient row exactly 0 as the whole-row kernel gives (before 2026-11-29 the shards gave it a
// loss and a softmax gradient). Row 2's target is in the last shard, row 0's in the first.
TEST(CrossEntropy, VocabParallelStepsMatchTheWholeRow) {
  std::mt19937 rng(65);
  const int64_t N = 5, V = 301;
  Vec x = randn(N * V, rng, 2.0), dloss(N, 1.0 / N), loss(N), dx(N * V);
  std::vector<int32_t> tgt = {3, -1, 300, 150, 299};
  cpu::cross_entropy_fwd_bwd<double>(x.data(), tgt.data(), loss.data(), dx.data(), dloss.data(), N, V);
  for (const int k : {1, 2, 3}) {
    const int64_t Vl = (V + k - 1) / k;  // the last shard ragged
    std::vector<std::vector<float>> shard(k);
    std::vector<float> m(N, -std::numeric_limits<float>::infinity()), stats(2 * N, 0.0f);
    for (int r = 0; r < k; ++r) {
      const int64_t v0 = r * Vl, w = std::min(Vl, V - v0);
      for (int64_t n = 0; n < N; ++n)
        for (int64_t j = 0; j < w; ++j) shard[r].push_back(static_cast<float>(x[n * V + v0 + j]));
      std::vector<float> mr(N);
      cpu::xent_row_max(shard[r].data(), mr.data(), N, w);
      for (int64_t n = 0; n < N; ++n) m[n] = std::max(m[n], mr[n]);
    }
    for (int r = 0; r < k; ++r) {
      const int64_t v0 = r * Vl, w = std::min(Vl, V - v0);
      std::vector<float> sr(2 * N);
      cpu::xent_row_stats(shard[r].data(), tgt.data(), m.data(), sr.data(), N, w, v0);
      for (int64_t i = 0; i < 2 * N; ++i) stats[i] += sr[i];
    }
    Vec got(N * V);
    for (int r = 0; r < k; ++r) {
      const int64_t v0 = r * Vl, w = std::min(Vl, V - v0);
      std::vector<float> lr(N);
      cpu::xent_row_finish(shard[r].data(), tgt.data(), m.data(), stats.data(), lr.data(), shard[r].data(),
                           static_cast<float>(dloss[0]), N, w, v0, V);  // in place, as the op runs it
      expect_close(("loss, k=" + std::to_string(k) + " rank " + std::to_string(r)).c_str(), lr, loss, 1e-5);
      EXPECT_EQ(lr[1], 0.0f) << "k=" << k << " rank " << r;
      for (int64_t n = 0; n < N; ++n)
        for (int64_t j = 0; j < w; ++j) got[n * V + v0 + j] = shard[r][n * w + j];
    }
    expect_close(("dlogits, k=" + std::to_string(k)).c_str(), got, dx, 1e-5, 0.0);
    for (int64_t v = 0; v < V; ++v) EXPECT_EQ(got[V + v], 0.0) << "the ignored row, k=" << k << " column " << v;
  }
  // A target past the vocabulary: a ConfigError naming it, nothing written.
  std::vector<float> one(V, 0.5f), mo(1, 0.5f), so{float(V), 0.5f}, lo(1, -3.0f);
  const std::vector<int32_t> bad{static_cast<int32_t>(V)};
  try {
    cpu::xent_row_finish(one.data(), bad.data(), mo.data(), so.data(), lo.data(), one.data(), 1.0f, 1, V, 0, V);
    FAIL() << "a target past the vocabulary was accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("targets[0] = 301 is not below V=301"), std::string::npos) << e.what();
  }
  EXPECT_EQ(lo[0], -3.0f);
  EXPECT_EQ(one[0], 0.5f);
}

}  // namespace
}  // namespace dhelix::test
