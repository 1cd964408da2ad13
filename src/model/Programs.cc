// Layer programs for the GPT, Llama and MoE families. One function per unit kind writes the forward
// op list and the backward op list with shapes, FLOPs and bytes; the layout decides which
// collectives appear. The op codes are bound to kernels by the runtime's OpRegistry. The programs
// of AxoNN's 3D grid are in Programs3D.cc.
#include "model/Programs.h"

#include "base/Error.h"
#include "model/Params.h"
#include "model/ProgramParts.h"

namespace dhelix {

namespace detail {

Op compute_op(std::string name, std::string code, std::vector<std::string> in, std::vector<std::string> out,
              std::vector<std::string> params, std::vector<std::string> grads) {
  Op op;
  op.name = std::move(name);
  op.code = std::move(code);
  op.inputs = std::move(in);
  op.outputs = std::move(out);
  op.params = std::move(params);
  op.grads = std::move(grads);
  return op;
}

}  // namespace detail

namespace {

using detail::activation;
using detail::compute_op;
using detail::kF;

struct Builder {
  const ModelConfig& m;
  const LayoutConfig& lay;
  int64_t B, T, N, Ns, C, tp;

  Op compute(std::string name, std::string code, std::vector<std::string> in, std::vector<std::string> out,
             std::vector<std::string> params = {}, std::vector<std::string> grads = {}) const {
    return compute_op(std::move(name), std::move(code), std::move(in), std::move(out), std::move(params),
                      std::move(grads));
  }
  // A tp collective on dim 0; returns the op (no-op callers check tp > 1 first).
  Op coll(std::string name, CollOp c, const std::string& in, const std::string& out, double elems_full) const {
    Op op;
    op.name = std::move(name);
    op.kind = OpKind::kCollective;
    op.coll = c;
    op.group = "tp";
    op.code = coll_op_name(c);
    op.inputs = {in};
    op.outputs = {out};
    // Per-rank buffer: the full (gathered / pre-scatter) tensor's bytes.
    op.cost.comm_bytes = elems_full * kF;
    op.cost.bytes = elems_full * kF;
    return op;
  }
  // GEMM extents as attrs gemm_rows / gemm_in / gemm_out (what a pricer that times GEMM shapes
  // reads): forward Y[rows x out] = X[rows x in] W^T; input gradient dX[rows x out] = dY[rows x in] W;
  // weight gradient dW[in x out] = dY^T[in x rows] X[rows x out] (the contraction over the rows).
  void linear_cost(Op& op, double rows, double in, double out) const {
    op.cost.flops = 2 * rows * in * out;
    op.cost.bytes = kF * (rows * in + in * out + rows * out);
    op.attrs["gemm_rows"] = int64_t(rows), op.attrs["gemm_in"] = int64_t(in), op.attrs["gemm_out"] = int64_t(out);
  }
  void elem_cost(Op& op, double elems, double flops_per = 1, double passes = 2) const {
    op.cost.flops = elems * flops_per;
    op.cost.bytes = kF * elems * passes;
  }
};

// --- a column GEMM fed by the sequence-parallel all-gather, and its backward ------------------
// fwd: [AG in -> in_g] ; out = in_g @ w^T (+b)     bwd: dgrad, wgrad, [RS d_in_g -> d_in]
void column_fwd(const Builder& b, std::vector<Op>& ops, const std::string& tag, const std::string& in,
                const std::string& out, const std::string& w, const std::string& bias, int64_t out_local) {
  std::string g = in;
  if (b.tp > 1) {
    g = in + "_g";
    ops.push_back(activation(b.coll("tp.ag." + tag, CollOp::kAllGather, in, g, double(b.N * b.C))));
  }
  std::vector<std::string> params = {w};
  if (!bias.empty()) params.push_back(bias);
  Op op = b.compute(tag, "linear", {g}, {out}, params);
  b.linear_cost(op, double(b.N), double(b.C), double(out_local));
  if (tag == "lm_head") op.attrs["vocab_rows"] = 1;
  ops.push_back(op);
}

// `held`: weight-gradient ops of earlier GEMMs held back to run here, after the reduce-scatter,
// ahead of this GEMM's own wgrad (see row_bwd).
// `deferred`: when given, this GEMM's own weight-gradient op goes there instead of into ops, and
// so do the held ones when `defer_held`. `split_wgrad` (with `deferred`): the weight gradient is
// cut in two ops over the halves of the weight's rows, "<tag>.wgrad.0" into ops (after the held
// ones) and "<tag>.wgrad.1" into deferred: the first adds cover for the reduce-scatter, the second
// stays a trailing op. Together they compute exactly what the one op would.
void column_bwd(const Builder& b, std::vector<Op>& ops, const std::string& tag, const std::string& in,
                const std::string& d_out, const std::string& d_in, const std::string& w, const std::string& bias,
                int64_t out_local, std::vector<Op> held = {}, std::vector<Op>* deferred = nullptr,
                bool defer_held = true, bool split_wgrad = false) {
  std::string g = b.tp > 1 ? in + "_g" : in;
  std::string dg = b.tp > 1 ? d_in + "_g" : d_in;
  Op dgrad = b.compute(tag + ".dgrad", "linear_dgrad", {d_out}, {dg}, {w});
  b.linear_cost(dgrad, double(b.N), double(out_local), double(b.C));
  std::vector<std::string> grads = {w};
  if (!bias.empty()) grads.push_back(bias);
  Op wgrad = b.compute(tag + ".wgrad", "linear_wgrad", {d_out, g}, {}, {}, grads);
  b.linear_cost(wgrad, double(b.N), double(out_local), double(b.C));
  if (tag == "lm_head") dgrad.attrs["vocab_rows"] = wgrad.attrs["vocab_rows"] = 1;
  ops.push_back(dgrad);
  // With tp > 1 the input-gradient reduce-scatter goes out before the weight-gradient GEMM, which
  // does not need it: the collective then also runs under this strand's wgrad (Megatron's
  // dgrad-RS / wgrad overlap), not only under the other strand's compute.
  if (b.tp > 1) ops.push_back(activation(b.coll("tp.rs." + tag + ".bwd", CollOp::kReduceScatter, dg, d_in, double(b.N * b.C))));
  for (Op& h : held) (deferred && defer_held ? *deferred : ops).push_back(std::move(h));
  if (split_wgrad && deferred && out_local >= 2) {
    // The cut falls on a multiple of 96 rows when the weight has enough (a whole row tile of every
    // OpenBLAS sgemm kernel measured, so the pieces equal the unsplit op bitwise); a small weight is
    // cut at its half (equal within rounding).
    const int64_t half = out_local / 2 >= 96 ? out_local / 2 / 96 * 96 : out_local / 2;
    for (int part = 0; part < 2; ++part) {
      const int64_t lo = part == 0 ? 0 : half, hi = part == 0 ? half : out_local;
      Op piece = wgrad;
      piece.name = tag + ".wgrad." + std::to_string(part);
      piece.attrs["rows_lo"] = lo;
      piece.attrs["rows_hi"] = hi;
      b.linear_cost(piece, double(b.N), double(hi - lo), double(b.C));
      (part == 0 ? ops : *deferred).push_back(std::move(piece));
    }
    return;
  }
  (deferred ? *deferred : ops).push_back(wgrad);
}

// --- a row GEMM followed by the sequence-parallel reduce-scatter ------------------------------
void row_fwd(const Builder& b, std::vector<Op>& ops, const std::string& tag, const std::string& in,
             const std::string& out, const std::string& w, int64_t in_local) {
  std::string partial = b.tp > 1 ? out + "_p" : out;
  Op op = b.compute(tag, "linear", {in}, {partial}, {w});
  b.linear_cost(op, double(b.N), double(in_local), double(b.C));
  ops.push_back(op);
  if (b.tp > 1) ops.push_back(activation(b.coll("tp.rs." + tag, CollOp::kReduceScatter, partial, out, double(b.N * b.C))));
}

// With tp > 1 the weight-gradient GEMM is returned, not appended: nothing in the layer reads its
// result, so the caller runs it after the next column GEMM's input-gradient reduce-scatter. There
// the backward strand has two weight-gradient GEMMs in a row — enough compute to hide both that
// reduce-scatter and a collective of the forward strand beside it under Strand Interleaving.
// Gradients are unchanged: each GEMM writes its own parameters' gradients.
// `hold` returns the weight-gradient GEMM with tp = 1 as well.
std::vector<Op> row_bwd(const Builder& b, std::vector<Op>& ops, const std::string& tag, const std::string& in,
                        const std::string& d_out, const std::string& d_in, const std::string& w, int64_t in_local,
                        bool hold = false) {
  std::string dg = d_out;
  if (b.tp > 1) {
    dg = d_out + "_g";
    ops.push_back(activation(b.coll("tp.ag." + tag + ".bwd", CollOp::kAllGather, d_out, dg, double(b.N * b.C))));
  }
  Op dgrad = b.compute(tag + ".dgrad", "linear_dgrad", {dg}, {d_in}, {w});
  b.linear_cost(dgrad, double(b.N), double(b.C), double(in_local));
  Op wgrad = b.compute(tag + ".wgrad", "linear_wgrad", {dg, in}, {}, {}, {w});
  b.linear_cost(wgrad, double(b.N), double(b.C), double(in_local));
  ops.push_back(dgrad);
  if (b.tp > 1 || hold) return {wgrad};
  ops.push_back(wgrad);
  return {};
}

Op norm_fwd(const Builder& b, const std::string& tag, const std::string& in, const std::string& out,
            const std::string& prefix) {
  bool gpt = b.m.family == ModelFamily::kGPT;
  Op op = gpt ? b.compute(tag, "layernorm", {in}, {out, tag + ".mean", tag + ".rstd"},
                          {prefix + ".weight", prefix + ".bias"})
              : b.compute(tag, "rmsnorm", {in}, {out, tag + ".rstd"}, {prefix + ".weight"});
  b.elem_cost(op, double(b.Ns * b.C), 5, 2);
  return op;
}

// dx = d_res + norm_bwd(d_out); d_res may be empty (no residual path).
Op norm_bwd(const Builder& b, const std::string& tag, const std::string& in, const std::string& d_out,
            const std::string& d_res, const std::string& d_in, const std::string& prefix) {
  bool gpt = b.m.family == ModelFamily::kGPT;
  std::vector<std::string> inputs = {d_out, in};
  if (gpt) inputs.push_back(tag + ".mean");
  inputs.push_back(tag + ".rstd");
  if (!d_res.empty()) inputs.push_back(d_res);
  std::vector<std::string> grads = {prefix + ".weight"};
  if (gpt) grads.push_back(prefix + ".bias");
  Op op = b.compute(tag + ".bwd", gpt ? "layernorm_bwd" : "rmsnorm_bwd", inputs, {d_in}, {prefix + ".weight"}, grads);
  op.attrs["residual"] = d_res.empty() ? 0 : 1;
  b.elem_cost(op, double(b.Ns * b.C), 10, 4);
  return op;
}

// --- the Mixture-of-Experts MLP (dropless top-k routing over stacked SwiGLU experts) -------------
// It reads the norm's output "h2" [Ns, C] (this rank's tokens: the sequence shard under tp) and
// writes "mo". Under tp each rank routes its sequence shard and the router's statistics are summed
// over tp. Under expert parallelism (ep = G > 1) this rank holds E / G whole experts: the token
// counts per expert are exchanged first (an even all-to-all), then the rows themselves (an uneven
// all-to-all over ep) go to the ranks holding their experts and come back after the expert GEMMs;
// backward moves the gradients the same two ways. The expert ops' costs assume balanced routing.
//   fwd: router -> route (softmax, top-k, gates, grouping by expert, statistics) -> dispatch (rows by
//        expert) [-> counts a2a -> rows a2a -> regroup by local expert] -> grouped up-GEMM -> SwiGLU ->
//        grouped down-GEMM [-> regroup by rank -> rows a2a back] -> aux -> combine (gate-weighted sum)
//   bwd: the reverse; the router's input gradient and the dispatch's sum into "dh2".
Op ep_coll(const Builder& b, std::string name, std::vector<std::string> in, const std::string& out, double bytes) {
  Op op = b.coll(std::move(name), CollOp::kAllToAll, in.at(0), out, bytes / kF);
  op.group = "ep";
  const bool rows = in.size() == 3;  // the rows, not the token counts
  op.inputs = std::move(in);
  return rows ? activation(std::move(op)) : op;
}

void moe_fwd(const Builder& b, std::vector<Op>& f) {
  const ModelConfig& m = b.m;
  const int64_t G = b.lay.ep;
  const double N = double(b.Ns), E = double(m.n_experts), P = N * double(m.top_k), C = double(b.C),
               F = double(m.ffn_hidden), El = E / double(G);
  Op router = b.compute("moe.router", "linear", {"h2"}, {"moe.logits"}, {"router"});
  b.linear_cost(router, N, C, E);
  f.push_back(router);
  Op route = b.compute("moe.route", "moe_route", {"moe.logits"},
                       {"moe.probs", "moe.expert", "moe.gate", "moe.counts", "moe.order", "moe.slot", "moe.stats"});
  b.elem_cost(route, N * E, 8, 3);
  f.push_back(route);
  // The load-balancing loss is over the whole micro-batch: under tp each rank routes its sequence
  // shard, so the per-expert counts and probability sums ("moe.stats", 2E floats) are summed over
  // tp; the sum runs under the expert GEMMs and is read by moe.aux (forward) and moe.route.bwd.
  if (b.tp > 1) f.push_back(b.coll("tp.ar.moe.stats", CollOp::kAllReduce, "moe.stats", "moe.stats", 2 * E));
  if (G > 1) f.push_back(ep_coll(b, "ep.a2a.counts", {"moe.counts"}, "moe.rcounts", 4 * E));
  Op disp = b.compute("moe.dispatch", "moe_dispatch", {"h2", "moe.order"}, {"moe.xs"});
  b.elem_cost(disp, P * C, 0, 2);
  f.push_back(disp);
  std::string xs = "moe.xs", counts = "moe.counts", eo = "moe.eo";
  if (G > 1) {
    f.push_back(ep_coll(b, "ep.a2a.dispatch", {"moe.xs", "moe.counts", "moe.rcounts"}, "moe.xr", kF * P * C));
    Op sort = b.compute("moe.ep.sort", "moe_ep_sort", {"moe.xr", "moe.rcounts"}, {"moe.xg", "moe.lcounts"});
    b.elem_cost(sort, P * C, 0, 2);
    f.push_back(sort);
    xs = "moe.xg", counts = "moe.lcounts", eo = "moe.eg";
  }
  Op fc = b.compute("moe.fc", "expert_linear", {xs, counts}, {"moe.fc"}, {"experts.wgu"});
  b.linear_cost(fc, P, C, 2 * F);
  fc.attrs["gemm_rows"] = int64_t(P / El);  // one expert's GEMM, balanced (times El in the FLOPs)
  f.push_back(fc);
  Op act = b.compute("moe.act", "swiglu", {"moe.fc"}, {"moe.act"});
  b.elem_cost(act, P * F, 6, 3);
  f.push_back(act);
  Op proj = b.compute("moe.proj", "expert_linear", {"moe.act", counts}, {eo}, {"experts.wdown"});
  b.linear_cost(proj, P, F, C);
  proj.attrs["gemm_rows"] = int64_t(P / El);
  f.push_back(proj);
  if (G > 1) {
    Op unsort = b.compute("moe.ep.unsort", "moe_ep_unsort", {"moe.eg", "moe.rcounts"}, {"moe.er"});
    b.elem_cost(unsort, P * C, 0, 2);
    f.push_back(unsort);
    f.push_back(ep_coll(b, "ep.a2a.combine", {"moe.er", "moe.rcounts", "moe.counts"}, "moe.eo", kF * P * C));
  }
  Op aux = b.compute("moe.aux", "moe_aux", {"moe.stats"}, {});
  b.elem_cost(aux, 2 * E, 2, 1);
  f.push_back(aux);
  Op comb = b.compute("moe.combine", "moe_combine", {"moe.eo", "moe.slot", "moe.gate"}, {"mo"});
  b.elem_cost(comb, P * C, 2, 2);
  f.push_back(comb);
}

void moe_bwd(const Builder& b, std::vector<Op>& g) {
  const ModelConfig& m = b.m;
  const int64_t G = b.lay.ep;
  const double N = double(b.Ns), E = double(m.n_experts), P = N * double(m.top_k), C = double(b.C),
               F = double(m.ffn_hidden), El = E / double(G);
  Op comb = b.compute("moe.combine.bwd", "moe_combine_bwd", {"dy", "moe.eo", "moe.slot", "moe.gate"},
                      {"moe.deo", "moe.dgate"});
  b.elem_cost(comb, P * C, 4, 3);
  g.push_back(comb);
  std::string deo = "moe.deo", xs = "moe.xs", counts = "moe.counts", dxs = "moe.dxs";
  if (G > 1) {
    g.push_back(ep_coll(b, "ep.a2a.combine.bwd", {"moe.deo", "moe.counts", "moe.rcounts"}, "moe.der", kF * P * C));
    Op sort = b.compute("moe.ep.sort.bwd", "moe_ep_sort", {"moe.der", "moe.rcounts"}, {"moe.deg"});
    b.elem_cost(sort, P * C, 0, 2);
    g.push_back(sort);
    deo = "moe.deg", xs = "moe.xg", counts = "moe.lcounts", dxs = "moe.dxg";
  }
  auto grouped = [&](Op& op, double in, double out) {
    b.linear_cost(op, P, in, out);
    op.attrs["gemm_rows"] = int64_t(P / El);
  };
  Op pd = b.compute("moe.proj.dgrad", "expert_linear_dgrad", {deo, counts}, {"moe.dact"}, {"experts.wdown"});
  grouped(pd, C, F);
  g.push_back(pd);
  Op pw = b.compute("moe.proj.wgrad", "expert_linear_wgrad", {deo, "moe.act", counts}, {}, {}, {"experts.wdown"});
  grouped(pw, C, F);
  Op ab = b.compute("moe.act.bwd", "swiglu_bwd", {"moe.dact", "moe.fc"}, {"moe.dfc"});
  b.elem_cost(ab, P * F, 10, 3);
  Op fd = b.compute("moe.fc.dgrad", "expert_linear_dgrad", {"moe.dfc", counts}, {dxs}, {"experts.wgu"});
  grouped(fd, 2 * F, C);
  Op fw = b.compute("moe.fc.wgrad", "expert_linear_wgrad", {"moe.dfc", xs, counts}, {}, {}, {"experts.wgu"});
  grouped(fw, 2 * F, C);
  if (G == 1) {  // the single-rank order: each weight gradient right after its input gradient's GEMM
    g.push_back(pw);
    g.push_back(ab);
    g.push_back(fd);
    g.push_back(fw);
  } else {
    // The rows' gradients go back first; both weight-gradient GEMMs, which nothing here waits for,
    // then run while the all-to-all is on the wire.
    g.push_back(ab);
    g.push_back(fd);
    Op unsort = b.compute("moe.ep.unsort.bwd", "moe_ep_unsort", {"moe.dxg", "moe.rcounts"}, {"moe.dxr"});
    b.elem_cost(unsort, P * C, 0, 2);
    g.push_back(unsort);
    g.push_back(ep_coll(b, "ep.a2a.dispatch.bwd", {"moe.dxr", "moe.rcounts", "moe.counts"}, "moe.dxs", kF * P * C));
    g.push_back(pw);
    g.push_back(fw);
  }
  Op rb = b.compute("moe.route.bwd", "moe_route_bwd", {"moe.dgate", "moe.probs", "moe.expert", "moe.gate", "moe.stats"},
                    {"moe.dlogits"});
  b.elem_cost(rb, N * E, 8, 3);
  g.push_back(rb);
  Op rd = b.compute("moe.router.dgrad", "linear_dgrad", {"moe.dlogits"}, {"moe.dh2"}, {"router"});
  b.linear_cost(rd, N, E, C);
  g.push_back(rd);
  Op rw = b.compute("moe.router.wgrad", "linear_wgrad", {"moe.dlogits", "h2"}, {}, {}, {"router"});
  b.linear_cost(rw, N, E, C);
  g.push_back(rw);
  Op db = b.compute("moe.dispatch.bwd", "moe_dispatch_bwd", {"moe.dxs", "moe.slot", "moe.dh2"}, {"dh2"});
  b.elem_cost(db, P * C, 1, 2);
  g.push_back(db);
}

// --- context parallelism: causal ring attention over the cp group ------------------------------
// Each rank holds two of the sequence's 2cp chunks (r and 2cp-1-r: B * Tl local rows, Tl = T / cp).
// The keys and values travel the ring: ring step i computes this rank's queries against the
// keys/values of rank (r - i) mod cp (cp_ring_step: the mask variant and the rows) and merges the
// partial result by its log-sum-exp; the next step's keys/values move (a send_recv on "cp") under
// it. Backward: the keys/values travel the ring again (re-packed from the saved qkv, not kept
// per step), each step adds its share to dQ and to the travelling dK/dV of the keys it saw, which
// follows one step behind (the dK/dV that arrives is added after the step's own GEMMs, so its
// transfer runs under them) and ends at the rank that owns those keys, which adds its own share.
//   fwd: pack kv0 -> [ring kv0 -> kv1] -> step 0 -> [ring kv1 -> kv2] -> step 1 ... -> step cp-1 (att, lse)
//   bwd: pack -> [ring] -> step 0 (own dkv) -> [ring] -> step 1 -> ring dkv1 -> [ring] -> step 2 -> add
//        -> ring dkv2 ... -> finish (dq, own dkv + the dkv that came round)
Op cp_ring(std::string name, const std::string& in, const std::string& out, double elems) {
  Op op;
  op.name = std::move(name);
  op.kind = OpKind::kCollective;
  op.coll = CollOp::kSendRecv;
  op.group = "cp";
  op.code = coll_op_name(CollOp::kSendRecv);
  op.inputs = {in};
  op.outputs = {out};
  op.cost.comm_bytes = elems * kF;
  op.cost.bytes = elems * kF;
  return activation(std::move(op));  // keys and values, or their gradients
}

// The keys/values of the packed qkv rows as the buffer that travels the ring; returns its elements.
double cp_pack(const Builder& b, std::vector<Op>& ops, const std::string& name, const std::string& qkv,
               const std::string& out, const Op& attn) {
  const double kv = double(b.N * 2 * attn.attrs.at("kv_heads") * attn.attrs.at("head_dim"));
  Op pack = b.compute(name, "cp_kv_pack", {qkv}, {out});
  pack.attrs = attn.attrs;
  b.elem_cost(pack, kv, 0, 2);
  ops.push_back(pack);
  return kv;
}

void cp_attention_fwd(const Builder& b, std::vector<Op>& f, const std::string& qkv, const Op& attn) {
  const int cp = b.lay.cp;
  const int64_t D = attn.attrs.at("head_dim");
  const double kv = cp_pack(b, f, "attn.cp.kv", qkv, "cp.kv0", attn);
  for (int i = 0; i < cp; ++i) {
    const std::string si = std::to_string(i), sn = std::to_string(i + 1);
    if (i + 1 < cp) f.push_back(cp_ring("cp.ring.kv." + si, "cp.kv" + si, "cp.kv" + sn, kv));
    std::vector<std::string> in = {qkv, "cp.kv" + si};
    if (i > 0) in.push_back("att.p" + std::to_string(i - 1)), in.push_back("att.lse.p" + std::to_string(i - 1));
    const bool last = i + 1 == cp;
    Op st = b.compute("attn.cp." + si, "ring_attention", in, {last ? "att" : "att.p" + si, last ? "att.lse" : "att.lse.p" + si});
    st.attrs = attn.attrs;
    st.attrs["step"] = i;
    if (i > 0) st.attrs["in_place"] = 1;  // merges into the running output and lse
    // Every step covers B * Tl * Tl / 2 query-key pairs (step 0 causal over Tl, the others Tl x Tl/2).
    st.cost.flops = 2.0 * b.B * double(b.T) * double(b.T) * double(attn.attrs.at("heads")) * double(D);
    st.cost.bytes = attn.cost.bytes;
    f.push_back(st);
  }
}

void cp_attention_bwd(const Builder& b, std::vector<Op>& g, const std::string& qkv, const std::string& dqkv,
                      const Op& attn_b) {
  const int cp = b.lay.cp;
  const int64_t D = attn_b.attrs.at("head_dim");
  const double kv = cp_pack(b, g, "attn.cp.kv.bwd", qkv, "cp.bkv0", attn_b);
  // Step 0's dK/dV (this rank's own keys) stays here; the dK/dV of the keys visiting at step i >= 1
  // starts at their first visitor (step 1), is added to at each later step and, after step cp-1,
  // reaches the owner: cp - 1 moves, as many as the keys make.
  for (int i = 0; i < cp; ++i) {
    const std::string si = std::to_string(i), sn = std::to_string(i + 1);
    if (i + 1 < cp) g.push_back(cp_ring("cp.ring.kv.bwd." + si, "cp.bkv" + si, "cp.bkv" + sn, kv));
    std::vector<std::string> in = {qkv, "cp.bkv" + si, "att", "att.lse", "datt"};
    if (i > 0) in.push_back("cp.dq" + std::to_string(i - 1));
    const std::string dkv_out = i == 0 ? "cp.dkv.own" : i == 1 ? "cp.dkv1" : "cp.dkvc" + si;
    Op st = b.compute("attn.cp.bwd." + si, "ring_attention_bwd", in, {"cp.dq" + si, dkv_out});
    st.attrs = attn_b.attrs;
    st.attrs["step"] = i;
    if (i > 0) st.attrs["in_place"] = 1;  // accumulates into the running dq
    st.cost.flops = 2.5 * 2.0 * b.B * double(b.T) * double(b.T) * double(attn_b.attrs.at("heads")) * double(D);
    st.cost.bytes = attn_b.cost.bytes;
    g.push_back(st);
    if (i >= 2) {
      Op add = b.compute("attn.cp.dkv." + si, "cp_dkv_add", {"cp.dkvr" + si, "cp.dkvc" + si}, {"cp.dkv" + si});
      b.elem_cost(add, kv, 1, 3);
      add.attrs["in_place"] = 1;
      g.push_back(add);
    }
    if (i >= 1) g.push_back(cp_ring("cp.ring.dkv." + si, "cp.dkv" + si, "cp.dkvr" + sn, kv));
  }
  Op fin = b.compute("attn.cp.bwd.end", "cp_ring_bwd_finish",
                     {"cp.dq" + std::to_string(cp - 1), "cp.dkv.own", "cp.dkvr" + std::to_string(cp)}, {dqkv});
  fin.attrs = attn_b.attrs;
  fin.attrs["in_place"] = 1;  // writes dq's k and v columns
  b.elem_cost(fin, kv, 1, 3);
  g.push_back(fin);
}

LayerProgram block_program(const Builder& b) {
  const ModelConfig& m = b.m;
  const bool gpt = m.family == ModelFamily::kGPT;
  const int64_t D = m.head_dim(), Hl = m.n_heads / b.tp, Hkvl = m.n_kv_heads / b.tp, Fl = m.ffn_hidden / b.tp;
  const int64_t qkv_l = (Hl + 2 * Hkvl) * D;
  const std::string n1 = gpt ? "ln1" : "attn_norm", n2 = gpt ? "ln2" : "mlp_norm";
  LayerProgram p;
  p.name = "block";
  auto& f = p.fwd;

  // ---- attention ----
  f.push_back(norm_fwd(b, n1, "x", "h1", n1));
  column_fwd(b, f, "attn.qkv", "h1", "qkv", "wqkv", gpt ? "bqkv" : "", qkv_l);
  std::string qkv_in = "qkv";
  if (!gpt) {
    Op rope = b.compute("attn.rope", "rope", {"qkv"}, {"qkv_r"});
    b.elem_cost(rope, double(b.N * (Hl + Hkvl) * D), 3, 2);
    f.push_back(rope);
    qkv_in = "qkv_r";
  }
  Op attn = b.compute("attn.core", "attention", {qkv_in}, {"att", "att.lse"});
  attn.attrs = {{"heads", Hl}, {"kv_heads", Hkvl}, {"head_dim", D}};
  // QK^T and AV, causal: 2 * 2 * B * T^2 * H * D / 2
  attn.cost.flops = 2.0 * b.B * double(b.T) * double(b.T) * double(Hl) * double(D);
  attn.cost.bytes = kF * double(b.N) * double(qkv_l + Hl * D);
  if (b.lay.cp > 1)
    cp_attention_fwd(b, f, qkv_in, attn);
  else
    f.push_back(attn);
  row_fwd(b, f, "attn.out", "att", "ao", "wo", Hl * D);
  Op res1 = b.compute("attn.residual", "residual_add", {"x", "ao"}, {"x2"}, gpt ? std::vector<std::string>{"bo"}
                                                                             : std::vector<std::string>{});
  b.elem_cost(res1, double(b.Ns * b.C), 1, 3);
  f.push_back(res1);

  // ---- MLP ----
  f.push_back(norm_fwd(b, n2, "x2", "h2", n2));
  if (m.is_moe()) {
    moe_fwd(b, f);
  } else {
    column_fwd(b, f, "mlp.fc", "h2", "fc", gpt ? "wfc" : "wgu", gpt ? "bfc" : "", gpt ? Fl : 2 * Fl);
    Op act = gpt ? b.compute("mlp.act", "gelu", {"fc"}, {"act"}) : b.compute("mlp.act", "swiglu", {"fc"}, {"act"});
    b.elem_cost(act, double(b.N * Fl), gpt ? 10 : 6, gpt ? 2 : 3);
    f.push_back(act);
    row_fwd(b, f, "mlp.proj", "act", "mo", gpt ? "wproj" : "wdown", Fl);
  }
  Op res2 = b.compute("mlp.residual", "residual_add", {"x2", "mo"}, {"y"},
                      gpt ? std::vector<std::string>{"bproj"} : std::vector<std::string>{});
  b.elem_cost(res2, double(b.Ns * b.C), 1, 3);
  f.push_back(res2);

  // ---- backward: dy flows into the MLP branch and, through the residual, to the norm ----
  auto& g = p.bwd;
  if (gpt) {
    Op bg = b.compute("mlp.residual.bwd", "bias_grad", {"dy"}, {}, {}, {"bproj"});
    b.elem_cost(bg, double(b.Ns * b.C), 1, 1);
    g.push_back(bg);
  }
  std::vector<Op> held;
  if (m.is_moe()) {
    moe_bwd(b, g);
  } else {
    held = row_bwd(b, g, "mlp.proj", "act", "dy", "dact", gpt ? "wproj" : "wdown", Fl);
    Op act_b = gpt ? b.compute("mlp.act.bwd", "gelu_bwd", {"dact", "fc"}, {"dfc"})
                   : b.compute("mlp.act.bwd", "swiglu_bwd", {"dact", "fc"}, {"dfc"});
    b.elem_cost(act_b, double(b.N * Fl), gpt ? 20 : 10, 3);
    g.push_back(act_b);
    column_bwd(b, g, "mlp.fc", "h2", "dfc", "dh2", gpt ? "wfc" : "wgu", gpt ? "bfc" : "", gpt ? Fl : 2 * Fl,
               std::move(held));
  }
  g.push_back(norm_bwd(b, n2, "x2", "dh2", "dy", "dx2", n2));
  if (gpt) {
    Op bg = b.compute("attn.residual.bwd", "bias_grad", {"dx2"}, {}, {}, {"bo"});
    b.elem_cost(bg, double(b.Ns * b.C), 1, 1);
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
  const bool defer = b.tp == 1;
  std::vector<Op> deferred;
  held = row_bwd(b, g, "attn.out", "att", "dx2", "datt", "wo", Hl * D, defer);
  Op attn_b = b.compute("attn.core.bwd", "attention_bwd", {qkv_in, "att", "att.lse", "datt"},
                        {gpt ? "dqkv" : "dqkv_r"});
  attn_b.attrs = attn.attrs;
  attn_b.cost.flops = 2.5 * attn.cost.flops;  // dS, dP recompute + dQ, dK, dV
  attn_b.cost.bytes = 2 * attn.cost.bytes;
  if (b.lay.cp > 1)
    cp_attention_bwd(b, g, qkv_in, gpt ? "dqkv" : "dqkv_r", attn_b);
  else
    g.push_back(attn_b);
  if (!gpt) {
    Op rb = b.compute("attn.rope.bwd", "rope_bwd", {"dqkv_r"}, {"dqkv"});
    b.elem_cost(rb, double(b.N * (Hl + Hkvl) * D), 3, 2);
    g.push_back(rb);
  }
  column_bwd(b, g, "attn.qkv", "h1", "dqkv", "dh1", "wqkv", gpt ? "bqkv" : "", qkv_l, std::move(held), &deferred,
             /*defer_held=*/defer, /*split_wgrad=*/b.tp > 1);
  g.push_back(norm_bwd(b, n1, "x", "dh1", "dx2", "dx", n1));
  for (Op& w : deferred) g.push_back(std::move(w));
  return p;
}

LayerProgram embed_program(const Builder& b) {
  const bool gpt = b.m.family == ModelFamily::kGPT;
  LayerProgram p;
  p.name = "embed";
  std::string tok_out = b.tp > 1 ? "e_p" : (gpt ? "e" : "y");
  Op e = b.compute("embed.tok", "embed", {"tokens"}, {tok_out}, {"wte"});
  b.elem_cost(e, double(b.N * b.C), 0, 2);
  p.fwd.push_back(e);
  std::string shard = gpt ? "e" : "y";
  if (b.tp > 1) p.fwd.push_back(activation(b.coll("tp.rs.embed", CollOp::kReduceScatter, "e_p", shard, double(b.N * b.C))));
  if (gpt) {
    Op pe = b.compute("embed.pos", "pos_embed", {"e"}, {"y"}, {"wpe"});
    b.elem_cost(pe, double(b.Ns * b.C), 1, 3);
    p.fwd.push_back(pe);
    Op pb = b.compute("embed.pos.bwd", "pos_embed_bwd", {"dy"}, {}, {}, {"wpe"});
    b.elem_cost(pb, double(b.Ns * b.C), 1, 2);
    p.bwd.push_back(pb);
  }
  std::string dg = "dy";
  if (b.tp > 1) {
    dg = "dy_g";
    p.bwd.push_back(activation(b.coll("tp.ag.embed.bwd", CollOp::kAllGather, "dy", dg, double(b.N * b.C))));
  }
  Op eb = b.compute("embed.tok.bwd", "embed_bwd", {"tokens", dg}, {}, {}, {"wte"});
  b.elem_cost(eb, double(b.N * b.C), 1, 2);
  p.bwd.push_back(eb);
  return p;
}

LayerProgram head_program(const Builder& b) {
  const bool gpt = b.m.family == ModelFamily::kGPT;
  const int64_t Vl = padded_vocab(b.m, int(b.tp)) / b.tp;  // Megatron: the vocabulary over tp
  const std::string w = b.m.tie_embeddings ? "wte" : "lm_head";
  LayerProgram p;
  p.name = "head";
  auto& f = p.fwd;
  f.push_back(norm_fwd(b, "final_norm", "x", "hf", "final_norm"));
  column_fwd(b, f, "lm_head", "hf", "logits", w, "", Vl);
  // Cross-entropy, vocab-parallel when tp > 1: local row max -> all-reduce(max) -> local
  // sum-exp and target logit -> all-reduce(sum) -> loss and dlogits (written over the logits).
  if (b.tp > 1) {
    Op mx = b.compute("xent.max", "xent_max", {"logits"}, {"xent.m"});
    b.elem_cost(mx, double(b.N * Vl), 1, 1);
    f.push_back(mx);
    Op ar1 = b.coll("tp.ar.xent.max", CollOp::kAllReduce, "xent.m", "xent.m", double(b.N));
    ar1.attrs["reduce_max"] = 1;
    f.push_back(ar1);
    Op st = b.compute("xent.stats", "xent_stats", {"logits", "targets", "xent.m"}, {"xent.s"});
    b.elem_cost(st, double(b.N * Vl), 3, 1);
    f.push_back(st);
    f.push_back(b.coll("tp.ar.xent.sum", CollOp::kAllReduce, "xent.s", "xent.s", double(2 * b.N)));
    Op fin = b.compute("xent.loss", "xent_finish", {"logits", "targets", "xent.m", "xent.s"}, {"loss", "dlogits"});
    b.elem_cost(fin, double(b.N * Vl), 4, 2);
    f.push_back(fin);
  } else {
    Op x = b.compute("xent", "cross_entropy", {"logits", "targets"}, {"loss", "dlogits"});
    b.elem_cost(x, double(b.N * Vl), 6, 3);
    f.push_back(x);
  }
  auto& g = p.bwd;
  column_bwd(b, g, "lm_head", "hf", "dlogits", "dhf", w, "", Vl);
  g.push_back(norm_bwd(b, "final_norm", "x", "dhf", "", "dx", "final_norm"));
  (void)gpt;
  return p;
}

}  // namespace

ModelPrograms build_programs(const ModelConfig& m, const LayoutConfig& lay, const MicroBatchShape& mb) {
  DHX_CHECK(!(lay.cp > 1 && lay.is_3d()), ConfigError,
            "context parallelism (parallel.cp={}) does not run on the 3D grid (tp_x={} tp_y={} tp_z={}); use tp with cp",
            lay.cp, lay.tp_x, lay.tp_y, lay.tp_z);
  DHX_CHECK(!(m.is_moe() && lay.is_3d()), ConfigError,
            "model.family=moe does not run on the 3D grid (tp_x={} tp_y={} tp_z={}) in this build; use tp, dp and ep",
            lay.tp_x, lay.tp_y, lay.tp_z);
  if (lay.is_3d()) return detail::build_programs_3d(m, lay, mb);
  DHX_CHECK(lay.cp == 1 || (!m.is_moe() && mb.T % 2 == 0), ConfigError,
            "context parallelism (parallel.cp={}) needs a dense model (family={}) and an even number of local rows per "
            "sequence (T/cp = {}): model.seq_len divisible by 2*cp",
            lay.cp, family_name(m.family), mb.T);
  Builder b{m, lay, mb.B, mb.T, mb.tokens(), 0, m.d_model, lay.tp};
  DHX_CHECK(b.N % lay.tp == 0, ConfigError, "micro-batch tokens {} (B={} x T={}) are not divisible by parallel.tp={}",
            b.N, mb.B, mb.T, lay.tp);
  b.Ns = b.N / lay.tp;
  ModelPrograms out{embed_program(b), block_program(b), head_program(b)};
  for (LayerProgram* p : {&out.embed, &out.block, &out.head}) annotate_lifetimes(*p, boundary_buffers());
  return out;
}

}  // namespace dhelix
