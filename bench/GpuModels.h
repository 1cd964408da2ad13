// The GPU benchmarks' models (bench/gpu_train.cc, bench/gpu_si.cc): GPT-2 124M (the preset), a
// Llama-style model of about 1B parameters, the same as bench/gpu_torch.py's llama-1b (GQA, RMSNorm,
// SwiGLU, RoPE), and (gpu_si's expert-parallel case) moe-0.6b: Mixtral-style blocks, 8 SwiGLU
// experts of hidden 2816 with top-2 routing on a d_model 1024 Llama attention, 8 layers -- about
// 0.64B parameters, of which a token's FLOPs use about 0.2B.
#pragma once
#include <algorithm>
#include <string>

#include "base/Error.h"
#include "model/ModelConfig.h"

namespace dhelix::bench {

// A Llama-style model (GQA, RMSNorm, SwiGLU, RoPE theta 500000, untied head) of these sizes.
inline ModelConfig llama_style(const std::string& name, ModelFamily family, int64_t T, int64_t d_model, int64_t layers,
                               int64_t heads, int64_t kv_heads, int64_t ffn) {
  ModelConfig m;
  m.name = name;
  m.family = family;
  m.vocab_size = 32000;
  m.seq_len = T;
  m.d_model = d_model;
  m.n_layers = layers;
  m.n_heads = heads;
  m.n_kv_heads = kv_heads;
  m.ffn_hidden = ffn;
  m.rope_theta = 500000.0;
  m.tie_embeddings = false;
  return m;
}

inline ModelConfig gpu_model_named(const std::string& name, int64_t T) {
  if (name == "gpt2-124m") {
    ModelConfig m = model_preset("gpt2-124m");
    m.seq_len = std::max<int64_t>(m.seq_len, T);
    return m;
  }
  if (name == "moe-0.6b") {
    ModelConfig m = llama_style(name, ModelFamily::kMoE, T, 1024, 8, 16, 4, 2816);
    m.n_experts = 8;
    m.top_k = 2;
    return m;
  }
  DHX_CHECK(name == "llama-1b", ConfigError, "unknown model '{}' (expected gpt2-124m, llama-1b or moe-0.6b)", name);
  return llama_style(name, ModelFamily::kLlama, T, 2048, 16, 32, 8, 8192);
}

}  // namespace dhelix::bench
