// The flag tables of the verbs that take a config (profile, plan, simulate: apps/CmdPlan.cc): each
// verb's own flags beside the config's keys, parsed and documented by FlagTable.h.
#pragma once
#include "FlagTable.h"

namespace dhelix {

const FlagTable& profile_flags();
const FlagTable& plan_flags();
const FlagTable& simulate_flags();
// --compute-slowdown K and --comm-slowdown K (co-execution interference; simulate's and tune's).
FlagSpec compute_slowdown_flag();
FlagSpec comm_slowdown_flag();

}  // namespace dhelix
