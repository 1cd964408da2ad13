// AxoNN: "Gx = Gz = 1 is Megatron 1D TP". build_programs for the 1D layout tp = G against the 3D
// lowering with Gx = Gz = 1, Gy = G, both families: the programs agree op for op where the two
// algorithms must (every GEMM's extents and FLOPs, attention, activations, the collectives'
// bytes), and each place they differ is asserted as the difference it is, with its reason:
//   (R1) Megatron's sequence parallelism splits each all-reduce into a reduce-scatter and an
//        all-gather (Korthikanti et al.), so between regions the activations are sequence shards
//        [N/G, C]; AxoNN keeps them whole [N, C], replicated over y. So 1D's tp.rs.<tag> is 3D's
//        y.ar.<tag> (same per-rank buffer), 1D's tp.ag.<tag> has no 3D twin, and the norms and
//        residual adds run on N/G rows in 1D and on N rows in 3D (G x the elements).
//   (R2) The 3D GEMM binds linear3d* (it reads a z-gathered block, or the shard at Gz = 1) and
//        adds its bias in an op of its own after the x all-reduce (added once, not Gx times);
//        its bias gradient is an op of its own. 1D's linear takes the bias and its wgrad
//        accumulates the bias gradient.
//   (R3) 1D places weight-gradient GEMMs late (WgradPolicy: row wgrads held under the next column
//        region's reduce-scatter, attn.qkv's split in two), 3D runs each inline: the backward
//        ops agree as a set, and the split pieces sum to the whole.
//   (R4) SP's norm gradients are partial sums over the sequence shards (partial_grad); AxoNN's
//        norms see every row.
// Oracle: the two lowerings of the one model against each other and the reasons above; a new
// difference fails the test until it is added here with its reason.
#include <gtest/gtest.h>

#include <map>
#include <set>
#include <string>
#include <vector>

#include "base/Error.h"
#include "sharding/ModelPrograms.h"
#include "sharding/ParamSharding.h"
#include "sharding/ShardIndex.h"

