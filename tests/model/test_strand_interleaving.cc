// Strand Interleaving against the sequential schedule (oracle: Interleave::kOff on the same
// weights and micro-batches). SI only reorders which micro-batch's forward and backward ops run
// when; each gradient still accumulates micro-batch 0, then 1, ... with unchanged kernels, so
// losses and gradients must be bitwise equal. Peak activation memory with SI is bounded by the
// sequential peak plus 5% (the DHelix claim: the backward strand frees what the forward strand
// allocates, so two micro-batches in flight cost about one).
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>

#include "ModelHarness.h"

namespace dhelix::test {
namespace {

void expect_bitwise_equal_steps(ModelFamily family, int micro_batches) {
  const ModelConfig m = reference_config(family);
  const MicroBatchShape mb{kRefB, kRefT};
  ModelHarness h(m, mb, micro_batches);
  h.set_values(random_full_values(m, 7));
  const auto mbs = random_micro_batches(m, mb, micro_batches, 8);
  StepStats off = h.step(mbs, Interleave::kOff);
  auto g_off = h.full_grads();
  StepStats on = h.step(mbs, Interleave::kOn);
  auto g_on = h.full_grads();
  const std::string ctx = fmt::format("{} M={}", family_name(family), micro_batches);
  EXPECT_EQ(on.tokens, off.tokens) << ctx;
  EXPECT_EQ(std::memcmp(&on.loss_sum, &off.loss_sum, sizeof(double)), 0)
      << ctx << ": loss sum " << on.loss_sum << " (SI) vs " << off.loss_sum << " (sequential)";
  for (const auto& [name, g] : g_off) {
    const Tensor& s = g_on.at(name);
    ASSERT_EQ(s.nbytes(), g.nbytes()) << ctx << " " << name;
    EXPECT_EQ(std::memcmp(s.raw(), g.raw(), g.nbytes()), 0) << ctx << ": gradient of " << name << " differs";
  }
}

TEST(StrandInterleaving, GptLossesAndGradientsBitwiseEqualSequential) {
  for (int M : {2, 3}) expect_bitwise_equal_steps(ModelFamily::kGPT, M);
}

TEST(StrandInterleaving, LlamaLossesAndGradientsBitwiseEqualSequential) {
  for (int M : {2, 3}) expect_bitwise_equal_steps(ModelFamily::kLlama, M);
}

// Peak activation bytes of one step, SI on over off, same harness (same weights and data).
double peak_ratio(const ModelConfig& m, const MicroBatchShape& mb, int micro_batches) {
  ModelHarness h(m, mb, micro_batches);
  const auto mbs = random_micro_batches(m, mb, micro_batches, 9);
  const StepStats off = h.step(mbs, Interleave::kOff);
  const StepStats on = h.step(mbs, Interleave::kOn);
  EXPECT_GT(off.peak_activation_bytes, 0);
  const double ratio = double(on.peak_activation_bytes) / double(off.peak_activation_bytes);
  std::printf("[%s B=%ld T=%ld M=%d] peak activations: SI off %.2f MiB, on %.2f MiB, ratio %.4f\n", m.name.c_str(),
              long(mb.B), long(mb.T), micro_batches, double(off.peak_activation_bytes) / (1 << 20),
              double(on.peak_activation_bytes) / (1 << 20), ratio);
  return ratio;
}

// Bound: 1.05, the paper's "no extra activation memory" claim with 5% slack for the few
// buffers of the forward strand's first op that exist before the backward strand frees its own.
TEST(StrandInterleaving, PeakActivationsDemoPresetWithin5Percent) {
  EXPECT_LE(peak_ratio(model_preset("demo"), {8, 128}, 2), 1.05);
}

// GPT-2 124M at B=1, T=256: ~1 GB of states and ~30 s of single-thread compute, so the sanitizer
// build (which re-runs the unit tests for memory errors, already covered by the demo case) skips it.
TEST(StrandInterleaving, PeakActivationsGpt2SmallBatchWithin5Percent) {
#ifdef __SANITIZE_ADDRESS__
  GTEST_SKIP() << "sized for the release build; the sanitizer build checks the demo shape";
#endif
  EXPECT_LE(peak_ratio(model_preset("gpt2-124m"), {1, 256}, 2), 1.05);
}

}  // namespace
}  // namespace dhelix::test
