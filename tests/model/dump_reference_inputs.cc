// Writes the inputs of the PyTorch oracle (tests/fixtures/make_reference.py): for each family,
// <out_dir>/<family>_in.safetensors with the reference config's random weights in Hugging Face
// names (f32), tokens and targets [M, B, T] (i32) and the config in the metadata. Run by
// tests/fixtures/regen.sh; the tests themselves read the committed fixtures, not these files.
#include <fmt/format.h>

#include <cstdio>
#include <exception>
#include <filesystem>

#include "ModelHarness.h"
#include "model/HfNames.h"
#include "train/Safetensors.h"

namespace dhelix::test {
namespace {

// Stacks micro-batch tensors [B*T] into [M, B, T].
Tensor stack(const std::vector<MicroBatch>& mbs, Tensor MicroBatch::*field) {
  const int64_t M = static_cast<int64_t>(mbs.size());
  Tensor out = Tensor::empty({M, kRefB, kRefT}, DType::kI32);
  for (int64_t i = 0; i < M; ++i) out.narrow0(i, 1).copy_from(mbs[i].*field);
  return out;
}

void write_inputs(ModelFamily family, const std::filesystem::path& dir) {
  const ModelConfig m = reference_config(family);
  const uint64_t seed = family == ModelFamily::kGPT ? 11 : family == ModelFamily::kLlama ? 12 : 13;
  NamedTensors tensors = to_hf(m, random_full_values(m, seed));
  const auto mbs = random_micro_batches(m, {kRefB, kRefT}, kRefMicroBatches, seed + 100);
  tensors.push_back({"tokens", stack(mbs, &MicroBatch::tokens)});
  tensors.push_back({"targets", stack(mbs, &MicroBatch::targets)});
  TensorMetadata meta = {
      {"family", family_name(family)},
      {"vocab_size", fmt::format("{}", m.vocab_size)},
      {"seq_len", fmt::format("{}", m.seq_len)},
      {"d_model", fmt::format("{}", m.d_model)},
      {"n_layers", fmt::format("{}", m.n_layers)},
      {"n_heads", fmt::format("{}", m.n_heads)},
      {"n_kv_heads", fmt::format("{}", m.n_kv_heads)},
      {"ffn_hidden", fmt::format("{}", m.ffn_hidden)},
      {"norm_eps", fmt::format("{:.17g}", m.norm_eps)},
      {"rope_theta", fmt::format("{:.17g}", m.rope_theta)},
      {"tie_embeddings", m.tie_embeddings ? "1" : "0"},
      {"micro_batches", fmt::format("{}", kRefMicroBatches)},
      {"B", fmt::format("{}", kRefB)},
      {"T", fmt::format("{}", kRefT)},
  };
  if (m.is_moe()) {
    meta["n_experts"] = fmt::format("{}", m.n_experts);
    meta["top_k"] = fmt::format("{}", m.top_k);
    meta["aux_loss_coef"] = fmt::format("{:.17g}", m.aux_loss_coef);
    meta["norm_topk"] = m.norm_topk ? "1" : "0";
  }
  const auto path = dir / fmt::format("{}_in.safetensors", family_name(family));
  write_safetensors(path.string(), tensors, meta);
  fmt::print("wrote {}\n", path.string());
}

}  // namespace
}  // namespace dhelix::test

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s OUT_DIR\n", argv[0]);
    return 2;
  }
  try {
    std::filesystem::create_directories(argv[1]);
    for (auto f : {dhelix::ModelFamily::kGPT, dhelix::ModelFamily::kLlama, dhelix::ModelFamily::kMoE})
      dhelix::test::write_inputs(f, argv[1]);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "dump_reference_inputs: %s\n", e.what());
    return 1;
  }
  return 0;
}
