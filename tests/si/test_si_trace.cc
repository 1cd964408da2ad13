// The trace of a tp = 2 Strand-Interleaving run (threads-as-ranks). Oracle: the executor's
// contract (DESIGN.md, Strand Interleaving) read off the Chrome trace it writes — in a paired
// block the collective of one micro-batch is issued, the other micro-batch's compute runs, and
// only then is the collective waited for, so at least one collective's issue-to-wait window must
// hold a compute op of a *different* micro-batch (the sequential schedule never has two
// micro-batches in flight, so such a window can only come from interleaving). Every lane and op
// is named.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <map>
#include <set>
#include <nlohmann/json.hpp>
#include <regex>
#include <string>
#include <vector>

#include "SiRun.h"
#include "schedule/Pipelines.h"
#include "base/Files.h"
#include "train/Trainer.h"

namespace dhelix {
namespace {

struct Interval {
  std::string lane, name;
  int mb = -1;
  double begin = 0, end = 0;  // microseconds
  double issued = 0;          // collectives: when the compute thread issued it (begin - queued_us)
  double waited = 0;          // tp collectives: when the compute thread began to wait (begin + wait_us)
};

// "attn.qkv mb3 u2" -> 3
int mb_of(const std::string& name) {
  static const std::regex re(R"( mb(\d+) u\d+$)");
  std::smatch m;
  return std::regex_search(name, m, re) ? std::stoi(m[1]) : -1;
}

// The comm and compute intervals of rank 0's trace; every lane and op must be named.
struct Lanes {
  std::vector<Interval> comm, compute;
  std::vector<Interval> dp, optimizer;  // dp bucket reductions; AdamW updates (no micro-batch)
  std::vector<Interval> pp;             // pipeline sends and receives ("send act mb0 b1 ->r1")
  std::vector<Interval> slots;          // the schedule lane: one box per slot ("F2 c0 || B1 c0")
  std::vector<std::string> names;
};
Lanes read_trace(const std::string& path) {
  Lanes out;
  EXPECT_TRUE(std::filesystem::exists(path)) << path;
  const auto doc = nlohmann::json::parse(read_file(path));
  EXPECT_TRUE(doc.contains("traceEvents"));
  std::map<int, std::string> lanes;  // tid -> lane name
  for (const auto& e : doc["traceEvents"])
    if (e.value("ph", "") == "M" && e.value("name", "") == "thread_name")
      lanes[e["tid"].get<int>()] = e["args"]["name"].get<std::string>();
  for (const auto& e : doc["traceEvents"]) {
    if (e.value("ph", "") != "X") continue;
    const int tid = e["tid"].get<int>();
    EXPECT_TRUE(lanes.count(tid)) << "event " << e.dump() << " is on an unnamed lane";
    Interval iv{lanes[tid], e.value("name", ""), -1, e["ts"].get<double>(), 0};
    iv.end = iv.begin + e["dur"].get<double>();
    EXPECT_FALSE(iv.name.empty()) << "unnamed op on lane " << iv.lane;
    iv.issued = iv.begin;
    iv.waited = iv.end;
    if (e.contains("args") && e["args"].contains("queued_us")) iv.issued -= e["args"]["queued_us"].get<double>();
    if (e.contains("args") && e["args"].contains("wait_us")) iv.waited = iv.begin + e["args"]["wait_us"].get<double>();
    if (iv.lane.rfind("schedule stage ", 0) == 0) {
      out.slots.push_back(iv);
      continue;
    }
    if (iv.lane.rfind("comm pp[", 0) == 0) {
      out.pp.push_back(iv);
      continue;
    }
    if (iv.lane.rfind("comm dp[", 0) == 0 || iv.lane == "compute optimizer") {
      (iv.lane == "compute optimizer" ? out.optimizer : out.dp).push_back(iv);
      continue;
    }
    iv.mb = mb_of(iv.name);
    EXPECT_GE(iv.mb, 0) << "op '" << iv.name << "' does not name its micro-batch";
    if (iv.lane.rfind("comm tp[", 0) == 0)
      out.comm.push_back(iv);
    else if (iv.lane == "compute fwd" || iv.lane == "compute bwd")
      out.compute.push_back(iv);
    else
      ADD_FAILURE() << "unexpected lane '" << iv.lane << "'";
  }
  for (auto& [tid, n] : lanes) out.names.push_back(n);
  return out;
}

// A 3-step llama SI run of dp x tp on a synthetic dataset in `dir`, tracing to <dir>/trace.json.
RunConfig traced_llama_config(const testing::TempDir& dir, int dp, int tp) {
  testing::write_synthetic_dataset(dir.path() + "/data", 200, 300, 17);
  RunConfig cfg = testing::si_config(dir.path(), "llama", dp, tp, /*interleave=*/true);
  cfg.training.steps = 3;
  cfg.output.trace = dir.path() + "/trace.json";
  return cfg;
}

// combination: tp si
TEST(SiTrace, CollectiveOfOneStrandOverlapsComputeOfTheOther) {
  testing::TempDir dir;
  const RunConfig cfg = traced_llama_config(dir, /*dp=*/1, /*tp=*/2);
  testing::on_local_ranks(cfg, [&](CommContext& comm) { Trainer(cfg, &comm, Quiet::kYes).run(); });
  const Lanes t = read_trace(cfg.output.trace + ".rank0");
  const auto& comm = t.comm;
  const auto& compute = t.compute;
  // The schedule lane: SI at pp = 1 has M + 1 slots a step, M - 1 of them co-executed.
  const int64_t M = cfg.training.micro_batches;
  EXPECT_EQ(static_cast<int64_t>(t.slots.size()), cfg.training.steps * (M + 1));
  EXPECT_EQ(std::count_if(t.slots.begin(), t.slots.end(),
                          [](const Interval& s) { return s.name.find(" || ") != std::string::npos; }),
            cfg.training.steps * (M - 1));
  const auto& names = t.names;
  for (const char* want : {"compute fwd", "compute bwd"})
    EXPECT_NE(std::find(names.begin(), names.end(), want), names.end()) << "no lane '" << want << "'";
  EXPECT_TRUE(std::any_of(names.begin(), names.end(), [](const std::string& n) { return n == "comm tp[0/2]"; }))
      << "no lane for rank 0's tp group";
  ASSERT_FALSE(comm.empty());
  ASSERT_FALSE(compute.empty());

  // The schedule's part, which is deterministic: a collective of micro-batch a whose window from
  // issue to wait holds a whole compute op of micro-batch b != a (the other strand of the same
  // slot). Whether the comm thread then got a core during that op is the OS scheduler's choice
  // (beside two spinning processes it once got none, in run 65), so actual overlap, intervals
  // that intersect with positive length, is printed, not asserted.
  int windows = 0, overlaps = 0;
  std::string example;
  for (const auto& c : comm)
    for (const auto& x : compute) {
      if (c.mb == x.mb) continue;
      if (c.issued <= x.begin && x.end <= c.waited && windows++ == 0)
        example = "'" + c.name + "' [" + c.lane + "] issued before '" + x.name + "' [" + x.lane + "], waited after it";
      if (std::max(c.begin, x.begin) < std::min(c.end, x.end)) ++overlaps;
    }
  EXPECT_GT(windows, 0) << comm.size() << " collectives, " << compute.size()
                        << " compute ops, none left in flight across an op of the other strand";
  std::printf("%d collective windows hold other-strand compute, e.g. %s; %d actually overlapped\n", windows,
              example.c_str(), overlaps);
}

// SIPlan::carry on the tp = 2 block pair: the upper layer's (u2) trailing attn.qkv.wgrad.1 leaves its
// pair and runs in the next one (forward u2 beside backward u1), right after that pair's first
// collective is issued — the all-gather before u1's first backward GEMM, issued after u1's first
// backward op (GPT: the residual's bias gradient). Oracle: the executor's carry contract read off the trace as op order
// (deterministic, unlike comm timings): in every paired slot the carried op runs after u1's first
// backward op and before its second, the GEMM that waits for that all-gather; in the backward-only
// last slot (no pairs, nothing carried) it ends before any backward op of u1 starts.
// combination: tp si
TEST(SiTrace, CarriedWeightGradientRunsUnderTheNextPairsFirstCollective) {
  testing::TempDir dir;
  testing::write_synthetic_dataset(dir.path() + "/data", 200, 300, 17);
  RunConfig cfg = testing::si_config(dir.path(), "gpt", /*dp=*/1, /*tp=*/2, /*interleave=*/true);
  cfg.training.steps = 1;
  cfg.output.trace = dir.path() + "/trace.json";
  testing::on_local_ranks(cfg, [&](CommContext& comm) { Trainer(cfg, &comm, Quiet::kYes).run(); });
  const Lanes t = read_trace(cfg.output.trace + ".rank0");
  const int M = static_cast<int>(cfg.training.micro_batches);
  auto ends_with = [](const std::string& s, const std::string& tail) {
    return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
  };
  for (int m = 0; m < M; ++m) {
    const std::string carried = "attn.qkv.wgrad.1 mb" + std::to_string(m) + " u2";
    auto it = std::find_if(t.compute.begin(), t.compute.end(), [&](const Interval& x) { return x.name == carried; });
    ASSERT_NE(it, t.compute.end()) << "no '" << carried << "' in the trace";
    std::vector<Interval> u1;  // backward compute of u1, micro-batch m, in time order
    for (const Interval& x : t.compute)
      if (x.lane == "compute bwd" && ends_with(x.name, " mb" + std::to_string(m) + " u1")) u1.push_back(x);
    std::sort(u1.begin(), u1.end(), [](const Interval& a, const Interval& b) { return a.begin < b.begin; });
    ASSERT_GE(u1.size(), 2u);
    // On failure, the times (us) involved, so that a rare failure can be read from its log.
    const std::string when = fmt::format("; {} [{:.3f}, {:.3f}], {} [{:.3f}, {:.3f}], {} [{:.3f}, {:.3f}]", carried,
                                         it->begin, it->end, u1[0].name, u1[0].begin, u1[0].end, u1[1].name,
                                         u1[1].begin, u1[1].end);
    if (m + 1 < M) {
      EXPECT_LE(u1[0].end, it->begin) << carried << " ran before '" << u1[0].name << "': it did not leave its pair"
                                      << when;
      EXPECT_LE(it->end, u1[1].begin) << carried << " ran after '" << u1[1].name
                                      << "': not under the next pair's first collective" << when;
    } else {
      EXPECT_LE(it->end, u1[0].begin) << carried << " (backward-only slot) ran after '" << u1[0].name << "'" << when;
    }
  }
}

// dp = 2: the trace also holds every dp bucket reduction (lane "comm dp[0/2]") and every AdamW
// update (lane "compute optimizer"). Oracles: GradSync's contract — one reduction per bucket per
// step, each before that step's update (the update needs the reduced gradients), and buckets
// issued as their gradients complete, so at least one reduction is issued while backward compute
// of the same step is still to run. The issue time (the event's begin minus its queued_us) is
// set by the compute thread in program order; when the comm thread then gets a core is the OS
// scheduler's choice, so actual overlap is only printed (on a loaded 2-core machine about 1 run
// in 20 started every reduction after backward).
// combination: dp si
TEST(SiTrace, DpBucketReductionsAndUpdatesAreTracedAndOverlapBackward) {
  testing::TempDir dir;
  const RunConfig cfg = traced_llama_config(dir, /*dp=*/2, /*tp=*/1);
  size_t buckets = 0;
  bool sparse = false;
  testing::on_local_ranks(cfg, [&](CommContext& comm) {
    Trainer t(cfg, &comm, Quiet::kYes);
    if (comm.rank() == 0) buckets = t.params().buckets().size(), sparse = t.grad_sync().sparse_embedding();
    t.run();
  });
  Lanes t = read_trace(cfg.output.trace + ".rank0");
  ASSERT_GE(buckets, 2u);
  ASSERT_EQ(t.optimizer.size(), static_cast<size_t>(cfg.training.steps));
  // The sparse embedding exchange adds two all-gathers (token ids, rows) per step.
  const size_t gathers = static_cast<size_t>(std::count_if(t.dp.begin(), t.dp.end(), [](const Interval& r) {
    return r.name == "dp.ag.embed.tokens" || r.name == "dp.ag.embed.rows";
  }));
  EXPECT_EQ(gathers, sparse ? 2u * static_cast<size_t>(cfg.training.steps) : 0u);
  t.dp.erase(std::remove_if(t.dp.begin(), t.dp.end(), [](const Interval& r) { return r.name.rfind("dp.ag.", 0) == 0; }),
             t.dp.end());
  ASSERT_EQ(t.dp.size(), buckets * static_cast<size_t>(cfg.training.steps));
  EXPECT_EQ(t.dp.front().lane, "comm dp[0/2]");
  int overlapping = 0, issued_early = 0;
  for (size_t s = 0; s < t.optimizer.size(); ++s) {
    const double step_begin = s == 0 ? 0 : t.optimizer[s - 1].end, update = t.optimizer[s].begin;
    double last_bwd_begin = step_begin;  // the step's last backward compute op
    for (const auto& x : t.compute)
      if (x.lane == "compute bwd" && x.begin >= step_begin && x.end <= update)
        last_bwd_begin = std::max(last_bwd_begin, x.begin);
    for (size_t b = s * buckets; b < (s + 1) * buckets; ++b) {
      const Interval& r = t.dp[b];
      EXPECT_GE(r.issued, step_begin) << r.name << " of step " << s + 1 << " issued before the step";
      EXPECT_LE(r.issued, r.begin) << r.name << ": queued_us is negative";
      EXPECT_LE(r.end, update) << r.name << " of step " << s + 1 << " ends after that step's update began";
      if (r.issued < last_bwd_begin) ++issued_early;
      for (const auto& x : t.compute)
        if (x.lane == "compute bwd" && x.begin >= step_begin && x.end <= update &&
            std::max(r.begin, x.begin) < std::min(r.end, x.end)) {
          ++overlapping;
          break;
        }
    }
  }
  EXPECT_GT(issued_early, 0) << "every dp bucket reduction was issued after the last backward op began";
  std::printf("%d of %zu dp bucket reductions issued before the last backward op, %d ran under backward compute\n",
              issued_early, t.dp.size(), overlapping);
}

// schedule.expose_collectives: every collective is waited for where it is issued. Oracles: the
// arithmetic is unchanged (same ops, same order, only waits move), so losses are bitwise those of
// the normal run; and in its trace no collective interval intersects any compute interval.
// combination: tp
// combination: tp si
TEST(SiTrace, ExposedCollectivesOverlapNothingAndChangeNoLoss) {
  testing::TempDir dir;
  testing::write_synthetic_dataset(dir.path() + "/data", 200, 300, 17);
  for (bool interleave : {false, true}) {
    RunConfig cfg = testing::si_config(dir.path(), "gpt", /*dp=*/1, /*tp=*/2, interleave);
    cfg.training.steps = 3;
    const std::vector<double> normal = testing::run_si(cfg).losses;
    cfg.schedule.expose_collectives = true;
    cfg.output.dir += "_exposed";
    cfg.output.trace = dir.path() + "/exposed.json";
    std::vector<double> exposed;
    testing::on_local_ranks(cfg, [&](CommContext& comm) {
      Trainer t(cfg, &comm, Quiet::kYes);
      std::vector<double> losses;
      for (int64_t s = 0; s < cfg.training.steps; ++s) losses.push_back(t.train_step().loss);
      t.trace()->write(fmt::format("{}.rank{}", cfg.output.trace, comm.rank()));
      if (comm.rank() == 0) exposed = losses;
    });
    ASSERT_EQ(exposed.size(), normal.size());
    for (size_t i = 0; i < normal.size(); ++i)
      EXPECT_EQ(std::memcmp(&exposed[i], &normal[i], sizeof(double)), 0)
          << "SI " << interleave << " step " << i << ": " << exposed[i] << " vs " << normal[i];
    const Lanes t = read_trace(cfg.output.trace + ".rank0");
    ASSERT_FALSE(t.comm.empty());
    for (const auto& c : t.comm)
      for (const auto& x : t.compute)
        EXPECT_FALSE(std::max(c.begin, x.begin) < std::min(c.end, x.end))
            << "SI " << interleave << ": '" << c.name << "' overlaps '" << x.name << "'";
  }
}

}  // namespace
}  // namespace dhelix

