// Binds the op codes of layer programs to CPU kernels. Each binding reads its inputs from the
// unit environment, allocates its outputs (charged to the activation tracker) and accumulates
// parameter gradients into the shared ParamStore. Collectives are not here (Executor issues them).
#pragma once
#include <functional>
#include <string>

#include "model/ModelConfig.h"
#include "model/Params.h"
#include "model/Programs.h"
#include "plan/Program.h"
#include "runtime/Env.h"
#include "parallel/ParamStore.h"

namespace dhelix {

struct OpCall {
  const Op& op;
  UnitEnv& env;
  const UnitSpec& unit;
  ParamStore& params;
  const ModelConfig& model;
  const MicroBatchShape& mb;
  int tp_rank;
  int tp;
  MemoryTracker* act_mem;
  float dloss;  // d(total loss)/d(per-token loss): 1 / tokens in the step (all micro-batches, all dp)

  Tensor& in(size_t i) const { return env.at(op.inputs.at(i)); }
  Tensor& out_new(size_t i, const Shape& shape, DType dt = DType::kF32) const;
  ParamEntry& param(size_t i) const { return params.resolve(unit, op.params.at(i)); }
  ParamEntry& grad(size_t i) const { return params.resolve(unit, op.grads.at(i)); }
};

using OpFn = std::function<void(OpCall&)>;

// Throws InternalError naming the code when no binding exists.
const OpFn& lookup_op(const std::string& code);

}  // namespace dhelix
