// Activation recomputation (training.recompute = selective | full) against no recomputation, on one
// rank. Oracle for the results: the run without recomputation on the same weights and micro-batches.
// A recompute op is a copy of a forward op run again at the start of its layer's backward, on the
// same inputs with the same kernels, so losses, routing statistics and every gradient are bitwise
// equal -- under every single-rank schedule (sequential, Strand Interleaving, the two-chunk W and
// interleaved ones). Oracle for the memory: the closed form below, from the buffers Megatron's
// accounting ("Reducing Activation Recomputation", Korthikanti et al. 2022, sec. 4) keeps per layer.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "ModelHarness.h"

namespace dhelix::test {
namespace {

PipelineSpec schedule(PipelineKind kind, CoExecute co) {
  PipelineSpec pipe = single_stage(co);
  pipe.kind = kind;
  pipe.virtual_stages = kind == PipelineKind::kInterleaved ? 2 : 1;
  return pipe;
}

struct StepRun {
  StepStats stats;
  std::map<std::string, Tensor> grads;
};

StepRun run_step(const ModelConfig& m, Recompute rc, const PipelineSpec& pipe, int micro_batches) {
  const MicroBatchShape mb{kRefB, kRefT};
  ModelHarness h(m, mb, micro_batches, Device::host(), rc);
  h.set_values(random_full_values(m, 7));
  StepRun r;
  r.stats = h.step(random_micro_batches(m, mb, micro_batches, 8), pipe);
  r.grads = h.full_grads();
  return r;
}

void expect_bitwise(const StepRun& got, const StepRun& want, const std::string& ctx) {
  EXPECT_EQ(got.stats.tokens, want.stats.tokens) << ctx;
  EXPECT_EQ(got.stats.expert_tokens, want.stats.expert_tokens) << ctx << ": routing statistics differ";
  EXPECT_EQ(std::memcmp(&got.stats.aux_weighted, &want.stats.aux_weighted, sizeof(double)), 0) << ctx << ": aux loss";
  EXPECT_EQ(std::memcmp(&got.stats.loss_sum, &want.stats.loss_sum, sizeof(double)), 0)
      << ctx << ": loss sum " << got.stats.loss_sum << " vs " << want.stats.loss_sum;
  ASSERT_EQ(got.grads.size(), want.grads.size()) << ctx;
  for (const auto& [name, g] : want.grads) {
    const Tensor& s = got.grads.at(name);
    ASSERT_EQ(s.nbytes(), g.nbytes()) << ctx << " " << name;
    EXPECT_EQ(std::memcmp(s.raw(), g.raw(), g.nbytes()), 0) << ctx << ": gradient of " << name << " differs";
  }
}

// combination: recompute
// combination: recompute si
TEST(Recompute, LossesRoutingAndGradientsBitwiseEqualNoneUnderEverySchedule) {
  for (ModelFamily f : {ModelFamily::kGPT, ModelFamily::kLlama, ModelFamily::kMoE}) {
    const ModelConfig m = reference_config(f);
    const StepRun none = run_step(m, Recompute::kNone, schedule(PipelineKind::k1F1B, CoExecute::kOff), 2);
    for (Recompute rc : {Recompute::kSelective, Recompute::kFull})
      for (PipelineKind k : {PipelineKind::k1F1B, PipelineKind::kW, PipelineKind::kInterleaved})
        for (CoExecute co : {CoExecute::kOff, CoExecute::kOn}) {
          const std::string ctx = fmt::format("{} recompute={} {}{}", family_name(f), recompute_name(rc),
                                              pipeline_kind_name(k), co == CoExecute::kOn ? "+si" : "");
          expect_bitwise(run_step(m, rc, schedule(k, co), 2), none, ctx);
        }
  }
}

// The recompute ops are the backward program's first ops, copies of forward ops (same code, inputs,
// outputs, parameters), and the rest of the backward is the program without recomputation.
// combination: recompute
TEST(Recompute, BackwardIsRecomputeOpsThenTheUnchangedBackward) {
  for (ModelFamily f : {ModelFamily::kGPT, ModelFamily::kLlama, ModelFamily::kMoE}) {
    const ModelConfig m = reference_config(f);
    const ModelHarness none(m, {kRefB, kRefT}, 1);
    const LayerProgram& base = none.programs().block;
    for (Recompute rc : {Recompute::kSelective, Recompute::kFull}) {
      const ModelHarness h(m, {kRefB, kRefT}, 1, Device::host(), rc);
      const LayerProgram& p = h.programs().block;
      const std::string ctx = fmt::format("{} {}", family_name(f), recompute_name(rc));
      ASSERT_EQ(p.fwd.size(), base.fwd.size()) << ctx;
      size_t k = 0;
      for (; k < p.bwd.size() && p.bwd[k].flag("recompute"); ++k) {
        const Op& r = p.bwd[k];
        auto src = std::find_if(base.fwd.begin(), base.fwd.end(), [&](const Op& o) { return o.name + ".recompute" == r.name; });
        ASSERT_NE(src, base.fwd.end()) << ctx << ": " << r.name << " copies no forward op";
        EXPECT_EQ(r.code, src->code) << ctx << " " << r.name;
        EXPECT_EQ(r.inputs, src->inputs) << ctx << " " << r.name;
        EXPECT_EQ(r.outputs, src->outputs) << ctx << " " << r.name;
        EXPECT_EQ(r.params, src->params) << ctx << " " << r.name;
      }
      ASSERT_GT(k, 0u) << ctx << ": no recompute op";
      ASSERT_EQ(p.bwd.size() - k, base.bwd.size()) << ctx;
      for (size_t i = 0; i < base.bwd.size(); ++i) EXPECT_EQ(p.bwd[k + i].name, base.bwd[i].name) << ctx;
      // Selective re-runs only the attention core; full re-runs more than it.
      if (rc == Recompute::kSelective) {
        EXPECT_EQ(k, 1u) << ctx;
        EXPECT_EQ(p.bwd[0].code, "attention") << ctx;
      } else {
        EXPECT_GT(k, 4u) << ctx;
      }
    }
  }
}

// Activation elements a layer keeps from its forward for its backward, per token (N = B T tokens):
// C model width, F MLP hidden, H query heads, Q = (H + 2 H_kv) D the fused q/k/v width.
//   GPT,  none:      x, ln1 out, ln1 mean+rstd, qkv, attention out, its lse (per head), x2, ln2 out,
//                    ln2 mean+rstd, fc out, gelu out          = 8C + 2F + H + 4   (qkv = 3C)
//   Llama, none:     x, norm out, rstd, rotated qkv, attention out, lse, x2, norm out, rstd, fc out
//                    (gate and up, 2F), swiglu out            = 5C + Q + H + 3F + 2
//   selective:       none without the attention out and lse  = none - (C + H)
//   full:            x only                                    = C
// (Megatron's per-layer 34sbh + 5as^2b at fp16 with dropout masks; here fp32, no dropout, and a
// flash-style attention that keeps lse instead of the s^2 scores, so selective removes C + H.)
double kept_per_token(const ModelConfig& m, Recompute rc) {
  const double C = double(m.d_model), F = double(m.ffn_hidden), H = double(m.n_heads);
  const double Q = double(m.n_heads + 2 * m.n_kv_heads) * double(m.head_dim());
  const double none = m.family == ModelFamily::kGPT ? 8 * C + 2 * F + H + 4 : 5 * C + Q + H + 3 * F + 2;
  switch (rc) {
    case Recompute::kNone: return none;
    case Recompute::kSelective: return none - (C + H);
    case Recompute::kFull: return C;
  }
  return 0;
}

struct Memory {
  int64_t after_forward = 0;  // activation bytes when the forward slot of the one micro-batch ends
  int64_t peak = 0;
};

Memory measure(const ModelConfig& m, Recompute rc, const PipelineSpec& pipe, int recompute_layers = 0) {
  const MicroBatchShape mb{kRefB, kRefT};
  ModelHarness h(m, mb, 1, Device::host(), rc, recompute_layers);
  Memory out;
  const StepStats st = h.step(random_micro_batches(m, mb, 1, 9), pipe, [&](int slot, bool begin) {
    if (slot == 0 && !begin) out.after_forward = h.activation_bytes();
  });
  out.peak = st.peak_activation_bytes;
  return out;
}

// Kept bytes after the forward: the difference to no recomputation is L x N x (kept(none) -
// kept(rc)) x 4 bytes exactly (the embedding's and head's buffers are the same in both). The peak
// (during a backward, when one layer's recomputed activations and its gradients are live) is lower
// too, selective below none and full below selective.
// combination: recompute
TEST(Recompute, KeptActivationsFollowTheClosedFormAndThePeakDrops) {
  for (ModelFamily f : {ModelFamily::kGPT, ModelFamily::kLlama}) {
    const ModelConfig m = reference_config(f);
    const double N = double(kRefB * kRefT), L = double(m.n_layers);
    const PipelineSpec seq = schedule(PipelineKind::k1F1B, CoExecute::kOff);
    const Memory none = measure(m, Recompute::kNone, seq);
    int64_t last_peak = none.peak;
    for (Recompute rc : {Recompute::kSelective, Recompute::kFull}) {
      const Memory got = measure(m, rc, seq);
      const double want = L * N * (kept_per_token(m, Recompute::kNone) - kept_per_token(m, rc)) * 4;
      std::printf("[%s %s] kept after forward %ld -> %ld bytes (closed form: -%.0f), peak %ld -> %ld\n",
                  family_name(f), recompute_name(rc), long(none.after_forward), long(got.after_forward), want,
                  long(none.peak), long(got.peak));
      EXPECT_EQ(double(none.after_forward - got.after_forward), want) << family_name(f) << " " << recompute_name(rc);
      EXPECT_LT(got.peak, last_peak) << family_name(f) << " " << recompute_name(rc);
      last_peak = got.peak;
    }
  }
}

// training.recompute_layers = 1 on the 2-layer model: the first layer recomputes, the second keeps
// its activations (it runs the block without recompute ops). Results bitwise equal to none; the kept
// bytes after the forward drop by one layer's worth of the closed form, N (kept(none) - kept(full)) 4.
// combination: recompute
TEST(Recompute, FirstNLayersOnlyRecompute) {
  for (ModelFamily f : {ModelFamily::kGPT, ModelFamily::kLlama}) {
    const ModelConfig m = reference_config(f);
    ASSERT_EQ(m.n_layers, 2);
    const PipelineSpec seq = schedule(PipelineKind::k1F1B, CoExecute::kOff);
    const MicroBatchShape mb{kRefB, kRefT};
    ModelHarness some(m, mb, 2, Device::host(), Recompute::kFull, 1);
    EXPECT_EQ(some.programs().program(2, "block").name, "block_plain")
        << "layer 2 (unit 2) should run the block without recompute";
    EXPECT_EQ(some.programs().program(1, "block").name, "block") << "layer 1 (unit 1) should recompute";
    some.set_values(random_full_values(m, 7));
    StepRun got;
    got.stats = some.step(random_micro_batches(m, mb, 2, 8), seq);
    got.grads = some.full_grads();
    expect_bitwise(got, run_step(m, Recompute::kNone, seq, 2), std::string(family_name(f)) + " recompute_layers=1");
    const double N = double(kRefB * kRefT);
    const Memory none = measure(m, Recompute::kNone, seq), one = measure(m, Recompute::kFull, seq, 1);
    EXPECT_EQ(double(none.after_forward - one.after_forward),
              N * (kept_per_token(m, Recompute::kNone) - kept_per_token(m, Recompute::kFull)) * 4)
        << family_name(f);
  }
}

// With Strand Interleaving the peak drops too (the backward strand's layer recomputes while the
// forward strand keeps less per layer).
// combination: recompute si
TEST(Recompute, PeakDropsUnderStrandInterleaving) {
  for (ModelFamily f : {ModelFamily::kGPT, ModelFamily::kLlama, ModelFamily::kMoE}) {
    const ModelConfig m = reference_config(f);
    const MicroBatchShape mb{kRefB, kRefT};
    auto peak = [&](Recompute rc) {
      ModelHarness h(m, mb, 2, Device::host(), rc);
      return h.step(random_micro_batches(m, mb, 2, 9), schedule(PipelineKind::k1F1B, CoExecute::kOn))
          .peak_activation_bytes;
    };
    const int64_t none = peak(Recompute::kNone), full = peak(Recompute::kFull);
    EXPECT_LT(full, none) << family_name(f);
  }
}

}  // namespace
}  // namespace dhelix::test
