// The helpers every lowering of sharding/ builds its ops with: a compute op, a collective op, the
// activation mark, and the cost terms of a GEMM and of an elementwise pass. Internal to sharding/
// (the lowerings and their regions); what a program *is* lives in plan/Program.h.
#pragma once
#include <string>
#include <vector>

#include "plan/Program.h"

namespace dhelix::sharding {

inline constexpr double kF = 4.0;  // bytes per fp32 element

// A compute op of a layer program: its binding, the buffers it reads and writes, the parameters it
// reads and those whose gradients it accumulates into.
Op compute_op(std::string name, std::string code, std::vector<std::string> in, std::vector<std::string> out,
              std::vector<std::string> params = {}, std::vector<std::string> grads = {});

// How the executor waits for a collective (Executor::run_op): at the end of the SI block it was
// issued in (the default), right where it is issued ("blocking"), or only where a later op reads
// its output ("background": not at its block's end).
enum class CollWait { kBlockEnd, kBlocking, kBackground };

// A collective on process-group role `group` ("tp", "cp", "ep", "x", "y", "z"): its per-rank
// buffer is `bytes` (the full, gathered or pre-scatter tensor's), counted as moved and as sent.
Op collective_op(std::string name, CollOp c, std::string group, std::vector<std::string> in, std::string out,
                 double bytes, CollWait wait = CollWait::kBlockEnd);

// Marks a collective of activations or of their gradients (the "activation" attr: it may move in
// bf16, RunContext::activation_wire); weight gathers, gradient reductions, statistics and counts
// stay unmarked.
inline Op activation(Op op) {
  op.attrs["activation"] = 1;
  return op;
}

// GEMM extents as attrs gemm_rows / gemm_in / gemm_out (what a pricer that times GEMM shapes
// reads): forward Y[rows x out] = X[rows x in] W^T; input gradient dX[rows x out] = dY[rows x in] W;
// weight gradient dW[in x out] = dY^T[in x rows] X[rows x out] (the contraction over the rows).
void gemm_cost(Op& op, double rows, double in, double out);
// An elementwise pass over `elems`: flops_per FLOPs each, `passes` fp32 reads or writes each.
void elem_cost(Op& op, double elems, double flops_per = 1, double passes = 2);

}  // namespace dhelix::sharding
