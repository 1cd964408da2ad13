// Small models the simulator tests price (test_pair_sim.cc, test_step_sim.cc).
#pragma once
#include <cstdint>

#include "model/ModelConfig.h"

namespace dhelix {

// A small Llama of `layers` layers (d 256, 8 heads over 4 kv heads, ffn 512, vocabulary 1000).
inline ModelConfig small_llama(int64_t layers) {
  ModelConfig m = model_preset("llama-8b");
  m.n_layers = layers, m.d_model = 256, m.n_heads = 8, m.n_kv_heads = 4, m.ffn_hidden = 512, m.vocab_size = 1000;
  return m;
}

}  // namespace dhelix
