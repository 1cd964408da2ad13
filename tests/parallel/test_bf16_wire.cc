// Activation collectives in bf16 (comm.precision, RunContext::activation_wire), on threads-as-ranks.
// Oracles: (1) the single-process fp32 run: a layout whose activations cross the wire in bf16 must
// train like it within the bound below, and must not equal the same layout's fp32-wire run bitwise
// (the rounding did happen); (2) Strand Interleaving on vs off with the bf16 wire: bitwise equal
// (SI only reorders whole ops; each collective rounds the same values the same way); (3) the bytes
// the comm layer counts: the activation collectives move exactly half their fp32 bytes and nothing
// else changes (test_comm_volume.cc covers the fp32 bytes against the model).
// The data-parallel gradient buckets in bf16 (comm.grad_precision) against the same three oracles:
// serial within kWireLossRelTol (each bucket element rounded once before the wire and once per ring
// hop, the same 2^-9 per rounding; measured 6.5e-6 to 2.1e-5 over 20 steps at dp 2, ZeRO-1 and tp 2 x
// dp 2), SI on vs off bitwise, and exactly half the dp
// bytes with every other group unchanged.
//
// Tolerance of (1): rounding to bf16 keeps 8 significant bits, a relative error of at most 2^-9
// (1.95e-3) per element per hop; the loss is a mean over 4,096 tokens of a smooth function of the
// rounded activations, so independent roundings average out and it moves far less than 2^-9 of its
// value. Measured on these shapes over 20 steps (the tests print it; the runs are deterministic):
// 6.2e-5 (Llama tp 2), 8.9e-5 (GPT tp 2), 1.6e-4 (MoE tp 2), 7.6e-6 (Llama cp 2), 5.0e-5 (Llama on a
// 2 x 2 x 1 grid), against 1e-8 with the fp32 wire. The bound, kWireLossRelTol = 1e-3, is ~6x the
// largest and half of 2^-9, and 10x below what a real bug moves the loss by (> 1e-2:
// ParallelHarness.h).
#include <fmt/format.h>
#include <gtest/gtest.h>

#include "../train/TempDir.h"
#include "ParallelHarness.h"
#include "sharding/ModelPrograms.h"
#include "sim/LayoutSearch.h"
#include "sim/StepModel.h"
#include "train/Trainer.h"

