// End-to-end trainer tests on a tiny model and a synthetic dataset.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <algorithm>
#include <set>

#include "TinyRun.h"
#include "base/Error.h"
#include "kernels/cpu/Bf16.h"
#include "sharding/ModelPrograms.h"
#include "plan/Program.h"
#include "runtime/Env.h"
#include "schedule/Pipelines.h"
#include "sim/LayoutSearch.h"
#include "sim/StepModel.h"
#include "TrainMemory.h"
#include "train/Trainer.h"

namespace dhelix {
namespace {

using testing::TempDir;
using testing::tiny_config;
using testing::write_synthetic_dataset;

std::vector<double> train_losses(const RunConfig& cfg, int64_t steps) {
  Trainer t(cfg, nullptr, Quiet::kYes);
  std::vector<double> out;
  for (int64_t i = 0; i < steps; ++i) out.push_back(t.train_step().loss);
  return out;
}

class Families : public ::testing::TestWithParam<const char*> {};

// Oracle: the uninterrupted run. Save at step k, reload in a fresh trainer, continue to 2k:
// every loss must be bitwise equal (weights, Adam moments, step and data position are restored
// exactly; nothing else carries state).
TEST_P(Families, ResumeContinuesBitwise) {
  TempDir dir;
  write_synthetic_dataset(dir.path() + "/data", 200, 300, 7);
  RunConfig cfg = tiny_config(dir.path(), GetParam());
  const int64_t k = 3;
  std::vector<double> straight = train_losses(cfg, 2 * k);

  std::string ck;
  std::vector<double> resumed;
  {
    Trainer a(cfg, nullptr, Quiet::kYes);
    for (int64_t i = 0; i < k; ++i) resumed.push_back(a.train_step().loss);
    ck = a.save_checkpoint();
  }
  Trainer b(cfg, nullptr, Quiet::kYes);
  b.load_checkpoint(ck);
  EXPECT_EQ(b.step(), k);
  for (int64_t i = 0; i < k; ++i) resumed.push_back(b.train_step().loss);
  ASSERT_EQ(straight.size(), resumed.size());
  for (size_t i = 0; i < straight.size(); ++i) EXPECT_EQ(straight[i], resumed[i]) << "step " << i + 1;
}

// Oracle: the sequential schedule. Strand Interleaving only reorders whole ops between two
// micro-batches; every reduction keeps its order, so losses must be bitwise equal.
// combination: si
TEST_P(Families, InterleavingOnOffBitwiseOverTraining) {
  TempDir dir;
  write_synthetic_dataset(dir.path() + "/data", 200, 300, 9);
  RunConfig on = tiny_config(dir.path(), GetParam());
  on.training.micro_batches = 3;
  RunConfig off = on;
  off.schedule.strand_interleaving = false;
  std::vector<double> a = train_losses(on, 5), b = train_losses(off, 5);
  for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ(a[i], b[i]) << "step " << i + 1;
}

// Oracle: the loss at initialisation is about log(V) (near-uniform predictions); a learnable
// pattern must bring it clearly down within a few dozen steps.
TEST_P(Families, LossFallsOnLearnableData) {
  TempDir dir;
  write_synthetic_dataset(dir.path() + "/data", 200, 300, 11);
  RunConfig cfg = tiny_config(dir.path(), GetParam());
  cfg.training.steps = 40;
  std::vector<double> l = train_losses(cfg, 40);
  EXPECT_NEAR(l.front(), std::log(200.0), 0.5);
  EXPECT_LT(l.back(), l.front() - 1.0);
}

// bf16 GEMMs (training.precision = bf16). Oracles: the fp32 run on the same data and seed, and the
// sequential schedule. SI only reorders whole ops, and each GEMM's bf16 result depends on its own
// operands only, so SI on and off stay bitwise equal. Against fp32: the first loss differs only
// by the forward's rounding (operands at u = 2^-8 relative, fp32 sums) -- within 0.01 nats of a
// loss of log(200) = 5.3; after that the two runs follow different (rounded) updates, so the band
// is on the curve: the means of every 20-step window within 0.2 nats (a step's loss alone swings by
// 0.2-0.4 nats with its micro-batches' contents) and the drop from the first loss to the mean of the
// last 20 within 5% of fp32's (measured: see the test's output). The window gap is chaotic, not a
// bias: over the data seeds 11-15 on a CPU with AMX-BF16 it measured 0.03-0.16 nats for the dense
// families, bf16 ending above fp32 for some seeds and below for others (0.04-0.08 at seed 11 on a
// CPU with AVX512-BF16 only); the drop's 5% is the bias check. MoE's band is 0.25: its top-k
// routing is discrete, so a rounding that moves a token to another expert changes its whole path
// (measured 0.08-0.17 over those seeds).
// combination: si bf16
TEST_P(Families, Bf16InterleavingOnOffBitwise) {
  if (!cpu::bf16_support().usable()) GTEST_SKIP() << "this CPU has neither AMX-BF16 nor AVX512-BF16";
  TempDir dir;
  write_synthetic_dataset(dir.path() + "/data", 200, 300, 9);
  RunConfig on = tiny_config(dir.path(), GetParam());
  on.training.micro_batches = 3;
  on.training.precision = "bf16";
  RunConfig off = on;
  off.schedule.strand_interleaving = false;
  std::vector<double> a = train_losses(on, 5), b = train_losses(off, 5);
  for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ(a[i], b[i]) << "step " << i + 1;
}

// combination: si bf16
TEST_P(Families, Bf16LossTracksFp32) {
  if (!cpu::bf16_support().usable()) GTEST_SKIP() << "this CPU has neither AMX-BF16 nor AVX512-BF16";
  TempDir dir;
  write_synthetic_dataset(dir.path() + "/data", 200, 300, 11);
  RunConfig cfg = tiny_config(dir.path(), GetParam());
  cfg.training.steps = 200;
  const std::vector<double> f = train_losses(cfg, 200);
  cfg.training.precision = "bf16";
  const std::vector<double> h = train_losses(cfg, 200);
  cfg.training.precision = "fp32";
  (void)train_losses(cfg, 1);  // the process's GEMM precision back to fp32 for the tests after
  EXPECT_NE(f, h) << "bf16 changed nothing: its GEMMs did not run";
  EXPECT_NEAR(h.front(), f.front(), 0.01);
  const testing::CurveGap g = testing::curve_gap(f, h);  // by 20-step windows
  const double drop_f = g.drop_ref, drop_h = g.drop;
  std::printf("[ info ] %s: fp32 %.4f -> %.4f, bf16 %.4f -> %.4f (last-20 means); worst 20-step window gap %.4f nats\n",
              GetParam(), f.front(), g.tail_ref, h.front(), g.tail, g.worst);
  EXPECT_LE(g.worst, std::string(GetParam()) == "moe" ? 0.25 : 0.2);
  EXPECT_NEAR(drop_h, drop_f, 0.05 * drop_f);
  EXPECT_GT(drop_f, 1.0);
}

// Activations kept in bf16 (training.bf16_activations, on with bf16). Oracles: the same run with
// them kept in fp32 -- every loss bitwise equal, since each such activation is read in the backward
// only by a weight-gradient GEMM that rounds it to the same bf16 before multiplying -- and the
// activation memory tracker: the peak strictly lower (the tiny model's figures printed).
// combination: si bf16
TEST_P(Families, Bf16SavedActivationsSameResultsLessMemory) {
  if (!cpu::bf16_support().usable()) GTEST_SKIP() << "this CPU has neither AMX-BF16 nor AVX512-BF16";
  TempDir dir;
  write_synthetic_dataset(dir.path() + "/data", 200, 300, 9);
  RunConfig cfg = tiny_config(dir.path(), GetParam());
  cfg.training.precision = "bf16";
  auto run = [&](bool keep16, int64_t* peak) {
    cfg.training.bf16_activations = keep16;
    Trainer t(cfg, nullptr, Quiet::kYes);
    std::vector<double> losses;
    for (int i = 0; i < 4; ++i) {
      const StepReport r = t.train_step();
      losses.push_back(r.loss);
      *peak = std::max(*peak, r.peak_activation_bytes);
    }
    return losses;
  };
  int64_t peak16 = 0, peak32 = 0;
  const std::vector<double> a = run(true, &peak16), b = run(false, &peak32);
  cfg.training.precision = "fp32";
  (void)train_losses(cfg, 1);  // the process's GEMM precision back to fp32 for the tests after
  for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ(a[i], b[i]) << "step " << i + 1;
  std::printf("[ info ] %s: peak activations %lld B with the saved inputs in bf16, %lld B in fp32 (%.3f)\n",
              GetParam(), static_cast<long long>(peak16), static_cast<long long>(peak32), double(peak16) / peak32);
  EXPECT_LT(peak16, peak32);
}

INSTANTIATE_TEST_SUITE_P(Trainer, Families, ::testing::Values("llama", "gpt", "moe"));

// The step's bf16 weight copies (runtime/Env.h). Oracles: to_bf16 of every element, pointer identity
// (a weight is rounded once, however often it is asked for), and the tracker's closed form (2 bytes
// an element while the copies live, nothing after).
TEST(Bf16Weights, RoundsEachWeightOnceAndChargesItsBytes) {
  MemoryTracker states("states");
  Tensor w = Tensor::empty({7, 5}), v = Tensor::empty({3});
  for (int64_t i = 0; i < w.numel(); ++i) w.f32()[i] = 0.1f * float(i) - 1.3f;
  for (int64_t i = 0; i < v.numel(); ++i) v.f32()[i] = 3.7f * float(i + 1);
  {
    Bf16Weights cache(&states);
    const uint16_t* a = cache.get(w);
    EXPECT_EQ(cache.get(w), a);
    const uint16_t* c = cache.get(v);
    EXPECT_NE(c, a);
    for (int64_t i = 0; i < w.numel(); ++i) ASSERT_EQ(a[i], cpu::to_bf16(w.f32()[i])) << i;
    for (int64_t i = 0; i < v.numel(); ++i) ASSERT_EQ(c[i], cpu::to_bf16(v.f32()[i])) << i;
    EXPECT_EQ(states.current(), 2 * (w.numel() + v.numel()));
  }
  EXPECT_EQ(states.current(), 0);
}

// Which activations are kept in bf16 (bf16_saved_buffers on the programs the trainer builds).
// Oracle, by hand from sharding/Lowering1D.cc: the linear layers' inputs whose only backward reader is their
// weight-gradient GEMM -- the norms' outputs h1 and h2 (with tp > 1 their gathered copies h1_g,
// h2_g, which the backward's GEMMs read), the MLP activation act and the head's hf. Not the
// attention output att (attention's backward reads it: D_i = rowsum(dO * O)), nor any buffer a
// norm, an activation function or a collective reads in the backward. Embedding: none.
TEST(Bf16SavedActivations, LinearInputsOnlyTheirWeightGradientReads) {
  TempDir dir;
  for (const char* family : {"gpt", "llama"})
    for (int tp : {1, 2}) {
      RunConfig cfg = tiny_config(dir.path(), family);
      LayoutConfig lay;
      lay.tp = tp;
      lay.sequence_parallel = tp > 1;
      const ModelPrograms progs = build_programs(cfg.model, lay, {cfg.training.micro_batch_size, cfg.model.seq_len});
      auto listed = [](const LayerProgram& p) {
        std::set<std::string> out;
        for (const auto& v : bf16_saved_buffers(p)) out.insert(v.begin(), v.end());
        return out;
      };
      const std::string g = tp > 1 ? "_g" : "";
      const std::set<std::string> block = {"h1" + g, "h2" + g, "act"};
      SCOPED_TRACE(std::string(family) + " tp " + std::to_string(tp));
      EXPECT_EQ(listed(progs.block), block);
      EXPECT_EQ(listed(progs.head), std::set<std::string>{"hf" + g});
      EXPECT_TRUE(listed(progs.embed).empty());
    }
}

// A checkpoint of another shape is rejected with the tensor named, before anything changes.
// `dhelix train` refuses a run by the memory `dhelix tune` reports (one cost vocabulary). Oracle:
// the step model's memory_per_rank for the layout, the batch the config implies (micro-batch size x
// micro-batches x data replicas), its ZeRO and SI switches and the config's pipeline schedule; the
// states and activations figures each equal its parts. The W and interleaved cases are ones whose
// walk differs from 1F1B's (checked), so an estimate that ignored the schedule would fail.
TEST(TrainerPreflight, MemoryEstimateIsTheStepModels) {
  TempDir dir;
  RunConfig cfg = tiny_config(dir.path(), "gpt");
  cfg.model.n_layers = 4;  // two chunks a stage at pp = 2 (the W, interleaved v = 2)
  struct Case {
    int64_t dp, tp, pp, x, z;
    bool zero, si;
    const char* pipeline = "1f1b";
  };
  for (const Case& k : {Case{1, 1, 1, 1, 1, false, true}, Case{2, 1, 1, 1, 1, true, false},
                        Case{1, 2, 2, 1, 1, false, true}, Case{1, 1, 1, 2, 2, false, true},
                        Case{1, 1, 2, 1, 1, false, false, "w"}, Case{1, 1, 2, 1, 1, false, false, "interleaved"}}) {
    cfg.parallel.dp = k.dp, cfg.parallel.tp = k.tp, cfg.parallel.pp = k.pp;
    cfg.parallel.tp_x = k.x, cfg.parallel.tp_y = 1, cfg.parallel.tp_z = k.z, cfg.parallel.zero = k.zero;
    cfg.schedule.strand_interleaving = k.si;
    cfg.schedule.pipeline = k.pipeline;
    cfg.schedule.virtual_stages = std::string(k.pipeline) == "interleaved" ? 2 : 1;
    cfg.training.micro_batches = k.pp > 1 ? 4 : 2;
    const LayoutConfig lay = layout_config(cfg);
    const int64_t mb = cfg.training.micro_batch_size;
    const BatchSpec batch{mb * cfg.training.micro_batches * lay.data_replicas(), cfg.model.seq_len, mb};
    const StepSchedule sch = make_schedule(pipeline_spec(cfg));
    const Zero zero = k.zero ? Zero::kZero1 : Zero::kNone;
    const StrandInterleaving si = k.si ? StrandInterleaving::kOn : StrandInterleaving::kOff;
    const MemoryUse want = memory_per_rank(cfg.model, lay, batch, Precision::kFp32, zero, si, nullptr, &sch);
    const MemoryEstimate got = estimate_rank_memory(cfg);
    if (std::string(k.pipeline) != "1f1b") {  // the case tells the schedules apart
      EXPECT_NE(want.activations, memory_per_rank(cfg.model, lay, batch, Precision::kFp32, zero, si).activations)
          << k.pipeline;
    }
    EXPECT_DOUBLE_EQ(got.states, want.params + want.grads + want.optimizer) << layout_label(lay);
    EXPECT_DOUBLE_EQ(got.activations, want.activations + want.gathered) << layout_label(lay);
    EXPECT_GT(want.activations, 0) << layout_label(lay);
    if (k.z > 1) {
      EXPECT_GT(want.gathered, 0) << layout_label(lay);
    }
  }
}

TEST(TrainerCheckpoint, MismatchedShapeIsRejected) {
  TempDir dir;
  write_synthetic_dataset(dir.path() + "/data", 200, 100, 3);
  RunConfig cfg = tiny_config(dir.path(), "llama");
  std::string ck;
  {
    Trainer a(cfg, nullptr, Quiet::kYes);
    a.train_step();
    ck = a.save_checkpoint();
  }
  RunConfig other = cfg;
  other.model.d_model = 32;
  Trainer b(other, nullptr, Quiet::kYes);
  try {
    b.load_checkpoint(ck);
    FAIL() << "loading a d_model=64 checkpoint into d_model=32 succeeded";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("model.embed_tokens.weight"), std::string::npos) << e.what();
  }
}

TEST(TrainerCheckpoint, TruncatedCheckpointIsRejected) {
  TempDir dir;
  write_synthetic_dataset(dir.path() + "/data", 200, 100, 5);
  RunConfig cfg = tiny_config(dir.path(), "gpt");
  Trainer a(cfg, nullptr, Quiet::kYes);
  a.train_step();
  std::string ck = a.save_checkpoint();
  std::string f = ck + "/model.safetensors";
  auto size = std::filesystem::file_size(f);
  std::filesystem::resize_file(f, size / 2);
  EXPECT_THROW(a.load_checkpoint(ck), IoError);
}

}  // namespace
}  // namespace dhelix
