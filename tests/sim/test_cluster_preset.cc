// Cluster presets and placement. Oracles: the ring formulas of axonn.md §4.1 (CostModel's
// collective_time) and the double binary tree's closed form (CostModel.h), the Perlmutter bandwidth table of axonn.md §4.3 (read from the committed
// preset), and the loader's error contract (file, field, hint).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "base/Error.h"
#include "sim/ClusterPreset.h"

namespace dhelix {
namespace {

std::string preset_path(const std::string& name) {
  return std::string(DHELIX_SOURCE_DIR) + "/configs/clusters/" + name + ".toml";
}

TEST(ClusterPreset, RingCollectiveAlone) {
  // 4 ranks, 1 MiB, 1 GB/s, 10 us per step: all-reduce 2 x (3/4 x B/bw + 3 x 10 us).
  const LinkSpec l{1e9, 10e-6};
  const double B = 1 << 20;
  EXPECT_DOUBLE_EQ(CostModel::collective_time(CollOp::kAllReduce, B, 4, l), 2 * (0.75 * B / 1e9 + 3 * 10e-6));
  EXPECT_DOUBLE_EQ(CostModel::collective_time(CollOp::kAllGather, B, 4, l), 0.75 * B / 1e9 + 3 * 10e-6);
  EXPECT_DOUBLE_EQ(CostModel::collective_time(CollOp::kReduceScatter, B, 1, l), 0.0);
}

TEST(ClusterPreset, CollectiveTakesAtLeastTheLinksFloor) {
  // min_op_s bounds each collective from below; a transfer longer than it is unchanged.
  const LinkSpec l{1e9, 0, 4e-3};
  EXPECT_DOUBLE_EQ(CostModel::collective_time(CollOp::kAllGather, 1024, 4, l), 4e-3);
  EXPECT_DOUBLE_EQ(CostModel::collective_time(CollOp::kAllReduce, 1e8, 4, l), 2 * 0.75 * 1e8 / 1e9);
  EXPECT_DOUBLE_EQ(CostModel::collective_time(CollOp::kSendRecv, 1024, 2, l), 1024 / 1e9);  // no ring
}

// Trees (LinkSpec::tree_allreduce): an all-reduce takes the less of the ring and the double binary
// tree, t_tree = 2 B/bw + 2 ceil(log2 n) L (CostModel.h); other collectives stay rings.
TEST(ClusterPreset, AllReduceTakesTheFasterOfRingAndTree) {
  const LinkSpec l{1e9, 10e-6, 0, true};
  // 1024 ranks, 64 KiB: ring 2 (1023/1024 B/bw + 1023 L) = 20.6 ms, tree 2 B/bw + 20 L = 0.33 ms.
  const double small = 64 * 1024;
  EXPECT_DOUBLE_EQ(CostModel::collective_time(CollOp::kAllReduce, small, 1024, l), 2 * small / 1e9 + 2 * 10 * 10e-6);
  // 4 ranks, 1 GB: ring 1.5 s + 60 us, tree 2 s + 40 us: the ring.
  const double big = 1e9;
  EXPECT_DOUBLE_EQ(CostModel::collective_time(CollOp::kAllReduce, big, 4, l), 2 * (0.75 * big / 1e9 + 3 * 10e-6));
  // The crossover at n = 4: ring 1.5 B/bw + 6 L, tree 2 B/bw + 4 L -- equal at B = 4 L bw = 40 KB.
  EXPECT_DOUBLE_EQ(CostModel::collective_time(CollOp::kAllReduce, 30e3, 4, l), 2 * 30e3 / 1e9 + 4 * 10e-6);
  EXPECT_DOUBLE_EQ(CostModel::collective_time(CollOp::kAllReduce, 50e3, 4, l), 2 * (0.75 * 50e3 / 1e9 + 3 * 10e-6));
  // 5 ranks: ceil(log2 5) = 3 steps each way.
  EXPECT_DOUBLE_EQ(CostModel::collective_time(CollOp::kAllReduce, 1e3, 5, l), 2 * 1e3 / 1e9 + 6 * 10e-6);
  // All-gather stays a ring even where a tree would be cheaper.
  EXPECT_DOUBLE_EQ(CostModel::collective_time(CollOp::kAllGather, small, 1024, l), 1023.0 / 1024 * small / 1e9 + 1023 * 10e-6);
  // Presets: the GPU clusters run NCCL (trees), this machine's emulated cluster Gloo (rings);
  // every link a preset hands out carries its setting.
  for (const char* gpu : {"a40-pcie", "h100-8gpu", "perlmutter-a100"}) {
    const ClusterPreset c = load_cluster(preset_path(gpu));
    EXPECT_TRUE(group_link(c, {0, 1}, 64).tree_allreduce) << gpu;
    EXPECT_TRUE(group_link(c, {0, 8, 16, 24}, 64).tree_allreduce) << gpu;
    EXPECT_TRUE(placement_link(c, 1, 64).tree_allreduce) << gpu;
    EXPECT_TRUE(placement_link(c, 1, 2).tree_allreduce) << gpu;
  }
  const ClusterPreset cpu = load_cluster(preset_path("cpu-emulated"));
  EXPECT_FALSE(group_link(cpu, {0, 1, 2, 3}, 4).tree_allreduce);
  EXPECT_FALSE(placement_link(cpu, 1, 4).tree_allreduce);
}

TEST(ClusterPreset, SharedFloorOnlyForGroupsWithSeveralMembersOnANode) {
  // cpu-emulated: 2 ranks per node. {0,1}: inside node 0; {0,2}: one member on each node; {0..3}:
  // both nodes, two members on each -- only that one gets node.inter_shared_min_op_s.
  const ClusterPreset c = load_cluster(preset_path("cpu-emulated"));
  ASSERT_GT(c.inter_shared_min_op_s, 0);
  EXPECT_EQ(group_link(c, {0, 1}, 4).min_op_s, 0);
  EXPECT_EQ(group_link(c, {0, 2}, 4).min_op_s, 0);
  EXPECT_EQ(group_link(c, {0, 1, 2, 3}, 4).min_op_s, c.inter_shared_min_op_s);
  EXPECT_EQ(placement_link(c, 2, 2).min_op_s, 0);
  EXPECT_EQ(placement_link(c, 1, 4).min_op_s, c.inter_shared_min_op_s);
}

TEST(ClusterPreset, PerlmutterPlacementMatchesAxonnTable) {
  const ClusterPreset c = load_cluster(preset_path("perlmutter-a100"));
  EXPECT_EQ(c.devices_per_node, 4);
  // axonn.md §4.3, Perlmutter row (GB/s): ip=1: g=2 76, g=4 225, g>=8 80; ip=2: g=2 76, g>=4 40;
  // ip=4: 20; ip>=8: 20.
  struct Case {
    int ip, g;
    double gbps;
  };
  for (const Case& k : {Case{1, 2, 76}, Case{1, 4, 225}, Case{1, 8, 80}, Case{1, 1024, 80}, Case{2, 2, 76},
                        Case{2, 4, 40}, Case{2, 64, 40}, Case{4, 2, 20}, Case{4, 256, 20}, Case{8, 2, 20},
                        Case{64, 16, 20}})
    EXPECT_DOUBLE_EQ(placement_link(c, k.ip, k.g).bandwidth, k.gbps * 1e9) << "ip=" << k.ip << " g=" << k.g;
}

TEST(ClusterPreset, GroupLinkEqualsStridedRule) {
  const ClusterPreset c = load_cluster(preset_path("perlmutter-a100"));
  const int world = 64;
  for (int ip : {1, 2, 4, 8, 16})
    for (int g : {2, 4}) {
      if (ip * g > world) continue;
      std::vector<int> ranks;
      for (int i = 0; i < g; ++i) ranks.push_back(i * ip);
      EXPECT_DOUBLE_EQ(group_link(c, ranks, world).bandwidth, placement_link(c, ip, g).bandwidth)
          << "ip=" << ip << " g=" << g;
    }
}

TEST(ClusterPreset, CommittedPresetsLoadByName) {
  const std::string dir = std::string(DHELIX_SOURCE_DIR) + "/configs/clusters";  // sim.clusters_dir
  for (const char* n : {"cpu-emulated", "perlmutter-a100", "h100-8gpu"}) {
    const ClusterPreset c = load_cluster(n, dir);
    EXPECT_EQ(c.name, n);
    EXPECT_GT(c.gemm_rate(Precision::kFp32), 0);
  }
  EXPECT_GT(load_cluster("h100-8gpu", dir).gemm_rate(Precision::kBf16),
            load_cluster("h100-8gpu", dir).gemm_rate(Precision::kFp32));
  // The CPU preset offers no bf16 rate: a ConfigError naming the preset.
  try {
    (void)load_cluster("cpu-emulated", dir).gemm_rate(Precision::kBf16);
    FAIL() << "bf16 on cpu-emulated accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("cpu-emulated"), std::string::npos) << e.what();
  }
  try {
    (void)load_cluster("nosuch", dir);
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("perlmutter-a100"), std::string::npos) << e.what();  // lists names
  }
}

// Every committed preset parses, and every number in it says where it comes from: each line that
// sets a value carries a trailing comment (a datasheet, a measurement here, a paper, or "assumed"
// with its reasoning), so no figure is unexplained (oracle: the presets' own text).
TEST(ClusterPreset, EveryPresetParsesAndEveryFigureCitesItsSource) {
  const std::filesystem::path dir = std::filesystem::path(DHELIX_SOURCE_DIR) / "configs" / "clusters";
  int presets = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    if (entry.path().extension() != ".toml") continue;
    ++presets;
    const std::string name = entry.path().stem().string();
    const ClusterPreset c = load_cluster(name, dir.string());
    EXPECT_EQ(c.name, name);
    EXPECT_GT(c.memory_bytes, 0) << name;
    EXPECT_GT(c.gemm_rate(c.native_precision()), 0) << name;
    std::ifstream in(entry.path());
    std::string line;
    int n = 0;
    while (std::getline(in, line)) {
      ++n;
      const size_t eq = line.find('=');
      const size_t hash = line.find('#');
      if (eq == std::string::npos || (hash != std::string::npos && hash < eq)) continue;  // no value, or a comment
      const std::string key = line.substr(0, line.find_first_of(" =")), value = line.substr(eq + 1);
      if (key == "name" || value.find_first_of("0123456789") == std::string::npos) continue;  // not a figure
      if (value.find('{') != std::string::npos && value.find('#') == std::string::npos) {
        ADD_FAILURE() << name << ".toml:" << n << ": table row without its source: " << line;
        continue;
      }
      EXPECT_NE(hash, std::string::npos) << name << ".toml:" << n << ": a figure without its source: " << line;
    }
  }
  EXPECT_GE(presets, 6) << "cpu-emulated, perlmutter-a100, h100-8gpu, a40-pcie, a100-80gb-8gpu, a800-8gpu";
  // The A800 is the A100 with NVLink capped at 400 GB/s (two thirds of the A100's 600 GB/s).
  const ClusterPreset a100 = load_cluster("a100-80gb-8gpu", dir.string()), a800 = load_cluster("a800-8gpu", dir.string());
  EXPECT_EQ(a100.peak_flops(Precision::kBf16), a800.peak_flops(Precision::kBf16));
  EXPECT_NEAR(a800.intra_node.bandwidth / a100.intra_node.bandwidth, 2.0 / 3.0, 1e-12);
}

