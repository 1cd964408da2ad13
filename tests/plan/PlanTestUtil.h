// Hand-built layer programs and cost tables for the plan tests. Nothing here depends on
// src/model: programs are spelled as strings ("c tp c c cp c": compute ops and collectives on
// named groups) or built to the Llama-style shape of reference/dhelix.md §3.4.
#pragma once
#include <cmath>
#include <cstdint>
#include <sstream>
#include <string>

#include "plan/BlockCost.h"
#include "plan/Program.h"

namespace dhelix::test {

// "c" = compute op, anything else = a collective (all-gather) on that group.
inline std::vector<Op> strand_from(const std::string& spec, const std::string& prefix) {
  std::vector<Op> ops;
  std::istringstream in(spec);
  std::string tok;
  while (in >> tok) {
    Op op;
    op.name = prefix + std::to_string(ops.size());
    if (tok == "c") {
      op.code = "compute";
      op.cost.flops = 1e9;
    } else {
      op.name += "." + tok;
      op.code = "all_gather";
      op.kind = OpKind::kCollective;
      op.coll = CollOp::kAllGather;
      op.group = tok;
      op.cost.comm_bytes = 1e6;
    }
    ops.push_back(op);
  }
  return ops;
}

inline LayerProgram program_from(const std::string& fwd, const std::string& bwd) {
  return LayerProgram{"block", strand_from(fwd, "f"), strand_from(bwd, "b")};
}

// A deterministic pseudo-random price table keyed by (seed, window(s)): single-op solo windows
// are always priced; longer solo windows and pairs are unknown (+inf) with probability
// `unknown` (per mille). Prices in [0.1, 1.1) and multiples of 1/1024 so sums are exact.
class HashCost final : public BlockCost {
 public:
  HashCost(uint64_t seed, int unknown_per_mille) : seed_(seed), unknown_(unknown_per_mille) {}
  double solo_fwd(int a, int b) const override { return price(1, a, b, 0, 0, b - a == 1); }
  double solo_bwd(int c, int d) const override { return price(2, c, d, 0, 0, d - c == 1); }
  double pair(int a, int b, int c, int d) const override { return price(3, a, b, c, d, false); }

 private:
  double price(int kind, int a, int b, int c, int d, bool always) const {
    uint64_t h = seed_ * 0x9E3779B97F4A7C15ull;
    for (int v : {kind, a, b, c, d}) {
      h ^= static_cast<uint64_t>(v) + 0x9E3779B97F4A7C15ull + (h << 6) + (h >> 2);
      h *= 0xBF58476D1CE4E5B9ull;
      h ^= h >> 31;
    }
    if (!always && static_cast<int>(h % 1000) < unknown_) return kNoCost;
    return 0.1 + static_cast<double>((h >> 20) % 1024) / 1024.0;
  }
  uint64_t seed_;
  int unknown_;
};

// A Llama-70B-like layer pair for tp=8 with sequence parallelism: 13 fwd and 17 bwd ops, four
// TP collectives per strand (§3.2-3.4). Shapes: b=1, s=4096, h=8192, f=28672, t=8, fp16.
inline LayerProgram llama_like_pair() {
  const double b = 1, s = 4096, h = 8192, f = 28672, t = 8, e = 2;
  auto compute = [](std::string name, double flops, double bytes) {
    Op op;
    op.name = std::move(name);
    op.code = "compute";
    op.cost.flops = flops;
    op.cost.bytes = bytes;
    return op;
  };
  auto coll = [](std::string name, CollOp c, double bytes) {
    Op op;
    op.name = std::move(name);
    op.code = coll_op_name(c);
    op.kind = OpKind::kCollective;
    op.coll = c;
    op.group = "tp";
    op.cost.comm_bytes = bytes;
    op.attrs["group_size"] = 8;
    return op;
  };
  const double act = b * s * h * e;  // one gathered [b·s, h] activation, bytes
  const double qkv = 2 * b * s * h * 3 * h / t, proj = 2 * b * s * h * h / t;
  const double attn = 4 * b * s * s * h / t / 2;  // causal
  const double fc1 = 2 * b * s * h * 2 * f / t, fc2 = 2 * b * s * f * h / t;
  LayerProgram p;
  p.name = "block";
  p.fwd = {compute("ln_attn", 0, 2 * act / t),           coll("tp.ag.attn", CollOp::kAllGather, act),
           compute("attn.qkv", qkv, act),                compute("attn.core", attn, 4 * act / t),
           compute("attn.proj", proj, act),              coll("tp.rs.attn", CollOp::kReduceScatter, act),
           compute("bda_ln_mlp", 0, 4 * act / t),        coll("tp.ag.mlp", CollOp::kAllGather, act),
           compute("mlp.fc1", fc1, 2 * f / h * act),     compute("mlp.swiglu", 0, 3 * f / h * act / t),
           compute("mlp.fc2", fc2, f / h * act),         coll("tp.rs.mlp", CollOp::kReduceScatter, act),
           compute("bda_mlp", 0, 3 * act / t)};
  p.bwd = {compute("bda_mlp.bwd", 0, 3 * act / t),       coll("tp.ag.mlp.bwd", CollOp::kAllGather, act),
           compute("mlp.fc2.dgrad", fc2, f / h * act),   compute("mlp.fc2.wgrad", fc2, f / h * act),
           compute("mlp.swiglu.bwd", 0, 5 * f / h * act / t),
           compute("mlp.fc1.dgrad", fc1, 2 * f / h * act),
           compute("mlp.fc1.wgrad", fc1, 2 * f / h * act),
           coll("tp.rs.mlp.bwd", CollOp::kReduceScatter, act),
           compute("ln_mlp_bda.bwd", 0, 6 * act / t),    coll("tp.ag.attn.bwd", CollOp::kAllGather, act),
           compute("attn.proj.dgrad", proj, act),        compute("attn.proj.wgrad", proj, act),
           compute("attn.core.bwd", 2.5 * attn, 8 * act / t),
           compute("attn.qkv.dgrad", qkv, act),          compute("attn.qkv.wgrad", qkv, act),
           coll("tp.rs.attn.bwd", CollOp::kReduceScatter, act),
           compute("ln_attn.bwd", 0, 3 * act / t)};
  return p;
}

}  // namespace dhelix::test
