// StepParts: units -> programs -> this stage's parameter store -> run context.
#include "runtime/StepParts.h"

#include <algorithm>

#include "sharding/ParamSharding.h"

namespace dhelix {

std::vector<int> stage_units(const PipelineSpec& pipeline, int pp_rank) {
  std::vector<int> owned;
  for (const Chunk& c : pipeline_chunks(pipeline))
    if (c.rank == pp_rank)
      for (int u = c.unit_begin; u < c.unit_end; ++u) owned.push_back(u);
  std::sort(owned.begin(), owned.end());
  return owned;
}

StepParts::StepParts(const StepPartsSpec& spec) : model(spec.model), layout(spec.layout) {
  layout.sequence_parallel = layout.tp > 1;
  units = model_units(model, layout, spec.tp_rank);
  progs = build_programs(model, layout, spec.mb);
  PipelineSpec pipe = spec.pipeline;
  pipe.n_layers = static_cast<int>(model.n_layers);
  owned_units = spec.owned_units.empty() ? stage_units(pipe, spec.pp_rank) : spec.owned_units;
  select_block_variants(progs, layout, pipeline_chunks(pipe));
  std::sort(owned_units.begin(), owned_units.end());
  ShardIndex at = ShardIndex::of(layout, spec.coord);
  at.tp_rank = spec.tp_rank;
  // ZeRO-1 shards over every replica of the weights: dp, times cp under context parallelism.
  params = std::make_unique<ParamStore>(units, owned_units, at, layout.dp * layout.cp, spec.seed, &state_mem);
  ctx.model = &model;
  ctx.layout = layout;
  ctx.tp_rank = spec.tp_rank;
  ctx.shard = at;
  ctx.pp_rank = spec.pp_rank;
  ctx.cp_rank = spec.coord.cp;
  ctx.mb = spec.mb;
  ctx.params = params.get();
  ctx.act_mem = &act_mem;
  ctx.state_mem = &state_mem;
  ctx.dloss = 1.0f / static_cast<float>(spec.tokens_per_step);
}

}  // namespace dhelix
