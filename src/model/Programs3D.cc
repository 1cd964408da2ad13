// Layer programs of AxoNN's 3D tensor parallelism (see the section comment below); the Megatron
// layouts' are in Programs.cc.
#include "base/Error.h"
#include "model/Params.h"
#include "model/ProgramParts.h"

namespace dhelix {

namespace {

using detail::activation;
using detail::compute_op;
using detail::kF;

// ==== 3D tensor parallelism (AxoNN) ============================================================
// Activations: the residual stream is [N, C/Gx] (features over x, replicated over y); a type-A
// layer (QKV, MLP-up) reads [N, in/Gx] and writes [N, out/Gy]; a type-B layer (attention-out,
// MLP-down) reads [N, in/Gy] and writes [N, out/Gx]. Per linear: all-gather of the weight block
// over z (when tp_z > 1), GEMM, all-reduce of the partial output over x (A) or y (B); backward:
// the block all-gathered again, input-gradient GEMM, its all-reduce over y (A) or x (B), the
// weight-gradient GEMM, its reduce-scatter over z into this rank's flat shard, accumulated into the
// gradient by a grad_accum op. The overlaps (LayoutConfig::overlap3d) only move ops and mark
// collectives blocking; the kernels and their inputs are the same, so results are bitwise equal.
struct Builder3 {
  const ModelConfig& m;
  const LayoutConfig& lay;
  int64_t B, T, N, C;
  int gx, gy, gz;

