// The executor: runs layer programs of two strands — the forward pass of one micro-batch and
// the backward pass of another — block by block according to an SI plan. In each block the
// collectives are issued first (they run on their group's comm thread), then the strand that
// does not wait on them, then the strand that does; the block's collectives complete before the
// next block starts — except two kinds that 3D tensor parallelism marks: a background collective
// (attr "background": a weight-gradient reduce-scatter, waited for by the op that reads it) and a
// cross-layer prefetch (attr "prefetch_unit": adopted, and waited for, by the neighbouring unit).
// Each strand's compute is launched on a stream of its own on the run's device (Stream.h; the
// host's runs it inline on this, the rank's compute thread) with that device's kernels
// (KernelRegistry.h); an op that reads a collective's output first makes its strand's stream wait
// on the collective's completion event. On a GPU the two strands' kernels are so in flight at once:
// within a pair nothing orders one strand's stream after the other's (they touch different
// micro-batches' buffers, read the same weights and only the backward writes gradients); each pair
// begins and ends with the two streams joined (each waits for an event of the other), so work
// outside the pairs -- the micro-batches' tokens, the optimizer, on the forward stream -- is
// ordered with both, and device memory a pair frees is given back only at its end, after the join
// (hold_device_frees: a buffer one strand drops may still be read by the other's kernels).
//
//   compute thread : [bwd ops k ........][fwd ops k (wait AG)] | [ ...block k+1
//   comm tp thread :  [AG fwd k ...........]                    |
//
//   GPU, fwd stream:  join [fwd ops k ....][fwd ops k+1 ...] join
//   GPU, bwd stream:  join [bwd ops k .........][bwd k+1 ..] join
#pragma once
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "comm/ProcessGroup.h"
#include "sharding/ModelPrograms.h"
#include "plan/SIPlan.h"
#include "runtime/Env.h"
#include "runtime/OpRegistry.h"
#include "parallel/StepObserver.h"
#include "runtime/KernelRegistry.h"
#include "runtime/Stream.h"
#include "runtime/StepGroups.h"
#include "parallel/ParamStore.h"
#include "base/Trace.h"

namespace dhelix {

// The element type activation collectives move (ops with the "activation" attr: TP/SP gathers and
// reduce-scatters, the context-parallel ring, the expert all-to-alls, 3D TP's activation
// all-reduces): fp32, or bf16 (rounded to nearest even before sending, reductions in fp32 per hop
// and rounded, widened back to fp32 on arrival: half the bytes on the wire). Weights, gradients and
// loss statistics always move in fp32.
enum class WirePrecision { kFp32, kBf16 };

struct RunContext {
  Device device;  // where this rank's tensors live and its op kernels run (the host: the CPU backend)
  const ModelConfig* model = nullptr;
  LayoutConfig layout;
  int tp_rank = 0;
  ShardIndex shard;                             // tp rank, or x, y, z under 3D tensor parallelism
  int pp_rank = 0;                              // this rank's pipeline stage (groups' kPP when pp > 1)
  int cp_rank = 0;                              // context parallelism: which two chunks of each sequence
  MicroBatchShape mb;                           // this rank's: under cp, T is the local rows (T / cp)
  ParamStore* params = nullptr;
  MemoryTracker* act_mem = nullptr;             // activation bytes (both strands)
  StepGroups groups;                            // this rank's groups by role (null: size 1)
  Trace* trace = nullptr;
  float dloss = 1.0f;                           // 1 / tokens per optimizer step (all mbs, all dp)
  RouterStats router;                           // MoE: tokens per expert and the aux loss (StepRunner resets it)
  // Micro-batches per optimizer step on this rank. A collective marked last_micro_batch (3D's
  // weight-gradient reduce-scatter over z) runs only for the last; earlier micro-batches add its
  // input to a block sum the last one's input then includes, and skip the op that reads its output.
  // 1 (profiling, evaluation): every micro-batch runs it.
  int micro_batches = 1;
  // Wait for every collective right after issuing it: no overlap of any kind, not even within a
  // strand (benchmarks measure the fully exposed step with it).
  bool expose_collectives = false;
  WirePrecision activation_wire = WirePrecision::kFp32;
  // GEMM precision bf16 (training.bf16_activations): after its last forward use, each activation
  // the backward reads only as a weight-gradient GEMM's x (bf16_saved_buffers) is replaced by its
  // bf16 rounding -- half its bytes until the backward, the same results bitwise.
  bool bf16_saved_activations = false;
  // The current step's bf16 weight copies (StepRunner sets it while a step runs in bf16), or null.
  Bf16Weights* bf16_weights = nullptr;
  MemoryTracker* state_mem = nullptr;  // model and optimizer states (the bf16 weight copies count there)
  cpu::KernelConfig kernels;  // the GEMM precision handed to the op kernels; threads: StepRunner sets them
  cuda::Blas* blas = nullptr;  // a GPU run's cuBLASLt GEMMs (one per GPU; not owned), else null
};

// One micro-batch positioned at one unit on one strand.
struct StrandSlot {
  int mb = 0;
  int unit = 0;
  UnitEnv* env = nullptr;
};

// Backward ops [begin, end) of slot.unit's program that a pair's plan carried out of it
// (SIPlan::carry): they run in the next pair, after its first collective is issued; then
// `on_done` (the unit's backward is complete: hooks, release of its buffers) is called.
struct CarriedOps {
  StrandSlot slot;
  int begin = 0, end = 0;
  std::function<void()> on_done;
  bool empty() const { return end <= begin; }
};

class Executor {
 public:
  Executor(RunContext& ctx, const std::vector<UnitSpec>& units, const ModelPrograms& progs);
  // Waits for prefetched weight all-gathers nobody adopted (their buffers outlive the transfer).
  ~Executor();

