// The GPT, Llama and MoE families' units as steps (UnitDesc.h): the layer is written here once, for
// every layout; the parameters of each step with their init.
#include "model/UnitDesc.h"

#include <cmath>

namespace dhelix {

const char* unit_step_kind_name(UnitStepKind k) {
  switch (k) {
    case UnitStepKind::kTokenEmbed: return "token_embed";
    case UnitStepKind::kPosEmbed: return "pos_embed";
    case UnitStepKind::kNorm: return "norm";
    case UnitStepKind::kLinear: return "linear";
    case UnitStepKind::kRope: return "rope";
    case UnitStepKind::kAttention: return "attention";
    case UnitStepKind::kActivation: return "activation";
    case UnitStepKind::kResidual: return "residual";
    case UnitStepKind::kMoeMlp: return "moe_mlp";
    case UnitStepKind::kCrossEntropy: return "cross_entropy";
  }
  return "?";
}

namespace {

ParamSpec param(std::string local, Shape full, ShardRole role, ParamInit init, double sd,
                std::vector<int64_t> parts = {}) {
  ParamSpec p;
  p.local = std::move(local);
  p.full = p.shard = std::move(full);
  p.role = role;
  p.init = init;
  p.init_std = sd;
  p.parts = std::move(parts);
  p.weight_decay = p.full.size() > 1;  // matrices decay; vectors (norms, biases) do not
  return p;
}

UnitStep step(UnitStepKind kind, std::string tag, std::vector<std::string> in, std::string out) {
  UnitStep s;
  s.kind = kind;
  s.tag = std::move(tag);
  s.in = std::move(in);
  s.out = std::move(out);
  return s;
}

// LayerNorm (GPT: weight and bias) or RMSNorm (Llama: weight), its parameters "<tag>.weight/bias".
UnitStep norm(const ModelConfig& m, const std::string& tag, const std::string& in, const std::string& out) {
  const bool gpt = m.family == ModelFamily::kGPT;
  UnitStep s = step(UnitStepKind::kNorm, tag, {in}, out);
  s.fn = gpt ? "layernorm" : "rmsnorm";
  s.weight = tag + ".weight";
  s.params.push_back(param(s.weight, {m.d_model}, ShardRole::kReplicated, ParamInit::kOnes, 0));
  if (gpt) {
    s.bias = tag + ".bias";
    s.params.push_back(param(s.bias, {m.d_model}, ShardRole::kReplicated, ParamInit::kZeros, 0));
  }
  return s;
}

// A column linear: its output features (the fused `parts`) split; a bias, when named, split with them.
UnitStep column(const std::string& tag, const std::string& in, const std::string& out, const std::string& w,
                 const std::string& bias, std::vector<int64_t> parts, int64_t in_features, double sd) {
  UnitStep s = step(UnitStepKind::kLinear, tag, {in}, out);
  s.role = ShardRole::kColumn;
  s.weight = w;
  s.bias = bias;
  for (int64_t q : parts) s.out_features += q;
  s.in_features = in_features;
  s.parts = parts;
  s.params.push_back(param(w, {s.out_features, in_features}, ShardRole::kColumn, ParamInit::kNormal, sd, parts));
  if (!bias.empty()) s.params.push_back(param(bias, {s.out_features}, ShardRole::kColumn, ParamInit::kZeros, 0, parts));
  return s;
}

// A row linear: its input features split; its bias (if any) belongs to the residual after it.
UnitStep row(const std::string& tag, const std::string& in, const std::string& out, const std::string& w,
             int64_t out_features, int64_t in_features, double sd) {
  UnitStep s = step(UnitStepKind::kLinear, tag, {in}, out);
  s.role = ShardRole::kRow;
  s.weight = w;
  s.out_features = out_features;
  s.in_features = in_features;
  s.params.push_back(param(w, {out_features, in_features}, ShardRole::kRow, ParamInit::kNormal, sd));
  return s;
}

UnitStep residual(const ModelConfig& m, const std::string& tag, const std::string& skip, const std::string& branch,
                  const std::string& out, const std::string& bias) {
  UnitStep s = step(UnitStepKind::kResidual, tag, {skip, branch}, out);
  if (!bias.empty()) {
    s.bias = bias;
    s.params.push_back(param(bias, {m.d_model}, ShardRole::kReplicated, ParamInit::kZeros, 0));
  }
  return s;
}

ParamSpec vocab_table(const ModelConfig& m, const std::string& local) {
  return param(local, {m.vocab_size, m.d_model}, ShardRole::kVocab, ParamInit::kNormal, m.init_std);
}

}  // namespace

UnitDesc describe_embed(const ModelConfig& m) {
  const bool gpt = m.family == ModelFamily::kGPT;
  UnitDesc u{"embed", {}};
  UnitStep tok = step(UnitStepKind::kTokenEmbed, "embed.tok", {"tokens"}, gpt ? "e" : "y");
  tok.weight = "wte";
  tok.role = ShardRole::kVocab;
  tok.params.push_back(vocab_table(m, "wte"));
  u.steps.push_back(tok);
  if (gpt) {
    UnitStep pos = step(UnitStepKind::kPosEmbed, "embed.pos", {"e"}, "y");
    pos.weight = "wpe";
    pos.params.push_back(param("wpe", {m.seq_len, m.d_model}, ShardRole::kReplicated, ParamInit::kNormal, 0.01));
    u.steps.push_back(pos);
  }
  return u;
}

// norm -> column QKV -> [rope] -> attention -> row out -> residual; norm -> column fc -> activation
// -> row proj (or the MoE MLP) -> residual.
UnitDesc describe_block(const ModelConfig& m) {
  const bool gpt = m.family == ModelFamily::kGPT;
  const int64_t C = m.d_model, D = m.head_dim(), F = m.ffn_hidden, H = m.n_heads, Hkv = m.n_kv_heads;
  const double sd = m.init_std;
  // GPT-2 scales the residual projections' init by 1/sqrt(2L).
  const double sd_res = gpt ? sd / std::sqrt(2.0 * m.n_layers) : sd;
  const std::string n1 = gpt ? "ln1" : "attn_norm", n2 = gpt ? "ln2" : "mlp_norm";
  UnitDesc u{"block", {}};
  auto& s = u.steps;
  s.push_back(norm(m, n1, "x", "h1"));
  s.push_back(column("attn.qkv", "h1", "qkv", "wqkv", gpt ? "bqkv" : "", {H * D, Hkv * D, Hkv * D}, C, sd));
  std::string qkv = "qkv";
  if (!gpt) {
    s.push_back(step(UnitStepKind::kRope, "attn.rope", {"qkv"}, "qkv_r"));
    qkv = "qkv_r";
  }
  UnitStep attn = step(UnitStepKind::kAttention, "attn.core", {qkv}, "att");
  attn.cp_ring = true;
  s.push_back(attn);
  s.push_back(row("attn.out", "att", "ao", "wo", C, H * D, sd_res));
  s.push_back(residual(m, "attn.residual", "x", "ao", "x2", gpt ? "bo" : ""));
  s.push_back(norm(m, n2, "x2", "h2"));
  if (m.is_moe()) {
    UnitStep moe = step(UnitStepKind::kMoeMlp, "moe", {"h2"}, "mo");
    // E experts' [rows, cols] weights stacked as [E * rows, cols].
    moe.params.push_back(param("router", {m.n_experts, C}, ShardRole::kReplicated, ParamInit::kNormal, sd));
    moe.params.push_back(param("experts.wgu", {m.n_experts * 2 * F, C}, ShardRole::kExpert, ParamInit::kNormal, sd));
    moe.params.push_back(param("experts.wdown", {m.n_experts * C, F}, ShardRole::kExpert, ParamInit::kNormal, sd_res));
    for (ParamSpec& q : moe.params) q.moe_mlp = true;
    s.push_back(moe);
  } else {
    s.push_back(gpt ? column("mlp.fc", "h2", "fc", "wfc", "bfc", {F}, C, sd)
                    : column("mlp.fc", "h2", "fc", "wgu", "", {F, F}, C, sd));
    UnitStep act = step(UnitStepKind::kActivation, "mlp.act", {"fc"}, "act");
    act.fn = gpt ? "gelu" : "swiglu";
    s.push_back(act);
    s.push_back(row("mlp.proj", "act", "mo", gpt ? "wproj" : "wdown", C, F, sd_res));
  }
  s.push_back(residual(m, "mlp.residual", "x2", "mo", "y", gpt ? "bproj" : ""));
  return u;
}

// Final norm, the LM head (the vocabulary table's rows: the embedding's when tied), cross-entropy.
UnitDesc describe_head(const ModelConfig& m) {
  UnitDesc u{"head", {}};
  u.steps.push_back(norm(m, "final_norm", "x", "hf"));
  UnitStep lm = step(UnitStepKind::kLinear, "lm_head", {"hf"}, "logits");
  lm.role = ShardRole::kVocab;
  lm.weight = m.tie_embeddings ? "wte" : "lm_head";
  lm.out_features = m.vocab_size;
  lm.in_features = m.d_model;
  if (!m.tie_embeddings) lm.params.push_back(vocab_table(m, "lm_head"));
  u.steps.push_back(lm);
  u.steps.push_back(step(UnitStepKind::kCrossEntropy, "xent", {"logits", "targets"}, "loss"));
  return u;
}

}  // namespace dhelix
