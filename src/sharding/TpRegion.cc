// Megatron's tp regions (TpRegion.h): the op lists of each forward/backward pair, with their GEMM
// extents and collective bytes. The layer programs that chain them are Lowering1D.cc's.
#include "sharding/TpRegion.h"

#include "base/Error.h"
#include "sharding/OpFactory.h"

namespace dhelix::sharding {

Op TpRegion::coll(std::string name, CollOp c, const std::string& in, const std::string& out,
                  double elems_full) const {
  return collective_op(std::move(name), c, group, {in}, out, elems_full * kF);
}

void column_fwd(const TpRegion& b, std::vector<Op>& ops, const TpLinear& l, const std::string& in,
                const std::string& out) {
  std::string g = in;
  if (b.tp > 1) {
    g = in + "_g";
    ops.push_back(activation(b.coll("tp.ag." + l.tag, CollOp::kAllGather, in, g, double(b.N * b.C))));
  }
  std::vector<std::string> params = {l.w};
  if (!l.bias.empty()) params.push_back(l.bias);
  Op op = compute_op(l.tag, "linear", {g}, {out}, params);
  gemm_cost(op, double(b.N), double(b.C), double(l.local));
  if (l.tag == "lm_head") op.attrs["vocab_rows"] = 1;
  ops.push_back(op);
}

// `held`: weight-gradient ops of earlier GEMMs held back to run here, after the reduce-scatter,
// ahead of this GEMM's own wgrad (see row_bwd); with own = kDefer they go to `deferred` instead.
// kSplit: the weight gradient is cut in two ops over the halves of the weight's rows,
// "<tag>.wgrad.0" into ops (after the held ones) and "<tag>.wgrad.1" into deferred: the first adds
// cover for the reduce-scatter, the second stays a trailing op. Together they compute exactly what
// the one op would.
void column_bwd(const TpRegion& b, std::vector<Op>& ops, const TpLinear& l, const std::string& in,
                const std::string& d_out, const std::string& d_in, WgradPolicy own, std::vector<Op> held,
                std::vector<Op>* deferred) {
  DHX_ASSERT(own == WgradPolicy::kInline || own == WgradPolicy::kDefer || own == WgradPolicy::kSplit,
             "column_bwd {}: wgrad policy {} is a row region's", l.tag, int(own));
  DHX_ASSERT(own == WgradPolicy::kInline || deferred, "column_bwd {}: a deferred wgrad needs the trailing list",
             l.tag);
  const std::string g = b.tp > 1 ? in + "_g" : in;
  const std::string dg = b.tp > 1 ? d_in + "_g" : d_in;
  Op dgrad = compute_op(l.tag + ".dgrad", "linear_dgrad", {d_out}, {dg}, {l.w});
  gemm_cost(dgrad, double(b.N), double(l.local), double(b.C));
  std::vector<std::string> grads = {l.w};
  if (!l.bias.empty()) grads.push_back(l.bias);
  Op wgrad = compute_op(l.tag + ".wgrad", "linear_wgrad", {d_out, g}, {}, {}, grads);
  gemm_cost(wgrad, double(b.N), double(l.local), double(b.C));
  if (l.tag == "lm_head") dgrad.attrs["vocab_rows"] = wgrad.attrs["vocab_rows"] = 1;
  ops.push_back(dgrad);
  // With tp > 1 the input-gradient reduce-scatter goes out before the weight-gradient GEMM, which
  // does not need it: the collective then also runs under this strand's wgrad (Megatron's
  // dgrad-RS / wgrad overlap), not only under the other strand's compute.
  if (b.tp > 1)
    ops.push_back(activation(b.coll("tp.rs." + l.tag + ".bwd", CollOp::kReduceScatter, dg, d_in, double(b.N * b.C))));
  for (Op& h : held) (own == WgradPolicy::kDefer ? *deferred : ops).push_back(std::move(h));
  if (own == WgradPolicy::kSplit && l.local >= 2) {
    // The cut falls on a multiple of 96 rows when the weight has enough (a whole row tile of every
    // OpenBLAS sgemm kernel measured, so the pieces equal the unsplit op bitwise); a small weight is
    // cut at its half (equal within rounding).
    const int64_t half = l.local / 2 >= 96 ? l.local / 2 / 96 * 96 : l.local / 2;
    for (int part = 0; part < 2; ++part) {
      const int64_t lo = part == 0 ? 0 : half, hi = part == 0 ? half : l.local;
      Op piece = wgrad;
      piece.name = l.tag + ".wgrad." + std::to_string(part);
      piece.attrs["rows_lo"] = lo;
      piece.attrs["rows_hi"] = hi;
      gemm_cost(piece, double(b.N), double(hi - lo), double(b.C));
      (part == 0 ? ops : *deferred).push_back(std::move(piece));
    }
    return;
  }
  (own == WgradPolicy::kInline ? ops : *deferred).push_back(wgrad);
}

void row_fwd(const TpRegion& b, std::vector<Op>& ops, const TpLinear& l, const std::string& in,
             const std::string& out) {
  const std::string partial = b.tp > 1 ? out + "_p" : out;
  Op op = compute_op(l.tag, "linear", {in}, {partial}, {l.w});
  gemm_cost(op, double(b.N), double(l.local), double(b.C));
  ops.push_back(op);
  if (b.tp > 1)
    ops.push_back(activation(b.coll("tp.rs." + l.tag, CollOp::kReduceScatter, partial, out, double(b.N * b.C))));
}

// A held weight-gradient GEMM runs after the next column GEMM's input-gradient reduce-scatter:
// there the backward strand has two weight-gradient GEMMs in a row — enough compute to hide both
// that reduce-scatter and a collective of the forward strand beside it under Strand Interleaving.
std::vector<Op> row_bwd(const TpRegion& b, std::vector<Op>& ops, const TpLinear& l, const std::string& in,
                        const std::string& d_out, const std::string& d_in, WgradPolicy own) {
  DHX_ASSERT(own == WgradPolicy::kInline || own == WgradPolicy::kHold || own == WgradPolicy::kHoldIfTp,
             "row_bwd {}: wgrad policy {} is a column region's", l.tag, int(own));
  std::string dg = d_out;
  if (b.tp > 1) {
    dg = d_out + "_g";
    ops.push_back(activation(b.coll("tp.ag." + l.tag + ".bwd", CollOp::kAllGather, d_out, dg, double(b.N * b.C))));
  }
  Op dgrad = compute_op(l.tag + ".dgrad", "linear_dgrad", {dg}, {d_in}, {l.w});
  gemm_cost(dgrad, double(b.N), double(b.C), double(l.local));
  Op wgrad = compute_op(l.tag + ".wgrad", "linear_wgrad", {dg, in}, {}, {}, {l.w});
  gemm_cost(wgrad, double(b.N), double(b.C), double(l.local));
  ops.push_back(dgrad);
  if (own == WgradPolicy::kHold || (own == WgradPolicy::kHoldIfTp && b.tp > 1)) return {wgrad};
  ops.push_back(wgrad);
  return {};
}

void vocab_embed_fwd(const TpRegion& b, std::vector<Op>& ops, const std::string& out) {
  const std::string part = b.tp > 1 ? "e_p" : out;
  Op e = compute_op("embed.tok", "embed", {"tokens"}, {part}, {"wte"});
  elem_cost(e, double(b.N * b.C), 0, 2);
  ops.push_back(e);
  if (b.tp > 1) ops.push_back(activation(b.coll("tp.rs.embed", CollOp::kReduceScatter, part, out, double(b.N * b.C))));
}

void vocab_embed_bwd(const TpRegion& b, std::vector<Op>& ops, const std::string& d_out) {
  std::string dg = d_out;
  if (b.tp > 1) {
    dg = d_out + "_g";
    ops.push_back(activation(b.coll("tp.ag.embed.bwd", CollOp::kAllGather, d_out, dg, double(b.N * b.C))));
  }
  Op eb = compute_op("embed.tok.bwd", "embed_bwd", {"tokens", dg}, {}, {}, {"wte"});
  elem_cost(eb, double(b.N * b.C), 1, 2);
  ops.push_back(eb);
}

void vocab_xent_fwd(const TpRegion& b, std::vector<Op>& f, int64_t Vl) {
  if (b.tp == 1) {
    Op x = compute_op("xent", "cross_entropy", {"logits", "targets"}, {"loss", "dlogits"});
    elem_cost(x, double(b.N * Vl), 6, 3);
    f.push_back(x);
    return;
  }
  Op mx = compute_op("xent.max", "xent_max", {"logits"}, {"xent.m"});
  elem_cost(mx, double(b.N * Vl), 1, 1);
  f.push_back(mx);
  Op ar1 = b.coll("tp.ar.xent.max", CollOp::kAllReduce, "xent.m", "xent.m", double(b.N));
  ar1.attrs["reduce_max"] = 1;
  f.push_back(ar1);
  Op st = compute_op("xent.stats", "xent_stats", {"logits", "targets", "xent.m"}, {"xent.s"});
  elem_cost(st, double(b.N * Vl), 3, 1);
  f.push_back(st);
  f.push_back(b.coll("tp.ar.xent.sum", CollOp::kAllReduce, "xent.s", "xent.s", double(2 * b.N)));
  Op fin = compute_op("xent.loss", "xent_finish", {"logits", "targets", "xent.m", "xent.s"}, {"loss", "dlogits"});
  elem_cost(fin, double(b.N * Vl), 4, 2);
  f.push_back(fin);
}

}  // namespace dhelix::sharding