namespace dhelix {
namespace {

// A pp = 2 run's trace (the folded W with Strand Interleaving): rank 0's "comm pp[0/2]" lane holds
// every point-to-point transfer of every step, each once. Oracle: the step schedule's transfer list
// for rank 0 (StepSchedule: each slot's sends and receives), named as StepRunner names them
// ("send act mb0 b1 ->r1", "recv grad mb0 b1 <-r1"); the compute lanes hold both strands.
// combination: w si
TEST(SiTrace, PipelineTransfersAreTracedOnTheirOwnLane) {
  testing::TempDir dir;
  testing::write_synthetic_dataset(dir.path() + "/data", 200, 300, 17);
  RunConfig cfg = testing::si_config(dir.path(), "llama", 1, 1, /*interleave=*/true);
  cfg.model.n_layers = 4;
  cfg.parallel.pp = 2;
  cfg.schedule.pipeline = "w";
  cfg.training.micro_batches = 4;
  cfg.training.steps = 2;
  cfg.output.trace = dir.path() + "/trace.json";
  run_local_ranks(layout_config(cfg), [&](CommContext& comm) { Trainer(cfg, &comm, Quiet::kYes).run(); });
  const Lanes t = read_trace(cfg.output.trace + ".rank0");
  const auto& names = t.names;
  EXPECT_NE(std::find(names.begin(), names.end(), "comm pp[0/2]"), names.end()) << "no lane for rank 0's pp group";
  std::multiset<std::string> want, got;
  PipelineSpec spec = pipeline_spec(cfg);
  spec.n_layers = static_cast<int>(cfg.model.n_layers);
  spec.micro_batches = static_cast<int>(cfg.training.micro_batches);
  const StepSchedule sch = make_schedule(spec);
  for (int step = 0; step < cfg.training.steps; ++step)
    for (const Slot& s : sch.ranks.at(0)) {
      for (const Transfer& x : s.sends)
        want.insert(fmt::format("send {} mb{} b{} ->r{}", transfer_kind_name(x.kind), x.mb, x.boundary, x.peer));
      for (const Transfer& x : s.recvs)
        want.insert(fmt::format("recv {} mb{} b{} <-r{}", transfer_kind_name(x.kind), x.mb, x.boundary, x.peer));
    }
  for (const Interval& iv : t.pp) got.insert(iv.name);
  ASSERT_FALSE(want.empty()) << "the schedule has no transfers for rank 0";
  EXPECT_EQ(got, want);
  EXPECT_TRUE(std::any_of(t.compute.begin(), t.compute.end(), [](const Interval& x) { return x.lane == "compute bwd"; }));
}

}  // namespace
}  // namespace dhelix
