// Model description: the shape and family of a transformer. GPT-2 style (LayerNorm, learned
// positions, GELU MLP, tied embeddings) or Llama style (RMSNorm, RoPE, SwiGLU, grouped-query
// attention). Presets for the papers' shapes can be priced without being allocated.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace dhelix {

enum class ModelFamily { kGPT, kLlama };
const char* family_name(ModelFamily f);

struct ModelConfig {
  std::string name = "demo";
  ModelFamily family = ModelFamily::kLlama;
  int64_t vocab_size = 2000;
  int64_t seq_len = 128;      // maximum context (GPT learned positions have this many rows)
  int64_t d_model = 256;
  int64_t n_layers = 4;
  int64_t n_heads = 8;
  int64_t n_kv_heads = 8;     // GQA when < n_heads (Llama only)
  int64_t ffn_hidden = 1024;  // GPT: 4*d; Llama: SwiGLU hidden
  double norm_eps = 1e-5;
  double rope_theta = 10000.0;
  bool tie_embeddings = true;
  double init_std = 0.02;

  int64_t head_dim() const { return d_model / n_heads; }
  // Parameter count (exact for the layer structure implemented).
  int64_t num_params() const;
  // Non-embedding parameters (for 6*N*tokens MFU accounting, as in the Chinchilla/PaLM convention
  // we count all matmul parameters including the LM head; see flops_per_token()).
  // Training FLOPs per token: 6 * N_matmul + 6 * n_layers * seq_len * d_model (causal attention
  // scores and values, fwd+bwd, halved for causality): the formula printed beside every MFU.
  double flops_per_token(int64_t seq) const;
  // Every violated rule, one message each ("n_heads=30 is not divisible by ... ").
  std::vector<std::string> validate() const;
};

// Built-in presets by name: "demo", "gpt2-124m", "llama-8b", "llama-25b", "llama-39b",
// "llama-66b", "llama-70b", "gpt-6.7b", "gpt-18b", "gpt-30b". Throws ConfigError listing names.
ModelConfig model_preset(const std::string& name);
std::vector<std::string> model_preset_names();

}  // namespace dhelix
