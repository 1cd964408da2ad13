// GradSync: moves gradients between ranks after backward. Sequence-parallel partial gradients
// (norm weights, row biases, positions) are all-reduced over tp when their unit's backward ends;
// data parallelism reduces each bucket as soon as the step's last micro-batch has produced the
// last gradient in it (per op, not per layer), on the dp comm thread, under the rest of backward:
//
//   compute : [bwd head][bwd L-1 ........][bwd L-2 ........] ... [bwd 0][embed] | wait | optimizer
//   comm dp :       [b0 AR][b1 AR]  [b2 AR][b3 AR]  [b4 AR] ...          [last] |
//
// With the sparse embedding exchange (enable_sparse_embedding) the token table's bucket goes
// first and only the last micro-batch's embedding rows are left for the end:
//
//   comm dp : [wte AR][b0 AR][b1 AR] ...  [b4 AR] ...                [rows AG] |
//
// Without ZeRO the buckets are all-reduced in place; with ZeRO-1 they are reduce-scattered and
// rank r keeps chunk r of every bucket (the optimizer updates only that chunk).
#pragma once
#include <deque>
#include <cstdint>
#include <string>
#include <vector>

#include "comm/ProcessGroup.h"
#include "sharding/ModelPrograms.h"
#include "parallel/ParamStore.h"
#include "parallel/StepObserver.h"

namespace dhelix {

class Trace;

enum class ZeroStage { kNone = 0, kOne = 1 };
// kOff holds every bucket until finish() (the no-overlap reference of benchmarks).
enum class GradOverlap { kOn, kOff };

class GradSync final : public StepObserver {
 public:
  // tp/dp may be null (size 1). `tp` is the group partial gradients are summed over: Megatron's tp,
  // or z under 3D tensor parallelism. `units` and `progs` tell how many backward ops accumulate into each
  // parameter per micro-batch (a tied embedding gets two: the head's and the embedding's).
  GradSync(ParamStore& params, const std::vector<UnitSpec>& units, const ModelPrograms& progs, ProcessGroup* tp,
           ProcessGroup* dp, ZeroStage zero, MemoryTracker* tracker);

  // A StepObserver of the step's executor (StepRunner::add_observer): it acts on the step's last
  // micro-batch only (on_step_begin tells which), the earlier ones only accumulate gradients.
  void on_step_begin(int micro_batches) override;
  // After a backward op of the last micro-batch accumulated its gradients (op.grads): parameters
  // whose last gradient op this was are ready; a bucket is reduced as soon as all its are.
  void on_grad_op(int mb, int unit, const Op& op) override;
  // After backward of the last micro-batch finished `unit`: the tp all-reduce of that unit's
  // partial gradients, which then count as ready for their dp buckets.
  void on_unit_backward_done(int mb, int unit) override;
  // Issues what is left, waits for all reductions and re-arms the counters; returns the seconds
  // this thread spent blocked.
  double finish();

  // Sparse exchange of the token embedding's gradient (dp > 1, tp = 1). The last micro-batch's
  // embedding backward is not scattered into the dense gradient: its rows (one per token, N x C)
  // and token ids are all-gathered over dp, and after the dense part (earlier micro-batches and,
  // when tied, the head) has been reduced every rank adds all ranks' rows in rank order. The dense
  // part is complete when the last micro-batch's backward starts, so its bucket is reduced under
  // that backward; what is left after the last op is N x C per rank instead of V x C. Turns on
  // when it moves fewer bytes at the end: tokens_per_mb x dp < 2 x V (a ring all-reduce sends
  // 2 (dp-1)/dp x V x C per rank, the all-gather (dp-1) x N x C). Returns whether it is on.
  bool enable_sparse_embedding(int64_t tokens_per_mb);
  bool sparse_embedding() const { return sparse_entry_ >= 0; }
  // The last micro-batch's gradient at the embedding output, `dy` (N x C), and its `tokens`
  // (N int32), as soon as the first layer's backward produced it: starts their all-gathers.
  // False (nothing taken) when sparse is off.
  bool take_embedding_rows(const Tensor& tokens, const Tensor& dy);
  bool embedding_rows_taken() const { return rows_taken_; }

