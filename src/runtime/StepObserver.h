// StepObserver: watches a step as the executor runs it, without changing what runs. The executor
// calls every observer added to it (Executor::add_observer) at each op it issues, in the order of
// plan/IssueOrder, and as each pair of strands begins. Tests read the issue order through it (the
// executor's order against the simulator's); the gradient hooks the trainer installs as callbacks
// (RunContext::on_grad_op, on_op_done, divert_grad_op, StepRunner's unit hook) are to move here.
#pragma once
#include "plan/Program.h"

namespace dhelix {

// One op as the executor issued it (a collective) or started it (compute).
struct IssuedOp {
  StrandKind strand = StrandKind::kForward;
  int mb = 0;     // the micro-batch
  int unit = 0;   // the unit whose program holds the op
  int index = 0;  // into program(unit).fwd or .bwd
  const Op* op = nullptr;
};

class StepObserver {
 public:
  virtual ~StepObserver() = default;
  // A pair of strands begins: forward unit `fwd_unit` beside backward unit `bwd_unit`, -1 for a
  // strand that is idle (both -1: the carried ops of a slot's last pair run alone).
  virtual void on_pair_begin(int fwd_unit, int bwd_unit) {}
  virtual void on_issue(const IssuedOp& op) {}
};

}  // namespace dhelix
