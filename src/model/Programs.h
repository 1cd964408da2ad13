// Writes each unit's layer program (forward and backward op lists) for a model, a layout and a
// micro-batch shape. Collectives appear as ops marked with their group ("tp") exactly where the
// layout needs them: with tp > 1 (sequence parallel) an all-gather before each column GEMM and
// a reduce-scatter after each row GEMM, vocab-parallel embedding and cross-entropy.
//
// Buffer conventions inside a unit's environment:
//   fwd reads "x" [Ns, C] (embed reads "tokens" [N]) and writes "y" [Ns, C] (head writes "loss").
//   bwd reads "dy" [Ns, C] (head starts from its saved "dlogits") and writes "dx" [Ns, C].
//   N = B*T tokens of the micro-batch, Ns = N / tp rows of the sequence shard.
#pragma once
#include <vector>

#include "layout/Layout.h"
#include "model/ModelConfig.h"
#include "plan/Program.h"

namespace dhelix {

struct MicroBatchShape {
  int64_t B = 1;  // sequences per micro-batch
  int64_t T = 1;  // tokens per sequence
  int64_t tokens() const { return B * T; }
};

struct ModelPrograms {
  LayerProgram embed;
  LayerProgram block;  // identical for every transformer layer (weights differ, program does not)
  LayerProgram head;
};

ModelPrograms build_programs(const ModelConfig& m, const LayoutConfig& lay, const MicroBatchShape& mb);

// Buffers that cross unit boundaries and are never freed by lifetime analysis.
inline const std::vector<std::string>& boundary_buffers() {
  static const std::vector<std::string> b = {"x", "y", "dy", "dx", "tokens", "targets", "loss"};
  return b;
}

}  // namespace dhelix
