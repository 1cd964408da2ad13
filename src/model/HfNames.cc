// Internal <-> Hugging Face tensor layouts for GPT-2, Llama and Mixtral-style MoE checkpoints.
#include "model/HfNames.h"

#include <set>

#include <cstring>

#include "base/Error.h"

namespace dhelix {
namespace {

// rows [r0, r0+n) of a 2-D (or 1-D) tensor, copied.
Tensor rows_of(const Tensor& t, int64_t r0, int64_t n) { return t.narrow0(r0, n).clone(); }

Tensor transpose2d(const Tensor& t) {
  int64_t R = t.dim(0), C = t.dim(1);
  Tensor o = Tensor::empty({C, R});
  const float* s = t.f32();
  float* d = o.f32();
  for (int64_t i = 0; i < R; ++i)
    for (int64_t j = 0; j < C; ++j) d[j * R + i] = s[i * C + j];
  return o;
}

// One HF tensor <-> a piece of an internal tensor.
struct Piece {
  std::string hf;
  std::string internal;
  int64_t row0 = 0, rows = -1;  // row range of the internal tensor (-1: all)
  bool transpose = false;
};

std::vector<Piece> pieces(const ModelConfig& m) {
  std::vector<Piece> out;
  const int64_t C = m.d_model, D = m.head_dim(), F = m.ffn_hidden, V = m.vocab_size;
  if (m.family == ModelFamily::kGPT) {
    out.push_back({"transformer.wte.weight", "wte", 0, V});
    out.push_back({"transformer.wpe.weight", "wpe"});
    for (int l = 0; l < m.n_layers; ++l) {
      std::string h = fmt::format("transformer.h.{}.", l), p = fmt::format("layers.{}.", l);
      out.push_back({h + "ln_1.weight", p + "ln1.weight"});
      out.push_back({h + "ln_1.bias", p + "ln1.bias"});
      out.push_back({h + "attn.c_attn.weight", p + "wqkv", 0, -1, true});
      out.push_back({h + "attn.c_attn.bias", p + "bqkv"});
      out.push_back({h + "attn.c_proj.weight", p + "wo", 0, -1, true});
      out.push_back({h + "attn.c_proj.bias", p + "bo"});
      out.push_back({h + "ln_2.weight", p + "ln2.weight"});
      out.push_back({h + "ln_2.bias", p + "ln2.bias"});
      out.push_back({h + "mlp.c_fc.weight", p + "wfc", 0, -1, true});
      out.push_back({h + "mlp.c_fc.bias", p + "bfc"});
      out.push_back({h + "mlp.c_proj.weight", p + "wproj", 0, -1, true});
      out.push_back({h + "mlp.c_proj.bias", p + "bproj"});
    }
    out.push_back({"transformer.ln_f.weight", "final_norm.weight"});
    out.push_back({"transformer.ln_f.bias", "final_norm.bias"});
    if (!m.tie_embeddings) out.push_back({"lm_head.weight", "lm_head", 0, V});
  } else {
    out.push_back({"model.embed_tokens.weight", "wte", 0, V});
    const int64_t q = m.n_heads * D, kv = m.n_kv_heads * D;
    for (int l = 0; l < m.n_layers; ++l) {
      std::string h = fmt::format("model.layers.{}.", l), p = fmt::format("layers.{}.", l);
      out.push_back({h + "input_layernorm.weight", p + "attn_norm.weight"});
      out.push_back({h + "self_attn.q_proj.weight", p + "wqkv", 0, q});
      out.push_back({h + "self_attn.k_proj.weight", p + "wqkv", q, kv});
      out.push_back({h + "self_attn.v_proj.weight", p + "wqkv", q + kv, kv});
      out.push_back({h + "self_attn.o_proj.weight", p + "wo"});
      out.push_back({h + "post_attention_layernorm.weight", p + "mlp_norm.weight"});
      if (m.is_moe()) {
        // Mixtral's names (Phi-3.5-MoE uses the same): w1 = gate, w3 = up, w2 = down, per expert.
        const std::string s = h + "block_sparse_moe.";
        out.push_back({s + "gate.weight", p + "router"});
        for (int64_t e = 0; e < m.n_experts; ++e) {
          const std::string x = fmt::format("{}experts.{}.", s, e);
          out.push_back({x + "w1.weight", p + "experts.wgu", e * 2 * F, F});
          out.push_back({x + "w2.weight", p + "experts.wdown", e * C, C});
          out.push_back({x + "w3.weight", p + "experts.wgu", e * 2 * F + F, F});
        }
        continue;
      }
      out.push_back({h + "mlp.gate_proj.weight", p + "wgu", 0, F});
      out.push_back({h + "mlp.up_proj.weight", p + "wgu", F, F});
      out.push_back({h + "mlp.down_proj.weight", p + "wdown"});
    }
    out.push_back({"model.norm.weight", "final_norm.weight"});
    if (!m.tie_embeddings) out.push_back({"lm_head.weight", "lm_head", 0, V});
  }
  (void)C;
  return out;
}

}  // namespace

TensorList to_hf(const ModelConfig& m, const std::map<std::string, Tensor>& full) {
  TensorList out;
  for (const Piece& p : pieces(m)) {
    auto it = full.find(p.internal);
    DHX_CHECK(it != full.end(), InternalError, "to_hf: no internal tensor '{}'", p.internal);
    Tensor t = p.rows >= 0 ? rows_of(it->second, p.row0, p.rows) : it->second.clone();
    if (p.transpose) t = transpose2d(t);
    out.push_back({p.hf, t});
  }
  return out;
}

namespace {
// A bf16 tensor as f32: each value's 16 bits become the high half of the float (exact).
Tensor bf16_to_f32(const Tensor& t) {
  Tensor f = Tensor::empty(t.shape(), DType::kF32);
  const uint16_t* src = t.data<uint16_t>();
  float* dst = f.f32();
  for (int64_t i = 0; i < t.numel(); ++i) {
    const uint32_t u = uint32_t{src[i]} << 16;
    std::memcpy(dst + i, &u, 4);
  }
  return f;
}
}  // namespace

std::map<std::string, Tensor> from_hf(const ModelConfig& m, const std::vector<ParamSpec>& specs, const TensorList& hf) {
  std::map<std::string, const Tensor*> byname;
  for (auto& [k, t] : hf) byname[k] = &t;
  std::map<std::string, Shape> shape_of;
  for (auto& s : specs) shape_of[s.name] = s.full;
  std::map<std::string, std::vector<std::pair<int64_t, Tensor>>> parts;
  const std::vector<Piece> want_pieces = pieces(m);
  {
    std::set<std::string> known;
    for (const Piece& p : want_pieces) known.insert(p.hf);
    std::vector<std::string> extra;
    for (const auto& [k, t] : hf)
      if (!known.count(k)) extra.push_back(k);
    if (!extra.empty()) {
      std::string list;
      for (size_t i = 0; i < extra.size() && i < 6; ++i) list += (i ? ", '" : "'") + extra[i] + "'";
      if (extra.size() > 6) list += fmt::format(" and {} more", extra.size() - 6);
      throw IoError(fmt::format("the checkpoint holds {} tensor{} that model {} ({} layers) does not have: {}",
                                extra.size(), extra.size() == 1 ? "" : "s", m.name, m.n_layers, list));
    }
  }
  for (const Piece& p : want_pieces) {
    auto it = byname.find(p.hf);
    DHX_CHECK(it != byname.end(), IoError, "checkpoint lacks tensor '{}' (model {} expects it)", p.hf, m.name);
    auto sh = shape_of.find(p.internal);
    if (sh == shape_of.end()) continue;  // another pipeline stage's parameter (every one must be there)
    Tensor t = *it->second;
    if (t.dtype() == DType::kBF16) t = bf16_to_f32(t);  // Hugging Face's bf16 releases: exact widening
    DHX_CHECK(t.dtype() == DType::kF32, IoError, "tensor '{}' is {}, expected f32 or bf16", p.hf,
              dtype_name(t.dtype()));
    if (p.transpose) {
      DHX_CHECK(t.ndim() == 2, IoError, "tensor '{}' has shape {}, expected 2-D", p.hf, shape_str(t.shape()));
      t = transpose2d(t);
    }
    Shape want = sh->second;
    if (p.rows >= 0) want[0] = p.rows;
    DHX_CHECK(t.shape() == want, IoError, "tensor '{}' has shape {} in the checkpoint but {} in the model", p.hf,
              shape_str(t.shape()), shape_str(want));
    parts[p.internal].push_back({p.row0, t});
  }
  std::map<std::string, Tensor> out;
  for (auto& s : specs) {
    auto& ps = parts.at(s.name);
    Tensor full = Tensor::zeros(s.full);
    int64_t row = s.full.size() > 1 ? s.full[1] : 1;
    for (auto& [r0, t] : ps) std::memcpy(full.f32() + r0 * row, t.f32(), t.nbytes());
    out[s.name] = full;
  }
  return out;
}

}  // namespace dhelix
