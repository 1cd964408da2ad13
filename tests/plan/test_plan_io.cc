// Plan JSON, profile JSON, text and SVG rendering. Oracles: round trips (save -> load gives
// the same plan / table), hand-written bad files whose error is known, and substrings the
// rendering must contain.
#include <gtest/gtest.h>

#include <filesystem>

#include "PlanTestUtil.h"
#include "base/Error.h"
#include "plan/PlanIO.h"
#include "plan/PlanRender.h"
#include "plan/PlanSvg.h"
#include "plan/Profile.h"
#include "schedule/BasicPlans.h"
#include "schedule/PlanSearch.h"

namespace dhelix {
namespace {

using nlohmann::json;

std::string error_of(const json& j, const LayerProgram& prog) {
  try {
    plan_from_json(j, prog, "t.json");
  } catch (const PlanError& e) {
    return e.what();
  }
  return "";
}

TEST(PlanIO, RoundTripKeepsBlocksAndHeader) {
  LayerProgram prog = test::llama_like_pair();
  test::HashCost cost(7, 100);
  SIPlan plan = search_plans(prog, cost, {.top_k = 3}).plans[2];
  json j = plan_to_json(plan, prog);
  EXPECT_EQ(j["format"], "dhelix-si-plan");
  EXPECT_EQ(j["version"], 2);
  EXPECT_EQ(j["fwd_ops"].size(), 13u);
  SIPlan back = plan_from_json(json::parse(j.dump()), prog);
  EXPECT_EQ(back.blocks, plan.blocks);
  EXPECT_EQ(back.pair, "block");
  EXPECT_EQ(back.source, "search");
  EXPECT_DOUBLE_EQ(back.predicted_s, plan.predicted_s);
}

// carry_bwd (version 2) round-trips; version-1 files (no carry) still load, as carry 0; a
// carry_bwd that is not the program's trailing ops is rejected. Oracle: the plan written.
TEST(PlanIO, CarryRoundTripsAndVersionOneLoads) {
  LayerProgram prog = test::program_from("c tp c c", "tp c c");
  prog.bwd[2].grads = {"w"};
  SIPlan plan = default_plan(prog);
  plan.carry = 1;
  json j = plan_to_json(plan, prog);
  EXPECT_EQ(j["carry_bwd"], json::array({"b2"}));
  EXPECT_EQ(plan_from_json(json::parse(j.dump()), prog).carry, 1);
  json v1 = j;
  v1["version"] = 1;
  v1.erase("carry_bwd");
  EXPECT_EQ(plan_from_json(v1, prog).carry, 0);
  j["carry_bwd"] = json::array({"b1"});
  EXPECT_NE(error_of(j, prog).find("'carry_bwd'[0] is \"b1\", expected 'b2': carried ops must be the last 1 "
                                   "backward ops"),
            std::string::npos)
      << error_of(j, prog);
}

TEST(PlanIO, FileRoundTrip) {
  LayerProgram prog = test::llama_like_pair();
  SIPlan plan = default_plan(prog);
  std::string path = (std::filesystem::temp_directory_path() / "dhelix_test_plan.json").string();
  save_plan(path, plan, prog);
  EXPECT_EQ(load_plan(path, prog).blocks, plan.blocks);
  std::filesystem::remove(path);
}

TEST(PlanIO, RejectsBadFiles) {
  LayerProgram prog = test::program_from("c tp c c", "tp c c");
  SIPlan plan = default_plan(prog);
  const json good = plan_to_json(plan, prog);
  ASSERT_EQ(error_of(good, prog), "");

  json j = good;
  j["format"] = "other";
  EXPECT_NE(error_of(j, prog).find("format is 'other'"), std::string::npos);
  j = good;
  j["version"] = 3;
  EXPECT_NE(error_of(j, prog).find("plan version 3 is not supported"), std::string::npos);
  j = good;
  j["blocks"][1]["fwd"] = json::array({"f2", "nope"});
  EXPECT_NE(error_of(j, prog).find("block 1: unknown fwd op 'nope'"), std::string::npos);
  j = good;
  j["blocks"][1]["fwd"] = json::array({"f3", "f2"});
  EXPECT_NE(error_of(j, prog).find("block 1: fwd op 'f2' (#2) does not follow 'f3' (#3)"),
            std::string::npos);
  j = good;
  j["fwd_ops"][0] = "g0";
  EXPECT_NE(error_of(j, prog).find("'fwd_ops'[0] is \"g0\", the program has 'f0'"),
            std::string::npos);
  j = good;
  j["blocks"].erase(0);  // f0 alone: now missing
  EXPECT_NE(error_of(j, prog).find("rule 'each op exactly once': fwd op #0 'f0' is in no block"),
            std::string::npos);
  EXPECT_THROW(load_plan("/nonexistent/plan.json", prog), IoError);
}

TEST(Profile, RoundTripAndLookup) {
  LayerProgram prog = test::program_from("c tp c", "tp c");
  Profile p;
  p.meta.model = "tiny";
  p.meta.layout = "tp=2";
  p.meta.repeats = 20;
  p.describe_program(prog);
  p.set_solo_fwd({0, 1}, 1e-3);
  p.set_solo_bwd({1, 2}, 2e-3);
  p.set_pair({1, 2}, {1, 2}, 2.5e-3);
  Profile q = Profile::from_json(json::parse(p.to_json().dump()));
  EXPECT_EQ(q.meta.model, "tiny");
  EXPECT_EQ(q.meta.repeats, 20);
  EXPECT_EQ(q.meta.fwd_ops, (std::vector<std::string>{"f0", "f1.tp", "f2"}));
  EXPECT_DOUBLE_EQ(q.solo_fwd(0, 1), 1e-3);
  EXPECT_DOUBLE_EQ(q.solo_bwd(1, 2), 2e-3);
  EXPECT_DOUBLE_EQ(q.pair(1, 2, 1, 2), 2.5e-3);
  EXPECT_EQ(q.solo_fwd(0, 2), kNoCost);
  EXPECT_EQ(q.num_pairs(), 1u);
  EXPECT_NO_THROW(q.check_matches(prog));
  EXPECT_THROW(q.check_matches(test::program_from("c tp c c", "tp c")), PlanError);
  json bad = p.to_json();
  bad["version"] = 9;
  EXPECT_THROW(Profile::from_json(bad), PlanError);
  EXPECT_THROW(p.set_pair({0, 1}, {0, 1}, -1), PlanError);
}

TEST(Profile, SearchOnMeasuredTable) {
  // Oracle: a table where pairing the collective with the other strand's compute is cheaper
  // than running either alone; the search must find that block.
  LayerProgram prog = test::program_from("tp", "c");
  Profile p;
  p.describe_program(prog);
  p.set_solo_fwd({0, 1}, 1.0);
  p.set_solo_bwd({0, 1}, 1.0);
  p.set_pair({0, 1}, {0, 1}, 1.2);
  SIPlan best = best_plan(prog, p);
  ASSERT_EQ(best.blocks.size(), 1u);
  EXPECT_EQ(best.blocks[0], (Block{0, 1, 0, 1}));
  EXPECT_DOUBLE_EQ(best.predicted_s, 1.2);
  Profile empty;
  EXPECT_THROW(best_plan(prog, empty), PlanError);
}

TEST(PlanRender, TableNamesOpsAndCollectives) {
  LayerProgram prog = test::llama_like_pair();
  test::HashCost cost(3, 0);
  SIPlan plan = default_plan(prog);
  plan.predicted_s = cost.plan(plan);
  std::string text = render_plan(plan, prog, &cost);
  EXPECT_NE(text.find("SI plan 'block' (source default)"), std::string::npos) << text;
  EXPECT_NE(text.find("forward ops"), std::string::npos);
  EXPECT_NE(text.find("fwd tp all_gather tp.ag.attn"), std::string::npos) << text;
  EXPECT_NE(text.find("attn.qkv attn.core attn.proj"), std::string::npos) << text;
  // One header line, one column-title line, one line per block.
  EXPECT_EQ(std::count(text.begin(), text.end(), '\n'),
            static_cast<long>(plan.blocks.size()) + 2);
}

TEST(PlanSvg, TimelineHasLanesBlocksAndLabels) {
  LayerProgram prog = test::program_from("c tp c c cp", "tp c c cp");
  test::HashCost cost(5, 0);
  SIPlan plan = best_plan(prog, cost);
  for (const BlockCost* c : {static_cast<const BlockCost*>(&cost), static_cast<const BlockCost*>(nullptr)}) {
    std::string svg = render_plan_svg(plan, prog, c);
    EXPECT_EQ(svg.rfind("<svg", 0), 0u);
    EXPECT_NE(svg.find("</svg>"), std::string::npos);
    EXPECT_NE(svg.find("comm tp"), std::string::npos);
    EXPECT_NE(svg.find("comm cp"), std::string::npos);
    EXPECT_NE(svg.find("<title>fwd f1.tp #1 (all_gather on tp)"), std::string::npos);
    // Every op of both strands is drawn once.
    size_t boxes = 0;
    for (size_t at = 0; (at = svg.find("<g><title>", at)) != std::string::npos; ++at) ++boxes;
    EXPECT_EQ(boxes, prog.fwd.size() + prog.bwd.size());
  }
}

}  // namespace
}  // namespace dhelix
