// Plan search tests. Oracle: exhaustive enumeration of every legal block sequence
// (brute_force_search) on small random programs and random price tables; the DP's best cost
// and its top-k costs must equal the enumeration's exactly (prices are multiples of 1/1024
// summed in the same order, so no tolerance is needed). Every emitted plan must pass the checker.
#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include <algorithm>
#include <chrono>
#include <set>

#include "ClusterTestUtil.h"
#include "PlanTestUtil.h"
#include "plan/PlanCheck.h"
#include "schedule/PlanSearch.h"
#include "sim/CostModel.h"

namespace dhelix {
namespace {

rc::Gen<std::string> gen_strand(int min_ops, int max_ops) {
  return rc::gen::map(rc::gen::container<std::vector<int>>(rc::gen::inRange(0, 4)),
                      [=](std::vector<int> v) {
                        v.resize(std::clamp<size_t>(v.size(), min_ops, max_ops), 0);
                        std::string s;
                        for (int x : v) s += (x == 2 ? "tp " : x == 3 ? "cp " : "c ");
                        return s;
                      });
}

// Number of block sequences if every window up to max_window ops (0 = any) were legal.
double path_bound(const LayerProgram& prog, int max_window) {
  const int P = static_cast<int>(prog.fwd.size()), Q = static_cast<int>(prog.bwd.size());
  const int w = max_window > 0 ? max_window : std::max(P, Q);
  std::vector<std::vector<double>> n(P + 1, std::vector<double>(Q + 1, 0));
  n[0][0] = 1;
  for (int i = 0; i <= P; ++i)
    for (int j = 0; j <= Q; ++j)
      for (int a = 0; a <= std::min(w, i); ++a)
        for (int b = 0; b <= std::min(w, j); ++b)
          if (a + b > 0) n[i][j] += n[i - a][j - b];
  return n[P][Q];
}

std::vector<double> costs_of(const SearchResult& r) {
  std::vector<double> c;
  for (const SIPlan& p : r.plans) c.push_back(p.predicted_s);
  return c;
}

void expect_plans_valid(const SearchResult& r, const LayerProgram& prog, const BlockCost& cost,
                        const SearchOptions& opts) {
  std::set<std::vector<std::array<int, 4>>> distinct;
  double prev = -1;
  for (const SIPlan& p : r.plans) {
    RC_ASSERT(find_violations(p, prog).empty());
    if (opts.windows == WindowRule::kWithinSegments) RC_ASSERT(windows_within_segments(p, prog));
    RC_ASSERT(cost.plan(p) == p.predicted_s);  // the reported cost is the plan's cost
    RC_ASSERT(p.predicted_s >= prev);          // best first
    prev = p.predicted_s;
    std::vector<std::array<int, 4>> key;
    for (const Block& b : p.blocks) key.push_back({b.fwd_begin, b.fwd_end, b.bwd_begin, b.bwd_end});
    distinct.insert(key);
  }
  RC_ASSERT(distinct.size() == r.plans.size());
}

RC_GTEST_PROP(PlanSearch, DpEqualsBruteForce, ()) {
  const LayerProgram prog = test::program_from(*gen_strand(2, 7), *gen_strand(2, 7));
  const auto seed = *rc::gen::arbitrary<uint32_t>();
  const int unknown = *rc::gen::element(0, 300, 800);
  SearchOptions opts{.top_k = *rc::gen::inRange(1, 6),
                     .windows = *rc::gen::element(WindowRule::kWithinSegments,
                                                  WindowRule::kAnyContiguous),
                     .max_window = *rc::gen::inRange(0, 4)};
  // Keep the enumeration affordable (7x7 unrestricted has 3.1M block sequences; one-op
  // windows at most 48,639): shrink windows when the legality-free path count is large.
  if (path_bound(prog, opts.max_window) > 100000) opts.max_window = 1;
  test::HashCost cost(seed, unknown);
  SearchResult dp = search_plans(prog, cost, opts);
  SearchResult bf = brute_force_search(prog, cost, opts);
  RC_TAG(bf.paths > 1000 ? "many paths" : "few paths");
  RC_ASSERT(dp.plans.size() == std::min<size_t>(opts.top_k, bf.paths));
  RC_ASSERT(costs_of(dp) == costs_of(bf));
  expect_plans_valid(dp, prog, cost, opts);
  expect_plans_valid(bf, prog, cost, opts);
}

TEST(PlanSearch, PrefersOverlapAndMatchesHandComputedOptimum) {
  // fwd: f0.tp   bwd: b0 b1 (compute). Prices: AG alone 1, each bwd op alone 1,
  // AG beside one bwd op 1.1, beside both 2.05 (HashCost not used: hand table).
  struct Table final : BlockCost {
    double solo_fwd(int, int) const override { return 1; }
    double solo_bwd(int c, int d) const override { return d - c == 1 ? 1 : 1.9; }
    double pair(int, int, int c, int d) const override { return d - c == 1 ? 1.1 : 2.05; }
  } table;
  LayerProgram prog = test::program_from("tp", "c c");
  SearchResult r = search_plans(prog, table, {.top_k = 3});
  ASSERT_EQ(r.plans.size(), 3u);
  EXPECT_EQ(r.plans[0].blocks, (std::vector<Block>{{0, 1, 0, 2}}));
  EXPECT_DOUBLE_EQ(r.plans[0].predicted_s, 2.05);
  EXPECT_DOUBLE_EQ(r.plans[1].predicted_s, 2.1);  // pair with one op + the other alone (x2)
  EXPECT_DOUBLE_EQ(r.plans[2].predicted_s, 2.1);
}

TEST(PlanSearch, NeverPairsSameGroupCollectives) {
  struct Cheap final : BlockCost {  // pairs look free: only legality stops them
    double solo_fwd(int, int) const override { return 1; }
    double solo_bwd(int, int) const override { return 1; }
    double pair(int, int, int, int) const override { return 0; }
  } cheap;
  LayerProgram prog = test::program_from("tp", "tp");
  SIPlan p = best_plan(prog, cheap);
  EXPECT_EQ(p.blocks.size(), 2u);
  EXPECT_DOUBLE_EQ(p.predicted_s, 2);
  LayerProgram mixed = test::program_from("tp", "cp");
  EXPECT_DOUBLE_EQ(best_plan(mixed, cheap).predicted_s, 0);
}

TEST(PlanSearch, LlamaShapedPairIsFast) {
  // 13 fwd x 17 bwd ops, 4 TP collectives per strand, priced by the analytical model.
  LayerProgram prog = test::llama_like_pair();
  CostModel model(prog, test::cluster_cost_model("h100-8gpu", test::tp_only(8)));
  for (int k : {1, 8}) {
    auto t0 = std::chrono::steady_clock::now();
    SearchResult r = search_plans(prog, model, {.top_k = k});
    double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0)
                    .count();
    ASSERT_EQ(r.plans.size(), static_cast<size_t>(k));
    expect_plans_valid(r, prog, model, {});
    std::printf("[ info ] 13x17 search top_k=%d: %.3f ms, %lld blocks priced, best %.3f ms\n", k,
                ms, static_cast<long long>(r.blocks_priced), r.plans[0].predicted_s * 1e3);
  }
  // Unrestricted windows (executor allows segment-crossing): still one DP, larger fan-in.
  auto t0 = std::chrono::steady_clock::now();
  SearchResult any = search_plans(prog, model, {.top_k = 8, .windows = WindowRule::kAnyContiguous});
  double ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  std::printf("[ info ] 13x17 search any-contiguous top_k=8: %.3f ms, %lld blocks priced\n", ms,
              static_cast<long long>(any.blocks_priced));
  EXPECT_LE(any.plans[0].predicted_s, search_plans(prog, model).plans[0].predicted_s);
}

}  // namespace
}  // namespace dhelix
