// Parameter specs: every parameter of a model with its full shape, the shard this rank holds
// under a layout, and its sharding role. The model says *what* is sharded (column, row, vocab,
// replicated); `parallel` decides *how* gradients and activations move. Units are the schedulable
// pieces: "embed", "block" (one per transformer layer) and "head".
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
};
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
  // Gradient is a partial sum over the tp group's sequence shards (sequence parallel): it must be
  // all-reduced over tp before the optimizer (Megatron's layernorm-grad all-reduce).
  bool tp_partial_grad = false;
  bool weight_decay = true;
};

struct UnitSpec {
  std::string kind;   // "embed", "block", "head"
  int layer = -1;     // block index for "block"
  std::string prefix; // "layers.3." for blocks, "" otherwise
  std::vector<ParamSpec> params;
};

// Vocabulary rows padded to a multiple of 128 * tp so the vocab shards are equal; logits of the
// padding rows are never computed (the LM head uses only real rows).
int64_t padded_vocab(const ModelConfig& m, int tp);

// All units in forward order: embed, block 0..L-1, head. Tied embeddings: the head refers to
// "wte" and owns no copy.
std::vector<UnitSpec> model_units(const ModelConfig& m, const LayoutConfig& lay, int tp_rank);

// Copies this rank's shard of `full` (shape spec.full) into `shard` (shape spec.shard).
void extract_shard(const ParamSpec& spec, const Tensor& full, Tensor& shard, int tp_rank, int tp);
// Inverse: scatters a shard into its place in `full`.
void insert_shard(const ParamSpec& spec, const Tensor& shard, Tensor& full, int tp_rank, int tp);

// Deterministic full-tensor initialisation from (seed, name): identical across layouts, so a
// tp=2 run starts from exactly the weights of the single-process run.
void init_full_param(const ParamSpec& spec, Tensor& full, uint64_t seed);

}  // namespace dhelix
