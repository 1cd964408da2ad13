// build_programs: the layout checks, then one of the two lowerings (Megatron's 1D layouts or
// AxoNN's 3D grid); the lowerings themselves are in Lowering1D.cc and Lowering3D.cc.
#include "sharding/ModelPrograms.h"

#include "base/Error.h"
#include "sharding/Epilogues.h"
#include "sharding/Lowering1D.h"
#include "sharding/Lowering3D.h"

namespace dhelix {

namespace {

ModelPrograms lower(const ModelConfig& m, const LayoutConfig& lay, const MicroBatchShape& mb) {
  return lay.is_3d() ? sharding::lower_3d(m, lay, mb) : sharding::lower_1d(m, lay, mb);
}

bool some_recompute(const LayoutConfig& lay) {
  return lay.recompute != Recompute::kNone && lay.recompute_layers > 0;
}

// The block without its recompute ops (`plain`) and/or gathering its weight blocks again (`gathering`).
std::string variant_name(bool plain, bool gathering) {
  return std::string("block") + (plain ? "_plain" : "") + (gathering ? "_gathering" : "");
}

}  // namespace

const LayerProgram* ModelPrograms::block_named(const std::string& name) const {
  if (block.name == name) return &block;
  for (const LayerProgram& v : variants)
    if (v.name == name) return &v;
  return nullptr;
}

std::vector<LayerProgram*> ModelPrograms::all() {
  std::vector<LayerProgram*> out = {&embed, &block, &head};
  for (LayerProgram& v : variants) out.push_back(&v);
  return out;
}

std::vector<const LayerProgram*> ModelPrograms::all() const {
  std::vector<const LayerProgram*> out = {&embed, &block, &head};
  for (const LayerProgram& v : variants) out.push_back(&v);
  return out;
}

std::string block_variant_name(const LayoutConfig& lay, int index) {
  const bool plain = some_recompute(lay) && index >= lay.recompute_layers;
  const bool gathering = lay.is_3d() && lay.keep_gathered > 0 && index >= lay.keep_gathered;
  return variant_name(plain, gathering);
}

ModelPrograms build_programs(const ModelConfig& m, const LayoutConfig& lay, const MicroBatchShape& mb) {
  ModelPrograms out = lower(m, lay, mb);
  // The variants the per-layer options need: each the block lowered with an option switched off.
  const bool plain = some_recompute(lay), gathering = lay.is_3d() && lay.keep_gathered > 0;
  for (int p = 0; p <= int(plain); ++p)
    for (int g = 0; g <= int(gathering); ++g) {
      if (p == 0 && g == 0) continue;
      LayoutConfig v = lay;
      if (p) v.recompute = Recompute::kNone;
      if (g) v.keep_gathered = 0;
      LayerProgram prog = lower(m, v, mb).block;
      prog.name = variant_name(p, g);
      out.variants.push_back(std::move(prog));
    }
  if (lay.fuse_epilogues) fuse_epilogues(out);
  for (LayerProgram* p : out.all())
    if (!p->fwd.empty()) annotate_lifetimes(*p, boundary_buffers());
  return out;
}

void select_block_variants(ModelPrograms& p, const LayoutConfig& lay, const std::vector<Chunk>& chunks) {
  p.unit_variant.clear();
  if (p.variants.empty() || chunks.empty()) return;
  const int units = chunks.back().unit_end;
  p.unit_variant.assign(static_cast<size_t>(units), -1);
  for (const Chunk& c : chunks) {
    int index = 0;
    for (int u = c.unit_begin; u < c.unit_end; ++u) {
      if (u == 0 || u == units - 1) continue;  // the embedding, the head
      const std::string name = block_variant_name(lay, index++);
      if (name == p.block.name) continue;
      const LayerProgram* v = p.block_named(name);
      DHX_CHECK(v, InternalError,
                "layer {} should run '{}' (recompute_layers={}, keep_gathered={}) but no such block was built", u, name,
                lay.recompute_layers, lay.keep_gathered);
      p.unit_variant[static_cast<size_t>(u)] = static_cast<int>(v - p.variants.data());
    }
  }
}

}  // namespace dhelix
