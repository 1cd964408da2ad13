// ModelHarness: one single-process model (ParamStore + StepRunner, tp = dp = 1) for the whole-model
// tests and for the dumper that writes the PyTorch oracle's inputs. It runs a step (forward +
// backward of every micro-batch, no optimizer) and reads back full gradients, per-token losses and
// logits. Not here: data files, optimizers, collectives.
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "base/Trace.h"
#include "model/ModelConfig.h"
#include "model/Params.h"
#include "sharding/ModelPrograms.h"
#include "parallel/ParamStore.h"
#include "runtime/StepParts.h"
#include "runtime/StepRunner.h"

namespace dhelix::test {

// The shapes the PyTorch fixtures are made for: vocab 96 (padded to 128, so padding rows are
// exercised), 2 layers, d 32, 4 heads (2 kv heads for Llama and MoE), B = 2, T = 16, 2 micro-batches;
// MoE: 4 experts of hidden 24, top-2, aux coefficient 0.1.
ModelConfig reference_config(ModelFamily family);
constexpr int64_t kRefB = 2;
constexpr int64_t kRefT = 16;
constexpr int kRefMicroBatches = 2;

// Full internal tensors (ParamSpec::full shapes) with every entry random, so no gradient path is
// hidden by a zero bias or a unit norm weight: matrices N(0, 0.2^2) (about 1/sqrt(d) for d = 32,
// giving non-uniform attention and O(1) logits), norm weights 1 + N(0, 0.2^2), biases and
// positions N(0, 0.1^2); vocabulary padding rows are zero.
std::map<std::string, Tensor> random_full_values(const ModelConfig& m, uint64_t seed);

// `count` micro-batches of uniform tokens and targets in [0, vocab_size).
std::vector<MicroBatch> random_micro_batches(const ModelConfig& m, const MicroBatchShape& mb, int count, uint64_t seed);

class ModelHarness {
 public:
  // Parameters start from the project's deterministic init (seed 1234). dloss = 1 / (M * B * T).
  // On a GPU (`device` cuda:N, a CUDA build) the parameters move there and the steps run there.
  // `recompute`: the transformer layers' activation recomputation (layout/Layout.h).
  // `recompute_layers`: only the first N layers recompute (0: all).
  // `fuse_epilogues`: the programs after the epilogue-fusion rewrite (sharding/Epilogues.h).
  ModelHarness(const ModelConfig& m, const MicroBatchShape& mb, int micro_batches, Device device = Device::host(),
               Recompute recompute = Recompute::kNone, int recompute_layers = 0, bool fuse_epilogues = false);
  ~ModelHarness();
  ModelHarness(const ModelHarness&) = delete;
  ModelHarness& operator=(const ModelHarness&) = delete;

  const ModelConfig& model() const { return model_; }
  std::vector<ParamSpec> specs() const;
  const ModelPrograms& programs() const { return parts_->progs; }
  // Activation bytes allocated now (between steps, or inside a step's slot hook).
  int64_t activation_bytes() const { return parts_->act_mem.current(); }
  // Every later step's ops (and, on a GPU, their kernels' times from CUDA events) go to `t` (not
  // owned; null: none).
  void set_trace(Trace* t);
  // Overwrites every parameter from full internal tensors.
  void set_values(const std::map<std::string, Tensor>& full);
  // Zeroes the gradients, then runs one step over `mbs` (size must be the constructor's count)
  // with a fresh StepRunner running `pipeline`'s schedule (pp = 1; default block plan), with the runner's slot and
  // backward-unit hooks set when given.
  StepStats step(const std::vector<MicroBatch>& mbs, const PipelineSpec& pipeline,
                 std::function<void(int slot, bool begin)> slot_hook = {},
                 std::function<void(int mb, int unit)> bwd_unit_hook = {});
  // Copies of the accumulated gradients, full internal shapes, keyed by internal name.
  std::map<std::string, Tensor> full_grads() const;
  // MoE: the last step's tokens routed to each expert, [layer * n_experts + e] (RouterStats).
  const std::vector<int64_t>& router_tokens() const;
  // Forward pass of one micro-batch through the executor: the head's per-token "loss" [B*T].
  Tensor forward_token_loss(const MicroBatch& mb);
  // Forward pass without the cross-entropy (which overwrites logits with dlogits): [B*T, vocab].
  Tensor forward_logits(const MicroBatch& mb);

 private:
  Tensor forward_head_buffer(const ModelPrograms& progs, const MicroBatch& mb, const std::string& buf);

  ModelConfig model_;
  MicroBatchShape mb_;
  int micro_batches_;
  std::unique_ptr<StepParts> parts_;
  std::shared_ptr<void> blas_;  // a GPU harness's cuda::Blas (type-erased: host builds have none)
};

}  // namespace dhelix::test
