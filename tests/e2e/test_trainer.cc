// End-to-end trainer tests on a tiny model and a synthetic dataset.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "TinyRun.h"
#include "base/Error.h"
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

INSTANTIATE_TEST_SUITE_P(Trainer, Families, ::testing::Values("llama", "gpt", "moe"));

// A checkpoint of another shape is rejected with the tensor named, before anything changes.
// `dhelix train` refuses a run by the memory `dhelix tune` reports (one cost vocabulary). Oracle:
// the step model's memory_per_rank for the layout, the batch the config implies (micro-batch size x
// micro-batches x data replicas) and its ZeRO and SI switches; the states and activations
// figures each equal its parts.
TEST(TrainerPreflight, MemoryEstimateIsTheStepModels) {
  TempDir dir;
  RunConfig cfg = tiny_config(dir.path(), "gpt");
  struct Case {
    int64_t dp, tp, pp, x, z;
    bool zero, si;
  };
  for (const Case& k : {Case{1, 1, 1, 1, 1, false, true}, Case{2, 1, 1, 1, 1, true, false},
                        Case{1, 2, 2, 1, 1, false, true}, Case{1, 1, 1, 2, 2, false, true}}) {
    cfg.parallel.dp = k.dp, cfg.parallel.tp = k.tp, cfg.parallel.pp = k.pp;
    cfg.parallel.tp_x = k.x, cfg.parallel.tp_y = 1, cfg.parallel.tp_z = k.z, cfg.parallel.zero = k.zero;
    cfg.schedule.strand_interleaving = k.si;
    const LayoutConfig lay = layout_config(cfg);
    const int64_t mb = cfg.training.micro_batch_size;
    const MemoryUse want =
        memory_per_rank(cfg.model, lay, {mb * cfg.training.micro_batches * lay.data_replicas(), cfg.model.seq_len, mb},
                        Precision::kFp32, k.zero ? Zero::kZero1 : Zero::kNone,
                        k.si ? StrandInterleaving::kOn : StrandInterleaving::kOff);
    const MemoryEstimate got = estimate_rank_memory(cfg);
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
