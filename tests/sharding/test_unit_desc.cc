// model/'s one description of each unit (UnitDesc.h) against its lowerings. Oracles:
//  - the description's own parameter list: under every layout, the unit's forward reads only
//    parameters the description names (the tied head: the embedding's table), and its backward
//    accumulates a gradient into every parameter the unit owns, and into nothing else;
//  - dataflow: every buffer an op reads was written before it (the forward from the unit's inputs,
//    the backward from the forward's buffers and the gradient arriving from the unit above), so the
//    walk's gradient names ("d<buffer>", passed through residuals and the positional add) connect;
//  - model_params is the concatenation of the steps' parameters, per layer;
//  - the dataflow and freed-buffer walks hold as well after the epilogue-fusion rewrite;
//  - activation recomputation (layout.recompute): the freed-buffer walk (no op reads a buffer its
//    lifetime already ended), and what the forward keeps: the layer's input alone under full
//    recompute (Megatron's full granularity), everything but the attention core's outputs under
//    selective.
#include <gtest/gtest.h>

#include <algorithm>
#include <set>
#include <string>
#include <vector>

#include "model/Params.h"
#include "model/UnitDesc.h"
#include "sharding/Epilogues.h"
#include "sharding/ModelPrograms.h"

namespace dhelix {
namespace {

struct Case {
  const char* name;
  ModelFamily family;
  LayoutConfig lay;
};

LayoutConfig layout(int tp, int cp, int ep, int gx, int gy, int gz, bool oag = true) {
  LayoutConfig l;
  l.tp = tp;
  l.cp = cp;
  l.ep = l.dp = ep;
  l.tp_x = gx;
  l.tp_y = gy;
  l.tp_z = gz;
  l.overlap3d.ag = oag;
  return l;
}

ModelConfig model(ModelFamily f, bool tied) {
  ModelConfig m = model_preset(f == ModelFamily::kMoE ? "moe-demo" : "demo");
  m.family = f;
  if (f == ModelFamily::kGPT) m.n_kv_heads = m.n_heads;
  m.tie_embeddings = tied;
  return m;
}

std::vector<Case> cases() {
  std::vector<Case> out;
  for (ModelFamily f : {ModelFamily::kGPT, ModelFamily::kLlama}) {
    out.push_back({"single", f, layout(1, 1, 1, 1, 1, 1)});
    out.push_back({"tp2", f, layout(2, 1, 1, 1, 1, 1)});
    out.push_back({"cp2", f, layout(1, 2, 1, 1, 1, 1)});
    out.push_back({"tp2_cp2", f, layout(2, 2, 1, 1, 1, 1)});
    out.push_back({"grid_222", f, layout(1, 1, 1, 2, 2, 2)});
    out.push_back({"grid_222_no_oag", f, layout(1, 1, 1, 2, 2, 2, false)});
    out.push_back({"grid_z2", f, layout(1, 1, 1, 1, 1, 2)});
  }
  out.push_back({"moe_single", ModelFamily::kMoE, layout(1, 1, 1, 1, 1, 1)});
  out.push_back({"moe_tp2_ep2", ModelFamily::kMoE, layout(2, 1, 2, 1, 1, 1)});
  out.push_back({"moe_grid_222_ep2", ModelFamily::kMoE, layout(1, 1, 2, 2, 2, 2)});
  out.push_back({"moe_grid_z2", ModelFamily::kMoE, layout(1, 1, 1, 1, 1, 2)});
  return out;
}

std::string what(const Case& c, bool tied, const std::string& unit, bool fused = false) {
  return std::string(c.name) + " " + family_name(c.family) + (tied ? " tied " : " untied ") + unit +
         (fused ? " (epilogues fused)" : "");
}

// The programs, and with `fuse` after the epilogue-fusion rewrite (sharding/Epilogues.h), which the
// dataflow and lifetime walks below check as they check what the lowerings make.
ModelPrograms programs(const ModelConfig& m, LayoutConfig lay, bool fuse) {
  lay.fuse_epilogues = fuse;
  return build_programs(m, lay, MicroBatchShape{2, 16});
}

TEST(UnitDesc, EachUnitReadsAndUpdatesExactlyTheParametersItDescribes) {
  for (const Case& c : cases())
    for (bool tied : {false, true}) {
      const ModelConfig m = model(c.family, tied);
      const ModelPrograms progs = build_programs(m, c.lay, MicroBatchShape{2, 16});
      const std::vector<std::pair<const LayerProgram*, UnitDesc>> units = {
          {&progs.embed, describe_embed(m)}, {&progs.block, describe_block(m)}, {&progs.head, describe_head(m)}};
      for (const auto& [prog, desc] : units) {
        std::set<std::string> owned, readable;
        for (const UnitStep& s : desc.steps)
          for (const ParamSpec& p : s.params) owned.insert(p.local);
        readable = owned;
        if (desc.kind == "head" && tied) readable.insert("wte");  // the LM head reads the embedding's table
        const std::set<std::string> updated_expected = readable;
        std::set<std::string> read, updated;
        for (const std::vector<Op>* ops : {&prog->fwd, &prog->bwd})
          for (const Op& op : *ops) {
            read.insert(op.params.begin(), op.params.end());
            updated.insert(op.grads.begin(), op.grads.end());
          }
        for (const std::string& p : read)
          EXPECT_TRUE(readable.count(p)) << what(c, tied, desc.kind) << ": reads '" << p << "', which it does not describe";
        EXPECT_EQ(updated, updated_expected) << what(c, tied, desc.kind);
      }
    }
}

// Each op's inputs were written earlier in the unit: forward from "x" / "tokens" / "targets", backward
// also from everything the forward wrote and from the gradient of the unit's output.
TEST(UnitDesc, EveryBufferIsWrittenBeforeItIsRead) {
  for (const Case& c : cases())
    for (bool tied : {false, true})
      for (bool fuse : {false, true}) {
      const ModelConfig m = model(c.family, tied);
      const ModelPrograms progs = programs(m, c.lay, fuse);
      for (const LayerProgram* prog : {&progs.embed, &progs.block, &progs.head}) {
        std::set<std::string> have = {"x", "tokens", "targets"};
        auto walk = [&](const std::vector<Op>& ops, const char* strand) {
          for (const Op& op : ops) {
            for (const std::string& in : op.inputs)
              EXPECT_TRUE(have.count(in)) << what(c, tied, prog->name, fuse) << ": " << strand << " op " << op.name
                                          << " reads '" << in << "' before anything writes it";
            have.insert(op.outputs.begin(), op.outputs.end());
          }
        };
        walk(prog->fwd, "forward");
        have.insert("dy");  // the gradient of the unit's output, from the unit above
        walk(prog->bwd, "backward");
        // The backward ends in the input gradient the unit below reads (the embedding has none).
        if (prog->name != "embed") {
          EXPECT_TRUE(have.count("dx")) << what(c, tied, prog->name, fuse) << " writes no dx";
        }
      }
    }
}

// Walks forward then backward with the annotated frees, under every recompute granularity: every
// buffer an op reads is live (written, and not freed since), nothing is freed that is not live, and
// the buffers left at the end are the unit's boundary buffers only (nothing leaks).
TEST(UnitDesc, LifetimesKeepEveryBufferUntilItsReadsUnderEveryRecompute) {
  for (const Case& c : cases())
    for (Recompute rc : {Recompute::kNone, Recompute::kSelective, Recompute::kFull})
      for (bool fuse : {false, true}) {
      LayoutConfig lay = c.lay;
      lay.recompute = rc;
      const ModelConfig m = model(c.family, false);
      const ModelPrograms progs = programs(m, lay, fuse);
      for (const LayerProgram* prog : {&progs.embed, &progs.block, &progs.head}) {
        const std::string ctx = what(c, false, prog->name, fuse) + " recompute=" + recompute_name(rc);
        std::set<std::string> live = {"x", "tokens", "targets", "dy"};
        for (const std::vector<Op>* ops : {&prog->fwd, &prog->bwd})
          for (const Op& op : *ops) {
            for (const std::string& in : op.inputs)
              EXPECT_TRUE(live.count(in)) << ctx << ": " << op.name << " reads '" << in << "', not live";
            live.insert(op.outputs.begin(), op.outputs.end());
            for (const std::string& f : op.frees)
              EXPECT_TRUE(live.erase(f)) << ctx << ": " << op.name << " frees '" << f << "', not live";
          }
        for (const std::string& b : live) {
          const auto& keep = boundary_buffers();
          EXPECT_TRUE(std::find(keep.begin(), keep.end(), b) != keep.end()) << ctx << ": '" << b << "' is never freed";
        }
      }
    }
}

// What the block's forward keeps for its backward (saved_for_backward): full, the layer input "x"
// only; selective, what none keeps less the attention core's outputs ("att", "att.lse"; under CP
// the ring's own partial results never were kept), and the forward keeps its ops unchanged.
TEST(UnitDesc, RecomputeKeepsTheLayerInputOrAllButTheAttentionCore) {
  for (const Case& c : cases()) {
    const ModelConfig m = model(c.family, false);
    const ModelPrograms none = build_programs(m, c.lay, MicroBatchShape{2, 16});
    const std::vector<std::string> kept = saved_for_backward(none.block);
    for (Recompute rc : {Recompute::kSelective, Recompute::kFull}) {
      LayoutConfig lay = c.lay;
      lay.recompute = rc;
      const ModelPrograms p = build_programs(m, lay, MicroBatchShape{2, 16});
      const std::string ctx = what(c, false, "block") + " recompute=" + recompute_name(rc);
      ASSERT_EQ(p.block.fwd.size(), none.block.fwd.size()) << ctx;
      std::vector<std::string> want;
      if (rc == Recompute::kFull) {
        want = {"x"};
      } else {
        for (const std::string& b : kept)
          if (b != "att" && b != "att.lse") want.push_back(b);
        EXPECT_LT(want.size(), kept.size()) << ctx << ": the attention core's outputs were not kept without recompute";
      }
      EXPECT_EQ(saved_for_backward(p.block), want) << ctx;
      for (const LayerProgram* u : {&p.embed, &p.head})
        for (const Op& op : u->bwd) EXPECT_FALSE(op.flag("recompute")) << ctx << ": " << u->name << " recomputes";
    }
  }
}

TEST(UnitDesc, ModelParamsAreTheStepsParametersLayerByLayer) {
  for (ModelFamily f : {ModelFamily::kGPT, ModelFamily::kLlama, ModelFamily::kMoE}) {
    const ModelConfig m = model(f, false);
    const std::vector<UnitSpec> units = model_params(m);
    ASSERT_EQ(units.size(), size_t(m.n_layers) + 2);
    const UnitDesc block = describe_block(m);
    for (int l = 0; l < m.n_layers; ++l) {
      const UnitSpec& u = units[size_t(l) + 1];
      size_t i = 0;
      for (const UnitStep& s : block.steps)
        for (const ParamSpec& p : s.params) {
          ASSERT_LT(i, u.params.size());
          EXPECT_EQ(u.params[i].name, "layers." + std::to_string(l) + "." + p.local);
          EXPECT_EQ(u.params[i].full, p.full) << p.local;
          EXPECT_EQ(u.params[i].role, p.role) << p.local;
          ++i;
        }
      EXPECT_EQ(i, u.params.size());
    }
  }
}

// The description carries what a layout may split: every linear's weight has the linear's role and
// shape [out_features, in_features], a column's fused parts sum to its output features, and the
// attention is marked for context parallelism's ring.
TEST(UnitDesc, LinearsCarryTheirRolesAndShapes) {
  for (ModelFamily f : {ModelFamily::kGPT, ModelFamily::kLlama, ModelFamily::kMoE}) {
    const ModelConfig m = model(f, false);
    int linears = 0, attention = 0;
    for (const UnitDesc& d : {describe_embed(m), describe_block(m), describe_head(m)})
      for (const UnitStep& s : d.steps) {
        if (s.kind == UnitStepKind::kAttention) {
          ++attention;
          EXPECT_TRUE(s.cp_ring);
        }
        if (s.kind != UnitStepKind::kLinear) continue;
        ++linears;
        ASSERT_FALSE(s.params.empty()) << s.tag;
        const ParamSpec& w = s.params.front();
        EXPECT_EQ(w.local, s.weight);
        EXPECT_EQ(w.role, s.role) << s.tag;
        EXPECT_EQ(w.full, (Shape{s.out_features, s.in_features})) << s.tag;
        if (s.role == ShardRole::kColumn) {
          int64_t sum = 0;
          for (int64_t q : s.parts) sum += q;
          EXPECT_EQ(sum, s.out_features) << s.tag;
        }
      }
    EXPECT_EQ(attention, 1);
    EXPECT_EQ(linears, f == ModelFamily::kMoE ? 3 : 5) << "qkv, out, [fc, proj,] the untied LM head";
  }
}

}  // namespace
}  // namespace dhelix
