// The lowering for Megatron's layouts: tp with sequence-parallel regions (TpRegion.h), context
// parallelism's ring (CpRing.h), expert parallelism's dispatch/combine (ExpertDispatch.h), and
// the single rank as their tp = cp = ep = 1 case. Internal to sharding/: callers use
// build_programs (ModelPrograms.h), which checks the layout and annotates lifetimes.
#pragma once
#include "sharding/ModelPrograms.h"

namespace dhelix::sharding {

ModelPrograms lower_1d(const ModelConfig& m, const LayoutConfig& lay, const MicroBatchShape& mb);

}  // namespace dhelix::sharding
