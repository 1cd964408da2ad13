// Analytical BlockCost: prices SI blocks from each Op's cost terms with a roofline for compute
// and a ring model for collectives, so the plan search runs without hardware. It predicts; it
// measures nothing (Profile holds measurements) and knows nothing about MPI or CUDA.
//
//   compute op       t = op_overhead + compute_seconds (max(flops / (flop_rate · tiling efficiency),
//                    s · bytes / mem_bw))
//   collective on a group of n ranks, B = s · Op::cost.comm_bytes = the full (gathered / unreduced)
//   buffer (s = element_bytes / 4: the programs count fp32 elements), bw = per-rank link bandwidth, L = per-step latency of the group's link:
//     all_gather, reduce_scatter, all_to_all   t = (n-1)/n · B/bw + (n-1)·L
//     all_reduce                              t = 2 · ((n-1)/n · B/bw + (n-1)·L)       (ring)
//       with LinkSpec::tree_allreduce, the less of that and a double binary tree's
//                                             t = 2 · B/bw + 2 · ⌈log2 n⌉ · L
//       (each half of the buffer reduced up one tree and broadcast down it, pipelined: every rank
//       sends and receives about B each way -- the ring's bandwidth term as n grows -- and the
//       pipeline fills in ⌈log2 n⌉ steps up and as many down; NVIDIA, "Massively Scale Your Deep
//       Learning Training with NCCL 2.4", 2019; Sanders, Speck, Träff, "Two-tree algorithms for
//       full bandwidth broadcast, reduction and scan", Parallel Computing 35(12), 2009)
//     broadcast                               t = B/bw + (n-1)·L
//     send_recv                               t = B/bw + L
//     (n <= 1: 0) + op_overhead
//   n = op.attrs["group_size"] when present, else config.group_sizes[op.group].
//
// A block is timed by replaying the executor's issue order on one compute engine and one
// channel per process group: within a strand ops run in order; a collective starts when its
// strand reaches it; compute ops queue on the single engine, the strand without a collective
// first, then the other (the "dependent" strand). T = makespan, then
//   solo window:                      T
//   pair with compute beside comm:    T · overlap_slowdown     (SMs / memory shared with NCCL)
//   pair of two pure-comm windows:    T · comm_comm_slowdown   (links shared)
//   pair of two pure-compute windows: T (= Cf + Cb: one engine, no overlap)
// and every block adds block_overhead (the barrier between blocks). So the pure cases are
// max(C, M)·s for compute ∥ comm and Cf + Cb for compute + compute.
#pragma once
#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "plan/BlockCost.h"
#include "plan/Program.h"

