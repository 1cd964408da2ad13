// The fused cross-entropy, AdamW and the sum of squares on the GPU (kernels/cuda/Ops.h) against
// cpu::cross_entropy_fwd_bwd, cpu::adamw_step and cpu::sum_squares (<float>) on the same inputs
// (bf16-rounded logits; fp32 optimizer state). Outputs poisoned before each call.
//
// Bounds. Cross-entropy: S = sum_v e^(x_v - max) over V <= 50257 terms in another order than the
// CPU's sequential sum (~sqrt(V) 2^-24 ~ 1.3e-5 relative at most for terms of one size), plus the
// CPU's polynomial exp (2e-7): losses within 2e-5 relative; dlogits are rounded once to bf16, so
// u = 2^-8 plus that. AdamW: the same fp32 formula, some operations fused (FMA) on the GPU: a few
// 2^-24 relative per element, 1e-6 in the norm. sum_squares: both sum the exact products x^2 in
// double, in two orders: each within (n - 1) 2^-53 relative (all terms positive), 2.4e-10 at
// n = 2^21 + 7, so at most 5e-10 apart.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "CudaTest.h"
#include "kernels/cpu/Kernels.h"
#include "kernels/cuda/Ops.h"

namespace dhelix::cuda::test {
namespace {

constexpr double kLossBound = 2e-5;
constexpr double kDlogitsBound = kBf16U + 2e-5;

template <typename T> bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

TEST(CudaOpsLoss, CrossEntropyMatchesCpuWrittenAliasedAndLossOnly) {
  DHX_REQUIRE_GPU();
  struct Shape { int64_t N, V; };
  uint64_t seed = 1;
  for (const Shape d : {Shape{1, 1}, Shape{5, 7}, Shape{64, 32}, Shape{17, 1000}, Shape{3, 50257}, Shape{4, 4096}}) {
    const auto logits = round_bf16(randn(d.N * d.V, seed++, 2.0f));
    auto targets = randint(d.N, seed++, static_cast<int32_t>(d.V));
    if (d.N > 1) targets[1] = -1;  // ignored: loss 0, gradient row 0
    const float dloss = 1.0f / static_cast<float>(d.N);
    const std::vector<float> dloss_rows(d.N, dloss);  // the CPU takes one per row
    std::vector<float> losses(d.N), dlogits(d.N * d.V);
    cpu::cross_entropy_fwd_bwd<float>(logits.data(), targets.data(), losses.data(), dlogits.data(), dloss_rows.data(),
                                      d.N, d.V);
    DevBuf<bf16> glogits(to_bf16(logits)), gd(d.N * d.V);
    DevBuf<int32_t> gtargets(targets);
    DevBuf<float> glosses(d.N);
    const std::string at = "N=" + std::to_string(d.N) + " V=" + std::to_string(d.V);
    // 1. dlogits in its own buffer.
    gd.poison(), glosses.poison();
    cross_entropy_fwd_bwd(glogits.get(), gtargets.get(), glosses.get(), gd.get(), dloss, d.N, d.V, nullptr);
    const auto first_losses = glosses.download();
    EXPECT_LE(rel_err(first_losses, losses), kLossBound) << "losses, " << at;
    EXPECT_LE(rel_err(to_f32(gd.download()), dlogits), kDlogitsBound) << "dlogits, " << at;
    // 2. Losses only (dlogits null): the same losses, bitwise.
    glosses.poison();
    cross_entropy_fwd_bwd(glogits.get(), gtargets.get(), glosses.get(), nullptr, dloss, d.N, d.V, nullptr);
    EXPECT_TRUE(same_bits(glosses.download(), first_losses)) << "loss only, " << at;
    // 3. dlogits aliasing logits: the same bits as the separate buffer.
    const auto separate = gd.download();
    glosses.poison();
    cross_entropy_fwd_bwd(glogits.get(), gtargets.get(), glosses.get(), glogits.get(), dloss, d.N, d.V, nullptr);
    EXPECT_TRUE(same_bits(glogits.download(), separate)) << "aliased dlogits, " << at;
    EXPECT_TRUE(same_bits(glosses.download(), first_losses)) << "aliased losses, " << at;
  }
}

// The strided form (a padded LM head's logits [N, ld], ld >= V): every kernel -- rows in shared
// memory (the default) and in registers (cross_entropy_rows_in_registers) for ld a multiple of 8
// from 2048 to 57344 columns (GPT-2's 50304, the widest 57344, a target in the last vector), and the
// general one (ld = 104, both entry points). Oracle: the CPU twin on the V vocabulary columns (same
// bounds as above); the padding columns' gradient exactly 0, whatever they held (poison).
TEST(CudaOpsLoss, CrossEntropyStridedMatchesCpuOnTheVocabularyPaddingZero) {
  DHX_REQUIRE_GPU();
  struct Shape { int64_t N, V, ld; };
  uint64_t seed = 40;
  for (const Shape d : {Shape{3, 50257, 50304}, Shape{5, 8000, 8064}, Shape{2, 57344, 57344}, Shape{4, 2048, 2048},
                        Shape{4, 100, 104}}) {
    const auto logits = round_bf16(randn(d.N * d.V, seed++, 2.0f));
    auto targets = randint(d.N, seed++, static_cast<int32_t>(d.V));
    targets[0] = static_cast<int32_t>(d.V - 1);
    if (d.N > 2) targets[2] = -1;
    const float dloss = 1.0f / static_cast<float>(d.N);
    const std::vector<float> dloss_rows(d.N, dloss);
    std::vector<float> losses(d.N), dlogits(d.N * d.V);
    cpu::cross_entropy_fwd_bwd<float>(logits.data(), targets.data(), losses.data(), dlogits.data(), dloss_rows.data(),
                                      d.N, d.V);
    std::vector<float> padded(d.N * d.ld, 3.0f);  // padding columns: large logits that must not count
    for (int64_t n = 0; n < d.N; ++n)
      std::memcpy(&padded[n * d.ld], &logits[n * d.V], d.V * sizeof(float));
    DevBuf<bf16> glogits(to_bf16(padded)), gd(d.N * d.ld);
    DevBuf<int32_t> gtargets(targets);
    DevBuf<float> glosses(d.N);
    for (bool registers : {false, true}) {
      gd.poison(), glosses.poison();
      (registers ? cross_entropy_rows_in_registers : cross_entropy_fwd_bwd_strided)(
          glogits.get(), gtargets.get(), glosses.get(), gd.get(), dloss, d.N, d.V, d.ld, nullptr);
      const std::string at = "N=" + std::to_string(d.N) + " V=" + std::to_string(d.V) + " ld=" + std::to_string(d.ld) +
                             (registers ? " (rows in registers)" : "");
      EXPECT_LE(rel_err(glosses.download(), losses), kLossBound) << "losses, " << at;
      const auto got = to_f32(gd.download());
      std::vector<float> vocab(d.N * d.V);
      bool pad_zero = true;
      for (int64_t n = 0; n < d.N; ++n) {
        std::memcpy(&vocab[n * d.V], &got[n * d.ld], d.V * sizeof(float));
        for (int64_t v = d.V; v < d.ld; ++v) pad_zero = pad_zero && got[n * d.ld + v] == 0.0f;
      }
      EXPECT_LE(rel_err(vocab, dlogits), kDlogitsBound) << "dlogits, " << at;
      EXPECT_TRUE(pad_zero) << "padding columns' gradient, " << at;
    }
  }
}

// The vocabulary-parallel cross-entropy (xent_row_max / _stats / _finish), the head's rows split
// over k ranks as Megatron splits them (padded_vocab: a multiple of 128 k; the last shard ragged,
// or empty), each shard's logits poisoned past its valid columns, the group's reductions done here
// as the tp all-reduces do them (max; sums in rank order). Oracle: the CPU twin of the whole row,
// cpu::cross_entropy_fwd_bwd, on the same bf16-rounded logits (bounds as above: the sums run in
// another order); every shard's padding columns' gradient exactly 0. Row 1's target is -1 (ignored:
// the oracle gives it loss 0 and a zero gradient row, which the shards must too, exactly).
TEST(CudaOpsLoss, VocabParallelCrossEntropyMatchesTheWholeRow) {
  DHX_REQUIRE_GPU();
  struct Shape { int64_t N, V; int k; };
  uint64_t seed = 70;
  for (const Shape d : {Shape{4, 50257, 4}, Shape{3, 8000, 2}, Shape{5, 100, 2}}) {
    const int64_t mult = 128 * d.k, Vp = (d.V + mult - 1) / mult * mult, Vl = Vp / d.k;
    const auto logits = round_bf16(randn(d.N * d.V, seed++, 2.0f));
    auto targets = randint(d.N, seed++, static_cast<int32_t>(d.V));
    targets[0] = static_cast<int32_t>(d.V - 1);  // in the last (ragged) shard
    targets[1] = -1;                             // ignored
    const float dloss = 1.0f / static_cast<float>(d.N);
    const std::vector<float> dloss_rows(d.N, dloss);
    std::vector<float> losses(d.N), dlogits(d.N * d.V);
    cpu::cross_entropy_fwd_bwd<float>(logits.data(), targets.data(), losses.data(), dlogits.data(), dloss_rows.data(),
                                      d.N, d.V);
    std::vector<DevBuf<bf16>> shard(d.k);
    std::vector<int64_t> valid(d.k);
    DevBuf<int32_t> gtargets(targets);
    std::vector<float> m(d.N, -INFINITY), stats(2 * d.N, 0.0f);
    for (int r = 0; r < d.k; ++r) {
      const int64_t v0 = r * Vl;
      valid[r] = std::clamp<int64_t>(d.V - v0, 0, Vl);
      std::vector<float> rows(d.N * Vl, 7.0f);  // padding: large logits that must not count
      for (int64_t n = 0; n < d.N; ++n)
        for (int64_t j = 0; j < valid[r]; ++j) rows[n * Vl + j] = logits[n * d.V + v0 + j];
      shard[r] = DevBuf<bf16>(to_bf16(rows));
      DevBuf<float> gm(d.N);
      gm.poison();
      xent_row_max(shard[r].get(), gm.get(), d.N, valid[r], Vl, nullptr);
      const auto mr = gm.download();
      for (int64_t n = 0; n < d.N; ++n) m[n] = std::max(m[n], mr[n]);
    }
    DevBuf<float> gm(m);
    for (int r = 0; r < d.k; ++r) {
      DevBuf<float> gs(2 * d.N);
      gs.poison();
      xent_row_stats(shard[r].get(), gtargets.get(), gm.get(), gs.get(), d.N, valid[r], Vl, r * Vl, nullptr);
      const auto sr = gs.download();
      for (int64_t i = 0; i < 2 * d.N; ++i) stats[i] += sr[i];
    }
    DevBuf<float> gstats(stats);
    const std::string at = "N=" + std::to_string(d.N) + " V=" + std::to_string(d.V) + " k=" + std::to_string(d.k);
    std::vector<float> got(d.N * d.V);
    bool pad_zero = true;
    for (int r = 0; r < d.k; ++r) {
      DevBuf<float> gl(d.N);
      gl.poison();
      xent_row_finish(shard[r].get(), gtargets.get(), gm.get(), gstats.get(), gl.get(), shard[r].get(), dloss, d.N,
                      valid[r], Vl, r * Vl, d.V, nullptr);  // in place, as the op runs it
      const auto lr = gl.download();
      EXPECT_LE(rel_err(lr, losses), kLossBound) << "losses on rank " << r << ", " << at;
      EXPECT_EQ(lr[1], 0.0f) << "the ignored row's loss on rank " << r << ", " << at;
      const auto g = to_f32(shard[r].download());
      for (int64_t n = 0; n < d.N; ++n) {
        for (int64_t j = 0; j < valid[r]; ++j) got[n * d.V + r * Vl + j] = g[n * Vl + j];
        for (int64_t j = valid[r]; j < Vl; ++j) pad_zero = pad_zero && g[n * Vl + j] == 0.0f;
      }
    }
    EXPECT_LE(rel_err(got, dlogits), kDlogitsBound) << "dlogits, " << at;
    EXPECT_TRUE(pad_zero) << "padding columns' gradient, " << at;
    EXPECT_TRUE(std::all_of(got.begin() + d.V, got.begin() + 2 * d.V, [](float g) { return g == 0.0f; }))
        << "the ignored row's gradient, " << at;
  }
  // A target past the vocabulary: NaN loss and gradient row on every shard (loud), the other rows
  // finite. Two shards of 128 over V = 200; the stats as any (finite) group sums.
  const int64_t N = 3, V = 200, Vl = 128;
  DevBuf<int32_t> gtargets(std::vector<int32_t>{5, static_cast<int32_t>(V), 150});
  DevBuf<float> gm(std::vector<float>(N, 1.0f)), gstats(std::vector<float>{10.f, 0.5f, 10.f, 0.f, 10.f, 0.25f});
  for (int r = 0; r < 2; ++r) {
    const int64_t valid = std::min<int64_t>(Vl, V - r * Vl);
    DevBuf<bf16> shard(to_bf16(randn(N * Vl, 90 + r)));
    DevBuf<float> gl(N);
    xent_row_finish(shard.get(), gtargets.get(), gm.get(), gstats.get(), gl.get(), shard.get(), 1.0f, N, valid, Vl,
                    r * Vl, V, nullptr);
    const auto l = gl.download();
    const auto g = to_f32(shard.download());
    EXPECT_TRUE(std::isfinite(l[0]) && std::isnan(l[1]) && std::isfinite(l[2])) << "rank " << r;
    bool ok = true;
    for (int64_t j = 0; j < valid; ++j) ok = ok && std::isnan(g[Vl + j]) && std::isfinite(g[j]) && std::isfinite(g[2 * Vl + j]);
    for (int64_t j = valid; j < Vl; ++j) ok = ok && g[Vl + j] == 0.0f;  // padding stays 0
    EXPECT_TRUE(ok) << "rank " << r;
  }
}

// A target >= V cannot throw on the device: NaN loss and NaN gradient row (loud), other rows fine.
// Both kernels: V = 10 (general), V = 4096 (rows in shared memory).
TEST(CudaOpsLoss, CrossEntropyTargetOutOfRangeIsNan) {
  DHX_REQUIRE_GPU();
  const int64_t N = 3;
  for (const int64_t V : {int64_t{10}, int64_t{4096}}) {
    DevBuf<bf16> glogits(to_bf16(randn(N * V, 5))), gd(N * V);
    DevBuf<int32_t> gtargets(std::vector<int32_t>{2, static_cast<int32_t>(V), 0});
    DevBuf<float> glosses(N);
    cross_entropy_fwd_bwd(glogits.get(), gtargets.get(), glosses.get(), gd.get(), 1.0f, N, V, nullptr);
    const auto losses = glosses.download();
    const auto d = to_f32(gd.download());
    EXPECT_TRUE(std::isfinite(losses[0]) && std::isnan(losses[1]) && std::isfinite(losses[2])) << "V=" << V;
    bool ok = true;
    for (int64_t v = 0; v < V; ++v) ok = ok && std::isnan(d[V + v]) && std::isfinite(d[v]) && std::isfinite(d[2 * V + v]);
    EXPECT_TRUE(ok) << "V=" << V;
  }
  const int64_t V = 10;
  DevBuf<bf16> glogits(to_bf16(randn(N * V, 5)));
  DevBuf<int32_t> gtargets(std::vector<int32_t>{2, static_cast<int32_t>(V), 0});
  DevBuf<float> glosses(N);
  EXPECT_THROW(cross_entropy_fwd_bwd(glogits.get(), gtargets.get(), glosses.get(), nullptr, 1.0f, N, 0, nullptr),
               InternalError);
}

TEST(CudaOpsOptim, AdamWMatchesCpuWithGradScaleAndBf16Copy) {
  DHX_REQUIRE_GPU();
  const AdamWParams a{1e-2, 0.9, 0.95, 1e-8, 0.1, 7};
  const cpu::AdamWParams ca{a.lr, a.beta1, a.beta2, a.eps, a.weight_decay, a.step};
  const float grad_scale = 0.37f;  // clipping: g is multiplied by this first
  uint64_t seed = 100;
  for (int64_t n : {int64_t{1}, int64_t{1000}, int64_t{100003}}) {
    const auto p0 = randn(n, seed++), g = randn(n, seed++), m0 = randn(n, seed++, 0.1f);
    auto v0 = randn(n, seed++, 0.01f);
    for (float& x : v0) x = std::abs(x);  // a second moment is never negative
    std::vector<float> p = p0, m = m0, v = v0, gs(n);
    for (int64_t i = 0; i < n; ++i) gs[i] = g[i] * grad_scale;  // the kernel's first fp32 product
    cpu::adamw_step<float>(p.data(), gs.data(), m.data(), v.data(), n, ca);
    for (bool with_copy : {true, false}) {
      DevBuf<float> gp(p0), gg(g), gm(m0), gv(v0);
      DevBuf<bf16> gcopy(n);
      gcopy.poison();
      adamw_step(gp.get(), gg.get(), gm.get(), gv.get(), with_copy ? gcopy.get() : nullptr, n, a, grad_scale, nullptr);
      const auto got_p = gp.download();
      EXPECT_LE(rel_err(got_p, p), 1e-6) << "p, n=" << n;
      EXPECT_LE(rel_err(gm.download(), m), 1e-6) << "m, n=" << n;
      EXPECT_LE(rel_err(gv.download(), v), 1e-6) << "v, n=" << n;
      if (with_copy) {
        EXPECT_TRUE(same_bits(gcopy.download(), to_bf16(got_p))) << "bf16 copy of p, n=" << n;
      }
    }
  }
  DevBuf<float> x(4);
  EXPECT_THROW(adamw_step(x.get(), x.get(), x.get(), x.get(), nullptr, 4, AdamWParams{1e-3, 0.9, 0.95, 1e-8, 0, 0},
                          1.0f, nullptr),
               InternalError);  // step is 1-based
}

// The optimizer cuts its launches by runs of parameters (Optimizer::update_gpu: "how the range is cut
// changes no bit"). Oracle: one launch over the whole buffer (16-byte accesses from element 0). The
// same update cut at elements 1 and 38 (each piece with a head of 1-3 single elements before its
// 16-byte units, and a ragged tail), and one with m and v one element off p's and g's alignment
// (16-byte accesses impossible: the single-element kernel), must give the same bits in p, m, v and
// the bf16 copy.
TEST(CudaOpsOptim, AdamWBitsDoNotDependOnHowTheRangeIsCut) {
  DHX_REQUIRE_GPU();
  const AdamWParams a{3e-3, 0.9, 0.95, 1e-8, 0.1, 3};
  const int64_t n = 100003;
  const auto p0 = randn(n, 11), g = randn(n, 12), m0 = randn(n, 13, 0.1f);
  auto v0 = randn(n, 14, 0.01f);
  for (float& x : v0) x = std::abs(x);
  struct Out { std::vector<float> p, m, v; std::vector<bf16> copy; };
  auto run = [&](const std::vector<int64_t>& cuts, int64_t state_shift) {
    std::vector<float> m_in(state_shift, 0.0f), v_in(state_shift, 0.0f);
    m_in.insert(m_in.end(), m0.begin(), m0.end());
    v_in.insert(v_in.end(), v0.begin(), v0.end());
    DevBuf<float> gp(p0), gg(g), gm(m_in), gv(v_in);
    DevBuf<bf16> gcopy(n);
    gcopy.poison();
    for (size_t k = 0; k + 1 < cuts.size(); ++k) {
      const int64_t lo = cuts[k], len = cuts[k + 1] - lo;
      adamw_step(gp.get() + lo, gg.get() + lo, gm.get() + state_shift + lo, gv.get() + state_shift + lo,
                 gcopy.get() + lo, len, a, 0.5f, nullptr);
    }
    Out o{gp.download(), gm.download(), gv.download(), gcopy.download()};
    o.m.erase(o.m.begin(), o.m.begin() + state_shift);
    o.v.erase(o.v.begin(), o.v.begin() + state_shift);
    return o;
  };
  const Out whole = run({0, n}, 0);
  for (const auto& [what, got] : {std::pair<const char*, Out>{"cut at 1 and 38", run({0, 1, 38, n}, 0)},
                                  {"m, v one element off", run({0, n}, 1)}}) {
    EXPECT_TRUE(same_bits(got.p, whole.p)) << "p, " << what;
    EXPECT_TRUE(same_bits(got.m, whole.m)) << "m, " << what;
    EXPECT_TRUE(same_bits(got.v, whole.v)) << "v, " << what;
    EXPECT_TRUE(same_bits(got.copy, whole.copy)) << "bf16 copy, " << what;
  }
}

TEST(CudaOpsOptim, SumSquaresMatchesCpuIsDeterministicAndAccumulates) {
  DHX_REQUIRE_GPU();
  uint64_t seed = 200;
  for (int64_t n : {int64_t{0}, int64_t{1}, int64_t{1000}, (int64_t{1} << 21) + 7}) {
    const auto x = randn(n, seed++);
    const double ref = cpu::sum_squares<float>(x.data(), n);
    DevBuf<float> gx(x);
    DevBuf<double> out(1);
    std::vector<double> first;
    for (int rep = 0; rep < 2; ++rep) {
      out.poison();
      sum_squares(gx.get(), n, out.get(), Accumulate::kNo, nullptr);
      const auto got = out.download();
      EXPECT_LE(std::abs(got[0] - ref), 5e-10 * ref) << "n=" << n << " got " << got[0] << " want " << ref;
      if (rep == 0) {
        first = got;
      } else {
        EXPECT_TRUE(same_bits(got, first)) << "sum_squares twice differs, n=" << n;
      }
    }
    out.upload({5.0});
    sum_squares(gx.get(), n, out.get(), Accumulate::kYes, nullptr);
    EXPECT_EQ(out.download()[0], 5.0 + first[0]) << "accumulated, n=" << n;
  }
  DevBuf<double> out(1);
  EXPECT_THROW(sum_squares(nullptr, -1, out.get(), Accumulate::kNo, nullptr), InternalError);
}

// adamw_step_many (the optimizer's runs, small ones sharing launches) against adamw_step on each run
// alone, bit for bit (oracle: the same per-element formula, so any difference is a run updated
// twice, skipped, with the other run's scalars or past its end). Runs: 300 small ones (more than
// a batch of 256), odd sizes and offsets, decayed and not, with and without the bf16 copy; runs of
// 4097, 12289 and 65535 elements (several chunks of one run in the shared launch); a 65536-element
// run (launched alone) and an empty one; gaps between runs that must stay untouched.
TEST(CudaOpsOptim, AdamWManyRunsEqualsEachRunAlone) {
  DHX_REQUIRE_GPU();
  const AdamWParams a{2e-3, 0.9, 0.95, 1e-8, 0.1, 5};
  AdamWParams plain = a;
  plain.weight_decay = 0.0;
  struct Span { int64_t off, n; bool decay, copy; };
  std::vector<Span> spans;
  int64_t off = 3;
  for (int k = 0; k < 300; ++k) {
    const int64_t n = 1 + (k * 53) % 700;
    spans.push_back({off, n, k % 3 != 0, k % 5 != 0});
    off += n + (k % 4);  // 0-3 untouched elements between runs
  }
  for (int64_t n : {int64_t{4097}, int64_t{12289}, int64_t{65535}}) {  // several 4096-element chunks, shared launch
    spans.push_back({off, n, n != 12289, true});
    off += n + 2;
  }
  spans.push_back({off, 65536, true, true});
  off += 65536 + 1;
  spans.push_back({off, 0, true, true});
  const int64_t total = off + 8;
  const auto p0 = randn(total, 21), g = randn(total, 22), m0 = randn(total, 23, 0.1f);
  auto v0 = randn(total, 24, 0.01f);
  for (float& x : v0) x = std::abs(x);
  DevBuf<float> p1(p0), m1(m0), v1(v0), p2(p0), m2(m0), v2(v0), gg(g);
  DevBuf<bf16> c1(total), c2(total);
  c1.poison(), c2.poison();
  std::vector<AdamWRun> runs;
  for (const Span& sp : spans) {
    runs.push_back({p1.get() + sp.off, gg.get() + sp.off, m1.get() + sp.off, v1.get() + sp.off,
                    sp.copy ? c1.get() + sp.off : nullptr, sp.n, sp.decay});
    adamw_step(p2.get() + sp.off, gg.get() + sp.off, m2.get() + sp.off, v2.get() + sp.off,
               sp.copy ? c2.get() + sp.off : nullptr, sp.n, sp.decay ? a : plain, 0.7f, nullptr);
  }
  adamw_step_many(runs, a, 0.7f, nullptr);
  EXPECT_TRUE(same_bits(p1.download(), p2.download())) << "p";
  EXPECT_TRUE(same_bits(m1.download(), m2.download())) << "m";
  EXPECT_TRUE(same_bits(v1.download(), v2.download())) << "v";
  EXPECT_TRUE(same_bits(c1.download(), c2.download())) << "bf16 copy (poison where no run writes)";
  const auto p_after = p1.download();
  EXPECT_TRUE(std::equal(p0.begin(), p0.begin() + 3, p_after.begin())) << "the elements before the first run";
}

// sum_squares_many, the gradient norm's parts in two launches. Items: sizes 0 (adds nothing), 1,
// 768, one chunk exactly (65536), a chunk and one (65537), 2^21 + 7 (33 chunks); two items sharing a
// slot (added in item order); and 300 small items (more than one batch of 256, the slot shared
// across the batches' boundary). Oracles: each item's exact sum of squares (cpu::sum_squares in
// double: within (n - 1) 2^-53 relative, as above, so 5e-10 for the GPU's other order) added to the
// slot's start value; a second run gives the same bits; and an item's sum does not depend on its
// neighbours (the same x alone in a call: the same bits), the claim that its order is fixed by n.
TEST(CudaOpsOptim, SumSquaresManyMatchesCpuPerSlotInItemOrder) {
  DHX_REQUIRE_GPU();
  const std::vector<int64_t> sizes{0, 1, 768, 65536, 65537, (int64_t{1} << 21) + 7};
  std::vector<std::vector<float>> xs;
  std::vector<DevBuf<float>> gxs;
  uint64_t seed = 300;
  for (int64_t n : sizes) xs.push_back(randn(n, seed++));
  for (int k = 0; k < 300; ++k) xs.push_back(randn(1 + (k * 37) % 200, seed++));
  for (const auto& x : xs) gxs.emplace_back(x);
  // Slots: items 0-5 slots 0-5, except item 4 shares item 2's slot; the 300 small ones slots 6.. with
  // every 7th sharing slot 6 (items in both batches).
  std::vector<SumSquaresItem> items;
  std::vector<int64_t> slot_of;
  for (size_t k = 0; k < xs.size(); ++k) {
    int64_t sl = k < 6 ? static_cast<int64_t>(k) : 6 + static_cast<int64_t>(k - 6);
    if (k == 4) sl = 2;
    if (k >= 6 && (k - 6) % 7 == 0) sl = 6;
    items.push_back({gxs[k].get(), static_cast<int64_t>(xs[k].size()), sl});
    slot_of.push_back(sl);
  }
  const size_t nslots = 6 + 300;
  const auto start = randn(static_cast<int64_t>(nslots), seed++);
  std::vector<double> want(start.begin(), start.end());
  for (size_t k = 0; k < xs.size(); ++k)
    want[static_cast<size_t>(slot_of[k])] += cpu::sum_squares<float>(xs[k].data(), static_cast<int64_t>(xs[k].size()));
  std::vector<double> start_d(start.begin(), start.end());
  DevBuf<double> out(start_d);
  sum_squares_many(items, out.get(), nullptr);
  const auto got = out.download();
  for (size_t j = 0; j < nslots; ++j) {
    const double scale = std::max(std::abs(want[j]), 1.0);
    EXPECT_LE(std::abs(got[j] - want[j]), 5e-10 * scale) << "slot " << j << " got " << got[j] << " want " << want[j];
  }
  DevBuf<double> again(start_d);
  sum_squares_many(items, again.get(), nullptr);
  EXPECT_TRUE(same_bits(again.download(), got)) << "sum_squares_many twice differs";
  // Item 5 alone, from 0: its share of slot 5 (which no other item uses), bit for bit.
  DevBuf<double> alone(std::vector<double>{0.0});
  sum_squares_many({{gxs[5].get(), static_cast<int64_t>(xs[5].size()), 0}}, alone.get(), nullptr);
  EXPECT_EQ(alone.download()[0] + start_d[5], got[5]) << "an item's sum depends on its neighbours";
  DevBuf<double> bad(1);
  EXPECT_THROW(sum_squares_many({{gxs[1].get(), -1, 0}}, bad.get(), nullptr), InternalError);
}

}  // namespace
}  // namespace dhelix::cuda::test
