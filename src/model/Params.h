// Parameter specs: every parameter of a model with its full shape, the shard this rank holds
// under a layout, and its sharding role. The model says *what* is sharded (column, row, vocab,
// replicated); sharding/ decides *how* activations move and holds the shard arithmetic
// (ShardIndex.h), parallel/ how gradients do. Units are the schedulable pieces: "embed", "block"
// (one per transformer layer) and "head".
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "layout/Layout.h"
#include "model/ModelConfig.h"
#include "tensor/Tensor.h"

namespace dhelix {

enum class ShardRole {
  kReplicated,  // same on every tp rank (norm weights, row-parallel bias, positions)
  kColumn,      // rows of W[out,in] split over tp (fused parts split separately)
  kRow,         // columns of W[out,in] split over tp
  kVocab,       // rows of the [padded_vocab, C] embedding split over tp
  kExpert,      // MoE experts stacked on dim 0 ([E * rows, cols]): contiguous runs of E / ep experts
                // over the ep group (whole experts per rank; replicated over tp)
  kGrid,        // 3D tensor parallelism: dim 0 split over grid_rows, dim 1 over grid_cols (x or y);
                // with z_flat the block is flattened and split over z (ParamSpec)
};

// An axis of the 3D grid that splits a tensor dimension.
enum class GridAxis { kNone, kX, kY };

const char* shard_role_name(ShardRole r);

enum class ParamInit { kNormal, kOnes, kZeros };

struct ParamSpec {
  std::string name;         // global name: "wte", "layers.3.wqkv", "final_norm.weight"
  std::string local;        // name inside its unit's program: "wqkv", "wte"
  Shape full;               // unsharded shape
  Shape shard;              // this rank's shape
  ShardRole role = ShardRole::kReplicated;
  // For kColumn: the fused parts of dim 0 (e.g. q, k, v rows), each split evenly over tp.
  std::vector<int64_t> parts;
  ParamInit init = ParamInit::kNormal;
  double init_std = 0.02;
  // kGrid: which grid axis splits dim 0 (by `parts` when given) and dim 1 (2-D tensors); z_flat:
  // the [rows, cols] block is flattened and split into tp_z contiguous pieces.
  GridAxis grid_rows = GridAxis::kNone, grid_cols = GridAxis::kNone;
  bool z_flat = false;
  // Gradient is a partial sum over the tokens split inside the tensor-parallel block: tp's
  // sequence shards (Megatron's layernorm-grad all-reduce) or z's batch shards (3D tensor
  // parallelism: a parameter not reduce-scattered over z). All-reduced over that group before
  // the optimizer.
  bool partial_grad = false;
  // Partial over the whole tensor-parallel block instead (all-reduced over it): on the 3D grid the
  // MoE MLP runs on a slice of the x-y plane's tokens with whole features (moe_mlp), so each of the
  // block's ranks sums other tokens into the router's and its experts' gradients.
  bool partial_grad_block = false;
  // Read by the MoE MLP (router, experts). On the 3D grid these are not split over the grid.
  bool moe_mlp = false;
  // Ranks of the tensor-parallel block holding an identical copy of this shard (the global norm
  // counts each element once).
  int replicas = 1;
  bool weight_decay = true;
};

struct UnitSpec {
  std::string kind;   // "embed", "block", "head"
  int layer = -1;     // block index for "block"
  std::string prefix; // "layers.3." for blocks, "" otherwise
  std::vector<ParamSpec> params;
};

// Vocabulary rows padded to a multiple of 128 * shards (tp, or tp_y under 3D) so the vocab shards
// are equal; logits of the padding rows are never computed (the LM head uses only real rows).
int64_t padded_vocab(const ModelConfig& m, int shards);
// How many shards the vocabulary rows are split into under `lay` (tp, or tp_y).
inline int vocab_shards(const LayoutConfig& lay) { return lay.is_3d() ? lay.tp_y : lay.tp; }

// The model's parameters, described once (the steps of UnitDesc.h, in order): all units in forward order (embed, block 0..L-1, head),
// each tensor unsharded (shard == full; the vocabulary rows unpadded) with its role (column with
// its fused parts, row, vocab, expert, replicated) and init. Tied embeddings: the head refers to
// "wte" and owns no copy. sharding/ParamSharding.h's model_units shards it for a layout.
std::vector<UnitSpec> model_params(const ModelConfig& m);

// The data-parallel gradient buckets of a rank's parameters: how ParamStore lays out its flat
// buffers and GradSync reduces them, and how the simulators price that reduction (one rule for
// both). `units` are the model's units with the parameters this rank holds (the others empty; the
// head of a stage holding a tied embedding's copy lists "wte"). Walked backward (head first), each
// unit's parameters in reverse declaration order (about the order backward produces their
// gradients); a bucket closes once it holds `bucket_elems` elements, so it is complete early in
// the backward pass. Alone in a bucket: each parameter of unit 0 (the token embedding's may be
// reduced early by GradSync's sparse path; the others wait for the last backward ops, so the
// exposed tail stays as short as it can be), the head's copy of "wte", each expert weight (reduced
// over edp, not dp). Element counts are the shards', unpadded.
struct GradBucketPlan {
  std::vector<std::pair<int, int>> members;  // (unit, index into units[unit].params), layout order
  int min_unit = 0;                          // complete once backward finished this unit
  bool expert = false;
  int64_t elems = 0;
};
std::vector<GradBucketPlan> plan_grad_buckets(const std::vector<UnitSpec>& units, int64_t bucket_elems);
// 1/16 of a rank's parameter elements, clamped to [64Ki, 4Mi]: a small model still gets several
// buckets (one per layer), so the dp all-reduce of early buckets overlaps the backward of later
// layers; a large one gets 16 MiB buckets (fewer, larger messages).
int64_t auto_bucket_elems(int64_t param_elems);

// Deterministic full-tensor initialisation from (seed, name): identical across layouts, so a
// tp=2 run starts from exactly the weights of the single-process run.
void init_full_param(const ParamSpec& spec, Tensor& full, uint64_t seed);

}  // namespace dhelix
