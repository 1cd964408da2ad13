// SI-plan checker: bounds, coverage, strand order, one collective per group per block.
#include "plan/PlanCheck.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>

#include "base/Error.h"
#include "plan/Windows.h"

namespace dhelix {

std::string PlanViolation::message() const {
  if (block < 0) return fmt::format("plan: rule '{}': {}", rule, detail);
  return fmt::format("block {}: rule '{}': {}", block, rule, detail);
}

namespace {

Window fwd_window(const Block& k) { return {k.fwd_begin, k.fwd_end}; }
Window bwd_window(const Block& k) { return {k.bwd_begin, k.bwd_end}; }

// Coverage and order of one strand. Windows out of bounds were reported already and are
// skipped here (bounds_ok[k] false).
void check_strand(const SIPlan& plan, const std::vector<Op>& ops, StrandKind strand,
                  const std::vector<bool>& bounds_ok, std::vector<PlanViolation>& out) {
  const char* sname = strand_name(strand);
  auto window_of = [&](const Block& k) {
    return strand == StrandKind::kForward ? fwd_window(k) : bwd_window(k);
  };
  const int n = static_cast<int>(ops.size());
  const int nb = static_cast<int>(plan.blocks.size());
  std::vector<int> first_block(n, -1);
  int prev_block = -1;
  Window prev{};
  for (int k = 0; k < nb; ++k) {
    if (!bounds_ok[k]) continue;
    Window w = window_of(plan.blocks[k]);
    if (w.empty()) continue;
    if (prev_block >= 0 && w.begin < prev.begin)
      out.push_back({k, kRuleOrder,
                     fmt::format("{} window {} comes after block {}'s {} window {}", sname,
                                 window_label(ops, w), prev_block, sname,
                                 window_label(ops, prev))});
    for (int i = w.begin; i < w.end; ++i) {
      if (first_block[i] >= 0)
        out.push_back({k, kRuleExactlyOnce,
                       fmt::format("{} op #{} '{}' appears again (first in block {})", sname, i,
                                   ops[i].name, first_block[i])});
      else
        first_block[i] = k;
    }
    prev = w;
    prev_block = k;
  }
  // Missing ops: name the first block whose window starts past the op (where it was skipped).
  for (int i = 0; i < n; ++i) {
    if (first_block[i] >= 0) continue;
    int where = -1;
    for (int k = 0; k < nb && where < 0; ++k) {
      Window w = window_of(plan.blocks[k]);
      if (bounds_ok[k] && !w.empty() && w.begin > i) where = k;
    }
    out.push_back({where, kRuleExactlyOnce,
                   fmt::format("{} op #{} '{}' is in no block{}", sname, i, ops[i].name,
                               where >= 0 ? " (skipped here)" : "")});
  }
}

}  // namespace

std::vector<PlanViolation> find_violations(const SIPlan& plan, const LayerProgram& prog) {
  std::vector<PlanViolation> out;
  if (!plan.pair.empty() && plan.pair != prog.name)
    out.push_back({-1, kRulePair,
                   fmt::format("plan is for pair '{}', program is '{}'", plan.pair, prog.name)});
  const int nf = static_cast<int>(prog.fwd.size());
  const int nbw = static_cast<int>(prog.bwd.size());
  const int nb = static_cast<int>(plan.blocks.size());
  std::vector<bool> bounds_ok(nb, true);
  for (int k = 0; k < nb; ++k) {
    const Block& b = plan.blocks[k];
    auto bad = [](int lo, int hi, int n) { return lo < 0 || hi < lo || hi > n; };
    if (bad(b.fwd_begin, b.fwd_end, nf) || bad(b.bwd_begin, b.bwd_end, nbw)) {
      bounds_ok[k] = false;
      out.push_back({k, kRuleBounds,
                     fmt::format("fwd [{},{}) of {} ops, bwd [{},{}) of {} ops", b.fwd_begin,
                                 b.fwd_end, nf, b.bwd_begin, b.bwd_end, nbw)});
      continue;
    }
    if (!b.has_fwd() && !b.has_bwd()) {
      out.push_back({k, kRuleNonEmpty, "both windows are empty"});
      continue;
    }
    // One collective per process group among both windows.
    std::map<std::string, std::string> seen;  // group -> "fwd 'name'"
    auto scan = [&](const std::vector<Op>& ops, Window w, const char* sname) {
      for (int i = w.begin; i < w.end; ++i) {
        if (!ops[i].is_collective()) continue;
        std::string here = fmt::format("{} '{}'", sname, ops[i].name);
        auto [it, fresh] = seen.emplace(ops[i].group, here);
        if (!fresh)
          out.push_back({k, kRuleGroup,
                         fmt::format("group '{}' has {} and {}", ops[i].group, it->second, here)});
      }
    };
    scan(prog.fwd, fwd_window(b), "fwd");
    scan(prog.bwd, bwd_window(b), "bwd");
  }
  if (plan.carry < 0 || plan.carry > nbw) {
    out.push_back({-1, kRuleCarry, fmt::format("carry {} is outside 0..{} (the backward program's op count)",
                                               plan.carry, nbw)});
  } else {
    for (int i = nbw - plan.carry; i < nbw; ++i) {
      const Op& op = prog.bwd[i];
      if (!only_accumulates_grads(op))
        out.push_back({-1, kRuleCarry,
                       fmt::format("bwd op #{} '{}' is carried into the next pair but {}; only trailing "
                                   "weight-gradient ops (no outputs, some gradients) may run late",
                                   i, op.name,
                                   op.is_collective()      ? "is a collective"
                                   : !op.outputs.empty() ? fmt::format("writes '{}'", op.outputs.front())
                                                         : "accumulates no gradient")});
    }
  }
  check_strand(plan, prog.fwd, StrandKind::kForward, bounds_ok, out);
  check_strand(plan, prog.bwd, StrandKind::kBackward, bounds_ok, out);
  std::stable_sort(out.begin(), out.end(),
                   [](const PlanViolation& a, const PlanViolation& b) { return a.block < b.block; });
  return out;
}

void check_plan(const SIPlan& plan, const LayerProgram& prog) {
  std::vector<PlanViolation> v = find_violations(plan, prog);
  if (v.empty()) return;
  std::string msg = fmt::format("SI plan '{}' (source '{}') for '{}' breaks {} rule(s): ",
                                plan.pair, plan.source, prog.name, v.size());
  for (size_t i = 0; i < v.size(); ++i) msg += (i ? "; " : "") + v[i].message();
  throw PlanError(msg);
}

bool windows_within_segments(const SIPlan& plan, const LayerProgram& prog) {
  std::vector<int> fe = segment_ends(prog.fwd), be = segment_ends(prog.bwd);
  auto inside = [](const std::vector<int>& ends, int a, int b) {
    return a >= b || (a >= 0 && a < static_cast<int>(ends.size()) && b <= ends[a]);
  };
  for (const Block& k : plan.blocks)
    if (!inside(fe, k.fwd_begin, k.fwd_end) || !inside(be, k.bwd_begin, k.bwd_end)) return false;
  return true;
}

}  // namespace dhelix
