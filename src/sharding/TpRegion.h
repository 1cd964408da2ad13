// Megatron's tensor-parallel regions with sequence parallelism, each a conjugate forward/backward
// pair: column (all-gather the sequence shard | reduce-scatter the input gradient), row
// (reduce-scatter the output | all-gather the output gradient), vocab (embedding rows over tp,
// cross-entropy over the vocabulary shards). Comm-free: the collectives are ops on group "tp";
// with tp = 1 the regions are the plain GEMMs. The 3D grid's regions are in Grid3D.h.
#pragma once
#include <string>
#include <vector>

#include "layout/Layout.h"
#include "model/ModelConfig.h"
#include "plan/Program.h"

namespace dhelix::sharding {

// One micro-batch under Megatron's layouts: the context every region and the CP/EP lowerings read.
struct TpRegion {
  const ModelConfig& m;
  const LayoutConfig& lay;
  int64_t B, T, N, Ns, C, tp;  // N = B*T tokens, Ns = N / tp rows of the sequence shard
  // The group the tp ranks form: "tp"; "xy" for the MoE MLP on the 3D grid (Lowering3D.cc), whose
  // x-y plane splits the tokens as sequence parallelism does.
  std::string group = "tp";

  // A collective over `group` on dim 0 (callers check tp > 1 first); its per-rank buffer is the full
  // (gathered / pre-scatter) tensor of `elems_full` elements.
  Op coll(std::string name, CollOp c, const std::string& in, const std::string& out, double elems_full) const;
};

// One linear of a region: its op tag, weight, bias ("" without) and local extent (column: the
// output features this rank holds; row: the input features).
struct TpLinear {
  std::string tag, w, bias;
  int64_t local = 0;
};

// Where a region's weight-gradient GEMM goes. Nothing in the layer reads its result (it only
// accumulates the weight's gradient), so it may run after later ops; each GEMM writes its own
// parameters' gradients, so results do not depend on the choice.
enum class WgradPolicy {
  kInline,    // right after the input gradient (column: after its reduce-scatter and the held ops)
  kHold,      // returned by row_bwd to the caller, which hands it to a later column_bwd (`held`)
  kHoldIfTp,  // kHold with tp > 1, kInline with tp = 1
  kDefer,     // into the layer's trailing ops (column_bwd's `deferred`), the held ones with it
  kSplit,     // cut in two over the weight's rows: one half inline, the other into the trailing ops
};

// fwd: [AG in -> in_g] ; out = in_g @ w^T (+b)
void column_fwd(const TpRegion& b, std::vector<Op>& ops, const TpLinear& l, const std::string& in,
                const std::string& out);
// bwd: dgrad, [RS d_in_g -> d_in], held, wgrad (placed by `own`; kDefer and kSplit need `deferred`).
void column_bwd(const TpRegion& b, std::vector<Op>& ops, const TpLinear& l, const std::string& in,
                const std::string& d_out, const std::string& d_in, WgradPolicy own, std::vector<Op> held = {},
                std::vector<Op>* deferred = nullptr);

// fwd: out_p = in @ w^T ; [RS out_p -> out]
void row_fwd(const TpRegion& b, std::vector<Op>& ops, const TpLinear& l, const std::string& in,
             const std::string& out);
// bwd: [AG d_out -> d_out_g] ; dgrad ; wgrad inline or returned (`own`: kInline, kHold, kHoldIfTp).
std::vector<Op> row_bwd(const TpRegion& b, std::vector<Op>& ops, const TpLinear& l, const std::string& in,
                        const std::string& d_out, const std::string& d_in, WgradPolicy own);

// The token embedding with its rows (vocabulary) over tp: a token outside this rank's rows gives
// zeros, the reduce-scatter sums the one real row in and leaves the sequence shard.
// fwd: lookup -> [RS -> out]        bwd: [AG d_out] -> scatter-add into the rows
void vocab_embed_fwd(const TpRegion& b, std::vector<Op>& ops, const std::string& out);
void vocab_embed_bwd(const TpRegion& b, std::vector<Op>& ops, const std::string& d_out);
// Cross-entropy over logits [N, Vl] ("logits", "targets" -> "loss", "dlogits"), vocab-parallel
// when tp > 1: local row max -> all-reduce(max) -> local sum-exp and target logit ->
// all-reduce(sum) -> loss and dlogits (written over the logits).
void vocab_xent_fwd(const TpRegion& b, std::vector<Op>& ops, int64_t Vl);

}  // namespace dhelix::sharding
