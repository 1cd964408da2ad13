// The epilogue-fused programs (sharding/Epilogues.h) against the plain ones, one rank on the CPU.
// Oracle: the plain programs' step on the same weights and micro-batches. On the CPU a fused op runs
// its pair's two kernels in the pair's order on the same inputs (OpRegistry.cc, op::unfused_*), so
// the loss, the routing statistics and every gradient are bitwise equal -- under recomputation
// (whose copies fuse too) and Strand Interleaving (whose blocks are cut from the fused program).
// What this cannot check is the GPU's epilogues themselves: tests/kernels_cuda (test_epilogues.cc,
// and test_model_gpu.cc's fused step against the CPU) do, on a GPU.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cstring>

#include "ModelHarness.h"

namespace dhelix::test {
namespace {

struct StepRun {
  StepStats stats;
  std::map<std::string, Tensor> grads;
  EpilogueFusions fusions;
};

StepRun run_step(const ModelConfig& m, Recompute rc, CoExecute co, bool fuse) {
  const MicroBatchShape mb{kRefB, kRefT};
  ModelHarness h(m, mb, kRefMicroBatches, Device::host(), rc, 0, fuse);
  h.set_values(random_full_values(m, 7));
  StepRun r;
  r.stats = h.step(random_micro_batches(m, mb, kRefMicroBatches, 8), single_stage(co));
  r.grads = h.full_grads();
  for (const auto* ops : {&h.programs().block.fwd, &h.programs().block.bwd})
    for (const Op& op : *ops) {
      r.fusions.gelu += op.code == "linear_gelu";
      r.fusions.dgelu += op.code == "linear_dgrad_gelu";
      r.fusions.residual += op.code == "linear_residual";
    }
  EXPECT_EQ(r.fusions.total(), h.programs().fusions.total());  // the embedding and head have none
  return r;
}

// combination: si recompute
TEST(EpilogueFusion, FusedStepIsBitwiseThePlainStepOnTheCpu) {
  for (ModelFamily f : {ModelFamily::kGPT, ModelFamily::kLlama, ModelFamily::kMoE}) {
    const ModelConfig m = reference_config(f);
    for (Recompute rc : {Recompute::kNone, Recompute::kFull})
      for (CoExecute co : {CoExecute::kOff, CoExecute::kOn}) {
        const std::string ctx = fmt::format("{} recompute={}{}", family_name(f), recompute_name(rc),
                                            co == CoExecute::kOn ? " si" : "");
        const StepRun plain = run_step(m, rc, co, false), fused = run_step(m, rc, co, true);
        // The rewrite ran (else this compares a program with itself): GPT-2 fuses its GELU pair and
        // both residuals, the others their residuals.
        EXPECT_EQ(plain.fusions.total(), 0) << ctx;
        EXPECT_EQ(fused.fusions.residual, f == ModelFamily::kMoE ? 1 + (rc == Recompute::kFull)
                                                                 : 2 + (rc == Recompute::kFull))
            << ctx;
        EXPECT_EQ(fused.fusions.gelu, f == ModelFamily::kGPT ? 1 + (rc == Recompute::kFull) : 0) << ctx;
        EXPECT_EQ(fused.stats.tokens, plain.stats.tokens) << ctx;
        EXPECT_EQ(fused.stats.expert_tokens, plain.stats.expert_tokens) << ctx;
        EXPECT_EQ(std::memcmp(&fused.stats.loss_sum, &plain.stats.loss_sum, sizeof(double)), 0)
            << ctx << ": loss sum " << fused.stats.loss_sum << " vs " << plain.stats.loss_sum;
        EXPECT_EQ(std::memcmp(&fused.stats.aux_weighted, &plain.stats.aux_weighted, sizeof(double)), 0) << ctx;
        ASSERT_EQ(fused.grads.size(), plain.grads.size()) << ctx;
        for (const auto& [name, g] : plain.grads) {
          const Tensor& s = fused.grads.at(name);
          ASSERT_EQ(s.nbytes(), g.nbytes()) << ctx << " " << name;
          EXPECT_EQ(std::memcmp(s.raw(), g.raw(), g.nbytes()), 0) << ctx << ": gradient of " << name << " differs";
        }
      }
  }
}

}  // namespace
}  // namespace dhelix::test
