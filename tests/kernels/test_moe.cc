// Mixture-of-Experts kernels. Oracles: a naive dense evaluation of the MoE MLP (every token through
// its k experts one at a time, written from the definition) for the forward; central finite
// differences of L = sum(y * r) + aux for the backward of the whole routed MLP (router logits,
// input, both expert weights); closed forms for the routing edge cases (ties, one expert taking
// every token, an expert receiving nothing). Tolerances: Oracle.h.
#include <gtest/gtest.h>

#include <numeric>

#include "Oracle.h"
#include "kernels/cpu/Kernels.h"

namespace dhelix::test {
namespace {

double silu(double a) { return a / (1 + std::exp(-a)); }

// One MoE MLP, x[N,C] -> y[N,C], with router weight wr[E,C], experts wgu[E*2F, C], wdown[E*C, F].
struct MoeCase {
  int64_t N = 0, C = 0, F = 0, E = 0, k = 0;
  bool norm = true;
  double coef = 0.05;
  Vec x, wr, wgu, wdown, r;

  // y and the aux loss through the kernels; when `grads` also the backward of L = y.r + aux.
  double run(Vec* y_out = nullptr, Vec* dx = nullptr, Vec* dwr = nullptr, Vec* dwgu = nullptr, Vec* dwdown = nullptr,
             std::vector<int32_t>* counts_out = nullptr) {
    const int64_t P = N * k;
    Vec logits(N * E), probs(N * E), gate(N * k), xs(P * C), fc(P * 2 * F), act(P * F), eo(P * C), y(N * C);
    std::vector<int32_t> expert(N * k), counts(E), order(P), slot(P);
    cpu::linear_fwd<double>(x.data(), wr.data(), nullptr, logits.data(), N, C, E);
    cpu::moe_route_fwd<double>(logits.data(), probs.data(), expert.data(), gate.data(), N, E, k, norm);
    cpu::moe_group(expert.data(), N, k, E, counts.data(), order.data(), slot.data());
    Vec stats(2 * E);
    cpu::moe_route_stats<double>(probs.data(), counts.data(), N, E, stats.data());
    const double aux = cpu::moe_aux_loss<double>(stats.data(), E, k, coef);
    cpu::moe_dispatch<double>(x.data(), order.data(), xs.data(), P, k, C);
    cpu::expert_linear_fwd<double>(xs.data(), wgu.data(), counts.data(), fc.data(), E, C, 2 * F);
    cpu::swiglu_fwd<double>(fc.data(), act.data(), P, F);
    cpu::expert_linear_fwd<double>(act.data(), wdown.data(), counts.data(), eo.data(), E, F, C);
    cpu::moe_combine<double>(eo.data(), slot.data(), gate.data(), y.data(), N, k, C);
    if (y_out) *y_out = y;
    if (counts_out) *counts_out = counts;
    if (dx) {
      Vec deo(P * C), dgate(N * k), dact(P * F), dfc(P * 2 * F), dxs(P * C), dlogits(N * E), aux_dp(E);
      dx->assign(N * C, 0.0), dwr->assign(E * C, 0.0), dwgu->assign(E * 2 * F * C, 0.0), dwdown->assign(E * C * F, 0.0);
      cpu::moe_combine_bwd<double>(r.data(), eo.data(), slot.data(), gate.data(), deo.data(), dgate.data(), N, k, C);
      cpu::expert_linear_bwd_data<double>(deo.data(), wdown.data(), counts.data(), dact.data(), E, F, C);
      cpu::expert_linear_bwd_weight<double>(deo.data(), act.data(), counts.data(), dwdown->data(), E, F, C);
      cpu::swiglu_bwd<double>(dact.data(), fc.data(), dfc.data(), P, F);
      cpu::expert_linear_bwd_data<double>(dfc.data(), wgu.data(), counts.data(), dxs.data(), E, C, 2 * F);
      cpu::expert_linear_bwd_weight<double>(dfc.data(), xs.data(), counts.data(), dwgu->data(), E, C, 2 * F);
      // d aux / d probs[n,e] = coef * E * counts[e] / (N k) / N, the same for every token.
      for (int64_t e = 0; e < E; ++e) aux_dp[e] = coef * double(E) * counts[e] / double(N * k) / double(N);
      cpu::moe_route_bwd<double>(probs.data(), expert.data(), gate.data(), dgate.data(), aux_dp.data(), dlogits.data(),
                                 N, E, k, norm);
      cpu::linear_bwd_data<double>(dlogits.data(), wr.data(), dx->data(), N, C, E, cpu::Accumulate::kNo);
      cpu::linear_bwd_weight<double>(dlogits.data(), x.data(), dwr->data(), nullptr, N, C, E);
      cpu::moe_dispatch_bwd<double>(dxs.data(), slot.data(), dx->data(), N, k, C);
    }
    return dot(y, r) + aux;
  }
};

MoeCase random_case(uint32_t seed, int64_t N, int64_t C, int64_t F, int64_t E, int64_t k, bool norm) {
  std::mt19937 rng(seed);
  MoeCase c;
  c.N = N, c.C = C, c.F = F, c.E = E, c.k = k, c.norm = norm;
  c.x = randn(N * C, rng), c.wr = randn(E * C, rng, 0.7), c.wgu = randn(E * 2 * F * C, rng, 0.4);
  c.wdown = randn(E * C * F, rng, 0.4), c.r = randn(N * C, rng);
  return c;
}

// Oracle: the definition, token by token: probabilities by softmax, the k largest, gates
// renormalised, y = sum_j g_j * W2_e (silu(W1_e x) * (W3_e x)).
TEST(Moe, ForwardMatchesTokenByTokenDefinition) {
  for (bool norm : {true, false}) {
    MoeCase c = random_case(31, 9, 6, 5, 4, 2, norm);
    Vec y;
    c.run(&y);
    const int64_t C = c.C, F = c.F, E = c.E;
    Vec want(c.N * C, 0.0);
    for (int64_t n = 0; n < c.N; ++n) {
      Vec p(E);
      double mx = -1e300, s = 0;
      for (int64_t e = 0; e < E; ++e) {
        for (int64_t i = 0; i < C; ++i) p[e] += c.wr[e * C + i] * c.x[n * C + i];
        mx = std::max(mx, p[e]);
      }
      for (auto& v : p) s += (v = std::exp(v - mx));
      for (auto& v : p) v /= s;
      std::vector<int64_t> idx(E);
      std::iota(idx.begin(), idx.end(), 0);
      std::stable_sort(idx.begin(), idx.end(), [&](int64_t a, int64_t b) { return p[a] > p[b]; });
      double gs = 0;
      for (int64_t j = 0; j < c.k; ++j) gs += p[idx[j]];
      for (int64_t j = 0; j < c.k; ++j) {
        const int64_t e = idx[j];
        const double g = norm ? p[e] / gs : p[e];
        Vec h(F);
        for (int64_t f = 0; f < F; ++f) {
          double a = 0, u = 0;
          for (int64_t i = 0; i < C; ++i) {
            a += c.wgu[(e * 2 * F + f) * C + i] * c.x[n * C + i];
            u += c.wgu[(e * 2 * F + F + f) * C + i] * c.x[n * C + i];
          }
          h[f] = silu(a) * u;
        }
        for (int64_t o = 0; o < C; ++o) {
          double v = 0;
          for (int64_t f = 0; f < F; ++f) v += c.wdown[(e * C + o) * F + f] * h[f];
          want[n * C + o] += g * v;
        }
      }
    }
    expect_close(norm ? "y (norm_topk)" : "y (raw gates)", y, want, 1e-13);
  }
}

// Oracle: central finite differences of L = y.r + aux, with the routing fixed inside each
// difference (asserted: no perturbation changes a token's experts, so L is smooth there).
TEST(Moe, BackwardMatchesFiniteDifferences) {
  for (bool norm : {true, false}) {
    for (int64_t k : {1, 2, 3}) {
      MoeCase c = random_case(40 + uint32_t(k), 7, 5, 4, 4, k, norm);
      Vec dx, dwr, dwgu, dwdown;
      std::vector<int32_t> counts0, counts;
      const double L = c.run(nullptr, &dx, &dwr, &dwgu, &dwdown, &counts0);
      auto loss = [&] {
        const double v = c.run(nullptr, nullptr, nullptr, nullptr, nullptr, &counts);
        EXPECT_EQ(counts, counts0) << "a finite-difference step changed the routing";
        return v;
      };
      SCOPED_TRACE(testing::Message() << "k=" << k << (norm ? " norm_topk" : " raw gates"));
      expect_grad_near("dx", dx, numeric_grad(c.x, loss), L);
      expect_grad_near("drouter", dwr, numeric_grad(c.wr, loss), L);
      expect_grad_near("dwgu", dwgu, numeric_grad(c.wgu, loss), L);
      expect_grad_near("dwdown", dwdown, numeric_grad(c.wdown, loss), L);
    }
  }
}

// Oracle: closed forms. Equal logits: softmax is uniform and the tie goes to the lower indices, in
// order; the gates are 1/k after renormalisation; a uniform router's aux loss is coef whatever the
// counts (sum_e f_e / E * E = 1).
TEST(MoeRouting, TiesGoToTheLowerExpertIndex) {
  const int64_t N = 3, E = 4, k = 2;
  Vec logits(N * E, 0.5), probs(N * E), gate(N * k);
  std::vector<int32_t> expert(N * k), counts(E), order(N * k), slot(N * k);
  cpu::moe_route_fwd<double>(logits.data(), probs.data(), expert.data(), gate.data(), N, E, k, true);
  for (int64_t n = 0; n < N; ++n) {
    EXPECT_EQ(expert[n * k], 0);
    EXPECT_EQ(expert[n * k + 1], 1);
    EXPECT_DOUBLE_EQ(gate[n * k], 0.5);
    EXPECT_DOUBLE_EQ(probs[n * E + 3], 0.25);
  }
  cpu::moe_group(expert.data(), N, k, E, counts.data(), order.data(), slot.data());
  EXPECT_EQ(counts, (std::vector<int32_t>{3, 3, 0, 0}));
  // aux = coef E sum_e (c_e / (N k)) (1/E) = coef * (3/6 + 3/6) = coef.
  Vec stats(2 * E);
  cpu::moe_route_stats<double>(probs.data(), counts.data(), N, E, stats.data());
  EXPECT_NEAR(cpu::moe_aux_loss<double>(stats.data(), E, k, 0.1), 0.1, 1e-15);
  // Grouped order: expert 0's assignments (a = 0, 2, 4), then expert 1's (1, 3, 5); slot inverts it.
  EXPECT_EQ(order, (std::vector<int32_t>{0, 2, 4, 1, 3, 5}));
  for (int64_t p = 0; p < N * k; ++p) EXPECT_EQ(slot[order[p]], p);
}

// One expert takes every token (a router that prefers expert 2 by far), another none: the grouped
// GEMMs skip the empty experts, whose weight gradients stay exactly zero, and the result still
// equals the dense definition (ForwardMatchesTokenByTokenDefinition's oracle, reused via k = 1
// and gate 1: y = W2_2 (silu(W1_2 x) * W3_2 x)).
TEST(MoeRouting, OneExpertTakesEveryTokenOthersNone) {
  MoeCase c = random_case(50, 5, 4, 3, 3, 1, true);
  std::fill(c.wr.begin(), c.wr.end(), 0.0);
  for (int64_t n = 0; n < c.N; ++n) c.x[n * c.C] = std::abs(c.x[n * c.C]) + 1.0;  // feature 0 > 0 for every token
  c.wr[2 * c.C + 0] = 50.0;                                                         // expert 2's logit = 50 x0
  Vec y, dx, dwr, dwgu, dwdown;
  std::vector<int32_t> counts;
  c.run(&y, &dx, &dwr, &dwgu, &dwdown, &counts);
  EXPECT_EQ(counts, (std::vector<int32_t>{0, 0, 5}));
  const int64_t C = c.C, F = c.F;
  for (int64_t e : {0, 1}) {
    for (int64_t i = 0; i < 2 * F * C; ++i) ASSERT_EQ(dwgu[e * 2 * F * C + i], 0.0) << "expert " << e;
    for (int64_t i = 0; i < C * F; ++i) ASSERT_EQ(dwdown[e * C * F + i], 0.0) << "expert " << e;
  }
  Vec want(c.N * C, 0.0);
  for (int64_t n = 0; n < c.N; ++n)
    for (int64_t o = 0; o < C; ++o)
      for (int64_t f = 0; f < F; ++f) {
        double a = 0, u = 0;
        for (int64_t i = 0; i < C; ++i) {
          a += c.wgu[(2 * 2 * F + f) * C + i] * c.x[n * C + i];
          u += c.wgu[(2 * 2 * F + F + f) * C + i] * c.x[n * C + i];
        }
        want[n * C + o] += c.wdown[(2 * C + o) * F + f] * silu(a) * u;
      }
  expect_close("y", y, want, 1e-13);
}

// Float kernels against the double ones on the same inputs (same routing): fp32 rounding only.
TEST(Moe, FloatMatchesDouble) {
  MoeCase c = random_case(60, 16, 8, 6, 4, 2, true);
  Vec y;
  c.run(&y);
  const int64_t N = c.N, C = c.C, F = c.F, E = c.E, k = c.k, P = N * k;
  auto f = [](const Vec& v) { return std::vector<float>(v.begin(), v.end()); };
  std::vector<float> x = f(c.x), wr = f(c.wr), wgu = f(c.wgu), wdown = f(c.wdown);
  std::vector<float> logits(N * E), probs(N * E), gate(N * k), xs(P * C), fc(P * 2 * F), act(P * F), eo(P * C), yf(N * C);
  std::vector<int32_t> expert(N * k), counts(E), order(P), slot(P);
  cpu::linear_fwd<float>(x.data(), wr.data(), nullptr, logits.data(), N, C, E);
  cpu::moe_route_fwd<float>(logits.data(), probs.data(), expert.data(), gate.data(), N, E, k, true);
  cpu::moe_group(expert.data(), N, k, E, counts.data(), order.data(), slot.data());
  cpu::moe_dispatch<float>(x.data(), order.data(), xs.data(), P, k, C);
  cpu::expert_linear_fwd<float>(xs.data(), wgu.data(), counts.data(), fc.data(), E, C, 2 * F);
  cpu::swiglu_fwd<float>(fc.data(), act.data(), P, F);
  cpu::expert_linear_fwd<float>(act.data(), wdown.data(), counts.data(), eo.data(), E, F, C);
  cpu::moe_combine<float>(eo.data(), slot.data(), gate.data(), yf.data(), N, k, C);
  expect_close("y float", yf, y, 1e-5);  // ~K u with K = 2F + C = 20 terms compounded over 3 GEMMs
}

}  // namespace
}  // namespace dhelix::test
