// Internal to model/: what the layer-program builders share (Programs.cc for Megatron's layouts,
// Programs3D.cc for AxoNN's 3D grid). Not part of the layer's interface (model/Programs.h).
#pragma once
#include <string>
#include <vector>

#include "model/Programs.h"

namespace dhelix::detail {

inline constexpr double kF = 4.0;  // bytes per fp32 element

// A compute op of a layer program: its binding, the buffers it reads and writes, the parameters it
// reads and those whose gradients it accumulates into.
Op compute_op(std::string name, std::string code, std::vector<std::string> in, std::vector<std::string> out,
              std::vector<std::string> params, std::vector<std::string> grads);

// Marks a collective of activations or of their gradients (the "activation" attr: it may move in
// bf16, RunContext::activation_wire); weight gathers, gradient reductions, statistics and counts
// stay unmarked.
inline Op activation(Op op) {
  op.attrs["activation"] = 1;
  return op;
}

// build_programs for a layout with a 3D grid (lay.is_3d()), lifetimes annotated.
ModelPrograms build_programs_3d(const ModelConfig& m, const LayoutConfig& lay, const MicroBatchShape& mb);

}  // namespace dhelix::detail
