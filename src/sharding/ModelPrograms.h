// A model's layer programs under a layout: build_programs lowers model/'s one description of each
// unit (model/UnitDesc.h: embed, block, head), walked by sharding/UnitLowering for every layout,
// into forward and backward op lists, with collectives marked by their group
// ("tp", "cp", "ep"; "x", "y", "z" on the 3D grid) exactly where the layout needs them. Pure data:
// nothing here communicates; the executor, profiler, planner and simulator read the result.
//
// Buffer conventions inside a unit's environment:
//   fwd reads "x" [Ns, C] (embed reads "tokens" [N]) and writes "y" [Ns, C] (head writes "loss").
//   bwd reads "dy" [Ns, C] (head starts from its saved "dlogits") and writes "dx" [Ns, C].
//   N = B*T tokens of the micro-batch, Ns = N / tp rows of the sequence shard ([N, C/Gx] on 3D).
#pragma once
#include <string>
#include <vector>

#include "layout/Layout.h"
#include "model/ModelConfig.h"
#include "plan/Program.h"
#include "plan/StepSchedule.h"

namespace dhelix {

struct MicroBatchShape {
  int64_t B = 1;  // sequences per micro-batch
  int64_t T = 1;  // tokens per sequence
  int64_t tokens() const { return B * T; }
};

// What the epilogue-fusion rewrite (sharding/Epilogues.h) made of a model's programs.
struct EpilogueFusions {
  int gelu = 0;      // linear_gelu ops made
  int dgelu = 0;     // linear_dgrad_gelu
  int residual = 0;  // linear_residual
  int total() const { return gelu + dgelu + residual; }
  EpilogueFusions& operator+=(const EpilogueFusions& o) {
    gelu += o.gelu, dgelu += o.dgelu, residual += o.residual;
    return *this;
  }
};

struct ModelPrograms {
  LayerProgram embed;
  // Identical for every transformer layer (weights differ, program does not), but for the per-layer
  // options below: the program of each chunk's first layer (recompute as the layout says, weight
  // blocks kept with keep_gathered > 0).
  LayerProgram block;
  LayerProgram head;
  // The per-layer options -- recompute_layers = N > 0 (only the first N layers of each chunk
  // recompute) and keep_gathered = K > 0 (only the first K keep their gathered weight blocks) --
  // make the layers past them run another block: "block_plain" (no recompute ops, the same
  // forward), "block_gathering" (gathers its weight blocks again in its backward) or
  // "block_plain_gathering" (both). select_block_variants marks which unit runs which; an empty
  // unit_variant: every transformer layer runs `block`.
  std::vector<LayerProgram> variants;
  std::vector<int> unit_variant;  // [unit] -> index into variants; -1: `block`
  EpilogueFusions fusions;        // with lay.fuse_epilogues: the fused ops made, over all programs
  // The program unit `unit` of `kind` ("embed", "block", "head") runs.
  const LayerProgram& program(int unit, const std::string& kind) const {
    if (kind == "embed") return embed;
    if (kind == "head") return head;
    if (unit >= 0 && static_cast<size_t>(unit) < unit_variant.size() && unit_variant[static_cast<size_t>(unit)] >= 0)
      return variants.at(static_cast<size_t>(unit_variant[static_cast<size_t>(unit)]));
    return block;
  }
  // The block variant named `name` ("block" itself too), or null when none was built.
  const LayerProgram* block_named(const std::string& name) const;
  // Every program built: embed, block, head, then the variants.
  std::vector<LayerProgram*> all();
  std::vector<const LayerProgram*> all() const;
};

// The block program of a chunk's `index`-th transformer layer (0-based) under the per-layer
// options: "block", "block_plain", "block_gathering" or "block_plain_gathering".
std::string block_variant_name(const LayoutConfig& lay, int index);

// Megatron's recompute_num_layers ("block" method) and AxoNN's weight caching by layer: with
// lay.recompute_layers = N > 0 (and recompute on), the first N transformer layers of each chunk (a
// pipeline stage, or a virtual stage of the interleaved and W schedules; the one chunk of a single
// stage) recompute; with lay.keep_gathered = K > 0 the first K keep their gathered weight blocks;
// the others run the variant block_variant_name names. Units: 0 the embedding, 1..L the layers,
// L + 1 the head (chunks in forward order).
void select_block_variants(ModelPrograms& p, const LayoutConfig& lay, const std::vector<Chunk>& chunks);

// Megatron's layouts (tp with sequence parallelism, cp, ep: sharding/Lowering1D) or AxoNN's 3D grid
// (lay.is_3d(): sharding/Lowering3D), with lay.fuse_epilogues the GEMM epilogues fused
// (sharding/Epilogues.h), lifetimes annotated. Throws ConfigError for a layout the
// model cannot run on, naming the fields.
ModelPrograms build_programs(const ModelConfig& m, const LayoutConfig& lay, const MicroBatchShape& mb);

// Buffers that cross unit boundaries and are never freed by lifetime analysis.
inline const std::vector<std::string>& boundary_buffers() {
  static const std::vector<std::string> b = {"x", "y", "dy", "dx", "tokens", "targets", "loss"};
  return b;
}

}  // namespace dhelix
