// AxoNN's 3D tensor parallelism as regions: one linear on the Gx x Gy x Gz grid (the weight
// block gathered over z, the GEMM, its partial output all-reduced over x or y; backward the
// input-gradient all-reduce and the weight gradient reduce-scattered over z) and the norm exact
// over the features split on x. Comm-free: collectives are ops on groups "x", "y", "z". Megatron's
// 1D regions are in TpRegion.h; the 3D layer programs that use these are in Lowering3D.cc.
#pragma once
#include <string>
#include <vector>

#include "layout/Layout.h"
#include "model/ModelConfig.h"
#include "model/UnitDesc.h"
#include "plan/Program.h"
#include "sharding/OpFactory.h"

namespace dhelix::sharding {

// ==== 3D tensor parallelism (AxoNN) ============================================================
// Activations: the residual stream is [N, C/Gx] (features over x, replicated over y); a type-A
// layer (QKV, MLP-up) reads [N, in/Gx] and writes [N, out/Gy]; a type-B layer (attention-out,
// MLP-down) reads [N, in/Gy] and writes [N, out/Gx]. Per linear: all-gather of the weight block
// over z (when tp_z > 1), GEMM, all-reduce of the partial output over x (A) or y (B); backward:
// the block all-gathered again, input-gradient GEMM, its all-reduce over y (A) or x (B), the
// weight-gradient GEMM, its reduce-scatter over z into this rank's flat shard, accumulated into the
// gradient by a grad_accum op. The overlaps (LayoutConfig::overlap3d) only move ops and mark
// collectives blocking; the kernels and their inputs are the same, so results are bitwise equal.
struct Grid3D {
  const ModelConfig& m;
  const LayoutConfig& lay;
  int64_t B, T, N, C;  // N = B*T tokens of this x-y plane's micro-batch
  int gx, gy, gz;
  // The size of grid axis "x", "y" or "z".
  int group_size(const std::string& g) const { return g == "x" ? gx : g == "y" ? gy : gz; }
};

// AxoNN's two linear types: A ("normal": QKV, MLP-up) reads features over x and writes them over
// y; B ("transposed": attention-out, MLP-down) the reverse, so A -> B -> A needs no reshuffle.
enum class GridType { kA, kB };

// One 3D linear: its weight block's shape and the axes its activations reduce over.
struct GridLinear {
  std::string tag, w, bias;  // "attn.qkv", "wqkv", "bqkv" ("" without)
  GridType type = GridType::kA;
  int64_t rows = 0, cols = 0;  // block [out/Gy, in/Gx] (A) or [out/Gx, in/Gy] (B)
  std::string fwd_group() const { return type == GridType::kA ? "x" : "y"; }
  std::string bwd_group() const { return type == GridType::kA ? "y" : "x"; }
};

// The all-gather of `l`'s block over z into "<w>.g<suffix>" ("" when tp_z = 1: the GEMM reads the
// shard); `wait`: kBlocking right before its GEMM, kBackground when gathered a GEMM ahead (OAG).
std::string gather_block(const Grid3D& b, std::vector<Op>& ops, const GridLinear& l, const std::string& suffix,
                         CollWait wait);
// OAG across layers: the neighbouring layer's (`dir` +1 forward, -1 backward) gather of `l`'s block.
void prefetch_block(const Grid3D& b, std::vector<Op>& ops, const GridLinear& l, const std::string& suffix, int dir);
// fwd: GEMM -> all-reduce over x (A) / y (B) -> bias. `wbuf`: the gathered block ("" for the shard).
void grid_linear_fwd(const Grid3D& b, std::vector<Op>& ops, const GridLinear& l, const std::string& in,
                     const std::string& wbuf, const std::string& out);
// bwd: [bias grad] -> dgrad -> all-reduce over y (A) / x (B) -> wgrad -> reduce-scatter over z ->
// grad_accum (into `accum` with ORS: the end of the layer's backward).
void grid_linear_bwd(const Grid3D& b, std::vector<Op>& ops, const GridLinear& l, const std::string& in,
                     const std::string& d_out, const std::string& d_in, const std::string& wbuf, std::vector<Op>& accum);
// The norm exact over the features split on x (statistics all-reduced over x when Gx > 1).
void grid_norm_fwd(const Grid3D& b, std::vector<Op>& ops, const UnitStep& s);
// d_in = d_res + norm_bwd(d_out); d_res may be empty (no residual path).
void grid_norm_bwd(const Grid3D& b, std::vector<Op>& ops, const UnitStep& s, const std::string& d_out,
                   const std::string& d_res, const std::string& d_in);

}  // namespace dhelix::sharding
