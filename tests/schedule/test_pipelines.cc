// Step schedules: the generators against the checker and against closed forms (the slot lists of
// the single-stage schedules, the W's layer placement, the bubble formulas), and the checker
// against hand-broken schedules, each rejected by the rule it breaks with rank and slot named.
#include <gtest/gtest.h>

#include <algorithm>

#include "base/Error.h"
#include "plan/StepSchedule.h"
#include "schedule/Pipelines.h"
#include "ScheduleTestUtil.h"

namespace dhelix {
namespace {

using test::B;
using test::F;
using test::FB;
using test::spec;

std::string all_messages(const std::vector<ScheduleViolation>& v) {
  std::string o;
  for (const auto& x : v) o += x.message() + "\n";
  return o;
}

// Oracle: the checker (every pass once, dependencies, matched transfers, no deadlock by simulating
// all ranks) accepts every generated schedule over the grid.
TEST(Pipelines, CheckerAcceptsEveryGeneratedSchedule) {
  int checked = 0;
  for (PipelineKind k : {PipelineKind::k1F1B, PipelineKind::kInterleaved, PipelineKind::kW})
    for (int p : {1, 2, 3, 4, 8})
      for (int v : {1, 2}) {
        if (v == 2 && k != PipelineKind::kInterleaved) continue;
        for (int N = p; N <= 4 * p; ++N)
          for (CoExecute co : {CoExecute::kOff, CoExecute::kOn}) {
            PipelineSpec s = spec(k, p, N, 4 * p * v, v, co);
            StepSchedule sch = make_schedule(s);
            auto viol = find_schedule_violations(sch);
            EXPECT_TRUE(viol.empty()) << sch.name << " p=" << p << " v=" << v << " N=" << N << "\n"
                                      << all_messages(viol) << render_schedule(sch);
            ++checked;
          }
      }
  EXPECT_GT(checked, 300);
}

// Oracle: closed forms of the single-stage schedules (they replace StepRunner's former loops):
// off = F0 B0 F1 B1 ...; on = F0, {F1 || B0}, ..., {F(N-1) || B(N-2)}, B(N-1).
TEST(Pipelines, SingleStageSchedulesAreSequentialAndStrandInterleaved) {
  const int N = 4;
  StepSchedule off = make_schedule(spec(PipelineKind::k1F1B, 1, N, 3));
  ASSERT_EQ(off.ranks.size(), 1u);
  ASSERT_EQ(off.chunks.size(), 1u);
  EXPECT_EQ(off.chunks[0].unit_begin, 0);
  EXPECT_EQ(off.chunks[0].unit_end, 5);
  ASSERT_EQ(off.ranks[0].size(), 2u * N);
  for (int m = 0; m < N; ++m) {
    EXPECT_EQ(off.ranks[0][2 * m].fwd, (Pass{m, 0}));
    EXPECT_FALSE(off.ranks[0][2 * m].bwd.active());
    EXPECT_EQ(off.ranks[0][2 * m + 1].bwd, (Pass{m, 0}));
    EXPECT_FALSE(off.ranks[0][2 * m + 1].fwd.active());
  }
  StepSchedule on = make_schedule(spec(PipelineKind::k1F1B, 1, N, 3, 1, CoExecute::kOn));
  ASSERT_EQ(on.ranks[0].size(), static_cast<size_t>(N + 1));
  for (int s = 0; s <= N; ++s) {
    const Slot& sl = on.ranks[0][s];
    EXPECT_EQ(sl.fwd, (s < N ? Pass{s, 0} : Pass{}));
    EXPECT_EQ(sl.bwd, (s >= 1 ? Pass{s - 1, 0} : Pass{}));
    EXPECT_TRUE(sl.recvs.empty() && sl.sends.empty());
  }
}

// Oracle: the placement (reference/dhelix.md §8.1) with k = L / 2p: stage s holds layers
// s*k+1..(s+1)*k and L-(s+1)*k+1..L-s*k; embedding and head on stage 0; and in every co-executed slot
// the forward chunk and the backward chunk are mirrors (chunk i beside chunk 2p-1-i), so layer l
// runs beside layer L+1-l.
TEST(Pipelines, WPlacementFoldsLayersAndPairsMirrors) {
  const int p = 4, L = 16, k = L / (2 * p);
  PipelineSpec s = spec(PipelineKind::kW, p, 8, L, 1, CoExecute::kOn);
  StepSchedule sch = make_schedule(s);
  ASSERT_EQ(sch.chunks.size(), 2u * p);
  for (int st = 0; st < p; ++st) {
    std::vector<int> layers;
    for (int c : sch.chunks_of(st))
      for (int u = sch.chunks[c].unit_begin; u < sch.chunks[c].unit_end; ++u)
        if (u >= 1 && u <= L) layers.push_back(u);  // unit u is layer u (1-based)
    std::vector<int> want;
    for (int l = st * k + 1; l <= (st + 1) * k; ++l) want.push_back(l);
    for (int l = L - (st + 1) * k + 1; l <= L - st * k; ++l) want.push_back(l);
    EXPECT_EQ(layers, want) << "stage " << st;
  }
  EXPECT_EQ(sch.chunks.front().rank, 0);  // embedding
  EXPECT_EQ(sch.chunks.back().rank, 0);   // head
  int co = 0;
  for (const auto& slots : sch.ranks)
    for (const Slot& sl : slots)
      if (sl.co_executed()) {
        ++co;
        EXPECT_EQ(sl.fwd.chunk + sl.bwd.chunk, 2 * p - 1);
        EXPECT_EQ(sl.fwd.mb, sl.bwd.mb + p);  // fwd(j) beside bwd(j - p)
      }
  EXPECT_EQ(co, p * 2 * (8 - p));  // each stage: N - p micro-batches pair, in a down- and an up-pass
}

// Oracle: the bubble formulas of Pipelines.h against the schedule's own timeline (uniform layers,
// backward = 2 or 3 x forward, embedding and head free, no communication), co-execution off and on.
TEST(Pipelines, TimelineBubbleMatchesFormula) {
  for (PipelineKind k : {PipelineKind::k1F1B, PipelineKind::kInterleaved, PipelineKind::kW})
    for (int p : {2, 3, 4, 8})
      for (int mult : {1, 2, 4})
        for (double ratio : {2.0, 3.0})
          for (CoExecute co : {CoExecute::kOff, CoExecute::kOn}) {
            const int N = p * mult, v = k == PipelineKind::kInterleaved ? 2 : 1;
            PipelineSpec s = spec(k, p, N, 4 * p * v, v, co);
            StepSchedule sch = make_schedule(s);
            ScheduleTimeline tl = simulate_timeline(sch, uniform_layer_cost(sch.num_units, ratio));
            EXPECT_NEAR(tl.max_bubble(), bubble_formula(s, ratio), 1e-9)
                << sch.name << " p=" << p << " N=" << N << " b/f=" << ratio;
          }
}


// Oracle: closed forms worked by hand on 1F1B, p = 2, N = 2, one chunk per rank. (a) 2 layers a
// chunk, forward 1 per layer, backward 2, every transfer x = 1: rank 0's F0 ends at 2, its act
// lands at 3; rank 1 runs F0 [3,5], B0 [5,9] (grad lands at 10), F1 [9,11], B1 [11,15] (grad
// lands at 16); rank 0's B1 runs [16,20]: makespan 18 + 2x. A zero transfer cost gives the
// transfer-free timeline. (b) The link carries one message at a time: forward = backward = 1 a
// chunk, x = 3: act 0 lands at 4, act 1 queues behind it and lands at 7 (not 5), so rank 1's F1
// starts at 7, its B1 grad lands at 12 and rank 0 ends at 13 (12 without the queue).
TEST(Pipelines, TimelinePricesTransfersOnALinkAtATime) {
  const StepSchedule sch = make_schedule(spec(PipelineKind::k1F1B, 2, 2, 4));
  const PassCost layers = uniform_layer_cost(sch.num_units, 2.0);
  EXPECT_DOUBLE_EQ(simulate_timeline(sch, layers).makespan, 18.0);
  EXPECT_DOUBLE_EQ(simulate_timeline(sch, layers, [](const Transfer&) { return 0.0; }).makespan, 18.0);
  const ScheduleTimeline tl = simulate_timeline(sch, layers, [](const Transfer&) { return 1.0; });
  EXPECT_DOUBLE_EQ(tl.makespan, 20.0);
  EXPECT_DOUBLE_EQ(tl.ranks[1][0].start, 3.0);
  EXPECT_DOUBLE_EQ(tl.ranks[0][3].start, 16.0);

  const PassCost unit = [](const Chunk&, bool) { return 1.0; };
  const ScheduleTimeline q = simulate_timeline(sch, unit, [](const Transfer&) { return 3.0; });
  EXPECT_DOUBLE_EQ(q.ranks[1][0].start, 4.0);
  EXPECT_DOUBLE_EQ(q.ranks[1][2].start, 7.0);  // F1 waits for act 1 queued behind act 0
  EXPECT_DOUBLE_EQ(q.makespan, 13.0);
}
StepSchedule two_stage_1f1b() { return make_schedule(spec(PipelineKind::k1F1B, 2, 3, 2)); }

TEST(ScheduleChecker, RejectsDeadlockingOrder) {
  // Rank 1 runs both forwards before its first backward while rank 0 waits for that backward's
  // gradient before sending the second activation: each waits for the other.
  StepSchedule s = two_stage_1f1b();
  auto& r0 = s.ranks[0];  // F0 F1 B0 F2 B1 B2
  auto& r1 = s.ranks[1];  // F0 B0 F1 B1 F2 B2
  r0 = {F(0, 0), B(0, 0), F(1, 0), B(1, 0), F(2, 0), B(2, 0)};
  r1 = {F(0, 1), F(1, 1), B(0, 1), F(2, 1), B(1, 1), B(2, 1)};
  attach_transfers(s);
  auto v = find_schedule_violations(s);
  ASSERT_FALSE(v.empty());
  EXPECT_EQ(v[0].rule, kRuleDeadlock) << all_messages(v);
  EXPECT_EQ(v[0].rank, 0);
  EXPECT_EQ(v[0].slot, 1);
  EXPECT_NE(v[0].message().find("rank 0 slot 1: rule 'no deadlock'"), std::string::npos) << v[0].message();
  EXPECT_NE(all_messages(v).find("grad of micro-batch 0"), std::string::npos) << all_messages(v);
  EXPECT_THROW(check_schedule(s), PlanError);
}

TEST(ScheduleChecker, RejectsMissingMicroBatch) {
  StepSchedule s = two_stage_1f1b();
  auto& r1 = s.ranks[1];
  r1.erase(std::remove_if(r1.begin(), r1.end(), [](const Slot& sl) { return sl.bwd == Pass{2, 1}; }), r1.end());
  auto v = find_schedule_violations(s);
  ASSERT_EQ(v.size(), 1u) << all_messages(v);
  EXPECT_EQ(v[0].rule, kRuleOnce);
  EXPECT_EQ(v[0].rank, 1);
  EXPECT_EQ(v[0].message(), "rank 1: rule 'each pass exactly once': micro-batch 2's backward of chunk 1 never runs");
}

TEST(ScheduleChecker, RejectsBackwardBeforeItsForward) {
  StepSchedule s = make_schedule(spec(PipelineKind::k1F1B, 1, 2, 2));  // F0 B0 F1 B1
  std::swap(s.ranks[0][2], s.ranks[0][3]);                            // F0 B0 B1 F1
  auto v = find_schedule_violations(s);
  ASSERT_EQ(v.size(), 1u) << all_messages(v);
  EXPECT_EQ(v[0].rule, kRuleDependency);
  EXPECT_EQ(v[0].rank, 0);
  EXPECT_EQ(v[0].slot, 2);
  EXPECT_NE(v[0].detail.find("micro-batch 1's backward of chunk 0 runs before micro-batch 1's forward of chunk 0"),
            std::string::npos)
      << v[0].message();
}

TEST(ScheduleChecker, RejectsCoExecutingAPassWithItsOwnInput) {
  StepSchedule s = make_schedule(spec(PipelineKind::k1F1B, 1, 2, 2, 1, CoExecute::kOn));  // F0, F1||B0, B1
  s.ranks[0] = {F(0, 0), FB({1, 0}, {1, 0}), B(0, 0)};
  auto v = find_schedule_violations(s);
  ASSERT_FALSE(v.empty());
  EXPECT_EQ(v[0].rule, kRuleDependency);
  EXPECT_EQ(v[0].slot, 1);
  EXPECT_NE(v[0].detail.find("co-executed"), std::string::npos) << v[0].message();
}

TEST(ScheduleChecker, RejectsUnmatchedTransfers) {
  StepSchedule s = two_stage_1f1b();
  ASSERT_FALSE(s.ranks[1][0].recvs.empty());
  s.ranks[1][0].recvs.clear();                  // rank 1 never receives mb 0's activation
  s.ranks[0][0].sends.back().peer = 0;          // and rank 0 sends it to itself
  auto v = find_schedule_violations(s);
  ASSERT_EQ(v.size(), 3u) << all_messages(v);
  for (const auto& x : v) EXPECT_EQ(x.rule, kRuleTransfer);
  EXPECT_EQ(v[0].rank, 0);
  EXPECT_NE(v[0].detail.find("no send of the act of micro-batch 0 across boundary 1 (peer rank 1)"),
            std::string::npos)
      << all_messages(v);
  EXPECT_EQ(v[2].rank, 1);
  EXPECT_NE(v[2].detail.find("no receive posted"), std::string::npos) << all_messages(v);
}

TEST(ScheduleChecker, RejectsChunksThatDoNotPartitionTheUnits) {
  StepSchedule s = two_stage_1f1b();
  s.chunks[1].unit_begin += 1;
  auto v = find_schedule_violations(s);
  ASSERT_EQ(v.size(), 1u) << all_messages(v);
  EXPECT_EQ(v[0].rule, kRuleChunks);
  EXPECT_EQ(v[0].rank, -1);
}

TEST(Pipelines, SpecErrorsAreAllReported) {
  PipelineSpec s = spec(PipelineKind::kW, 4, 3, 12, 2);
  auto e = pipeline_spec_errors(s);
  ASSERT_EQ(e.size(), 3u);
  EXPECT_NE(e[0].find("schedule.virtual_stages=2 applies to schedule.pipeline=interleaved only"), std::string::npos);
  EXPECT_NE(e[1].find("model.n_layers=12 is not divisible by 2 x parallel.pp = 8"), std::string::npos) << e[1];
  EXPECT_NE(e[2].find("training.micro_batches=3 is below parallel.pp=4"), std::string::npos) << e[2];
  EXPECT_THROW(make_schedule(s), ConfigError);
  auto i = pipeline_spec_errors(spec(PipelineKind::kInterleaved, 2, 2, 6, 2));
  ASSERT_EQ(i.size(), 1u);
  EXPECT_NE(i[0].find("parallel.pp x schedule.virtual_stages = 2 x 2 = 4"), std::string::npos) << i[0];
}

}  // namespace
}  // namespace dhelix
