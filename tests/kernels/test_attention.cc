// Tiled causal GQA attention. Oracles: a naive O(T^2) softmax attention in double (forward and
// lse), central finite differences in double (backward, across several 64-wide tiles and with
// q/k/v packed in one strided buffer), the double kernel for float, and the one-thread run for
// the multi-threaded one.
#include <gtest/gtest.h>

#include "Oracle.h"
#include "kernels/cpu/Kernels.h"

namespace dhelix::test {
namespace {

using cpu::AttnDims;

struct Naive {
  Vec o, lse;
};

// Definition: o[b,t,h] = sum_{s<=t} softmax_s(scale q[b,t,h].k[b,s,g]) v[b,s,g], g = h / (H / Hkv).
Naive naive_attention(const Vec& q, const Vec& k, const Vec& v, const AttnDims& d, double scale) {
  Naive out{Vec(d.B * d.T * d.o_stride, 0.0), Vec(d.B * d.H * d.T)};
  for (int64_t b = 0; b < d.B; ++b)
    for (int64_t h = 0; h < d.H; ++h) {
      const int64_t g = h / (d.H / d.Hkv);
      for (int64_t t = 0; t < d.T; ++t) {
        Vec s(t + 1);
        double m = -1e300;
        for (int64_t j = 0; j <= t; ++j) {
          double acc = 0;
          for (int64_t c = 0; c < d.D; ++c)
            acc += q[(b * d.T + t) * d.q_stride + h * d.D + c] * k[(b * d.T + j) * d.kv_stride + g * d.D + c];
          s[j] = scale * acc;
          m = std::max(m, s[j]);
        }
        double l = 0;
        for (auto& x : s) l += (x = std::exp(x - m));
        for (int64_t c = 0; c < d.D; ++c) {
          double acc = 0;
          for (int64_t j = 0; j <= t; ++j) acc += s[j] * v[(b * d.T + j) * d.kv_stride + g * d.D + c];
          out.o[(b * d.T + t) * d.o_stride + h * d.D + c] = acc / l;
        }
        out.lse[(b * d.H + h) * d.T + t] = m + std::log(l);
      }
    }
  return out;
}

AttnDims dims(int64_t B, int64_t T, int64_t H, int64_t Hkv, int64_t D) {
  return AttnDims{B, T, H, Hkv, D, H * D, Hkv * D, H * D};
}

// Oracle: naive attention in double. GQA H=4, Hkv=2; T not a multiple of the 64-wide tile
// (and T = 1, 64, 65); o has a padded row stride. Tolerance 1e-13 normwise: same sums in another
// order (online softmax rescaling adds a few roundings).
TEST(Attention, ForwardMatchesNaiveGqa) {
  for (int64_t T : {1, 64, 65, 131}) {
    std::mt19937 rng(40 + T);
    AttnDims d = dims(2, T, 4, 2, 16);
    d.o_stride = d.H * d.D + 5;
    const double scale = 1.0 / std::sqrt(double(d.D));
    Vec q = randn(d.B * T * d.q_stride, rng), k = randn(d.B * T * d.kv_stride, rng),
        v = randn(d.B * T * d.kv_stride, rng);
    Naive want = naive_attention(q, k, v, d, scale);
    Vec o(d.B * T * d.o_stride, 0.0), lse(d.B * d.H * T);
    cpu::attention_fwd<double>(q.data(), k.data(), v.data(), o.data(), lse.data(), d, scale);
    SCOPED_TRACE("T=" + std::to_string(T));
    expect_close("o", o, want.o, 1e-13);
    expect_close("lse", lse, want.lse, 1e-13);
  }
}

// L = sum(o * r) as a function of the packed buffer(s); used by the finite-difference tests.
double attn_loss(const double* q, const double* k, const double* v, const AttnDims& d, double scale, const Vec& r) {
  Vec o(d.B * d.T * d.o_stride, 0.0), lse(d.B * d.H * d.T);
  cpu::attention_fwd<double>(q, k, v, o.data(), lse.data(), d, scale);
  return dot(o, r);
}

// Oracle: central finite differences (tolerance in Oracle.h). T = 130 spans three query and key
// tiles (64, 64, 2), so the off-diagonal, diagonal and ragged tile paths are all differentiated.
TEST(Attention, BackwardMatchesFiniteDifferencesAcrossTiles) {
  std::mt19937 rng(50);
  const AttnDims d = dims(1, 130, 2, 1, 4);
  const double scale = 0.7;
  Vec q = randn(d.B * d.T * d.q_stride, rng), k = randn(d.B * d.T * d.kv_stride, rng),
      v = randn(d.B * d.T * d.kv_stride, rng), r = randn(d.B * d.T * d.o_stride, rng);
  Vec o(r.size()), lse(d.B * d.H * d.T);
  cpu::attention_fwd<double>(q.data(), k.data(), v.data(), o.data(), lse.data(), d, scale);
  Vec dq(q.size(), 9.0), dk(k.size(), 9.0), dv(v.size(), 9.0);  // written, not accumulated
  cpu::attention_bwd<double>(q.data(), k.data(), v.data(), o.data(), lse.data(), r.data(), dq.data(), dk.data(),
                             dv.data(), d, scale);
  auto loss = [&] { return attn_loss(q.data(), k.data(), v.data(), d, scale, r); };
  const double L = loss();
  expect_grad_near("dq", dq, numeric_grad(q, loss), L);
  expect_grad_near("dk", dk, numeric_grad(k, loss), L);
  expect_grad_near("dv", dv, numeric_grad(v, loss), L);
}

// Oracle: central finite differences. q, k, v packed in one [B, T, (H + 2 Hkv) D] buffer (as a
// fused QKV projection writes them) with GQA H=4, Hkv=2; the gradients land in a packed buffer of
// the same layout, so this also checks that each part writes only its own columns.
TEST(Attention, BackwardMatchesFiniteDifferencesPackedQkvGqa) {
  std::mt19937 rng(51);
  const int64_t B = 2, T = 7, H = 4, Hkv = 2, D = 8, W = (H + 2 * Hkv) * D;
  const AttnDims d{B, T, H, Hkv, D, W, W, H * D};
  const double scale = 1.0 / std::sqrt(double(D));
  Vec qkv = randn(B * T * W, rng), r = randn(B * T * H * D, rng);
  const int64_t ko = H * D, vo = (H + Hkv) * D;  // column offsets of k and v
  Vec o(r.size()), lse(B * H * T), dqkv(qkv.size());
  cpu::attention_fwd<double>(qkv.data(), qkv.data() + ko, qkv.data() + vo, o.data(), lse.data(), d, scale);
  cpu::attention_bwd<double>(qkv.data(), qkv.data() + ko, qkv.data() + vo, o.data(), lse.data(), r.data(), dqkv.data(),
                             dqkv.data() + ko, dqkv.data() + vo, d, scale);
  auto loss = [&] { return attn_loss(qkv.data(), qkv.data() + ko, qkv.data() + vo, d, scale, r); };
  expect_grad_near("dqkv", dqkv, numeric_grad(qkv, loss), loss());
}

struct FwdBwd {
  std::vector<float> of, lsef, dqf, dkf, dvf;
  Vec o, lse, dq, dk, dv;
};

// Oracle: the double kernel. Float tolerance 2e-5 normwise: scores are D = 64 term dot products
// (fp32 rounding ~64 * 6e-8 = 4e-6 relative), softmax uses the polynomial exp (2e-7), and the
// backward sums T = 200 terms per key.
TEST(Attention, FloatAgreesWithDouble) {
  std::mt19937 rng(52);
  const AttnDims d = dims(2, 200, 4, 2, 64);
  const double scale = 0.125;
  Vec q = randn(d.B * d.T * d.q_stride, rng), k = randn(d.B * d.T * d.kv_stride, rng),
      v = randn(d.B * d.T * d.kv_stride, rng), dout = randn(d.B * d.T * d.o_stride, rng);
  FwdBwd x;
  x.o.resize(dout.size()), x.lse.resize(d.B * d.H * d.T), x.dq.resize(q.size()), x.dk.resize(k.size()),
      x.dv.resize(v.size());
  cpu::attention_fwd<double>(q.data(), k.data(), v.data(), x.o.data(), x.lse.data(), d, scale);
  cpu::attention_bwd<double>(q.data(), k.data(), v.data(), x.o.data(), x.lse.data(), dout.data(), x.dq.data(),
                             x.dk.data(), x.dv.data(), d, scale);
  auto qf = cast<float>(q), kf = cast<float>(k), vf = cast<float>(v), doutf = cast<float>(dout);
  x.of.resize(dout.size()), x.lsef.resize(x.lse.size()), x.dqf.resize(q.size()), x.dkf.resize(k.size()),
      x.dvf.resize(v.size());
  cpu::attention_fwd<float>(qf.data(), kf.data(), vf.data(), x.of.data(), x.lsef.data(), d, 0.125f);
  cpu::attention_bwd<float>(qf.data(), kf.data(), vf.data(), x.of.data(), x.lsef.data(), doutf.data(), x.dqf.data(),
                            x.dkf.data(), x.dvf.data(), d, 0.125f);
  expect_close("o", x.of, x.o, 2e-5);
  expect_close("lse", x.lsef, x.lse, 2e-5);
  expect_close("dq", x.dqf, x.dq, 2e-5);
  expect_close("dk", x.dkf, x.dk, 2e-5);
  expect_close("dv", x.dvf, x.dv, 2e-5);
}

// Oracle: the single-threaded run. Every (b, h, query tile) and (b, kv head) item is computed the
// same way whichever thread runs it, so two threads must agree bitwise.
TEST(Attention, TwoThreadsEqualOneThreadBitwise) {
  std::mt19937 rng(53);
  const AttnDims d = dims(2, 150, 4, 2, 32);
  auto q = cast<float>(randn(d.B * d.T * d.q_stride, rng)), k = cast<float>(randn(d.B * d.T * d.kv_stride, rng)),
       v = cast<float>(randn(d.B * d.T * d.kv_stride, rng)), dout = cast<float>(randn(d.B * d.T * d.o_stride, rng));
  auto run = [&](int threads) {
    cpu::set_num_threads(threads);
    std::vector<float> o(dout.size()), lse(d.B * d.H * d.T), dq(q.size()), dk(k.size()), dv(v.size());
    cpu::attention_fwd<float>(q.data(), k.data(), v.data(), o.data(), lse.data(), d, 0.2f);
    cpu::attention_bwd<float>(q.data(), k.data(), v.data(), o.data(), lse.data(), dout.data(), dq.data(), dk.data(),
                              dv.data(), d, 0.2f);
    cpu::set_num_threads(1);
    return std::vector<std::vector<float>>{o, lse, dq, dk, dv};
  };
  auto one = run(1), two = run(2);
  for (size_t i = 0; i < one.size(); ++i) EXPECT_EQ(one[i], two[i]) << "output " << i;
}

}  // namespace
}  // namespace dhelix::test
