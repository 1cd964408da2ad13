// AxoNN's closed-form communication model of a step (axonn.md §4.2, Megatron-AxoNN's
// comm_model.py::model_v2): each transformer block is four GEMMs (QKV type A K=3, attention-out
// type B K=1, MLP-up type A K=4, MLP-down type B K=4); per GEMM, ring volumes over x, y, z and data
// divided by the placement bandwidth of each axis (ClusterPreset's placement_link), times L.
// Two modes:
//   kPaperCompat  exactly as coded: bf16 = 2 bytes, the forward all-reduce counted twice (full
//                 recompute), type B's K on the forward y term, volumes in GiB divided by β's
//                 GB/s figure (so β reads as GiB/s). Reproduces axonn.md §4.5's vectors.
//   kCorrected    the type-B K factor on the backward x term (dX of MLP-down is K·H wide,
//                 axonn.md §4.2 "Discrepancy"), bytes / (bytes/s), element size and recompute
//                 as given.
// Only communication: no compute, no embedding or head, no LayerNorm statistics, latency dropped.
#pragma once
#include <cstdint>

#include "layout/Layout.h"
#include "sim/ClusterPreset.h"

namespace dhelix {

struct AxonnGrid {
  int gx = 1, gy = 1, gz = 1, gdata = 1;
  int64_t world() const { return int64_t{gx} * gy * gz * gdata; }
};

enum class AxonnMode { kPaperCompat, kCorrected };
// Recompute (layout/Layout.h): kFull runs the forward twice (its all-reduces too); kSelective
// re-runs only the attention core, no all-reduce, and is priced here as kNone.

struct AxonnShape {
  int64_t hidden = 0;        // H
  int64_t layers = 0;        // L
  int64_t seq = 0;           // S
  int64_t batch = 0;         // B, global batch in sequences
  int64_t grad_acc = 1;      // micro-batches per step (the z collectives repeat per micro-batch)
};

struct AxonnOptions {
  AxonnMode mode = AxonnMode::kCorrected;
  int elem_bytes = 2;                     // weights and activations on the wire (kPaperCompat: 2)
  Recompute recompute = Recompute::kFull;  // kPaperCompat: kFull
};

// Bytes each rank moves per step (ring convention: (g-1)/g or 2(g-1)/g of the buffer), by phase,
// summed over the four GEMMs and L layers; and seconds per axis at the placement bandwidth.
struct AxonnComm {
  double fwd_x = 0, fwd_y = 0;  // forward all-reduces (x for type A, y for type B), recompute included
  double bwd_x = 0, bwd_y = 0;  // backward input-gradient all-reduces (y for type A, x for type B)
  double z_gather = 0;          // weight all-gathers over z (forward and backward)
  double z_scatter = 0;         // weight-gradient reduce-scatters over z
  double data = 0;              // data-parallel gradient all-reduce (fp32 gradients)
  double x_s = 0, y_s = 0, z_s = 0, data_s = 0;
  double bytes_x() const { return fwd_x + bwd_x; }
  double bytes_y() const { return fwd_y + bwd_y; }
  double bytes_z() const { return z_gather + z_scatter; }
  double total_s() const { return x_s + y_s + z_s + data_s; }
};

// β per axis from placement_link with the rank order x innermost, then y, z, data:
// ip(x) = 1, ip(y) = Gx, ip(z) = Gx·Gy, ip(data) = Gx·Gy·Gz.
AxonnComm axonn_comm(const AxonnShape& shape, const AxonnGrid& grid, const ClusterPreset& cluster,
                     const AxonnOptions& opt);

}  // namespace dhelix
