// cuBLASLt linear layers against the CPU's fp32 linear layers (kernels/cpu) run on the same
// bf16-rounded inputs, so the difference is the GPU's own error: the bf16 rounding of the output
// (at most u = 2^-8 relative per element, so at most u in the relative norm) plus fp32 summation in
// another order (about sqrt(K) * 2^-24, under 1e-5 for these K). Outputs poisoned before each call.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <tuple>
#include <utility>

#include "CudaTest.h"
#include "kernels/cpu/Kernels.h"
#include "kernels/cuda/Gemm.h"

namespace dhelix::cuda::test {
namespace {

struct Dims { int64_t N, I, O; };
const Dims kShapes[] = {{64, 96, 80}, {37, 50, 129}, {1, 8, 8}, {513, 768, 2304}};

constexpr double kBf16OutBound = kBf16U + 1e-5;  // one rounding to bf16 + fp32 order
constexpr double kF32OutBound = 1e-5;            // fp32 order only (dw accumulated in fp32)

TEST(CudaGemm, LinearForwardWithAndWithoutBiasMatchesCpu) {
  DHX_REQUIRE_GPU();
  Blas blas(0);
  uint64_t seed = 1;
  for (const Dims& d : kShapes) {
    for (bool with_bias : {false, true}) {
      const auto x = round_bf16(randn(d.N * d.I, seed++)), w = round_bf16(randn(d.O * d.I, seed++, 0.05f)),
                 b = round_bf16(randn(d.O, seed++));
      std::vector<float> ref(d.N * d.O);
      cpu::linear_fwd<float>(x.data(), w.data(), with_bias ? b.data() : nullptr, ref.data(), d.N, d.I, d.O);
      DevBuf<bf16> gx(to_bf16(x)), gw(to_bf16(w)), gb(to_bf16(b)), gy(d.N * d.O);
      gy.poison();
      blas.linear_fwd(gx.get(), gw.get(), with_bias ? gb.get() : nullptr, gy.get(), d.N, d.I, d.O, nullptr);
      const double e = rel_err(to_f32(gy.download()), ref);
      EXPECT_LE(e, kBf16OutBound) << "N=" << d.N << " I=" << d.I << " O=" << d.O << " bias=" << with_bias;
    }
  }
  EXPECT_GT(blas.cached_algorithms(), 0u);
}

// A bias that starts at an odd element of the flat bf16 store (2-byte aligned, as a tp shard of an
// odd width leaves the next parameter): Blas copies it to a 256-byte aligned buffer for cuBLASLt's
// epilogue. Oracle: the same GEMM with the bias in its own cudaMalloc (256-byte aligned), bitwise
// (the plan and so the algorithm are the same: the key's alignments, the bias's included, are).
// Then the same bias at 16- and 32-byte alignments: each gets a plan of its own (the heuristic judges
// the bias's alignment from its pointer), within the GEMM bound of the first output.
TEST(CudaGemm, AMisalignedBiasGivesTheAlignedBiasBits) {
  DHX_REQUIRE_GPU();
  Blas blas(0);
  uint64_t seed = 50;
  for (const Dims& d : kShapes) {
    const auto x = round_bf16(randn(d.N * d.I, seed++)), w = round_bf16(randn(d.O * d.I, seed++, 0.05f)),
               b = round_bf16(randn(d.O, seed++));
    std::vector<float> shifted(d.O + 1, 0.0f);
    std::copy(b.begin(), b.end(), shifted.begin() + 1);
    DevBuf<bf16> gx(to_bf16(x)), gw(to_bf16(w)), gb(to_bf16(b)), gb1(to_bf16(shifted)), gy(d.N * d.O),
        gy1(d.N * d.O);
    gy.poison();
    gy1.poison();
    blas.linear_fwd(gx.get(), gw.get(), gb.get(), gy.get(), d.N, d.I, d.O, nullptr);
    blas.linear_fwd(gx.get(), gw.get(), gb1.get() + 1, gy1.get(), d.N, d.I, d.O, nullptr);
    const auto y = gy.download(), y1 = gy1.download();
    EXPECT_EQ(0, std::memcmp(y.data(), y1.data(), y.size() * sizeof(bf16))) << "N=" << d.N << " I=" << d.I
                                                                            << " O=" << d.O;
    // 16 and 32 bytes: elements 8 and 16 of a buffer holding the bias there.
    for (int at : {8, 16}) {
      std::vector<float> moved(d.O + at, 0.0f);
      std::copy(b.begin(), b.end(), moved.begin() + at);
      DevBuf<bf16> gbm(to_bf16(moved)), gym(d.N * d.O);
      gym.poison();
      const size_t plans = blas.cached_algorithms();
      blas.linear_fwd(gx.get(), gw.get(), gbm.get() + at, gym.get(), d.N, d.I, d.O, nullptr);
      EXPECT_EQ(blas.cached_algorithms(), plans + 1) << "a bias " << 2 * at << "-byte aligned, N=" << d.N;
      // Another algorithm may sum in another order: within two bf16 roundings of the first output.
      EXPECT_LE(rel_err(to_f32(gym.download()), to_f32(y)), 2 * kBf16U + 1e-5) << "bias at " << 2 * at << " bytes";
    }
  }
}

TEST(CudaGemm, LinearBackwardDataWrittenAndAccumulatedMatchesCpu) {
  DHX_REQUIRE_GPU();
  Blas blas(0);
  uint64_t seed = 100;
  for (const Dims& d : kShapes) {
    const auto dy = round_bf16(randn(d.N * d.O, seed++)), w = round_bf16(randn(d.O * d.I, seed++, 0.05f));
    std::vector<float> ref(d.N * d.I);
    cpu::linear_bwd_data<float>(dy.data(), w.data(), ref.data(), d.N, d.I, d.O, cpu::Accumulate::kNo);
    DevBuf<bf16> gdy(to_bf16(dy)), gw(to_bf16(w)), gdx(d.N * d.I);
    gdx.poison();
    blas.linear_bwd_data(gdy.get(), gw.get(), gdx.get(), d.N, d.I, d.O, Accumulate::kNo, nullptr);
    EXPECT_LE(rel_err(to_f32(gdx.download()), ref), kBf16OutBound) << "written, N=" << d.N << " I=" << d.I;
    // Accumulate onto a random bf16 dx: the oracle is old + dy @ w. cuBLASLt may round the product
    // to bf16 before adding old (seen on an H200, 2026-11-26: 0.0023 > u at N=513, I=768), so the
    // bound allows two roundings: u * (||dy @ w|| + ||old + dy @ w||) / ||old + dy @ w||.
    const auto old = round_bf16(randn(d.N * d.I, seed++));
    gdx.upload(to_bf16(old));
    blas.linear_bwd_data(gdy.get(), gw.get(), gdx.get(), d.N, d.I, d.O, Accumulate::kYes, nullptr);
    double prod = 0, sum = 0;
    for (size_t i = 0; i < ref.size(); ++i) {
      prod += static_cast<double>(ref[i]) * ref[i];
      ref[i] += old[i];
      sum += static_cast<double>(ref[i]) * ref[i];
    }
    const double two_roundings = kBf16U * (std::sqrt(prod / sum) + 1) + 1e-5;
    EXPECT_LE(rel_err(to_f32(gdx.download()), ref), two_roundings) << "accumulated, N=" << d.N << " I=" << d.I;
  }
}

TEST(CudaGemm, LinearBackwardWeightAccumulatesFp32GradientsAndBias) {
  DHX_REQUIRE_GPU();
  Blas blas(0);
  uint64_t seed = 200;
  for (const Dims& d : kShapes) {
    const auto dy = round_bf16(randn(d.N * d.O, seed++)), x = round_bf16(randn(d.N * d.I, seed++));
    auto dw = randn(d.O * d.I, seed++), db = randn(d.O, seed++);  // accumulated into
    DevBuf<bf16> gdy(to_bf16(dy)), gx(to_bf16(x));
    DevBuf<float> gdw(dw), gdb(db);
    cpu::linear_bwd_weight<float>(dy.data(), x.data(), dw.data(), db.data(), d.N, d.I, d.O);
    blas.linear_bwd_weight(gdy.get(), gx.get(), gdw.get(), gdb.get(), d.N, d.I, d.O, nullptr);
    EXPECT_LE(rel_err(gdw.download(), dw), kF32OutBound) << "dw, N=" << d.N << " I=" << d.I << " O=" << d.O;
    EXPECT_LE(rel_err(gdb.download(), db), kF32OutBound) << "db, N=" << d.N << " O=" << d.O;
  }
}

// A column slice's bias gradient (a split weight gradient under tp: the weight's rows [lo, hi) and
// the bias's): bias_grad_strided over columns [lo, hi) of dy [N, O] against cpu::linear_bwd_weight_rows'
// bias over the same rows, accumulated onto random values; the columns outside untouched. Bound:
// fp32 sums of N bf16 values in another order (kF32OutBound). Slices: even and odd starts (the
// scalar path) and widths.
TEST(CudaGemm, BiasGradientOfAColumnSliceMatchesCpuRows) {
  DHX_REQUIRE_GPU();
  uint64_t seed = 500;
  struct Slice { int64_t N, O, lo, hi; };
  for (const Slice& d : {Slice{513, 2304, 0, 1152}, Slice{513, 2304, 1152, 2304}, Slice{37, 129, 1, 64},
                         Slice{64, 80, 40, 80}, Slice{1, 8, 3, 8}}) {
    const int64_t I = 16;
    const auto dy = round_bf16(randn(d.N * d.O, seed++)), x = round_bf16(randn(d.N * I, seed++));
    const auto db0 = randn(d.O, seed++);
    std::vector<float> db = db0, dw(d.O * I, 0.0f);
    cpu::linear_bwd_weight_rows<float>(dy.data(), x.data(), dw.data(), db.data(), d.N, I, d.O, d.lo, d.hi);
    DevBuf<bf16> gdy(to_bf16(dy));
    DevBuf<float> gdb(db0);
    bias_grad_strided(gdy.get() + d.lo, d.O, gdb.get() + d.lo, d.N, d.hi - d.lo, nullptr);
    const auto got = gdb.download();
    const std::vector<float> in(got.begin() + d.lo, got.begin() + d.hi), want(db.begin() + d.lo, db.begin() + d.hi);
    EXPECT_LE(rel_err(in, want), kF32OutBound) << "N=" << d.N << " O=" << d.O << " [" << d.lo << ", " << d.hi << ")";
    for (int64_t c = 0; c < d.O; ++c)
      if (c < d.lo || c >= d.hi) {
        EXPECT_EQ(got[c], db0[c]) << "column " << c << " outside the slice";
      }
  }
}

// The same call twice gives the same bits (one algorithm per shape, a fixed-order bias reduction).
TEST(CudaGemm, RepeatedCallsAreBitwiseEqual) {
  DHX_REQUIRE_GPU();
  Blas blas(0);
  const Dims d{1000, 768, 3072};
  DevBuf<bf16> gdy(to_bf16(randn(d.N * d.O, 7))), gx(to_bf16(randn(d.N * d.I, 8)));
  std::vector<float> first;
  for (int rep = 0; rep < 2; ++rep) {
    DevBuf<float> gdw(std::vector<float>(d.O * d.I, 0.5f)), gdb(std::vector<float>(d.O, 0.25f));
    blas.linear_bwd_weight(gdy.get(), gx.get(), gdw.get(), gdb.get(), d.N, d.I, d.O, nullptr);
    std::vector<float> got = gdw.download();
    const std::vector<float> gb = gdb.download();
    got.insert(got.end(), gb.begin(), gb.end());
    if (rep == 0) first = got;
    else EXPECT_EQ(0, std::memcmp(first.data(), got.data(), got.size() * sizeof(float)));
  }
}

// The choices file's promise (GemmChoices.h, training.gemm_choices): a Blas given another's choices
// (timed, or split-K) runs the same algorithms, so its outputs are that Blas's bit for bit, and it
// times nothing. Oracle: the first Blas's outputs on the same inputs (forward with bias, the weight
// gradient accumulated into fp32, the accumulating input gradient) at every shape; the counts.
// Then a choice cuBLASLt cannot honour (answer 7 where fewer are offered, or a split it refuses) is
// chosen anew and counted, never an error.
TEST(CudaGemm, ChoicesRepeatTheTimedAlgorithms) {
  DHX_REQUIRE_GPU();
  for (bool split : {false, true}) {
    Blas a(0);
    if (split) a.set_split_k(2);
    else a.set_choice(Blas::Choice::kTimed);
    uint64_t seed = 1300;
    struct Out {
      std::vector<bf16> y, dx;
      std::vector<float> dw;
    };
    auto run = [&](Blas& blas, const Dims& d, uint64_t s0) {
      uint64_t s = s0;
      const auto x = round_bf16(randn(d.N * d.I, s++)), w = round_bf16(randn(d.O * d.I, s++, 0.05f)),
                 b = round_bf16(randn(d.O, s++)), dy = round_bf16(randn(d.N * d.O, s++));
      DevBuf<bf16> gx(to_bf16(x)), gw(to_bf16(w)), gb(to_bf16(b)), gy(d.N * d.O), gdy(to_bf16(dy)),
          gdx(to_bf16(round_bf16(randn(d.N * d.I, s++))));
      DevBuf<float> gdw(randn(d.O * d.I, s++));
      gy.poison();
      blas.linear_fwd(gx.get(), gw.get(), gb.get(), gy.get(), d.N, d.I, d.O, nullptr);
      blas.linear_bwd_weight(gdy.get(), gx.get(), gdw.get(), nullptr, d.N, d.I, d.O, nullptr);
      blas.linear_bwd_data(gdy.get(), gw.get(), gdx.get(), d.N, d.I, d.O, Accumulate::kYes, nullptr);
      return Out{gy.download(), gdx.download(), gdw.download()};
    };
    std::vector<Out> first;
    for (const Dims& d : kShapes) first.push_back(run(a, d, seed += 10));
    const GemmChoices c = a.choices();
    ASSERT_EQ(c.choices.size(), a.cached_algorithms());
    EXPECT_EQ(c.device, device_info(0).name);
    Blas b(0);
    b.set_choice(Blas::Choice::kTimed);  // would time anew without the preset
    b.preset(c);
    seed = 1300;
    for (size_t i = 0; i < std::size(kShapes); ++i) {
      const Out again = run(b, kShapes[i], seed += 10);
      const std::string at = std::string(split ? "split-K 2" : "timed") + " N=" + std::to_string(kShapes[i].N);
      EXPECT_EQ(0, std::memcmp(again.y.data(), first[i].y.data(), again.y.size() * sizeof(bf16))) << "y, " << at;
      EXPECT_EQ(0, std::memcmp(again.dx.data(), first[i].dx.data(), again.dx.size() * sizeof(bf16))) << "dx, " << at;
      EXPECT_EQ(again.dw, first[i].dw) << "dw, " << at;
    }
    EXPECT_EQ(b.preset_used(), c.choices.size());
    EXPECT_EQ(b.preset_unusable(), 0u);
    EXPECT_EQ(b.chosen_here(), 0u);
    // Unusable choices: chosen anew (the heuristic's first here), counted.
    GemmChoices bad = c;
    for (GemmChoice& g : bad.choices) g.answer = Blas::kTimedCandidates - 1, g.split = 64;
    bad.choices.front().answer = Blas::kTimedCandidates;  // past the answers a preset may name: always refused
    Blas d(0);
    d.preset(bad);
    seed = 1300;
    for (const Dims& dims : kShapes) (void)run(d, dims, seed += 10);
    EXPECT_EQ(d.preset_used() + d.preset_unusable(), c.choices.size());
    EXPECT_GT(d.preset_unusable(), 0u) << "an answer past kTimedCandidates must be refused";
  }
}

// Blas::HeuristicOnly (the grouped expert GEMMs' scope: their row counts change with the routing):
// under kTimed, a shape first planned inside the scope runs the heuristic's first answer untimed
// and is neither counted nor written to the choices; run again outside the scope it becomes an
// ordinary choice. Oracles: a kHeuristic Blas's output on the same inputs, bit for bit (the first
// answer, not a timed one), and the counts.
TEST(CudaGemm, HeuristicOnlyScopePlansUntimedAndLeavesTheChoicesFile) {
  DHX_REQUIRE_GPU();
  const Dims d = kShapes[0];
  const auto x = round_bf16(randn(d.N * d.I, 1400)), w = round_bf16(randn(d.O * d.I, 1401, 0.05f));
  DevBuf<bf16> gx(to_bf16(x)), gw(to_bf16(w)), y_timed(d.N * d.O), y_plain(d.N * d.O);
  Blas plain(0);  // kHeuristic
  plain.linear_fwd(gx.get(), gw.get(), nullptr, y_plain.get(), d.N, d.I, d.O, nullptr);
  Blas timed(0);
  timed.set_choice(Blas::Choice::kTimed);
  {
    const Blas::HeuristicOnly scope;
    y_timed.poison();
    timed.linear_fwd(gx.get(), gw.get(), nullptr, y_timed.get(), d.N, d.I, d.O, nullptr);
  }
  EXPECT_EQ(0, std::memcmp(y_timed.download().data(), y_plain.download().data(), d.N * d.O * sizeof(bf16)))
      << "inside the scope: the heuristic's first answer";
  EXPECT_EQ(timed.cached_algorithms(), 1u);
  EXPECT_EQ(timed.chosen_here(), 0u);
  EXPECT_TRUE(timed.choices().choices.empty());
  timed.linear_fwd(gx.get(), gw.get(), nullptr, y_timed.get(), d.N, d.I, d.O, nullptr);  // outside: timed now
  EXPECT_EQ(timed.chosen_here(), 1u);
  EXPECT_EQ(timed.choices().choices.size(), 1u);
}

// Choice::kTimed (training.gemm_algo = timed): each new shape's algorithm the fastest of the
// heuristic's first answers, timed on the first call's operands into a scratch copy of C. Oracles:
// (1) the CPU's fp32 layers with the bounds above (any cuBLASLt algorithm accumulates in fp32; only
// the order differs), for the forward with bias (the epilogue's pointer set while timing), the data
// gradient accumulated and the weight gradient accumulated: with beta = 1 a timing that wrote C
// itself would have added the product seven more times, far past the bound; (2) the chosen
// algorithm sticks: a second call gives the first call's bits; (3) the study (time_candidates)
// returns the heuristic's answers with the first one timed (finite), then the kSplitKVariants split
// forms, and leaves C bit for bit.
TEST(CudaGemm, TimedChoiceMatchesCpuAndSticks) {
  DHX_REQUIRE_GPU();
  Blas blas(0);
  blas.set_choice(Blas::Choice::kTimed);
  uint64_t seed = 900;
  for (const Dims& d : kShapes) {
    const auto x = round_bf16(randn(d.N * d.I, seed++)), w = round_bf16(randn(d.O * d.I, seed++, 0.05f)),
               b = round_bf16(randn(d.O, seed++)), dy = round_bf16(randn(d.N * d.O, seed++));
    std::vector<float> ref(d.N * d.O);
    cpu::linear_fwd<float>(x.data(), w.data(), b.data(), ref.data(), d.N, d.I, d.O);
    DevBuf<bf16> gx(to_bf16(x)), gw(to_bf16(w)), gb(to_bf16(b)), gy(d.N * d.O), gdy(to_bf16(dy));
    gy.poison();
    blas.linear_fwd(gx.get(), gw.get(), gb.get(), gy.get(), d.N, d.I, d.O, nullptr);
    const auto first = gy.download();
    EXPECT_LE(rel_err(to_f32(first), ref), kBf16OutBound) << "fwd N=" << d.N << " I=" << d.I << " O=" << d.O;
    gy.poison();
    blas.linear_fwd(gx.get(), gw.get(), gb.get(), gy.get(), d.N, d.I, d.O, nullptr);
    const auto second = gy.download();
    EXPECT_EQ(0, std::memcmp(first.data(), second.data(), first.size() * sizeof(bf16))) << "fwd N=" << d.N;
    auto dw = randn(d.O * d.I, seed++), db = randn(d.O, seed++);
    DevBuf<float> gdw(dw), gdb(db);
    cpu::linear_bwd_weight<float>(dy.data(), x.data(), dw.data(), db.data(), d.N, d.I, d.O);
    blas.linear_bwd_weight(gdy.get(), gx.get(), gdw.get(), gdb.get(), d.N, d.I, d.O, nullptr);
    EXPECT_LE(rel_err(gdw.download(), dw), kF32OutBound) << "dw N=" << d.N << " I=" << d.I << " O=" << d.O;
    const auto old = round_bf16(randn(d.N * d.I, seed++));
    std::vector<float> dx(d.N * d.I);
    cpu::linear_bwd_data<float>(dy.data(), w.data(), dx.data(), d.N, d.I, d.O, cpu::Accumulate::kNo);
    double prod = 0, sum = 0;
    for (size_t i = 0; i < dx.size(); ++i) {
      prod += static_cast<double>(dx[i]) * dx[i];
      dx[i] += old[i];
      sum += static_cast<double>(dx[i]) * dx[i];
    }
    DevBuf<bf16> gdx(to_bf16(old));
    blas.linear_bwd_data(gdy.get(), gw.get(), gdx.get(), d.N, d.I, d.O, Accumulate::kYes, nullptr);
    EXPECT_LE(rel_err(to_f32(gdx.download()), dx), kBf16U * (std::sqrt(prod / sum) + 1) + 1e-5) << "dx N=" << d.N;
  }
  // The study, on the weight gradient's accumulating form at the largest shape.
  const Dims d = kShapes[3];
  DevBuf<bf16> gdy(to_bf16(randn(d.N * d.O, 77))), gx(to_bf16(randn(d.N * d.I, 78)));
  const auto c0 = randn(d.O * d.I, 79);
  DevBuf<float> gc(c0);
  const std::vector<double> ms = blas.time_candidates(Blas::Op::kT, Blas::Op::kN, d.O, d.I, d.N, gdy.get(), d.O,
                                                      gx.get(), d.I, 1.0f, gc.get(), d.I, Blas::Out::kF32, 8, 3, nullptr);
  ASSERT_GE(ms.size(), 1u + Blas::kSplitKVariants);  // at least the first answer, always the split forms
  EXPECT_LE(ms.size(), 8u + Blas::kSplitKVariants);
  EXPECT_TRUE(std::isfinite(ms[0]) && ms[0] > 0) << ms[0];
  const auto c1 = gc.download();
  EXPECT_EQ(0, std::memcmp(c0.data(), c1.data(), c0.size() * sizeof(float))) << "the study wrote C";
}

// The split-K forms the timed choice may keep (Gemm.h), forced (Choice::kSplitK) for each of
// kSplitKParts: the weight gradient accumulated into fp32 (beta 1: the split's fp32 parts are reduced
// and added to C) and the forward with bias. Oracle: the CPU's fp32 layers, with the bounds above (a
// split changes only the fp32 summation order). K = N = 4096 tokens at GPT-2's qkv shape, where a
// split has work to spread; whether cuBLASLt accepts a split is its call, so the test also requires
// that the weight gradient's shape ran split for at least one of the parts (else it checks nothing
// it claims to). The forward's GEMM (K = 768) may or may not split: it is checked either way, and
// which it did is not asserted.
TEST(CudaGemm, SplitKFormsMatchCpu) {
  DHX_REQUIRE_GPU();
  const Dims d{4096, 768, 2304};
  uint64_t seed = 1000;
  const auto x = round_bf16(randn(d.N * d.I, seed++)), w = round_bf16(randn(d.O * d.I, seed++, 0.05f)),
             b = round_bf16(randn(d.O, seed++)), dy = round_bf16(randn(d.N * d.O, seed++));
  std::vector<float> ref(d.N * d.O);
  cpu::linear_fwd<float>(x.data(), w.data(), b.data(), ref.data(), d.N, d.I, d.O);
  const auto dw0 = randn(d.O * d.I, seed++), db0 = randn(d.O, seed++);
  auto dw = dw0, db = db0;
  cpu::linear_bwd_weight<float>(dy.data(), x.data(), dw.data(), db.data(), d.N, d.I, d.O);
  DevBuf<bf16> gx(to_bf16(x)), gw(to_bf16(w)), gb(to_bf16(b)), gy(d.N * d.O), gdy(to_bf16(dy));
  size_t ran_split = 0;
  for (int parts : Blas::kSplitKParts) {
    Blas blas(0);
    blas.set_split_k(parts);
    DevBuf<float> gdw(dw0), gdb(db0);
    blas.linear_bwd_weight(gdy.get(), gx.get(), gdw.get(), gdb.get(), d.N, d.I, d.O, nullptr);
    EXPECT_LE(rel_err(gdw.download(), dw), kF32OutBound) << "dw, split " << parts;
    EXPECT_LE(rel_err(gdb.download(), db), kF32OutBound) << "db, split " << parts;
    ran_split += blas.split_plans();
    gy.poison();
    blas.linear_fwd(gx.get(), gw.get(), gb.get(), gy.get(), d.N, d.I, d.O, nullptr);
    EXPECT_LE(rel_err(to_f32(gy.download()), ref), kBf16OutBound) << "fwd, split " << parts;
  }
  EXPECT_GT(ran_split, 0u) << "cuBLASLt accepted no split of the weight gradient's first answer (or that answer "
                               "was split already): the split forms went untested";
}

// The partials rule (Gemm.h, Blas::wgrad_parts), no GPU needed. Oracle: the rule's words worked by
// hand. GPT-2 at B = 16, T = 1024 (N = 16384) on 132 SMs (2 x 132 = 264 tiles wanted): qkv's
// 2304 x 768 output is 18 x 6 = 108 tiles, 216 < 264 at 2 parts, 432 at 4: 4; the attention
// projection's 768 x 768 is 36, 288 at 8: 8; the MLP's 3072 x 768 and 768 x 3072 are 144, 288 at 2: 2;
// the head's 50304 x 768 is 2358 >= 264: 1 (direct). Fewer rows: 8 parts of the projection over
// N = 2048 would be 256 rows each, halved to 2 parts of 1024; N = 2047 gives parts of 1023 rows,
// 896 after the 128-row alignment, under 1024 even at 2 parts: 1.
TEST(CudaGemmRule, WgradPartsFollowTheTileRule) {
  EXPECT_EQ(Blas::wgrad_parts(16384, 768, 2304, 132), 4);
  EXPECT_EQ(Blas::wgrad_parts(16384, 768, 768, 132), 8);
  EXPECT_EQ(Blas::wgrad_parts(16384, 768, 3072, 132), 2);
  EXPECT_EQ(Blas::wgrad_parts(16384, 3072, 768, 132), 2);
  EXPECT_EQ(Blas::wgrad_parts(16384, 768, 50304, 132), 1);
  EXPECT_EQ(Blas::wgrad_parts(2048, 768, 768, 132), 2);
  EXPECT_EQ(Blas::wgrad_parts(2047, 768, 768, 132), 1);
  // Half the SMs (an SM partition of 66): qkv's 108 tiles are already 2 x 66 at 2 parts.
  EXPECT_EQ(Blas::wgrad_parts(16384, 768, 2304, 66), 2);
  EXPECT_EQ(Blas::wgrad_parts(16384, 768, 768, 0), 1);  // no SM count: the direct form
  EXPECT_EQ(Blas::wgrad_parts(0, 768, 768, 132), 1);
}

// The partials' layout (Blas::wgrad_split), no GPU needed. Oracle: its contract in Gemm.h, checked
// over token counts (whole, ragged, just under the least), shapes (GPT-2's, Llama-1B's, tiny) and SM
// counts (H100/H200's 132, a partition's 66, 114): every row in exactly one part or the rest, parts
// of a multiple of 128 rows and at least 1024, the rest under one part's alignment per part, the
// scratch stride the least multiple of 64 floats holding O x I; and GPT-2's qkv worked by hand
// (4 parts of 4096 rows, no rest, stride 2304 x 768).
TEST(CudaGemmRule, WgradSplitCoversEveryRowOnce) {
  const Blas::WgradSplit qkv = Blas::wgrad_split(16384, 768, 2304, 132);
  EXPECT_EQ(std::tie(qkv.parts, qkv.rows, qkv.rest, qkv.stride), std::make_tuple(4, int64_t{4096}, int64_t{0},
                                                                                  int64_t{2304 * 768}));
  const Blas::WgradSplit direct = Blas::wgrad_split(16384, 768, 50304, 132);
  EXPECT_EQ(std::tie(direct.parts, direct.rows, direct.rest), std::make_tuple(1, int64_t{16384}, int64_t{0}));
  int split = 0;
  for (const int64_t N : {int64_t{1}, int64_t{2047}, int64_t{2048}, int64_t{4096}, int64_t{4173}, int64_t{8191},
                          int64_t{16384}, int64_t{16411}, int64_t{65536}})
    for (const auto& [I, O] : {std::pair<int64_t, int64_t>{768, 2304}, {768, 768}, {3072, 768}, {2048, 2048},
                               {96, 160}, {5, 3}, {2048, 11264}})
      for (const int sms : {132, 66, 114}) {
        const Blas::WgradSplit sp = Blas::wgrad_split(N, I, O, sms);
        const std::string at = "N=" + std::to_string(N) + " I=" + std::to_string(I) + " O=" + std::to_string(O) +
                               " sms=" + std::to_string(sms);
        EXPECT_EQ(sp.parts, Blas::wgrad_parts(N, I, O, sms)) << at;
        EXPECT_EQ(sp.parts * sp.rows + sp.rest, N) << at;
        if (sp.parts == 1) {
          EXPECT_EQ(sp.rest, 0) << at;
          continue;
        }
        ++split;
        EXPECT_EQ(sp.rows % Blas::kPartRowAlign, 0) << at;
        EXPECT_GE(sp.rows, Blas::kMinPartRows) << at;
        EXPECT_GE(sp.rest, 0) << at;
        EXPECT_LT(sp.rest, sp.parts * (Blas::kPartRowAlign + 1)) << at;
        EXPECT_LE(sp.parts, Blas::kMaxWgradParts) << at;
        EXPECT_EQ(sp.stride % 64, 0) << at;
        EXPECT_GE(sp.stride, O * I) << at;
        EXPECT_LT(sp.stride - O * I, 64) << at;
      }
  EXPECT_GT(split, 20) << "the grid above should cut many of its cases";
}

// The partials form of the weight gradient (Blas::Wgrad::kPartials): dw and db accumulated onto
// random values. Oracles: the CPU's fp32 linear_bwd_weight (bound kF32OutBound: the partials change
// only the fp32 order of the sums), the direct form on the same operands (within two such bounds of
// it), and itself (a second run from the same values bitwise equal: a fixed algorithm and order).
// Shapes chosen to cut: a small output on 8192 rows (8 parts of 1024), on 4173 rows (4 parts of 1024
// and 77 rows by the direct GEMM after), and the attention projection's 768 x 768 on 4096 rows (4
// parts); then dw at an odd element (the reduction's scalar path). Each call must run as partials
// (partial_wgrads counts them): a cuBLASLt refusal of the batched GEMM fails here by name.
TEST(CudaGemm, WgradPartialsMatchTheCpuTheDirectFormAndRepeatBitwise) {
  DHX_REQUIRE_GPU();
  struct Case { Dims d; int64_t dw_offset; };
  const Case cases[] = {{{8192, 96, 160}, 0}, {{4173, 96, 160}, 0}, {{4096, 768, 768}, 0}, {{4173, 96, 160}, 1}};
  uint64_t seed = 1200;
  Blas partials(0), direct(0);
  partials.set_wgrad(Blas::Wgrad::kPartials);
  size_t calls = 0;
  for (const Case& c : cases) {
    const Dims& d = c.d;
    const std::string at = "N=" + std::to_string(d.N) + " I=" + std::to_string(d.I) + " O=" + std::to_string(d.O) +
                           " dw offset " + std::to_string(c.dw_offset);
    ASSERT_GT(Blas::wgrad_parts(d.N, d.I, d.O, partials.sm_count_target() > 0 ? partials.sm_count_target()
                                                                               : device_info(0).sms), 1) << at;
    const auto dy = round_bf16(randn(d.N * d.O, seed++)), x = round_bf16(randn(d.N * d.I, seed++));
    const auto dw0 = randn(d.O * d.I, seed++), db0 = randn(d.O, seed++);
    auto dw = dw0, db = db0;
    cpu::linear_bwd_weight<float>(dy.data(), x.data(), dw.data(), db.data(), d.N, d.I, d.O);
    std::vector<float> padded(c.dw_offset, 0.0f);
    padded.insert(padded.end(), dw0.begin(), dw0.end());
    DevBuf<bf16> gdy(to_bf16(dy)), gx(to_bf16(x));
    DevBuf<float> gdw(padded), gdw2(padded), gdw_direct(padded), gdb(db0), gdb2(db0);
    partials.linear_bwd_weight(gdy.get(), gx.get(), gdw.get() + c.dw_offset, gdb.get(), d.N, d.I, d.O, nullptr);
    partials.linear_bwd_weight(gdy.get(), gx.get(), gdw2.get() + c.dw_offset, gdb2.get(), d.N, d.I, d.O, nullptr);
    direct.linear_bwd_weight(gdy.get(), gx.get(), gdw_direct.get() + c.dw_offset, nullptr, d.N, d.I, d.O, nullptr);
    calls += 2;
    EXPECT_EQ(partials.partial_wgrads(), calls) << at << ": the batched GEMM did not run (cuBLASLt refused it?)";
    auto got = gdw.download(), again = gdw2.download(), ref_direct = gdw_direct.download();
    EXPECT_EQ(0, std::memcmp(got.data(), again.data(), got.size() * sizeof(float))) << at << ": not repeatable";
    for (int64_t i = 0; i < c.dw_offset; ++i) EXPECT_EQ(got[i], 0.0f) << at << ": wrote before dw";
    got.erase(got.begin(), got.begin() + c.dw_offset);
    ref_direct.erase(ref_direct.begin(), ref_direct.begin() + c.dw_offset);
    EXPECT_LE(rel_err(got, dw), kF32OutBound) << at;
    EXPECT_LE(rel_err(got, ref_direct), 2 * kF32OutBound) << at << " against the direct form";
    EXPECT_LE(rel_err(gdb.download(), db), kF32OutBound) << at << " db";
  }
  EXPECT_EQ(direct.partial_wgrads(), 0u);
}

TEST(CudaGemm, NoGpuIsAClearDeviceError) {
  if (probe().devices > 0) {
    EXPECT_THROW(require_device(probe().devices), DeviceError);  // one past the last GPU
    return;
  }
  try {
    require_device(0);
    FAIL() << "require_device(0) returned on a machine without a GPU";
  } catch (const DeviceError& e) {
    EXPECT_NE(std::string(e.what()).find("no GPU"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace dhelix::cuda::test
