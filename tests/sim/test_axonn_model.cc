// AxoNN's closed form. Oracles: axonn.md §4.5's test vectors (an independent re-implementation of
// comm_model.py, Perlmutter table; printed to 3 significant digits, so the tolerance is half a unit
// of the last printed digit), and the type-B correction counted by hand from §2.3.
#include <gtest/gtest.h>

#include "sim/AxonnModel.h"

namespace dhelix {
namespace {

ClusterPreset perlmutter() {
  return load_cluster(std::string(DHELIX_SOURCE_DIR) + "/configs/clusters/perlmutter-a100.toml");
}

TEST(AxonnModel, PaperVectorsOf80BOn1024Gpus) {
  const ClusterPreset c = perlmutter();
  const AxonnShape s{12288, 42, 2048, 1024, 1};  // 80B: H, L, S, B, grad_acc
  struct Vec {
    AxonnGrid g;
    double seconds, half_unit;
  };
  for (const Vec& v : {Vec{{1, 1, 1024, 1}, 5.31, 0.005}, Vec{{4, 2, 128, 1}, 5.84, 0.005},
                       Vec{{2, 4, 8, 16}, 7.11, 0.005}, Vec{{4, 4, 4, 16}, 9.34, 0.005},
                       Vec{{1, 64, 1, 16}, 37.6, 0.05}}) {
    const AxonnComm r = axonn_comm(s, v.g, c, {AxonnMode::kPaperCompat, 2, Recompute::kFull});
    EXPECT_NEAR(r.total_s(), v.seconds, v.half_unit)
        << v.g.gx << " " << v.g.gy << " " << v.g.gz << " " << v.g.gdata;
  }
}

TEST(AxonnModel, CorrectedModeMovesMlpDownKToBackwardX) {
  const ClusterPreset c = perlmutter();
  const AxonnShape s{64, 3, 16, 8, 1};
  const AxonnGrid g{2, 2, 1, 1};
  const AxonnComm paper = axonn_comm(s, g, c, {AxonnMode::kPaperCompat, 2, Recompute::kFull});
  const AxonnComm fixed = axonn_comm(s, g, c, {AxonnMode::kCorrected, 2, Recompute::kFull});
  // MLP-down (K = 4, type B), per layer, m = b·S = 8·16 tokens, e = 2 bytes, ring 2(g-1)/g = 1:
  //   as coded:  fwd y = 2 · 1 · m·4H/Gx · e (x2 recompute), bwd x = 1 · m·H/Gy · e
  //   corrected: fwd y = 2 · 1 · m·H/Gx · e,                 bwd x = 1 · m·4H/Gy · e
  const double m = 8 * 16, H = 64, e = 2, L = 3;
  EXPECT_DOUBLE_EQ(paper.fwd_y - fixed.fwd_y, L * 2 * (m * 4 * H / 2 - m * H / 2) * e);
  EXPECT_DOUBLE_EQ(fixed.bwd_x - paper.bwd_x, L * (m * 4 * H / 2 - m * H / 2) * e);
  EXPECT_DOUBLE_EQ(paper.fwd_x, fixed.fwd_x);  // type A untouched
  // Without recompute the forward all-reduces count once.
  const AxonnComm once = axonn_comm(s, g, c, {AxonnMode::kCorrected, 2, Recompute::kNone});
  EXPECT_DOUBLE_EQ(once.fwd_x * 2, fixed.fwd_x);
  // Corrected mode keeps SI units: seconds = bytes / (bytes/s).
  EXPECT_DOUBLE_EQ(fixed.x_s, fixed.bytes_x() / placement_link(c, 1, 2).bandwidth);
}

}  // namespace
}  // namespace dhelix