  void set_overlap(GradOverlap o) { overlap_ = o; }
  // The data-parallel buckets' element type on the wire: kF32 (default) or kBF16 (comm.grad_precision):
  // each bucket rounded to bf16 before its all-reduce / reduce-scatter (half the bytes; every hop
  // adds in fp32 and rounds once), widened back into the fp32 gradient when it is waited for. The
  // fp32 gradients, their accumulation over micro-batches, tp's partial-gradient all-reduce and the
  // sparse embedding rows are untouched.
  void set_wire(DType wire);
  // Expert parallelism: the experts' buckets (GradBucket::expert) are all-reduced over `edp`, the
  // dp ranks holding the same experts (null: size 1, nothing to reduce), instead of over dp.
  // With ZeRO-1 the experts' buckets are reduce-scattered over `edp` instead: each edp rank owns
  // 1/edp of its experts' optimizer state.
  void set_expert_group(ProcessGroup* edp);
  // The whole tensor-parallel block (3D: x-y-z), over which gradients marked
  // ParamSpec::partial_grad_block are all-reduced (the MoE MLP's on the grid); null: none.
  void set_block_group(ProcessGroup* block) { block_ = block; }
  // The group a bucket's gradient is reduced (and, with ZeRO-1, sharded) over: edp for the experts'
  // buckets once set_expert_group was called, dp for the others (null: a group of one).
  ProcessGroup* shard_group(const GradBucket& b) const { return b.expert && expert_group_set_ ? edp_ : dp_; }
  int shard_size(const GradBucket& b) const { return shard_group(b) ? shard_group(b)->size() : 1; }
  int shard_rank(const GradBucket& b) const { return shard_group(b) ? shard_group(b)->rank() : 0; }
  // Pipelines whose embedding and head live on different stages of a tied model: finish() first
  // sums the two copies of "wte" (the embedding's on one stage, the head's ParamStore::tied_copy()
  // on the other) with pp rank `peer`, so both hold E + H, and only then reduces their bucket over
  // dp (plain or ZeRO-1): each copy sits alone in a bucket of the same size, so both stages reduce
  // and update it identically and the copies stay equal. One process sums h0 + e0 + h1 + e1 + ...
  // in micro-batch order instead: bitwise different, equal within rounding.
  void set_tied_peer(ProcessGroup* pp, int peer);
  // ZeRO-1: this rank's reduced gradient chunk of bucket b (size (end-begin)/shard_size).
  Tensor& owned_grad(size_t b) { return owned_grads_.at(b); }
  ZeroStage zero() const { return zero_; }
  // Seconds the dp comm thread spent running bucket reductions in the last step.
  double dp_comm_seconds() const { return dp_comm_s_; }
  // When set, finish() records every bucket reduction on the lane "comm <dp group name>".
  void set_trace(Trace* trace) { trace_ = trace; }
  // A GPU step: the stream whose kernels write the gradients (the backward strand's). Every
  // reduction this sync issues is ordered after that stream's work at its issue (a GPU group's
  // ProcessGroup::set_producer_stream, set before each issue: the executor sets the same groups'
  // producer to the issuing strand for its own collectives). Null (the host): nothing to order.
  void set_producer_stream(void* stream) { producer_ = stream; }
  // A GPU step: the stream whose kernels read the reduced gradients after finish() (the
  // optimizer's). finish() widens a bf16 wire's results into the fp32 gradients there, after the
  // host has waited for each reduction; the backward's stream may already be joined behind it.
  void set_update_stream(void* stream) { update_ = stream; }

 private:
  // `g`, about to take an op of this sync: ordered after the producer stream (a GPU step's).
  ProcessGroup* produced(ProcessGroup* g) const {
    if (g && producer_) g->set_producer_stream(producer_);
    return g;
  }
  void param_ready(size_t entry);
  void add_tied_peer();  // the tied embedding's gradient summed with the other stage's copy's
  void add_gathered_rows();
  void issue_bucket(size_t b);
  // A gradient summed over only this rank's tokens of the tensor-parallel block (ParamSpec::partial_grad):
  // all-reduced over `tp_` — the tp group (sequence parallelism) or z (3D tensor parallelism).
  // Or over the whole block (ParamSpec::partial_grad_block: `block_`). Returns the group, or null.
  ProcessGroup* partial_group(const ParamEntry& e) const {
    if (e.spec.partial_grad && tp_ && tp_->size() > 1) return tp_;
    if (e.spec.partial_grad_block && block_ && block_->size() > 1) return block_;
    return nullptr;
  }
  bool tp_partial(const ParamEntry& e) const { return partial_group(e) != nullptr; }

  ParamStore& params_;
  const std::vector<UnitSpec>& units_;
  ProcessGroup* tp_;
  void* producer_ = nullptr;  // set_producer_stream
  // A GPU step's tp partial-gradient all-reduces of a unit, not yet complete (on_unit_backward_done).
  struct Partial {
    std::vector<Work> works;
    std::vector<size_t> ready;  // entries ready once they complete
  };
  std::deque<Partial> partials_;
  void drain_partials();  // waits for them in issue order; their entries become ready
  ProcessGroup* block_ = nullptr;
  ProcessGroup* dp_;
  bool expert_group_set_ = false;
  ProcessGroup* edp_ = nullptr;
  ZeroStage zero_;
  GradOverlap overlap_ = GradOverlap::kOn;
  std::vector<Tensor> owned_grads_;
  std::vector<int> grad_ops_;         // per entry: backward ops accumulating into it per micro-batch
  std::vector<int> pending_ops_;      // per entry: of those, not yet run in this step's last micro-batch
  std::vector<int> pending_params_;   // per bucket: entries not yet ready
  std::vector<char> issued_;          // per bucket
  struct Inflight {
    Work work;
    std::string name;  // trace name: "dp.ar.bucket3", "dp.ag.embed.rows", ...
    int64_t elems;     // elements it moves
    Tensor wire_out, widen_to;  // a bf16 bucket: its reduced bf16 result, widened into widen_to at wait
    Tensor keep;                // a bf16 reduce-scatter's input: alive until the op is done
  };
  bool on_gpu() const { return !params_.device().is_host(); }
  Tensor owned_chunk(int64_t n) const;  // a zeroed fp32 chunk on the gradients' device
  void* update_ = nullptr;
  DType wire_ = DType::kF32;
  std::vector<Inflight> inflight_;
  double dp_comm_s_ = 0;
  Trace* trace_ = nullptr;
  int last_mb_ = 0;              // the step's last micro-batch (on_step_begin)
  int64_t sparse_entry_ = -1;   // the token embedding's entry when the sparse path is on
  bool bwd_started_ = false;    // the last micro-batch's first gradient op has run this step
  bool rows_taken_ = false;     // take_embedding_rows ran this step
  Tensor tokens_all_, rows_all_;  // gathered: dp x N token ids, dp x N rows of C
  MemoryTracker* tracker_ = nullptr;
  ProcessGroup* tied_pp_ = nullptr;
  int tied_peer_ = -1;
  size_t tied_bucket_ = SIZE_MAX;  // held back until the copies are summed
};

}  // namespace dhelix
