// Hugging Face tensor names for checkpoints: GPT-2 layout (transformer.h.{i}.attn.c_attn, Conv1D
// weights stored [in, out]), Llama layout (model.layers.{i}.self_attn.q_proj, ...) and, for the moe
// family, Mixtral's (model.layers.{i}.block_sparse_moe.gate / experts.{e}.w1, w2, w3). Converts
// between our full (unsharded) internal tensors and HF tensors: fused q|k|v and gate|up are
// split, GPT-2 Conv1D weights transposed, vocabulary padding rows dropped.
#pragma once
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "model/ModelConfig.h"
#include "model/Params.h"
#include "tensor/Tensor.h"

namespace dhelix {

using TensorList = std::vector<std::pair<std::string, Tensor>>;

// `full` maps internal names (ParamSpec::name) to full tensors (ParamSpec::full shapes).
TensorList to_hf(const ModelConfig& m, const std::map<std::string, Tensor>& full);
// Inverse for the parameters in `specs` (all of the model, or one pipeline stage's), which give the
// internal full shapes (padding rows of the vocabulary are zero). Every HF tensor of the model must
// be present; missing or mis-shaped ones -> IoError naming the tensor, the expected and found shapes.
// A tensor in `hf` that the model does not have (a checkpoint of a deeper model, say) -> IoError
// naming them: nothing is silently dropped. Tensors are f32 or bf16 (widened exactly to f32).
std::map<std::string, Tensor> from_hf(const ModelConfig& m, const std::vector<ParamSpec>& specs,
                                      const TensorList& hf);

}  // namespace dhelix
