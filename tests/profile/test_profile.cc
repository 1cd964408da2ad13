// Profiler and planner tests: the whole flow profile -> search -> validation -> plan file ->
// training, on a tiny model with tp = 2 on threads-as-ranks (so the programs hold collectives).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <mutex>

#include "../e2e/TinyRun.h"
#include "../plan/ClusterTestUtil.h"
#include "base/Error.h"
#include "comm/LocalBackend.h"
#include "kernels/cpu/Bf16.h"
#include "kernels/cpu/Kernels.h"
#include "plan/PlanCheck.h"
#include "plan/PlanIO.h"
#include "profile/PlanValidation.h"
#include "profile/Profiler.h"
#include "sim/CostModel.h"
#include "train/Trainer.h"

namespace dhelix {
namespace {

using testing::TempDir;
using testing::tiny_config;
using testing::write_synthetic_dataset;

// The bench's run from seed `seed`: GEMM precision and activation wire as given (the default: fp32).
LayerPairRun bench_run(uint64_t seed, cpu::GemmPrecision gemm = cpu::GemmPrecision::kFp32,
                       WirePrecision wire = WirePrecision::kFp32) {
  LayerPairRun r;
  r.seed = seed;
  r.gemm = gemm;
  r.activation_wire = wire;
  return r;
}

LayoutConfig tp_layout(int tp) {
  LayoutConfig l;
  l.tp = tp;
  l.sequence_parallel = tp > 1;
  return l;
}

MicroBatchShape mb_of(const RunConfig& c) { return {c.training.micro_batch_size, c.model.seq_len}; }

// Every rule of check_plan, and the segment rule the search promises (the runtime's default
// plan may extend a collective's window over independent compute, so it is exempt from that one).
void expect_legal(const SIPlan& p, const LayerProgram& prog) {
  for (const auto& v : find_violations(p, prog)) ADD_FAILURE() << p.source << ": " << v.message();
  if (p.source != "default" && p.source != "cover") {
    EXPECT_TRUE(windows_within_segments(p, prog)) << p.source;
  }
}

// Each of the layout's ranks (threads-as-ranks): the layer pair's profile, then the search of the top
// 3 plans validated on the bench (one timing round, no warm-up).
struct Flow {
  Profile profile;
  PlanChoice choice;
};
std::vector<Flow> profile_and_search(const RunConfig& cfg, const LayoutConfig& lay, const MicroBatchShape& mb) {
  std::vector<Flow> flows(static_cast<size_t>(lay.world()));
  run_local_ranks(lay, [&](CommContext& comm) {
    LayerPairBench bench(cfg.model, lay, mb, &comm, bench_run(7));
    ProfileOptions po;
    po.timing = {0, 1};
    Flow& f = flows[static_cast<size_t>(comm.rank())];
    f.profile = profile_layer_pair(bench, cfg.model, lay, &comm, po);
    SearchOptions so;
    so.top_k = 3;
    f.choice = search_and_validate(bench.program(), f.profile, so, &bench, {0, 1});
  });
  return flows;
}

std::vector<double> train_losses(const RunConfig& cfg, const LayoutConfig& lay, int steps) {
  std::vector<double> losses;
  std::mutex mu;
  run_local_ranks(lay, [&](CommContext& comm) {
    Trainer t(cfg, &comm, Quiet::kYes);
    std::vector<double> mine;
    for (int i = 0; i < steps; ++i) mine.push_back(t.train_step().loss);
    if (comm.rank() == 0) {
      std::lock_guard<std::mutex> g(mu);
      losses = mine;
    }
  });
  return losses;
}

// Oracle: the sequential schedule (Strand Interleaving off). A searched plan only regroups whole
// ops of two micro-batches into blocks; every reduction keeps its order, so the losses of
// training with it must be bitwise equal to the sequential run's. The profile itself is checked
// for completeness (every window and legal pair priced, identical on both ranks), and every plan
// the flow emits must pass check_plan.
// combination: tp si
TEST(ProfilePlanTrain, SearchedPlanTrainsBitwiseLikeSequentialTp2) {
  TempDir dir;
  write_synthetic_dataset(dir.path() + "/data", 200, 300, 13);
  RunConfig cfg = tiny_config(dir.path(), "llama");
  cfg.training.micro_batches = 3;
  cfg.parallel.tp = 2;
  const LayoutConfig lay = tp_layout(2);
  const std::string plan_path = dir.path() + "/plan.json", profile_path = dir.path() + "/profile.json";

  const std::vector<Flow> flows = profile_and_search(cfg, lay, mb_of(cfg));
  const LayerProgram prog = build_programs(cfg.model, lay, mb_of(cfg)).block;
  flows[0].profile.save(profile_path);
  // The search's best plan, or, should that be the default plan, the next search plan (the point
  // is to train with a plan the search made).
  const SIPlan def = block_default_plan(prog);
  for (const auto& k : flows[0].choice.candidates)
    if (k.plan.blocks != def.blocks) {
      save_plan(plan_path, k.plan, prog);
      break;
    }
  ASSERT_TRUE(std::any_of(prog.fwd.begin(), prog.fwd.end(), [](const Op& o) { return o.is_collective(); }));
  const Profile& p = flows[0].profile;
  EXPECT_EQ(p.num_solo_fwd(), strand_windows(prog.fwd, WindowRule::kWithinSegments).size());
  EXPECT_EQ(p.num_solo_bwd(), strand_windows(prog.bwd, WindowRule::kWithinSegments).size());
  EXPECT_EQ(p.num_pairs(), legal_pairs(prog, WindowRule::kWithinSegments).size());
  EXPECT_EQ(p.to_json(), flows[1].profile.to_json()) << "ranks disagree on the agreed (max) times";
  EXPECT_NO_THROW(check_profile_fits(Profile::load(profile_path), cfg.model, lay, mb_of(cfg), prog,
                                     describe_precision(bench_run(7))));

  // Both ranks kept the same plan (timings are agreed), and every candidate is legal.
  EXPECT_EQ(flows[0].choice.chosen, flows[1].choice.chosen);
  EXPECT_EQ(flows[0].choice.plan().blocks, flows[1].choice.plan().blocks);
  ASSERT_GE(flows[0].choice.candidates.size(), 2u);
  for (const auto& k : flows[0].choice.candidates) {
    expect_legal(k.plan, prog);
    EXPECT_GT(k.measured_s, 0) << k.plan.source;
  }
  const SIPlan searched = load_plan(plan_path, prog);
  // Made by the search ("search+validated" when that candidate also won the timed validation,
  // which depends on the machine's timings).
  EXPECT_TRUE(searched.source == "search" || searched.source == "search+validated") << searched.source;
  EXPECT_NE(searched.blocks, block_default_plan(prog).blocks);

  RunConfig with_plan = cfg;
  with_plan.schedule.plan = plan_path;
  RunConfig sequential = cfg;
  sequential.schedule.strand_interleaving = false;
  const std::vector<double> a = train_losses(with_plan, lay, 3), b = train_losses(sequential, lay, 3);
  ASSERT_EQ(a.size(), 3u);
  ASSERT_EQ(b.size(), 3u);
  for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ(a[i], b[i]) << "step " << i + 1;
}

// The same flow on a context-parallel layer (cp = 2: the ring attention's steps and their
// send_recv collectives, whose compute ops update buffers in place, which the bench's windows must
// restore). Oracle: the sequential schedule, bitwise, as above; every candidate passes check_plan.
// combination: cp si
TEST(ProfilePlanTrain, SearchedPlanTrainsBitwiseLikeSequentialCp2) {
  TempDir dir;
  write_synthetic_dataset(dir.path() + "/data", 200, 300, 13);
  RunConfig cfg = tiny_config(dir.path(), "llama");
  cfg.training.micro_batches = 3;
  cfg.parallel.cp = 2;
  LayoutConfig lay;
  lay.cp = 2;
  const MicroBatchShape mb{cfg.training.micro_batch_size, cfg.model.seq_len / 2};
  const std::string plan_path = dir.path() + "/plan.json";
  const std::vector<Flow> flows = profile_and_search(cfg, lay, mb);
  const LayerProgram prog = build_programs(cfg.model, lay, mb).block;
  save_plan(plan_path, flows[0].choice.plan(), prog);
  ASSERT_TRUE(std::any_of(prog.bwd.begin(), prog.bwd.end(), [](const Op& o) { return o.group == "cp"; }));
  EXPECT_EQ(flows[0].choice.plan().blocks, flows[1].choice.plan().blocks);
  for (const auto& k : flows[0].choice.candidates) expect_legal(k.plan, prog);
  RunConfig with_plan = cfg;
  with_plan.schedule.plan = plan_path;
  RunConfig sequential = cfg;
  sequential.schedule.strand_interleaving = false;
  const std::vector<double> a = train_losses(with_plan, lay, 3), b = train_losses(sequential, lay, 3);
  ASSERT_EQ(a.size(), 3u);
  ASSERT_EQ(b.size(), 3u);
  for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ(a[i], b[i]) << "step " << i + 1;
}

// Oracle: the profile's identity strings and op lists. A profile measured for tp = 2 is refused
// for a tp = 1 run and for another d_model, with the mismatched fields named.
TEST(ProfilePlanTrain, ProfileOfAnotherRunIsRefused) {
  TempDir dir;
  RunConfig cfg = tiny_config(dir.path(), "gpt");
  const LayoutConfig lay2 = tp_layout(2), lay1 = tp_layout(1);
  const auto mb = mb_of(cfg);
  Profile p;
  p.describe_program(build_programs(cfg.model, lay2, mb).block);
  p.meta.model = describe_model(cfg.model);
  p.meta.layout = describe_layout(lay2);
  p.meta.shapes = describe_shapes(mb);
  const std::string fp32 = describe_precision(bench_run(1));
  const std::string bf16 = describe_precision(bench_run(1, cpu::GemmPrecision::kBf16, WirePrecision::kBf16));
  EXPECT_EQ(fp32, "fp32 GEMMs, fp32 wire");
  EXPECT_EQ(bf16, "bf16 GEMMs, bf16 wire");
  // A profile written before meta.precision (none recorded) is not checked for it.
  EXPECT_NO_THROW(check_profile_fits(p, cfg.model, lay2, mb, build_programs(cfg.model, lay2, mb).block, bf16));
  p.meta.precision = fp32;
  EXPECT_NO_THROW(check_profile_fits(p, cfg.model, lay2, mb, build_programs(cfg.model, lay2, mb).block, fp32));
  try {
    check_profile_fits(p, cfg.model, lay2, mb, build_programs(cfg.model, lay2, mb).block, bf16);
    FAIL() << "an fp32 profile was accepted for a bf16 run";
  } catch (const PlanError& e) {
    EXPECT_NE(std::string(e.what()).find("precision: profile has 'fp32 GEMMs, fp32 wire', this run is 'bf16 GEMMs, "
                                         "bf16 wire'"), std::string::npos) << e.what();
  }
  try {
    check_profile_fits(p, cfg.model, lay1, mb, build_programs(cfg.model, lay1, mb).block, fp32);
    FAIL() << "a tp=2 profile was accepted for tp=1";
  } catch (const PlanError& e) {
    EXPECT_NE(std::string(e.what()).find("layout"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("ops"), std::string::npos) << e.what();
  }
  ModelConfig wider = cfg.model;
  wider.d_model = 128;
  try {
    check_profile_fits(p, wider, lay2, mb, build_programs(wider, lay2, mb).block, fp32);
    FAIL() << "a d_model=64 profile was accepted for d_model=128";
  } catch (const PlanError& e) {
    EXPECT_NE(std::string(e.what()).find("model"), std::string::npos) << e.what();
  }
}

// Oracle: check_plan. Every plan the flow emits with a cost model (top-k candidates and the
// default), for the papers' shapes and layouts, keeps every plan rule and the segment rule.
// With a simulator the search's candidates come in the simulator's order, top_k of three times as
// many, each with its simulated time (the default plan appended last when the search did not find
// it). Oracle: a stand-in simulator whose order is known (more blocks = slower) and the
// unsimulated search of 3 top_k plans: the kept plans are its fewest-block ones.
// The bench runs the pair as the run's precision would (LayerPairRun, from training.precision and
// comm.precision): before, `dhelix profile --training.precision bf16` timed fp32 GEMMs and an fp32
// wire. Oracles, on tp = 2 ranks (threads) from the same seed:
//  - bf16 wire: the activation all-gather's output is the bf16 rounding of the fp32 wire's, element
//    for element (the wire moves each rank's rounded rows; rounding commutes with concatenation);
//  - bf16 GEMMs: the QKV projection's output differs from the fp32 GEMMs' and stays within 2% of it
//    in norm (bf16 keeps 8 significant bits of each input: 2^-8 relative per product, 2x for two
//    rounded factors, summed in fp32);
//  - fp32 everywhere (the default) repeats the same values bitwise.
TEST(ProfilePlanTrain, TheBenchRunsTheRunsGemmPrecisionAndWire) {
  if (!cpu::bf16_support().usable()) GTEST_SKIP() << "this CPU has no bf16 GEMMs (AMX-BF16 / AVX512-BF16)";
  TempDir dir;
  const RunConfig cfg = tiny_config(dir.path(), "llama");
  const LayoutConfig lay = tp_layout(2);
  const auto mb = mb_of(cfg);
  const std::vector<LayerPairRun> runs = {bench_run(7), bench_run(7),
                                          bench_run(7, cpu::GemmPrecision::kFp32, WirePrecision::kBf16),
                                          bench_run(7, cpu::GemmPrecision::kBf16, WirePrecision::kFp32)};
  const ModelPrograms progs = build_programs(cfg.model, lay, mb);
  const LayerProgram& prog = progs.block;
  auto index_of = [&](const std::string& name) {
    for (size_t i = 0; i < prog.fwd.size(); ++i)
      if (prog.fwd[i].name == name) return static_cast<int>(i);
    ADD_FAILURE() << "no forward op " << name;
    return 0;
  };
  const int gather = index_of("tp.ag.attn.qkv"), qkv = index_of("attn.qkv");
  const std::string gathered = prog.fwd[static_cast<size_t>(gather)].outputs.at(0);
  const std::string projected = prog.fwd[static_cast<size_t>(qkv)].outputs.at(0);
  std::vector<std::vector<float>> g(runs.size()), q(runs.size());  // rank 0's
  for (size_t r = 0; r < runs.size(); ++r)
    run_local_ranks(lay, [&](CommContext& comm) {
      LayerPairBench bench(cfg.model, lay, mb, &comm, runs[r]);
      if (comm.rank() != 0) return;
      const Tensor& a = bench.forward_state(gather + 1).at(gathered);
      const Tensor& b = bench.forward_state(qkv + 1).at(projected);
      g[r].assign(a.f32(), a.f32() + a.numel());
      q[r].assign(b.f32(), b.f32() + b.numel());
    });
  EXPECT_EQ(g[0], g[1]);
  EXPECT_EQ(q[0], q[1]);
  ASSERT_EQ(g[2].size(), g[0].size());
  std::vector<uint16_t> rounded(g[0].size());
  cpu::round_to_bf16(g[0].data(), rounded.data(), static_cast<int64_t>(g[0].size()));
  size_t differ = 0;
  for (size_t i = 0; i < g[0].size(); ++i) {
    const uint32_t bits = uint32_t{rounded[i]} << 16;
    float want;
    std::memcpy(&want, &bits, sizeof want);
    ASSERT_EQ(g[2][i], want) << "element " << i;
    differ += g[2][i] != g[0][i];
  }
  EXPECT_GT(differ, g[0].size() / 2) << "the bf16 wire moved the fp32 values";
  ASSERT_EQ(q[3].size(), q[0].size());
  double num = 0, den = 0;
  for (size_t i = 0; i < q[0].size(); ++i) num += (q[3][i] - q[0][i]) * (q[3][i] - q[0][i]), den += q[0][i] * q[0][i];
  EXPECT_GT(num, 0) << "bf16 GEMMs gave the fp32 GEMMs' bits";
  EXPECT_LT(std::sqrt(num / den), 0.02);
}

TEST(ProfilePlanTrain, ASimulatorRanksTheCandidates) {
  const ModelConfig m = model_preset("gpt2-124m");
  const LayoutConfig lay = tp_layout(2);
  const LayerProgram prog = build_programs(m, lay, {4, 1024}).block;
  CostModel cost(prog, test::cluster_cost_model("cpu-emulated", lay));
  SearchOptions so;
  so.top_k = 3;
  const PlanSimulator by_blocks = [](const SIPlan& p) { return double(p.blocks.size()); };
  const PlanChoice ch = search_and_validate(prog, cost, so, nullptr, {}, kDefaultMinGain, by_blocks);
  SearchOptions wide = so;
  wide.top_k = 9;
  const PlanChoice all = search_and_validate(prog, cost, wide, nullptr, {});
  std::vector<double> sizes;
  for (const auto& k : all.candidates)
    if (k.plan.source == "search") sizes.push_back(double(k.plan.blocks.size()));
  std::sort(sizes.begin(), sizes.end());
  std::vector<double> kept;
  for (const auto& k : ch.candidates) {
    EXPECT_EQ(k.simulated_s, double(k.plan.blocks.size()));
    if (k.plan.source == "search") kept.push_back(k.simulated_s);
  }
  ASSERT_EQ(kept.size(), 3u);
  EXPECT_TRUE(std::is_sorted(kept.begin(), kept.end()));
  EXPECT_EQ(kept, std::vector<double>(sizes.begin(), sizes.begin() + 3));
  // Unvalidated, the kept plan is the simulator's fastest, the default plan included: a stand-in
  // that prices the default below every searched plan makes it the kept one.
  for (size_t i = 0; i < ch.candidates.size(); ++i)
    EXPECT_LE(ch.candidates[static_cast<size_t>(ch.chosen)].simulated_s, ch.candidates[i].simulated_s);
  const PlanSimulator default_fastest = [](const SIPlan& p) { return p.source == "default" ? 1.0 : 2.0; };
  const PlanChoice d = search_and_validate(prog, cost, so, nullptr, {}, kDefaultMinGain, default_fastest);
  EXPECT_EQ(d.candidates.at(static_cast<size_t>(d.chosen)).plan.source, "default");
}

TEST(ProfilePlanTrain, EveryEmittedPlanPassesCheckPlan) {
  struct Case {
    const char* preset;
    int tp;
    int64_t B, T;
    const char* hw;
  };
  for (const Case& c : {Case{"llama-70b", 8, 1, 4096, "h100-8gpu"}, Case{"gpt2-124m", 2, 4, 1024, "cpu-emulated"},
                        Case{"llama-8b", 4, 2, 2048, "a40-pcie"}, Case{"gpt2-124m", 1, 1, 256, "perlmutter-a100"}}) {
    SCOPED_TRACE(c.preset);
    ModelConfig m = model_preset(c.preset);
    const LayoutConfig lay = tp_layout(c.tp);
    const LayerProgram prog = build_programs(m, lay, {c.B, c.T}).block;
    CostModel cost(prog, test::cluster_cost_model(c.hw, lay));
    SearchOptions so;
    so.top_k = 5;
    so.max_window = c.tp == 1 ? 4 : 0;
    PlanChoice ch = search_and_validate(prog, cost, so, nullptr, {});
    ASSERT_FALSE(ch.candidates.empty());
    EXPECT_EQ(ch.chosen, 0);
    for (const auto& k : ch.candidates) {
      expect_legal(k.plan, prog);
      EXPECT_EQ(k.measured_s, 0);
      // (The default plan may use windows longer than max_window, so only search plans compare.)
      if (k.plan.source == "search") {
        EXPECT_LE(ch.candidates.front().predicted_s, k.predicted_s) << "the search's best is not the cheapest";
      }
    }
  }
}

}  // namespace
}  // namespace dhelix
