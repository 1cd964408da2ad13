// ModelHarness: single-process step runner and forward probes for the whole-model tests.
#include "ModelHarness.h"

#include <algorithm>
#include <random>

#include "base/Error.h"
#include "runtime/Executor.h"
#if DHELIX_HAVE_CUDA
#include "kernels/cuda/Gemm.h"
#endif
#include "sharding/ParamSharding.h"

namespace dhelix::test {

ModelConfig reference_config(ModelFamily family) {
  ModelConfig m;
  m.family = family;
  m.vocab_size = 96;  // not a multiple of 128: the padded table has 32 rows the loss never sees
  m.seq_len = kRefT;
  m.d_model = 32;
  m.n_layers = 2;
  m.n_heads = 4;
  m.norm_eps = 1e-5;
  if (family == ModelFamily::kGPT) {
    m.name = "ref-gpt";
    m.n_kv_heads = 4;
    m.ffn_hidden = 128;
    m.tie_embeddings = true;
  } else {
    m.name = family == ModelFamily::kMoE ? "ref-moe" : "ref-llama";
    m.n_kv_heads = 2;
    m.ffn_hidden = 64;
    m.tie_embeddings = false;
    m.rope_theta = 1000.0;  // not the default, so a hard-coded 10000 would show
  }
  if (family == ModelFamily::kMoE) {
    // 4 experts of hidden 24, top-2, renormalised gates, an aux coefficient large enough that its
    // gradient is a visible part of the router's (a wrong aux term fails the router gradient).
    m.ffn_hidden = 24;
    m.n_experts = 4;
    m.top_k = 2;
    m.aux_loss_coef = 0.1;
    m.norm_topk = true;
  }
  return m;
}

std::map<std::string, Tensor> random_full_values(const ModelConfig& m, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> n01(0.0f, 1.0f);
  std::map<std::string, Tensor> out;
  for (const UnitSpec& u : model_units(m, LayoutConfig{}, 0)) {
    for (const ParamSpec& p : u.params) {
      Tensor t = Tensor::zeros(p.full);
      float* v = t.f32();
      const bool is_norm = p.local.find("norm") != std::string::npos || p.local.rfind("ln", 0) == 0;
      const bool is_vocab = p.local == "wte" || p.local == "lm_head";
      const int64_t n = is_vocab ? m.vocab_size * p.full[1] : t.numel();  // padding rows stay zero
      for (int64_t i = 0; i < n; ++i) {
        if (is_norm && p.local.ends_with(".weight"))
          v[i] = 1.0f + 0.2f * n01(rng);
        else if (p.full.size() == 1 || p.local == "wpe")
          v[i] = 0.1f * n01(rng);
        else
          v[i] = 0.2f * n01(rng);
      }
      out[p.name] = t;
    }
  }
  return out;
}

std::vector<MicroBatch> random_micro_batches(const ModelConfig& m, const MicroBatchShape& mb, int count,
                                             uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int32_t> tok(0, static_cast<int32_t>(m.vocab_size - 1));
  std::vector<MicroBatch> out;
  for (int i = 0; i < count; ++i) {
    MicroBatch b{Tensor::empty({mb.tokens()}, DType::kI32), Tensor::empty({mb.tokens()}, DType::kI32)};
    for (int64_t j = 0; j < mb.tokens(); ++j) b.tokens.data<int32_t>()[j] = tok(rng);
    for (int64_t j = 0; j < mb.tokens(); ++j) b.targets.data<int32_t>()[j] = tok(rng);
    out.push_back(b);
  }
  return out;
}

ModelHarness::ModelHarness(const ModelConfig& m, const MicroBatchShape& mb, int micro_batches, Device device,
                           Recompute recompute, int recompute_layers, bool fuse_epilogues)
    : model_(m), mb_(mb), micro_batches_(micro_batches) {
  StepPartsSpec ps;
  ps.layout.fuse_epilogues = fuse_epilogues;
  ps.model = model_;
  ps.layout.recompute = recompute;
  ps.layout.recompute_layers = recompute_layers;
  ps.mb = mb_;
  ps.tokens_per_step = static_cast<double>(micro_batches_ * mb_.tokens());
  parts_ = std::make_unique<StepParts>(ps);
  if (device.is_host()) return;
#if DHELIX_HAVE_CUDA
  auto blas = std::make_shared<cuda::Blas>(device.index);
  parts_->ctx.blas = blas.get();
  blas_ = blas;
  parts_->ctx.device = device;
  parts_->params->move_to(device, &parts_->state_mem);
#else
  throw DeviceError(fmt::format("ModelHarness on {}: this build has no CUDA backend", device.str()));
#endif
}

ModelHarness::~ModelHarness() = default;

std::vector<ParamSpec> ModelHarness::specs() const {
  std::vector<ParamSpec> out;
  for (const ParamEntry& e : parts_->params->entries()) out.push_back(e.spec);
  return out;
}

void ModelHarness::set_values(const std::map<std::string, Tensor>& full) {
  for (ParamEntry& e : parts_->params->entries()) {
    auto it = full.find(e.spec.name);
    DHX_CHECK(it != full.end(), InternalError, "set_values: no tensor for parameter '{}'", e.spec.name);
    Tensor host = Tensor::empty(e.value.shape());  // a GPU store's values are filled through the host
    extract_shard(e.spec, it->second, host, tp_shard(0, 1));
    e.value.copy_from(host);
  }
  parts_->params->refresh_bf16();
}

void ModelHarness::set_trace(Trace* t) { parts_->ctx.trace = t; }

StepStats ModelHarness::step(const std::vector<MicroBatch>& mbs, const PipelineSpec& pipeline,
                             std::function<void(int, bool)> slot_hook, std::function<void(int, int)> bwd_unit_hook) {
  DHX_CHECK(static_cast<int>(mbs.size()) == micro_batches_, InternalError,
            "step got {} micro-batches, the harness's dloss assumes {}", mbs.size(), micro_batches_);
  parts_->params->zero_grads();
  StepRunner runner(parts_->ctx, parts_->units, parts_->progs, nullptr, pipeline);
  if (slot_hook) runner.set_slot_hook(std::move(slot_hook));
  // The backward-unit hook watches the step as a StepObserver does.
  struct UnitHook final : StepObserver {
    std::function<void(int, int)> fn;
    void on_unit_backward_done(int mb, int unit) override { fn(mb, unit); }
  } hook;
  if (bwd_unit_hook) {
    hook.fn = std::move(bwd_unit_hook);
    runner.add_observer(&hook);
  }
  return runner.run(mbs);
}

const std::vector<int64_t>& ModelHarness::router_tokens() const { return parts_->ctx.router.tokens; }

std::map<std::string, Tensor> ModelHarness::full_grads() const {
  std::map<std::string, Tensor> out;
  for (const ParamEntry& e : parts_->params->entries()) out[e.spec.name] = e.grad.to(Device::host()).clone();
  return out;
}

Tensor ModelHarness::forward_head_buffer(const ModelPrograms& progs, const MicroBatch& mb, const std::string& buf) {
  Executor exec(parts_->ctx, parts_->units, progs);
  const int U = exec.num_units();
  std::vector<std::unique_ptr<UnitEnv>> envs;
  for (int u = 0; u < U; ++u) envs.push_back(std::make_unique<UnitEnv>());
  envs.front()->bufs["tokens"] = mb.tokens.to(parts_->ctx.device, nullptr, exec.compute_stream());
  envs.back()->bufs["targets"] = mb.targets.to(parts_->ctx.device, nullptr, exec.compute_stream());
  for (int u = 0; u < U; ++u) {
    if (u > 0) envs[u]->bufs["x"] = envs[u - 1]->at("y");
    StrandSlot s{0, u, envs[u].get()};
    exec.run_alone(s, StrandKind::kForward);
  }
  return envs.back()->at(buf).to(Device::host()).clone();
}

Tensor ModelHarness::forward_token_loss(const MicroBatch& mb) { return forward_head_buffer(parts_->progs, mb, "loss"); }

Tensor ModelHarness::forward_logits(const MicroBatch& mb) {
  ModelPrograms p = parts_->progs;
  auto& f = p.head.fwd;
  auto it = std::find_if(f.begin(), f.end(), [](const Op& op) { return op.name == "lm_head"; });
  DHX_CHECK(it != f.end(), InternalError, "head program has no 'lm_head' op");
  f.erase(it + 1, f.end());  // drop the cross-entropy, which writes dlogits over the logits
  return forward_head_buffer(p, mb, "logits");
}

}  // namespace dhelix::test
