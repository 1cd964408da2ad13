// The 3D grid's regions (Grid3D.h): the op lists of a grid linear (gather, GEMM, all-reduce,
// reduce-scatter) and of the norm exact over x. The layer programs are Lowering3D.cc's.
#include "sharding/Grid3D.h"

namespace dhelix::sharding {

// The all-gather of a weight block over z ("" when tp_z = 1: the GEMM reads the shard).
std::string gather_block(const Grid3D& b, std::vector<Op>& ops, const GridLinear& l, const std::string& suffix,
                         CollWait wait) {
  if (b.gz == 1) return "";
  const std::string buf = l.w + ".g" + suffix;
  // With OAG a block is gathered a GEMM ahead of its use (kBackground): only that GEMM waits for it,
  // not the end of the SI block it was issued in (as the weight-gradient reduce-scatters:
  // Executor::run_op), so under Strand Interleaving the z gathers run beside the other strand's
  // x / y all-reduces.
  Op ag = collective_op("z.ag." + l.tag + suffix, CollOp::kAllGather, "z", {}, buf, kF * double(l.rows * l.cols), wait);
  ag.params = {l.w};
  ops.push_back(ag);
  return buf;
}

// OAG across layers: the neighbouring block's (`dir` +1 forward, -1 backward) all-gather of `l`'s
// weight, issued here and adopted by that block's own all-gather op (runtime Executor). Its bytes
// are the adopting op's (comm_bytes 0 here, so a step's volume counts each gather once); where the
// neighbour is not a block (the head, the embedding) the executor issues nothing.
void prefetch_block(const Grid3D& b, std::vector<Op>& ops, const GridLinear& l, const std::string& suffix, int dir) {
  if (b.gz == 1 || !b.lay.overlap3d.ag) return;
  Op ag = collective_op(std::string(dir > 0 ? "z.ag.next." : "z.ag.prev.") + l.tag + suffix, CollOp::kAllGather,
                        "z", {}, l.w + ".g" + suffix + ".next", 0);
  ag.params = {l.w};
  ag.attrs["prefetch_unit"] = dir;
  ops.push_back(ag);
}

// fwd: GEMM -> all-reduce over x (A) / y (B) -> bias. Writes `out`.
void grid_linear_fwd(const Grid3D& b, std::vector<Op>& ops, const GridLinear& l, const std::string& in, const std::string& wbuf,
              const std::string& out) {
  const bool reduce = b.group_size(l.fwd_group()) > 1;
  const std::string summed = l.bias.empty() ? out : out + "_s";
  const std::string partial = reduce ? out + "_p" : summed;
  std::vector<std::string> ins = {in};
  if (!wbuf.empty()) ins.push_back(wbuf);
  Op g = compute_op(l.tag, "linear3d", ins, {partial}, {l.w});
  g.attrs = {{"w_rows", l.rows}, {"w_cols", l.cols}};
  gemm_cost(g, double(b.N), double(l.cols), double(l.rows));
  ops.push_back(g);
  if (reduce)
    ops.push_back(activation(collective_op(l.fwd_group() + ".ar." + l.tag, CollOp::kAllReduce, l.fwd_group(), {partial},
                                    summed, kF * double(b.N * l.rows))));
  if (!l.bias.empty()) {
    Op ba = compute_op(l.tag + ".bias", "bias_add", {summed}, {out}, {l.bias});
    elem_cost(ba, double(b.N * l.rows), 1, 2);
    ops.push_back(ba);
  }
}

// bwd: [bias grad] -> dgrad -> all-reduce over y (A) / x (B) [blocking without OAR] -> wgrad ->
// reduce-scatter over z [blocking without ORS] -> grad_accum (into `accum`: the end of the layer's
// backward with ORS, else right here). Writes `d_in`.
void grid_linear_bwd(const Grid3D& b, std::vector<Op>& ops, const GridLinear& l, const std::string& in, const std::string& d_out,
              const std::string& d_in, const std::string& wbuf, std::vector<Op>& accum) {
  const TP3DOverlaps& ov = b.lay.overlap3d;
  if (!l.bias.empty()) {
    Op bg = compute_op(l.tag + ".bias.bwd", "bias_grad", {d_out}, {}, {}, {l.bias});
    elem_cost(bg, double(b.N * l.rows), 1, 1);
    ops.push_back(bg);
  }
  const bool reduce = b.group_size(l.bwd_group()) > 1;
  const std::string partial = reduce ? d_in + "_p" : d_in;
  std::vector<std::string> ins = {d_out};
  if (!wbuf.empty()) ins.push_back(wbuf);
  Op dg = compute_op(l.tag + ".dgrad", "linear3d_dgrad", ins, {partial}, {l.w});
  dg.attrs = {{"w_rows", l.rows}, {"w_cols", l.cols}};
  gemm_cost(dg, double(b.N), double(l.rows), double(l.cols));
  ops.push_back(dg);
  if (reduce)
    ops.push_back(activation(collective_op(l.bwd_group() + ".ar." + l.tag + ".bwd", CollOp::kAllReduce, l.bwd_group(),
                                    {partial}, d_in, kF * double(b.N * l.cols),
                                           ov.ar ? CollWait::kBlockEnd : CollWait::kBlocking)));
  Op wg = compute_op(l.tag + ".wgrad", "linear3d_wgrad", {d_out, in}, {}, {}, {l.w});
  wg.attrs = {{"w_rows", l.rows}, {"w_cols", l.cols}};
  gemm_cost(wg, double(b.N), double(l.rows), double(l.cols));
  if (b.gz == 1) {
    ops.push_back(wg);
    return;
  }
  const std::string dw = "dw." + l.tag;
  wg.outputs = {dw};
  wg.grads.clear();
  ops.push_back(wg);
  Op rs = collective_op("z.rs." + l.tag, CollOp::kReduceScatter, "z", {dw}, dw + ".s", kF * double(l.rows * l.cols),
                        // with ORS not waited for at its SI block's end (Executor::run_op)
                        ov.rs ? CollWait::kBackground : CollWait::kBlocking);
  if (ov.accumulate_z) rs.attrs["last_micro_batch"] = 1;  // earlier micro-batches add dw to a block sum
  ops.push_back(rs);
  Op acc = compute_op(l.tag + ".wgrad.accum", "grad_accum", {dw + ".s"}, {}, {}, {l.w});
  elem_cost(acc, double(l.rows * l.cols / b.gz), 1, 3);
  (ov.rs ? accum : ops).push_back(acc);
}

// Exact norm over the features split on x: statistics -> all-reduce over x -> application.
void grid_norm_fwd(const Grid3D& b, std::vector<Op>& ops, const UnitStep& s) {
  const bool gpt = s.fn == "layernorm";
  const std::string &tag = s.tag, &in = s.in.at(0), &out = s.out;
  const int64_t Cl = b.C / b.gx;
  if (b.gx == 1) {  // whole rows: the single-process kernels
    Op op = gpt ? compute_op(tag, "layernorm", {in}, {out, tag + ".mean", tag + ".rstd"},
                            {s.weight, s.bias})
                : compute_op(tag, "rmsnorm", {in}, {out, tag + ".rstd"}, {s.weight});
    elem_cost(op, double(b.N * Cl), 5, 2);
    ops.push_back(op);
    return;
  }
  Op st = compute_op(tag + ".stats", gpt ? "ln_stats" : "rms_stats", {in}, {tag + ".st"});
  elem_cost(st, double(b.N * Cl), 2, 1);
  ops.push_back(st);
  ops.push_back(collective_op("x.ar." + tag, CollOp::kAllReduce, "x", {tag + ".st"}, tag + ".st", 8.0 * double(b.N * (gpt ? 2 : 1))));
  Op ap = gpt ? compute_op(tag, "ln_apply", {in, tag + ".st"}, {out, tag + ".mean", tag + ".rstd"},
                          {s.weight, s.bias})
              : compute_op(tag, "rms_apply", {in, tag + ".st"}, {out, tag + ".rstd"}, {s.weight});
  ap.attrs["features"] = b.C;
  elem_cost(ap, double(b.N * Cl), 4, 2);
  ops.push_back(ap);
}

void grid_norm_bwd(const Grid3D& b, std::vector<Op>& ops, const UnitStep& s, const std::string& d_out,
                   const std::string& d_res, const std::string& d_in) {
  const bool gpt = s.fn == "layernorm";
  const std::string &tag = s.tag, &in = s.in.at(0);
  const int64_t Cl = b.C / b.gx;
  std::vector<std::string> saved = {in};
  if (gpt) saved.push_back(tag + ".mean");
  saved.push_back(tag + ".rstd");
  std::vector<std::string> grads = {s.weight};
  if (gpt) grads.push_back(s.bias);
  if (b.gx == 1) {
    std::vector<std::string> inputs = {d_out};
    inputs.insert(inputs.end(), saved.begin(), saved.end());
    if (!d_res.empty()) inputs.push_back(d_res);
    Op op = compute_op(tag + ".bwd", gpt ? "layernorm_bwd" : "rmsnorm_bwd", inputs, {d_in}, {s.weight}, grads);
    op.attrs["residual"] = d_res.empty() ? 0 : 1;
    elem_cost(op, double(b.N * Cl), 10, 4);
    ops.push_back(op);
    return;
  }
  std::vector<std::string> sin = {d_out};
  sin.insert(sin.end(), saved.begin(), saved.end());
  Op st = compute_op(tag + ".bwd.stats", gpt ? "ln_bwd_stats" : "rms_bwd_stats", sin, {tag + ".bst"},
                    {s.weight});
  elem_cost(st, double(b.N * Cl), 4, 2);
  ops.push_back(st);
  ops.push_back(collective_op("x.ar." + tag + ".bwd", CollOp::kAllReduce, "x", {tag + ".bst"}, tag + ".bst",
                       8.0 * double(b.N * (gpt ? 2 : 1))));
  std::vector<std::string> ain = sin;
  ain.push_back(tag + ".bst");
  if (!d_res.empty()) ain.push_back(d_res);
  Op ap = compute_op(tag + ".bwd", gpt ? "ln_bwd_apply" : "rms_bwd_apply", ain, {d_in}, {s.weight}, grads);
  ap.attrs["features"] = b.C;
  ap.attrs["residual"] = d_res.empty() ? 0 : 1;
  elem_cost(ap, double(b.N * Cl), 8, 4);
  ops.push_back(ap);
}

}  // namespace dhelix::sharding
