// A readable text table of an SI plan: one row per block with its forward compute ops,
// backward compute ops and collectives (strand:group:kind name), optional per-block cost, and
// the predicted total. For people and logs; the JSON (PlanIO) is what programs read.
#pragma once
#include <string>

#include "plan/BlockCost.h"
#include "plan/Program.h"
#include "plan/SIPlan.h"

namespace dhelix {

// `cost` (may be null) adds a "time" column and the model's total next to plan.predicted_s.
std::string render_plan(const SIPlan& plan, const LayerProgram& prog,
                        const BlockCost* cost = nullptr);

// "1.234 ms" / "56.7 us" / "2.5 s"; "-" for non-finite values.
std::string format_seconds(double s);

}  // namespace dhelix
