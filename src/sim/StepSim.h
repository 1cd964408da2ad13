// The whole step of one rank simulated op by op (issue 21): every micro-batch's passes through
// every unit, as the step runner orders them, each unit (or co-executed pair of units) run through
// the pair simulator (PairSim.h) with the executor's block rules, then the gradient tail (dp
// buckets on the dp channel as each unit's last backward ends in the simulated passes, ZeRO-1's
// all-gather, the partial-gradient all-reduce: gradient_tail, StepModel.h). Without a step schedule (one stage): with Strand Interleaving, slot 0
// is fwd(mb 0), slot i fwd(mb i) beside bwd(mb i-1) with forward unit u paired with backward unit
// L+1-u (model folding), slot M bwd(mb M-1); without it, each micro-batch's forward then backward.
// With one (StepSimOptions::schedule), any pipeline: 1F1B, interleaved, the folded W.
// Costs: the cluster preset's rates and links (op_time), interference as a compute slowdown beside
// a collective and a collective's slowdown beside compute (PairSimOptions).
#pragma once
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "plan/StepSchedule.h"
#include "sim/PairSim.h"
#include "sim/StepModel.h"

namespace dhelix {

// The plan of a co-executed pair: forward strand of the unit program `fwd` ("embed", "block",
// "head") beside the backward strand of `bwd`. The apps pass the runtime's choice (a plan file's
// for two transformer layers, else schedule/BasicPlans.h's default), which this layer cannot build.
using PairPlanner = std::function<SIPlan(const LayerProgram& fwd, const LayerProgram& bwd)>;

struct StepSimOptions {
  StrandInterleaving si = StrandInterleaving::kOn;  // without `schedule` (with one, its slots say)
  Zero zero = Zero::kNone;
  SparseEmbedGrad sparse_embed = SparseEmbedGrad::kOff;  // parallel.sparse_embed_grad (StepModel.h)
  double grad_wire_bytes = 4;  // comm.grad_precision: 4 (fp32) or 2 (bf16) per gradient element
  Precision precision = Precision::kFp32;
  double compute_slowdown = 1.0;  // PairSimOptions
  double comm_slowdown = 1.0;     // PairSimOptions
  GemmTimer gemm_timer = {};      // when set: GEMM ops as timed for their shapes (DeviceRates)
  OpTimer op_timer = {};          // when set: an op's seconds instead of the preset's op_time (a
                                  // profile's single-op timings: profile_op_timer, a test's
                                  // stand-in); a negative value: the preset's; a pipeline message
                                  // is asked for as the send_recv op "pp.p2p" on group pp, the
                                  // optimizer step as the compute op "optimizer.step"
  PairPlanner plan_for;           // required when a slot co-executes
  // The step schedule (schedule/Pipelines.h's make_schedule of the config's pipeline): required
  // for pp > 1. Every rank's slots run in order; a slot starts when its rank is free and its inputs
  // are there (simulate_slots: activations and gradients cross the pp link, one message at a time
  // per direction); a co-executed slot pairs forward unit fwd_begin+i with backward unit
  // bwd_end-1-i, the longer pass's remaining units alone after; a rank's gradient tail follows its
  // last slot, and the step ends with the latest rank.
  const StepSchedule* schedule = nullptr;
  // A straggler (simulate --straggler RANK:FACTOR): every compute op of pipeline stage `slow_stage`
  // (the slow rank's) and its optimizer step take `slow_factor` times as long; collectives do not
  // (the GPU computes slower, its links do not). Every rank of a stage is in the stage's tp / cp /
  // ep (or x / y / z) groups, whose collectives complete when their last member arrives, so one slow
  // rank paces its whole stage; the other dp replicas wait for it at the gradient tail (each
  // bucket's reduction completes when the slow replica's arrives) and their stages downstream for
  // its messages: the step is the slow replica's, which the representative stage simulated slow
  // gives. -1: none.
  int slow_stage = -1;
  double slow_factor = 1.0;
  // Uneven expert loads (simulate --moe-imbalance F): under expert parallelism the busiest ep rank
  // receives F times the mean of the routed rows (the trainer logs the busiest expert over the
  // mean, which bounds it). Its expert GEMMs, its regrouping of the received rows and its row
  // all-to-alls take F times as long, and every ep collective completes when it arrives, so it paces
  // the stage (and, through the all-to-alls, every replica in its ep group): each rank is priced as
  // that rank. 1: balanced (the programs' own costs).
  double expert_imbalance = 1.0;
};

struct StepSimEvent {
  std::string lane, name;  // lane: "compute" or a group; name: "<op> mb<m> u<unit>", or a tail collective's
  double begin_s = 0, end_s = 0;
  int mb = -1, unit = -1;  // a pass's op: its micro-batch and unit (-1: the gradient tail)
  StrandKind strand = StrandKind::kForward;
};

// One collective of a stage's programs (its op name: "z.ag.attn.qkv", "y.ar.mlp.proj.bwd") or of its
// gradient tail ("grad bucket 3", "zero1 all-gather"), summed over the step's micro-batches and
// layers: where a layout's communication time goes.
struct CollectiveUse {
  std::string group;
  int64_t count = 0;
  double busy_s = 0;     // on its group's channel
  double exposed_s = 0;  // the passes' engine waits charged to it (PairSimResult::exposed_s)
};

// One pipeline stage (every rank of a stage runs alike: the simulator follows one of them).
struct StepSimStage {
  double end_s = 0;       // its last slot ends
  double tail_s = 0;      // its gradient tail past that, the optimizer step included
  double optimizer_s = 0; // its optimizer step (optimizer_time, StepModel.h), the tail's last part
  double compute_s = 0;   // engine busy time
  double bubble_s = 0;    // time between its slots
  double exposed_s = 0;   // end + tail - compute - bubble
  std::map<std::string, double> channel_busy_s;  // per group, passes only
  std::map<std::string, CollectiveUse> collectives;  // by op name, passes and gradient tail
};

struct StepSimResult {
  int64_t micro_batches = 0;
  double step_s = 0;     // body + tail
  double body_s = 0;     // the micro-batches' passes
  double tail_s = 0;     // the gradient tail past the last backward, the optimizer step included
  double optimizer_s = 0;  // the critical stage's optimizer step
  double compute_s = 0;  // engine busy time (slowed where it ran beside a collective)
  double exposed_s = 0;  // step - compute - bubble: what the rank waited on communication
  double bubble_s = 0;   // pipelines: the critical rank's time between its slots
  double tokens_per_s = 0, model_flops_per_s_per_rank = 0;
  std::map<std::string, double> channel_busy_s;  // per group, passes only (the critical rank's)
  std::map<std::string, AxisCost> tail_axes;
  MemoryUse memory;                      // the stage that needs most (the limit)
  std::vector<MemoryUse> stage_memory;   // each pipeline stage's ranks, stage 0 first
  std::vector<StepSimStage> stages;  // per pipeline stage; the step ends with the latest (critical)
  // The data replicas simulated (rank classes: every rank of a replica's stage runs alike, so one
  // stands for it): without a straggler one class, every dp replica; with one, the replicas holding
  // it (with, under ep, its ep group's) and, when there are any, the others, whose passes end
  // wait_s earlier and whose gradient reductions then wait for it. The stages above are the
  // straggler's class (the step's).
  struct ReplicaClass {
    std::string name;  // "all", "with the straggler", "the others"
    int replicas = 0;
    double passes_end_s = 0;
    double wait_s = 0;  // its ranks idle at the gradient reduction, waiting for the slowest class
  };
  std::vector<ReplicaClass> replica_classes;
  // The rank classes simulated: one representative rank per pipeline stage of each replica class
  // (pp x replica_classes.size()), standing for all of the layout's ranks.
  int rank_classes = 0;
  int critical_stage = 0;
  std::vector<StepSimEvent> events;  // passes and gradient tails of every stage, on one clock
};

// ConfigError for a layout that cannot run (layout_errors), or pp > 1 without a schedule.
StepSimResult simulate_step(const ModelConfig& m, const LayoutConfig& lay, const BatchSpec& batch,
                            const ClusterPreset& cluster, const StepSimOptions& opt);

}  // namespace dhelix
