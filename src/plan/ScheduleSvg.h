// An SVG timeline of one step schedule that a person can read: a lane per pp rank, each slot a box
// at its [start, end) from simulate_timeline (forward blue "F<mb>", backward orange "B<mb>", a
// co-executed slot split: forward top half, backward bottom half), phase changes marked, the bubble
// in the title. A picture of the cost given (no communication time), not of a measured run.
#pragma once
#include <string>

#include "plan/StepSchedule.h"

namespace dhelix {

// Every pass box is a <rect class="pass fwd|bwd [co] vs<g>"> (g = chunk / pp, the virtual-stage
// group: the W's down chunks are vs0, its up chunks vs1; odd groups are drawn lighter and dashed),
// so one rect per single-pass slot and two per co-executed slot; phase changes are
// <line class="phase">. The axis is in the cost's unit. Throws PlanError when the schedule breaks
// a rule of check_schedule (simulate_timeline checks it).
std::string render_schedule_svg(const StepSchedule& s, const PassCost& cost);

}  // namespace dhelix
