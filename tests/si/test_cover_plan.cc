// cover_plan (src/schedule/BasicPlans.h), the plan the runtime uses when no plan file is given.
// Oracles: the plan checker (check_plan: coverage, order, one collective per group per block) and
// windows_within_segments, on the real layer programs and on random strands; and, for the
// transformer block pair, the dependency argument of reference/dhelix.md §6.2: at least 6 of the
// 8 tp collectives must sit beside compute of the other strand; and counting only large compute
// (at least the planner's "small" threshold, 10% of the strand's biggest compute segment) of the
// other strand or the collective's own independent tail, 7 of 8: the pair's first backward
// collective (the all-gather of the incoming gradient) is the one with only the forward strand's
// first norm beside it; every other collective has a GEMM segment available (the row-parallel
// wgrad GEMMs held back after the next reduce-scatter give the backward strand the compute).
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <string>

#include "../plan/PlanTestUtil.h"
#include "sharding/ModelPrograms.h"
#include "plan/PlanCheck.h"
#include "schedule/BasicPlans.h"

namespace dhelix {
namespace {

int collectives(const std::vector<Op>& ops, int a, int b) {
  int n = 0;
  for (int i = a; i < b; ++i) n += ops[i].is_collective();
  return n;
}

// Collectives in a block whose other-strand window is non-empty compute.
int covered(const SIPlan& plan, const LayerProgram& p) {
  int n = 0;
  for (const Block& k : plan.blocks) {
    const int cf = collectives(p.fwd, k.fwd_begin, k.fwd_end), cb = collectives(p.bwd, k.bwd_begin, k.bwd_end);
    if (cf && k.has_bwd() && cb == 0) n += cf;
    if (cb && k.has_fwd() && cf == 0) n += cb;
  }
  return n;
}

double flops(const std::vector<Op>& ops, int a, int b) {
  double f = 0;
  for (int i = a; i < b; ++i) f += ops[i].is_collective() ? 0 : ops[i].cost.flops;
  return f;
}

// 10% of the biggest run of consecutive compute ops (the planner's threshold, BasicPlans.cc).
double small_threshold(const std::vector<Op>& ops) {
  double biggest = 0, run = 0;
  for (const Op& op : ops) {
    run = op.is_collective() ? 0 : run + op.cost.flops;
    biggest = std::max(biggest, run);
  }
  return 0.1 * biggest;
}

// Collectives whose block gives them large cover: other-strand compute plus the compute after the
// collective in its own window (its independent tail), at least the other strand's threshold.
int covered_by_large_compute(const SIPlan& plan, const LayerProgram& p) {
  const double small_f = small_threshold(p.fwd), small_b = small_threshold(p.bwd);
  int n = 0;
  for (const Block& k : plan.blocks) {
    const int cf = collectives(p.fwd, k.fwd_begin, k.fwd_end), cb = collectives(p.bwd, k.bwd_begin, k.bwd_end);
    const double ff = flops(p.fwd, k.fwd_begin, k.fwd_end), fb = flops(p.bwd, k.bwd_begin, k.bwd_end);
    if (cf && cb == 0 && fb + ff >= small_b) n += cf;
    if (cb && cf == 0 && ff + fb >= small_f) n += cb;
  }
  return n;
}

// A window may cross a segment boundary only as a collective followed by compute that does not
// read the collective's output (the independent tail cover_plan adds); otherwise windows stay
// inside segments.
void expect_tails_independent(const std::vector<Op>& ops, int begin, int end, const std::string& what) {
  for (int c = begin; c < end; ++c) {
    if (!ops[c].is_collective()) continue;
    EXPECT_EQ(c, begin) << what << ": collective " << ops[c].name << " is not first in its window";
    for (int i = c + 1; i < end; ++i) {
      EXPECT_FALSE(ops[i].is_collective()) << what << ": two collectives in one window";
      for (const auto& in : ops[i].inputs)
        for (const auto& out : ops[c].outputs)
          EXPECT_NE(in, out) << what << ": " << ops[i].name << " reads " << out << " of " << ops[c].name
                             << " in the same window";
    }
  }
}

void expect_valid(const SIPlan& plan, const LayerProgram& p, const std::string& what) {
  EXPECT_EQ(find_violations(plan, p).size(), 0u) << what;
  EXPECT_NO_THROW(check_plan(plan, p)) << what;
  for (const Block& k : plan.blocks) {
    expect_tails_independent(p.fwd, k.fwd_begin, k.fwd_end, what + " fwd");
    expect_tails_independent(p.bwd, k.bwd_begin, k.bwd_end, what + " bwd");
  }
}

class CoverPlanOnModels : public ::testing::TestWithParam<const char*> {};

TEST_P(CoverPlanOnModels, ValidAndCoversSixOfEightBlockCollectives) {
  ModelConfig m = model_preset(GetParam());
  LayoutConfig lay;
  lay.tp = 2;
  lay.sequence_parallel = true;
  ModelPrograms progs = build_programs(m, lay, MicroBatchShape{1, 256});
  SIPlan block = cover_plan(progs.block);
  expect_valid(block, progs.block, "block");
  EXPECT_EQ(collectives(progs.block.fwd, 0, int(progs.block.fwd.size())) +
                collectives(progs.block.bwd, 0, int(progs.block.bwd.size())),
            8);
  EXPECT_GE(covered(block, progs.block), 6);
  EXPECT_GE(covered_by_large_compute(block, progs.block), 7);
  // The edge pairs of the folded schedule: embed beside head, head beside embed.
  for (auto [f, b] : {std::pair{&progs.embed, &progs.head}, std::pair{&progs.head, &progs.embed}}) {
    LayerProgram pair{"pair", f->fwd, b->bwd};
    expect_valid(cover_plan(pair), pair, f->name + "|" + b->name);
  }
}

INSTANTIATE_TEST_SUITE_P(Presets, CoverPlanOnModels, ::testing::Values("gpt2-124m", "demo"));

// Random strands of compute ops (random FLOPs, including 0) and collectives on two groups.
TEST(CoverPlan, RandomStrandsAlwaysPassTheChecker) {
  std::mt19937_64 rng(2024);
  const char* toks[] = {"c", "c", "tp", "cp"};
  for (int trial = 0; trial < 3000; ++trial) {
    std::string f, b;
    for (int i = 0, n = int(rng() % 13); i < n; ++i) f += std::string(toks[rng() % 4]) + " ";
    for (int i = 0, n = int(rng() % 13); i < n; ++i) b += std::string(toks[rng() % 4]) + " ";
    LayerProgram p = test::program_from(f, b);
    for (auto* s : {&p.fwd, &p.bwd})
      for (Op& op : *s)
        if (!op.is_collective()) op.cost.flops = double(rng() % 4) * 1e8;
    expect_valid(cover_plan(p), p, "fwd '" + f + "' bwd '" + b + "'");
    if (HasFailure()) break;
  }
}

}  // namespace
}  // namespace dhelix

