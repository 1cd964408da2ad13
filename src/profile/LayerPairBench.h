// LayerPairBench: the folded transformer-layer pair of a run (forward strand on the first layer,
// backward strand on the last) set up on the real executor, kernels and process groups, so that
// any SI block — a forward window, a backward window or both — or a whole plan can be timed from
// the exact state the training step would reach it in. The profiler and the plan validation both
// time through it. It times; it does not decide what to time (Profiler) or which plan wins.
//
// State: snapshot k of a strand = the environment's buffer map after that strand's ops [0, k).
// Forward: "x" random [Ns, C], then the forward ops one by one. Backward: another micro-batch's
// full forward, "dy" random [Ns, C], then the backward ops one by one. Ops write new tensors, so a
// shallow copy of the map restores a state; the one in-place op (the executor's all-reduce) gets
// its input cloned before every run.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "comm/CommContext.h"
#include "plan/SIPlan.h"
#include "runtime/Executor.h"
#include "runtime/StepBuilder.h"
#include "runtime/StepParts.h"

namespace dhelix {

struct BenchTiming {
  int warmup = 1;   // untimed runs before the timed ones
  int repeats = 5;  // timed runs; the median is kept
};

// How the bench runs the pair's ops: as the training run it profiles would (the trainer's StepSpec
// fields of the same meaning; dhelix profile and plan fill them from the run's config).
struct LayerPairRun {
  uint64_t seed = 1234;  // the weights' and inputs' random values
  // Where the layers' weights and buffers live and their kernels run (a GPU: the executor's two
  // strand streams, so a co-executed window pair has both strands' kernels in flight; each timing
  // ends when both streams are done).
  Device device = Device::host();
  // On a GPU, how the collectives move device tensors (place_groups_on_device: staged through host
  // memory by default, with an emulated link when it names a rate).
  DeviceGroupOptions groups;
  // On the host: the GEMMs' precision (bf16: each weight's bf16 rounding, made once, as a training
  // step's Bf16Weights) and the activation collectives' wire (bf16: a rounded copy moves). A GPU's
  // GEMMs and activations are bf16 whatever these say.
  cpu::GemmPrecision gemm = cpu::GemmPrecision::kFp32;
  WirePrecision activation_wire = WirePrecision::kFp32;
  // On a GPU, how its cuBLASLt GEMMs choose their algorithms and run the weight gradients (the
  // run's training.gemm_algo and training.wgrad_gemm; a choices file is not read here).
  GemmOptions gemms;
};

// "fp32 GEMMs, fp32 wire", "bf16 GEMMs, bf16 wire", "GPU (bf16)": what a profile's times were
// measured with (its meta.precision; dhelix plan and simulate refuse a profile of another).
std::string describe_precision(const LayerPairRun& run);

class LayerPairBench {
 public:
  // `comm` may be null (one process: the layout must be world size 1). Every rank of the world
  // constructs it and then makes the same calls in the same order (collectives inside).
  // DeviceError when this build or machine has no such GPU; ConfigError for bf16 GEMMs on a CPU
  // without them (cpu::kernel_config).
  LayerPairBench(const ModelConfig& model, const LayoutConfig& layout, const MicroBatchShape& mb,
                 CommContext* comm, const LayerPairRun& run = {});
  ~LayerPairBench();
  LayerPairBench(const LayerPairBench&) = delete;
  LayerPairBench& operator=(const LayerPairBench&) = delete;

  const LayerProgram& program() const { return parts_->progs.block; }
  const MicroBatchShape& micro_batch() const { return mb_; }
  Device device() const { return parts_->ctx.device; }
  const LayerPairRun& run() const { return run_; }
  // The forward strand's buffers after its ops [0, k) ran (k in [0, fwd ops]): where every window
  // starts from, made once as the constructor ran the ops one at a time. For inspection and tests.
  const std::map<std::string, Tensor>& forward_state(int k) const { return fsnap_.at(static_cast<size_t>(k)); }

  // Seconds of one run of `blocks` (windows into program()), from the state where the first
  // block's windows start; this rank's wall clock, after a world barrier. Each block's windows
  // must continue where the previous block's ended (a plan, or a single block).
  double run_once(const std::vector<Block>& blocks);

  // warmup + repeats runs of run_once; this rank's median.
  double local_median(const std::vector<Block>& blocks, const BenchTiming& t);

  // The timing's own cost: run_once's bracket (the restored state's sync, the pair's stream joins,
  // the drain, the closing sync) around no op; this rank's median of warmup + max(repeats, 9) runs.
  // On a GPU it is of the size of a small op (tens of microseconds of syncs and joins); every entry
  // carries it once, so the profiler takes it out of each (Profile's meta.timing_overhead_s).
  double local_overhead(const BenchTiming& t);

  // Element-wise max over the world of `local` (every rank passes the same length); identity
  // for one process. The agreed time of an entry is the slowest rank's median.
  std::vector<double> agree_max(const std::vector<double>& local);

  // Median seconds of a whole plan, agreed across ranks.
  double time_plan(const SIPlan& plan, const BenchTiming& t);

 private:
  void build_snapshots(uint64_t seed);
  void drain();  // waits for what the windows left in flight (LayerPairBench.cc)
  void restore(UnitEnv& env, const std::vector<std::map<std::string, Tensor>>& snaps, int k,
               const std::vector<Op>& ops, int begin, int end);

  ModelConfig model_;
  LayoutConfig layout_;
  LayerPairRun run_;
  std::shared_ptr<cuda::Blas> blas_;  // a GPU's cuBLASLt GEMMs (declared before parts_: outlives the executor)
  MicroBatchShape mb_;
  CommContext* comm_;
  int tp_rank_ = 0;
  RankCoord coord_;  // this rank's grid coordinates (3D: x, y, z)
  // A GPU bench's process groups (place_groups_on_device: staged over comm_'s CPU groups), which
  // parts_->ctx.groups point at; cleared first by the destructor.
  std::vector<std::unique_ptr<ProcessGroup>> staged_;
  std::unique_ptr<StepParts> parts_;  // the whole model's units; only the first and last block stored
  std::unique_ptr<Executor> exec_;
  // bf16 GEMMs on the host: the weights' bf16 copies (the bench's weights never change), which
  // parts_->ctx.bf16_weights points at; gone before parts_' trackers.
  std::unique_ptr<Bf16Weights> weights16_;
  UnitEnv fenv_, benv_;
  StrandSlot fslot_, bslot_;
  std::vector<std::map<std::string, Tensor>> fsnap_, bsnap_;  // [k]: buffers after ops [0, k)
};

}  // namespace dhelix
