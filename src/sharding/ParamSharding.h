// The parameter list of model/ (model_params: every tensor unsharded, with its role) sharded for a
// layout: each ParamSpec's shard shape, grid axes, partial-gradient flag and replica count under
// Megatron's tp / ep or AxoNN's 3D grid. Shapes only: the elements a shard holds are ShardIndex.h's
// (extract_shard / insert_shard), and nothing here allocates or communicates.
#pragma once
#include <vector>

#include "layout/Layout.h"
#include "model/ModelConfig.h"
#include "model/Params.h"

namespace dhelix {

// All units in forward order: embed, block 0..L-1, head, with the shards this layout gives every
// rank (the same shapes on each rank of a block). Tied embeddings: the head refers to "wte" and
// owns no copy. Throws ConfigError naming the field when a dimension does not split.
std::vector<UnitSpec> model_units(const ModelConfig& m, const LayoutConfig& lay, int tp_rank);

}  // namespace dhelix