  Op compute(std::string name, std::string code, std::vector<std::string> in, std::vector<std::string> out,
             std::vector<std::string> params = {}, std::vector<std::string> grads = {}) const {
    return compute_op(std::move(name), std::move(code), std::move(in), std::move(out), std::move(params),
                      std::move(grads));
  }
  Op coll(std::string name, CollOp c, const std::string& group, std::vector<std::string> in, const std::string& out,
          double bytes_full, bool blocking = false) const {
    Op op;
    op.name = std::move(name);
    op.kind = OpKind::kCollective;
    op.coll = c;
    op.group = group;
    op.code = coll_op_name(c);
    op.inputs = std::move(in);
    op.outputs = {out};
    op.cost.comm_bytes = bytes_full;
    op.cost.bytes = bytes_full;
    if (blocking) op.attrs["blocking"] = 1;
    return op;
  }
  static void gemm_cost(Op& op, double rows, double in, double out) {  // attrs as Builder::linear_cost
    op.cost.flops = 2 * rows * in * out;
    op.cost.bytes = kF * (rows * in + in * out + rows * out);
    op.attrs["gemm_rows"] = int64_t(rows), op.attrs["gemm_in"] = int64_t(in), op.attrs["gemm_out"] = int64_t(out);
  }
  static void elem_cost(Op& op, double elems, double flops_per, double passes) {
    op.cost.flops = elems * flops_per;
    op.cost.bytes = kF * elems * passes;
  }
};

// One 3D linear: its weight block's shape and the axes its activations reduce over.
struct Lin3 {
  std::string tag, w, bias;  // "attn.qkv", "wqkv", "bqkv" ("" without)
  bool type_a = true;
  int64_t rows = 0, cols = 0;  // block [out/Gy, in/Gx] (A) or [out/Gx, in/Gy] (B)
  std::string fwd_group() const { return type_a ? "x" : "y"; }
  std::string bwd_group() const { return type_a ? "y" : "x"; }
};

int group_size(const Builder3& b, const std::string& g) { return g == "x" ? b.gx : g == "y" ? b.gy : b.gz; }

// The all-gather of a weight block over z ("" when tp_z = 1: the GEMM reads the shard).
std::string gather_op(const Builder3& b, std::vector<Op>& ops, const Lin3& l, const std::string& suffix,
                      bool blocking) {
  if (b.gz == 1) return "";
  const std::string buf = l.w + ".g" + suffix;
  Op ag = b.coll("z.ag." + l.tag + suffix, CollOp::kAllGather, "z", {}, buf, kF * double(l.rows * l.cols), blocking);
  // With OAG a block is gathered a GEMM ahead of its use: only that GEMM waits for it, not the end
  // of the SI block it was issued in (as the weight-gradient reduce-scatters: Executor::run_op), so
  // under Strand Interleaving the z gathers run beside the other strand's x / y all-reduces.
  if (!blocking) ag.attrs["background"] = 1;
  ag.params = {l.w};
  ops.push_back(ag);
  return buf;
}

// OAG across layers: the neighbouring block's (`dir` +1 forward, -1 backward) all-gather of `l`'s
// weight, issued here and adopted by that block's own all-gather op (runtime Executor). Its bytes
// are the adopting op's (comm_bytes 0 here, so a step's volume counts each gather once); where the
// neighbour is not a block (the head, the embedding) the executor issues nothing.
void prefetch_op(const Builder3& b, std::vector<Op>& ops, const Lin3& l, const std::string& suffix, int dir) {
  if (b.gz == 1 || !b.lay.overlap3d.ag) return;
  Op ag = b.coll(std::string(dir > 0 ? "z.ag.next." : "z.ag.prev.") + l.tag + suffix, CollOp::kAllGather, "z", {},
                 l.w + ".g" + suffix + ".next", 0);
  ag.params = {l.w};
  ag.attrs["prefetch_unit"] = dir;
  ops.push_back(ag);
}

// fwd: GEMM -> all-reduce over x (A) / y (B) -> bias. Writes `out`.
void lin3_fwd(const Builder3& b, std::vector<Op>& ops, const Lin3& l, const std::string& in, const std::string& wbuf,
              const std::string& out) {
  const bool reduce = group_size(b, l.fwd_group()) > 1;
  const std::string summed = l.bias.empty() ? out : out + "_s";
  const std::string partial = reduce ? out + "_p" : summed;
  std::vector<std::string> ins = {in};
  if (!wbuf.empty()) ins.push_back(wbuf);
  Op g = b.compute(l.tag, "linear3d", ins, {partial}, {l.w});
  g.attrs = {{"w_rows", l.rows}, {"w_cols", l.cols}};
  Builder3::gemm_cost(g, double(b.N), double(l.cols), double(l.rows));
  ops.push_back(g);
  if (reduce)
    ops.push_back(activation(b.coll(l.fwd_group() + ".ar." + l.tag, CollOp::kAllReduce, l.fwd_group(), {partial},
                                    summed, kF * double(b.N * l.rows))));
  if (!l.bias.empty()) {
    Op ba = b.compute(l.tag + ".bias", "bias_add", {summed}, {out}, {l.bias});
    Builder3::elem_cost(ba, double(b.N * l.rows), 1, 2);
    ops.push_back(ba);
  }
}

// bwd: [bias grad] -> dgrad -> all-reduce over y (A) / x (B) [blocking without OAR] -> wgrad ->
// reduce-scatter over z [blocking without ORS] -> grad_accum (into `accum`: the end of the layer's
// backward with ORS, else right here). Writes `d_in`.
void lin3_bwd(const Builder3& b, std::vector<Op>& ops, const Lin3& l, const std::string& in, const std::string& d_out,
              const std::string& d_in, const std::string& wbuf, std::vector<Op>& accum) {
  const TP3DOverlaps& ov = b.lay.overlap3d;
  if (!l.bias.empty()) {
    Op bg = b.compute(l.tag + ".bias.bwd", "bias_grad", {d_out}, {}, {}, {l.bias});
    Builder3::elem_cost(bg, double(b.N * l.rows), 1, 1);
    ops.push_back(bg);
  }
  const bool reduce = group_size(b, l.bwd_group()) > 1;
  const std::string partial = reduce ? d_in + "_p" : d_in;
  std::vector<std::string> ins = {d_out};
  if (!wbuf.empty()) ins.push_back(wbuf);
  Op dg = b.compute(l.tag + ".dgrad", "linear3d_dgrad", ins, {partial}, {l.w});
  dg.attrs = {{"w_rows", l.rows}, {"w_cols", l.cols}};
  Builder3::gemm_cost(dg, double(b.N), double(l.rows), double(l.cols));
  ops.push_back(dg);
  if (reduce)
    ops.push_back(activation(b.coll(l.bwd_group() + ".ar." + l.tag + ".bwd", CollOp::kAllReduce, l.bwd_group(),
                                    {partial}, d_in, kF * double(b.N * l.cols), !ov.ar)));
  Op wg = b.compute(l.tag + ".wgrad", "linear3d_wgrad", {d_out, in}, {}, {}, {l.w});
  wg.attrs = {{"w_rows", l.rows}, {"w_cols", l.cols}};
  Builder3::gemm_cost(wg, double(b.N), double(l.rows), double(l.cols));
  if (b.gz == 1) {
    ops.push_back(wg);
    return;
  }
  const std::string dw = "dw." + l.tag;
  wg.outputs = {dw};
  wg.grads.clear();
  ops.push_back(wg);
  Op rs = b.coll("z.rs." + l.tag, CollOp::kReduceScatter, "z", {dw}, dw + ".s", kF * double(l.rows * l.cols), !ov.rs);
  if (ov.rs) rs.attrs["background"] = 1;  // not waited for at its SI block's end (Executor::run_op)
  if (ov.accumulate_z) rs.attrs["last_micro_batch"] = 1;  // earlier micro-batches add dw to a block sum
  ops.push_back(rs);
  Op acc = b.compute(l.tag + ".wgrad.accum", "grad_accum", {dw + ".s"}, {}, {}, {l.w});
  Builder3::elem_cost(acc, double(l.rows * l.cols / b.gz), 1, 3);
  (ov.rs ? accum : ops).push_back(acc);
}

// Exact norm over the features split on x: statistics -> all-reduce over x -> application.
void norm3_fwd(const Builder3& b, std::vector<Op>& ops, const std::string& tag, const std::string& in,
               const std::string& out, const std::string& prefix) {
  const bool gpt = b.m.family == ModelFamily::kGPT;
  const int64_t Cl = b.C / b.gx;
  if (b.gx == 1) {  // whole rows: the single-process kernels
    Op op = gpt ? b.compute(tag, "layernorm", {in}, {out, tag + ".mean", tag + ".rstd"},
                            {prefix + ".weight", prefix + ".bias"})
                : b.compute(tag, "rmsnorm", {in}, {out, tag + ".rstd"}, {prefix + ".weight"});
    Builder3::elem_cost(op, double(b.N * Cl), 5, 2);
    ops.push_back(op);
    return;
  }
  Op st = b.compute(tag + ".stats", gpt ? "ln_stats" : "rms_stats", {in}, {tag + ".st"});
  Builder3::elem_cost(st, double(b.N * Cl), 2, 1);
  ops.push_back(st);
  ops.push_back(b.coll("x.ar." + tag, CollOp::kAllReduce, "x", {tag + ".st"}, tag + ".st", 8.0 * double(b.N * (gpt ? 2 : 1))));
  Op ap = gpt ? b.compute(tag, "ln_apply", {in, tag + ".st"}, {out, tag + ".mean", tag + ".rstd"},
                          {prefix + ".weight", prefix + ".bias"})
              : b.compute(tag, "rms_apply", {in, tag + ".st"}, {out, tag + ".rstd"}, {prefix + ".weight"});
  ap.attrs["features"] = b.C;
  Builder3::elem_cost(ap, double(b.N * Cl), 4, 2);
  ops.push_back(ap);
}

void norm3_bwd(const Builder3& b, std::vector<Op>& ops, const std::string& tag, const std::string& in,
               const std::string& d_out, const std::string& d_res, const std::string& d_in, const std::string& prefix) {
  const bool gpt = b.m.family == ModelFamily::kGPT;
  const int64_t Cl = b.C / b.gx;
  std::vector<std::string> saved = {in};
  if (gpt) saved.push_back(tag + ".mean");
  saved.push_back(tag + ".rstd");
  std::vector<std::string> grads = {prefix + ".weight"};
  if (gpt) grads.push_back(prefix + ".bias");
  if (b.gx == 1) {
    std::vector<std::string> inputs = {d_out};
    inputs.insert(inputs.end(), saved.begin(), saved.end());
    if (!d_res.empty()) inputs.push_back(d_res);
    Op op = b.compute(tag + ".bwd", gpt ? "layernorm_bwd" : "rmsnorm_bwd", inputs, {d_in}, {prefix + ".weight"}, grads);
    op.attrs["residual"] = d_res.empty() ? 0 : 1;
    Builder3::elem_cost(op, double(b.N * Cl), 10, 4);
    ops.push_back(op);
    return;
  }
  std::vector<std::string> sin = {d_out};
  sin.insert(sin.end(), saved.begin(), saved.end());
  Op st = b.compute(tag + ".bwd.stats", gpt ? "ln_bwd_stats" : "rms_bwd_stats", sin, {tag + ".bst"},
                    {prefix + ".weight"});
  Builder3::elem_cost(st, double(b.N * Cl), 4, 2);
  ops.push_back(st);
  ops.push_back(b.coll("x.ar." + tag + ".bwd", CollOp::kAllReduce, "x", {tag + ".bst"}, tag + ".bst",
                       8.0 * double(b.N * (gpt ? 2 : 1))));
  std::vector<std::string> ain = sin;
  ain.push_back(tag + ".bst");
  if (!d_res.empty()) ain.push_back(d_res);
  Op ap = b.compute(tag + ".bwd", gpt ? "ln_bwd_apply" : "rms_bwd_apply", ain, {d_in}, {prefix + ".weight"}, grads);
  ap.attrs["features"] = b.C;
  ap.attrs["residual"] = d_res.empty() ? 0 : 1;
  Builder3::elem_cost(ap, double(b.N * Cl), 8, 4);
  ops.push_back(ap);
}

LayerProgram block_program_3d(const Builder3& b) {
  const ModelConfig& m = b.m;
  const bool gpt = m.family == ModelFamily::kGPT;
  const bool oag = b.lay.overlap3d.ag;
  const int64_t D = m.head_dim(), Hl = m.n_heads / b.gy, Hkvl = m.n_kv_heads / b.gy, Fl = m.ffn_hidden / b.gy;
  const int64_t Cx = b.C / b.gx, Cy = b.C / b.gy;
  const std::string n1 = gpt ? "ln1" : "attn_norm", n2 = gpt ? "ln2" : "mlp_norm";
  const Lin3 qkv{"attn.qkv", "wqkv", gpt ? "bqkv" : "", true, (Hl + 2 * Hkvl) * D, Cx};
  const Lin3 out{"attn.out", "wo", "", false, Cx, Hl * D};
  const Lin3 fc{"mlp.fc", gpt ? "wfc" : "wgu", gpt ? "bfc" : "", true, gpt ? Fl : 2 * Fl, Cx};
  const Lin3 proj{"mlp.proj", gpt ? "wproj" : "wdown", "", false, Cx, Fl};
  (void)Cy;
  LayerProgram p;
  p.name = "block";
  auto& f = p.fwd;
  // OAG: each block is gathered one GEMM ahead of its use, so its all-gather runs under the GEMM
  // before; the layer's first is prefetched by the layer before (prefetch_op) and adopted here
  // (gathered here only in the first layer). Without OAG: right before its GEMM, waited for there.
  std::string g_qkv = gather_op(b, f, qkv, "", !oag), g_out, g_fc, g_proj;
  if (oag) g_out = gather_op(b, f, out, "", false);
  norm3_fwd(b, f, n1, "x", "h1", n1);
  lin3_fwd(b, f, qkv, "h1", g_qkv, "qkv");
  std::string qkv_in = "qkv";
  if (!gpt) {
    Op rope = b.compute("attn.rope", "rope", {"qkv"}, {"qkv_r"});
    Builder3::elem_cost(rope, double(b.N * (Hl + Hkvl) * D), 3, 2);
    f.push_back(rope);
    qkv_in = "qkv_r";
  }
  Op attn = b.compute("attn.core", "attention", {qkv_in}, {"att", "att.lse"});
  attn.attrs = {{"heads", Hl}, {"kv_heads", Hkvl}, {"head_dim", D}};
  attn.cost.flops = 2.0 * b.B * double(b.T) * double(b.T) * double(Hl) * double(D);
  attn.cost.bytes = kF * double(b.N) * double(qkv.rows + Hl * D);
  f.push_back(attn);
  if (!oag) g_out = gather_op(b, f, out, "", true);
  else g_fc = gather_op(b, f, fc, "", false);
  lin3_fwd(b, f, out, "att", g_out, "ao");
  Op res1 = b.compute("attn.residual", "residual_add", {"x", "ao"}, {"x2"},
                      gpt ? std::vector<std::string>{"bo"} : std::vector<std::string>{});
  Builder3::elem_cost(res1, double(b.N * Cx), 1, 3);
  f.push_back(res1);
  norm3_fwd(b, f, n2, "x2", "h2", n2);
  if (!oag) g_fc = gather_op(b, f, fc, "", true);
  else g_proj = gather_op(b, f, proj, "", false);
  lin3_fwd(b, f, fc, "h2", g_fc, "fc");
  Op act = gpt ? b.compute("mlp.act", "gelu", {"fc"}, {"act"}) : b.compute("mlp.act", "swiglu", {"fc"}, {"act"});
  Builder3::elem_cost(act, double(b.N * Fl), gpt ? 10 : 6, gpt ? 2 : 3);
  f.push_back(act);
  if (!oag) g_proj = gather_op(b, f, proj, "", true);
  prefetch_op(b, f, qkv, "", +1);  // the next layer's first block, under this layer's last GEMM
  lin3_fwd(b, f, proj, "act", g_proj, "mo");
  Op res2 = b.compute("mlp.residual", "residual_add", {"x2", "mo"}, {"y"},
                      gpt ? std::vector<std::string>{"bproj"} : std::vector<std::string>{});
  Builder3::elem_cost(res2, double(b.N * Cx), 1, 3);
  f.push_back(res2);

  auto& g = p.bwd;
  std::vector<Op> accum;  // the reduce-scattered weight gradients' accumulation (ORS: at the end)
  if (gpt) {
    Op bg = b.compute("mlp.residual.bwd", "bias_grad", {"dy"}, {}, {}, {"bproj"});
    Builder3::elem_cost(bg, double(b.N * Cx), 1, 1);
    g.push_back(bg);
  }
  std::string b_proj = gather_op(b, g, proj, ".bwd", !oag), b_fc, b_out, b_qkv;
  if (oag) b_fc = gather_op(b, g, fc, ".bwd", false);
  lin3_bwd(b, g, proj, "act", "dy", "dact", b_proj, accum);
  Op act_b = gpt ? b.compute("mlp.act.bwd", "gelu_bwd", {"dact", "fc"}, {"dfc"})
                 : b.compute("mlp.act.bwd", "swiglu_bwd", {"dact", "fc"}, {"dfc"});
  Builder3::elem_cost(act_b, double(b.N * Fl), gpt ? 20 : 10, 3);
  g.push_back(act_b);
  if (!oag) b_fc = gather_op(b, g, fc, ".bwd", true);
  else b_out = gather_op(b, g, out, ".bwd", false);
  lin3_bwd(b, g, fc, "h2", "dfc", "dh2", b_fc, accum);
  norm3_bwd(b, g, n2, "x2", "dh2", "dy", "dx2", n2);
  if (gpt) {
    Op bg = b.compute("attn.residual.bwd", "bias_grad", {"dx2"}, {}, {}, {"bo"});
    Builder3::elem_cost(bg, double(b.N * Cx), 1, 1);
    g.push_back(bg);
  }
  if (!oag) b_out = gather_op(b, g, out, ".bwd", true);
  else b_qkv = gather_op(b, g, qkv, ".bwd", false);
  lin3_bwd(b, g, out, "att", "dx2", "datt", b_out, accum);
  Op attn_b = b.compute("attn.core.bwd", "attention_bwd", {qkv_in, "att", "att.lse", "datt"},
                        {gpt ? "dqkv" : "dqkv_r"});
  attn_b.attrs = attn.attrs;
  attn_b.cost.flops = 2.5 * attn.cost.flops;
  attn_b.cost.bytes = 2 * attn.cost.bytes;
  g.push_back(attn_b);
  if (!gpt) {
    Op rb = b.compute("attn.rope.bwd", "rope_bwd", {"dqkv_r"}, {"dqkv"});
    Builder3::elem_cost(rb, double(b.N * (Hl + Hkvl) * D), 3, 2);
    g.push_back(rb);
  }
  if (!oag) b_qkv = gather_op(b, g, qkv, ".bwd", true);
  prefetch_op(b, g, proj, ".bwd", -1);  // the layer below's first backward block
  lin3_bwd(b, g, qkv, "h1", "dqkv", "dh1", b_qkv, accum);
  norm3_bwd(b, g, n1, "x", "dh1", "dx2", "dx", n1);
  for (Op& a : accum) g.push_back(std::move(a));
  return p;
}

// Token embedding: the table's rows (vocabulary) over y and columns over x; a token outside this
// rank's rows gives zeros, the all-reduce over y sums the one real row in: [N, C/Gx].
LayerProgram embed_program_3d(const Builder3& b) {
  const bool gpt = b.m.family == ModelFamily::kGPT;
  const int64_t Cx = b.C / b.gx;
  LayerProgram p;
  p.name = "embed";
  const std::string e = gpt ? "e" : "y";
  const std::string part = b.gy > 1 ? "e_p" : e;
  Op tok = b.compute("embed.tok", "embed", {"tokens"}, {part}, {"wte"});
  Builder3::elem_cost(tok, double(b.N * Cx), 0, 2);
  p.fwd.push_back(tok);
  if (b.gy > 1) p.fwd.push_back(activation(b.coll("y.ar.embed", CollOp::kAllReduce, "y", {part}, e, kF * double(b.N * Cx))));
  if (gpt) {
    Op pe = b.compute("embed.pos", "pos_embed", {"e"}, {"y"}, {"wpe"});
    Builder3::elem_cost(pe, double(b.N * Cx), 1, 3);
    p.fwd.push_back(pe);
    Op pb = b.compute("embed.pos.bwd", "pos_embed_bwd", {"dy"}, {}, {}, {"wpe"});
    Builder3::elem_cost(pb, double(b.N * Cx), 1, 2);
    p.bwd.push_back(pb);
  }
  Op eb = b.compute("embed.tok.bwd", "embed_bwd", {"tokens", "dy"}, {}, {}, {"wte"});
  Builder3::elem_cost(eb, double(b.N * Cx), 1, 2);
  p.bwd.push_back(eb);
  return p;
}

// LM head: final norm (exact over x), logits = type-A GEMM with the vocabulary over y (all-reduced
// over x), cross-entropy vocab-parallel over y; the input gradient all-reduced over y.
LayerProgram head_program_3d(const Builder3& b) {
  const int64_t Vl = padded_vocab(b.m, b.gy) / b.gy, Cx = b.C / b.gx;
  const std::string w = b.m.tie_embeddings ? "wte" : "lm_head";
  LayerProgram p;
  p.name = "head";
  auto& f = p.fwd;
  norm3_fwd(b, f, "final_norm", "x", "hf", "final_norm");
  const std::string logits_p = b.gx > 1 ? "logits_p" : "logits";
  Op lg = b.compute("lm_head", "linear", {"hf"}, {logits_p}, {w});
  lg.attrs["vocab_rows"] = 1;
  Builder3::gemm_cost(lg, double(b.N), double(Cx), double(Vl));
  f.push_back(lg);
  if (b.gx > 1)
    f.push_back(activation(b.coll("x.ar.lm_head", CollOp::kAllReduce, "x", {logits_p}, "logits", kF * double(b.N * Vl))));
  if (b.gy > 1) {
    Op mx = b.compute("xent.max", "xent_max", {"logits"}, {"xent.m"});
    Builder3::elem_cost(mx, double(b.N * Vl), 1, 1);
    f.push_back(mx);
    Op ar1 = b.coll("y.ar.xent.max", CollOp::kAllReduce, "y", {"xent.m"}, "xent.m", kF * double(b.N));
    ar1.attrs["reduce_max"] = 1;
    f.push_back(ar1);
    Op st = b.compute("xent.stats", "xent_stats", {"logits", "targets", "xent.m"}, {"xent.s"});
    Builder3::elem_cost(st, double(b.N * Vl), 3, 1);
    f.push_back(st);
    f.push_back(b.coll("y.ar.xent.sum", CollOp::kAllReduce, "y", {"xent.s"}, "xent.s", kF * double(2 * b.N)));
    Op fin = b.compute("xent.loss", "xent_finish", {"logits", "targets", "xent.m", "xent.s"}, {"loss", "dlogits"});
    Builder3::elem_cost(fin, double(b.N * Vl), 4, 2);
    f.push_back(fin);
  } else {
    Op x = b.compute("xent", "cross_entropy", {"logits", "targets"}, {"loss", "dlogits"});
    Builder3::elem_cost(x, double(b.N * Vl), 6, 3);
    f.push_back(x);
  }
  auto& g = p.bwd;
  const std::string dhf_p = b.gy > 1 ? "dhf_p" : "dhf";
  Op dg = b.compute("lm_head.dgrad", "linear_dgrad", {"dlogits"}, {dhf_p}, {w});
  dg.attrs["vocab_rows"] = 1;
  Builder3::gemm_cost(dg, double(b.N), double(Vl), double(Cx));
  g.push_back(dg);
  if (b.gy > 1)
    g.push_back(activation(b.coll("y.ar.lm_head.bwd", CollOp::kAllReduce, "y", {dhf_p}, "dhf", kF * double(b.N * Cx),
                                  !b.lay.overlap3d.ar)));
  Op wg = b.compute("lm_head.wgrad", "linear_wgrad", {"dlogits", "hf"}, {}, {}, {w});
  wg.attrs["vocab_rows"] = 1;
  Builder3::gemm_cost(wg, double(b.N), double(Vl), double(Cx));
  g.push_back(wg);
  norm3_bwd(b, g, "final_norm", "x", "dhf", "", "dx", "final_norm");
  return p;
}

}  // namespace

namespace detail {

ModelPrograms build_programs_3d(const ModelConfig& m, const LayoutConfig& lay, const MicroBatchShape& mb) {
  Builder3 b3{m, lay, mb.B, mb.T, mb.tokens(), m.d_model, lay.tp_x, lay.tp_y, lay.tp_z};
  ModelPrograms out{embed_program_3d(b3), block_program_3d(b3), head_program_3d(b3)};
  for (LayerProgram* p : {&out.embed, &out.block, &out.head}) annotate_lifetimes(*p, boundary_buffers());
  return out;
}

}  // namespace detail

}  // namespace dhelix
