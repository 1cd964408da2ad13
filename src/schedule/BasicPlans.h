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

// Forward strand first, then backward, one segment per block. source = "sequential".
SIPlan sequential_plan(const LayerProgram& prog);

}  // namespace dhelix
