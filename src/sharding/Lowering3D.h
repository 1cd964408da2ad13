// The lowering for AxoNN's 3D grid (lay.is_3d()): every linear a grid region (Grid3D.h), the
// norms exact over x, the vocabulary over y. Internal to sharding/: callers use build_programs
// (ModelPrograms.h), which checks the layout and annotates lifetimes. No CP, no MoE on the grid.
#pragma once
#include "sharding/ModelPrograms.h"

namespace dhelix::sharding {

ModelPrograms lower_3d(const ModelConfig& m, const LayoutConfig& lay, const MicroBatchShape& mb);

}  // namespace dhelix::sharding
