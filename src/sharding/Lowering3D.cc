// Layer programs of AxoNN's 3D tensor parallelism (Lowering3D.h), written with the grid's regions
// (Grid3D.h); the Megatron layouts' are in Lowering1D.cc.
#include "sharding/Lowering3D.h"

#include "model/Params.h"
#include "sharding/Grid3D.h"
#include "sharding/OpFactory.h"

namespace dhelix::sharding {

namespace {

LayerProgram block_program(const Grid3D& b) {
  const ModelConfig& m = b.m;
  const bool gpt = m.family == ModelFamily::kGPT;
  const bool oag = b.lay.overlap3d.ag;
  const int64_t D = m.head_dim(), Hl = m.n_heads / b.gy, Hkvl = m.n_kv_heads / b.gy, Fl = m.ffn_hidden / b.gy;
  const int64_t Cx = b.C / b.gx;
  const std::string n1 = gpt ? "ln1" : "attn_norm", n2 = gpt ? "ln2" : "mlp_norm";
  const GridLinear qkv{"attn.qkv", "wqkv", gpt ? "bqkv" : "", GridType::kA, (Hl + 2 * Hkvl) * D, Cx};
  const GridLinear out{"attn.out", "wo", "", GridType::kB, Cx, Hl * D};
  const GridLinear fc{"mlp.fc", gpt ? "wfc" : "wgu", gpt ? "bfc" : "", GridType::kA, gpt ? Fl : 2 * Fl, Cx};
  const GridLinear proj{"mlp.proj", gpt ? "wproj" : "wdown", "", GridType::kB, Cx, Fl};
  LayerProgram p;
  p.name = "block";
  auto& f = p.fwd;
  // OAG: each block is gathered one GEMM ahead of its use, so its all-gather runs under the GEMM
  // before; the layer's first is prefetched by the layer before (prefetch_op) and adopted here
  // (gathered here only in the first layer). Without OAG: right before its GEMM, waited for there.
  std::string g_qkv = gather_block(b, f, qkv, "", oag ? CollWait::kBackground : CollWait::kBlocking), g_out, g_fc, g_proj;
  if (oag) g_out = gather_block(b, f, out, "", CollWait::kBackground);
  grid_norm_fwd(b, f, n1, "x", "h1", n1);
  grid_linear_fwd(b, f, qkv, "h1", g_qkv, "qkv");
  std::string qkv_in = "qkv";
  if (!gpt) {
    Op rope = compute_op("attn.rope", "rope", {"qkv"}, {"qkv_r"});
    elem_cost(rope, double(b.N * (Hl + Hkvl) * D), 3, 2);
    f.push_back(rope);
    qkv_in = "qkv_r";
  }
  Op attn = compute_op("attn.core", "attention", {qkv_in}, {"att", "att.lse"});
  attn.attrs = {{"heads", Hl}, {"kv_heads", Hkvl}, {"head_dim", D}};
  attn.cost.flops = 2.0 * b.B * double(b.T) * double(b.T) * double(Hl) * double(D);
  attn.cost.bytes = kF * double(b.N) * double(qkv.rows + Hl * D);
  f.push_back(attn);
  if (!oag) g_out = gather_block(b, f, out, "", CollWait::kBlocking);
  else g_fc = gather_block(b, f, fc, "", CollWait::kBackground);
  grid_linear_fwd(b, f, out, "att", g_out, "ao");
  Op res1 = compute_op("attn.residual", "residual_add", {"x", "ao"}, {"x2"},
                      gpt ? std::vector<std::string>{"bo"} : std::vector<std::string>{});
  elem_cost(res1, double(b.N * Cx), 1, 3);
  f.push_back(res1);
  grid_norm_fwd(b, f, n2, "x2", "h2", n2);
  if (!oag) g_fc = gather_block(b, f, fc, "", CollWait::kBlocking);
  else g_proj = gather_block(b, f, proj, "", CollWait::kBackground);
  grid_linear_fwd(b, f, fc, "h2", g_fc, "fc");
  Op act = gpt ? compute_op("mlp.act", "gelu", {"fc"}, {"act"}) : compute_op("mlp.act", "swiglu", {"fc"}, {"act"});
  elem_cost(act, double(b.N * Fl), gpt ? 10 : 6, gpt ? 2 : 3);
  f.push_back(act);
  if (!oag) g_proj = gather_block(b, f, proj, "", CollWait::kBlocking);
  prefetch_block(b, f, qkv, "", +1);  // the next layer's first block, under this layer's last GEMM
  grid_linear_fwd(b, f, proj, "act", g_proj, "mo");
  Op res2 = compute_op("mlp.residual", "residual_add", {"x2", "mo"}, {"y"},
                      gpt ? std::vector<std::string>{"bproj"} : std::vector<std::string>{});
  elem_cost(res2, double(b.N * Cx), 1, 3);
  f.push_back(res2);

  auto& g = p.bwd;
  std::vector<Op> accum;  // the reduce-scattered weight gradients' accumulation (ORS: at the end)
  if (gpt) {
    Op bg = compute_op("mlp.residual.bwd", "bias_grad", {"dy"}, {}, {}, {"bproj"});
    elem_cost(bg, double(b.N * Cx), 1, 1);
    g.push_back(bg);
  }
  std::string b_proj = gather_block(b, g, proj, ".bwd", oag ? CollWait::kBackground : CollWait::kBlocking), b_fc, b_out, b_qkv;
  if (oag) b_fc = gather_block(b, g, fc, ".bwd", CollWait::kBackground);
  grid_linear_bwd(b, g, proj, "act", "dy", "dact", b_proj, accum);
  Op act_b = gpt ? compute_op("mlp.act.bwd", "gelu_bwd", {"dact", "fc"}, {"dfc"})
                 : compute_op("mlp.act.bwd", "swiglu_bwd", {"dact", "fc"}, {"dfc"});
  elem_cost(act_b, double(b.N * Fl), gpt ? 20 : 10, 3);
  g.push_back(act_b);
  if (!oag) b_fc = gather_block(b, g, fc, ".bwd", CollWait::kBlocking);
  else b_out = gather_block(b, g, out, ".bwd", CollWait::kBackground);
  grid_linear_bwd(b, g, fc, "h2", "dfc", "dh2", b_fc, accum);
  grid_norm_bwd(b, g, n2, "x2", "dh2", "dy", "dx2", n2);
  if (gpt) {
    Op bg = compute_op("attn.residual.bwd", "bias_grad", {"dx2"}, {}, {}, {"bo"});
    elem_cost(bg, double(b.N * Cx), 1, 1);
    g.push_back(bg);
  }
  if (!oag) b_out = gather_block(b, g, out, ".bwd", CollWait::kBlocking);
  else b_qkv = gather_block(b, g, qkv, ".bwd", CollWait::kBackground);
  grid_linear_bwd(b, g, out, "att", "dx2", "datt", b_out, accum);
  Op attn_b = compute_op("attn.core.bwd", "attention_bwd", {qkv_in, "att", "att.lse", "datt"},
                        {gpt ? "dqkv" : "dqkv_r"});
  attn_b.attrs = attn.attrs;
  attn_b.cost.flops = 2.5 * attn.cost.flops;
  attn_b.cost.bytes = 2 * attn.cost.bytes;
  g.push_back(attn_b);
  if (!gpt) {
    Op rb = compute_op("attn.rope.bwd", "rope_bwd", {"dqkv_r"}, {"dqkv"});
    elem_cost(rb, double(b.N * (Hl + Hkvl) * D), 3, 2);
    g.push_back(rb);
  }
  if (!oag) b_qkv = gather_block(b, g, qkv, ".bwd", CollWait::kBlocking);
  prefetch_block(b, g, proj, ".bwd", -1);  // the layer below's first backward block
  grid_linear_bwd(b, g, qkv, "h1", "dqkv", "dh1", b_qkv, accum);
  grid_norm_bwd(b, g, n1, "x", "dh1", "dx2", "dx", n1);
  for (Op& a : accum) g.push_back(std::move(a));
  return p;
}

// Token embedding: the table's rows (vocabulary) over y and columns over x; a token outside this
// rank's rows gives zeros, the all-reduce over y sums the one real row in: [N, C/Gx].
LayerProgram embed_program(const Grid3D& b) {
  const bool gpt = b.m.family == ModelFamily::kGPT;
  const int64_t Cx = b.C / b.gx;
  LayerProgram p;
  p.name = "embed";
  const std::string e = gpt ? "e" : "y";
  const std::string part = b.gy > 1 ? "e_p" : e;
  Op tok = compute_op("embed.tok", "embed", {"tokens"}, {part}, {"wte"});
  elem_cost(tok, double(b.N * Cx), 0, 2);
  p.fwd.push_back(tok);
  if (b.gy > 1) p.fwd.push_back(activation(collective_op("y.ar.embed", CollOp::kAllReduce, "y", {part}, e, kF * double(b.N * Cx))));
  if (gpt) {
    Op pe = compute_op("embed.pos", "pos_embed", {"e"}, {"y"}, {"wpe"});
    elem_cost(pe, double(b.N * Cx), 1, 3);
    p.fwd.push_back(pe);
    Op pb = compute_op("embed.pos.bwd", "pos_embed_bwd", {"dy"}, {}, {}, {"wpe"});
    elem_cost(pb, double(b.N * Cx), 1, 2);
    p.bwd.push_back(pb);
  }
  Op eb = compute_op("embed.tok.bwd", "embed_bwd", {"tokens", "dy"}, {}, {}, {"wte"});
  elem_cost(eb, double(b.N * Cx), 1, 2);
  p.bwd.push_back(eb);
  return p;
}

// LM head: final norm (exact over x), logits = type-A GEMM with the vocabulary over y (all-reduced
// over x), cross-entropy vocab-parallel over y; the input gradient all-reduced over y.
LayerProgram head_program(const Grid3D& b) {
  const int64_t Vl = padded_vocab(b.m, b.gy) / b.gy, Cx = b.C / b.gx;
  const std::string w = b.m.tie_embeddings ? "wte" : "lm_head";
  LayerProgram p;
  p.name = "head";
  auto& f = p.fwd;
  grid_norm_fwd(b, f, "final_norm", "x", "hf", "final_norm");
  const std::string logits_p = b.gx > 1 ? "logits_p" : "logits";
  Op lg = compute_op("lm_head", "linear", {"hf"}, {logits_p}, {w});
  lg.attrs["vocab_rows"] = 1;
  gemm_cost(lg, double(b.N), double(Cx), double(Vl));
  f.push_back(lg);
  if (b.gx > 1)
    f.push_back(activation(collective_op("x.ar.lm_head", CollOp::kAllReduce, "x", {logits_p}, "logits", kF * double(b.N * Vl))));
  if (b.gy > 1) {
    Op mx = compute_op("xent.max", "xent_max", {"logits"}, {"xent.m"});
    elem_cost(mx, double(b.N * Vl), 1, 1);
    f.push_back(mx);
    Op ar1 = collective_op("y.ar.xent.max", CollOp::kAllReduce, "y", {"xent.m"}, "xent.m", kF * double(b.N));
    ar1.attrs["reduce_max"] = 1;
    f.push_back(ar1);
    Op st = compute_op("xent.stats", "xent_stats", {"logits", "targets", "xent.m"}, {"xent.s"});
    elem_cost(st, double(b.N * Vl), 3, 1);
    f.push_back(st);
    f.push_back(collective_op("y.ar.xent.sum", CollOp::kAllReduce, "y", {"xent.s"}, "xent.s", kF * double(2 * b.N)));
    Op fin = compute_op("xent.loss", "xent_finish", {"logits", "targets", "xent.m", "xent.s"}, {"loss", "dlogits"});
    elem_cost(fin, double(b.N * Vl), 4, 2);
    f.push_back(fin);
  } else {
    Op x = compute_op("xent", "cross_entropy", {"logits", "targets"}, {"loss", "dlogits"});
    elem_cost(x, double(b.N * Vl), 6, 3);
    f.push_back(x);
  }
  auto& g = p.bwd;
  const std::string dhf_p = b.gy > 1 ? "dhf_p" : "dhf";
  Op dg = compute_op("lm_head.dgrad", "linear_dgrad", {"dlogits"}, {dhf_p}, {w});
  dg.attrs["vocab_rows"] = 1;
  gemm_cost(dg, double(b.N), double(Vl), double(Cx));
  g.push_back(dg);
  if (b.gy > 1)
    g.push_back(activation(collective_op("y.ar.lm_head.bwd", CollOp::kAllReduce, "y", {dhf_p}, "dhf", kF * double(b.N * Cx),
                                  b.lay.overlap3d.ar ? CollWait::kBlockEnd : CollWait::kBlocking)));
  Op wg = compute_op("lm_head.wgrad", "linear_wgrad", {"dlogits", "hf"}, {}, {}, {w});
  wg.attrs["vocab_rows"] = 1;
  gemm_cost(wg, double(b.N), double(Vl), double(Cx));
  g.push_back(wg);
  grid_norm_bwd(b, g, "final_norm", "x", "dhf", "", "dx", "final_norm");
  return p;
}

}  // namespace

ModelPrograms lower_3d(const ModelConfig& m, const LayoutConfig& lay, const MicroBatchShape& mb) {
  Grid3D b{m, lay, mb.B, mb.T, mb.tokens(), m.d_model, lay.tp_x, lay.tp_y, lay.tp_z};
  return ModelPrograms{embed_program(b), block_program(b), head_program(b)};
}

}  // namespace dhelix::sharding
