// The epilogue-fusion rewrite (sharding/Epilogues.h) against the programs it rewrites. Oracles:
//  - which pairs fuse, by the rule: GPT-2's GELU and its derivative wherever the MLP runs on one
//    rank's columns (every 1D layout), a residual add wherever no collective sits between the row
//    linear and the add (tp = 1; cp rings attention, not the projection), nothing on the 3D grid
//    (its GEMMs are linear3d ops) or in SwiGLU; recompute copies fuse like the forward they copy;
//  - what each fused op is: the pair's outer buffers and parameters, the GEMM's place, name and
//    attributes (its GEMM extents, so the simulator prices it as that GEMM), the GEMM's FLOPs;
//  - what the forward keeps for the backward (saved_for_backward) is unchanged: no intermediate a
//    fused op drops was ever kept;
//  - hand-made programs where fusing would change what an op reads stay as they are.
// (The dataflow and lifetime walks over fused programs are in test_unit_desc.cc; the numerical
// equality of fused and unfused steps in tests/model/test_epilogue_fusion.cc.)
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "sharding/Epilogues.h"
#include "sharding/ModelPrograms.h"

namespace dhelix {
namespace {

ModelConfig model(ModelFamily f) {
  ModelConfig m = model_preset(f == ModelFamily::kMoE ? "moe-demo" : "demo");
  m.family = f;
  if (f == ModelFamily::kGPT) m.n_kv_heads = m.n_heads;
  return m;
}

LayoutConfig layout(int tp, int cp, int gx = 1, int gy = 1, int gz = 1) {
  LayoutConfig l;
  l.tp = tp;
  l.cp = cp;
  l.sequence_parallel = tp > 1;
  l.tp_x = gx, l.tp_y = gy, l.tp_z = gz;
  return l;
}

int count_code(const LayerProgram& p, const std::string& code) {
  int n = 0;
  for (const auto* ops : {&p.fwd, &p.bwd})
    for (const Op& op : *ops) n += op.code == code ? 1 : 0;
  return n;
}

const Op& find_code(const std::vector<Op>& ops, const std::string& code, const std::string& name) {
  for (const Op& op : ops)
    if (op.code == code && op.name == name) return op;
  ADD_FAILURE() << "no " << code << " op named " << name;
  static const Op none;
  return none;
}

const Op& find_name(const std::vector<Op>& ops, const std::string& name) {
  for (const Op& op : ops)
    if (op.name == name) return op;
  ADD_FAILURE() << "no op named " << name;
  static const Op none;
  return none;
}

struct Want {
  const char* name;
  ModelFamily family;
  LayoutConfig lay;
  Recompute rc;
  int gelu, dgelu, residual;  // in the block program
};

TEST(EpilogueFusion, FusesExactlyThePairsTheRuleAllows) {
  const std::vector<Want> cases = {
      {"gpt single", ModelFamily::kGPT, layout(1, 1), Recompute::kNone, 1, 1, 2},
      {"gpt tp2 (reduce-scatters before the residuals)", ModelFamily::kGPT, layout(2, 1), Recompute::kNone, 1, 1, 0},
      {"gpt cp2", ModelFamily::kGPT, layout(1, 2), Recompute::kNone, 1, 1, 2},
      {"gpt single, selective recompute", ModelFamily::kGPT, layout(1, 1), Recompute::kSelective, 1, 1, 2},
      // Full recompute copies ln1 .. mlp.act to the backward's front: fc + gelu fuse there too (the
      // projection and the second residual are not copied: nothing in the backward reads them).
      {"gpt single, full recompute", ModelFamily::kGPT, layout(1, 1), Recompute::kFull, 2, 1, 3},
      {"gpt 3D grid", ModelFamily::kGPT, layout(1, 1, 2, 2, 1), Recompute::kNone, 0, 0, 0},
      {"llama single (SwiGLU)", ModelFamily::kLlama, layout(1, 1), Recompute::kNone, 0, 0, 2},
      {"llama tp2", ModelFamily::kLlama, layout(2, 1), Recompute::kNone, 0, 0, 0},
      {"moe single (the MLP is the MoE block)", ModelFamily::kMoE, layout(1, 1), Recompute::kNone, 0, 0, 1},
  };
  for (const Want& w : cases) {
    LayoutConfig lay = w.lay;
    lay.recompute = w.rc;
    const ModelConfig m = model(w.family);
    const ModelPrograms plain = build_programs(m, lay, MicroBatchShape{2, 16});
    lay.fuse_epilogues = true;  // build_programs fuses (what the trainer, profile, plan and simulate get)
    const ModelPrograms fused = build_programs(m, lay, MicroBatchShape{2, 16});
    const EpilogueFusions n = fused.fusions;
    const LayerProgram& b = fused.block;
    // Only the block has such pairs (the embedding and the head have no GELU and no residual).
    EXPECT_EQ(count_code(b, "linear_gelu"), w.gelu) << w.name;
    EXPECT_EQ(count_code(b, "linear_dgrad_gelu"), w.dgelu) << w.name;
    EXPECT_EQ(count_code(b, "linear_residual"), w.residual) << w.name;
    EXPECT_EQ(n.gelu, w.gelu) << w.name;
    EXPECT_EQ(n.dgelu, w.dgelu) << w.name;
    EXPECT_EQ(n.residual, w.residual) << w.name;
    // Each fusion removes one op, and what is left of the pairs is what did not fuse.
    EXPECT_EQ(b.fwd.size() + b.bwd.size() + size_t(n.total()), plain.block.fwd.size() + plain.block.bwd.size()) << w.name;
    EXPECT_EQ(count_code(b, "gelu"), count_code(plain.block, "gelu") - w.gelu) << w.name;
    EXPECT_EQ(count_code(b, "gelu_bwd"), count_code(plain.block, "gelu_bwd") - w.dgelu) << w.name;
    EXPECT_EQ(count_code(b, "residual_add"), count_code(plain.block, "residual_add") - w.residual) << w.name;
    EXPECT_EQ(saved_for_backward(b), saved_for_backward(plain.block)) << w.name;
    for (const LayerProgram* u : {&fused.embed, &fused.head}) {
      const LayerProgram& before = u == &fused.embed ? plain.embed : plain.head;
      EXPECT_EQ(u->fwd.size(), before.fwd.size()) << w.name << " " << u->name;
      EXPECT_EQ(u->bwd.size(), before.bwd.size()) << w.name << " " << u->name;
    }
  }
}

// GPT-2's block at tp = 1, op by op: each fused op is its pair's outer buffers, the GEMM's name,
// place, attributes, parameters (then the residual's bias) and FLOPs.
TEST(EpilogueFusion, EachFusedOpIsItsPairWithTheGemmsPlaceAndAttributes) {
  const ModelConfig m = model(ModelFamily::kGPT);
  LayoutConfig lay = layout(1, 1);
  const ModelPrograms plain = build_programs(m, lay, MicroBatchShape{2, 16});
  lay.fuse_epilogues = true;
  const ModelPrograms fused = build_programs(m, lay, MicroBatchShape{2, 16});
  const LayerProgram &p = plain.block, &f = fused.block;

  const Op& fc = find_name(p.fwd, "mlp.fc");
  const Op& act = find_name(p.fwd, "mlp.act");
  const Op& lg = find_code(f.fwd, "linear_gelu", "mlp.fc");
  EXPECT_EQ(lg.inputs, fc.inputs);
  EXPECT_EQ(lg.outputs, (std::vector<std::string>{act.outputs[0], fc.outputs[0]}));  // act, then pre
  EXPECT_EQ(lg.params, fc.params);
  EXPECT_EQ(lg.attrs, fc.attrs);
  // Priced as the GEMM (its FLOPs: the epilogue's run inside it), with the pair's bytes less pre's read.
  EXPECT_DOUBLE_EQ(lg.cost.flops, fc.cost.flops);
  EXPECT_LT(lg.cost.bytes, fc.cost.bytes + act.cost.bytes);

  const Op& dg = find_name(p.bwd, "mlp.proj.dgrad");
  const Op& gb = find_name(p.bwd, "mlp.act.bwd");
  const Op& ldg = find_code(f.bwd, "linear_dgrad_gelu", "mlp.proj.dgrad");
  EXPECT_EQ(ldg.inputs, (std::vector<std::string>{dg.inputs[0], gb.inputs[1]}));  // dy, pre
  EXPECT_EQ(ldg.outputs, gb.outputs);
  EXPECT_EQ(ldg.params, dg.params);
  EXPECT_EQ(ldg.attrs, dg.attrs);

  for (const auto& [gemm, residual] : {std::pair<std::string, std::string>{"attn.out", "attn.residual"},
                                       {"mlp.proj", "mlp.residual"}}) {
    const Op& l = find_name(p.fwd, gemm);
    const Op& r = find_name(p.fwd, residual);
    const Op& lr = find_code(f.fwd, "linear_residual", gemm);
    EXPECT_EQ(lr.inputs, (std::vector<std::string>{l.inputs[0], r.inputs[0]})) << gemm;  // x, skip
    EXPECT_EQ(lr.outputs, r.outputs) << gemm;
    std::vector<std::string> params = l.params;
    params.insert(params.end(), r.params.begin(), r.params.end());
    EXPECT_EQ(lr.params, params) << gemm;
    EXPECT_EQ(lr.attrs, l.attrs) << gemm;
  }
  // Every fused op sits where its GEMM sat: the forward's op names in order are the plain ones less
  // the second op of each pair.
  std::vector<std::string> want, got;
  for (const Op& op : p.fwd)
    if (op.name != "mlp.act" && op.name != "attn.residual" && op.name != "mlp.residual") want.push_back(op.name);
  for (const Op& op : f.fwd) got.push_back(op.name);
  EXPECT_EQ(got, want);
}

// ("probe": an op code no fusion pattern names, standing for any other op.)
Op op(const std::string& name, const std::string& code, std::vector<std::string> in, std::vector<std::string> out,
      std::vector<std::string> params = {}) {
  Op o;
  o.name = name;
  o.code = code;
  o.inputs = std::move(in);
  o.outputs = std::move(out);
  o.params = std::move(params);
  return o;
}

// Pairs whose fusion would change what some op reads are left alone; the same pairs without the
// interfering op fuse (so the rule, not the pattern match, is what refused).
TEST(EpilogueFusion, LeavesPairsWhoseFusionWouldChangeWhatAnOpReads) {
  struct Case {
    const char* why;
    std::vector<Op> fwd, bwd;
    size_t interferer;  // index in fwd (or bwd when fwd has no such op) of the op to drop for the control
    bool in_bwd;
  };
  const std::vector<Case> cases = {
      {"the residual's branch is read by another op too",
       {op("l", "linear", {"x"}, {"b"}, {"w"}), op("peek", "probe", {"b"}, {"z"}),
        op("r", "residual_add", {"x", "b"}, {"y"})},
       {},
       1,
       false},
      {"an op between the pair writes the residual's skip",
       {op("l", "linear", {"h"}, {"b"}, {"w"}), op("s", "probe", {"h"}, {"skip"}),
        op("r", "residual_add", {"skip", "b"}, {"y"})},
       {},
       1,
       false},
      {"an op between the GEMM and GELU reads the GELU's output (an earlier value of it)",
       {op("a0", "probe", {"x"}, {"act"}), op("l", "linear", {"x"}, {"pre"}, {"w"}), op("use", "probe", {"act"}, {"u"}),
        op("g", "gelu", {"pre"}, {"act"})},
       {},
       2,
       false},
      {"the input gradient's intermediate is read by another backward op",
       {op("g", "gelu", {"x"}, {"pre"})},
       {op("d", "linear_dgrad", {"dy"}, {"da"}, {"w"}), op("peek", "probe", {"da"}, {"z"}),
        op("gb", "gelu_bwd", {"da", "pre"}, {"dpre"})},
       1,
       true},
  };
  for (const Case& c : cases) {
    LayerProgram p;
    p.name = "block";
    p.fwd = c.fwd;
    p.bwd = c.bwd;
    LayerProgram kept = p;
    EXPECT_EQ(fuse_epilogues(kept).total(), 0) << c.why;
    EXPECT_EQ(kept.fwd.size(), p.fwd.size()) << c.why;
    EXPECT_EQ(kept.bwd.size(), p.bwd.size()) << c.why;
    // The control: without the interfering op the pair fuses.
    LayerProgram control = p;
    std::vector<Op>& list = c.in_bwd ? control.bwd : control.fwd;
    list.erase(list.begin() + static_cast<std::ptrdiff_t>(c.interferer));
    EXPECT_EQ(fuse_epilogues(control).total(), 1) << c.why << " (control)";
  }
}

}  // namespace
}  // namespace dhelix
