// The rank grid: world = dp x pp x cp x ep x tp with Megatron's ordering (tp innermost, then
// ep, cp, pp, dp outermost). Pure arithmetic: which coordinates a rank has and which ranks
// share a group. No MPI here; comm builds sub-communicators from these rank lists.
#pragma once
#include <string>
#include <vector>

namespace dhelix {

enum class GroupRole { kTP, kEP, kCP, kPP, kDP };
const char* group_role_name(GroupRole r);  // "tp", "ep", "cp", "pp", "dp"

struct LayoutConfig {
  int dp = 1, pp = 1, cp = 1, ep = 1, tp = 1;
  bool sequence_parallel = true;  // with tp > 1: SP regions (AG before column GEMMs, RS after row GEMMs)
  int world() const { return dp * pp * cp * ep * tp; }
};

// Every mismatch between `cfg` and a world of `world_size` ranks, one readable message each
// ("world size 3 != dp*pp*cp*ep*tp = 4 (dp=2 tp=2)"); empty when the layout fits.
std::vector<std::string> validate_layout(const LayoutConfig& cfg, int world_size);

struct RankCoord {
  int dp = 0, pp = 0, cp = 0, ep = 0, tp = 0;
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

  RankCoord coord_of(int rank) const;
  int rank_of(const RankCoord& c) const;
  // Ranks of the group of `role` that contains `rank`, in group-rank order.
  std::vector<int> group_ranks(GroupRole role, int rank) const;
  // Every group of `role` (a partition of the world), for creating sub-communicators collectively.
  std::vector<std::vector<int>> all_groups(GroupRole role) const;
  // "tp[1/2] dp[0/2]" (only dimensions of size > 1; "single" when all are 1).
  std::string describe() const;

 private:
  LayoutConfig cfg_;
  int rank_;
  RankCoord coord_;
};

}  // namespace dhelix
