// Binds the op codes of layer programs to CPU kernels. Each binding reads its inputs from the
// unit environment, allocates its outputs (charged to the activation tracker) and accumulates
// parameter gradients into the shared ParamStore. Collectives are not here (Executor issues them).
#pragma once
#include <functional>
#include <string>
#include <vector>
#include <algorithm>

#include "model/ModelConfig.h"
#include "model/Params.h"
#include "sharding/ModelPrograms.h"
#include "plan/Program.h"
#include "kernels/cpu/Kernels.h"
#include "runtime/Env.h"
#include "parallel/ParamStore.h"

namespace dhelix {
namespace cuda {
class Blas;  // kernels/cuda/Gemm.h (a CUDA build's GEMMs)
}

// What the MoE router saw over a step: per layer and expert the tokens routed there, and the
// load-balancing loss weighted by each micro-batch's tokens (sum over layers and micro-batches of
// N_mb * aux; divided by the step's tokens it is the aux term of the objective). Filled by the
// moe_aux op; the step runner resets it per step.
struct RouterStats {
  int64_t n_experts = 0;
  std::vector<int64_t> tokens;  // [layer * n_experts + e]
  double aux_weighted = 0;
  // A GPU's statistics on their way to the host: the moe_aux op starts the copy and goes on (a wait
  // there would stop both strands' issue until the forward stream got there); settle(), at the
  // step's end, records them in the order the ops ran.
  struct Pending {
    HostMirror stats;  // [2E] floats, as moe_record_aux reads them
    const ModelConfig* model;
    int layer, cp_rank;
  };
  std::vector<Pending> pending;
  // One layer's statistics of one micro-batch (a rank that is not cp rank 0, or no routed token,
  // records nothing): its tokens per expert and its load-balancing loss, weighted.
  void record(const ModelConfig& m, int layer, int cp_rank, const float* stats, int64_t E);
  void settle();  // records what is pending (waiting for its copies)
  void clear() {
    std::fill(tokens.begin(), tokens.end(), 0);
    aux_weighted = 0;
    pending.clear();
  }
};

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
  const ShardIndex& shard;  // tp rank, or x, y, z under 3D tensor parallelism
  RouterStats* router = nullptr;  // MoE routing statistics (may be null: nothing recorded)
  int cp_rank = 0;                 // context parallelism: this rank's chunks of each sequence
  int cp = 1;
  Bf16Weights* bf16_weights = nullptr;  // this step's bf16 weight copies (GEMM precision bf16), or null
  cpu::GemmPrecision precision = cpu::GemmPrecision::kFp32;  // the run's (RunContext::kernels)
  Device device = Device::host();  // where the op's tensors live and its kernels run (RunContext::device)
  StreamHandle stream = nullptr;   // the compute stream a GPU op's kernels are enqueued on
  cuda::Blas* blas = nullptr;      // a GPU run's GEMMs (RunContext::blas), else null

  // The vocabulary shard this rank holds (tp rank, or y under 3D); the first sequence row of its
  // activations (Megatron's sequence shard; 0 under 3D, which splits no sequence); the divisor of
  // the attention heads (tp, or tp_y).
  int vocab_rank() const { return shard.vocab_rank(); }
  int64_t seq_row0(int64_t rows) const { return shard.is_3d() ? 0 : tp_rank * rows; }
  int head_shards() const { return shard.is_3d() ? shard.gy : tp; }
  // Position in its sequence of local row t (0 <= t < mb.T): t itself, or under context
  // parallelism the position in the chunk this rank holds (cpu::cp_position).
  int64_t seq_pos(int64_t t) const;

  // The same call running op `o` instead (a fused op's parts; every field above but the op is
  // copied, so a field added to OpCall must be added here too).
  OpCall with(const Op& o) const {
    OpCall c{o,      env,   unit,   params,  model,        mb,       tp_rank, tp,     act_mem,
             dloss,  shard, router, cp_rank, cp,           bf16_weights, precision};
    c.device = device;
    c.stream = stream;
    c.blas = blas;
    return c;
  }

  Tensor& in(size_t i) const { return env.at(op.inputs.at(i)); }
  // A new output tensor on the op's device (ordered on its stream), charged to the activations.
  Tensor& out_new(size_t i, const Shape& shape, DType dt = DType::kF32) const;
  ParamEntry& param(size_t i) const { return params.resolve(unit, op.params.at(i)); }
  ParamEntry& grad(size_t i) const { return params.resolve(unit, op.grads.at(i)); }
};

using OpFn = std::function<void(OpCall&)>;

// What every op binding reads off its call (the CPU bindings here, the GPU ones of CudaOps.cc).
namespace op {
int64_t rows(const Tensor& t);  // dimension 0
// Elements per row, from the shape (so a tensor of zero rows still has its width: an
// expert-parallel rank that receives no tokens).
int64_t cols(const Tensor& t);
int64_t attr(const OpCall& c, const char* key);  // InternalError naming the op when absent
int64_t attr_or(const OpCall& c, const char* key, int64_t fallback);
// Rows of this rank's LM-head (vocabulary) shard of `shard_rows` rows that are real vocabulary ids:
// shard r covers ids [r * shard_rows, ...); the padding rows past vocab_size produce nothing.
int64_t vocab_valid(const OpCall& c, int64_t shard_rows);
// The first vocabulary id of this rank's shard of `shard_rows` rows: r * shard_rows.
int64_t vocab_first(const OpCall& c, int64_t shard_rows);
// MoE's host-side work on a micro-batch's routing statistics (stats: [2E] host floats, counts per
// expert then each expert's probability sum, summed over tp): moe_record_aux adds the layer's tokens
// per expert and its load-balancing loss (weighted by the micro-batch's tokens) to the call's
// RouterStats; moe_aux_dprob is d objective / d probs[n, e] of that loss (the same for every token;
// empty when the loss is off).
void moe_record_aux(OpCall& c, const float* stats, int64_t E);
std::vector<float> moe_aux_dprob(const OpCall& c, const float* stats, int64_t E);
}  // namespace op

// Throws InternalError naming the code when no binding exists.
const OpFn& lookup_op(const std::string& code);
// Every op code with a kernel binding, sorted (what the executor can run; the simulator's coverage
// test checks each against the programs it prices).
std::vector<std::string> op_codes();

}  // namespace dhelix
