// Checker tests. Oracle: hand-made bad plans, one per rule, whose expected message (block index
// and rule name) is known; and default/sequential plans on hand-built programs, which the
// rules of DESIGN.md say must be legal.
#include <gtest/gtest.h>
#include <algorithm>
#include <rapidcheck/gtest.h>

#include "PlanTestUtil.h"
#include "base/Error.h"
#include "plan/PlanCheck.h"
#include "schedule/BasicPlans.h"

namespace dhelix {
namespace {

using test::program_from;

// fwd: f0 | f1.tp | f2 f3 | f4.cp      bwd: b0.tp | b1 b2 | b3.cp
LayerProgram small() { return program_from("c tp c c cp", "tp c c cp"); }

SIPlan plan_of(std::vector<Block> blocks) {
  SIPlan p;
  p.pair = "block";
  p.source = "test";
  p.blocks = std::move(blocks);
  return p;
}

// Runs the checker and returns its message ("" if it accepted the plan).
std::string check_message(const SIPlan& plan, const LayerProgram& prog) {
  try {
    check_plan(plan, prog);
  } catch (const PlanError& e) {
    return e.what();
  }
  return "";
}

TEST(PlanCheck, AcceptsLegalPlan) {
  SIPlan p = plan_of({{0, 1, 0, 1}, {1, 2, 1, 3}, {2, 4, 3, 4}, {4, 5, 0, 0}});
  EXPECT_EQ(check_message(p, small()), "");
  EXPECT_TRUE(windows_within_segments(p, small()));
}

TEST(PlanCheck, RejectsMissingOp) {
  SIPlan p = plan_of({{0, 1, 0, 1}, {2, 4, 1, 4}, {4, 5, 0, 0}});  // f1.tp skipped
  std::string m = check_message(p, small());
  EXPECT_NE(m.find("block 1: rule 'each op exactly once': fwd op #1 'f1.tp' is in no block"),
            std::string::npos)
      << m;
}

TEST(PlanCheck, RejectsMissingTrailingOp) {
  SIPlan p = plan_of({{0, 1, 0, 3}, {1, 5, 0, 0}});  // b3.cp never runs
  std::string m = check_message(p, small());
  EXPECT_NE(m.find("plan: rule 'each op exactly once': bwd op #3 'b3.cp' is in no block"),
            std::string::npos)
      << m;
}

TEST(PlanCheck, RejectsDuplicateOp) {
  SIPlan p = plan_of({{0, 0, 0, 1}, {0, 2, 1, 3}, {1, 3, 0, 0}, {3, 4, 3, 4}, {4, 5, 0, 0}});
  std::string m = check_message(p, small());  // f1.tp in blocks 1 and 2
  EXPECT_NE(m.find("block 2: rule 'each op exactly once': fwd op #1 'f1.tp' appears again "
                   "(first in block 1)"),
            std::string::npos)
      << m;
}

TEST(PlanCheck, RejectsOrderViolation) {
  SIPlan p = plan_of({{0, 1, 0, 1}, {2, 4, 1, 4}, {1, 2, 0, 0}, {4, 5, 0, 0}});
  std::string m = check_message(p, small());
  EXPECT_NE(m.find("block 2: rule 'strand order kept': fwd window [1,2) f1.tp comes after "
                   "block 1's fwd window [2,4) f2 f3"),
            std::string::npos)
      << m;
}

TEST(PlanCheck, RejectsTwoCollectivesOfOneGroup) {
  SIPlan p = plan_of({{0, 1, 1, 3}, {1, 2, 0, 1}, {2, 5, 3, 4}});  // block 1: tp + tp
  std::string m = check_message(p, small());
  EXPECT_NE(m.find("block 1: rule 'one collective per process group': group 'tp' has fwd "
                   "'f1.tp' and bwd 'b0.tp'"),
            std::string::npos)
      << m;
  // Also block 2 (cp on both sides) is reported, and the order break in bwd.
  EXPECT_NE(m.find("block 2: rule 'one collective per process group': group 'cp'"),
            std::string::npos)
      << m;
}

TEST(PlanCheck, RejectsTwoCollectivesOfOneGroupInOneWindow) {
  LayerProgram prog = program_from("tp c tp", "c");
  SIPlan p = plan_of({{0, 3, 0, 1}});
  std::string m = check_message(p, prog);
  EXPECT_NE(m.find("block 0: rule 'one collective per process group': group 'tp' has fwd "
                   "'f0.tp' and fwd 'f2.tp'"),
            std::string::npos)
      << m;
}

TEST(PlanCheck, RejectsBoundsAndEmptyBlocksAndWrongPair) {
  SIPlan p = plan_of({{0, 1, 0, 0}, {0, 0, 0, 0}, {1, 9, 0, 4}});
  p.pair = "embed";
  std::vector<PlanViolation> v = find_violations(p, small());
  auto has = [&](int block, const char* rule) {
    for (auto& x : v)
      if (x.block == block && x.rule == rule) return true;
    return false;
  };
  EXPECT_TRUE(has(-1, kRulePair));
  EXPECT_TRUE(has(1, kRuleNonEmpty));
  EXPECT_TRUE(has(2, kRuleBounds));
}

// SIPlan::carry: only trailing backward ops that write no buffer and accumulate gradients may
// run in the next pair. Oracle: hand-set outputs/grads whose verdict the rule states.
TEST(PlanCheck, CarryOnlyTrailingWeightGradientOps) {
  LayerProgram prog = program_from("c tp c", "tp c c c");
  prog.bwd[1].outputs = {"h"};
  prog.bwd[1].grads = {"w1"};
  prog.bwd[2].grads = {"w2"};
  prog.bwd[3].grads = {"w3"};
  SIPlan p = plan_of({{0, 1, 0, 1}, {1, 2, 1, 4}, {2, 3, 0, 0}});
  ASSERT_EQ(check_message(p, prog), "");
  p.carry = 2;  // b2 b3: gradients only
  EXPECT_EQ(check_message(p, prog), "");
  p.carry = 3;
  std::string m = check_message(p, prog);
  EXPECT_NE(m.find("plan: rule 'carried ops write nothing': bwd op #1 'b1' is carried into the next pair but "
                   "writes 'h'"),
            std::string::npos)
      << m;
  p.carry = 4;
  m = check_message(p, prog);
  EXPECT_NE(m.find("bwd op #0 'b0.tp' is carried into the next pair but is a collective"), std::string::npos) << m;
  p.carry = 5;
  m = check_message(p, prog);
  EXPECT_NE(m.find("rule 'carried ops write nothing': carry 5 is outside 0..4"), std::string::npos) << m;
  p.carry = 1;
  prog.bwd[3].grads.clear();
  m = check_message(p, prog);
  EXPECT_NE(m.find("bwd op #3 'b3' is carried into the next pair but accumulates no gradient"), std::string::npos)
      << m;
}

TEST(PlanCheck, DependentStrandWindowIsLegal) {
  // A window holding a collective and the compute that consumes it, beside the other strand's
  // compute: legal (crosses a segment, so not "within segments").
  SIPlan p = plan_of({{0, 0, 0, 1}, {0, 4, 1, 3}, {4, 5, 0, 0}, {0, 0, 3, 4}});
  EXPECT_EQ(check_message(p, small()), "");
  EXPECT_FALSE(windows_within_segments(p, small()));
}

TEST(BasicPlans, DefaultPairsCollectivesWithComputeOnLlamaShape) {
  LayerProgram prog = test::llama_like_pair();
  SIPlan d = default_plan(prog);
  EXPECT_EQ(check_message(d, prog), "");
  EXPECT_TRUE(windows_within_segments(d, prog));
  int overlapped = 0;
  for (const Block& b : d.blocks)
    if (b.has_fwd() && b.has_bwd()) ++overlapped;
  EXPECT_EQ(overlapped, 8);  // each of the 8 TP collectives sits beside compute
  SIPlan s = sequential_plan(prog);
  EXPECT_EQ(check_message(s, prog), "");
  EXPECT_EQ(s.blocks.size(), 18u);  // 9 segments per strand
}

// Random strand spec: 0-7 tokens of compute or collectives on tp/cp.
rc::Gen<std::string> gen_strand(int min_ops, int max_ops) {
  return rc::gen::map(
      rc::gen::container<std::vector<int>>(rc::gen::inRange(0, 4)), [=](std::vector<int> v) {
        v.resize(std::clamp<size_t>(v.size(), min_ops, max_ops), 0);
        std::string s;
        for (int x : v) s += (x == 2 ? "tp " : x == 3 ? "cp " : "c ");
        return s;
      });
}

RC_GTEST_PROP(BasicPlans, DefaultAndSequentialAlwaysPass, ()) {
  std::string f = *gen_strand(0, 12), b = *gen_strand(0, 12);
  LayerProgram prog = program_from(f, b);
  for (const SIPlan& p : {default_plan(prog), sequential_plan(prog)}) {
    RC_ASSERT(check_message(p, prog) == "");
    RC_ASSERT(windows_within_segments(p, prog));
  }
}

}  // namespace
}  // namespace dhelix
