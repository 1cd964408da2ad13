// The engine-facing performance model: predicts one training step of a model on a layout the
// engine runs -- Megatron tp (with sequence parallelism) x dp, pipeline pp (1F1B), and AxoNN's 3D
// grids Gx x Gy x Gz x Gdata -- on a cluster preset, by reading the layer programs
// (build_programs) and parameter shards (model_units). It prices; it runs nothing.
//
// Compute: each op t = max(flops / gemm_rate, bytes / mem_bw) (CostModel's roofline), bytes and
// comm_bytes scaled from the programs' fp32 to the chosen element size.
// Collectives: rings (CostModel::collective_time) on the op's group ("tp", "x", "y", "z", "xy",
// "dp", "pp"), group size from the layout, bandwidth by placement (group_link: inside a node or
// across nodes, NIC sharing).
// Overlap (what hides what), per strand of one unit, a list schedule on one compute engine and one
// channel per group: ops run in program order; a collective starts when its inputs exist and its
// channel is free; a compute op waits for its inputs. So a collective hides under the strand's
// following compute that does not read its output (Megatron's dgrad reduce-scatter under the
// weight-gradient GEMM; 3D's input-gradient all-reduce under the weight-gradient GEMM, OAR).
//   - a 3D weight all-gather the previous layer's prefetch op issued (OAG across layers, depth 1) is
//     there already; the layer's own prefetch op (for the next layer) takes that gather's time on
//     the channel, under the layer's last GEMMs;
//   - a collective whose output nothing in the strand reads and that is not the unit's output (a
//     weight-gradient reduce-scatter, ORS) runs in the background: it costs only where its channel's
//     total per layer exceeds the layer's span;
//   - Megatron SP collectives feeding the next GEMM are exposed (nothing independent follows them);
//   - Strand Interleaving on: fwd(mb i) beside bwd(mb i-1) per slot, as the step simulator runs it:
//     the forward's units in order beside the backward's in reverse, each pair one SI pair of strand
//     programs timed by the pair simulator (simulate_pair, the default pair plan: one engine for
//     both strands' compute, one channel per group, each op's inputs awaited), slot 0 forward only
//     and the last backward only;
//   - data-parallel gradients: each unit's gradients all-reduce (ZeRO-1: reduce-scatter) on the dp
//     channel as soon as that unit's backward of the last micro-batch ends; what runs past the end of
//     backward is exposed (so all but the last buckets hide). ZeRO-1's parameter all-gather after
//     the optimizer step is exposed;
//   - pipelines (PredictOptions::pipeline): each stage holds the units of its chunks (1F1B one, the
//     W two -- layer l beside L+1-l, the embedding and head on stage 0 --, the interleaved v);
//     the body is the schedule walked slot by slot (simulate_slots, as the simulator walks it: each
//     chunk's passes as its units are priced, a co-executed slot as above), each activation and
//     gradient that crosses to another rank priced on the pp link and sent after the slot that made
//     it while the next slot runs (1F1B one each way a micro-batch, the W two, the interleaved v);
//     its receiver waits until it has crossed. Stages whose ranks share one core (a node holding k stages of a pipeline,
//     core_share = 1/k) fill each other's bubbles: the body is the most of the core's work,
//     M x the sum of its stages' times x core_share, and the critical path at the whole core,
//     the body above x core_share.
// Interference (PredictOptions::compute_slowdown / comm_slowdown, else the preset's; none by default):
// the co-execution interference the step simulator charges op by op (PairSimOptions), here as a
// strand by the pair simulator's op rules (price_strand), and a Strand Interleaving pair by the pair
// simulator itself. The gradient tail and the closed-form 3D pricer charge none (as the simulator's
// tail).
// 3D layouts whose programs build_programs does not yet write (no op on x, y or z) are priced by the
// corrected closed form (AxonnModel.h) with compute from the single-rank program's FLOPs divided over
// the grid; StepPrediction::pricer says which.
// 3D with accumulate_z: the micro-batches before the last add each weight gradient block into a
// sum (an element-wise add) instead of reduce-scattering it over z; the last reduce-scatters the sum.
// Memory per rank (a hard limit against the preset's device memory): parameters (element size),
// gradients (fp32, 4 bytes; plus the block sums under accumulate_z), AdamW (two fp32 moments, 8 bytes, plus a 4-byte fp32 master copy under
// bf16; divided by dp under ZeRO-1), gathered 3D weight blocks (two in flight: prefetch), and
// activations: the most of the programs' saved buffers (forward buffers the backward reads) a stage
// holds at once over its slots of the pipeline schedule (StepMemory.h walk_peak: 1F1B stage s holds
// min(p - s, M) micro-batches; the W and interleaved schedules more, their chunks' in turn), plus
// the kept 3D weight blocks and one recomputing layer's remade buffers. predict() walks the schedule
// of PredictOptions::pipeline.
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "layout/Layout.h"
#include "model/ModelConfig.h"
#include "model/Params.h"
#include "plan/Program.h"
#include "plan/StepSchedule.h"
#include "schedule/Pipelines.h"
#include "sim/ClusterPreset.h"
#include "sim/PairSim.h"

