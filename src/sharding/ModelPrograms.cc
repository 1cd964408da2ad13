// build_programs: the layout checks, then one of the two lowerings (Megatron's 1D layouts or
// AxoNN's 3D grid); the lowerings themselves are in Lowering1D.cc and Lowering3D.cc.
#include "sharding/ModelPrograms.h"

#include "base/Error.h"
#include "sharding/Epilogues.h"
#include "sharding/Lowering1D.h"
#include "sharding/Lowering3D.h"

namespace dhelix {

ModelPrograms build_programs(const ModelConfig& m, const LayoutConfig& lay, const MicroBatchShape& mb) {
  ModelPrograms out = lay.is_3d() ? sharding::lower_3d(m, lay, mb) : sharding::lower_1d(m, lay, mb);
  if (lay.recompute != Recompute::kNone && lay.recompute_layers > 0) {
    LayoutConfig plain = lay;
    plain.recompute = Recompute::kNone;
    out.block_plain = (lay.is_3d() ? sharding::lower_3d(m, plain, mb) : sharding::lower_1d(m, plain, mb)).block;
    out.block_plain.name = "block_plain";
  }
  if (lay.fuse_epilogues) fuse_epilogues(out);
  for (LayerProgram* p : {&out.embed, &out.block, &out.head, &out.block_plain})
    if (!p->fwd.empty()) annotate_lifetimes(*p, boundary_buffers());
  return out;
}

void select_recompute_layers(ModelPrograms& p, const LayoutConfig& lay, const std::vector<Chunk>& chunks) {
  p.plain_unit.clear();
  if (lay.recompute == Recompute::kNone || lay.recompute_layers <= 0 || chunks.empty()) return;
  DHX_CHECK(!p.block_plain.fwd.empty(), InternalError, "recompute_layers={} but no block_plain was built",
            lay.recompute_layers);
  const int units = chunks.back().unit_end;
  p.plain_unit.assign(static_cast<size_t>(units), 0);
  for (const Chunk& c : chunks) {
    int blocks = 0;
    for (int u = c.unit_begin; u < c.unit_end; ++u) {
      if (u == 0 || u == units - 1) continue;  // the embedding, the head
      if (blocks++ >= lay.recompute_layers) p.plain_unit[static_cast<size_t>(u)] = 1;
    }
  }
}

}  // namespace dhelix
