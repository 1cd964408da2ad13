// The ring-attention steps of context parallelism (CpRing.h): the pack, ring moves and steps of the
// forward and backward strands. The ring kernels' math is kernels/'s, the moves the executor's.
#include "sharding/CpRing.h"

#include "sharding/OpFactory.h"

namespace dhelix::sharding {

namespace {

// One ring move of keys and values (or their gradients) to the next cp rank.
Op cp_ring(std::string name, const std::string& in, const std::string& out, double elems) {
  return activation(collective_op(std::move(name), CollOp::kSendRecv, "cp", {in}, out, elems * kF));
}

// The keys/values of the packed qkv rows as the buffer that travels the ring; returns its elements.
double cp_pack(const TpRegion& b, std::vector<Op>& ops, const std::string& name, const std::string& qkv,
               const std::string& out, const Op& attn) {
  const double kv = double(b.N * 2 * attn.attrs.at("kv_heads") * attn.attrs.at("head_dim"));
  Op pack = compute_op(name, "cp_kv_pack", {qkv}, {out});
  pack.attrs = attn.attrs;
  elem_cost(pack, kv, 0, 2);
  ops.push_back(pack);
  return kv;
}

}  // namespace

void cp_attention_fwd(const TpRegion& b, std::vector<Op>& f, const std::string& qkv, const Op& attn) {
  const int cp = b.lay.cp;
  const int64_t D = attn.attrs.at("head_dim");
  const double kv = cp_pack(b, f, "attn.cp.kv", qkv, "cp.kv0", attn);
  for (int i = 0; i < cp; ++i) {
    const std::string si = std::to_string(i), sn = std::to_string(i + 1);
    if (i + 1 < cp) f.push_back(cp_ring("cp.ring.kv." + si, "cp.kv" + si, "cp.kv" + sn, kv));
    std::vector<std::string> in = {qkv, "cp.kv" + si};
    if (i > 0) in.push_back("att.p" + std::to_string(i - 1)), in.push_back("att.lse.p" + std::to_string(i - 1));
    const bool last = i + 1 == cp;
    Op st = compute_op("attn.cp." + si, "ring_attention", in, {last ? "att" : "att.p" + si, last ? "att.lse" : "att.lse.p" + si});
    st.attrs = attn.attrs;
    st.attrs["step"] = i;
    if (i > 0) st.attrs["in_place"] = 1;  // merges into the running output and lse
    // Every step covers B * Tl * Tl / 2 query-key pairs (step 0 causal over Tl, the others Tl x Tl/2).
    st.cost.flops = 2.0 * b.B * double(b.T) * double(b.T) * double(attn.attrs.at("heads")) * double(D);
    st.cost.bytes = attn.cost.bytes;
    f.push_back(st);
  }
}

void cp_attention_bwd(const TpRegion& b, std::vector<Op>& g, const std::string& qkv, const std::string& dqkv,
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
    Op st = compute_op("attn.cp.bwd." + si, "ring_attention_bwd", in, {"cp.dq" + si, dkv_out});
    st.attrs = attn_b.attrs;
    st.attrs["step"] = i;
    if (i > 0) st.attrs["in_place"] = 1;  // accumulates into the running dq
    st.cost.flops = 2.5 * 2.0 * b.B * double(b.T) * double(b.T) * double(attn_b.attrs.at("heads")) * double(D);
    st.cost.bytes = attn_b.cost.bytes;
    g.push_back(st);
    if (i >= 2) {
      Op add = compute_op("attn.cp.dkv." + si, "cp_dkv_add", {"cp.dkvr" + si, "cp.dkvc" + si}, {"cp.dkv" + si});
      elem_cost(add, kv, 1, 3);
      add.attrs["in_place"] = 1;
      g.push_back(add);
    }
    if (i >= 1) g.push_back(cp_ring("cp.ring.dkv." + si, "cp.dkv" + si, "cp.dkvr" + sn, kv));
  }
  Op fin = compute_op("attn.cp.bwd.end", "cp_ring_bwd_finish",
                     {"cp.dq" + std::to_string(cp - 1), "cp.dkv.own", "cp.dkvr" + std::to_string(cp)}, {dqkv});
  fin.attrs = attn_b.attrs;
  fin.attrs["in_place"] = 1;  // writes dq's k and v columns
  elem_cost(fin, kv, 1, 3);
  g.push_back(fin);
}

}  // namespace dhelix::sharding
