// Rank-grid arithmetic for Layout. Axes from innermost to outermost: the 3D tensor-parallel axes in
// tp_order (x, y, z by default), tp, cp, pp, dp (ep and edp partition the dp axis); rank = sum over axes of coord * stride, each
// stride the product of the inner extents (Megatron's order with tp innermost; AxoNN's with x
// innermost). Composite roles (the x-y plane, the whole tensor-parallel block) are the ranks that
// vary only along their axes. Plus validate_layout's error list.
// Not here: communicators (comm builds them from all_groups()), placement on hosts.
#include "layout/Layout.h"

#include <algorithm>

#include <fmt/ranges.h>

#include "base/Error.h"

namespace dhelix {
namespace {

constexpr std::array<GroupRole, 7> kAxes = {GroupRole::kX,  GroupRole::kY,  GroupRole::kZ, GroupRole::kTP,
                                            GroupRole::kCP, GroupRole::kPP, GroupRole::kDP};

bool is_axis(GroupRole r) {
  return r != GroupRole::kXY && r != GroupRole::kTPBlock && r != GroupRole::kEP && r != GroupRole::kEDP &&
         r != GroupRole::kDPCP && r != GroupRole::kEDPCP;
}
// The partitions of the dp axis: ep runs of consecutive dp coordinates, edp strided ones (edpcp:
// edp's with every cp coordinate).
bool splits_dp(GroupRole r) { return r == GroupRole::kEP || r == GroupRole::kEDP || r == GroupRole::kEDPCP; }

int extent(const LayoutConfig& c, GroupRole r) {
  switch (r) {
    case GroupRole::kTP: return c.tp;
    case GroupRole::kEP: return c.ep;
    case GroupRole::kCP: return c.cp;
    case GroupRole::kPP: return c.pp;
    case GroupRole::kDP: return c.dp;
    case GroupRole::kX: return c.tp_x;
    case GroupRole::kY: return c.tp_y;
    case GroupRole::kZ: return c.tp_z;
    case GroupRole::kXY: return c.tp_x * c.tp_y;
    case GroupRole::kTPBlock: return c.tp_block();
    case GroupRole::kEDP: return c.ep > 0 ? c.dp / c.ep : c.dp;
    case GroupRole::kDPCP: return c.dp * c.cp;
    case GroupRole::kEDPCP: return (c.ep > 0 ? c.dp / c.ep : c.dp) * c.cp;
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
    case GroupRole::kX: return c.x;
    case GroupRole::kY: return c.y;
    case GroupRole::kZ: return c.z;
    default: break;
  }
  DHX_ASSERT(false, "{} is not an axis", group_role_name(r));
  return c.tp;
}

bool valid_order(const std::string& o) {
  std::string s = o;
  std::sort(s.begin(), s.end());
  return s == "xyz";
}

// Axes innermost first: the 3D axes in tp_order, then tp, cp, pp, dp.
std::array<GroupRole, 7> inner_to_outer(const LayoutConfig& c) {
  std::array<GroupRole, 7> out = kAxes;
  if (valid_order(c.tp_order))
    for (int i = 0; i < 3; ++i)
      out[static_cast<size_t>(i)] = c.tp_order[static_cast<size_t>(i)] == 'x'   ? GroupRole::kX
                                    : c.tp_order[static_cast<size_t>(i)] == 'y' ? GroupRole::kY
                                                                                : GroupRole::kZ;
  return out;
}

// The axes a role spans.
std::vector<GroupRole> axes_of(GroupRole role) {
  if (role == GroupRole::kXY) return {GroupRole::kX, GroupRole::kY};
  if (role == GroupRole::kTPBlock) return {GroupRole::kX, GroupRole::kY, GroupRole::kZ, GroupRole::kTP};
  if (role == GroupRole::kDPCP) return {GroupRole::kCP, GroupRole::kDP};
  return {role};
}

// "dp=2 tp=2": the dimensions that are not 1 ("all 1" when none).
std::string nontrivial_dims(const LayoutConfig& c) {
  std::string out;
  for (GroupRole r : {GroupRole::kDP, GroupRole::kPP, GroupRole::kCP, GroupRole::kEP, GroupRole::kTP, GroupRole::kX,
                      GroupRole::kY, GroupRole::kZ}) {
    if (extent(c, r) != 1) {
      const char* key = r == GroupRole::kX ? "tp_x" : r == GroupRole::kY ? "tp_y" : r == GroupRole::kZ ? "tp_z"
                                                                                                     : group_role_name(r);
      out += fmt::format("{}{}={}", out.empty() ? "" : " ", key, extent(c, r));
    }
  }
  return out.empty() ? "all 1" : out;
}

}  // namespace

const std::array<GroupRole, kNumGroupRoles>& all_group_roles() {
  static const std::array<GroupRole, kNumGroupRoles> roles = {
      GroupRole::kTP, GroupRole::kEP, GroupRole::kCP, GroupRole::kPP,      GroupRole::kDP, GroupRole::kX,
      GroupRole::kY,  GroupRole::kZ,  GroupRole::kXY, GroupRole::kTPBlock, GroupRole::kEDP, GroupRole::kDPCP,
      GroupRole::kEDPCP};
  return roles;
}

const char* recompute_name(Recompute r) {
  switch (r) {
    case Recompute::kNone: return "none";
    case Recompute::kSelective: return "selective";
    case Recompute::kFull: return "full";
  }
  return "?";
}

bool parse_recompute(const std::string& text, Recompute& out) {
  for (Recompute r : {Recompute::kNone, Recompute::kSelective, Recompute::kFull})
    if (text == recompute_name(r)) {
      out = r;
      return true;
    }
  return false;
}

const char* group_role_name(GroupRole r) {
  switch (r) {
    case GroupRole::kTP: return "tp";
    case GroupRole::kEP: return "ep";
    case GroupRole::kCP: return "cp";
    case GroupRole::kPP: return "pp";
    case GroupRole::kDP: return "dp";
    case GroupRole::kX: return "x";
    case GroupRole::kY: return "y";
    case GroupRole::kZ: return "z";
    case GroupRole::kXY: return "xy";
    case GroupRole::kTPBlock: return "tpblock";
    case GroupRole::kEDP: return "edp";
    case GroupRole::kDPCP: return "dpcp";
    case GroupRole::kEDPCP: return "edpcp";
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
    case GroupRole::kX: return x;
    case GroupRole::kY: return y;
    case GroupRole::kZ: return z;
    default: break;
  }
  DHX_ASSERT(false, "RankCoord::get({}): use Layout::index_in for a composite role", group_role_name(r));
  return 0;
}

std::vector<std::string> validate_layout(const LayoutConfig& cfg, int world_size) {
  std::vector<std::string> errors;
  bool dims_ok = true;
  for (GroupRole r : kAxes) {
    if (extent(cfg, r) < 1) {
      const char* key = r == GroupRole::kX ? "tp_x" : r == GroupRole::kY ? "tp_y" : r == GroupRole::kZ ? "tp_z"
                                                                                                     : group_role_name(r);
      errors.push_back(fmt::format("{}={} must be >= 1", key, extent(cfg, r)));
      dims_ok = false;
    }
  }
  if (!valid_order(cfg.tp_order))
    errors.push_back(fmt::format("tp_order=\"{}\" is not an order of the axes x, y, z (e.g. \"xyz\", \"yxz\")",
                                 cfg.tp_order));
  if (dims_ok && cfg.tp > 1 && cfg.is_3d())
    errors.push_back(fmt::format(
        "tp={} cannot be mixed with the 3D grid tp_x={} tp_y={} tp_z={}: Megatron's tp is the 3D grid with "
        "Gx = Gz = 1 (set tp=1 and tp_y={}), or keep tp and set tp_x = tp_y = tp_z = 1",
        cfg.tp, cfg.tp_x, cfg.tp_y, cfg.tp_z, cfg.tp));
  if (cfg.ep < 1) {
    errors.push_back(fmt::format("ep={} must be >= 1", cfg.ep));
    dims_ok = false;
  } else if (dims_ok && cfg.dp % cfg.ep != 0) {
    errors.push_back(fmt::format("dp={} is not divisible by ep={} (expert parallelism is carved out of the data-parallel "
                                 "ranks)", cfg.dp, cfg.ep));
  }
  if (dims_ok && cfg.world() != world_size) {
    errors.push_back(fmt::format("world size {} != {} = {} ({})", world_size,
                                 cfg.is_3d() ? "dp*pp*cp*tp_x*tp_y*tp_z" : "dp*pp*cp*tp", cfg.world(),
                                 nontrivial_dims(cfg)));
  }
  return errors;
}

Layout::Layout(const LayoutConfig& cfg, int rank) : cfg_(cfg), rank_(rank) {
  auto errors = validate_layout(cfg, cfg.world());
  DHX_CHECK(errors.empty(), ConfigError, "bad layout: {}", fmt::join(errors, "; "));
  DHX_CHECK(rank >= 0 && rank < cfg.world(), ConfigError, "rank {} is outside the layout's world of {} ({})",
            rank, cfg.world(), nontrivial_dims(cfg));
  coord_ = coord_of(rank);
}

int Layout::size(GroupRole r) const { return extent(cfg_, r); }

int Layout::stride(GroupRole axis) const {
  DHX_ASSERT(is_axis(axis), "stride({}): not an axis", group_role_name(axis));
  int s = 1;
  for (GroupRole r : inner_to_outer(cfg_)) {
    if (r == axis) return s;
    s *= extent(cfg_, r);
  }
  return s;
}

int Layout::index_in(GroupRole role, const RankCoord& c) const { return group_index(cfg_, role, c); }

int group_index(const LayoutConfig& cfg, GroupRole role, const RankCoord& c) {
  if (role == GroupRole::kEP) return c.dp % cfg.ep;
  if (role == GroupRole::kEDP) return c.dp / cfg.ep;
  if (role == GroupRole::kEDPCP) return c.cp + cfg.cp * (c.dp / cfg.ep);  // cp innermost, as in dpcp
  if (is_axis(role)) return c.get(role);
  // Inside the group, the axes in the grid's own order (innermost fastest).
  int idx = 0, mul = 1;
  const std::vector<GroupRole> mine = axes_of(role);
  for (GroupRole r : inner_to_outer(cfg)) {
    if (std::find(mine.begin(), mine.end(), r) == mine.end()) continue;
    idx += c.get(r) * mul;
    mul *= extent(cfg, r);
  }
  return idx;
}

RankCoord Layout::coord_of(int rank) const {
  DHX_CHECK(rank >= 0 && rank < world(), ConfigError, "rank {} is outside world {}", rank, world());
  RankCoord c;
  int rest = rank;
  for (GroupRole r : inner_to_outer(cfg_)) {
    coord_ref(c, r) = rest % extent(cfg_, r);
    rest /= extent(cfg_, r);
  }
  c.ep = c.dp % cfg_.ep;
  return c;
}

int Layout::rank_of(const RankCoord& c) const {
  int rank = 0;
  for (GroupRole r : inner_to_outer(cfg_)) {
    int v = c.get(r);
    DHX_CHECK(v >= 0 && v < extent(cfg_, r), ConfigError, "coordinate {}={} outside 0..{}", group_role_name(r), v,
              extent(cfg_, r) - 1);
    rank += v * stride(r);
  }
  return rank;
}

std::vector<int> Layout::group_ranks(GroupRole role, int rank) const {
  const RankCoord base = coord_of(rank);
  if (splits_dp(role)) {  // dp coordinates: a run of ep from a multiple of ep, or those equal mod ep
    std::vector<int> ranks;
    for (int i = 0; i < size(role); ++i) {
      RankCoord c = base;
      const int j = role == GroupRole::kEDPCP ? i / cfg_.cp : i;  // edpcp: every cp coordinate of each
      if (role == GroupRole::kEDPCP) c.cp = i % cfg_.cp;
      c.dp = role == GroupRole::kEP ? base.dp - base.dp % cfg_.ep + j : j * cfg_.ep + base.dp % cfg_.ep;
      ranks.push_back(rank_of(c));
    }
    return ranks;
  }
  const std::vector<GroupRole> mine = axes_of(role);
  std::vector<int> ranks(static_cast<size_t>(size(role)));
  // Every combination of the role's axes, the others fixed at `rank`'s coordinates.
  for (int i = 0; i < size(role); ++i) {
    RankCoord c = base;
    int rest = i;
    for (GroupRole r : inner_to_outer(cfg_)) {
      if (std::find(mine.begin(), mine.end(), r) == mine.end()) continue;
      coord_ref(c, r) = rest % extent(cfg_, r);
      rest /= extent(cfg_, r);
    }
    ranks[static_cast<size_t>(index_in(role, c))] = rank_of(c);
  }
  return ranks;
}

std::vector<std::vector<int>> Layout::all_groups(GroupRole role) const {
  // Groups ordered by their first (lowest) rank; each group's members in group-rank order.
  std::vector<std::vector<int>> groups;
  for (int r = 0; r < world(); ++r) {
    if (index_in(role, coord_of(r)) == 0) groups.push_back(group_ranks(role, r));
  }
  return groups;
}

std::string Layout::describe() const {
  std::string out;  // innermost first, as in "tp[1/2] dp[0/2]"
  for (GroupRole r : inner_to_outer(cfg_)) {
    if (size(r) > 1) out += fmt::format("{}{}[{}/{}]", out.empty() ? "" : " ", group_role_name(r), coord_.get(r), size(r));
  }
  if (cfg_.ep > 1) out += fmt::format(" ep[{}/{}]", coord_.ep, cfg_.ep);
  return out.empty() ? "single" : out;
}

}  // namespace dhelix
