// Two reference SI plans that need no profile: the default rule (each collective beside the
// next compute segment of the other strand) and the sequential plan (no overlap at all). Both
// keep windows inside segments and always pass check_plan. The search lives in PlanSearch.h.
#pragma once
#include "plan/Program.h"
#include "plan/SIPlan.h"

namespace dhelix {

// Walks both strands segment by segment:
//   fwd collective + bwd compute segment  -> one block (and the mirror case);
//   both compute                          -> the fwd segment runs alone;
//   both collective                       -> the fwd collective runs alone;
//   one strand exhausted                  -> the other's segments run alone.
// source = "default".
SIPlan default_plan(const LayerProgram& prog);

// Cover plan: every collective beside a compute window of the other strand, sized so that the
// other strand's compute is shared among the collectives that must hide under it. Walks both
// strands op by op:
//   collective of S facing compute segment G of S' -> one block: the collective and the first
//     1/n of G by FLOPs (at least one op), where n counts this and the following collectives of
//     S separated only by small compute (< 10% of S's largest compute segment): those must also
//     hide under G;
//   both compute -> the strand whose segment leads to a collective runs it alone (the smaller
//     one when both do; backward on a tie), so its collective then faces the other's compute;
//     neither leads to a collective -> both in one block;
//   both collective -> the forward collective alone.
// Then extend_over_independent_tails. Windows hold at most one collective and stay inside segments
// except for those independent tails. source = "cover". The runtime uses it when no plan file is
// given.
SIPlan cover_plan(const LayerProgram& prog);

// Moves into a window that ends with a collective the strand's following compute ops that do not
// read the collective's output (taken from the strand's next window; emptied blocks are dropped),
// so the collective also runs under its own strand's independent work (dgrad-RS beside wgrad).
void extend_over_independent_tails(SIPlan& plan, const LayerProgram& prog);

// Sets plan.carry (SIPlan::carry) to the backward program's trailing ops that write no buffer and
// accumulate gradients (weight-gradient GEMMs) when the plan's first collective has only small
// compute of the other strand beside it (below 10% of that strand's largest compute segment);
// else 0. cover_plan ends with it.
void carry_trailing_wgrads(SIPlan& plan, const LayerProgram& prog);

// Plan for a pair of (forward program, backward program) of any two units: cover_plan; when neither
// strand has a collective, one block of the whole backward, then one of the whole forward (the
// forward strand reuses the memory the backward freed). The runtime's default for every pair.
SIPlan pair_default_plan(const std::vector<Op>& fwd, const std::vector<Op>& bwd);

// Forward strand first, then backward, one segment per block. source = "sequential".
SIPlan sequential_plan(const LayerProgram& prog);

}  // namespace dhelix
