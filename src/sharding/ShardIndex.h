// Where a rank sits in its tensor-parallel block (ShardIndex) and the shard arithmetic over it:
// extract a rank's shard from a full tensor, insert it back. The roles (column, row, vocab,
// expert, grid) come from model/'s parameter specs; nothing here communicates (gathering the
// pieces of a checkpoint is the trainer's, moving gradients parallel/'s).
#pragma once
#include "layout/Layout.h"
#include "model/Params.h"
#include "tensor/Tensor.h"

namespace dhelix {

// Where this rank sits in its tensor-parallel block: Megatron's tp rank, or the 3D coordinates.
struct ShardIndex {
  int tp_rank = 0, tp = 1;
  int x = 0, y = 0, z = 0, gx = 1, gy = 1, gz = 1;
  int ep_rank = 0, ep = 1;  // expert-parallel rank: which run of experts this rank holds
  // 3D: this rank's index in its x-y plane group (group_index(kXY): the axes in tp_order,
  // innermost fastest); the MoE MLP on the grid runs on token slice `xy` of the plane.
  int xy = 0;
  static ShardIndex of(const LayoutConfig& lay, const RankCoord& c);
  bool is_3d() const { return gx * gy * gz > 1; }
  // The rank that holds vocabulary shard `vocab_rank()` of `vocab_shards()` (tp, or y under 3D).
  int vocab_rank() const { return is_3d() ? y : tp_rank; }
};

// Copies this rank's shard of `full` (shape spec.full) into `shard` (shape spec.shard).
void extract_shard(const ParamSpec& spec, const Tensor& full, Tensor& shard, const ShardIndex& at);
// Inverse: scatters a shard into its place in `full`.
void insert_shard(const ParamSpec& spec, const Tensor& shard, Tensor& full, const ShardIndex& at);
// Megatron's tp only (tests, single process).
inline ShardIndex tp_shard(int tp_rank, int tp) {
  ShardIndex s;
  s.tp_rank = tp_rank, s.tp = tp;
  return s;
}

}  // namespace dhelix
