// StepRunner: one optimizer step's worth of micro-batches through the executor, either
// sequentially (forward then backward of each micro-batch) or with Strand Interleaving over
// folded units: in slot s the forward strand carries micro-batch s and the backward strand
// micro-batch s-1; pair k co-executes forward unit k with backward unit U-1-k, so layer l runs
// beside layer L+1-l, the embedding beside the head and the head beside the embedding. Slot 0
// is forward-only and slot M backward-only. Gradients accumulate into the one ParamStore.
#pragma once
#include <deque>
#include <functional>
#include <memory>
#include <vector>

#include "plan/SIPlan.h"
#include "runtime/Executor.h"

namespace dhelix {

enum class Interleave { kOff, kOn };

struct MicroBatch {
  Tensor tokens;   // [B*T] int32
  Tensor targets;  // [B*T] int32
};

struct StepStats {
  double loss_sum = 0;   // sum of per-token losses over this rank's micro-batches
  int64_t tokens = 0;    // tokens those losses cover
  int64_t peak_activation_bytes = 0;
};

class StepRunner {
 public:
  // `block_plan` is the plan of the transformer-layer pair (windows into progs.block); the edge
  // pairs (embed|head, head|embed) use pair_default_plan. A null plan means pair_default_plan.
  StepRunner(RunContext& ctx, const std::vector<UnitSpec>& units, const ModelPrograms& progs,
             const SIPlan* block_plan, Interleave mode);

  StepStats run(const std::vector<MicroBatch>& mbs);
  // Forward passes only (held-out loss); touches no gradient.
  StepStats forward_only(const std::vector<MicroBatch>& mbs);
  // Called after the backward of micro-batch `mb` finished unit `unit` (DP bucket hook).
  void set_bwd_unit_hook(std::function<void(int mb, int unit)> hook) { bwd_hook_ = std::move(hook); }
  // Called as each slot of run() begins (begin = true) and ends. With SI on and M >= 2, slot s in
  // [0, M] carries the forward of micro-batch s beside the backward of s - 1 (slot 0 forward only,
  // slot M backward only); otherwise slot m in [0, M) is micro-batch m's forward then backward.
  void set_slot_hook(std::function<void(int slot, bool begin)> hook) { slot_hook_ = std::move(hook); }
  const SIPlan& block_plan() const { return block_plan_; }
  Executor& executor() { return exec_; }

 private:
  struct Inflight {
    int mb = -1;
    std::vector<std::unique_ptr<UnitEnv>> envs;  // one per unit
  };
  void start_mb(Inflight& f, int mb, const MicroBatch& data);
  void link_forward(Inflight& f, int unit);     // y of unit-1 becomes x of unit
  // dx of unit+1 becomes dy of unit; unit+1's env is released unless `release_above` is false
  // (its carried ops have not run yet).
  void link_backward(Inflight& b, int unit, bool release_above = true);
  void finish_bwd_unit(Inflight& b, int unit, StepStats& st);
  const SIPlan& pair_plan(int fwd_unit, int bwd_unit);

  RunContext& ctx_;
  Executor exec_;
  Interleave mode_;
  SIPlan block_plan_;
  std::deque<SIPlan> edge_cache_;  // [kind pair] -> plan
  std::vector<std::pair<std::string, std::string>> edge_keys_;
  std::function<void(int, int)> bwd_hook_;
  std::function<void(int, bool)> slot_hook_;
};

// Plan for a pair of (forward program, backward program): cover_plan (BasicPlans.h); when neither strand
// has a collective, the backward strand runs first so the forward strand reuses freed memory.
SIPlan pair_default_plan(const std::vector<Op>& fwd, const std::vector<Op>& bwd);

}  // namespace dhelix
