// StepObserver: what watches a training step as the executor and the step runner run it --
// gradient sync (parallel/GradSync), the trainer's sparse embedding exchange and fault injection
// (train/), tests reading the issue order -- through one interface instead of callbacks. The
// executor calls every observer added to it (Executor::add_observer) in the order added; an
// observer changes nothing that runs, except that it may take over one gradient (divert_grad_op).
// Here, not in runtime, so that parallel's GradSync can be one.
#pragma once
#include <map>
#include <string>

#include "plan/Program.h"
#include "tensor/Tensor.h"

namespace dhelix {

// One op as the executor issued it (a collective) or started it (compute).
struct IssuedOp {
  StrandKind strand = StrandKind::kForward;
  int mb = 0;     // the micro-batch
  int unit = 0;   // the unit whose program holds the op
  int index = 0;  // into program(unit).fwd or .bwd
  const Op* op = nullptr;
};

using UnitBuffers = std::map<std::string, Tensor>;  // a unit's buffers by name (runtime's UnitEnv::bufs)

class StepObserver {
 public:
  virtual ~StepObserver() = default;
  // A step of `micro_batches` micro-batches begins (StepRunner::run, run_schedule).
  virtual void on_step_begin(int micro_batches) {}
  // A pair of strands begins: forward unit `fwd_unit` beside backward unit `bwd_unit`, -1 for a
  // strand that is idle (both -1: the carried ops of a slot's last pair run alone).
  virtual void on_pair_begin(int fwd_unit, int bwd_unit) {}
  // Every op, in the order the executor issues it (plan/IssueOrder).
  virtual void on_issue(const IssuedOp& op) {}
  // Before compute op `op` of `unit`, which accumulates parameter gradients (op.grads), runs for
  // micro-batch `mb`: true when this observer reduces that gradient another way; the op's kernel
  // and every observer's on_grad_op are then skipped for it.
  virtual bool divert_grad_op(int mb, int unit, const Op& op) { return false; }
  // After such an op accumulated its gradients for micro-batch `mb`.
  virtual void on_grad_op(int mb, int unit, const Op& op) {}
  // After every compute op that ran, with its unit's buffers (its outputs are there).
  virtual void on_op_done(int mb, int unit, const Op& op, const UnitBuffers& bufs) {}
  // Micro-batch `mb`'s backward finished `unit` (every gradient op of the unit ran for it).
  virtual void on_unit_backward_done(int mb, int unit) {}
};

}  // namespace dhelix
