// The "final validation" of the planning flow (§5.4): the search's top candidates and the
// default plan are timed on the real layer pair (LayerPairBench) and the fastest is kept, since
// the additive block model is only a model. Without a bench (cost model only) the search's best
// is kept unvalidated. Every candidate passes check_plan before it is run or returned.
#pragma once
#include <vector>

#include "plan/BlockCost.h"
#include "profile/LayerPairBench.h"
#include "schedule/PlanSearch.h"

namespace dhelix {

struct PlanCandidate {
  SIPlan plan;
  double predicted_s = 0;  // the BlockCost total (additive model)
  double measured_s = 0;   // median on the layer pair, agreed across ranks; 0 when not timed
};

struct PlanChoice {
  std::vector<PlanCandidate> candidates;  // search order (best predicted first), default plan last
  int chosen = 0;                         // index of the kept plan
  const SIPlan& plan() const { return candidates.at(chosen).plan; }
};

// The default plan of the transformer-layer pair, as StepRunner runs it without a plan file,
// with pair = prog.name so it checks against `prog`.
SIPlan block_default_plan(const LayerProgram& prog);

// search_plans(top_k), then — when `bench` is not null — times each candidate and the default
// plan (collective over the world) and picks the fastest measured; otherwise the best predicted.
// The chosen plan's source says how it was chosen ("search", "search+validated", "default").
PlanChoice search_and_validate(const LayerProgram& prog, const BlockCost& cost, const SearchOptions& opts,
                               LayerPairBench* bench, const BenchTiming& timing);

}  // namespace dhelix