namespace dhelix {
namespace {

constexpr int kG = 2;

ModelConfig model_of(ModelFamily f) {
  ModelConfig m;
  m.family = f;
  m.vocab_size = 500, m.seq_len = 64, m.d_model = 64, m.n_layers = 2, m.n_heads = 4;
  m.n_kv_heads = f == ModelFamily::kGPT ? 4 : 2;
  m.ffn_hidden = f == ModelFamily::kGPT ? 256 : 192;
  m.tie_embeddings = f == ModelFamily::kGPT;
  return m;
}

LayoutConfig one_d() {
  LayoutConfig l;
  l.tp = kG;
  return l;
}
LayoutConfig three_d() {
  LayoutConfig l;
  l.tp_y = kG;  // Gx = Gz = 1
  return l;
}

const Op* find(const std::vector<Op>& ops, const std::string& name) {
  for (const Op& op : ops)
    if (op.name == name) return &op;
  return nullptr;
}

bool is_gemm(const Op& op) { return op.attrs.count("gemm_rows") > 0; }
bool is_row_local(const Op& op) {  // norms and residual adds: per-row elementwise (R1)
  static const std::set<std::string> codes = {"layernorm", "rmsnorm", "layernorm_bwd", "rmsnorm_bwd", "residual_add",
                                              "bias_grad", "pos_embed", "pos_embed_bwd"};
  return codes.count(op.code) > 0;
}
std::string code_1d(const std::string& code_3d) {  // (R2)
  if (code_3d == "linear3d") return "linear";
  if (code_3d == "linear3d_dgrad") return "linear_dgrad";
  if (code_3d == "linear3d_wgrad") return "linear_wgrad";
  return code_3d;
}
// 3D ops with no 1D twin: the bias add and bias gradient of a grid linear (R2).
bool only_3d(const Op& op) {
  return op.code == "bias_add" || (op.code == "bias_grad" && op.name.ends_with(".bias.bwd"));
}

// Every 3D compute op has its 1D twin of the same name (or, for a split wgrad, its pieces), equal
// in what the two must share.
void expect_compute_agrees(const std::vector<Op>& ops1, const std::vector<Op>& ops3, const std::string& where) {
  for (const Op& o3 : ops3) {
    if (o3.is_collective() || only_3d(o3)) continue;
    SCOPED_TRACE(where + " " + o3.name);
    const Op* o1 = find(ops1, o3.name);
    if (!o1 && o3.code == "linear3d_wgrad") {  // (R3) 1D's split weight gradient: the pieces sum to it
      const Op* a = find(ops1, o3.name + ".0");
      const Op* b = find(ops1, o3.name + ".1");
      ASSERT_TRUE(a && b) << "no 1D twin";
      EXPECT_DOUBLE_EQ(a->cost.flops + b->cost.flops, o3.cost.flops);
      EXPECT_EQ(a->grads, b->grads);
      EXPECT_EQ(a->grads.front(), o3.grads.front());
      continue;
    }
    ASSERT_TRUE(o1) << "no 1D twin";
    EXPECT_EQ(o1->code, code_1d(o3.code));
    if (is_gemm(o3)) {
      for (const char* k : {"gemm_rows", "gemm_in", "gemm_out"}) EXPECT_EQ(o1->attrs.at(k), o3.attrs.at(k)) << k;
      EXPECT_DOUBLE_EQ(o1->cost.flops, o3.cost.flops);
      // The same weight read and accumulated; 1D's GEMM also reads and accumulates the bias (R2).
      if (!o3.params.empty()) {
        EXPECT_EQ(o1->params.front(), o3.params.front());
      }
      if (!o3.grads.empty()) {
        EXPECT_EQ(o1->grads.front(), o3.grads.front());
      }
    } else if (is_row_local(o3)) {
      EXPECT_DOUBLE_EQ(o3.cost.flops, kG * o1->cost.flops) << "(R1) N rows vs N/G";
    } else {
      EXPECT_DOUBLE_EQ(o1->cost.flops, o3.cost.flops);
      EXPECT_DOUBLE_EQ(o1->cost.bytes, o3.cost.bytes);
      EXPECT_EQ(o1->attrs, o3.attrs);
    }
  }
}

// And the other way: every 1D compute op has its 3D twin (a split piece its whole).
void expect_no_1d_only_compute(const std::vector<Op>& ops1, const std::vector<Op>& ops3, const std::string& where) {
  for (const Op& o1 : ops1) {
    if (o1.is_collective()) continue;
    std::string name = o1.name;
    if (o1.attrs.count("rows_lo")) name = name.substr(0, name.size() - 2);  // "<tag>.wgrad.0" (R3)
    EXPECT_TRUE(find(ops3, name)) << where << ": 1D op " << o1.name << " has no 3D twin";
  }
}

// 1D tp.rs.<x> is 3D y.ar.<x> with the same per-rank buffer; 1D tp.ag.<x> is the all-reduce's other
// half (R1); the tp all-reduces (vocab-parallel cross-entropy's statistics) are y's. Both walks
// together make the 3D collectives one-to-one with 1D's reduce-scatters and all-reduces.
void expect_collectives_agree(const std::vector<Op>& ops1, const std::vector<Op>& ops3, const std::string& where) {
  for (const Op& o3 : ops3) {
    if (!o3.is_collective()) continue;
    SCOPED_TRACE(where + " " + o3.name);
    ASSERT_EQ(o3.group, "y") << "Gx = Gz = 1 leaves only y's collectives";
    ASSERT_EQ(o3.coll, CollOp::kAllReduce);
    const std::string tail = o3.name.substr(2);  // after "y."
    const Op* rs = find(ops1, "tp.rs." + tail.substr(3));
    const Op* ar = find(ops1, "tp." + tail);
    const Op* o1 = ar ? ar : rs;
    ASSERT_TRUE(o1) << "no 1D twin (tp.ar or tp.rs)";
    EXPECT_EQ(o1->coll, ar ? CollOp::kAllReduce : CollOp::kReduceScatter);
    EXPECT_DOUBLE_EQ(o1->cost.comm_bytes, o3.cost.comm_bytes);
    EXPECT_EQ(o1->flag("activation"), o3.flag("activation"));
  }
  for (const Op& o1 : ops1) {
    if (!o1.is_collective()) continue;
    EXPECT_EQ(o1.group, "tp") << where << " " << o1.name;
    if (o1.coll == CollOp::kAllGather) {
      EXPECT_EQ(o1.name.rfind("tp.ag.", 0), 0u) << where << " " << o1.name;  // SP's other half (R1)
      continue;
    }
    const std::string tail = o1.coll == CollOp::kReduceScatter ? "ar." + o1.name.substr(6) : o1.name.substr(3);
    EXPECT_TRUE(find(ops3, "y." + tail)) << where << ": 1D " << o1.name << " has no 3D all-reduce";
  }
}

void expect_programs_agree(const LayerProgram& p1, const LayerProgram& p3) {
  expect_compute_agrees(p1.fwd, p3.fwd, p1.name + " fwd");
  expect_compute_agrees(p1.bwd, p3.bwd, p1.name + " bwd");
  expect_no_1d_only_compute(p1.fwd, p3.fwd, p1.name + " fwd");
  expect_no_1d_only_compute(p1.bwd, p3.bwd, p1.name + " bwd");
  expect_collectives_agree(p1.fwd, p3.fwd, p1.name + " fwd");
  expect_collectives_agree(p1.bwd, p3.bwd, p1.name + " bwd");
}

class OneDvsThreeD : public ::testing::TestWithParam<ModelFamily> {};

TEST_P(OneDvsThreeD, ProgramsAgreeOpForOp) {
  const ModelConfig m = model_of(GetParam());
  const MicroBatchShape mb{2, 32};
  const ModelPrograms a = build_programs(m, one_d(), mb), b = build_programs(m, three_d(), mb);
  expect_programs_agree(a.block, b.block);
  expect_programs_agree(a.head, b.head);
  expect_programs_agree(a.embed, b.embed);
}

// The forward compute ops run in the same order (R2's bias adds aside); backward order differs only
// by where the weight gradients go (R3).
TEST_P(OneDvsThreeD, ForwardOrderAgrees) {
  const ModelConfig m = model_of(GetParam());
  const MicroBatchShape mb{2, 32};
  const ModelPrograms a = build_programs(m, one_d(), mb), b = build_programs(m, three_d(), mb);
  auto names = [](const std::vector<Op>& ops, bool drop_wgrad) {
    std::vector<std::string> out;
    for (const Op& op : ops)
      if (!op.is_collective() && !only_3d(op) && !(drop_wgrad && op.grads.size() && op.outputs.empty()))
        out.push_back(op.name);
    return out;
  };
  for (auto [p1, p3] : {std::pair{&a.embed, &b.embed}, {&a.block, &b.block}, {&a.head, &b.head}}) {
    EXPECT_EQ(names(p1->fwd, false), names(p3->fwd, false)) << p1->name;
    EXPECT_EQ(names(p1->bwd, true), names(p3->bwd, true)) << p1->name << " (weight gradients aside, R3)";
  }
}

// Parameters: the same shard shapes and replicas, and the same elements of each full tensor in
// each rank's shard (tp rank r is y = r); only the role's name and SP's partial norm gradients
// differ (R4).
TEST_P(OneDvsThreeD, ParameterShardsAgreeElementForElement) {
  const ModelConfig m = model_of(GetParam());
  const std::vector<UnitSpec> u1 = model_units(m, one_d(), 0), u3 = model_units(m, three_d(), 0);
  ASSERT_EQ(u1.size(), u3.size());
  for (size_t u = 0; u < u1.size(); ++u) {
    ASSERT_EQ(u1[u].params.size(), u3[u].params.size()) << u1[u].kind;
    for (size_t i = 0; i < u1[u].params.size(); ++i) {
      const ParamSpec &s1 = u1[u].params[i], &s3 = u3[u].params[i];
      SCOPED_TRACE(s1.name);
      ASSERT_EQ(s1.name, s3.name);
      EXPECT_EQ(s1.full, s3.full);
      EXPECT_EQ(s1.shard, s3.shard);
      EXPECT_EQ(s1.replicas, s3.replicas);
      EXPECT_EQ(s1.weight_decay, s3.weight_decay);
      EXPECT_EQ(s1.init, s3.init);
      EXPECT_DOUBLE_EQ(s1.init_std, s3.init_std);
      if (s1.role == ShardRole::kReplicated) {
        EXPECT_TRUE(s1.partial_grad) << "(R4)";
      }
      EXPECT_FALSE(s3.partial_grad) << "(R4)";
      Tensor full = Tensor::empty(s1.full);
      for (int64_t k = 0; k < full.numel(); ++k) full.f32()[k] = float(k);
      for (int r = 0; r < kG; ++r) {
        ShardIndex i1 = tp_shard(r, kG), i3;
        i3.y = r, i3.gy = kG;
        Tensor a = Tensor::empty(s1.shard), b = Tensor::empty(s3.shard);
        extract_shard(s1, full, a, i1);
        extract_shard(s3, full, b, i3);
        for (int64_t k = 0; k < a.numel(); ++k) ASSERT_EQ(a.f32()[k], b.f32()[k]) << "rank " << r << " element " << k;
      }
    }
  }
}

// model/ describes the parameters once (model_params); both layouts shard that one list, so they
// agree on names, order and full shapes (the vocabulary padded for each), and each keeps the
// description's role, init and decay. Oracle: the description itself.
TEST_P(OneDvsThreeD, BothLayoutsShardTheOneDescription) {
  const ModelConfig m = model_of(GetParam());
  const std::vector<UnitSpec> d = model_params(m);
  for (const LayoutConfig& lay : {one_d(), three_d()}) {
    const std::vector<UnitSpec> u = model_units(m, lay, 0);
    ASSERT_EQ(u.size(), d.size());
    for (size_t i = 0; i < u.size(); ++i) {
      ASSERT_EQ(u[i].params.size(), d[i].params.size());
      for (size_t j = 0; j < u[i].params.size(); ++j) {
        const ParamSpec &s = u[i].params[j], &r = d[i].params[j];
        SCOPED_TRACE(r.name);
        EXPECT_EQ(s.name, r.name);
        EXPECT_EQ(s.role, lay.is_3d() ? ShardRole::kGrid : r.role);
        if (r.role == ShardRole::kVocab) {
          EXPECT_EQ(s.full[0], padded_vocab(m, vocab_shards(lay)));
        } else {
          EXPECT_EQ(s.full, r.full);
        }
        EXPECT_EQ(s.init, r.init);
        EXPECT_EQ(s.weight_decay, r.weight_decay);
      }
    }
  }
}

// The MoE family on the grid: the MoE MLP runs on a slice of the x-y plane's tokens with whole
// features, so its router and experts are not split over the grid (only the experts over ep), every
// block rank holds an identical copy once their gradients, partial over the block, are summed
// (partial_grad_block, replicas = the block); the other tensors shard as for Llama. Oracle: the
// unsharded shapes of model_params and the grid's own rule for the rest.
TEST(ParamSharding, MoeOnTheGridKeepsTheMlpWholeAndSumsItOverTheBlock) {
  ModelConfig m = model_of(ModelFamily::kMoE);
  m.n_experts = 4, m.top_k = 2;
  LayoutConfig lay;
  lay.tp_x = 2, lay.tp_y = 2, lay.tp_z = 2, lay.ep = 2, lay.dp = 2;
  const std::vector<UnitSpec> full = model_params(m), grid = model_units(m, lay, 0);
  ASSERT_EQ(full.size(), grid.size());
  int moe = 0;
  for (size_t u = 0; u < full.size(); ++u)
    for (size_t i = 0; i < full[u].params.size(); ++i) {
      const ParamSpec &f = full[u].params[i], &g = grid[u].params[i];
      EXPECT_EQ(f.moe_mlp, g.moe_mlp) << g.name;
      if (!f.moe_mlp) {
        EXPECT_FALSE(g.partial_grad_block) << g.name;
        EXPECT_EQ(g.role, ShardRole::kGrid) << g.name;
        continue;
      }
      ++moe;
      EXPECT_EQ(g.role, f.role) << g.name;
      EXPECT_TRUE(g.partial_grad_block) << g.name;
      EXPECT_FALSE(g.partial_grad) << g.name;
      EXPECT_EQ(g.replicas, 8) << g.name;
      Shape want = f.full;
      if (f.role == ShardRole::kExpert) want[0] /= 2;  // E / ep whole experts
      EXPECT_EQ(g.shard, want) << g.name;
    }
  EXPECT_EQ(moe, 3 * m.n_layers);  // router, experts.wgu, experts.wdown per layer
}

// The MoE MLP's token slice on the grid is the rank's index in its x-y plane group, which is the
// order the plane's all-gather concatenates in. Oracles, for every axis order: the rank's position
// in the member list the communicator is built from (Layout::group_ranks), and Layout::index_in.
TEST(ShardIndex, PlaneIndexIsTheXyGroupRank) {
  for (const char* order : {"xyz", "xzy", "yxz", "yzx", "zxy", "zyx"}) {
    LayoutConfig lay;
    lay.tp_x = 2, lay.tp_y = 3, lay.tp_z = 2, lay.tp_order = order;
    for (int r = 0; r < lay.world(); ++r) {
      const Layout l(lay, r);
      const int xy = ShardIndex::of(lay, l.coord()).xy;
      EXPECT_EQ(xy, l.index_in(GroupRole::kXY, l.coord())) << order << " rank " << r;
      const std::vector<int> members = l.group_ranks(GroupRole::kXY, r);
      ASSERT_LT(xy, int(members.size())) << order << " rank " << r;
      EXPECT_EQ(members[size_t(xy)], r) << order << " rank " << r;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Families, OneDvsThreeD, ::testing::Values(ModelFamily::kGPT, ModelFamily::kLlama),
                         [](const auto& info) { return std::string(family_name(info.param)); });

}  // namespace
}  // namespace dhelix