std::string error_of(const std::string& text) {
  try {
    (void)parse_cluster(text, "bad.toml");
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

TEST(ClusterPreset, BadFilesNameFileFieldAndHint) {
  const std::string good =
      "[device]\nmemory_bytes = 1e9\nmem_bw = 1e9\npeak_flops_fp32 = 1e9\ngemm_efficiency = 0.5\n"
      "[node]\ndevices = 2\nintra_bw = 1e9\nintra_latency = 1e-6\ninter_bw = 1e8\ninter_latency = 1e-5\n";
  EXPECT_EQ(error_of(good), "");
  std::string e = error_of("[device]\nmem_bw = 1e9\n");
  EXPECT_NE(e.find("bad.toml"), std::string::npos) << e;
  EXPECT_NE(e.find("device.memory_bytes"), std::string::npos) << e;
  EXPECT_NE(e.find("hint"), std::string::npos) << e;
  std::string bad = good;
  bad.replace(bad.find("mem_bw = 1e9"), 12, "mem_bw = \"fast\"");
  e = error_of(bad);
  EXPECT_NE(e.find("device.mem_bw"), std::string::npos) << e;
  EXPECT_NE(e.find("\"fast\""), std::string::npos) << e;
  e = error_of(good + "inter_bww = 3\n");
  EXPECT_NE(e.find("unknown field node.inter_bww"), std::string::npos) << e;
  e = error_of(good + "intra_table = [{ip = 2, g = 2, bw = 1e9}]\n");
  EXPECT_NE(e.find("node.intra_table[0]"), std::string::npos) << e;  // 4 ranks > 2 per node
  e = error_of("[device\n");
  EXPECT_NE(e.find("not valid TOML"), std::string::npos) << e;
  const std::string dev_end = "gemm_efficiency = 0.5\n";
  std::string tiled = good;
  tiled.insert(tiled.find(dev_end) + dev_end.size(), "gemm_units = 4\n");  // without gemm_tile
  e = error_of(tiled);
  EXPECT_NE(e.find("device.gemm_units"), std::string::npos) << e;
  EXPECT_NE(e.find("gemm_tile"), std::string::npos) << e;
  tiled.insert(tiled.find("gemm_units"), "gemm_tile = [0, 128]\n");
  e = error_of(tiled);
  EXPECT_NE(e.find("device.gemm_tile must be two positive integers"), std::string::npos) << e;
  // Attention's efficiencies: in (0, 1], the backward's only beside the forward's.
  std::string attn = good;
  attn.insert(attn.find(dev_end) + dev_end.size(), "attention_efficiency = 1.5\n");
  e = error_of(attn);
  EXPECT_NE(e.find("device.attention_efficiency=1.5"), std::string::npos) << e;
  attn = good;
  attn.insert(attn.find(dev_end) + dev_end.size(), "attention_bwd_efficiency = 0.1\n");
  e = error_of(attn);
  EXPECT_NE(e.find("the backward's only with the forward's"), std::string::npos) << e;
  // The co-execution interference factors: 1 when absent, read when given, in [1, 100].
  const ClusterPreset plain = parse_cluster(good, "good.toml");
  EXPECT_EQ(plain.compute_slowdown, 1.0);
  EXPECT_EQ(plain.comm_slowdown, 1.0);
  std::string slow = good;
  slow.insert(slow.find(dev_end) + dev_end.size(), "compute_slowdown = 1.4\ncomm_slowdown = 1.1\n");
  const ClusterPreset measured = parse_cluster(slow, "slow.toml");
  EXPECT_EQ(measured.compute_slowdown, 1.4);
  EXPECT_EQ(measured.comm_slowdown, 1.1);
  slow = good;
  slow.insert(slow.find(dev_end) + dev_end.size(), "compute_slowdown = 0.5\n");
  e = error_of(slow);
  EXPECT_NE(e.find("device.compute_slowdown=0.5 must be in [1, 100]"), std::string::npos) << e;
  EXPECT_NE(e.find("hint"), std::string::npos) << e;
}

// Attention's rates from the preset: peak x each efficiency; the backward's defaults to the
// forward's; none without them (the GEMM rate prices attention). Oracle: by hand, peak 1e12.
TEST(ClusterPreset, AttentionRatesArePeakTimesTheirEfficiencies) {
  ClusterPreset c;
  c.peak_flops_fp32 = 1e12;
  EXPECT_EQ(c.attention_rates(Precision::kFp32).fwd, 0.0);
  c.attention_efficiency = 0.2;
  EXPECT_DOUBLE_EQ(c.attention_rates(Precision::kFp32).fwd, 2e11);
  EXPECT_DOUBLE_EQ(c.attention_rates(Precision::kFp32).bwd, 2e11);
  c.attention_bwd_efficiency = 0.1;
  EXPECT_DOUBLE_EQ(c.attention_rates(Precision::kFp32).bwd, 1e11);
}

// The size-dependent GEMM efficiency (GemmTiling). Oracle: tile and wave quantization worked by
// hand for an A100 (108 SMs, 256 x 128 tiles, from the committed preset): one full wave of whole
// tiles runs at 1; one row past a tile doubles the tiles (two waves, each tile half used); one
// tile past a wave leaves 107 of the second wave's 108 SMs idle; a grouped launch of g GEMMs
// fills waves together.
TEST(ClusterPreset, GemmTileAndWaveQuantization) {
  const ClusterPreset c = load_cluster(preset_path("perlmutter-a100"));
  const GemmTiling& t = c.gemm_tiling;
  ASSERT_EQ(t.units, 108);
  ASSERT_EQ(t.tile_m, 256);
  ASSERT_EQ(t.tile_n, 128);
  EXPECT_DOUBLE_EQ(t.efficiency(256, 128 * 108), 1.0);
  EXPECT_DOUBLE_EQ(t.efficiency(2560, 128 * 108), 1.0);                      // 10 whole waves
  EXPECT_DOUBLE_EQ(t.efficiency(257, 128 * 108), 257.0 / 512.0);             // 216 tiles, 2 waves
  EXPECT_DOUBLE_EQ(t.efficiency(256, 128 * 109), 109.0 / 216.0);             // 109 tiles in 2 waves
  EXPECT_DOUBLE_EQ(t.efficiency(256, 128, 54), 54.0 / 108.0);                // 54 one-tile GEMMs together
  EXPECT_DOUBLE_EQ(t.efficiency(128, 64), 128.0 * 64 / (256.0 * 128) / 108);  // one quarter tile, one SM
  EXPECT_DOUBLE_EQ(GemmTiling{}.efficiency(7, 9), 1.0);                       // absent: no quantization
  EXPECT_EQ(load_cluster(preset_path("cpu-emulated")).gemm_tiling.units, 0);
}

}  // namespace
}  // namespace dhelix
