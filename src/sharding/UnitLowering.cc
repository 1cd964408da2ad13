// lower_unit (UnitLowering.h): model/'s steps forward, then in reverse, with the ops every layout
// writes alike; the layout writes the rest.
#include "sharding/UnitLowering.h"

#include <map>

#include "base/Error.h"
#include "sharding/CpRing.h"
#include "sharding/OpFactory.h"

namespace dhelix::sharding {

namespace {

struct Extents {
  int64_t D, Hl, Hkvl, Fl;  // head size; heads, kv heads and MLP features on this rank
};

Extents extents(const UnitLowering& lw) {
  const ModelConfig& m = lw.model();
  return {m.head_dim(), m.n_heads / lw.split(), m.n_kv_heads / lw.split(), m.ffn_hidden / lw.split()};
}

// Causal attention over this rank's heads: QK^T and AV, 2 * 2 * B * T^2 * H * D / 2 FLOPs.
Op attention_op(const UnitStep& s, const UnitLowering& lw, const Extents& e) {
  Op attn = compute_op(s.tag, "attention", {s.in[0]}, {s.out, s.out + ".lse"});
  attn.attrs = {{"heads", e.Hl}, {"kv_heads", e.Hkvl}, {"head_dim", e.D}};
  attn.cost.flops = 2.0 * double(lw.batch()) * double(lw.seq()) * double(lw.seq()) * double(e.Hl) * double(e.D);
  attn.cost.bytes = kF * lw.tokens() * double((e.Hl + 2 * e.Hkvl) * e.D + e.Hl * e.D);
  return attn;
}

bool is_gelu(const UnitStep& s) {
  DHX_ASSERT(s.fn == "gelu" || s.fn == "swiglu", "{}: activation '{}'", s.tag, s.fn);
  return s.fn == "gelu";
}

std::vector<LinearSite> linear_sites(const UnitDesc& d) {
  std::vector<LinearSite> at(d.steps.size());
  int n = 0;
  for (size_t i = 0; i < d.steps.size(); ++i) {
    const UnitStep& s = d.steps[i];
    if (s.kind == UnitStepKind::kLinear && s.role != ShardRole::kVocab) at[i].index = n++;
  }
  for (LinearSite& a : at) a.count = n;
  return at;
}

// `core` gets, per forward op, whether the attention step wrote it (the op, or CP's ring).
void lower_fwd(const UnitDesc& d, UnitLowering& lw, const std::vector<LinearSite>& at, std::vector<Op>& f,
               std::vector<bool>& core) {
  const Extents e = extents(lw);
  lw.begin(d, f);
  for (size_t i = 0; i < d.steps.size(); ++i) {
    const UnitStep& s = d.steps[i];
    core.resize(f.size(), false);
    if (s.kind == UnitStepKind::kAttention) {
      lw.attention_fwd(s, attention_op(s, lw, e), f);
      core.resize(f.size(), true);
      continue;
    }
    switch (s.kind) {
      case UnitStepKind::kTokenEmbed: lw.token_embed_fwd(s, f); break;
      case UnitStepKind::kPosEmbed: {
        Op pe = compute_op(s.tag, "pos_embed", {s.in[0]}, {s.out}, {s.weight});
        elem_cost(pe, lw.stream_elems(), 1, 3);
        f.push_back(pe);
        break;
      }
      case UnitStepKind::kNorm: lw.norm_fwd(s, f); break;
      case UnitStepKind::kLinear: lw.linear_fwd(s, at[i], f); break;
      case UnitStepKind::kRope: {
        Op rope = compute_op(s.tag, "rope", {s.in[0]}, {s.out});
        elem_cost(rope, lw.tokens() * double((e.Hl + e.Hkvl) * e.D), 3, 2);
        f.push_back(rope);
        break;
      }
      case UnitStepKind::kAttention: break;  // above
      case UnitStepKind::kActivation: {
        Op act = compute_op(s.tag, s.fn, {s.in[0]}, {s.out});
        elem_cost(act, lw.tokens() * double(e.Fl), is_gelu(s) ? 10 : 6, is_gelu(s) ? 2 : 3);
        f.push_back(act);
        break;
      }
      case UnitStepKind::kResidual: {
        Op res = compute_op(s.tag, "residual_add", {s.in[0], s.in[1]}, {s.out},
                            s.bias.empty() ? std::vector<std::string>{} : std::vector<std::string>{s.bias});
        elem_cost(res, lw.stream_elems(), 1, 3);
        f.push_back(res);
        break;
      }
      case UnitStepKind::kMoeMlp: lw.moe_fwd(s, f); break;
      case UnitStepKind::kCrossEntropy: lw.xent_fwd(s, f); break;
    }
  }
  core.resize(f.size(), false);
}

void lower_bwd(const UnitDesc& d, UnitLowering& lw, const std::vector<LinearSite>& at, std::vector<Op>& g) {
  const Extents e = extents(lw);
  std::map<std::string, std::string> passed;  // buffer -> the gradient a pass-through step gave it
  std::map<std::string, std::string> skip;    // a residual's skip input -> that residual's output gradient
  auto grad = [&](const std::string& buf) {
    auto it = passed.find(buf);
    return it != passed.end() ? it->second : "d" + buf;
  };
  for (size_t k = d.steps.size(); k-- > 0;) {
    const UnitStep& s = d.steps[k];
    switch (s.kind) {
      case UnitStepKind::kTokenEmbed: lw.token_embed_bwd(s, grad(s.out), g); break;
      case UnitStepKind::kPosEmbed: {
        Op pb = compute_op(s.tag + ".bwd", "pos_embed_bwd", {grad(s.out)}, {}, {}, {s.weight});
        elem_cost(pb, lw.stream_elems(), 1, 2);
        g.push_back(pb);
        passed[s.in[0]] = grad(s.out);
        break;
      }
      case UnitStepKind::kNorm: {
        auto it = skip.find(s.in[0]);
        const std::string d_res = it == skip.end() ? "" : it->second;
        if (it != skip.end()) skip.erase(it);
        lw.norm_bwd(s, grad(s.out), d_res, grad(s.in[0]), g);
        break;
      }
      case UnitStepKind::kLinear: lw.linear_bwd(s, at[k], grad(s.out), grad(s.in[0]), g); break;
      case UnitStepKind::kRope: {
        Op rb = compute_op(s.tag + ".bwd", "rope_bwd", {grad(s.out)}, {grad(s.in[0])});
        elem_cost(rb, lw.tokens() * double((e.Hl + e.Hkvl) * e.D), 3, 2);
        g.push_back(rb);
        break;
      }
      case UnitStepKind::kAttention: {
        const Op attn = attention_op(s, lw, e);
        Op ab = compute_op(s.tag + ".bwd", "attention_bwd", {s.in[0], s.out, s.out + ".lse", grad(s.out)},
                           {grad(s.in[0])});
        ab.attrs = attn.attrs;
        ab.cost.flops = 2.5 * attn.cost.flops;  // dS, dP recompute + dQ, dK, dV
        ab.cost.bytes = 2 * attn.cost.bytes;
        lw.attention_bwd(s, std::move(ab), g);
        break;
      }
      case UnitStepKind::kActivation: {
        Op ab = compute_op(s.tag + ".bwd", s.fn + "_bwd", {grad(s.out), s.in[0]}, {grad(s.in[0])});
        elem_cost(ab, lw.tokens() * double(e.Fl), is_gelu(s) ? 20 : 10, 3);
        g.push_back(ab);
        break;
      }
      case UnitStepKind::kResidual: {
        // The branch's bias (a row linear's, added after its reduction) has its gradient here.
        if (!s.bias.empty()) {
          Op bg = compute_op(s.tag + ".bwd", "bias_grad", {grad(s.out)}, {}, {}, {s.bias});
          elem_cost(bg, lw.stream_elems(), 1, 1);
          g.push_back(bg);
        }
        passed[s.in[1]] = grad(s.out);
        skip[s.in[0]] = grad(s.out);
        break;
      }
      case UnitStepKind::kMoeMlp: lw.moe_bwd(s, grad(s.out), grad(s.in[0]), g); break;
      case UnitStepKind::kCrossEntropy: break;  // its input gradient is written in the forward
    }
  }
  // Each skip gradient is added by the norm that reads the skip (the fused residual backward).
  DHX_ASSERT(skip.empty(), "unit {}: a residual's skip input '{}' is read by no norm", d.kind, skip.begin()->first);
  lw.end_bwd(g);
}

}  // namespace

void UnitLowering::attention_fwd(const UnitStep& s, Op attn, std::vector<Op>& f) {
  if (const TpRegion* r = cp_ring(); r && s.cp_ring)
    cp_attention_fwd(*r, f, s.in[0], attn);
  else
    f.push_back(std::move(attn));
}

void UnitLowering::attention_bwd(const UnitStep& s, Op attn_b, std::vector<Op>& g) {
  if (const TpRegion* r = cp_ring(); r && s.cp_ring)
    cp_attention_bwd(*r, g, s.in[0], attn_b.outputs.at(0), attn_b);
  else
    g.push_back(std::move(attn_b));
}

LayerProgram lower_unit(const UnitDesc& d, UnitLowering& lw, Recompute recompute) {
  LayerProgram p;
  p.name = d.kind;
  const std::vector<LinearSite> at = linear_sites(d);
  std::vector<bool> core;
  lower_fwd(d, lw, at, p.fwd, core);
  lower_bwd(d, lw, at, p.bwd);
  if (d.kind == "block" && recompute != Recompute::kNone) {
    if (recompute == Recompute::kFull) core.assign(p.fwd.size(), true);
    add_recompute(p, core);
  }
  return p;
}

}  // namespace dhelix::sharding
