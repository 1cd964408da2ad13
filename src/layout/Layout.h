// The rank grid: world = dp x pp x cp x (tensor-parallel block). The tensor-parallel block is
// either Megatron's 1D `tp` (with sequence parallelism) or AxoNN's 3D grid Gx x Gy x Gz
// (tp_x, tp_y, tp_z), never both. Ordering: the tensor-parallel axes innermost (x, y, z in
// `tp_order`, innermost first; or tp), then cp, pp, dp outermost. Expert parallelism is carved out
// of dp (Megatron's convention): ep consecutive dp ranks form an ep group (they exchange tokens for
// their experts; ep coordinate = dp mod ep), and the dp ranks holding the same experts form the
// expert-data-parallel group edp (dp / ep of them), over which expert gradients are reduced. Pure arithmetic: which
// coordinates a rank has and which ranks share a group. No MPI here; comm builds sub-communicators
// from these rank lists.
#pragma once
#include <array>
#include <string>
#include <vector>

namespace dhelix {

// kX, kY, kZ: the 3D tensor-parallel axes (AxoNN's G_x, G_y, G_z); kXY: the x-y plane (vocabulary
// layers); kTPBlock: every tensor-parallel axis together (the ranks that split one layer's weights:
// the tp group, or the x-y-z block); kEP and kEDP: the two partitions of the dp axis above; kDPCP: the
// dp and cp axes together (the ranks holding replicas of the same weights under context parallelism,
// over which their gradients are reduced: Megatron's data-parallel-with-context group); kEDPCP: edp
// and cp together (the replicas of the same experts under context parallelism, over which the
// experts' gradients are reduced). The first five keep their old values.
enum class GroupRole { kTP, kEP, kCP, kPP, kDP, kX, kY, kZ, kXY, kTPBlock, kEDP, kDPCP, kEDPCP };
constexpr int kNumGroupRoles = 13;
// Every role, in enum order (the backends build one group per role).
const std::array<GroupRole, kNumGroupRoles>& all_group_roles();
const char* group_role_name(GroupRole r);  // "tp", "ep", "cp", "pp", "dp", "x", "y", "z", "xy", "tpblock", "edp", "dpcp",
                                            // "edpcp"

// AxoNN's three overlaps of 3D tensor parallelism (parallel.overlap_ar / _rs / _ag): each on by
// default; off keeps the same ops and marks the collective blocking (waited for where issued).
struct TP3DOverlaps {
  bool ar = true;  // input-gradient all-reduce under the weight-gradient GEMM
  bool rs = true;  // weight-gradient reduce-scatters in the background (accumulated at the layer's end)
  bool ag = true;  // weight all-gathers issued one GEMM ahead of their use
  // Weight gradients summed over the step's micro-batches at block size and reduce-scattered over z
  // once, by the last micro-batch (z traffic per step 2M + 1 blocks instead of 3M; one block of
  // memory per weight). Off: every micro-batch reduce-scatters its own (AxoNN).
  bool accumulate_z = true;
};

// Activation recomputation of the transformer layers (training.recompute; Megatron-Core's
// recompute_granularity): kSelective re-runs the attention core (the attention op, or CP's ring) in
// the layer's backward instead of keeping its output and statistics; kFull keeps only the layer's
// input and re-runs every forward op the backward needs (its collectives too) at the start of the
// layer's backward. The recompute ops are ops of the block's backward program (named
// "<op>.recompute"), so everything that reads the programs sees them.
enum class Recompute { kNone, kSelective, kFull };
const char* recompute_name(Recompute r);  // "none", "selective", "full"
// "none", "selective", "full" -> the value; false for any other text.
bool parse_recompute(const std::string& text, Recompute& out);

struct LayoutConfig {
  int dp = 1, pp = 1, cp = 1, ep = 1, tp = 1;
  bool sequence_parallel = true;  // with tp > 1: SP regions (AG before column GEMMs, RS after row GEMMs)
  Recompute recompute = Recompute::kNone;
  int recompute_layers = 0;  // with recompute: only the first N transformer layers of each chunk; 0: all
  // GEMM epilogue fusion of the layer programs (sharding/Epilogues.h: GELU, its derivative and the
  // residual adds in their GEMMs' epilogues). Results: the same bits on the CPU; on a GPU one bf16
  // rounding where the pair made two. training.fuse_epilogues (auto: on a GPU).
  bool fuse_epilogues = false;
  // AxoNN's 3D tensor parallelism: weights split Gx x Gy, each block flattened and split over Gz;
  // the batch split over Gz x dp. Exclusive with tp > 1.
  int tp_x = 1, tp_y = 1, tp_z = 1;
  std::string tp_order = "xyz";  // the 3D axes from innermost (consecutive ranks) outward
  TP3DOverlaps overlap3d = {};
  // AxoNN's weight caching (parallel.keep_gathered; needs tp_z > 1): the first N transformer layers
  // of each chunk gather their weight blocks over z once a step, in the first micro-batch's forward
  // (ops marked "kept"), and every micro-batch's forward, backward and recompute reads them (the
  // executor's kept_blocks_); the blocks are held from that forward to the step's end. 0: every
  // layer gathers its blocks in each forward and again in each backward.
  int keep_gathered = 0;
  int world() const { return dp * pp * cp * tp * tp_x * tp_y * tp_z; }  // ep divides dp
  bool is_3d() const { return tp_x * tp_y * tp_z > 1; }
  // Ranks that split one layer's weights: tp, or Gx * Gy * Gz.
  int tp_block() const { return tp * tp_x * tp_y * tp_z; }
  // Ranks that read different data: dp, times Gz under 3D (the batch is split over z too).
  int data_replicas() const { return dp * tp_z; }
};

// Every mismatch between `cfg` and a world of `world_size` ranks, one readable message each
// ("world size 3 != dp*pp*cp*tp = 4 (dp=2 tp=2)"); empty when the layout fits.
std::vector<std::string> validate_layout(const LayoutConfig& cfg, int world_size);

struct RankCoord {
  int dp = 0, pp = 0, cp = 0, ep = 0, tp = 0;  // ep = dp mod the ep size (not an axis of its own)
  int x = 0, y = 0, z = 0;
  // The coordinate along an axis role; for kXY and kTPBlock the position inside that group
  // (y * Gx + x, and z * Gx * Gy + y * Gx + x), which needs the extents: use Layout::index_in.
  int get(GroupRole r) const;
};

class Layout {
 public:
  Layout(const LayoutConfig& cfg, int rank);
  const LayoutConfig& config() const { return cfg_; }
  int rank() const { return rank_; }
  int world() const { return cfg_.world(); }
  const RankCoord& coord() const { return coord_; }
  int size(GroupRole r) const;
  // Position of `c` inside its group of `role` (the group rank).
  int index_in(GroupRole role, const RankCoord& c) const;

  RankCoord coord_of(int rank) const;
  int rank_of(const RankCoord& c) const;
  // Ranks of the group of `role` that contains `rank`, in group-rank order.
  std::vector<int> group_ranks(GroupRole role, int rank) const;
  // Every group of `role` (a partition of the world), for creating sub-communicators collectively.
  std::vector<std::vector<int>> all_groups(GroupRole role) const;
  // Distance in ranks between neighbours along an axis role (kX, kY, kZ, kTP, kCP, kPP, kDP).
  int stride(GroupRole axis) const;
  // "tp[1/2] dp[0/2]", "x[1/2] z[0/2] dp[1/2]" (only dimensions of size > 1; "single" when all are 1).
  std::string describe() const;

 private:
  LayoutConfig cfg_;
  int rank_;
  RankCoord coord_;
};

// Position of `c` inside its group of `role` under `cfg` (the group rank; Layout::index_in without
// a Layout: sharding/ShardIndex's plane index).
int group_index(const LayoutConfig& cfg, GroupRole role, const RankCoord& c);

}  // namespace dhelix
