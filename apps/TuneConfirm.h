// `dhelix tune --confirm`: runs the ranked layouts for a few steps on the real engine and sets the
// measured step time beside the predicted one. Each run is `dhelix train` launched as a child
// process by a launcher command (mpirun by default; scripts/cluster for the emulated cluster), its
// step times read from the run's metrics.jsonl. Rounds alternate the layouts (round r starts at a
// different layout), so a slow spell of the shared machine does not fall on one layout only.
#pragma once
#include <string>
#include <vector>

#include "sim/StepModel.h"

namespace dhelix {

struct ConfirmOptions {
  int steps = 3;              // optimizer steps per run; the first is a warm-up and not counted
  int rounds = 1;             // runs per layout, alternating
  std::string config_path;    // the run's data and training settings (--config)
  std::string launch = "mpirun --oversubscribe --bind-to none -np {np}";  // {np}: the layout's ranks
  std::string workdir;        // run directories
  bool trace = false;         // each run writes <run dir>/trace.json.rank<r> (output.trace)
};

struct Confirmed {
  LayoutConfig layout;
  PipelineKind pipeline = PipelineKind::k1F1B;  // the schedule predicted (schedule.pipeline)
  int virtual_stages = 1;
  double predicted_s = 0;
  std::vector<double> step_s;  // every counted step of every round
  double measured_s = 0;       // their median
  bool ok = true;
  std::string error;           // the failed run's last output lines
};

// Runs every prediction's layout (model, batch and options as predicted); prints one line per run.
std::vector<Confirmed> confirm_layouts(const ModelConfig& m, const BatchSpec& batch, const PredictOptions& opt,
                                       const std::vector<StepPrediction>& layouts, const ConfirmOptions& o);

struct RankAgreement {
  int layouts = 0;             // confirmed (ran) layouts
  double kendall_tau = 0;      // tau-b of predicted vs measured step times
  double top1_regret = 0;      // measured time of the predicted best / the measured best - 1
  double median_abs_error = 0; // median |predicted - measured| / measured
};
RankAgreement agreement(const std::vector<Confirmed>& c);

// `--measure-gemm`: times each GEMM op's shape here (OpenBLAS via cpu::gemm in the op's
// orientation: forward X W^T, input gradient dY W, weight gradient dY^T X; one warm-up; cached per
// shape) as the ranks of one core run it: with core_share < 1, 1/core_share - 1 partner threads on
// the same CPU run the same shape meanwhile and the mean over >= 0.2 s of runs is returned;
// alone (core_share 1), the best of three.
GemmTimer measured_gemm_timer(double core_share);

}  // namespace dhelix
