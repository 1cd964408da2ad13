// Model description: the shape and family of a transformer. GPT-2 style (LayerNorm, learned
// positions, GELU MLP, tied embeddings), Llama style (RMSNorm, RoPE, SwiGLU, grouped-query
// attention) or Mixture-of-Experts (Llama attention; the MLP replaced by a softmax top-k router over
// n_experts SwiGLU experts, dropless, with the load-balancing auxiliary loss — Mixtral / Phi-3.5-MoE
// blocks). Presets for the papers' shapes can be priced without being allocated.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace dhelix {

enum class ModelFamily { kGPT, kLlama, kMoE };

// How training FLOPs are counted for MFU (ModelConfig::flops_per_token): dhelix's own, Megatron-LM's
// or AxoNN's.
enum class FlopConvention { kDhelix, kMegatron, kAxonn };
const char* flop_convention_name(FlopConvention c);  // "dhelix", "megatron", "axonn"
bool parse_flop_convention(const std::string& text, FlopConvention& out);
// The formula a convention counts, for printing beside its figures ("6N + 6LTd per token").
const char* flop_convention_formula(FlopConvention c);
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
  // kMoE only: experts per layer, experts each token is routed to, the load-balancing loss's
  // coefficient (Switch / Megatron: aux = coef * E * sum_e f_e P_e per layer and micro-batch, f_e the
  // fraction of the k*N assignments that went to expert e, P_e its mean router probability), and
  // whether the k gate weights are renormalised to sum to 1 (Mixtral) or are the raw probabilities.
  // ffn_hidden is each expert's SwiGLU hidden size.
  int64_t n_experts = 8;
  int64_t top_k = 2;
  double aux_loss_coef = 0.01;
  bool norm_topk = true;

  bool is_moe() const { return family == ModelFamily::kMoE; }
  // Llama-style attention, RMSNorm and RoPE (llama and moe).
  bool llama_attention() const { return family != ModelFamily::kGPT; }

  int64_t head_dim() const { return d_model / n_heads; }
  // Parameter count (exact for the layer structure implemented).
  int64_t num_params() const;
  // Non-embedding parameters (for 6*N*tokens MFU accounting, as in the Chinchilla/PaLM convention
  // we count all matmul parameters including the LM head; see flops_per_token()).
  // Training FLOPs per token: 6 * N_matmul + 6 * n_layers * seq_len * d_model (causal attention
  // scores and values, fwd+bwd, halved for causality): the formula printed beside every MFU.
  double flops_per_token(int64_t seq) const;
  // The same under a published counting convention (FlopConvention): per token, with M the matmul
  // parameters (layers' M_l plus the LM head's V C), L layers, T = seq, C = d_model:
  //   dhelix:   6 M + 6 L T C                    (causal attention counted once: the default)
  //   megatron: 6 M + 12 L T C                   (Narayanan et al. 2021: 72 B s l h^2 (1 + s/6h +
  //                                               V/12lh) per step for GPT; attention not halved)
  //   axonn:    8 M_l + 6 V C + 16 L T C         (the same with full recompute, the forward of the
  //                                               layers counted twice: 96 B s l h^2 (1 + s/6h +
  //                                               V/16lh); AxoNN's counting, Singh et al. 2024)
  double flops_per_token(int64_t seq, FlopConvention convention) const;
  // Every violated rule, one message each ("n_heads=30 is not divisible by ... ").
  std::vector<std::string> validate() const;
};

// Built-in presets by name: "demo", "moe-demo", "phi-3.5-moe", "gpt2-124m", "llama-8b", "llama-25b", "llama-39b",
// "llama-66b", "llama-70b", "gpt-6.7b", "gpt-18b", "gpt-30b". Throws ConfigError listing names.
ModelConfig model_preset(const std::string& name);
std::vector<std::string> model_preset_names();

}  // namespace dhelix
