// build_programs: the layout checks, then one of the two lowerings (Megatron's 1D layouts or
// AxoNN's 3D grid); the lowerings themselves are in Lowering1D.cc and Lowering3D.cc.
#include "sharding/ModelPrograms.h"

#include "base/Error.h"
#include "sharding/Lowering1D.h"
#include "sharding/Lowering3D.h"

namespace dhelix {

ModelPrograms build_programs(const ModelConfig& m, const LayoutConfig& lay, const MicroBatchShape& mb) {
  DHX_CHECK(!(m.is_moe() && lay.is_3d()), ConfigError,
            "model.family=moe does not run on the 3D grid (tp_x={} tp_y={} tp_z={}) in this build; use tp, dp and ep",
            lay.tp_x, lay.tp_y, lay.tp_z);
  ModelPrograms out = lay.is_3d() ? sharding::lower_3d(m, lay, mb) : sharding::lower_1d(m, lay, mb);
  for (LayerProgram* p : {&out.embed, &out.block, &out.head}) annotate_lifetimes(*p, boundary_buffers());
  return out;
}

}  // namespace dhelix
