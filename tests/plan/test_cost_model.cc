// Analytical cost model. Oracles: the closed forms in sim/CostModel.h worked by hand for
// small numbers (exact in binary floating point where written with ==).
#include <gtest/gtest.h>

#include "ClusterTestUtil.h"
#include "PlanTestUtil.h"
#include "base/Error.h"
#include "sim/CostModel.h"

namespace dhelix {
namespace {

CostModelConfig unit_config() {
  CostModelConfig c;
  c.name = "unit";
  c.flop_rate = 1e9;  // 1e9 flops -> 1 s
  c.mem_bw = 1e9;
  c.overlap_slowdown = 1.25;
  c.links = {{"tp", {1e6, 0.5}}, {"cp", {2e6, 0}}};
  c.group_sizes = {{"tp", 4}, {"cp", 2}};
  return c;
}

TEST(CostModel, RingFormulas) {
  LinkSpec l{1e6, 0.5};
  // all-gather of 4e6 bytes on 4 ranks: 3/4 * 4 s + 3 * 0.5 s = 4.5 s
  EXPECT_DOUBLE_EQ(CostModel::collective_time(CollOp::kAllGather, 4e6, 4, l), 4.5);
  EXPECT_DOUBLE_EQ(CostModel::collective_time(CollOp::kReduceScatter, 4e6, 4, l), 4.5);
  EXPECT_DOUBLE_EQ(CostModel::collective_time(CollOp::kAllReduce, 4e6, 4, l), 9.0);
  EXPECT_DOUBLE_EQ(CostModel::collective_time(CollOp::kSendRecv, 4e6, 2, l), 4.5);
  EXPECT_DOUBLE_EQ(CostModel::collective_time(CollOp::kAllGather, 4e6, 1, l), 0.0);
}

TEST(CostModel, BlockRules) {
  // fwd: f0 (1 s compute) f1.tp (AG of 1e6 B on 4 ranks: 0.75 + 1.5 = 2.25 s)
  // bwd: b0 (1 s) b1.cp (AG of 1e6 B on 2 ranks at 2e6 B/s: 0.25 s) b2 (1 s)
  LayerProgram prog = test::program_from("c tp", "c cp c");
  CostModel m(prog, unit_config());
  EXPECT_DOUBLE_EQ(m.op_time(StrandKind::kForward, 1), 2.25);
  EXPECT_DOUBLE_EQ(m.solo_fwd(0, 2), 3.25);                 // chain
  EXPECT_DOUBLE_EQ(m.pair(0, 1, 0, 1), 2.0);                // compute + compute, one engine
  EXPECT_DOUBLE_EQ(m.pair(1, 2, 0, 1), 2.25 * 1.25);        // max(C, M) * slowdown
  EXPECT_DOUBLE_EQ(m.pair(1, 2, 1, 2), 2.25);               // tp || cp: separate channels
  // Dependent strand: bwd [b1.cp, b2] beside fwd f0: f0 runs first (0..1), cp AG 0..0.25,
  // b2 waits for the engine: 1..2. Makespan 2, times the overlap slowdown.
  EXPECT_DOUBLE_EQ(m.pair(0, 1, 1, 3), 2.0 * 1.25);
  LayerProgram same = test::program_from("tp", "tp");
  EXPECT_EQ(CostModel(same, unit_config()).pair(0, 1, 0, 1), kNoCost);
}

// The precision's element size: the programs count fp32 bytes, a 16-bit run moves half of them.
// Oracle: BlockRules' tp all-gather worked by hand at 2-byte elements (B = 5e5: 3/4 * 0.5 s +
// 1.5 s = 1.875 s); the GPU presets are 16-bit, the CPU one fp32; the field survives JSON.
TEST(CostModel, ElementBytesScaleTheTraffic) {
  LayerProgram prog = test::program_from("c tp", "c");
  CostModelConfig half = unit_config();
  half.element_bytes = 2;
  EXPECT_DOUBLE_EQ(CostModel(prog, half).op_time(StrandKind::kForward, 1), 1.875);
  EXPECT_DOUBLE_EQ(CostModel(prog, unit_config()).op_time(StrandKind::kForward, 1), 2.25);
  for (const char* gpu : {"a40-pcie", "perlmutter-a100", "h100-8gpu"})
    EXPECT_EQ(test::cluster_cost_model(gpu, test::tp_only(2)).element_bytes, 2) << gpu;
  EXPECT_EQ(test::cluster_cost_model("cpu-emulated", test::tp_only(2)).element_bytes, 4);
  EXPECT_EQ(CostModelConfig::from_json(half.to_json()).element_bytes, 2);
  half.element_bytes = 0;
  EXPECT_THROW(half.validate(), ConfigError);
}

// The named pricers are the cluster presets' figures (one cost vocabulary): the GEMM rate, memory
// bandwidth and each group's placement link of the preset, as the step model reads them. Oracle:
// the preset's own fields, and group_links for the links. JSON files give their figures.
TEST(CostModel, ClusterPresetsAndJson) {
  for (const char* name : {"a40-pcie", "perlmutter-a100", "h100-8gpu", "cpu-emulated"}) {
    SCOPED_TRACE(name);
    const ClusterPreset cl = load_cluster(std::string(DHELIX_SOURCE_DIR) + "/configs/clusters/" + name + ".toml");
    LayoutConfig lay = test::tp_only(2);
    lay.dp = 2;
    const CostModelConfig c = cost_model_config(cl, lay, cl.native_precision());
    EXPECT_NO_THROW(c.validate());
    EXPECT_DOUBLE_EQ(c.flop_rate, cl.gemm_rate(cl.native_precision()));
    EXPECT_DOUBLE_EQ(c.mem_bw, cl.mem_bw);
    const auto groups = group_links(lay, cl);
    for (const char* g : {"tp", "dp"}) {
      EXPECT_EQ(c.group_sizes.at(g), 2);
      EXPECT_DOUBLE_EQ(c.links.at(g).bandwidth, groups.at(g).link.bandwidth);
      EXPECT_DOUBLE_EQ(c.links.at(g).latency, groups.at(g).link.latency);
    }
  }
  EXPECT_THROW(CostModelConfig::from_json(nlohmann::json::parse(R"({"preset":"cpu-1gbit"})")), ConfigError);
  CostModelConfig c = CostModelConfig::from_json(nlohmann::json::parse(
      R"({"name":"mine","flop_rate":1e12,"links":{"default":{"bandwidth":1e9}},"group_sizes":{"tp":2},"mem_bw":5e9})"));
  EXPECT_EQ(c.name, "mine");
  EXPECT_EQ(c.group_sizes.at("tp"), 2);
  EXPECT_DOUBLE_EQ(c.mem_bw, 5e9);
  CostModelConfig back = CostModelConfig::from_json(c.to_json());
  EXPECT_EQ(back.to_json(), c.to_json());
  EXPECT_THROW(CostModelConfig::from_json(nlohmann::json::parse(R"({"flop_rate":-1})")),
               ConfigError);
  // A group without a size is a configuration error that names the op.
  LayerProgram prog = test::program_from("ep", "c");
  CostModelConfig nosize = unit_config();
  nosize.links["ep"] = {1e9, 0};
  try {
    CostModel m(prog, nosize);
    FAIL() << "expected ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("size of group 'ep' unknown for fwd op 'f0.ep'"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace dhelix