namespace dhelix::testing {
namespace {

constexpr double kWireLossRelTol = 1e-3;

// combination: tp si
// combination: cp si
// combination: 3d si
TEST(Bf16Wire, LayoutsTrackTheSerialRun) {
  TempDir dir;
  const std::string prefix = write_walk_dataset(dir.path());
  struct Case {
    const char* name;
    RunConfig cfg;
    RunConfig serial;
  };
  std::vector<Case> cases;
  for (ModelFamily f : {ModelFamily::kLlama, ModelFamily::kGPT, ModelFamily::kMoE})
    cases.push_back({family_name(f), tiny_config(f, 1, 2, 0, prefix, dir / "tp2"),
                     tiny_config(f, 1, 1, 0, prefix, dir / "serial")});
  {
    RunConfig cp = tiny_config(ModelFamily::kLlama, 1, 1, 0, prefix, dir / "cp2");
    cp.parallel.cp = 2;
    cases.push_back({"llama cp2", cp, tiny_config(ModelFamily::kLlama, 1, 1, 0, prefix, dir / "serial")});
    cases.push_back({"llama 3D 2x2x1", tiny_config_3d(ModelFamily::kLlama, 1, 2, 2, 1, prefix, dir / "3d"),
                     tiny_config_3d(ModelFamily::kLlama, 1, 1, 1, 1, prefix, dir / "serial3d")});
  }
  for (Case& c : cases) {
    const RunResult serial = run_serial(c.serial);
    c.cfg.comm.precision = "fp32";
    const RunResult fp32 = run_local(c.cfg);
    c.cfg.comm.precision = "bf16";
    const RunResult bf16 = run_local(c.cfg);
    const double dev = max_rel_deviation(bf16.losses, serial.losses);
    fmt::print("[measured] {}: bf16 wire, 20-step max rel loss dev {:.2e} (fp32 wire {:.2e}); loss {:.4f} -> {:.4f}\n",
               c.name, dev, max_rel_deviation(fp32.losses, serial.losses), serial.losses.front(), serial.losses.back());
    EXPECT_LE(dev, kWireLossRelTol) << c.name;
    EXPECT_NE(bf16.losses, fp32.losses) << c.name << ": the bf16 wire changed nothing; was anything rounded?";
    EXPECT_LT(serial.losses.back(), serial.losses.front() - 0.1) << c.name;
  }
}

// combination: tp si
TEST(Bf16Wire, StrandInterleavingOnOffBitwise) {
  TempDir dir;
  const std::string prefix = write_walk_dataset(dir.path());
  for (ModelFamily f : {ModelFamily::kLlama, ModelFamily::kGPT}) {
    RunConfig on = tiny_config(f, 1, 2, 0, prefix, dir / "on");
    on.comm.precision = "bf16";
    on.training.micro_batches = 3;
    on.schedule.strand_interleaving = true;
    EXPECT_EQ(si_on_off_difference(on, dir / "off"), "") << family_name(f);
  }
}

// The half by hand: per group, the fp32 ring bytes of the program's activation collectives (every
// unit's forward and backward, every micro-batch), halved; the other collectives (loss statistics,
// norm statistics, partial gradients, data-parallel buckets) unchanged.
// combination: dp tp si
// combination: 3d si
TEST(Bf16Wire, ActivationCollectivesMoveHalfTheirBytes) {
  TempDir dir;
  const std::string prefix = write_walk_dataset(dir.path());
  std::vector<RunConfig> cfgs = {tiny_config(ModelFamily::kLlama, 2, 2, 0, prefix, dir / "m", 2, 8),
                                 tiny_config_3d(ModelFamily::kGPT, 1, 2, 2, 1, prefix, dir / "g")};
  for (RunConfig& cfg : cfgs) {
    cfg.parallel.sparse_embed_grad = false;
    const LayoutConfig lay = layout_config(cfg);
    const ModelPrograms progs = build_programs(cfg.model, lay, {cfg.training.micro_batch_size, cfg.model.seq_len});
    std::map<std::string, double> act;  // fp32 ring bytes of the activation collectives, per group
    const double units[3] = {1, double(cfg.model.n_layers), 1};
    const LayerProgram* ps[3] = {&progs.embed, &progs.block, &progs.head};
    for (int i = 0; i < 3; ++i)
      for (const auto* ops : {&ps[i]->fwd, &ps[i]->bwd})
        for (const Op& o : *ops)
          if (o.is_collective() && o.flag("activation")) {
            const int n = o.group == "tp" ? lay.tp : o.group == "x" ? lay.tp_x : lay.tp_y;
            act[o.group] += units[i] * double(cfg.training.micro_batches) * ring_bytes(o.coll, o.cost.comm_bytes, n);
          }
    ASSERT_FALSE(act.empty());
    cfg.comm.precision = "fp32";
    const std::map<std::string, double> full = counted_step_bytes(cfg);
    cfg.comm.precision = "bf16";
    const std::map<std::string, double> half = counted_step_bytes(cfg);
    for (const auto& [g, bytes] : full) {
      const double want = bytes - (act.count(g) ? act[g] / 2 : 0.0);
      fmt::print("[measured] {} {}: fp32 wire {:.0f} B, bf16 wire {:.0f} B (by hand {:.0f} B)\n", layout_label(lay), g,
                 bytes, half.at(g), want);
      EXPECT_NEAR(half.at(g), want, 1e-12 * want) << layout_label(lay) << " group " << g;
    }
  }
}

// comm.grad_precision = bf16: dp 2 (plain and ZeRO-1) and tp 2 x dp 2 train like the serial run
// (kWireLossRelTol, derivation above) and differ from the fp32-gradient run.
// combination: dp si
// combination: dp si zero1
// combination: dp tp si
TEST(Bf16Wire, DataParallelGradientsTrackTheSerialRun) {
  TempDir dir;
  const std::string prefix = write_walk_dataset(dir.path());
  struct Case {
    std::string name;
    RunConfig cfg, serial;
  };
  std::vector<Case> cases;
  for (ModelFamily f : {ModelFamily::kLlama, ModelFamily::kGPT})
    for (int zero : {0, 1})
      cases.push_back({fmt::format("{} dp2 zero{}", family_name(f), zero), tiny_config(f, 2, 1, zero, prefix, dir / "dp"),
                       tiny_config(f, 1, 1, 0, prefix, dir / "serial")});
  cases.push_back({"llama tp2 dp2", tiny_config(ModelFamily::kLlama, 2, 2, 0, prefix, dir / "tpdp"),
                   tiny_config(ModelFamily::kLlama, 1, 1, 0, prefix, dir / "serial")});
  for (Case& c : cases) {
    const RunResult ref = run_serial(c.serial);
    const RunResult fp32 = run_local(c.cfg);
    c.cfg.comm.grad_precision = "bf16";
    const RunResult bf16 = run_local(c.cfg);
    const double dev = max_rel_deviation(bf16.losses, ref.losses);
    fmt::print("[measured] {}: bf16 gradients, 20-step max rel loss dev {:.2e} (fp32 gradients {:.2e})\n", c.name, dev,
               max_rel_deviation(fp32.losses, ref.losses));
    EXPECT_LE(dev, kWireLossRelTol) << c.name;
    EXPECT_NE(bf16.losses, fp32.losses) << c.name << ": bf16 gradients changed nothing; was anything rounded?";
  }
}

// combination: dp tp si zero1
TEST(Bf16Wire, DataParallelGradientsStrandInterleavingOnOffBitwise) {
  TempDir dir;
  const std::string prefix = write_walk_dataset(dir.path());
  RunConfig on = tiny_config(ModelFamily::kLlama, 2, 2, 1, prefix, dir / "on");
  on.comm.grad_precision = "bf16";
  on.training.micro_batches = 3;
  on.schedule.strand_interleaving = true;
  EXPECT_EQ(si_on_off_difference(on, dir / "off"), "");
}

// Exactly half the dp group's bytes (the buckets are all it carries with the sparse embedding
// exchange off), every other group's unchanged: counted by the comm layer, fp32 vs bf16 gradients.
// combination: dp tp si
// combination: dp tp si zero1
TEST(Bf16Wire, DataParallelGradientsMoveHalfTheirBytes) {
  TempDir dir;
  const std::string prefix = write_walk_dataset(dir.path());
  for (int zero : {0, 1}) {
    RunConfig cfg = tiny_config(ModelFamily::kGPT, 2, 2, zero, prefix, dir / "g");
    cfg.parallel.sparse_embed_grad = false;
    const std::map<std::string, double> full = counted_step_bytes(cfg);
    cfg.comm.grad_precision = "bf16";
    const std::map<std::string, double> half = counted_step_bytes(cfg);
    ASSERT_TRUE(full.count("dp")) << "no dp traffic counted";
    for (const auto& [g, bytes] : full) {
      const double want = g == "dp" ? bytes / 2 : bytes;
      fmt::print("[measured] zero {} {}: fp32 gradients {:.0f} B, bf16 gradients {:.0f} B\n", zero, g, bytes, half.at(g));
      EXPECT_EQ(half.at(g), want) << "zero " << zero << " group " << g;
    }
  }
}

}  // namespace
}  // namespace dhelix::testing
