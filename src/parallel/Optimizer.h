// AdamW with global-norm gradient clipping over a sharded model, optionally ZeRO-1 (optimizer
// state and the update split over dp, parameters all-gathered after). The global norm counts
// every tp-sharded element once and every tp-replicated element once (not tp times).
// Checkpoints see full, layout-free tensors: gather_state()/scatter_state().
// On a GPU store (ParamStore::move_to a GPU): m and v on the GPU (with ZeRO-1 the owned chunks), the
// norm's parts from kernels/cuda's sum_squares per entry (read back for the sum and the non-finite
// check), the update one adamw_step launch per run of entries alike in weight decay, which also
// rewrites the store's bf16 weights; with ZeRO-1 the updated chunks all-gathered over the process
// groups (staged or NCCL) and the gathered ranges' bf16 weights cast; all on set_stream's stream.
#pragma once
#include <string>
#include <vector>

#include "comm/ProcessGroup.h"
#include "parallel/GradSync.h"
#include "parallel/ParamStore.h"
#include "tensor/DeviceMemory.h"

namespace dhelix {

struct AdamWConfig {
  double beta1 = 0.9, beta2 = 0.95, eps = 1e-8, weight_decay = 0.1, grad_clip = 1.0;
};

class Optimizer {
 public:
  // `tp`: the tensor-parallel block (Megatron's tp group, or the 3D x-y-z block), over which the
  // gradient norm's parts are summed.
  Optimizer(ParamStore& params, GradSync& sync, ProcessGroup* tp, ProcessGroup* dp, const AdamWConfig& cfg,
            MemoryTracker* tracker);

  // One update with learning rate `lr`; `step` is 1-based. Returns the pre-clip global grad norm.
  // = grad_norm() then update().
  double step(double lr, int64_t step);
  // The global gradient norm (collective over dp with ZeRO-1, tp and pp), before clipping. Also
  // keeps each entry's part, for nonfinite_entry().
  double grad_norm();
  // The whole model's first entry (ParamStore global index, every stage's) whose gradient holds a
  // non-finite value in the last grad_norm(); -1 when all are finite. The same on every rank.
  int64_t nonfinite_entry() const;
  // Clips to cfg.grad_clip with `norm` (grad_norm()'s result) and applies AdamW.
  void update(double lr, int64_t step, double norm);
  int64_t steps_taken() const { return steps_; }
  // Pipeline stages: the gradient norm sums every stage's parameters (over `pp`).
  void set_pipeline_group(ProcessGroup* pp) { pp_ = pp; }
  // Expert parallelism: the ranks of `ep` hold different experts, so the experts' parts of the
  // gradient norm are summed over it (the dense parts are equal there and are not).
  // With ZeRO-1 their optimizer state is sharded over `edp` (GradSync::shard_group).
  // Call after GradSync::set_expert_group and before the first update.
  void set_expert_group(ProcessGroup* ep, ProcessGroup* edp = nullptr);
  // A GPU store: the stream its kernels run on (the executor's compute stream, so the update
  // follows the step's backward in stream order). Ignored on the host.
  void set_stream(StreamHandle s) { stream_ = s; }

  // Full (unsharded) tensors of this rank's tp slice: "<param>.exp_avg" / ".exp_avg_sq", gathered
  // over dp when ZeRO-1 holds only chunks. Collective over dp.
  std::vector<std::pair<std::string, Tensor>> shard_state();
  // Inverse of shard_state (each tensor has the param's shard shape).
  void load_shard_state(const std::vector<std::pair<std::string, Tensor>>& state, int64_t steps);

 private:
  void allocate_state();
  template <typename Fn>
  void for_each_owned(Fn fn);  // fn(entry, bucket, flat_begin, flat_end, state_offset)
  ParamStore& params_;
  GradSync& sync_;
  ProcessGroup* tp_;
  ProcessGroup* dp_;
  ProcessGroup* edp_ = nullptr;
  ProcessGroup* pp_ = nullptr;
  ProcessGroup* ep_ = nullptr;
  AdamWConfig cfg_;
  MemoryTracker* tracker_ = nullptr;
  float* grad_ptr(size_t bucket, int64_t flat_index);
  Tensor m_, v_;  // flat; full size without ZeRO, the owned chunks (concatenated) with ZeRO-1
  Tensor norm_parts_;  // [global entry] squared-norm parts of the last grad_norm()
  StreamHandle stream_ = nullptr;
  bool on_gpu() const { return !params_.device().is_host(); }
  double grad_norm_gpu();
  double sum_norm_parts();
  void update_gpu(double lr, int64_t step, double clip);
  void gather_updated();         // ZeRO-1: the updated chunks all-gathered over each bucket's group
  void refresh_gathered_bf16();  // a GPU's bf16 weights of the gathered ranges
  int64_t steps_ = 0;
};

}  // namespace dhelix
