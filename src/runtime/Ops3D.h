// Op bindings of 3D tensor parallelism (AxoNN): GEMMs on gathered weight blocks, the weight
// gradient's hand-over to its reduce-scatter and accumulation, bias adds after the all-reduce, and
// LayerNorm / RMSNorm split into per-token statistics and their application, so that the norm of a
// residual stream whose features are split over x is exact (the statistics are all-reduced over x
// between the two ops). Registered into OpRegistry's table.
#pragma once
#include <map>
#include <string>

#include "runtime/OpRegistry.h"

namespace dhelix {

void add_3d_ops(std::map<std::string, OpFn>& table);

// The MoE MLP's token slices on the grid (grid_rows / grid_cols; the CPU's and the GPU's bindings
// share this geometry). grid_rows reads the stream gathered over x, [Gx N, Cx] with Cx = C / Gx
// (piece x at rows x N), and keeps rows [r0, r0 + Ns) of each piece, Ns = N / (Gx Gy), r0 = xy Ns.
struct GridRows {
  int gx;
  int64_t Cx, N, Ns, C, r0;
};
GridRows grid_rows_of(const OpCall& c, const Tensor& gathered);
// grid_cols reads the slices gathered over the plane, [N, C], and keeps columns [c0, c0 + Cx).
struct GridCols {
  int64_t N, C, Cx, c0;
};
GridCols grid_cols_of(const OpCall& c, const Tensor& gathered);

}  // namespace dhelix
