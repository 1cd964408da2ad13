// The SI-plan checker: every rule a plan must keep before the executor may run it, reported
// with the block index and the rule's name. It reads the plan and the layer program only; it
// does not judge speed (BlockCost) or whether windows follow the segment rule (see below).
#pragma once
#include <string>
#include <vector>

#include "plan/Program.h"
#include "plan/SIPlan.h"

namespace dhelix {

// Rule names used in messages, so tests and tools can match on them.
inline constexpr const char* kRuleBounds = "window in bounds";
inline constexpr const char* kRuleNonEmpty = "block not empty";
inline constexpr const char* kRuleExactlyOnce = "each op exactly once";
inline constexpr const char* kRuleOrder = "strand order kept";
inline constexpr const char* kRuleGroup = "one collective per process group";
inline constexpr const char* kRulePair = "plan made for this layer pair";
inline constexpr const char* kRuleCarry = "carried ops write nothing";

struct PlanViolation {
  int block = -1;    // block index, or -1 for the plan as a whole
  std::string rule;  // one of the kRule* names
  std::string detail;
  std::string message() const;  // "block 3: rule 'strand order kept': ..."
};

// All violations, in block order (empty when the plan is legal).
//   bounds:      0 <= begin <= end <= #ops of the strand;
//   non-empty:   a block holds at least one op;
//   exactly-once: each op of each strand is in exactly one block (reported where it is
//                 skipped or repeated);
//   order:       a strand's non-empty windows appear in increasing op order (windows are
//                contiguous by construction, so order + exactly-once = the strand runs its
//                program order, and every op's inputs are produced by earlier ops);
//   group:       at most one collective per Op::group among a block's fwd and bwd ops. A
//                window holding a collective and later compute that reads its result is legal
//                (the "dependent strand": the executor waits on the collective first).
//   pair:        plan.pair, when set, equals prog.name;
//   carry:       0 <= plan.carry <= #bwd ops, and each carried (trailing) backward op is a compute
//                op that writes no buffer (it only accumulates parameter gradients), so nothing
//                after its pair -- the unit below, the next pair -- can depend on it.
std::vector<PlanViolation> find_violations(const SIPlan& plan, const LayerProgram& prog);

// Throws PlanError listing every violation (the first one leads the message).
void check_plan(const SIPlan& plan, const LayerProgram& prog);

// True when no window crosses a segment boundary (segment_ids). Plans from the search and the
// default plan satisfy it; the executor also runs plans that do not.
bool windows_within_segments(const SIPlan& plan, const LayerProgram& prog);

}  // namespace dhelix
