// Strand Interleaving and every other single-rank step schedule against the sequential schedule
// (oracle: 1F1B at pp = 1 without co-execution, on the same weights and micro-batches). A schedule
// only reorders which micro-batch's forward and backward ops run when; each gradient still
// accumulates micro-batch 0, then 1, ... with unchanged kernels, so losses and gradients must be
// bitwise equal. Peak activation memory with SI is bounded by the
// sequential peak plus 5% (the DHelix claim: the backward strand frees what the forward strand
// allocates, so two micro-batches in flight cost about one).
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <utility>
#include <vector>

#include "ModelHarness.h"

namespace dhelix::test {
namespace {

const PipelineSpec kSequential = single_stage(CoExecute::kOff);
const PipelineSpec kSi = single_stage(CoExecute::kOn);

void expect_bitwise_equal_steps(ModelFamily family, int micro_batches, const PipelineSpec& pipe = kSi) {
  const ModelConfig m = reference_config(family);
  const MicroBatchShape mb{kRefB, kRefT};
  ModelHarness h(m, mb, micro_batches);
  h.set_values(random_full_values(m, 7));
  const auto mbs = random_micro_batches(m, mb, micro_batches, 8);
  StepStats off = h.step(mbs, kSequential);
  auto g_off = h.full_grads();
  StepStats on = h.step(mbs, pipe);
  auto g_on = h.full_grads();
  const std::string ctx = fmt::format("{} M={} {}{} v={}", family_name(family), micro_batches,
                                      pipeline_kind_name(pipe.kind), pipe.co_execute == CoExecute::kOn ? "+si" : "",
                                      pipe.virtual_stages);
  EXPECT_EQ(on.tokens, off.tokens) << ctx;
  EXPECT_EQ(on.expert_tokens, off.expert_tokens) << ctx;
  EXPECT_EQ(std::memcmp(&on.aux_weighted, &off.aux_weighted, sizeof(double)), 0) << ctx << ": aux loss differs";
  EXPECT_EQ(std::memcmp(&on.loss_sum, &off.loss_sum, sizeof(double)), 0)
      << ctx << ": loss sum " << on.loss_sum << " (SI) vs " << off.loss_sum << " (sequential)";
  for (const auto& [name, g] : g_off) {
    const Tensor& s = g_on.at(name);
    ASSERT_EQ(s.nbytes(), g.nbytes()) << ctx << " " << name;
    EXPECT_EQ(std::memcmp(s.raw(), g.raw(), g.nbytes()), 0) << ctx << ": gradient of " << name << " differs";
  }
}

// combination: si
TEST(StrandInterleaving, GptLossesAndGradientsBitwiseEqualSequential) {
  for (int M : {2, 3}) expect_bitwise_equal_steps(ModelFamily::kGPT, M);
}

// combination: si
TEST(StrandInterleaving, LlamaLossesAndGradientsBitwiseEqualSequential) {
  for (int M : {2, 3}) expect_bitwise_equal_steps(ModelFamily::kLlama, M);
}

// MoE: routing, the grouped expert GEMMs and the aux loss's gradient are per micro-batch, so the
// schedule cannot change them either (the routing statistics are compared too).
// combination: si
TEST(StrandInterleaving, MoeLossesAndGradientsBitwiseEqualSequential) {
  for (int M : {2, 3}) expect_bitwise_equal_steps(ModelFamily::kMoE, M);
}

// The folded W and interleaved 1F1B at pp = 1 run the model as two chunks on one rank (the W's
// down chunk embedding + layer 1, its up chunk layer 2 + head; interleaved: chunk i = layer i+1
// with the embedding and head at the ends), with and without co-execution.
// combination: si
TEST(StrandInterleaving, TwoChunkSchedulesBitwiseEqualSequential) {
  for (ModelFamily f : {ModelFamily::kGPT, ModelFamily::kLlama, ModelFamily::kMoE})
    for (PipelineKind k : {PipelineKind::kW, PipelineKind::kInterleaved})
      for (CoExecute co : {CoExecute::kOff, CoExecute::kOn})
        for (int M : {2, 3}) {
          PipelineSpec pipe;
          pipe.kind = k;
          pipe.virtual_stages = k == PipelineKind::kInterleaved ? 2 : 1;
          pipe.co_execute = co;
          expect_bitwise_equal_steps(f, M, pipe);
        }
}

// Peak activation bytes of one step, SI on over off, same harness (same weights and data).
double peak_ratio(const ModelConfig& m, const MicroBatchShape& mb, int micro_batches) {
  ModelHarness h(m, mb, micro_batches);
  const auto mbs = random_micro_batches(m, mb, micro_batches, 9);
  const StepStats off = h.step(mbs, kSequential);
  const StepStats on = h.step(mbs, kSi);
  EXPECT_GT(off.peak_activation_bytes, 0);
  const double ratio = double(on.peak_activation_bytes) / double(off.peak_activation_bytes);
  std::printf("[%s B=%ld T=%ld M=%d] peak activations: SI off %.2f MiB, on %.2f MiB, ratio %.4f\n", m.name.c_str(),
              long(mb.B), long(mb.T), micro_batches, double(off.peak_activation_bytes) / (1 << 20),
              double(on.peak_activation_bytes) / (1 << 20), ratio);
  return ratio;
}

// Bound: 1.05, the paper's "no extra activation memory" claim with 5% slack for the few
// buffers of the forward strand's first op that exist before the backward strand frees its own.
// combination: si
TEST(StrandInterleaving, PeakActivationsDemoPresetWithin5Percent) {
  EXPECT_LE(peak_ratio(model_preset("demo"), {8, 128}, 2), 1.05);
}

// GPT-2 124M at B=1, T=256: ~1 GB of states and ~30 s of single-thread compute, so the sanitizer
// build (which re-runs the unit tests for memory errors, already covered by the demo case) skips it.
// combination: si
TEST(StrandInterleaving, PeakActivationsGpt2SmallBatchWithin5Percent) {
#ifdef __SANITIZE_ADDRESS__
  GTEST_SKIP() << "sized for the release build; the sanitizer build checks the demo shape";
#endif
  EXPECT_LE(peak_ratio(model_preset("gpt2-124m"), {1, 256}, 2), 1.05);
}

// The slot hook brackets the slots of the schedule the runner was handed (oracle: that schedule's
// slot list): one begin and one end mark per slot, in order, and each micro-batch's backward
// finishes unit 0 inside the slot whose backward pass is that micro-batch on the first chunk. With
// one chunk: SI off, slot 2i + 1 (F0 B0 F1 B1 ...); SI on, slot i + 1 (slot 0 finishes none).
void expect_slots_bracket_backward(const PipelineSpec& pipe, int micro_batches) {
  const ModelConfig m = reference_config(ModelFamily::kGPT);
  const MicroBatchShape mb{kRefB, kRefT};
  ModelHarness h(m, mb, micro_batches);
  const auto mbs = random_micro_batches(m, mb, micro_batches, 10);
  PipelineSpec full = pipe;
  full.n_layers = static_cast<int>(m.n_layers);
  full.micro_batches = micro_batches;
  const StepSchedule sch = make_schedule(full);
  std::vector<std::pair<int, bool>> marks;
  int open = -1;                         // the slot now running, -1 between slots
  std::vector<int> finished_in;          // [mb] -> slot in which its backward finished unit 0
  finished_in.assign(micro_batches, -2);
  h.step(
      mbs, pipe,
      [&](int slot, bool begin) {
        marks.push_back({slot, begin});
        open = begin ? slot : -1;
      },
      [&](int mbi, int unit) {
        if (unit == 0) finished_in.at(mbi) = open;
      });
  const int slots = static_cast<int>(sch.ranks[0].size());
  ASSERT_EQ(static_cast<int>(marks.size()), 2 * slots) << sch.name;
  for (int s = 0; s < slots; ++s) {
    EXPECT_EQ(marks[2 * s], (std::pair<int, bool>{s, true})) << sch.name << " slot " << s;
    EXPECT_EQ(marks[2 * s + 1], (std::pair<int, bool>{s, false})) << sch.name << " slot " << s;
  }
  for (int i = 0; i < micro_batches; ++i) {
    int want = -1;
    for (int s = 0; s < slots; ++s)
      if (sch.ranks[0][s].bwd == Pass{i, 0}) want = s;
    EXPECT_EQ(finished_in[i], want) << sch.name << ": backward of micro-batch " << i;
  }
  if (full.kind == PipelineKind::k1F1B) {
    for (int i = 0; i < micro_batches; ++i)
      EXPECT_EQ(finished_in[i], full.co_execute == CoExecute::kOn ? i + 1 : 2 * i + 1) << sch.name;
  }
}

// combination: si
TEST(StrandInterleaving, SlotHookBracketsEachSlotsBackward) {
  expect_slots_bracket_backward(kSi, 3);
  expect_slots_bracket_backward(kSequential, 3);
  PipelineSpec w;
  w.kind = PipelineKind::kW;
  w.co_execute = CoExecute::kOn;
  expect_slots_bracket_backward(w, 3);
}

}  // namespace
}  // namespace dhelix::test