namespace dhelix {

struct BatchSpec {
  int64_t global_batch = 0;  // sequences per optimizer step (all data replicas)
  int64_t seq = 0;           // tokens per sequence
  int64_t micro_batch = 1;   // sequences per micro-batch per data replica
};

enum class Zero { kNone, kZero1 };
enum class SparseEmbedGrad { kOff, kOn };  // parallel.sparse_embed_grad
enum class StrandInterleaving { kOff, kOn };
enum class PricerKind { kPrograms, kClosedForm3D };
const char* pricer_name(PricerKind p);  // "programs", "closed-form"

// Seconds of one GEMM of the op's shape measured on this machine (ops carrying attrs gemm_rows /
// gemm_in / gemm_out, sharding/OpFactory.h), or a negative value for "use the preset's rate". A
// grouped GEMM (the experts') is priced as gemm_groups (CostModel.h) such GEMMs.
using GemmTimer = std::function<double(const Op& op)>;

struct PredictOptions {
  Precision precision = Precision::kFp32;
  GemmTimer gemm_timer = {};  // empty: every GEMM at the preset's rate
  Zero zero = Zero::kNone;
  StrandInterleaving si = StrandInterleaving::kOff;
  SparseEmbedGrad sparse_embed = SparseEmbedGrad::kOff;  // price the trainer's sparse embedding exchange
  double grad_wire_bytes = 4;  // a data-parallel gradient element on the wire: 4, or 2 (comm.grad_precision = bf16)
  // rank_layouts (LayoutSearch.h): every layout priced with this activation recomputation; with
  // recompute_auto, the least of none, selective, full with which the layout fits memory.
  Recompute recompute = Recompute::kNone;
  bool recompute_auto = false;
  // rank_layouts: every 3D layout with tp_z > 1 keeps the gathered weight blocks of the first
  // keep_gathered layers of each chunk (LayoutConfig::keep_gathered); with keep_gathered_auto, the
  // most layers with which it still fits memory (after recompute_auto's choice).
  int keep_gathered = 0;
  bool keep_gathered_auto = false;
  // rank_layouts: every layout priced on its programs with the GEMM epilogues fused
  // (LayoutConfig::fuse_epilogues, training.fuse_epilogues: what a GPU run trains by default).
  bool fuse_epilogues = false;
  // The pipeline schedule (pp > 1; schedule.pipeline, schedule.virtual_stages: v chunks a rank for
  // the interleaved one): where its chunks put the units, how many activations cross ranks, the
  // body (its slots walked: simulate_slots) and the activations in flight (the memory walk).
  PipelineKind pipeline = PipelineKind::k1F1B;
  int virtual_stages = 2;  // interleaved only
  // rank_layouts: each layout with pp > 1 priced under each of these schedules (empty: `pipeline`).
  std::vector<PipelineKind> pipelines;
  // Co-execution interference (PairSimOptions: compute beside a collective, a collective beside
  // compute), charged as the interference rule above says; 0: the preset's (ClusterPreset's
  // compute_slowdown, comm_slowdown; 1 where it has none).
  double compute_slowdown = 0, comm_slowdown = 0;
};

// One process-group role's traffic per rank per step.
struct AxisCost {
  double bytes = 0;      // bytes this rank moves (ring: (n-1)/n or 2(n-1)/n of each buffer)
  double seconds = 0;    // time of its collectives
  double exposed_s = 0;  // the part no compute hides
};

struct MemoryUse {
  double params = 0, grads = 0, optimizer = 0, gathered = 0, activations = 0;
  double total() const { return params + grads + optimizer + gathered + activations; }
};

// One op of a priced strand: when it runs in the strand's list schedule (seconds from the
// strand's start; a prefetched collective may start before 0) and how long it takes.
struct OpPrice {
  std::string name, code, group;  // group: "" for compute
  double start_s = 0, seconds = 0;
};

struct StepPrediction {
  LayoutConfig layout;
  PricerKind pricer = PricerKind::kPrograms;
  PipelineKind pipeline = PipelineKind::k1F1B;  // pp > 1: the schedule priced (1F1B at pp = 1)
  int virtual_stages = 1;                       // its chunks a rank, for the interleaved one
  int64_t micro_batches = 0;  // per step per data replica
  double step_s = 0, compute_s = 0, exposed_comm_s = 0, bubble_s = 0;
  double optimizer_s = 0;  // the (slowest) stage's optimizer step, in step_s and compute_s (optimizer_time)
  // What the co-execution interference adds to step_s (the step less the same prediction priced
  // without it; the part that lengthens a pipeline's bubble is also in bubble_s, the rest in neither
  // compute_s nor exposed_comm_s), and the factors charged ({1, 1} by the closed-form 3D pricer).
  double interference_s = 0;
  PairSimOptions interference;
  std::map<std::string, AxisCost> axes;  // "tp", "x", "y", "z", "xy", "pp", "dp"
  MemoryUse memory;
  double memory_limit = 0;
  bool fits = true;
  std::string reason;  // when !fits
  std::vector<std::string> notes;
  // Pipeline stages (programs pricer): each stage's seconds per micro-batch (forward and backward,
  // or the Strand Interleaving slot), and how many consecutive stages share one core.
  std::vector<double> stage_mb_s;
  int stages_per_core = 1;
  // Per strand ("embed fwd", "block bwd", ...): its ops as priced, one micro-batch (programs pricer).
  std::map<std::string, std::vector<OpPrice>> strands;
};

// Every reason `lay` cannot run `m` with `batch` (one message each; empty when legal): the world,
// heads / kv heads / hidden / ffn divisibility per axis, layers by pp, the batch by data replicas x
// micro-batch, cp / ep (not priced).
std::vector<std::string> layout_errors(const ModelConfig& m, const LayoutConfig& lay, const BatchSpec& batch);

// The pipeline predict() prices `lay` under: opt.pipeline at pp > 1 (1F1B at pp = 1), v chunks a
// rank for the interleaved one only, the batch's micro-batches, co-executed under Strand Interleaving.
PipelineSpec pipeline_spec_of(const ModelConfig& m, const LayoutConfig& lay, const BatchSpec& batch,
                              const PredictOptions& opt);

// The interference factors predict charges: the options', else the preset's (1 where it has none).
PairSimOptions interference_of(const PredictOptions& opt, const ClusterPreset& cluster);

// ConfigError with layout_errors' reasons when the layout is illegal.
StepPrediction predict(const ModelConfig& m, const LayoutConfig& lay, const BatchSpec& batch,
                       const ClusterPreset& cluster, const PredictOptions& opt);

// Bytes one rank needs (the stage that needs most), as predict() counts them (the memory rule in
// this header's comment); `dhelix train` refuses a run by it too. ConfigError when illegal. Saved
// buffers without a size rule are counted as residual rows and named in `notes`. The activations
// walk `schedule` (the run's pipeline: its pp, micro-batches and units must be the layout's), or
// without one the 1F1B schedule of the layout, co-executed under Strand Interleaving.
MemoryUse memory_per_rank(const ModelConfig& m, const LayoutConfig& lay, const BatchSpec& batch, Precision precision,
                          Zero zero, StrandInterleaving si, std::vector<std::string>* notes = nullptr,
                          const StepSchedule* schedule = nullptr);
// The same per pipeline stage (every rank of a stage needs the same bytes: its units' states, its
// micro-batches in flight), stage 0 first; memory_per_rank is the largest of them.
std::vector<MemoryUse> memory_per_stage(const ModelConfig& m, const LayoutConfig& lay, const BatchSpec& batch,
                                        Precision precision, Zero zero, StrandInterleaving si,
                                        std::vector<std::string>* notes = nullptr,
                                        const StepSchedule* schedule = nullptr);

// ---- the pieces, for tests and the future whole-step simulator ----

// A collective group as the pricer sees it: ranks and the placement link.
struct GroupLink {
  int size = 1;
  LinkSpec link;
};
// Every role of `lay` ("tp", "x", "y", "z", "xy", "tpblock", "dp", "pp", "cp", "ep") with the
// placement of the group containing rank 0.
std::map<std::string, GroupLink> group_links(const LayoutConfig& lay, const ClusterPreset& cluster);

// The block pricer's configuration (CostModel.h, `dhelix plan --cost-model`) from a cluster preset:
// the GEMM rate in `p` as flop_rate, the preset's memory bandwidth, p's element size, every role's
// placement link and group size (group_links). No launch overheads and no overlap slowdown: the
// preset gives none (a profile's fitted interference does, Interference.h). One cost vocabulary.
CostModelConfig cost_model_config(const ClusterPreset& cluster, const LayoutConfig& lay, Precision p);

struct DeviceRates {
  double gemm_rate = 0;     // FLOP/s
  double mem_bw = 0;        // bytes/s
  double byte_scale = 1.0;  // element bytes / 4 (programs are written in fp32)
  GemmTimer gemm_timer = {};  // when set: GEMM ops' compute time as measured for their shapes
  GemmTiling tiling = {};     // else: a GEMM op at gemm_rate x tiling.efficiency(its C's rows, cols)
  AttentionRates attention = {};  // attention ops' rates (0: gemm_rate)
};
// The rates of `cluster`'s device in `p` (its GEMM rate and tiling, memory bandwidth, element size).
DeviceRates device_rates(const ClusterPreset& cluster, Precision p, GemmTimer gemm_timer = {});

// When each of a stage's units has its gradients (its last backward of the step has ended), for
// gradient_tail: ready_s[i] for unit mine[i], on the clock on which the stage's passes end at end_s.
struct GradReadiness {
  std::vector<double> ready_s;
  double end_s = 0;
};
// The stage's last backward pass alone, starting at 0: its units in reverse order, unit i taking
// bwd_span[i].
GradReadiness readiness_after(const std::vector<double>& bwd_span);

// A gradient-tail collective on its group's comm thread, on the readiness clock (the trace).
struct ChannelSpan {
  std::string group, name;
  double begin_s = 0, end_s = 0;
};

// The sparse exchange of the token embedding's gradient (parallel.sparse_embed_grad; GradSync):
// the table's bucket (the earlier micro-batches, and the head's part when tied) goes at the start
// of the last backward (after the head's when tied), and the last micro-batch's rows and token ids
// are all-gathered once the first layer's backward has written them; the embedding unit's own
// bucket then holds the rest of its parameters. Bytes are the full (gathered) buffers.
struct SparseEmbedTail {
  double table_bytes = 0, rows_bytes = 0, tokens_bytes = 0;
  double table_ready_s = 0, rows_ready_s = 0;  // on the GradReadiness clock
};
// Whether the trainer takes that path (Trainer, GradSync::enable_sparse_embedding) and the models
// price it: parallel.sparse_embed_grad on, one stage, no 3D grid, tp = 1, dp > 1, and a micro-batch's
// tokens over all dp ranks under 2 x vocabulary; priced with cp = ep = 1 only (other layouts keep
// the dense table bucket in the price).
bool sparse_embedding_applies(const ModelConfig& m, const LayoutConfig& lay, const BatchSpec& batch,
                              SparseEmbedGrad s);
// That exchange's figures for a stage (units `mine`, ready as `rd`, its last backward starting at
// last_bwd_start_s), taking the table's bytes out of the embedding unit's entry of grad_bytes.
SparseEmbedTail sparse_embed_tail(const ModelConfig& m, const LayoutConfig& lay, const BatchSpec& batch,
                                  const std::vector<UnitSpec>& units, const std::vector<int>& mine,
                                  const GradReadiness& rd, double last_bwd_start_s, std::vector<double>& grad_bytes,
                                  double grad_wire_bytes);

// What follows a stage's last backward before the optimizer, in seconds past ready.end_s: the
// data-parallel reduction of its units' gradients (the executor's buckets, plan_grad_buckets in
// model/Params.h, on the dp comm thread — dpcp under cp, edp for the experts' — each going when
// the last unit it holds is ready and the thread is free: grad_bytes and expert_bytes per unit of
// `mine`, shared among a unit's buckets by elements), then ZeRO-1's all-gather of `elems` parameters
// and the sequence-parallel partial gradients' all-reduce. Adds the traffic to `axes` and, when
// given, every collective's span to `spans`.
double gradient_tail(const LayoutConfig& lay, const std::map<std::string, GroupLink>& groups,
                     const std::vector<UnitSpec>& units, const std::vector<int>& mine, const GradReadiness& ready,
                     const std::vector<double>& grad_bytes, const std::vector<double>& expert_bytes, double elems,
                     double elem, Zero zero, std::map<std::string, AxisCost>& axes,
                     std::vector<ChannelSpan>* spans = nullptr, const SparseEmbedTail* sparse = nullptr);

// The optimizer step after the gradient tail (Optimizer::step, ParamStore::zero_grads), on the
// compute thread and exposed: the stage's gradient buffer zeroed (4 bytes an element), the
// global-norm pass over the owned gradients (4 bytes), AdamW on the owned elements (reads the
// parameter, its gradient and both moments, writes the parameter and both moments: 28 bytes; in
// bf16 also the parameter's 2-byte working copy). Owned: all `elems`, or elems / dp under ZeRO-1.
// Clipping's extra pass (only when the norm exceeds the clip) is not priced. At the device's memory
// bandwidth, or at its measured optimizer rate (device.optimizer_elems_per_s) where that is slower.
double optimizer_time(double elems, int dp, Zero zero, Precision p, const ClusterPreset& cluster);

// A backward strand as a micro-batch before the step's last runs it under 3D TP's accumulate_z
// (the executor's block sums): each last_micro_batch collective becomes an element-wise add of its
// input into the block sum (read both, write the sum), and each op reading its output a no-op
// ("deferred", no cost). Op for op, so an SI plan of the strand still applies. Unchanged when it
// has none.
std::vector<Op> folding_variant(const std::vector<Op>& ops);

// One micro-batch's activation (or its gradient) crossing a pipeline stage boundary: the residual
// stream [N / tp, C] (Megatron's sequence shard) or [N, C / Gx] (3D), N = B x T / cp rows, of
// `elem`-byte elements. The step model and the step simulator send it alike.
double pipeline_message_bytes(const ModelConfig& m, const LayoutConfig& lay, const BatchSpec& batch, double elem);

// A forward strand as a micro-batch after the step's first runs it under LayoutConfig::keep_gathered:
// the kept weight gathers (op attr "kept") are left out, their blocks kept from the step's first
// micro-batch (the executor's kept_blocks_), and so are the prefetch ops that stand for them (for a
// kept block the executor issues nothing). Unchanged when it has none.
std::vector<Op> without_kept_gathers(const std::vector<Op>& ops);

// Seconds of one op of a layer program: a compute op on the device (FLOPs at the GEMM rate or its
// bytes at memory bandwidth, whichever is longer; the GEMM timer where set), a collective on its
// group's link (CostModel::collective_time). ConfigError when the collective's group is not in
// `groups`. The cost terms price_strand and the pair simulator (PairSim.h) both use.
double op_time(const Op& op, const std::map<std::string, GroupLink>& groups, const DeviceRates& rates);

// Bytes one rank moves in the ring of `coll` over n ranks for a buffer of `bytes`
// (all-gather, reduce-scatter, all-to-all: (n-1)/n; all-reduce: 2(n-1)/n; send/recv and broadcast: 1).
double ring_bytes(CollOp coll, double bytes, int n);

struct StrandPrice {
  double compute_s = 0;  // sum of compute ops
  double span_s = 0;     // the strand's time per layer, overlaps and interference applied
  double interference_s = 0;  // what the interference adds to span_s (0 without)
  std::map<std::string, AxisCost> axes;
  std::vector<OpPrice> ops;  // program order
};
// Prices one strand of one unit (the overlap rule above). `prefetch` = kOn: the steady state of a
// stack of such layers, as the pair simulator runs it -- a 3D weight gather a prefetch op of the
// strand issues for the next layer (OAG) is there already, the prefetch op takes its time and bytes
// on the channel; kOff: the layer's gathers where they stand (the prefetch ops as written).
enum class Prefetch { kOff, kOn };
// With `interference`, each op slows as the pair simulator's rules say (PairSim.h
// compute_end_beside_comm, comm_end_beside_compute, the fixed point over passes when collectives
// slow); compute_s stays the ops' own time, the ops' seconds and span_s include the slowdown.
StrandPrice price_strand(const std::vector<Op>& ops, const std::map<std::string, GroupLink>& groups,
                         const DeviceRates& rates, Prefetch prefetch, const PairSimOptions& interference = {});


}  // namespace dhelix
