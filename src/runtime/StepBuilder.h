// StepBuilder: one rank's training step wired once, in one place, for the trainer and the
// benchmarks -- the parts (units, layer programs, this rank's parameters, the run context; on a GPU
// moved there with its cuBLASLt handle), the gradient sync over the rank's typed process groups,
// AdamW, and the StepRunner (sequential or Strand Interleaving, any pipeline). What watches the
// step is added by the caller, in the order it needs (StepRunner::add_observer): GradSync's
// buckets, metrics, a test's fault injection.
//
//   StepSpec spec;  spec.parts = ...;  spec.groups = StepGroups::of(comm);  spec.zero = ...
//   Step step(spec);
//   step.runner->add_observer(step.sync.get());
//   step.params().zero_grads();  step.runner->run(mbs);  step.sync->finish();
//   step.opt->step(lr, n);
//
// Not here: data, the learning-rate schedule, checkpoints and logging (train/Trainer).
#pragma once
#include <memory>
#include <optional>
#include <string>

#include "parallel/GradSync.h"
#include "parallel/Optimizer.h"
#include "plan/SIPlan.h"
#include "runtime/StepGroups.h"
#include "runtime/StepParts.h"
#include "runtime/StepRunner.h"

namespace dhelix {
namespace cuda {
class Blas;
}

// How a GPU step's cuBLASLt GEMMs run (its Blas's settings, kernels/cuda/Gemm.h).
struct GemmOptions {
  // Algorithms: cuBLASLt's heuristic's first answer (false: reproducible run to run), or the fastest
  // of its first answers timed on the first step (training.gemm_algo = timed).
  bool timed = false;
  // Weight gradients in the partials form where it applies (Blas::Wgrad::kPartials: the default,
  // training.wgrad_gemm = auto or partials), else direct.
  bool wgrad_partials = true;
  // This rank's choices file (training.gemm_choices, kernels/cuda/GemmChoices.h: gemm_choices_for_rank's
  // name below), "" for none: read when it exists (ConfigError when it was made on another GPU or
  // cuBLASLt), so its shapes run its recorded algorithms; Step::save_gemm_choices writes it.
  std::string choices;
};

struct StepSpec {
  StepPartsSpec parts;                 // model, layout, this rank's coordinates, micro-batch, pipeline, seed
  StepGroups groups;                   // this rank's process groups by role (none: a single process)
  Device device = Device::host();      // a GPU: the parameters move there, ops bind to its kernels
  cpu::KernelConfig kernels;           // threads and GEMM precision of the CPU kernels
  ZeroStage zero = ZeroStage::kNone;   // ZeRO-1 shards AdamW's state and update over dp
  AdamWConfig adamw;
  DType grad_wire = DType::kF32;                       // the dp gradient buckets on the wire
  WirePrecision activation_wire = WirePrecision::kFp32;  // the activation collectives on the wire
  bool bf16_saved_activations = false;  // with bf16 GEMMs on the CPU: GEMM-only inputs kept in bf16
  bool expose_collectives = false;      // wait for every collective at once (benchmarks)
  int micro_batches = 1;                // per optimizer step on this rank
  std::string plan_path;                // a saved SI plan (dhelix plan), else the default pairing
  // A GPU step's staged groups (several ranks sharing a GPU): an emulated link of this many bytes
  // per second per rank (StagedOptions::link_bytes_per_s; 0: none).
  double emulated_link_bytes_per_s = 0;
  // A GPU step's groups: staged (device tensors through host memory over the CPU groups; ranks may
  // share a GPU) or NCCL communicators bootstrapped over them (a GPU per rank; the pp group stays
  // staged: NCCL's point-to-point ops have no tags, and the schedule posts receives ahead).
  bool nccl = false;
  int nccl_max_ctas = 0;  // with nccl: the CTAs each NCCL collective may occupy (0: NCCL's choice)
  GemmOptions gemms;  // a GPU step's GEMMs
};

// Moves `parts` to GPU `d` (nothing for the host): the model states go there, and the op programs
// bind to the GPU's kernels with the returned cuBLASLt handle, which must outlive everything
// launching on it. DeviceError naming why when this build or machine has no such GPU. Step and the
// profiler's LayerPairBench both place their parts with it.
std::shared_ptr<cuda::Blas> place_on_device(StepParts& parts, Device d, const GemmOptions& gemms = {});

// How a GPU run's process groups move device tensors (StepSpec's fields of the same names).
struct DeviceGroupOptions {
  bool nccl = false;      // NCCL groups over the CPU ones (but pp), else staged groups
  int nccl_max_ctas = 0;  // with nccl: the CTAs each NCCL collective may occupy (0: NCCL's choice)
  double emulated_link_bytes_per_s = 0;  // staged groups: StagedOptions::link_bytes_per_s (0: none)
};

// The groups a step on `d` uses: `host` itself on the host; on a GPU each distinct CPU group of
// `host` wrapped once (in role order: NCCL's bootstrap is a collective over the CPU group) in a
// staged group (comm/StagedGroup.h) or an NCCL one, appended to `owned`, which the caller destroys
// before the executor's streams and after the ops' last wait. A CPU group given device tensors
// would read device memory on the host. Step and the profiler's LayerPairBench both wrap with it.
StepGroups place_groups_on_device(const StepGroups& host, Device d, const DeviceGroupOptions& options,
                                  std::vector<std::unique_ptr<ProcessGroup>>& owned);

class Step {
 public:
  explicit Step(const StepSpec& spec);
  ~Step();
  Step(const Step&) = delete;
  Step& operator=(const Step&) = delete;

  ParamStore& params() { return *parts->params; }
  RunContext& ctx() { return parts->ctx; }
  // GemmOptions::choices rewritten with every GEMM algorithm this step's Blas has chosen (and the
  // file's other choices) when it chose any since the last write: what a later run reads. Cheap when
  // nothing is new (call it after every step). Returns the preset's plans used and unusable so far,
  // and how many choices of this run the write added (0: nothing written; all 0 on a CPU step).
  struct GemmChoiceCounts {
    size_t from_file = 0, written = 0, unusable = 0;
  };
  GemmChoiceCounts save_gemm_choices();
  // Weight gradients this step's Blas ran in the partials form so far (GemmOptions::wgrad_partials;
  // 0 on a CPU step).
  size_t partial_wgrads() const;

  // Declared in destruction order's reverse: the cuBLASLt handle outlives everything launching on it.
  std::shared_ptr<cuda::Blas> blas;  // a GPU step's (shared_ptr: complete only in a CUDA build)
  // A GPU step's process groups: each of spec.groups wrapped in a staged group (comm/StagedGroup.h:
  // device tensors through host memory over the CPU group) or, with StepSpec::nccl, an NCCL group
  // over it (but pp), which the step's parts use instead. Destroyed first (~Step): what their
  // unfinished ops hold needs the parts' trackers and the runner's streams.
  std::vector<std::unique_ptr<ProcessGroup>> staged;
  std::unique_ptr<StepParts> parts;
  std::optional<SIPlan> plan;
  std::unique_ptr<GradSync> sync;
  std::unique_ptr<Optimizer> opt;
  std::unique_ptr<StepRunner> runner;

 private:
  std::string gemm_choices_;
  size_t gemm_choices_written_ = 0;  // chosen_here() at the last write
};

// A rank's own GEMM choices file: `path` itself in a run of one rank, else `path` with ".rank<r>"
// before its extension (ranks of a pipeline or a grid have GEMM shapes of their own).
std::string gemm_choices_for_rank(const std::string& path, int rank, int world);

}  // namespace dhelix
