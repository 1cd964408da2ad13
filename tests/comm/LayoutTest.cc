// Layout rank maps against closed forms: rank = (((dp*PP+pp)*CP+cp)*TP+tp) with ep = dp mod EP
// (expert parallelism carved out of dp); every role's groups partition the world; tp groups are runs of consecutive ranks; validate_layout's text.
#include <gtest/gtest.h>

#include <set>

#include "base/Error.h"
#include "layout/Layout.h"

namespace dhelix {
namespace {

const GroupRole kRoles[] = {GroupRole::kTP, GroupRole::kEP, GroupRole::kCP, GroupRole::kPP, GroupRole::kDP,
                            GroupRole::kEDP, GroupRole::kDPCP, GroupRole::kEDPCP};

std::vector<LayoutConfig> sample_configs() {
  std::vector<LayoutConfig> out;
  for (int dp : {1, 2, 3, 6})
    for (int pp : {1, 2})
      for (int cp : {1, 2})
        for (int ep : {1, 3})
          for (int tp : {1, 2, 4})
            if (dp % ep == 0) out.push_back(LayoutConfig{dp, pp, cp, ep, tp});
  return out;
}

TEST(Layout, CoordinatesFollowMegatronOrder) {
  for (const LayoutConfig& c : sample_configs()) {
    for (int rank = 0; rank < c.world(); ++rank) {
      Layout l(c, rank);
      const RankCoord& k = l.coord();
      int closed = (((k.dp * c.pp + k.pp) * c.cp + k.cp) * c.tp + k.tp);
      ASSERT_EQ(closed, rank) << "layout " << Layout(c, 0).describe();
      ASSERT_EQ(k.ep, k.dp % c.ep);
      ASSERT_EQ(l.rank_of(k), rank);
    }
  }
}

TEST(Layout, EveryRolePartitionsTheWorld) {
  for (const LayoutConfig& c : sample_configs()) {
    Layout l(c, 0);
    for (GroupRole role : kRoles) {
      auto groups = l.all_groups(role);
      ASSERT_EQ(static_cast<int>(groups.size()) * l.size(role), c.world()) << group_role_name(role);
      std::multiset<int> seen;
      for (const auto& g : groups) {
        ASSERT_EQ(static_cast<int>(g.size()), l.size(role));
        for (size_t pos = 0; pos < g.size(); ++pos) {
          seen.insert(g[pos]);
          // Group rank pos is coordinate pos of the role; the other coordinates are shared. The ep
          // and edp groups split the dp axis: their members differ in dp (and ep, for ep groups) only.
          RankCoord a = l.coord_of(g[pos]), b = l.coord_of(g[0]);
          ASSERT_EQ(l.index_in(role, a), static_cast<int>(pos));
          const bool dp_part = role == GroupRole::kEP || role == GroupRole::kEDP;
          const bool dpcp = role == GroupRole::kDPCP;  // varies dp and cp (and so ep), nothing else
          const bool edpcp = role == GroupRole::kEDPCP;  // varies cp and dp within one ep coordinate
          if (role == GroupRole::kEP) {
            ASSERT_EQ(a.dp / c.ep, b.dp / c.ep);
          }
          if (role == GroupRole::kEDP || edpcp) {
            ASSERT_EQ(a.ep, b.ep);
          }
          for (GroupRole other : {GroupRole::kTP, GroupRole::kCP, GroupRole::kPP, GroupRole::kDP, GroupRole::kEP}) {
            if (other == role || (dp_part && (other == GroupRole::kDP || other == GroupRole::kEP)) ||
                ((dpcp || edpcp) && (other == GroupRole::kDP || other == GroupRole::kCP || other == GroupRole::kEP)) ||
                (role == GroupRole::kDP && other == GroupRole::kEP))
              continue;
            ASSERT_EQ(a.get(other), b.get(other)) << group_role_name(other) << " in " << group_role_name(role);
          }
          ASSERT_EQ(l.group_ranks(role, g[pos]), g);
        }
      }
      for (int r = 0; r < c.world(); ++r) ASSERT_EQ(seen.count(r), 1u) << "rank " << r << " in " << group_role_name(role);
    }
  }
}

TEST(Layout, TensorParallelGroupsAreContiguous) {
  for (const LayoutConfig& c : sample_configs()) {
    Layout l(c, 0);
    for (int r = 0; r < c.world(); ++r) {
      auto g = l.group_ranks(GroupRole::kTP, r);
      int base = r - r % c.tp;
      for (int i = 0; i < c.tp; ++i) ASSERT_EQ(g[static_cast<size_t>(i)], base + i);
    }
  }
}

// Expert parallelism carved out of dp (Megatron): dp = 4, ep = 2, tp = 2 on 8 ranks. Oracle: the
// closed forms: dp rank d = rank / 2; ep group = the dp ranks {2i, 2i+1}; edp = those equal mod 2.
TEST(Layout, ExpertGroupsSplitTheDataParallelRanks) {
  const LayoutConfig c{4, 1, 1, 2, 2};
  ASSERT_EQ(c.world(), 8);
  Layout l(c, 5);  // tp 1, dp 2 -> ep 0, edp 1
  EXPECT_EQ(l.coord().ep, 0);
  EXPECT_EQ(l.group_ranks(GroupRole::kDP, 5), (std::vector<int>{1, 3, 5, 7}));
  EXPECT_EQ(l.group_ranks(GroupRole::kEP, 5), (std::vector<int>{5, 7}));
  EXPECT_EQ(l.group_ranks(GroupRole::kEDP, 5), (std::vector<int>{1, 5}));
  EXPECT_EQ(l.group_ranks(GroupRole::kEDP, 7), (std::vector<int>{3, 7}));
  EXPECT_EQ(l.size(GroupRole::kEDP), 2);
  const auto e = validate_layout(LayoutConfig{3, 1, 1, 2, 1}, 3);
  ASSERT_EQ(e.size(), 1u);
  EXPECT_EQ(e[0], "dp=3 is not divisible by ep=2 (expert parallelism is carved out of the data-parallel ranks)");
}

// Context parallelism: dp = 2, cp = 2, tp = 2 on 8 ranks. Oracle: the closed form rank = (dp * 2 + cp)
// * 2 + tp; cp groups pair ranks 2 apart, the dpcp group (the weights' replicas) is every rank of one tp
// coordinate, cp fastest.
TEST(Layout, DataContextGroupSpansDpAndCp) {
  const LayoutConfig c{2, 1, 2, 1, 2};
  Layout l(c, 0);
  EXPECT_EQ(l.group_ranks(GroupRole::kCP, 5), (std::vector<int>{5, 7}));
  EXPECT_EQ(l.group_ranks(GroupRole::kDPCP, 5), (std::vector<int>{1, 3, 5, 7}));
  EXPECT_EQ(l.group_ranks(GroupRole::kDPCP, 2), (std::vector<int>{0, 2, 4, 6}));
  EXPECT_EQ(l.size(GroupRole::kDPCP), 4);
}

// The experts' replicas under cp and ep: dp = 4, cp = 2, ep = 2 on 8 ranks (rank = dp * 2 + cp).
// Oracle: the closed form: edpcp = the ranks whose dp is equal mod ep, every cp, cp fastest.
TEST(Layout, ExpertDataContextGroupSpansEdpAndCp) {
  const LayoutConfig c{4, 1, 2, 2, 1};
  Layout l(c, 0);
  EXPECT_EQ(l.group_ranks(GroupRole::kEDP, 3), (std::vector<int>{3, 7}));
  EXPECT_EQ(l.group_ranks(GroupRole::kEDPCP, 3), (std::vector<int>{2, 3, 6, 7}));
  EXPECT_EQ(l.group_ranks(GroupRole::kEDPCP, 0), (std::vector<int>{0, 1, 4, 5}));
  EXPECT_EQ(l.size(GroupRole::kEDPCP), 4);
}

TEST(Layout, DataParallelStrideIsWorldOverDp) {
  LayoutConfig c{2, 2, 1, 1, 2};
  Layout l(c, 0);
  EXPECT_EQ(l.group_ranks(GroupRole::kDP, 3), (std::vector<int>{3, 7}));
  EXPECT_EQ(l.group_ranks(GroupRole::kPP, 5), (std::vector<int>{5, 7}));
  EXPECT_EQ(l.group_ranks(GroupRole::kTP, 5), (std::vector<int>{4, 5}));
}

TEST(Layout, Describe) {
  EXPECT_EQ(Layout(LayoutConfig{2, 1, 1, 1, 2}, 1).describe(), "tp[1/2] dp[0/2]");
  EXPECT_EQ(Layout(LayoutConfig{}, 0).describe(), "single");
}

TEST(Layout, ValidateListsEveryMismatch) {
  EXPECT_TRUE(validate_layout(LayoutConfig{2, 1, 1, 1, 2}, 4).empty());
  auto e = validate_layout(LayoutConfig{2, 1, 1, 1, 2}, 3);
  ASSERT_EQ(e.size(), 1u);
  EXPECT_EQ(e[0], "world size 3 != dp*pp*cp*tp = 4 (dp=2 tp=2)");
  e = validate_layout(LayoutConfig{0, 1, -1, 1, 1}, 4);
  ASSERT_EQ(e.size(), 2u);
  EXPECT_EQ(e[0], "cp=-1 must be >= 1");
  EXPECT_EQ(e[1], "dp=0 must be >= 1");
}

// AxoNN's 4D grid: rank = ((data * Gz + z) * Gy + y) * Gx + x with the default order xyz
// (axonn.md §2.1), every group is one grid line of its axis, the x-y plane and the whole block
// are the ranks varying only along their axes, and tp_order moves the innermost axis.
LayoutConfig grid(int dp, int gx, int gy, int gz, const char* order = "xyz") {
  LayoutConfig c;
  c.dp = dp, c.tp_x = gx, c.tp_y = gy, c.tp_z = gz, c.tp_order = order;
  return c;
}

TEST(Layout, Grid3DFollowsAxonnOrder) {
  for (LayoutConfig c : {grid(2, 2, 2, 2), grid(1, 3, 1, 2), grid(2, 1, 2, 1), grid(1, 2, 3, 2)}) {
    for (int rank = 0; rank < c.world(); ++rank) {
      Layout l(c, rank);
      const RankCoord& k = l.coord();
      ASSERT_EQ(((k.dp * c.tp_z + k.z) * c.tp_y + k.y) * c.tp_x + k.x, rank);
      ASSERT_EQ(l.rank_of(k), rank);
    }
  }
}

TEST(Layout, Grid3DGroupsAreGridLines) {
  const GroupRole roles[] = {GroupRole::kX, GroupRole::kY, GroupRole::kZ, GroupRole::kDP, GroupRole::kXY,
                             GroupRole::kTPBlock};
  for (LayoutConfig c : {grid(2, 2, 2, 2), grid(1, 2, 3, 2, "zyx"), grid(2, 1, 2, 3, "yzx")}) {
    Layout l(c, 0);
    for (GroupRole role : roles) {
      auto groups = l.all_groups(role);
      ASSERT_EQ(static_cast<int>(groups.size()) * l.size(role), c.world()) << group_role_name(role);
      std::multiset<int> seen;
      for (const auto& g : groups)
        for (size_t pos = 0; pos < g.size(); ++pos) {
          seen.insert(g[pos]);
          const RankCoord a = l.coord_of(g[pos]), b = l.coord_of(g[0]);
          ASSERT_EQ(l.index_in(role, a), static_cast<int>(pos));
          // Axes outside the role are shared by the whole group.
          const bool in_x = role == GroupRole::kX || role == GroupRole::kXY || role == GroupRole::kTPBlock;
          const bool in_y = role == GroupRole::kY || role == GroupRole::kXY || role == GroupRole::kTPBlock;
          const bool in_z = role == GroupRole::kZ || role == GroupRole::kTPBlock;
          if (!in_x) {
            ASSERT_EQ(a.x, b.x);
          }
          if (!in_y) {
            ASSERT_EQ(a.y, b.y);
          }
          if (!in_z) {
            ASSERT_EQ(a.z, b.z);
          }
          if (role != GroupRole::kDP) {
            ASSERT_EQ(a.dp, b.dp);
          }
          ASSERT_EQ(l.group_ranks(role, g[pos]), g);
        }
      for (int r = 0; r < c.world(); ++r) ASSERT_EQ(seen.count(r), 1u) << "rank " << r << " in " << group_role_name(role);
    }
  }
  // Default order: x lines are consecutive ranks; with tp_order = "zyx", z lines are.
  EXPECT_EQ(Layout(grid(1, 2, 2, 2), 0).group_ranks(GroupRole::kX, 5), (std::vector<int>{4, 5}));
  EXPECT_EQ(Layout(grid(1, 2, 2, 2), 0).group_ranks(GroupRole::kZ, 5), (std::vector<int>{1, 5}));
  EXPECT_EQ(Layout(grid(1, 2, 2, 2, "zyx"), 0).group_ranks(GroupRole::kZ, 5), (std::vector<int>{4, 5}));
  EXPECT_EQ(Layout(grid(2, 2, 1, 1), 0).group_ranks(GroupRole::kDP, 1), (std::vector<int>{1, 3}));
  EXPECT_EQ(Layout(grid(1, 2, 2, 2), 0).stride(GroupRole::kZ), 4);
  EXPECT_EQ(Layout(grid(1, 2, 2, 2), 6).describe(), "x[0/2] y[1/2] z[1/2]");
}

TEST(Layout, Grid3DValidation) {
  LayoutConfig mixed = grid(1, 2, 1, 1);
  mixed.tp = 2;
  auto e = validate_layout(mixed, 4);
  ASSERT_EQ(e.size(), 1u);
  EXPECT_NE(e[0].find("cannot be mixed"), std::string::npos) << e[0];
  e = validate_layout(grid(1, 2, 2, 1, "xxz"), 4);
  ASSERT_EQ(e.size(), 1u);
  EXPECT_NE(e[0].find("tp_order=\"xxz\""), std::string::npos) << e[0];
  e = validate_layout(grid(2, 2, 1, 2), 4);
  ASSERT_EQ(e.size(), 1u);
  EXPECT_EQ(e[0], "world size 4 != dp*pp*cp*tp_x*tp_y*tp_z = 8 (dp=2 tp_x=2 tp_z=2)");
}

TEST(Layout, RejectsRankOutsideWorld) {
  EXPECT_THROW((void)Layout(LayoutConfig{2, 1, 1, 1, 2}, 4), ConfigError);
  EXPECT_THROW((void)Layout(LayoutConfig{0, 1, 1, 1, 1}, 0), ConfigError);
}

}  // namespace
}  // namespace dhelix