namespace dhelix {

struct LinkSpec {
  double bandwidth = 0;  // bytes/s each rank can push around the ring (bus bandwidth)
  double latency = 0;    // seconds per ring step
  // The least time one collective takes on this link (0: none). Where a ring's ranks share a core
  // with ring neighbours (the emulated cluster: 2 ranks per core), each hand-off between them waits
  // for the scheduler, and a collective of any size takes a few milliseconds (ClusterPreset).
  double min_op_s = 0;
  // The collective library may run an all-reduce as a pipelined double binary tree instead of a
  // ring, taking whichever is faster (NCCL >= 2.4 does; Gloo and Open MPI here run rings): the
  // tree's latency grows with log2 n instead of n (below).
  bool tree_allreduce = false;
};

// How a GPU's GEMM library cuts C[m, n] into output tiles run one per streaming multiprocessor, in
// waves (NVIDIA, "Matrix Multiplication Background User's Guide", DU-09799-001, §2.3 and §3): a
// partial tile and a partial last wave compute nothing useful, so a GEMM runs at
//   efficiency(m, n) = m·n / (tiles · tm·tn)  ×  tiles / (waves · units),
//   tiles = g·⌈m/tm⌉·⌈n/tn⌉, waves = ⌈tiles/units⌉ (g GEMMs of one grouped launch),
// of the preset's large-GEMM rate. Absent (units = 0): 1 (the CPU presets: no tiles in waves).
struct GemmTiling {
  int units = 0;                   // streaming multiprocessors (device.gemm_units)
  int64_t tile_m = 0, tile_n = 0;  // device.gemm_tile = [tm, tn]
  double efficiency(int64_t m, int64_t n, int64_t groups = 1) const;
};

// Attention's achievable FLOP/s in the programs' count (causal forward 2·B·T²·H·D, backward 2.5x
// that: sharding/UnitLowering.cc), forward and backward (attention, ring_attention ops; their _bwd
// ops): a measured device's (device.attention_efficiency, attention_bwd_efficiency x peak). 0: the
// GEMM rate, as the fused attention kernels of the published runs come near it.
struct AttentionRates {
  double fwd = 0, bwd = 0;
};

// Seconds of a compute op on a device: its FLOPs at the GEMM rate (a GEMM op -- attrs gemm_rows /
// gemm_in / gemm_out -- at the rate times tiling.efficiency of its output C; an attention op at
// its own rate when `attention` gives one) or its bytes (scaled by byte_scale: the programs count
// fp32) at memory bandwidth, whichever is longer. The one compute formula of the simulator, the
// step model and the cost model.
double compute_seconds(const Op& op, double gemm_rate, double mem_bw, double byte_scale, const GemmTiling& tiling,
                       const AttentionRates& attention = {});
// How many GEMMs of the op's gemm_rows x gemm_in x gemm_out shape its FLOPs make: 1, or a grouped
// GEMM's groups (the experts': flops / (2 rows in out)).
int64_t gemm_groups(const Op& op);

struct CostModelConfig {
  std::string name = "custom";
  double flop_rate = 0;             // achievable FLOP/s of one compute engine
  double mem_bw = 0;                // achievable bytes/s of device memory
  double op_overhead_s = 0;         // launch cost of each op
  double block_overhead_s = 0;      // barrier/join cost of each block
  double overlap_slowdown = 1.0;    // >= 1: compute and comm co-running slow each other
  double comm_comm_slowdown = 1.0;  // >= 1: two groups' collectives co-running
  // Bytes per element of the precision simulated. The programs count fp32 (4 bytes), so memory
  // traffic and collective bytes are scaled by element_bytes / 4: the GPU presets train in 16-bit
  // (the papers' bf16/fp16, and their flop_rate is the 16-bit tensor rate), cpu-emulated in fp32.
  double element_bytes = 4;
  GemmTiling tiling;                       // the preset's (GPUs); absent: every GEMM at flop_rate
  AttentionRates attention;                // attention_rate / attention_bwd_rate; 0: flop_rate
  std::map<std::string, LinkSpec> links;   // per group role; "default" for any other role
  std::map<std::string, int> group_sizes;  // ranks per role, for ops without attrs["group_size"]

  // Every field optional (defaults above). ConfigError on bad values. The named configurations come
  // from the cluster presets (cost_model_config in StepModel.h), not from here.
  nlohmann::json to_json() const;
  static CostModelConfig from_json(const nlohmann::json& j, const std::string& origin = "<json>");
  void validate() const;  // ConfigError naming the field and value
};

class CostModel final : public BlockCost {
 public:
  // Prices every op of `prog` up front; ConfigError when a collective's group has no link or
  // no size.
  CostModel(const LayerProgram& prog, CostModelConfig cfg);

  double op_time(StrandKind strand, int i) const;
  double solo_fwd(int a, int b) const override;
  double solo_bwd(int c, int d) const override;
  double pair(int a, int b, int c, int d) const override;

  const CostModelConfig& config() const { return cfg_; }
  // Seconds of one collective of `coll` kind over `bytes` on n ranks with `link`.
  static double collective_time(CollOp coll, double bytes, int n, const LinkSpec& link);

 private:
  struct OpTime {
    double t;
    int group;  // -1 for compute, else index into the group channels
  };
  double makespan(const std::vector<OpTime>* first, int a, int b, const std::vector<OpTime>* second,
                  int c, int d) const;

  CostModelConfig cfg_;
  std::vector<OpTime> fwd_, bwd_;
  int num_groups_ = 0;
};

}  // namespace dhelix
