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

inline ModelConfig gpu_model_named(const std::string& name, int64_t T) {
  if (name == "gpt2-124m") {
    ModelConfig m = model_preset("gpt2-124m");
    m.seq_len = std::max<int64_t>(m.seq_len, T);
    return m;
  }
  if (name == "moe-0.6b") {
    ModelConfig m;
    m.name = "moe-0.6b";
    m.family = ModelFamily::kMoE;
    m.vocab_size = 32000;
    m.seq_len = T;
    m.d_model = 1024;
    m.n_layers = 8;
    m.n_heads = 16;
    m.n_kv_heads = 4;
    m.ffn_hidden = 2816;
    m.n_experts = 8;
    m.top_k = 2;
    m.rope_theta = 500000.0;
    m.tie_embeddings = false;
    return m;
  }
  DHX_CHECK(name == "llama-1b", ConfigError, "unknown model '{}' (expected gpt2-124m, llama-1b or moe-0.6b)", name);
  ModelConfig m;
  m.name = "llama-1b";
  m.family = ModelFamily::kLlama;
  m.vocab_size = 32000;
  m.seq_len = T;
  m.d_model = 2048;
  m.n_layers = 16;
  m.n_heads = 32;
  m.n_kv_heads = 8;
  m.ffn_hidden = 8192;
  m.rope_theta = 500000.0;
  m.tie_embeddings = false;
  return m;
}

}  // namespace dhelix::bench
