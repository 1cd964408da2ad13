// StepParts: the parts one rank needs to run training steps, built one way for the trainer, the
// profiler's layer-pair bench, the benchmarks and the test harness: the whole model's units in
// forward order, their layer programs for the layout and micro-batch shape, this rank's parameter
// store (its pipeline stage's units only) and the run context that binds them. Not here: process
// groups, gradient sync, optimizer and the step's hooks, which each caller adds to `ctx`.
#pragma once
#include <memory>
#include <vector>

#include "model/Params.h"
#include "sharding/ModelPrograms.h"
#include "parallel/ParamStore.h"
#include "runtime/Executor.h"
#include "schedule/Pipelines.h"

namespace dhelix {

struct StepPartsSpec {
  ModelConfig model;
  LayoutConfig layout;           // sequence parallelism follows tp (set here)
  int tp_rank = 0, pp_rank = 0;
  RankCoord coord;               // this rank's grid coordinates (x, y, z under 3D tensor parallelism)
  MicroBatchShape mb;
  PipelineSpec pipeline;         // which units each pp rank holds (n_layers is the model's)
  std::vector<int> owned_units;  // when non-empty, this rank's units instead of the placement's
  uint64_t seed = 1234;          // deterministic init of the full parameters
  double tokens_per_step = 1;    // tokens of one optimizer step over all ranks: dloss = 1 / that
};

class StepParts {
 public:
  explicit StepParts(const StepPartsSpec& spec);
  StepParts(const StepParts&) = delete;  // ctx points into the members
  StepParts& operator=(const StepParts&) = delete;

  ModelConfig model;
  LayoutConfig layout;
  std::vector<UnitSpec> units;   // the whole model, forward order: embed, block 0..L-1, head
  ModelPrograms progs;
  std::vector<int> owned_units;  // this rank's, ascending
  MemoryTracker state_mem{"states"}, act_mem{"activations"};
  std::unique_ptr<ParamStore> params;
  RunContext ctx;                // model, layout, ranks, mb, params, act_mem, dloss
};

// The units pipeline rank `pp_rank` holds under `pipeline` (its chunks' units, ascending).
std::vector<int> stage_units(const PipelineSpec& pipeline, int pp_rank);

}  // namespace dhelix
