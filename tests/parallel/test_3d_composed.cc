// AxoNN's 3D grid composed with the other axes, on threads-as-ranks: pipelines (1F1B, interleaved
// and the folded W, Strand Interleaving on and off), context parallelism (CP's ring over each grid
// rank's heads), ZeRO-1, and the MoE family with and without expert parallelism. Oracle: the single-process run of the same model on the same global
// batches (the grid's data replicas read their windows of each global micro-batch, as dp ranks do;
// pipeline stages and cp ranks read the same sequences). Tolerances: ParallelHarness.h (kGradRelTol,
// kLossRelTol): the grid regroups the fp32 sums TP and DP do, the ring merges each query row's
// softmax over cp key blocks, and a pipeline reorders nothing in an untied model -- the bounds are
// the ones test_3d_equals_serial.cc and test_context_parallel.cc hold each axis to alone. ZeRO-1
// holds reduced gradients only in chunks: its step-1 gradients are not compared, its losses are.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include "../train/TempDir.h"
#include "ParallelHarness.h"
#include "schedule/Pipelines.h"

namespace dhelix::testing {
namespace {

struct Composed {
  const char* name;
  ModelFamily family;
  int gx, gy, gz, dp, pp, cp;
  PipelineKind kind;
  bool si;
  int zero;
  int ep = 1;  // expert parallelism (the MoE family), carved out of dp
  Recompute recompute = Recompute::kNone;
};

RunConfig config(const Composed& c, const std::string& prefix, const std::string& out) {
  RunConfig r = tiny_config_3d(c.family, c.dp, c.gx, c.gy, c.gz, prefix, out);
  r.model.n_layers = 4;  // the W at pp = 2 needs L % 4 == 0
  r.model.tie_embeddings = false;
  r.training.micro_batches = 4;
  r.training.steps = 6;
  r.parallel.pp = c.pp;
  r.parallel.cp = c.cp;
  r.parallel.zero = c.zero;
  r.parallel.ep = c.ep;
  r.training.recompute = recompute_name(c.recompute);
  r.schedule.pipeline = pipeline_kind_name(c.kind);
  r.schedule.virtual_stages = c.kind == PipelineKind::kInterleaved ? 2 : 1;
  r.schedule.strand_interleaving = c.si;
  return r;
}

class Grid3DComposed : public ::testing::TestWithParam<Composed> {};

// combination: 3d 1f1b
// combination: 3d 1f1b si
// combination: 3d interleaved si
// combination: 3d w si
// combination: 3d cp
// combination: 3d cp si
// combination: 3d cp w si
// combination: 3d dp zero1
// combination: 3d cp zero1
// combination: 3d ep
// combination: 3d ep si
// combination: 3d ep dp si
// combination: 3d ep w si
// combination: 3d ep cp
// combination: 3d ep dp si recompute
TEST_P(Grid3DComposed, EqualsSerial) {
  const Composed c = GetParam();
  TempDir dir;
  const std::string prefix = write_walk_dataset(dir.path());
  RunConfig serial_cfg =
      config({"serial", c.family, 1, 1, 1, 1, 1, 1, PipelineKind::k1F1B, false, 0}, prefix, dir / "serial");
  const RunConfig par_cfg = config(c, prefix, dir / "par");
  if (c.family == ModelFamily::kMoE) {
    // The load-balancing loss is per data shard and micro-batch (dp's and z's, as MoeDataParallel
    // holds dp to): the one process runs each shard's window of a global micro-batch as its own.
    serial_cfg.training.micro_batch_size = par_cfg.training.micro_batch_size;
    serial_cfg.training.micro_batches = c.dp * c.gz * par_cfg.training.micro_batches;
    ASSERT_EQ(serial_cfg.tokens_per_step(), par_cfg.tokens_per_step());
  }
  const RunResult serial = run_serial(serial_cfg, Grads::kCollect);
  const RunResult par = run_local(par_cfg, c.zero ? Grads::kSkip : Grads::kCollect);
  const double loss_dev = max_rel_deviation(par.losses, serial.losses);
  std::string worst = "-";
  double grad_dev = 0;
  if (!c.zero) {
    grad_dev = max_grad_deviation(par.first_grads, serial.first_grads, &worst);
    EXPECT_EQ(par.first_grads.size(), serial.first_grads.size()) << c.name;
    EXPECT_LE(grad_dev, kGradRelTol) << c.name << " worst tensor " << worst;
  }
  fmt::print("[measured] {}: grad max rel dev {:.2e} ({}), {}-step loss max rel dev {:.2e}; loss {:.4f} -> {:.4f}\n",
             c.name, grad_dev, worst, serial.losses.size(), loss_dev, serial.losses.front(), serial.losses.back());
  EXPECT_LE(loss_dev, kLossRelTol) << c.name;
  EXPECT_LT(serial.losses.back(), serial.losses.front() - 0.05) << "it trains, or equal losses prove little";
}

std::string composed_name(const ::testing::TestParamInfo<Composed>& info) { return info.param.name; }

INSTANTIATE_TEST_SUITE_P(
    Axes, Grid3DComposed,
    ::testing::Values(
        Composed{"llama_x2y2_pp2_1f1b", ModelFamily::kLlama, 2, 2, 1, 1, 2, 1, PipelineKind::k1F1B, false, 0},
        Composed{"gpt_y2z2_pp2_1f1b_si", ModelFamily::kGPT, 1, 2, 2, 1, 2, 1, PipelineKind::k1F1B, true, 0},
        Composed{"llama_x2z2_pp2_interleaved_si", ModelFamily::kLlama, 2, 1, 2, 1, 2, 1, PipelineKind::kInterleaved,
                 true, 0},
        Composed{"gpt_x2y2_pp2_w_si", ModelFamily::kGPT, 2, 2, 1, 1, 2, 1, PipelineKind::kW, true, 0},
        Composed{"llama_x2y2_cp2", ModelFamily::kLlama, 2, 2, 1, 1, 1, 2, PipelineKind::k1F1B, false, 0},
        Composed{"gpt_y2z2_cp2_si", ModelFamily::kGPT, 1, 2, 2, 1, 1, 2, PipelineKind::k1F1B, true, 0},
        Composed{"llama_y2_cp2_pp2_w_si", ModelFamily::kLlama, 1, 2, 1, 1, 2, 2, PipelineKind::kW, true, 0},
        Composed{"llama_x2z2_dp2_zero1", ModelFamily::kLlama, 2, 1, 2, 2, 1, 1, PipelineKind::k1F1B, false, 1},
        Composed{"gpt_y2_cp2_zero1", ModelFamily::kGPT, 1, 2, 1, 1, 1, 2, PipelineKind::k1F1B, false, 1},
        // The MoE MLP on the grid: each plane rank routes its slice of the plane's tokens (x and y),
        // z splits the batch, ep carves the experts out of dp, and with pipelines and cp.
        Composed{"moe_x2y2", ModelFamily::kMoE, 2, 2, 1, 1, 1, 1, PipelineKind::k1F1B, false, 0},
        Composed{"moe_x2z2_si", ModelFamily::kMoE, 2, 1, 2, 1, 1, 1, PipelineKind::k1F1B, true, 0},
        Composed{"moe_y2_dp2_ep2_si", ModelFamily::kMoE, 1, 2, 1, 2, 1, 1, PipelineKind::k1F1B, true, 0, 2},
        Composed{"moe_x2_pp2_w_si", ModelFamily::kMoE, 2, 1, 1, 1, 2, 1, PipelineKind::kW, true, 0},
        Composed{"moe_y2_cp2", ModelFamily::kMoE, 1, 2, 1, 1, 1, 2, PipelineKind::k1F1B, false, 0},
        // Full recomputation re-runs the grid MoE's gathers, routing and all-to-alls in the backward.
        Composed{"moe_x2_dp2_ep2_si_full_recompute", ModelFamily::kMoE, 2, 1, 1, 2, 1, 1, PipelineKind::k1F1B, true,
                 0, 2, Recompute::kFull}),
    composed_name);

}  // namespace
}  // namespace dhelix::testing
