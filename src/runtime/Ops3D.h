// Op bindings of 3D tensor parallelism (AxoNN): GEMMs on gathered weight blocks, the weight
// gradient's hand-over to its reduce-scatter and accumulation, bias adds after the all-reduce, and
// LayerNorm / RMSNorm split into per-token statistics and their application, so that the norm of a
// residual stream whose features are split over x is exact (the statistics are all-reduced over x
// between the two ops). Registered into OpRegistry's table.
#pragma once
#include <map>
#include <string>

#include "runtime/OpRegistry.h"

namespace dhelix {

void add_3d_ops(std::map<std::string, OpFn>& table);

}  // namespace dhelix
