// Co-execution interference calibrated from a profile (Echo's method): the profile times every
// window of a layer pair alone and every legal pair of windows together. Each op's own time is its
// single-op window timed alone; a pair simulated from those (PairSim) with no interference is what
// a sum of isolated timings assumes, and the measured pair time differs from it by what the two
// strands cost each other. Two parameters (PairSimOptions): the compute slowdown beside a
// collective and the collective's slowdown beside compute, fitted on some pairs (least mean
// relative error: a coarse grid over both, then one parameter at a time; most pairs hold no
// collective beside compute and do not move with either) and judged on the others.
#pragma once
#include <utility>
#include <vector>

#include "sharding/ModelPrograms.h"
#include "plan/BlockCost.h"
#include "plan/Program.h"
#include "plan/Windows.h"
#include "sim/PairSim.h"

namespace dhelix {

// Per-op seconds from a BlockCost's single-op solo windows of `prog` (the op is found by address in
// prog.fwd / prog.bwd); ConfigError naming the op when its window was not timed.
OpTimer solo_op_timer(const LayerProgram& prog, const BlockCost& measured);

// The compute ops of the layer pair's program (progs.block) at their profiled single-op times, found
// by name, so that any copy of the same programs is priced (simulate_step builds its own); every
// other op (collectives, the embedding's and head's, a name the embedding or head shares) returns
// -1, the step simulator's "price it from the preset" (StepSimOptions::op_timer). The times are
// copied: the profile need not outlive the timer.
OpTimer profile_op_timer(const ModelPrograms& progs, const BlockCost& measured);

struct InterferenceFit {
  double compute_slowdown = 1.0;
  double comm_slowdown = 1.0;
  size_t calibration_pairs = 0, held_back_pairs = 0;
  // |simulated - measured| / measured over each set, with the fitted slowdown and without (1.0).
  double calibration_median_error = 0, calibration_max_error = 0;
  double held_back_median_error = 0, held_back_max_error = 0;
  double held_back_median_error_without = 0, held_back_max_error_without = 0;  // the isolated-timing
                                                                              // assumption (1.0)
};

// Fits the compute slowdown over [1, max_slowdown] and the collectives' over [1, max_comm_slowdown]
// (steps of 0.01; max_comm_slowdown = 1: the compute slowdown alone) on `calibration` and reports
// both sets. Pairs whose measured time is unknown (kNoCost) are skipped.
InterferenceFit fit_interference(const LayerProgram& prog, const BlockCost& measured, const OpTimer& op_seconds,
                                 const std::vector<std::pair<Window, Window>>& calibration,
                                 const std::vector<std::pair<Window, Window>>& held_back, double max_slowdown = 6.0,
                                 double max_comm_slowdown = 4.0);

// The fit `dhelix plan --profile` and `dhelix simulate --profile` use: the profile's legal pairs
// (within segments) alternately to calibration and held-back, the single-op windows as op times.
InterferenceFit fit_interference_alternating(const LayerProgram& prog, const BlockCost& measured);

// The simulated time of the pair of windows (one block) under `opt`.
double simulate_window_pair(const LayerProgram& prog, Window f, Window b, const OpTimer& op_seconds,
                            const PairSimOptions& opt);

}  // namespace dhelix
