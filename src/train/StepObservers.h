// The trainer's StepObservers (parallel/StepObserver.h) besides GradSync: the sparse exchange of the
// last micro-batch's embedding rows, and the test-only fault injection (DHELIX_FAULT_INJECT). Each
// watches the step through the one interface; the trainer adds them to its step runner around
// GradSync, in the order their effects must have (FaultInjector says which).
#pragma once
#include <cstdint>
#include <memory>

#include "comm/CommContext.h"
#include "parallel/GradSync.h"
#include "parallel/ParamStore.h"
#include "parallel/StepObserver.h"

namespace dhelix {

// GradSync's sparse embedding exchange (GradSync::enable_sparse_embedding): the first layer's input
// gradient is the embedding output's gradient, so the last micro-batch's rows leave as soon as the
// layer's backward writes "dx" (ahead of its last weight-gradient GEMMs), and that micro-batch's
// embedding backward is diverted: GradSync adds the gathered rows instead.
class SparseEmbeddingRows final : public StepObserver {
 public:
  // `last_tokens`: the step's last micro-batch's token ids, kept current by the trainer.
  SparseEmbeddingRows(GradSync& sync, const Tensor& last_tokens) : sync_(sync), last_tokens_(last_tokens) {}
  void on_step_begin(int micro_batches) override { last_mb_ = micro_batches - 1; }
  void on_op_done(int mb, int unit, const Op& op, const UnitBuffers& bufs) override;
  bool divert_grad_op(int mb, int unit, const Op& op) override;

 private:
  GradSync& sync_;
  const Tensor& last_tokens_;
  int last_mb_ = 0;
};

// TEST HOOK (tests/parallel/mpi_train_failure_test.sh, tests/train/nonfinite_test.sh):
// DHELIX_FAULT_INJECT=RANK:STEP[:MODE] makes world rank RANK fail in optimizer step STEP (1-based).
// MODE kill (the default) and throw act mid-backward, once the step's last micro-batch has
// finished its middle unit, so dp buckets are in flight: kill prints its rank and last collective
// and raises SIGKILL (a crashed process); throw throws CommError, which `dhelix train` turns into
// an abort of the world. nan-grad writes a NaN into that unit's first gradient before it is
// reduced (one bad step); nan-weight writes a NaN into the rank's first weight as the step starts
// (every step from then on is bad); sigterm raises SIGTERM as the step starts (a graceful stop at
// a known step). RANK:POINT:sigterm raises it at a named point of the run instead (POINT: setup,
// as the run starts; eval0, as the evaluation before step 1 starts; eval, as an evaluation after a
// step starts; save, as a checkpoint save starts; sample, as the final sample starts): the tests of a first signal outside the training loop. Unset in normal
// runs: from_env returns nothing.
enum class FaultMode { kKill, kThrow, kNanGrad, kNanWeight, kSigterm };

class FaultInjector {
 public:
  // Null when DHELIX_FAULT_INJECT is unset or names another rank; ConfigError when malformed.
  // `step` is the trainer's count of finished steps (read when a unit's backward ends).
  static std::unique_ptr<FaultInjector> from_env(int world_rank, int n_units, ParamStore& params, CommContext* comm,
                                               const int64_t& step);
  // Two observers: `before_sync` writes nan-grad's NaN before GradSync reduces the unit, so it must
  // be added before GradSync; `after_sync` kills or throws once the unit's buckets are in flight,
  // so it must be added after GradSync.
  FaultInjector(const FaultInjector&) = delete;  // the phases point back at it
  FaultInjector& operator=(const FaultInjector&) = delete;
  StepObserver& before_sync() { return before_; }
  StepObserver& after_sync() { return after_; }
  // The step (1-based) at whose start nan-weight / sigterm act, or -1.
  int64_t nan_weight_step() const { return mode_ == FaultMode::kNanWeight ? fault_step_ : -1; }
  int64_t sigterm_step() const { return mode_ == FaultMode::kSigterm && point_.empty() ? fault_step_ : -1; }
  // Whether sigterm is to be raised at the named point (setup, eval, save, sample).
  bool sigterm_at(const char* point) const { return mode_ == FaultMode::kSigterm && point_ == point; }

 private:
  FaultInjector(FaultMode mode, int rank, int64_t fault_step, int unit, ParamStore& params, CommContext* comm,
                const int64_t& step);
  struct Phase final : StepObserver {
    FaultInjector* self = nullptr;
    int phase = 0;  // 0 before GradSync, 1 after
    void on_step_begin(int micro_batches) override { self->last_mb_ = micro_batches - 1; }
    void on_unit_backward_done(int mb, int unit) override;
  };
  bool here(int mb, int unit) const { return fault_step_ == step_ + 1 && mb == last_mb_ && unit == unit_; }
  [[noreturn]] void fail() const;

  FaultMode mode_;
  std::string point_;  // a named point instead of a step (sigterm only)
  int rank_;
  int64_t fault_step_;
  int unit_;  // the middle unit of the model
  ParamStore& params_;
  CommContext* comm_;
  const int64_t& step_;
  int last_mb_ = 0;
  Phase before_, after_;
};

}  // namespace dhelix
