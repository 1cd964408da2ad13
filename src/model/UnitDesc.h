// What each unit of a model computes, written once and free of any parallelism: the embedding, the
// transformer layer and the head as ordered steps (norm, linear, rope, attention, activation,
// residual, MoE MLP, ...), each naming the buffers it reads and writes and owning its parameters
// (unsharded, with their roles). sharding/ lowers this one description into op programs for
// Megatron's 1D layouts and AxoNN's 3D grid (build_programs); model_params (Params.h) is the
// concatenation of the steps' parameters, so the parameter list cannot disagree with the program.
//
// Buffer names follow ModelPrograms.h: a unit reads "x" ("tokens" for the embedding) and writes
// "y" ("loss" for the head). The gradient of buffer "b" is "db", except where a step passes its
// output's gradient through unchanged (a residual's branch and skip, the positional add).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "model/ModelConfig.h"
#include "model/Params.h"

namespace dhelix {

enum class UnitStepKind {
  kTokenEmbed,    // out = rows of the vocabulary table (weight) at "tokens"
  kPosEmbed,      // out = in + positions (weight): the gradient passes through
  kNorm,          // fn "layernorm" (weight, bias) or "rmsnorm" (weight)
  kLinear,        // out = in @ W^T (+ bias); W's role says what a layout may split: column, row, vocab
  kRope,          // rotary positions on the packed q and k
  kAttention,     // causal self-attention over the packed qkv; out and out + ".lse"
  kActivation,    // fn "gelu" or "swiglu" (the fused [gate; up] halves)
  kResidual,      // out = in[0] (the skip) + in[1] (the branch) (+ bias: the branch's row-linear bias,
                  // added after that linear's reduction)
  kMoeMlp,        // the Mixture-of-Experts MLP (router, top-k dispatch, experts, combine): in -> out
  kCrossEntropy,  // in {logits, targets} -> loss; its input gradient is written over the logits
};

const char* unit_step_kind_name(UnitStepKind k);

struct UnitStep {
  UnitStepKind kind = UnitStepKind::kNorm;
  std::string tag;              // the ops' name stem: "ln1", "attn.qkv", "mlp.act", "attn.residual"
  std::vector<std::string> in;  // buffers read, in order
  std::string out;              // the buffer written
  std::string fn;               // the function of a norm or activation
  std::string weight, bias;     // parameter locals the step reads ("" without); a tied weight is owned
                                // by another unit
  ShardRole role = ShardRole::kReplicated;  // a linear's weight
  int64_t out_features = 0, in_features = 0;  // a linear's, unsharded
  std::vector<int64_t> parts;   // a column linear's fused output parts (q, k, v), each split evenly
  bool cp_ring = false;         // attention that context parallelism may run as a ring over "cp"
  std::vector<ParamSpec> params;  // the parameters this step owns, unsharded, in declaration order
};

struct UnitDesc {
  std::string kind;  // "embed", "block", "head"
  std::vector<UnitStep> steps;  // forward order; the backward is their reverse
};

// The three unit descriptions of `m` (every transformer layer shares the block's; its parameters
// are named without the "layers.<l>." prefix).
UnitDesc describe_embed(const ModelConfig& m);
UnitDesc describe_block(const ModelConfig& m);
UnitDesc describe_head(const ModelConfig& m);

}  // namespace dhelix
