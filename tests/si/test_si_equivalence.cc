// SI on versus off on threads-as-ranks (local backend), same data, same seed. Oracle: the
// sequential schedule (forward then backward of each micro-batch). Strand Interleaving only
// reorders whole ops of two different micro-batches; every reduction (GEMM, tp all-reduce /
// reduce-scatter, dp bucket all-reduce, gradient accumulation over micro-batches) keeps its
// operands and its order, so losses and gradients must be bitwise equal — no tolerance.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <tuple>

#include "SiRun.h"

namespace dhelix {
namespace {

struct SiLayout {
  int dp, tp;
};

class SiOnOff : public ::testing::TestWithParam<std::tuple<const char*, SiLayout>> {};

// Number of gradient elements whose bit patterns differ (0 when bitwise equal).
int64_t differing_bits(const Tensor& a, const Tensor& b) {
  const float* pa = a.f32();
  const float* pb = b.f32();
  int64_t n = 0;
  for (int64_t i = 0; i < b.numel(); ++i) n += std::memcmp(pa + i, pb + i, sizeof(float)) != 0;
  return n;
}

// combination: tp si
// combination: dp si
// combination: dp tp si
TEST_P(SiOnOff, LossesAndGradientsBitwiseEqual) {
  auto [family, lay] = GetParam();
  testing::TempDir dir;
  testing::write_synthetic_dataset(dir.path() + "/data", 200, 300, 13);
  testing::SiResult a = testing::run_si(testing::si_config(dir.path(), family, lay.dp, lay.tp, true));
  testing::SiResult b = testing::run_si(testing::si_config(dir.path(), family, lay.dp, lay.tp, false));

  ASSERT_EQ(a.losses.size(), 20u);
  ASSERT_EQ(a.losses.size(), b.losses.size());
  for (size_t i = 0; i < a.losses.size(); ++i)
    EXPECT_EQ(a.losses[i], b.losses[i]) << "step " << i + 1 << ": SI on " << a.losses[i] << " vs off " << b.losses[i];

  ASSERT_FALSE(b.grads.empty());
  ASSERT_EQ(a.grads.size(), b.grads.size());
  for (const auto& [name, gb] : b.grads) {
    auto it = a.grads.find(name);
    ASSERT_NE(it, a.grads.end()) << "gradient " << name << " missing with SI on";
    ASSERT_EQ(it->second.shape(), gb.shape()) << name;
    EXPECT_EQ(differing_bits(it->second, gb), 0) << "gradient " << name << " differs (of " << gb.numel() << ")";
  }
}

std::string layout_name(const ::testing::TestParamInfo<std::tuple<const char*, SiLayout>>& info) {
  auto [family, lay] = info.param;
  return std::string(family) + "_dp" + std::to_string(lay.dp) + "_tp" +
         std::to_string(lay.tp);
}

INSTANTIATE_TEST_SUITE_P(Layouts, SiOnOff,
                         ::testing::Combine(::testing::Values("llama", "gpt"),
                                            ::testing::Values(SiLayout{1, 2}, SiLayout{2, 1}, SiLayout{2, 2})),
                         layout_name);

}  // namespace
}  // namespace dhelix
