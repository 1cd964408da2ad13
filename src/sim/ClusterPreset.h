// A cluster preset: what one device computes and holds, and how fast its node talks inside and
// across nodes, read from a TOML file (configs/clusters/*.toml, every number with its source in
// the file). Plus AxoNN's placement rule: the bandwidth a collective group sees depends on where
// its ranks sit (axonn.md §4.3). Pure data and arithmetic; it measures nothing.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "sim/CostModel.h"

namespace dhelix {

enum class Precision { kFp32, kBf16 };
const char* precision_name(Precision p);  // "fp32", "bf16"
int element_bytes(Precision p);           // 4, 2

// A measured intra-node bus bandwidth for one placement pattern: a group of g ranks at stride ip.
struct IntraNodeEntry {
  int ip = 1;
  int g = 2;
  double bandwidth = 0;  // bytes/s (NCCL bus-bandwidth convention)
};

struct ClusterPreset {
  std::string name;
  std::string origin;  // the file it was read from
  int devices_per_node = 1;
  double memory_bytes = 0;     // device memory usable by one rank
  double mem_bw = 0;           // device memory bytes/s
  double peak_flops_fp32 = 0;  // per device
  double peak_flops_bf16 = 0;  // 0: not offered
  // The achievable GEMM rate: a measured rate per precision when given, else peak x efficiency.
  double gemm_efficiency = 0;  // 0: absent
  double gemm_flops_fp32 = 0;  // 0: absent
  double gemm_flops_bf16 = 0;  // 0: absent
  // Fractions of peak attention reaches, forward and backward, in the programs' FLOP count (a
  // measured device's kernels; CostModel.h's AttentionRates). 0: absent (the GEMM rate).
  double attention_efficiency = 0, attention_bwd_efficiency = 0;
  // Share of one core each rank computes with, for presets of this machine: `dhelix tune
  // --measure-gemm` times the programs' GEMM shapes on one core here and scales by it. 0: absent.
  double core_share = 0;
  // AdamW elements per second one device updates, measured (presets of this machine, where the
  // update's square roots and divisions, not memory, bound it); 0: absent (memory-bound price).
  double optimizer_elems_per_s = 0;
  // Co-execution interference (PairSim.h PairSimOptions), measured: a compute op runs
  // compute_slowdown times slower while a collective of its rank is in flight, a collective
  // comm_slowdown times slower while its rank computes (a profile's fit, Interference.h). 1: none
  // (absent). What `predict`, `tune` and `simulate` charge when no flag or profile sets them.
  double compute_slowdown = 1.0, comm_slowdown = 1.0;
  GemmTiling gemm_tiling;      // size-dependent GEMM efficiency (GPUs); absent: every GEMM at gemm_rate
  LinkSpec intra_node;         // bus bandwidth and per-step latency inside a node
  LinkSpec inter_node;         // per-node injection bandwidth and per-step latency across nodes
  // The least time of one collective whose group spans nodes with several members on one node
  // (node.inter_shared_min_op_s; 0: none): on this machine's emulated cluster those members share
  // a core, and each ring hand-off between them waits for the scheduler.
  double inter_shared_min_op_s = 0;
  std::vector<IntraNodeEntry> intra_table;  // measured (ip, g) patterns; others use intra_node

  // FLOP/s of a GEMM in `p` on one device; ConfigError naming the preset when it has no figure.
  double gemm_rate(Precision p) const;
  // Attention's rates in `p`: peak x attention_efficiency (forward) and x attention_bwd_efficiency
  // (backward; the forward's when absent); {0, 0} (the GEMM rate) without them.
  AttentionRates attention_rates(Precision p) const;
  // A GPU's preset: one with a bf16 tensor-core figure (every GPU preset has one; this machine's
  // CPU presets have none). What `training.fuse_epilogues = auto` asks of a preset.
  bool is_gpu() const { return peak_flops_bf16 > 0 || gemm_flops_bf16 > 0; }
  // bf16 on a GPU's preset (the papers train in 16-bit), else fp32.
  Precision native_precision() const { return is_gpu() ? Precision::kBf16 : Precision::kFp32; }
  // The vendor's peak FLOP/s in `p` (the MFU denominator); ConfigError when the preset has none.
  double peak_flops(Precision p) const;
};

// Reads a preset from TOML text; ConfigError naming `origin`, the field and a hint.
ClusterPreset parse_cluster(const std::string& text, const std::string& origin);

// `name_or_path`: a path (contains '/' or ends in .toml), or a preset name looked up as
// <dir>/<name>.toml in cluster_search_dirs(clusters_dir). ConfigError naming the places looked in
// and the names found there.
ClusterPreset load_cluster(const std::string& name_or_path, const std::string& clusters_dir = "");
// `clusters_dir` (sim.clusters_dir, tune's --clusters-dir) when not empty; else <directory of this
// executable>/../configs/clusters, then ./configs/clusters.
std::vector<std::string> cluster_search_dirs(const std::string& clusters_dir = "");
// Preset names (file stems) found in the search directories, sorted, without duplicates.
std::vector<std::string> cluster_names(const std::string& clusters_dir = "");

// AxoNN's placement rule for a group of g ranks whose neighbours are ip ranks apart, ranks placed
// on nodes in rank order, devices_per_node per node:
//   ip * g <= devices_per_node (inside one node): the (ip, g) table entry, else intra_node;
//   spanning nodes: inter_node.bandwidth / min(ip, devices_per_node) -- ip groups of one node
//   share its NICs at once -- with inter_node's latency, and inter_shared_min_op_s as the least
//   time of a collective when the group has several members on a node (ip < devices_per_node).
// g <= 1 returns intra_node (no traffic).
LinkSpec placement_link(const ClusterPreset& c, int ip, int g);

// The same rule for any rank list (a grid line, or a composite group such as the x-y plane under
// a non-default tp_order): one node -> the table entry for (ranks[1] - ranks[0], g), else
// intra_node; spanning nodes -> inter_node / (ranks of a node / members of the group on it),
// which equals min(ip, devices_per_node) for an evenly strided group; inter_shared_min_op_s when a
// node holds several members of the group.
LinkSpec group_link(const ClusterPreset& c, const std::vector<int>& ranks, int world);

}  // namespace dhelix