  const LayerProgram& program(int unit) const;
  int num_units() const { return static_cast<int>(units_.size()); }
  const UnitSpec& unit(int u) const { return units_.at(u); }

  // Runs fwd ops of `f` and bwd ops of `b` (either may be null) by `blocks`, whose windows index
  // program(f->unit).fwd and program(b->unit).bwd. The last `carry_out` bwd ops are skipped (the
  // caller runs them later: SIPlan::carry). `carry_in` (may be null or empty), ops an earlier pair
  // carried out, run in the first block that issues a leading collective, right after issuing it,
  // or after the last block when none does. The order is plan/IssueOrder's, as the simulator's.
  void run_pair(StrandSlot* f, StrandSlot* b, const std::vector<Block>& blocks, int carry_out = 0,
                CarriedOps* carry_in = nullptr);
  // Watches every later pair and op, after those added before it (not owned; it must outlive the
  // executor or be removed). StepRunner also tells the executor's observers of steps and units.
  void add_observer(StepObserver* o) { observers_.push_back(o); }
  void remove_observer(StepObserver* o) { std::erase(observers_, o); }
  const std::vector<StepObserver*>& observers() const { return observers_; }
  // The stream of the step's work outside the pairs (the forward strand's; each pair joins it with
  // the backward strand's before and after): its device handle, a cudaStream_t on a GPU, nullptr
  // on the host.
  StreamHandle compute_stream() const { return streams_[0]->handle(); }
  // Either strand's stream (a cudaStream_t on a GPU; nullptr on the host).
  StreamHandle strand_stream(StrandKind k) const { return streams_[static_cast<int>(k)]->handle(); }
  // Compute launched after this call, on either strand, waits for `w` (a receive whose buffer the
  // next op reads): on the host a join; on a GPU both streams wait (Work::wait_on), and the host
  // then waits too (the caller drops `w`: its failure must be seen here).
  void stream_wait(const Work& w) {
    WorkEvent done(w);
    for (auto& s : streams_) s->wait(done);
    if (on_gpu_) w.wait();
  }
  // Waits for the collectives whose readers were ordered after them on the GPU (wait_pending:
  // NCCL ops, Work::wait_on) and that had not finished then, throwing the first failure; adds their
  // trace entries. StepRunner calls it at the end of a step, before flush_trace.
  void finish_device_waits();
  // Blocks until everything launched on both strands' streams has run (a no-op on the host, where
  // work runs as it is launched): a GPU's timings end here.
  void synchronize();
  // Orders both strands' streams after the work issued so far on the thread's default stream (the
  // parameter store's zeroing of the gradients): StepRunner calls it as a step begins. A GPU only
  // (tensor/DeviceMemory.h's stream_after_default: explicit, for the default stream inside an SM
  // partition).
  void after_default_stream();
  // On a GPU with a trace, the compute lanes come from CUDA events around each op; they are read
  // (waiting for the last) and added to the trace here: StepRunner calls it at the end of a step.
  // Nothing to do on the host, whose lanes are written as the ops run.
  void flush_trace();
  // Runs carried ops now (the slot's last pair carried some and no pair follows).
  void run_carried(CarriedOps& c);
  // Runs the whole forward (or backward) program of one slot, collectives exposed.
  void run_alone(StrandSlot& s, StrandKind kind);
  // Waits for every collective still pending in `env` (background reduce-scatters whose reader did
  // not run: a window timed on its own) and for every prefetch no unit adopted, and forgets those.
  void drain(UnitEnv& env);
  void drain_prefetches();
  // Drops the weight blocks kept for this step's micro-batches (reuse_kept_block): at the end of a
  // step or a forward-only pass, before any update changes the weights.
  void end_kept_blocks() { kept_blocks_.clear(); }

