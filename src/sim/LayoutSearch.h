// Every layout of N ranks the engine can run -- Megatron tp x pp x dp, and AxoNN's 3D grids
// Gx x Gy x Gz x Gdata (every factorisation, not only powers of two) -- each priced by the step
// model, ranked by predicted step time; the illegal and the ones that do not fit memory are listed
// with their reason. What `dhelix tune` prints.
#pragma once
#include <string>
#include <vector>

#include "sim/StepModel.h"

namespace dhelix {

// Megatron layouts (tp, pp, dp with tp * pp * dp = n, pure data parallel included), then the 3D
// grids (tp_x, tp_y, tp_z, pp, dp with product n and tp_x * tp_y * tp_z > 1). rank_layouts adds
// to each the variants that carve ep (MoE) or cp (dense models) out of its dp.
std::vector<LayoutConfig> enumerate_layouts(int n);
// "tp=2 pp=1 dp=2" (cp, ep after), or "x=2 y=1 z=2 dp=1" ("x=2 y=1 z=2 pp=2 cp=2 dp=1 ep=2": pp,
// cp and ep only when not 1).
std::string layout_label(const LayoutConfig& lay);

// "1f1b", "w", "interleaved v=2".
std::string schedule_label(PipelineKind kind, int virtual_stages);
// A ranked row's label: layout_label, with the schedule after it for a pipeline not run as 1F1B
// ("tp=1 pp=2 dp=2 w", "tp=1 pp=2 dp=2 interleaved v=2").
std::string row_label(const LayoutConfig& lay, PipelineKind kind, int virtual_stages);

struct ExcludedLayout {
  LayoutConfig layout;
  std::string reason;
  PipelineKind pipeline = PipelineKind::k1F1B;  // the schedule it was priced under (pp > 1)
  int virtual_stages = 1;
};

struct TuneResult {
  std::vector<StepPrediction> ranked;  // legal and fitting, fastest first
  std::vector<ExcludedLayout> excluded;
};

// Each layout with opt.recompute (or, with opt.recompute_auto, the least recomputation that fits),
// and the 3D layouts with tp_z > 1 keeping opt.keep_gathered layers' gathered weight blocks (or,
// with opt.keep_gathered_auto, the most that fit): its prediction's layout says which. A layout
// with pp > 1 is priced under each schedule of opt.pipelines (a row each; empty: opt.pipeline),
// one a schedule cannot run (layers not divisible by its chunks) excluded with the reason.
TuneResult rank_layouts(const ModelConfig& m, int n, const BatchSpec& batch, const ClusterPreset& cluster,
                        const PredictOptions& opt);

}  // namespace dhelix
