// Causal ring attention (context parallelism) at kernel level: the ring steps of every rank, run in
// one process with each rank's keys/values handed around by hand, against the causal attention of
// the whole sequence. Oracles: attention_fwd / attention_bwd on the full sequence in double (which
// test_attention.cc checks against a naive softmax and finite differences), rows matched through
// cp_position; the block kernels against a naive rectangular softmax.
#include <gtest/gtest.h>

#include <numeric>

#include "Oracle.h"
#include "kernels/cpu/Kernels.h"

namespace dhelix::test {
namespace {

// The chunking itself: every global position is held by exactly one (rank, local row), chunk r and
// 2cp-1-r in order; and the block of every step but the first has Tl * c entries on every rank.
TEST(RingAttention, ChunkingCoversTheSequenceOnceAndBalancesTheSteps) {
  for (int cp : {1, 2, 3, 4, 5}) {
    const int64_t c = 3, Tl = 2 * c, T = Tl * cp;
    std::vector<int> seen(static_cast<size_t>(T), 0);
    for (int r = 0; r < cp; ++r) {
      for (int64_t t = 0; t < Tl; ++t) ++seen[static_cast<size_t>(cpu::cp_position(cp, r, Tl, t))];
      EXPECT_EQ(cpu::cp_position(cp, r, Tl, 0), r * c);
      EXPECT_EQ(cpu::cp_position(cp, r, Tl, c), (2 * cp - 1 - r) * c);
      for (int i = 1; i < cp; ++i) {
        const cpu::RingStep st = cpu::cp_ring_step(cp, r, i, Tl);
        EXPECT_EQ(st.Tq * st.Tk, Tl * c) << "cp " << cp << " rank " << r << " step " << i;
        EXPECT_FALSE(st.causal);
      }
    }
    for (int64_t p = 0; p < T; ++p) EXPECT_EQ(seen[static_cast<size_t>(p)], 1) << "cp " << cp << " position " << p;
  }
}

struct Shape {
  int64_t B, H, Hkv, D;
};

// Each rank's ring attention (forward steps 0..cp-1, then backward steps with the dK/dV of each
// rank's keys summed over the ranks that saw them) vs the full sequence's causal attention.
// Tolerance 1e-12 normwise in double: the same sums regrouped over blocks and merged by the
// online-softmax rule (a few roundings of 1.1e-16 per term over <= 2 * 70 * 4 terms).
void check_ring(int cp, int64_t c, const Shape& s, uint32_t seed) {
  std::mt19937 rng(seed);
  const int64_t Tl = 2 * c, T = Tl * cp, B = s.B, H = s.H, Hkv = s.Hkv, D = s.D;
  const int64_t W = (H + 2 * Hkv) * D, ow = H * D, kvw = 2 * Hkv * D;
  const double scale = 1.0 / std::sqrt(double(D));
  // The full sequence, q, k, v packed per row as a fused QKV projection writes them.
  Vec qkv = randn(B * T * W, rng), dout = randn(B * T * ow, rng);
  Vec o(B * T * ow), lse(B * H * T), dqkv(qkv.size());
  const cpu::AttnDims full{B, T, H, Hkv, D, W, W, ow};
  cpu::attention_fwd<double>(qkv.data(), qkv.data() + ow, qkv.data() + ow + Hkv * D, o.data(), lse.data(), full, scale);
  cpu::attention_bwd<double>(qkv.data(), qkv.data() + ow, qkv.data() + ow + Hkv * D, o.data(), lse.data(), dout.data(),
                             dqkv.data(), dqkv.data() + ow, dqkv.data() + ow + Hkv * D, full, scale);

  // Each rank's local rows: q (packed as qkv), its keys/values packed [rows, 2 Hkv D], dout.
  auto grow = [&](int r, int64_t b, int64_t t) { return b * T + cpu::cp_position(cp, r, Tl, t); };
  std::vector<Vec> q_l(cp), kv_l(cp), do_l(cp), o_l(cp), lse_l(cp);
  for (int r = 0; r < cp; ++r) {
    q_l[r].resize(B * Tl * W), kv_l[r].resize(B * Tl * kvw), do_l[r].resize(B * Tl * ow);
    for (int64_t b = 0; b < B; ++b)
      for (int64_t t = 0; t < Tl; ++t) {
        const int64_t g = grow(r, b, t), l = b * Tl + t;
        std::copy_n(qkv.data() + g * W, W, q_l[r].data() + l * W);
        std::copy_n(qkv.data() + g * W + ow, kvw, kv_l[r].data() + l * kvw);
        std::copy_n(dout.data() + g * ow, ow, do_l[r].data() + l * ow);
      }
  }
  cpu::RingDims rd{cp, 0, B, Tl, H, Hkv, D, W};
  for (int r = 0; r < cp; ++r) {
    rd.rank = r;
    o_l[r].assign(B * Tl * ow, 0.0), lse_l[r].assign(B * H * Tl, 0.0);
    Vec ot(o_l[r].size()), lt(lse_l[r].size());
    for (int i = 0; i < cp; ++i) {
      const int src = ((r - i) % cp + cp) % cp;
      cpu::ring_attention_fwd_step<double>(rd, i, q_l[r].data(), kv_l[src].data(), o_l[r].data(), lse_l[r].data(),
                                           ot.data(), lt.data(), scale);
    }
  }
  std::vector<Vec> dq_l(cp, Vec(B * Tl * W, 0.0)), dkv_l(cp, Vec(B * Tl * kvw, 0.0));
  for (int r = 0; r < cp; ++r) {
    rd.rank = r;
    for (int i = 0; i < cp; ++i) {
      const int src = ((r - i) % cp + cp) % cp;
      cpu::ring_attention_bwd_step<double>(rd, i, q_l[r].data(), kv_l[src].data(), o_l[r].data(), lse_l[r].data(),
                                           do_l[r].data(), dq_l[r].data(), dkv_l[src].data(), scale);
    }
  }
  // Gather back to global rows and compare.
  Vec o_r(o.size()), lse_r(lse.size()), dq_r(dqkv.size(), 0.0);
  for (int r = 0; r < cp; ++r)
    for (int64_t b = 0; b < B; ++b)
      for (int64_t t = 0; t < Tl; ++t) {
        const int64_t g = grow(r, b, t), l = b * Tl + t, pos = g - b * T;
        std::copy_n(o_l[r].data() + l * ow, ow, o_r.data() + g * ow);
        for (int64_t h = 0; h < H; ++h) lse_r[(b * H + h) * T + pos] = lse_l[r][(b * H + h) * Tl + t];
        std::copy_n(dq_l[r].data() + l * W, ow, dq_r.data() + g * W);
        std::copy_n(dkv_l[r].data() + l * kvw, kvw, dq_r.data() + g * W + ow);
      }
  SCOPED_TRACE(testing::Message() << "cp " << cp << " chunk " << c << " B " << B << " H " << H << " Hkv " << Hkv);
  expect_close("o", o_r, o, 1e-12);
  expect_close("lse", lse_r, lse, 1e-12);
  expect_close("dqkv", dq_r, dqkv, 1e-12);
}

TEST(RingAttention, EveryRankEqualsFullCausalAttention) {
  for (int cp : {1, 2, 3, 4}) check_ring(cp, 5, Shape{2, 4, 2, 8}, 100 + cp);
}

// Chunks longer than the 64-wide tile (the block kernels' partial tiles and several key tiles),
// grouped-query heads H / Hkv = 3.
TEST(RingAttention, EveryRankEqualsFullCausalAttentionAcrossTiles) {
  check_ring(2, 70, Shape{1, 3, 1, 4}, 200);
  check_ring(3, 33, Shape{2, 6, 2, 4}, 201);
}

// A full (unmasked) rectangular block against the naive definition, forward: o and lse over all
// Tk keys; and the merge of two key halves equal to the block over all keys (the online-softmax
// identity the ring relies on). Tolerance 1e-13 as test_attention.cc's forward.
TEST(RingAttention, FullBlockAndMergeMatchNaiveSoftmax) {
  std::mt19937 rng(300);
  const int64_t B = 2, Tq = 5, Tk = 70, H = 2, Hkv = 1, D = 4;
  const double scale = 0.6;
  Vec q = randn(B * Tq * H * D, rng), k = randn(B * Tk * Hkv * D, rng), v = randn(B * Tk * Hkv * D, rng);
  const cpu::AttnBlock all{B, Tq, Tk, H, Hkv, D, H * D, Hkv * D, H * D, Tq * H * D, Tk * Hkv * D, Tq * H * D, Tq, false};
  Vec o(B * Tq * H * D), lse(B * H * Tq);
  cpu::attention_block_fwd<double>(q.data(), k.data(), v.data(), o.data(), lse.data(), all, scale);
  Vec o_n(o.size()), lse_n(lse.size());
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t t = 0; t < Tq; ++t) {
        Vec sc(Tk);
        double m = -1e300, l = 0;
        for (int64_t j = 0; j < Tk; ++j) {
          double a = 0;
          for (int64_t x = 0; x < D; ++x) a += q[(b * Tq + t) * H * D + h * D + x] * k[(b * Tk + j) * D + x];
          m = std::max(m, sc[j] = scale * a);
        }
        for (auto& e : sc) l += (e = std::exp(e - m));
        for (int64_t x = 0; x < D; ++x) {
          double a = 0;
          for (int64_t j = 0; j < Tk; ++j) a += sc[j] * v[(b * Tk + j) * D + x];
          o_n[(b * Tq + t) * H * D + h * D + x] = a / l;
        }
        lse_n[(b * H + h) * Tq + t] = m + std::log(l);
      }
  expect_close("o", o, o_n, 1e-13);
  expect_close("lse", lse, lse_n, 1e-13);
  // Keys [0, 40) then [40, 70), merged.
  cpu::AttnBlock first = all, second = all;
  first.Tk = 40, second.Tk = Tk - 40;
  Vec o1(o.size()), l1(lse.size()), o2(o.size()), l2(lse.size());
  cpu::attention_block_fwd<double>(q.data(), k.data(), v.data(), o1.data(), l1.data(), first, scale);
  cpu::attention_block_fwd<double>(q.data(), k.data() + 40 * D, v.data() + 40 * D, o2.data(), l2.data(), second, scale);
  cpu::attention_merge<double>(o1.data(), l1.data(), o2.data(), l2.data(), B, Tq, H, D, H * D, Tq * H * D, Tq, Tq);
  expect_close("merged o", o1, o_n, 1e-13);
  expect_close("merged lse", l1, lse_n, 1e-13);
}

// Bad geometry is refused with the values named.
TEST(RingAttention, BadGeometryIsRefused) {
  EXPECT_THROW(cpu::cp_ring_step(2, 2, 0, 8), std::exception);  // rank outside cp
  EXPECT_THROW(cpu::cp_ring_step(2, 0, 2, 8), std::exception);  // step outside cp
  EXPECT_THROW(cpu::cp_position(2, 0, 7, 0), std::exception);   // odd local rows: no two chunks
}

}  // namespace
}  // namespace dhelix::test
