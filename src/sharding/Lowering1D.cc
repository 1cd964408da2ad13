// Layer programs of the GPT, Llama and MoE families under Megatron's layouts (Lowering1D.h): one
// function per unit kind writes the forward and backward op lists with shapes, FLOPs and bytes;
// the regions decide which collectives appear. The op codes are bound to kernels by the runtime's
// OpRegistry. The 3D grid's lowering is Lowering3D.cc.
#include "sharding/Lowering1D.h"

#include "base/Error.h"
#include "model/Params.h"
#include "sharding/CpRing.h"
#include "sharding/ExpertDispatch.h"
#include "sharding/OpFactory.h"
#include "sharding/TpRegion.h"

namespace dhelix::sharding {

namespace {

Op norm_fwd(const TpRegion& b, const std::string& tag, const std::string& in, const std::string& out,
            const std::string& prefix) {
  bool gpt = b.m.family == ModelFamily::kGPT;
  Op op = gpt ? compute_op(tag, "layernorm", {in}, {out, tag + ".mean", tag + ".rstd"},
                          {prefix + ".weight", prefix + ".bias"})
              : compute_op(tag, "rmsnorm", {in}, {out, tag + ".rstd"}, {prefix + ".weight"});
  elem_cost(op, double(b.Ns * b.C), 5, 2);
  return op;
}

// dx = d_res + norm_bwd(d_out); d_res may be empty (no residual path).
Op norm_bwd(const TpRegion& b, const std::string& tag, const std::string& in, const std::string& d_out,
            const std::string& d_res, const std::string& d_in, const std::string& prefix) {
  bool gpt = b.m.family == ModelFamily::kGPT;
  std::vector<std::string> inputs = {d_out, in};
  if (gpt) inputs.push_back(tag + ".mean");
  inputs.push_back(tag + ".rstd");
  if (!d_res.empty()) inputs.push_back(d_res);
  std::vector<std::string> grads = {prefix + ".weight"};
  if (gpt) grads.push_back(prefix + ".bias");
  Op op = compute_op(tag + ".bwd", gpt ? "layernorm_bwd" : "rmsnorm_bwd", inputs, {d_in}, {prefix + ".weight"}, grads);
  op.attrs["residual"] = d_res.empty() ? 0 : 1;
  elem_cost(op, double(b.Ns * b.C), 10, 4);
  return op;
}

// The transformer layer: norm -> column QKV -> [rope] -> attention (or CP's ring) -> row out ->
// residual; norm -> column fc -> activation -> row proj (or the MoE MLP) -> residual.
LayerProgram block_program(const TpRegion& b) {
  const ModelConfig& m = b.m;
  const bool gpt = m.family == ModelFamily::kGPT;
  const int64_t D = m.head_dim(), Hl = m.n_heads / b.tp, Hkvl = m.n_kv_heads / b.tp, Fl = m.ffn_hidden / b.tp;
  const int64_t qkv_l = (Hl + 2 * Hkvl) * D;
  const std::string n1 = gpt ? "ln1" : "attn_norm", n2 = gpt ? "ln2" : "mlp_norm";
  const TpLinear qkv{"attn.qkv", "wqkv", gpt ? "bqkv" : "", qkv_l}, out{"attn.out", "wo", "", Hl * D};
  const TpLinear fc{"mlp.fc", gpt ? "wfc" : "wgu", gpt ? "bfc" : "", gpt ? Fl : 2 * Fl};
  const TpLinear proj{"mlp.proj", gpt ? "wproj" : "wdown", "", Fl};
  LayerProgram p;
  p.name = "block";
  auto& f = p.fwd;

  // ---- attention ----
  f.push_back(norm_fwd(b, n1, "x", "h1", n1));
  column_fwd(b, f, qkv, "h1", "qkv");
  std::string qkv_in = "qkv";
  if (!gpt) {
    Op rope = compute_op("attn.rope", "rope", {"qkv"}, {"qkv_r"});
    elem_cost(rope, double(b.N * (Hl + Hkvl) * D), 3, 2);
    f.push_back(rope);
    qkv_in = "qkv_r";
  }
  Op attn = compute_op("attn.core", "attention", {qkv_in}, {"att", "att.lse"});
  attn.attrs = {{"heads", Hl}, {"kv_heads", Hkvl}, {"head_dim", D}};
  // QK^T and AV, causal: 2 * 2 * B * T^2 * H * D / 2
  attn.cost.flops = 2.0 * b.B * double(b.T) * double(b.T) * double(Hl) * double(D);
  attn.cost.bytes = kF * double(b.N) * double(qkv_l + Hl * D);
  if (b.lay.cp > 1)
    cp_attention_fwd(b, f, qkv_in, attn);
  else
    f.push_back(attn);
  row_fwd(b, f, out, "att", "ao");
  Op res1 = compute_op("attn.residual", "residual_add", {"x", "ao"}, {"x2"}, gpt ? std::vector<std::string>{"bo"}
                                                                             : std::vector<std::string>{});
  elem_cost(res1, double(b.Ns * b.C), 1, 3);
  f.push_back(res1);

  // ---- MLP ----
  f.push_back(norm_fwd(b, n2, "x2", "h2", n2));
  if (m.is_moe()) {
    moe_fwd(b, f);
  } else {
    column_fwd(b, f, fc, "h2", "fc");
    Op act = gpt ? compute_op("mlp.act", "gelu", {"fc"}, {"act"}) : compute_op("mlp.act", "swiglu", {"fc"}, {"act"});
    elem_cost(act, double(b.N * Fl), gpt ? 10 : 6, gpt ? 2 : 3);
    f.push_back(act);
    row_fwd(b, f, proj, "act", "mo");
  }
  Op res2 = compute_op("mlp.residual", "residual_add", {"x2", "mo"}, {"y"},
                      gpt ? std::vector<std::string>{"bproj"} : std::vector<std::string>{});
  elem_cost(res2, double(b.Ns * b.C), 1, 3);
  f.push_back(res2);

  // ---- backward: dy flows into the MLP branch and, through the residual, to the norm ----
  auto& g = p.bwd;
  if (gpt) {
    Op bg = compute_op("mlp.residual.bwd", "bias_grad", {"dy"}, {}, {}, {"bproj"});
    elem_cost(bg, double(b.Ns * b.C), 1, 1);
    g.push_back(bg);
  }
  std::vector<Op> held;
  if (m.is_moe()) {
    moe_bwd(b, g);
  } else {
    held = row_bwd(b, g, proj, "act", "dy", "dact", WgradPolicy::kHoldIfTp);
    Op act_b = gpt ? compute_op("mlp.act.bwd", "gelu_bwd", {"dact", "fc"}, {"dfc"})
                   : compute_op("mlp.act.bwd", "swiglu_bwd", {"dact", "fc"}, {"dfc"});
    elem_cost(act_b, double(b.N * Fl), gpt ? 20 : 10, 3);
    g.push_back(act_b);
    column_bwd(b, g, fc, "h2", "dfc", "dh2", WgradPolicy::kInline, std::move(held));
  }
  g.push_back(norm_bwd(b, n2, "x2", "dh2", "dy", "dx2", n2));
  if (gpt) {
    Op bg = compute_op("attn.residual.bwd", "bias_grad", {"dx2"}, {}, {}, {"bo"});
    elem_cost(bg, double(b.Ns * b.C), 1, 1);
    g.push_back(bg);
  }
  // tp = 1: the attention's weight-gradient GEMMs, which nothing in the layer reads, run after the
  // layer's input gradient (ln1.bwd), so the unit below gets dx two GEMMs earlier. Below the first
  // layer is the embedding: GradSync's all-gather of its rows (sparse exchange) then runs under
  // them instead of after the last backward op. With tp > 1 the held attn.out.wgrad stays ahead of
  // ln1.bwd, under the reduce-scatter that ln1.bwd waits for. attn.qkv's weight gradient is cut
  // in two halves: attn.qkv.wgrad.0 joins attn.out.wgrad under that reduce-scatter (attn.out.wgrad
  // alone, an eighth of the FLOPs of the two MLP wgrads under the MLP's reduce-scatter, left gaps
  // of 2.4-3.5 ms per layer before ln1.bwd in a GPT-2 124M SI trace at 1 Gbit/s), and
  // attn.qkv.wgrad.1 comes last: a trailing op that only accumulates gradients, which a
  // Strand-Interleaving plan may carry into the next layer pair, under its first collective
  // (SIPlan::carry).
  std::vector<Op> deferred;
  held = row_bwd(b, g, out, "att", "dx2", "datt", WgradPolicy::kHold);
  Op attn_b = compute_op("attn.core.bwd", "attention_bwd", {qkv_in, "att", "att.lse", "datt"},
                        {gpt ? "dqkv" : "dqkv_r"});
  attn_b.attrs = attn.attrs;
  attn_b.cost.flops = 2.5 * attn.cost.flops;  // dS, dP recompute + dQ, dK, dV
  attn_b.cost.bytes = 2 * attn.cost.bytes;
  if (b.lay.cp > 1)
    cp_attention_bwd(b, g, qkv_in, gpt ? "dqkv" : "dqkv_r", attn_b);
  else
    g.push_back(attn_b);
  if (!gpt) {
    Op rb = compute_op("attn.rope.bwd", "rope_bwd", {"dqkv_r"}, {"dqkv"});
    elem_cost(rb, double(b.N * (Hl + Hkvl) * D), 3, 2);
    g.push_back(rb);
  }
  column_bwd(b, g, qkv, "h1", "dqkv", "dh1", b.tp > 1 ? WgradPolicy::kSplit : WgradPolicy::kDefer, std::move(held),
             &deferred);
  g.push_back(norm_bwd(b, n1, "x", "dh1", "dx2", "dx", n1));
  for (Op& w : deferred) g.push_back(std::move(w));
  return p;
}

// The token embedding (its rows over tp: the vocab region) and, for GPT, the learned positions
// added on the sequence shard.
LayerProgram embed_program(const TpRegion& b) {
  const bool gpt = b.m.family == ModelFamily::kGPT;
  LayerProgram p;
  p.name = "embed";
  vocab_embed_fwd(b, p.fwd, gpt ? "e" : "y");
  if (gpt) {
    Op pe = compute_op("embed.pos", "pos_embed", {"e"}, {"y"}, {"wpe"});
    elem_cost(pe, double(b.Ns * b.C), 1, 3);
    p.fwd.push_back(pe);
    Op pb = compute_op("embed.pos.bwd", "pos_embed_bwd", {"dy"}, {}, {}, {"wpe"});
    elem_cost(pb, double(b.Ns * b.C), 1, 2);
    p.bwd.push_back(pb);
  }
  vocab_embed_bwd(b, p.bwd, "dy");
  return p;
}

// Final norm, the LM head as a column region over the vocabulary shards, cross-entropy (the vocab
// region).
LayerProgram head_program(const TpRegion& b) {
  const int64_t Vl = padded_vocab(b.m, int(b.tp)) / b.tp;  // Megatron: the vocabulary over tp
  const TpLinear lm{"lm_head", b.m.tie_embeddings ? "wte" : "lm_head", "", Vl};
  LayerProgram p;
  p.name = "head";
  auto& f = p.fwd;
  f.push_back(norm_fwd(b, "final_norm", "x", "hf", "final_norm"));
  column_fwd(b, f, lm, "hf", "logits");
  vocab_xent_fwd(b, f, Vl);
  auto& g = p.bwd;
  column_bwd(b, g, lm, "hf", "dlogits", "dhf", WgradPolicy::kInline);
  g.push_back(norm_bwd(b, "final_norm", "x", "dhf", "", "dx", "final_norm"));
  return p;
}

}  // namespace

ModelPrograms lower_1d(const ModelConfig& m, const LayoutConfig& lay, const MicroBatchShape& mb) {
  DHX_CHECK(lay.cp == 1 || (!m.is_moe() && mb.T % 2 == 0), ConfigError,
            "context parallelism (parallel.cp={}) needs a dense model (family={}) and an even number of local rows per "
            "sequence (T/cp = {}): model.seq_len divisible by 2*cp",
            lay.cp, family_name(m.family), mb.T);
  TpRegion b{m, lay, mb.B, mb.T, mb.tokens(), 0, m.d_model, lay.tp};
  DHX_CHECK(b.N % lay.tp == 0, ConfigError, "micro-batch tokens {} (B={} x T={}) are not divisible by parallel.tp={}",
            b.N, mb.B, mb.T, lay.tp);
  b.Ns = b.N / lay.tp;
  return ModelPrograms{embed_program(b), block_program(b), head_program(b)};
}

}  // namespace dhelix::sharding
