// Rank-grid arithmetic for Layout: rank = ((((dp*PP + pp)*CP + cp)*EP + ep)*TP + tp), i.e.
// tp innermost and dp outermost (Megatron order), plus validate_layout's error list.
// Not here: communicators (comm builds them from all_groups()), placement on hosts.
#include "layout/Layout.h"

#include <array>

#include "base/Error.h"

namespace dhelix {
namespace {

// Dimensions from innermost to outermost.
constexpr std::array<GroupRole, 5> kInnerToOuter = {GroupRole::kTP, GroupRole::kEP, GroupRole::kCP,
                                                    GroupRole::kPP, GroupRole::kDP};

int extent(const LayoutConfig& c, GroupRole r) {
  switch (r) {
    case GroupRole::kTP: return c.tp;
    case GroupRole::kEP: return c.ep;
    case GroupRole::kCP: return c.cp;
    case GroupRole::kPP: return c.pp;
    case GroupRole::kDP: return c.dp;
  }
  return 1;
}

int& coord_ref(RankCoord& c, GroupRole r) {
  switch (r) {
    case GroupRole::kTP: return c.tp;
    case GroupRole::kEP: return c.ep;
    case GroupRole::kCP: return c.cp;
    case GroupRole::kPP: return c.pp;
    case GroupRole::kDP: return c.dp;
  }
  return c.tp;
}

// Distance in ranks between neighbours along `role` (product of the inner extents).
int stride_of(const LayoutConfig& c, GroupRole role) {
  int s = 1;
  for (GroupRole r : kInnerToOuter) {
    if (r == role) return s;
    s *= extent(c, r);
  }
  return s;
}

// "dp=2 tp=2": the dimensions that are not 1 ("all 1" when none).
std::string nontrivial_dims(const LayoutConfig& c) {
  std::string out;
  for (GroupRole r : {GroupRole::kDP, GroupRole::kPP, GroupRole::kCP, GroupRole::kEP, GroupRole::kTP}) {
    if (extent(c, r) != 1) out += fmt::format("{}{}={}", out.empty() ? "" : " ", group_role_name(r), extent(c, r));
  }
  return out.empty() ? "all 1" : out;
}

}  // namespace

const char* group_role_name(GroupRole r) {
  switch (r) {
    case GroupRole::kTP: return "tp";
    case GroupRole::kEP: return "ep";
    case GroupRole::kCP: return "cp";
    case GroupRole::kPP: return "pp";
    case GroupRole::kDP: return "dp";
  }
  return "?";
}

int RankCoord::get(GroupRole r) const {
  switch (r) {
    case GroupRole::kTP: return tp;
    case GroupRole::kEP: return ep;
    case GroupRole::kCP: return cp;
    case GroupRole::kPP: return pp;
    case GroupRole::kDP: return dp;
  }
  return 0;
}

std::vector<std::string> validate_layout(const LayoutConfig& cfg, int world_size) {
  std::vector<std::string> errors;
  bool dims_ok = true;
  for (GroupRole r : kInnerToOuter) {
    if (extent(cfg, r) < 1) {
      errors.push_back(fmt::format("{}={} must be >= 1", group_role_name(r), extent(cfg, r)));
      dims_ok = false;
    }
  }
  if (dims_ok && cfg.world() != world_size) {
    errors.push_back(fmt::format("world size {} != dp*pp*cp*ep*tp = {} ({})", world_size, cfg.world(),
                                 nontrivial_dims(cfg)));
  }
  return errors;
}

Layout::Layout(const LayoutConfig& cfg, int rank) : cfg_(cfg), rank_(rank) {
  for (GroupRole r : kInnerToOuter) {
    DHX_CHECK(extent(cfg, r) >= 1, ConfigError, "layout {}={} must be >= 1", group_role_name(r), extent(cfg, r));
  }
  DHX_CHECK(rank >= 0 && rank < cfg.world(), ConfigError, "rank {} is outside the layout's world of {} ({})",
            rank, cfg.world(), nontrivial_dims(cfg));
  coord_ = coord_of(rank);
}

int Layout::size(GroupRole r) const { return extent(cfg_, r); }

RankCoord Layout::coord_of(int rank) const {
  DHX_CHECK(rank >= 0 && rank < world(), ConfigError, "rank {} is outside world {}", rank, world());
  RankCoord c;
  int rest = rank;
  for (GroupRole r : kInnerToOuter) {
    coord_ref(c, r) = rest % extent(cfg_, r);
    rest /= extent(cfg_, r);
  }
  return c;
}

int Layout::rank_of(const RankCoord& c) const {
  int rank = 0;
  for (auto it = kInnerToOuter.rbegin(); it != kInnerToOuter.rend(); ++it) {
    int v = c.get(*it);
    DHX_CHECK(v >= 0 && v < extent(cfg_, *it), ConfigError, "coordinate {}={} outside 0..{}",
              group_role_name(*it), v, extent(cfg_, *it) - 1);
    rank = rank * extent(cfg_, *it) + v;
  }
  return rank;
}

std::vector<int> Layout::group_ranks(GroupRole role, int rank) const {
  RankCoord c = coord_of(rank);
  int stride = stride_of(cfg_, role);
  int base = rank - c.get(role) * stride;
  std::vector<int> ranks(static_cast<size_t>(size(role)));
  for (int i = 0; i < size(role); ++i) ranks[static_cast<size_t>(i)] = base + i * stride;
  return ranks;
}

std::vector<std::vector<int>> Layout::all_groups(GroupRole role) const {
  // Groups ordered by their first (lowest) rank; each group's members in coordinate order.
  std::vector<std::vector<int>> groups;
  for (int r = 0; r < world(); ++r) {
    if (coord_of(r).get(role) == 0) groups.push_back(group_ranks(role, r));
  }
  return groups;
}

std::string Layout::describe() const {
  std::string out;  // innermost first, as in "tp[1/2] dp[0/2]"
  for (GroupRole r : kInnerToOuter) {
    if (size(r) > 1) out += fmt::format("{}{}[{}/{}]", out.empty() ? "" : " ", group_role_name(r), coord_.get(r), size(r));
  }
  return out.empty() ? "single" : out;
}

}  // namespace dhelix
