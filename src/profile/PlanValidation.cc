// PlanValidation: top-k search, then timing of the candidates on the real layer pair.
#include "profile/PlanValidation.h"

#include <algorithm>

#include <fmt/format.h>

#include "base/Signals.h"
#include "plan/PlanCheck.h"
#include "runtime/StepRunner.h"
#include "schedule/BasicPlans.h"

namespace dhelix {

SIPlan block_default_plan(const LayerProgram& prog) {
  SIPlan p = pair_default_plan(prog.fwd, prog.bwd);
  p.pair = prog.name;
  p.source = "default";
  return p;
}

PlanChoice search_and_validate(const LayerProgram& prog, const BlockCost& cost, const SearchOptions& opts,
                               LayerPairBench* bench, const BenchTiming& timing, double min_gain,
                               const PlanSimulator& simulate, const std::function<void(int64_t, int64_t)>& progress) {
  SearchOptions wide = opts;
  if (simulate) wide.top_k = 3 * opts.top_k;
  SearchResult r = search_plans(prog, cost, wide);
  PlanChoice c;
  for (SIPlan& p : r.plans) {
    p.pair = prog.name;
    check_plan(p, prog);
    c.candidates.push_back({p, cost.plan(p), 0, simulate ? simulate(p) : 0.0});
  }
  if (simulate) {  // the simulator's order, then its top_k
    std::stable_sort(c.candidates.begin(), c.candidates.end(),
                     [](const PlanCandidate& a, const PlanCandidate& b) { return a.simulated_s < b.simulated_s; });
    if (static_cast<int>(c.candidates.size()) > opts.top_k) c.candidates.resize(static_cast<size_t>(opts.top_k));
  }
  SIPlan def = block_default_plan(prog);
  check_plan(def, prog);
  bool def_found = false;
  for (auto& k : c.candidates)
    if (k.plan.blocks == def.blocks) def_found = true;
  if (!def_found) {
    def.predicted_s = cost.plan(def);
    c.candidates.push_back({def, def.predicted_s, 0, simulate ? simulate(def) : 0.0});
  }
  c.chosen = 0;
  if (!bench) {  // unvalidated: the simulator's fastest, the default plan included
    if (simulate)
      for (size_t i = 1; i < c.candidates.size(); ++i)
        if (c.candidates[i].simulated_s < c.candidates[static_cast<size_t>(c.chosen)].simulated_s)
          c.chosen = static_cast<int>(i);
    return c;
  }
  // Round-robin: every round runs each candidate once, so slow phases of a noisy machine hit all.
  const size_t n = c.candidates.size();
  std::vector<std::vector<double>> samples(n);
  for (int r = 0; r < timing.warmup + timing.repeats; ++r)
    for (size_t i = 0; i < n; ++i) {
      // A first stop signal on any rank ends the validation on every rank at the same run.
      if (const int sig = static_cast<int>(bench->agree_max({double(stop_signal())}).front()); sig != 0)
        throw StopRequested(sig, fmt::format("plan validation (round {} of {}, candidate {} of {}; no plan written)",
                                             r + 1, timing.warmup + timing.repeats, i + 1, n));
      double t = bench->run_once(c.candidates[i].plan.blocks);
      if (r >= timing.warmup) samples[i].push_back(t);
      if (progress) progress(int64_t(r) * int64_t(n) + int64_t(i) + 1, int64_t(timing.warmup + timing.repeats) * int64_t(n));
    }
  std::vector<double> med(n);
  for (size_t i = 0; i < n; ++i) {
    std::sort(samples[i].begin(), samples[i].end());
    const auto& v = samples[i];
    med[i] = v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
  }
  med = bench->agree_max(med);
  int best = 0, def_i = 0;
  for (size_t i = 0; i < n; ++i) {
    c.candidates[i].measured_s = med[i];
    if (med[i] < med[best]) best = static_cast<int>(i);
    if (c.candidates[i].plan.blocks == def.blocks) def_i = static_cast<int>(i);
  }
  c.chosen = med[best] <= med[def_i] * (1.0 - min_gain) ? best : def_i;
  SIPlan& win = c.candidates[c.chosen].plan;
  if (win.source == "search") win.source = "search+validated";
  return c;
}

}  // namespace dhelix
