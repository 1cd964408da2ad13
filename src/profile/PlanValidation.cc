// PlanValidation: top-k search, then timing of the candidates on the real layer pair.
#include "profile/PlanValidation.h"

#include "plan/PlanCheck.h"
#include "runtime/StepRunner.h"

namespace dhelix {

SIPlan block_default_plan(const LayerProgram& prog) {
  SIPlan p = pair_default_plan(prog.fwd, prog.bwd);
  p.pair = prog.name;
  p.source = "default";
  return p;
}

PlanChoice search_and_validate(const LayerProgram& prog, const BlockCost& cost, const SearchOptions& opts,
                               LayerPairBench* bench, const BenchTiming& timing) {
  SearchResult r = search_plans(prog, cost, opts);
  PlanChoice c;
  for (SIPlan& p : r.plans) {
    p.pair = prog.name;
    check_plan(p, prog);
    c.candidates.push_back({p, cost.plan(p), 0});
  }
  SIPlan def = block_default_plan(prog);
  check_plan(def, prog);
  bool def_found = false;
  for (auto& k : c.candidates)
    if (k.plan.blocks == def.blocks) def_found = true;
  if (!def_found) {
    def.predicted_s = cost.plan(def);
    c.candidates.push_back({def, def.predicted_s, 0});
  }
  c.chosen = 0;
  if (!bench) return c;
  for (auto& k : c.candidates) k.measured_s = bench->time_plan(k.plan, timing);
  for (size_t i = 1; i < c.candidates.size(); ++i)
    if (c.candidates[i].measured_s < c.candidates[c.chosen].measured_s) c.chosen = static_cast<int>(i);
  SIPlan& win = c.candidates[c.chosen].plan;
  if (win.source == "search") win.source = "search+validated";
  return c;
}

}  // namespace dhelix
