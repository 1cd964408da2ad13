// AxoNN's per-block communication volumes (axonn.md §2.3 and §4.2), as coded and corrected.
#include "sim/AxonnModel.h"

#include "base/Error.h"

namespace dhelix {

AxonnComm axonn_comm(const AxonnShape& s, const AxonnGrid& grid, const ClusterPreset& cluster,
                     const AxonnOptions& opt) {
  DHX_CHECK(grid.gx >= 1 && grid.gy >= 1 && grid.gz >= 1 && grid.gdata >= 1, ConfigError,
            "AxoNN grid ({}, {}, {}, {}) has an axis below 1", grid.gx, grid.gy, grid.gz, grid.gdata);
  DHX_CHECK(s.batch % (int64_t{grid.gz} * grid.gdata) == 0, ConfigError,
            "batch {} is not divisible by Gz x Gdata = {} x {}", s.batch, grid.gz, grid.gdata);
  const bool paper = opt.mode == AxonnMode::kPaperCompat;
  const double e = paper ? 2.0 : opt.elem_bytes;
  const double fwd_passes = paper || opt.recompute == Recompute::kFull ? 2.0 : 1.0;
  const double gx = grid.gx, gy = grid.gy, gz = grid.gz, gd = grid.gdata;
  const double H = static_cast<double>(s.hidden), S = static_cast<double>(s.seq);
  const double b = static_cast<double>(s.batch) / (gd * gz);  // sequences per x-y plane
  const double ring_x = (gx - 1) / gx, ring_y = (gy - 1) / gy, ring_z = (gz - 1) / gz, ring_d = (gd - 1) / gd;

  struct Gemm {
    double K;
    bool type_b;
  };
  const Gemm gemms[] = {{3, false}, {1, true}, {4, false}, {4, true}};  // QKV, attn-out, MLP-up, MLP-down
  AxonnComm v;
  for (const Gemm& g : gemms) {
    const double w = g.K * H * H;  // weight elements
    // Data: all-reduce of the fp32 gradient shard (comm_model.py: 4 · ... · 2 bytes = 2(n-1)/n · 4 bytes).
    v.data += 2 * ring_d * w / (gx * gy * gz) * 4;
    // Depth: forward all-gather, backward all-gather, gradient reduce-scatter, per micro-batch.
    v.z_gather += 2 * ring_z * w / (gx * gy) * e * static_cast<double>(s.grad_acc);
    v.z_scatter += 1 * ring_z * w / (gx * gy) * e * static_cast<double>(s.grad_acc);
    const double wide = b * S * g.K * H, narrow = b * S * H;  // output / input activation elements
    if (!g.type_b) {
      // Type A (in H, out K·H): forward AR over x of [m, K·H/Gy]; backward AR over y of [m, H/Gx].
      v.fwd_x += fwd_passes * 2 * ring_x * wide / gy * e;
      v.bwd_y += 2 * ring_y * narrow / gx * e;
    } else if (paper) {
      // Type B as coded: K on the forward y term.
      v.fwd_y += fwd_passes * 2 * ring_y * wide / gx * e;
      v.bwd_x += 2 * ring_x * narrow / gy * e;
    } else {
      // Type B (in K·H, out H): forward AR over y of [m, H/Gx]; backward AR over x of [m, K·H/Gy].
      v.fwd_y += fwd_passes * 2 * ring_y * narrow / gx * e;
      v.bwd_x += 2 * ring_x * wide / gy * e;
    }
  }
  const double L = static_cast<double>(s.layers);
  for (double* f : {&v.fwd_x, &v.fwd_y, &v.bwd_x, &v.bwd_y, &v.z_gather, &v.z_scatter, &v.data}) *f *= L;

  // comm_model.py divides GiB by β in GB/s; the corrected mode keeps bytes and bytes/s.
  const double unit = paper ? double(1 << 30) / 1e9 : 1.0;
  auto seconds = [&](double bytes, int ip, int g) {
    return g <= 1 ? 0.0 : bytes / unit / placement_link(cluster, ip, g).bandwidth;
  };
  v.x_s = seconds(v.bytes_x(), 1, grid.gx);
  v.y_s = seconds(v.bytes_y(), grid.gx, grid.gy);
  v.z_s = seconds(v.bytes_z(), grid.gx * grid.gy, grid.gz);
  v.data_s = seconds(v.data, grid.gx * grid.gy * grid.gz, grid.gdata);
  return v;
}

}  // namespace dhelix