namespace dhelix {
namespace {

// Layer-program order for tp = 1 (src/sharding/Lowering1D.cc, block_program): the block's input
// gradient (the first norm's backward writes "dx") comes before the attention's weight-gradient GEMMs, so the unit
// below — for the first layer, GradSync's embedding-row all-gather — gets it two GEMMs earlier;
// with tp > 1 attn.out.wgrad and the first half of attn.qkv's weight gradient (attn.qkv.wgrad.0)
// stay ahead of ln1.bwd, under the reduce-scatter it waits for, and the second half
// (attn.qkv.wgrad.1) is the block's last op (what an SI plan carries into the next pair). Oracle:
// the op lists themselves, plus the dataflow rule that nothing after "dx" in the block reads a
// wgrad; the halves' row ranges tile the weight.
TEST(BlockProgram, InputGradientBeforeAttentionWgradsOnlyWithoutTp) {
  for (const char* preset : {"demo", "gpt2-124m"}) {
    ModelConfig m = model_preset(preset);
    for (int tp : {1, 2}) {
      LayoutConfig lay;
      lay.tp = tp;
      lay.sequence_parallel = tp > 1;
      const auto& bwd = build_programs(m, lay, MicroBatchShape{1, 64}).block.bwd;
      auto index_of = [&](const std::string& name, const std::string& output) {
        for (size_t i = 0; i < bwd.size(); ++i)
          if (bwd[i].name == name || (!output.empty() && !bwd[i].outputs.empty() && bwd[i].outputs[0] == output))
            return static_cast<int>(i);
        ADD_FAILURE() << preset << " tp=" << tp << ": no op " << name << output;
        return -1;
      };
      const int dx = index_of("", "dx"), wo = index_of("attn.out.wgrad", "");
      if (tp == 1) {
        const int wqkv = index_of("attn.qkv.wgrad", "");
        EXPECT_LT(dx, wo) << preset;
        EXPECT_LT(dx, wqkv) << preset;
        EXPECT_EQ(wqkv, static_cast<int>(bwd.size()) - 1) << preset << ": the block's last op is a wgrad";
      } else {
        const int w0 = index_of("attn.qkv.wgrad.0", ""), w1 = index_of("attn.qkv.wgrad.1", "");
        const int rs = index_of("tp.rs.attn.qkv.bwd", "");
        EXPECT_GT(dx, wo) << preset;
        EXPECT_LT(rs, w0) << preset << ": the first half runs after the reduce-scatter is issued";
        EXPECT_GT(dx, w0) << preset << ": the first half runs before ln1.bwd waits on it";
        EXPECT_LT(dx, w1) << preset;
        EXPECT_EQ(w1, static_cast<int>(bwd.size()) - 1) << preset << ": the block's last op is a wgrad";
        const Op& a = bwd[static_cast<size_t>(w0)];
        const Op& b = bwd[static_cast<size_t>(w1)];
        const int64_t rows = (m.n_heads + 2 * m.n_kv_heads) / tp * m.head_dim();  // qkv rows per rank
        EXPECT_EQ(a.attrs.at("rows_lo"), 0);
        EXPECT_EQ(a.attrs.at("rows_hi"), b.attrs.at("rows_lo"));
        EXPECT_EQ(b.attrs.at("rows_hi"), rows) << preset;
        EXPECT_EQ(a.cost.flops + b.cost.flops, 2.0 * 64 * static_cast<double>(rows) * m.d_model) << preset;
      }
    }
  }
}

}  // namespace
}  // namespace dhelix
