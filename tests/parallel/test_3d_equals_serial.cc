// 3D tensor parallelism (AxoNN) equals serial, on threads-as-ranks. Oracle: the single-process run
// of the same model on the same global batches (the ranks of one x-y plane read the same
// micro-batches; the dp * Gz data replicas read windows [r*B, (r+1)*B) of each global micro-batch,
// as dp ranks do). Tolerances: ParallelHarness.h (kGradRelTol, kLossRelTol) — 3D regroups the same
// fp32 sums TP and DP do (partial GEMM outputs summed over x or y, weight gradients summed over z's
// batch shards, norm statistics summed over x in double), so the same bounds hold; the measured
// deviations are printed.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include "../train/TempDir.h"
#include "ParallelHarness.h"
#include "train/Trainer.h"

namespace dhelix::testing {
namespace {

struct Grid {
  ModelFamily family;
  int gx, gy, gz, dp;
};

std::string grid_name(const ::testing::TestParamInfo<Grid>& info) {
  const Grid& g = info.param;
  return fmt::format("{}_x{}_y{}_z{}_dp{}", family_name(g.family), g.gx, g.gy, g.gz, g.dp);
}

class Grid3DEqualsSerial : public ::testing::TestWithParam<Grid> {};

// combination: 3d si
// combination: dp 3d si
TEST_P(Grid3DEqualsSerial, LossesAndFirstGradients) {
  const Grid g = GetParam();
  TempDir dir;
  const std::string prefix = write_walk_dataset(dir.path());
  const int64_t kv = g.gy >= 4 ? 4 : 2;
  RunResult serial = run_serial(tiny_config_3d(g.family, 1, 1, 1, 1, prefix, dir / "serial", kv), Grads::kCollect);
  RunResult par = run_local(tiny_config_3d(g.family, g.dp, g.gx, g.gy, g.gz, prefix, dir / "par", kv), Grads::kCollect);
  std::string worst;
  const double grad_dev = max_grad_deviation(par.first_grads, serial.first_grads, &worst);
  const double loss_dev = max_rel_deviation(par.losses, serial.losses);
  fmt::print("[measured] {} Gx={} Gy={} Gz={} dp={}: grad max rel dev {:.2e} ({}), 20-step loss max rel dev {:.2e}; "
             "loss {:.4f} -> {:.4f}\n",
             family_name(g.family), g.gx, g.gy, g.gz, g.dp, grad_dev, worst, loss_dev, serial.losses.front(),
             serial.losses.back());
  EXPECT_EQ(par.first_grads.size(), serial.first_grads.size());
  EXPECT_LE(grad_dev, kGradRelTol) << "worst tensor " << worst;
  EXPECT_LE(loss_dev, kLossRelTol);
  EXPECT_LT(serial.losses.back(), serial.losses.front() - 0.1);  // it trains
}

// Every grid (Gx, Gy, Gz, Gdata) of 2, 4 and 8 ranks with a 3D part (x * y * z > 1), both families,
// except Gy = 8: the tiny models have 4 heads (GPT) and 4 key/value heads (Llama at Gy >= 4), and
// heads must divide by Gy (a configuration error, tested in tests/e2e/cli_bad_input.sh).
std::vector<Grid> grids() {
  std::vector<Grid> out;
  for (ModelFamily f : {ModelFamily::kLlama, ModelFamily::kGPT})
    for (int n : {2, 4, 8})
      for (int x = 1; x <= n; ++x)
        for (int y = 1; y <= n / x; ++y)
          for (int z = 1; z <= n / (x * y); ++z) {
            if (n % (x * y * z) != 0 || x * y * z == 1 || y > 4) continue;
            out.push_back(Grid{f, x, y, z, n / (x * y * z)});
          }
  return out;
}

INSTANTIATE_TEST_SUITE_P(Grids, Grid3DEqualsSerial, ::testing::ValuesIn(grids()), grid_name);

}  // namespace
}  // namespace dhelix::testing
