// An SVG timeline of one SI plan that a person can read: a lane per strand (fwd, bwd) for
// compute and a lane per process group for collectives, blocks as shaded columns, op boxes
// labelled (full name on hover), collectives coloured by strand, a time axis from the cost.
// A picture of predictions (BlockCost), not of a measured trace.
#pragma once
#include <string>

#include "plan/BlockCost.h"
#include "plan/Program.h"
#include "plan/SIPlan.h"

namespace dhelix {

// With `cost` null (or a block priced +inf) every block gets the same width and ops split
// their strand's share evenly; the axis then counts blocks instead of seconds.
std::string render_plan_svg(const SIPlan& plan, const LayerProgram& prog,
                            const BlockCost* cost = nullptr);

}  // namespace dhelix
