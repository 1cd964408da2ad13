// The "final validation" of the planning flow (§5.4): the search's top candidates and the
// default plan are timed on the real layer pair (LayerPairBench) and the fastest is kept, since
// the additive block model is only a model. Without a bench (cost model only) the search's best
// is kept unvalidated. Every candidate passes check_plan before it is run or returned.
#pragma once
#include <functional>
#include <vector>

#include "plan/BlockCost.h"
#include "profile/LayerPairBench.h"
#include "schedule/PlanSearch.h"

namespace dhelix {

struct PlanCandidate {
  SIPlan plan;
  double predicted_s = 0;  // the BlockCost total (additive model)
  double measured_s = 0;   // median on the layer pair, agreed across ranks; 0 when not timed
  double simulated_s = 0;  // the pair simulation's time, when a simulator ranked the candidates
};

// Seconds of a plan for the layer pair as a simulator prices it (the apps pass sim's pair
// simulator; this layer does not depend on sim).
using PlanSimulator = std::function<double(const SIPlan&)>;

struct PlanChoice {
  std::vector<PlanCandidate> candidates;  // search order (best predicted first), default plan last
  int chosen = 0;                         // index of the kept plan
  const SIPlan& plan() const { return candidates.at(chosen).plan; }
};

// The default plan of the transformer-layer pair, as StepRunner runs it without a plan file,
// with pair = prog.name so it checks against `prog`.
SIPlan block_default_plan(const LayerProgram& prog);

// A searched plan replaces the default only when measured at least this fraction faster: below
// that the difference is within the run-to-run noise of a shared machine (DESIGN: up to 3x
// swings; round-robin medians of a few runs agree to a few percent), and the DP, which picks
// the lowest of many noisy entries, is biased towards plans whose entries were measured low.
inline constexpr double kDefaultMinGain = 0.03;

// search_plans(top_k), then — when `bench` is not null — times each candidate and the default
// plan (collective over the world; round-robin over candidates in each of timing.repeats rounds,
// so drift hits all alike) and keeps the fastest measured, if it beats the default by min_gain;
// otherwise (no bench) the best predicted. The chosen plan's source says how it was chosen
// ("search", "search+validated", "default").
// With `simulate`, the search returns three times top_k plans and keeps the top_k the simulator
// prices fastest (the whole pair simulated, instead of its blocks' times summed), in that order;
// every candidate's simulated_s is set. `progress`, when given, is called after each timed run
// (runs done, runs in all).
PlanChoice search_and_validate(const LayerProgram& prog, const BlockCost& cost, const SearchOptions& opts,
                               LayerPairBench* bench, const BenchTiming& timing,
                               double min_gain = kDefaultMinGain, const PlanSimulator& simulate = {},
                               const std::function<void(int64_t, int64_t)>& progress = {});

}  // namespace dhelix
