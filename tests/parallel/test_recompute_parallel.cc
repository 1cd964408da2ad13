// Activation recomputation on multi-rank layouts, threads-as-ranks. Oracle: the same layout without
// recomputation on the same data. A recompute op re-runs a forward op -- a collective too: the
// sequence-parallel gathers and reduce-scatters, CP's ring, the expert all-to-alls, the 3D grid's
// all-reduces and weight gathers -- on the same inputs, so every rank gets the same values back and
// the losses over 3 steps and the step-1 gradients are bitwise equal. One case per parallelism the
// recompute ops pass through, with Strand Interleaving where it runs, and every pipeline kind.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cstring>
#include <functional>

#include "../train/TempDir.h"
#include "ParallelHarness.h"
#include "schedule/Pipelines.h"

namespace dhelix::testing {
namespace {

struct RcCase {
  const char* name;
  const char* recompute;
  std::function<RunConfig(const std::string& prefix, const std::string& out)> config;
  int layers = 0;  // training.recompute_layers
};

RunConfig with(RunConfig c, bool si, int steps = 3) {
  c.schedule.strand_interleaving = si;
  c.training.steps = steps;
  return c;
}

RunConfig pipeline(ModelFamily f, int tp, PipelineKind kind, const std::string& prefix, const std::string& out) {
  RunConfig c = tiny_config(f, 1, tp, 0, prefix, out);
  c.model.n_layers = 4;
  c.parallel.pp = 2;
  c.schedule.pipeline = pipeline_kind_name(kind);
  c.schedule.virtual_stages = kind == PipelineKind::kInterleaved ? 2 : 1;
  c.training.micro_batches = 4;
  return with(c, true);
}

std::vector<RcCase> cases() {
  using P = const std::string&;
  return {
      {"gpt_tp2_si_full", "full", [](P p, P o) { return with(tiny_config(ModelFamily::kGPT, 1, 2, 0, p, o), true); }},
      {"llama_tp2_selective", "selective",
       [](P p, P o) { return with(tiny_config(ModelFamily::kLlama, 1, 2, 0, p, o), false); }},
      {"llama_cp2_si_selective", "selective",
       [](P p, P o) {
         RunConfig c = tiny_config(ModelFamily::kLlama, 1, 1, 0, p, o);
         c.parallel.cp = 2;
         return with(c, true);
       }},
      {"gpt_cp2_full", "full",
       [](P p, P o) {
         RunConfig c = tiny_config(ModelFamily::kGPT, 1, 1, 0, p, o);
         c.parallel.cp = 2;
         return with(c, false);
       }},
      {"moe_ep2_si_full", "full",
       [](P p, P o) {
         RunConfig c = tiny_config(ModelFamily::kMoE, 2, 1, 0, p, o);
         c.parallel.ep = 2;
         return with(c, true);
       }},
      {"gpt_grid_2x2x1_si_full", "full",
       [](P p, P o) { return with(tiny_config_3d(ModelFamily::kGPT, 1, 2, 2, 1, p, o), true); }},
      {"llama_grid_1x2x2_full", "full",
       [](P p, P o) { return with(tiny_config_3d(ModelFamily::kLlama, 1, 1, 2, 2, p, o), false); }},
      {"llama_pp2_1f1b_si_full", "full",
       [](P p, P o) { return pipeline(ModelFamily::kLlama, 1, PipelineKind::k1F1B, p, o); }},
      {"gpt_pp2_interleaved_si_selective", "selective",
       [](P p, P o) { return pipeline(ModelFamily::kGPT, 1, PipelineKind::kInterleaved, p, o); }},
      {"llama_pp2_w_tp2_si_full", "full",
       [](P p, P o) { return pipeline(ModelFamily::kLlama, 2, PipelineKind::kW, p, o); }},
      {"gpt_pp2_1f1b_si_full_first1", "full",
       [](P p, P o) { return pipeline(ModelFamily::kGPT, 1, PipelineKind::k1F1B, p, o); }, 1},
      {"llama_dp2_zero1_si_full", "full",
       [](P p, P o) { return with(tiny_config(ModelFamily::kLlama, 2, 1, 1, p, o), true); }},
  };
}

bool bitwise_equal(const Tensor& a, const Tensor& b) {
  return a.nbytes() == b.nbytes() && std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
}

// combination: tp si recompute
// combination: tp recompute
// combination: cp si recompute
// combination: cp recompute
// combination: dp ep si recompute
// combination: 3d si recompute
// combination: 3d recompute
// combination: 1f1b si recompute
// combination: interleaved si recompute
// combination: w tp si recompute
// combination: 1f1b si recompute
// combination: dp zero1 si recompute
TEST(RecomputeParallel, LossesAndFirstGradientsBitwiseEqualNoRecompute) {
  for (const RcCase& c : cases()) {
    TempDir dir;
    const std::string prefix = write_walk_dataset(dir.path());
    RunConfig base = c.config(prefix, dir / "none");
    RunConfig rc = c.config(prefix, dir / "rc");
    rc.training.recompute = c.recompute;
    rc.training.recompute_layers = c.layers;
    // ZeRO-1 holds reduced gradients only in chunks: its losses are compared, not step-1 gradients.
    const Grads grads = base.parallel.zero ? Grads::kSkip : Grads::kCollect;
    const RunResult want = run_local(base, grads);
    const RunResult got = run_local(rc, grads);
    ASSERT_EQ(got.losses.size(), want.losses.size()) << c.name;
    for (size_t i = 0; i < want.losses.size(); ++i)
      EXPECT_EQ(std::memcmp(&got.losses[i], &want.losses[i], sizeof(double)), 0)
          << c.name << " step " << i + 1 << ": " << got.losses[i] << " vs " << want.losses[i];
    ASSERT_EQ(got.first_grads.size(), want.first_grads.size()) << c.name;
    for (const auto& [name, g] : want.first_grads)
      EXPECT_TRUE(bitwise_equal(got.first_grads.at(name), g)) << c.name << ": gradient of " << name << " differs";
    fmt::print("[recompute] {} ({}): {} steps, losses {:.6f} .. {:.6f}, bitwise equal to none\n", c.name, c.recompute,
               want.losses.size(), want.losses.front(), want.losses.back());
  }
}

}  // namespace
}  // namespace dhelix::testing
