// Interference: a profile's single-op windows as op times, and the slowdown fit (Interference.h).
#include "sim/Interference.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <set>

#include "base/Error.h"
#include "base/Signals.h"

namespace dhelix {

OpTimer solo_op_timer(const LayerProgram& prog, const BlockCost& measured) {
  return [&prog, &measured](const Op& op) {
    auto index_in = [&](const std::vector<Op>& ops) {
      return &op >= ops.data() && &op < ops.data() + ops.size() ? static_cast<int>(&op - ops.data()) : -1;
    };
    const int f = index_in(prog.fwd), b = index_in(prog.bwd);
    DHX_CHECK(f >= 0 || b >= 0, InternalError, "op {} is not in the layer program", op.name);
    const double t = f >= 0 ? measured.solo_fwd(f, f + 1) : measured.solo_bwd(b, b + 1);
    DHX_CHECK(std::isfinite(t), ConfigError, "op {} ({} {}) has no single-op time in the profile", op.name,
              f >= 0 ? "forward" : "backward", f >= 0 ? f : b);
    return t;
  };
}

OpTimer profile_op_timer(const ModelPrograms& progs, const BlockCost& measured) {
  std::set<std::string> shared;
  for (const LayerProgram* p : {&progs.embed, &progs.head})
    for (const auto* ops : {&p->fwd, &p->bwd})
      for (const Op& o : *ops) shared.insert(o.name);
  const OpTimer solo = solo_op_timer(progs.block, measured);
  auto seconds = std::make_shared<std::map<std::string, double>>();
  for (const auto* ops : {&progs.block.fwd, &progs.block.bwd})
    for (const Op& o : *ops)
      if (!o.is_collective() && !shared.count(o.name)) (*seconds)[o.name] = solo(o);
  return [seconds](const Op& op) {
    if (op.is_collective()) return -1.0;
    const auto it = seconds->find(op.name);
    return it == seconds->end() ? -1.0 : it->second;
  };
}

double simulate_window_pair(const LayerProgram& prog, Window f, Window b, const OpTimer& op_seconds,
                            const PairSimOptions& opt) {
  SIPlan one;
  one.blocks = {{f.begin, f.end, b.begin, b.end}};
  return simulate_pair(&prog.fwd, &prog.bwd, one, op_seconds, opt).span_s;
}

namespace {

struct Errors {
  double mean = 0, median = 0, max = 0;
};

Errors errors_of(const LayerProgram& prog, const BlockCost& measured, const OpTimer& op_seconds,
                 const std::vector<std::pair<Window, Window>>& pairs, const PairSimOptions& opt, size_t* used) {
  std::vector<double> e;
  for (const auto& [f, b] : pairs) {
    const double m = measured.pair(f.begin, f.end, b.begin, b.end);
    if (!std::isfinite(m) || m <= 0) continue;
    e.push_back(std::abs(simulate_window_pair(prog, f, b, op_seconds, opt) - m) / m);
  }
  if (used) *used = e.size();
  if (e.empty()) return {};
  std::sort(e.begin(), e.end());
  const size_t n = e.size();
  double sum = 0;
  for (double x : e) sum += x;
  return {sum / double(n), n % 2 ? e[n / 2] : 0.5 * (e[n / 2 - 1] + e[n / 2]), e.back()};
}

}  // namespace

InterferenceFit fit_interference(const LayerProgram& prog, const BlockCost& measured, const OpTimer& op_seconds,
                                 const std::vector<std::pair<Window, Window>>& calibration,
                                 const std::vector<std::pair<Window, Window>>& held_back, double max_slowdown,
                                 double max_comm_slowdown) {
  DHX_CHECK(max_slowdown >= 1.0, ConfigError, "max_slowdown={} must be >= 1", max_slowdown);
  DHX_CHECK(max_comm_slowdown >= 1.0, ConfigError, "max_comm_slowdown={} must be >= 1", max_comm_slowdown);
  InterferenceFit fit;
  PairSimOptions opt;
  double best = std::numeric_limits<double>::infinity();
  // One parameter over its grid (steps of 0.01) with the other held.
  auto sweep = [&](double PairSimOptions::*k, double hi) {
    double at = opt.*k;
    for (int i = 0; 1.0 + 0.01 * i <= hi + 1e-9; ++i) {
      if (stop_signal() != 0) stop_point("fitting the co-execution interference (nothing written)");
      opt.*k = 1.0 + 0.01 * i;
      const Errors e = errors_of(prog, measured, op_seconds, calibration, opt, nullptr);
      if (e.mean < best - 1e-12) best = e.mean, at = opt.*k;
    }
    opt.*k = at;
  };
  // A coarse grid over both (steps of 0.1: the error surface has ridges along which one parameter
  // trades for the other, where a search one axis at a time from (1, 1) stalls), then coordinate
  // descent at 0.01 until a round moves neither (each sweep keeps the best point so far, so the
  // error never rises; at most 4 rounds).
  sweep(&PairSimOptions::compute_slowdown, max_slowdown);
  for (int i = 0; max_comm_slowdown > 1.0 && 1.0 + 0.1 * i <= max_slowdown + 1e-9; ++i)
    for (int j = 1; 1.0 + 0.1 * j <= max_comm_slowdown + 1e-9; ++j) {
      if (stop_signal() != 0) stop_point("fitting the co-execution interference (nothing written)");
      const PairSimOptions o{1.0 + 0.1 * i, 1.0 + 0.1 * j};
      const Errors e = errors_of(prog, measured, op_seconds, calibration, o, nullptr);
      if (e.mean < best - 1e-12) best = e.mean, opt = o;
    }
  for (int round = 0; round < 4 && max_comm_slowdown > 1.0; ++round) {
    const PairSimOptions before = opt;
    sweep(&PairSimOptions::comm_slowdown, max_comm_slowdown);
    sweep(&PairSimOptions::compute_slowdown, max_slowdown);
    if (opt.comm_slowdown == before.comm_slowdown && opt.compute_slowdown == before.compute_slowdown) break;
  }
  fit.compute_slowdown = opt.compute_slowdown, fit.comm_slowdown = opt.comm_slowdown;
  const Errors c = errors_of(prog, measured, op_seconds, calibration, opt, &fit.calibration_pairs);
  const Errors h = errors_of(prog, measured, op_seconds, held_back, opt, &fit.held_back_pairs);
  fit.calibration_median_error = c.median, fit.calibration_max_error = c.max;
  fit.held_back_median_error = h.median, fit.held_back_max_error = h.max;
  const Errors w = errors_of(prog, measured, op_seconds, held_back, PairSimOptions{}, nullptr);
  fit.held_back_median_error_without = w.median, fit.held_back_max_error_without = w.max;
  return fit;
}

InterferenceFit fit_interference_alternating(const LayerProgram& prog, const BlockCost& measured) {
  const OpTimer solo = solo_op_timer(prog, measured);
  const auto pairs = legal_pairs(prog, WindowRule::kWithinSegments);
  std::vector<std::pair<Window, Window>> calib, held;
  for (size_t i = 0; i < pairs.size(); ++i) (i % 2 ? held : calib).push_back(pairs[i]);
  return fit_interference(prog, measured, solo, calib, held);
}

}  // namespace dhelix
