// The MoE MLP's ops with expert parallelism's dispatch/combine all-to-alls (ExpertDispatch.h), and
// their costs under balanced routing. The routing kernels are kernels/'s.
#include "sharding/ExpertDispatch.h"

#include "sharding/OpFactory.h"

namespace dhelix::sharding {

namespace {

// An all-to-all over "ep": the rows (inputs: rows, send counts, receive counts) or the counts.
Op ep_coll(const TpRegion& b, std::string name, std::vector<std::string> in, const std::string& out, double bytes) {
  Op op = b.coll(std::move(name), CollOp::kAllToAll, in.at(0), out, bytes / kF);
  op.group = "ep";
  const bool rows = in.size() == 3;  // the rows, not the token counts
  op.inputs = std::move(in);
  return rows ? activation(std::move(op)) : op;
}

}  // namespace

void moe_fwd(const TpRegion& b, std::vector<Op>& f, const std::string& in, const std::string& out) {
  const ModelConfig& m = b.m;
  const int64_t G = b.lay.ep;
  const double N = double(b.Ns), E = double(m.n_experts), P = N * double(m.top_k), C = double(b.C),
               F = double(m.ffn_hidden), El = E / double(G);
  Op router = compute_op("moe.router", "linear", {in}, {"moe.logits"}, {"router"});
  gemm_cost(router, N, C, E);
  f.push_back(router);
  Op route = compute_op("moe.route", "moe_route", {"moe.logits"},
                       {"moe.probs", "moe.expert", "moe.gate", "moe.counts", "moe.order", "moe.slot", "moe.stats"});
  elem_cost(route, N * E, 8, 3);
  f.push_back(route);
  // The load-balancing loss is over the whole micro-batch: under tp each rank routes its sequence
  // shard (on the 3D grid its slice of the plane's tokens), so the per-expert counts and probability
  // sums ("moe.stats", 2E floats) are summed over tp (the plane, "xy"); the sum runs under the expert
  // GEMMs and is read by moe.aux (forward) and moe.route.bwd.
  if (b.tp > 1) f.push_back(b.coll(b.group + ".ar.moe.stats", CollOp::kAllReduce, "moe.stats", "moe.stats", 2 * E));
  // Under context parallelism each cp rank routes its chunks of the same sequences: summed over cp
  // too, so the loss and its gradient are the whole micro-batch's (moe.aux records them on cp rank 0
  // only: the step's statistics are then summed over cp).
  if (b.lay.cp > 1)
    f.push_back(collective_op("cp.ar.moe.stats", CollOp::kAllReduce, "cp", {"moe.stats"}, "moe.stats", 2 * E * kF));
  if (G > 1) f.push_back(ep_coll(b, "ep.a2a.counts", {"moe.counts"}, "moe.rcounts", 4 * E));
  Op disp = compute_op("moe.dispatch", "moe_dispatch", {in, "moe.order"}, {"moe.xs"});
  elem_cost(disp, P * C, 0, 2);
  f.push_back(disp);
  std::string xs = "moe.xs", counts = "moe.counts", eo = "moe.eo";
  if (G > 1) {
    f.push_back(ep_coll(b, "ep.a2a.dispatch", {"moe.xs", "moe.counts", "moe.rcounts"}, "moe.xr", kF * P * C));
    Op sort = compute_op("moe.ep.sort", "moe_ep_sort", {"moe.xr", "moe.rcounts"}, {"moe.xg", "moe.lcounts"});
    elem_cost(sort, P * C, 0, 2);
    f.push_back(sort);
    xs = "moe.xg", counts = "moe.lcounts", eo = "moe.eg";
  }
  Op fc = compute_op("moe.fc", "expert_linear", {xs, counts}, {"moe.fc"}, {"experts.wgu"});
  gemm_cost(fc, P, C, 2 * F);
  fc.attrs["gemm_rows"] = int64_t(P / El);  // one expert's GEMM, balanced (times El in the FLOPs)
  f.push_back(fc);
  Op act = compute_op("moe.act", "swiglu", {"moe.fc"}, {"moe.act"});
  elem_cost(act, P * F, 6, 3);
  f.push_back(act);
  Op proj = compute_op("moe.proj", "expert_linear", {"moe.act", counts}, {eo}, {"experts.wdown"});
  gemm_cost(proj, P, F, C);
  proj.attrs["gemm_rows"] = int64_t(P / El);
  f.push_back(proj);
  if (G > 1) {
    Op unsort = compute_op("moe.ep.unsort", "moe_ep_unsort", {"moe.eg", "moe.rcounts"}, {"moe.er"});
    elem_cost(unsort, P * C, 0, 2);
    f.push_back(unsort);
    f.push_back(ep_coll(b, "ep.a2a.combine", {"moe.er", "moe.rcounts", "moe.counts"}, "moe.eo", kF * P * C));
  }
  Op aux = compute_op("moe.aux", "moe_aux", {"moe.stats"}, {});
  elem_cost(aux, 2 * E, 2, 1);
  f.push_back(aux);
  Op comb = compute_op("moe.combine", "moe_combine", {"moe.eo", "moe.slot", "moe.gate"}, {out});
  elem_cost(comb, P * C, 2, 2);
  f.push_back(comb);
}

void moe_bwd(const TpRegion& b, std::vector<Op>& g, const std::string& in, const std::string& d_out,
             const std::string& d_in) {
  const ModelConfig& m = b.m;
  const int64_t G = b.lay.ep;
  const double N = double(b.Ns), E = double(m.n_experts), P = N * double(m.top_k), C = double(b.C),
               F = double(m.ffn_hidden), El = E / double(G);
  Op comb = compute_op("moe.combine.bwd", "moe_combine_bwd", {d_out, "moe.eo", "moe.slot", "moe.gate"},
                      {"moe.deo", "moe.dgate"});
  elem_cost(comb, P * C, 4, 3);
  g.push_back(comb);
  std::string deo = "moe.deo", xs = "moe.xs", counts = "moe.counts", dxs = "moe.dxs";
  if (G > 1) {
    g.push_back(ep_coll(b, "ep.a2a.combine.bwd", {"moe.deo", "moe.counts", "moe.rcounts"}, "moe.der", kF * P * C));
    Op sort = compute_op("moe.ep.sort.bwd", "moe_ep_sort", {"moe.der", "moe.rcounts"}, {"moe.deg"});
    elem_cost(sort, P * C, 0, 2);
    g.push_back(sort);
    deo = "moe.deg", xs = "moe.xg", counts = "moe.lcounts", dxs = "moe.dxg";
  }
  auto grouped = [&](Op& op, double in, double out) {
    gemm_cost(op, P, in, out);
    op.attrs["gemm_rows"] = int64_t(P / El);
  };
  Op pd = compute_op("moe.proj.dgrad", "expert_linear_dgrad", {deo, counts}, {"moe.dact"}, {"experts.wdown"});
  grouped(pd, C, F);
  g.push_back(pd);
  Op pw = compute_op("moe.proj.wgrad", "expert_linear_wgrad", {deo, "moe.act", counts}, {}, {}, {"experts.wdown"});
  grouped(pw, C, F);
  Op ab = compute_op("moe.act.bwd", "swiglu_bwd", {"moe.dact", "moe.fc"}, {"moe.dfc"});
  elem_cost(ab, P * F, 10, 3);
  Op fd = compute_op("moe.fc.dgrad", "expert_linear_dgrad", {"moe.dfc", counts}, {dxs}, {"experts.wgu"});
  grouped(fd, 2 * F, C);
  Op fw = compute_op("moe.fc.wgrad", "expert_linear_wgrad", {"moe.dfc", xs, counts}, {}, {}, {"experts.wgu"});
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
    Op unsort = compute_op("moe.ep.unsort.bwd", "moe_ep_unsort", {"moe.dxg", "moe.rcounts"}, {"moe.dxr"});
    elem_cost(unsort, P * C, 0, 2);
    g.push_back(unsort);
    g.push_back(ep_coll(b, "ep.a2a.dispatch.bwd", {"moe.dxr", "moe.rcounts", "moe.counts"}, "moe.dxs", kF * P * C));
    g.push_back(pw);
    g.push_back(fw);
  }
  Op rb = compute_op("moe.route.bwd", "moe_route_bwd", {"moe.dgate", "moe.probs", "moe.expert", "moe.gate", "moe.stats"},
                    {"moe.dlogits"});
  elem_cost(rb, N * E, 8, 3);
  g.push_back(rb);
  Op rd = compute_op("moe.router.dgrad", "linear_dgrad", {"moe.dlogits"}, {"moe.dh2"}, {"router"});
  gemm_cost(rd, N, E, C);
  g.push_back(rd);
  Op rw = compute_op("moe.router.wgrad", "linear_wgrad", {"moe.dlogits", in}, {}, {}, {"router"});
  gemm_cost(rw, N, E, C);
  g.push_back(rw);
  Op db = compute_op("moe.dispatch.bwd", "moe_dispatch_bwd", {"moe.dxs", "moe.slot", "moe.dh2"}, {d_in});
  elem_cost(db, P * C, 1, 2);
  g.push_back(db);
}

}  // namespace dhelix::sharding
