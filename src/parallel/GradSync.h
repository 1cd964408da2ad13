// GradSync: moves gradients between ranks after backward. Sequence-parallel partial gradients
// (norm weights, row biases, positions) are all-reduced over tp; then data parallelism reduces
// each bucket as soon as backward of the step's last micro-batch has produced it, so the traffic
// runs on the dp comm thread under the rest of the backward pass:
//
//   compute : [bwd head][bwd L-1][bwd L-2] ... [bwd 0][embed]   | wait | optimizer
//   comm dp :            [bucket 0 AR   ][bucket 1 AR   ] ...  [last]
//
// Without ZeRO the buckets are all-reduced in place; with ZeRO-1 they are reduce-scattered and
// rank r keeps chunk r of every bucket (the optimizer updates only that chunk).
#pragma once
#include <vector>

#include "comm/ProcessGroup.h"
#include "parallel/ParamStore.h"

namespace dhelix {

enum class ZeroStage { kNone = 0, kOne = 1 };

class GradSync {
 public:
  // tp/dp may be null (size 1).
  GradSync(ParamStore& params, ProcessGroup* tp, ProcessGroup* dp, ZeroStage zero, MemoryTracker* tracker);

  // Call after backward of the step's last micro-batch finished `unit` (units finish in order
  // U-1 .. 0). Issues the tp all-reduce of that unit's partial gradients, and every dp bucket that
  // became complete.
  void on_unit_done(int unit);
  // Waits for all outstanding reductions; returns the seconds this thread spent blocked.
  double finish();

  // ZeRO-1: this rank's reduced gradient chunk of bucket b (size (end-begin)/dp).
  Tensor& owned_grad(size_t b) { return owned_grads_.at(b); }
  ZeroStage zero() const { return zero_; }
  // Seconds the dp comm thread spent running bucket reductions in the last step.
  double dp_comm_seconds() const { return dp_comm_s_; }

 private:
  ParamStore& params_;
  ProcessGroup* tp_;
  ProcessGroup* dp_;
  ZeroStage zero_;
  std::vector<Tensor> owned_grads_;
  std::vector<Work> inflight_;
  size_t next_bucket_ = 0;
  double dp_comm_s_ = 0;
};

}  // namespace dhelix