 private:
  void run_op(StrandKind kind, StrandSlot& s, const Op& op, std::vector<std::pair<UnitEnv*, std::string>>& issued);
  // The carried ops ran (none may issue a collective): mark them done and call c.on_done.
  void finish_carried(CarriedOps& c, const std::vector<std::pair<UnitEnv*, std::string>>& issued);
  void issue_collective(StrandKind kind, StrandSlot& s, const Op& op);
  // Makes `on` (every strand's stream when null) wait for the collective writing `buf`, if pending.
  void wait_pending(UnitEnv& env, const std::string& buf, Stream* on = nullptr);
  Stream& stream_of(StrandKind k) { return *streams_[static_cast<int>(k)]; }
  // Each strand's stream waits for what the other's has been given so far (a GPU; nothing on the host).
  void join_streams();
  class PairScope;
  std::string lane(StrandKind k) const;
  ProcessGroup& group_of(const Op& op) const;  // the collective's group (InternalError when absent)
  // A cross-layer prefetch (op attr "prefetch_unit": +1 forward, -1 backward; Executor.cc):
  // issues the all-gather of the neighbouring unit's weight block and keeps it for that unit's own
  // all-gather op, which then adopts it instead of gathering again.
  void issue_prefetch(StrandKind kind, StrandSlot& s, const Op& op);
  // This rank's flat shard of a weight, as a weight all-gather (3D) sends it: the fp32 values, or on
  // a GPU the bf16 copy its GEMMs read.
  Tensor weight_shard(const ParamEntry& w) const;
  bool adopt_prefetch(StrandKind kind, StrandSlot& s, const Op& op);
  // A last_micro_batch collective: an earlier micro-batch adds its input to the block sum (the
  // first one starts it) and returns true (not issued); the last adds the sum into its input, drops
  // the sum and returns false (issued as usual).
  bool fold_into_block_sum(StrandKind kind, StrandSlot& s, const Op& op);
  // A kept weight gather (op attr "kept": LayoutConfig::keep_gathered) of a micro-batch after the
  // step's first: the block micro-batch 0 gathered, whose weights no update has changed since, is
  // bound to this micro-batch's buffer and true returned (nothing issued). False: gather it
  // (micro-batch 0, or a run of one micro-batch), and keep_block stores it for the later ones, until
  // end_kept_blocks at the step's (or the forward-only pass's) end.
  bool reuse_kept_block(StrandSlot& s, const Op& op);
  void keep_block(StrandSlot& s, const Op& op);
  // RunContext::bf16_saved_activations: after forward compute op `op` of s.unit, its unit's
  // activations whose last forward use it was and that only weight-gradient GEMMs read later are
  // replaced by their bf16 rounding.
  void keep_saved_in_bf16(StrandSlot& s, const Op& op);

  RunContext& ctx_;
  const std::vector<UnitSpec>& units_;
  const ModelPrograms& progs_;
  struct Prefetched {
    Tensor buf;
    PendingColl coll;
  };
  // Keyed by (strand, micro-batch, unit, the adopting op's output buffer).
  std::map<std::tuple<int, int, int, std::string>, Prefetched> prefetched_;
  std::map<std::pair<int, std::string>, Tensor> block_sums_;  // (unit, op name) -> sum so far this step
  // (unit, kept gather's output buffer) -> the block micro-batch 0 gathered this step (AxoNN's cache:
  // one gather of a kept layer's blocks per step, whatever the micro-batch count).
  std::map<std::pair<int, std::string>, Tensor> kept_blocks_;
  std::map<const LayerProgram*, std::vector<std::vector<std::string>>> bf16_saves_;  // bf16_saved_buffers, per program
  std::vector<StepObserver*> observers_;
  // Collectives a strand's stream was ordered after on the GPU before they finished (wait_pending),
  // waited for by finish_device_waits; with their trace names and when their wait was called.
  struct DeviceWaited {
    Work work;
    std::string group, name;
    double wait_called = 0;
  };
  std::vector<DeviceWaited> device_waited_;
  const KernelRegistry& kernels_;       // ctx.device's op kernels
  const bool on_gpu_;                   // ctx.device is a GPU
  std::unique_ptr<Stream> streams_[2];  // ctx.device's compute streams, by StrandKind
  // A GPU trace's ops not yet read back: their lane, name and timed events on the strand's stream;
  // times are taken from trace_base_, an event recorded when both streams were idle at host time
  // trace_base_s_.
  struct GpuMark {
    std::string lane, name;
    std::unique_ptr<Event> begin, end;
  };
  std::vector<GpuMark> gpu_marks_;
  std::unique_ptr<Event> trace_base_;
  double trace_base_s_ = 0;
};

}  // namespace dhelix
