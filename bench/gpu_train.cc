// GPU training throughput through the engine (issue 35): the step the trainer runs with
// training.device = cuda, wired by the same StepBuilder (runtime/StepBuilder.h) -- the executor
// runs the model's layer programs on the GPU (runtime/CudaOps.cc: bf16 activations, cuBLASLt GEMMs,
// flash attention), then the trainer's GPU optimizer (the gradient norm per parameter tensor, read
// back; clipping; AdamW with the weight-decay mask, writing the bf16 weights). Random tokens; one
// micro-batch per step; each step timed on the host between device synchronisations (so every
// launch and host gap counts), median over the timed steps after warm-up. Not timed: the data
// loader and the loss's all-reduce (host work of microseconds on one GPU). optimizer_s: the median
// of the optimizer's share alone (gradient norm, read back, AdamW), timed inside the same steps.
// (Until 2026-11-27 this bench ran one AdamW launch over all parameters without the mask or
// clipping; its figures of 2026-11-26 and -27 are of that form.) Variants, stepped alternately:
// the first GEMM algorithm choice with the epilogues fused (training.fuse_epilogues = auto on a GPU:
// sharding/Epilogues.h) and partial weight gradients (training.wgrad_gemm = auto: Blas::Wgrad), the
// same with direct weight gradients (what ran before 2026-11-29), the same unfused (fuse_epilogues
// false: the plain programs, what ran before 2026-11-28), so one call measures what each gains, then
// the other choices; a variant whose Step would not fit beside the others' is skipped, named (each
// Step keeps its own model states). With --ordered-dq on, the default's Step again with attention's
// backward in its ordered-dQ form (kernels/cuda/Attention.h AttnBwdForm::kOrderedDq, a process-wide
// switch: the same Step; its fp32 dQ scratch is the kernels' own, scratch_peak_bytes below), stepped
// alternately with the others.
//   dhelix_bench_gpu_train [--models gpt2-124m,llama-1b] [--batch gpt2-124m=16,llama-1b=4] [--seq 1024]
//                          [--steps 10] [--warmup 3] [--gemm-algo heuristic,timed] [--plain on|off]
//                          [--wgrad-direct on|off] [--ordered-dq on|off]
// Prints a table, a line {"model_result":[rows]} as each model is done (a failed model: its error; the
// others still run, exit 1) and, last, one JSON object: tokens_per_s, mfu (989 TFLOP/s), peak_bytes
// (the tensors' peak over the first variant's warm-up steps), scratch_peak_bytes (the kernels' own
// scratch's, outside it: DeviceMemoryStats), ... (non-finite numbers written null).
#include <cuda_runtime_api.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "BenchMain.h"
#include "GpuModels.h"
#include "base/Error.h"
#include "kernels/cuda/Attention.h"
#include "kernels/cuda/Cuda.h"
#include "kernels/cuda/Gemm.h"
#include "runtime/StepBuilder.h"
#include "schedule/Pipelines.h"
#include "tensor/DeviceMemory.h"

namespace dhelix {
namespace {

constexpr double kPeak = 989e12;  // H100/H200 SXM dense bf16

struct Variant {
  std::string algo;  // training.gemm_algo: heuristic or timed
  bool fuse = true;  // training.fuse_epilogues
  bool partials = true;  // training.wgrad_gemm: partials (auto's) or direct
  bool ordered_dq = false;  // attention's backward in the ordered-dQ form (on the first variant's Step)
  std::string label() const {
    return std::string(fuse ? "fused" : "plain") + (partials ? "" : " direct-wgrad") + (ordered_dq ? " ordered-dq" : "");
  }
  // The Step's settings (the attention form is not one of them: a variant differing only in it steps
  // the same Step).
  bool same_step(const Variant& o) const { return algo == o.algo && fuse == o.fuse && partials == o.partials; }
};

// One model's step timed for each variant: one Step per variant, built side by side and stepped
// alternately (the same data), so all see the same machine state; a JSON object per variant.
std::string run_model(const std::string& name, int64_t B, int64_t T, int steps, int warmup,
                      const std::vector<Variant>& variants) {
  const Device gpu = Device::cuda(0);
  StepSpec spec;
  StepPartsSpec& ps = spec.parts;
  ps.model = bench::gpu_model_named(name, T);
  ps.mb = MicroBatchShape{B, T};
  ps.tokens_per_step = static_cast<double>(B * T);
  ps.pipeline = single_stage(CoExecute::kOff);
  spec.device = gpu;
  spec.adamw = AdamWConfig{0.9, 0.95, 1e-8, 0.1, 1.0};
  std::vector<MicroBatch> data;
  std::mt19937 rng(7);
  for (int i = 0; i < 4; ++i) {
    MicroBatch mbt{Tensor::empty({B * T}, DType::kI32), Tensor::empty({B * T}, DType::kI32)};
    for (int64_t j = 0; j < B * T; ++j) {
      mbt.tokens.data<int32_t>()[j] = static_cast<int32_t>(rng() % static_cast<uint32_t>(ps.model.vocab_size));
      mbt.targets.data<int32_t>()[j] = static_cast<int32_t>(rng() % static_cast<uint32_t>(ps.model.vocab_size));
    }
    data.push_back(mbt);
  }
  std::vector<std::unique_ptr<Step>> steps_built;  // one per distinct Step
  std::vector<Step*> built;                        // each kept variant's Step
  std::vector<size_t> runs;                        // steps run on each of steps_built
  std::vector<std::vector<double>> times(variants.size()), opt_times(variants.size());
  std::vector<double> loss(variants.size(), 0.0);
  std::vector<Variant> kept;
  const cuda::AttnBwdForm form0 = cuda::attention_bwd_form();
  auto one_step = [&](size_t k, int s) {
    Step& step = *built[k];
    cuda::set_attention_bwd_form(kept[k].ordered_dq ? cuda::AttnBwdForm::kOrderedDq : form0);
    ++runs[static_cast<size_t>(std::find_if(steps_built.begin(), steps_built.end(),
                                            [&](const auto& p) { return p.get() == &step; }) -
                               steps_built.begin())];
    DHX_CUDA(cudaDeviceSynchronize());
    const auto t0 = std::chrono::steady_clock::now();
    step.params().zero_grads();
    const StepStats st = step.runner->run({data[static_cast<size_t>(s) % data.size()]});
    step.sync->finish();
    // The optimizer's share (gradient norm, read back, AdamW): from the passes' end, a device sync
    // that costs nothing the step would not wait for anyway (grad_norm reads the norm back).
    DHX_CUDA(cudaDeviceSynchronize());
    const auto t1 = std::chrono::steady_clock::now();
    const double norm = step.opt->grad_norm();
    step.opt->update(3e-4, s + 1, norm);
    DHX_CUDA(cudaDeviceSynchronize());
    const auto t2 = std::chrono::steady_clock::now();
    cuda::set_attention_bwd_form(form0);
    const double dt = std::chrono::duration<double>(t2 - t0).count();
    if (s >= warmup) {
      times[k].push_back(dt);
      opt_times[k].push_back(std::chrono::duration<double>(t2 - t1).count());
    }
    loss[k] = st.loss_sum / static_cast<double>(st.tokens);
  };
  // Weight gradients that ran as partials in a step (Blas::partial_wgrads over the steps run on the
  // variant's Step): 0 with direct ones, or where cuBLASLt refused the batched GEMMs.
  auto partials_per_step = [&](size_t k) {
    for (size_t i = 0; i < steps_built.size(); ++i)
      if (steps_built[i].get() == built[k] && built[k]->blas && runs[i] > 0) return built[k]->blas->partial_wgrads() / runs[i];
    return size_t{0};
  };
  // Each Step is built and warmed up alone (the first one's peak is one step's memory: the model
  // states and its activations), then the measured steps alternate between them. A Step that would
  // not fit beside the ones built is left out, named (Llama-1B's three Steps, ~70 GiB, on an 80 GB
  // H100): the model states stay per Step (in use between steps), the activations come and go, so
  // one more Step needs the first's states plus the activations' peak, with 10% to spare, within 95%
  // of the device's memory.
  int64_t peak_one = 0, states_one = 0, scratch_peak_one = 0;
  const double device_bytes = static_cast<double>(cuda::device_info(0).global_bytes);
  for (size_t k = 0; k < variants.size(); ++k) {
    // A variant of a kept one's Step (the attention form alone differs): that Step again.
    const auto twin = std::find_if(kept.begin(), kept.end(), [&](const Variant& o) { return o.same_step(variants[k]); });
    if (twin != kept.end()) {
      built.push_back(built[static_cast<size_t>(twin - kept.begin())]);
      kept.push_back(variants[k]);
      for (int s = 0; s < warmup; ++s) one_step(built.size() - 1, s);
      continue;
    }
    if (k > 0) {
      const double in_use = static_cast<double>(device_memory_stats(gpu).in_use);
      const double need = static_cast<double>(states_one) + 1.1 * static_cast<double>(peak_one - states_one);
      if (in_use + need > 0.95 * device_bytes) {
        std::printf("%-10s gemm_algo %-9s %-5s: skipped: another Step needs ~%.1f GiB beside the %.1f GiB in use, "
                    "past 95%% of the device's %.1f GiB\n",
                    name.c_str(), variants[k].algo.c_str(), variants[k].label().c_str(), need / (1 << 30),
                    in_use / (1 << 30), device_bytes / (1 << 30));
        continue;
      }
    }
    if (k == 0) reset_device_peak(gpu);
    spec.gemms.timed = variants[k].algo == "timed";
    spec.gemms.wgrad_partials = variants[k].partials;
    ps.layout.fuse_epilogues = variants[k].fuse;
    steps_built.push_back(std::make_unique<Step>(spec));
    runs.push_back(0);
    built.push_back(steps_built.back().get());
    built.back()->runner->add_observer(built.back()->sync.get());
    kept.push_back(variants[k]);
    for (int s = 0; s < warmup; ++s) one_step(built.size() - 1, s);
    if (k == 0) {
      const DeviceMemoryStats m = device_memory_stats(gpu);
      peak_one = m.peak_in_use, states_one = m.in_use, scratch_peak_one = m.scratch_peak;
    }
  }
  for (int s = warmup; s < warmup + steps; ++s)
    for (size_t k = 0; k < built.size(); ++k) one_step(k, s);
  std::string out;
  for (size_t k = 0; k < built.size(); ++k) {
    std::vector<double> sorted = times[k];
    std::sort(sorted.begin(), sorted.end());
    const double med = sorted[sorted.size() / 2];
    std::vector<double> opt = opt_times[k];
    std::sort(opt.begin(), opt.end());
    const double opt_med = opt[opt.size() / 2];
    const double tok = static_cast<double>(B * T) / med, fpt = ps.model.flops_per_token(T);
    std::printf("%-10s B=%ld T=%ld gemm_algo %-9s %-5s: step %.2f ms (min %.2f, max %.2f; optimizer %.2f) -> %.0f tok/s, "
                "MFU %.3f, loss %.3f, peak %.1f GiB (one step)\n",
                name.c_str(), static_cast<long>(B), static_cast<long>(T), kept[k].algo.c_str(),
                kept[k].label().c_str(), med * 1e3,
                sorted.front() * 1e3, sorted.back() * 1e3, opt_med * 1e3, tok, tok * fpt / kPeak, loss[k],
                static_cast<double>(peak_one) / (1 << 30));
    out += fmt::format("{}{{\"model\":\"{}\",\"gemm_algo\":\"{}\",\"fuse_epilogues\":{},\"epilogue_fusions\":{},\"wgrad_gemm\":\"{}\",\"partial_wgrads_per_step\":{},\"attention_bwd\":\"{}\",\"batch\":{},\"seq\":{},\"step_s\":{:.6g},"
                       "\"spread\":[{:.6g},{:.6g}],\"optimizer_s\":{:.6g},\"tokens_per_s\":{:.6g},"
                       "\"flops_per_token\":{:.6g},\"mfu\":{:.4g},\"last_loss\":{:.5g},\"peak_bytes\":{},"
                       "\"scratch_peak_bytes\":{}}}",
                       out.empty() ? "" : ",", name, kept[k].algo, kept[k].fuse,
                       built[k]->parts->progs.fusions.total(), kept[k].partials ? "partials" : "direct",
                       partials_per_step(k), kept[k].ordered_dq ? "ordered_dq" : "default", B, T, med, sorted.front(), sorted.back(), opt_med, tok,
                       fpt, tok * fpt / kPeak, loss[k], peak_one, scratch_peak_one);
  }
  return out;
}

int run(int argc, char** argv) {
  std::string models = "gpt2-124m,llama-1b", batch = "gpt2-124m=16,llama-1b=4";
  int64_t T = 1024;
  int steps = 10, warmup = 3;
  std::string gemm_algo = "heuristic,timed", plain = "on", direct = "on", ordered = "off";
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--models") models = v;
    else if (k == "--batch") batch = v;
    else if (k == "--seq") T = std::stoll(v);
    else if (k == "--steps") steps = std::stoi(v);
    else if (k == "--warmup") warmup = std::stoi(v);
    else if (k == "--gemm-algo") gemm_algo = v;
    else if (k == "--plain") plain = v;
    else if (k == "--wgrad-direct") direct = v;
    else if (k == "--ordered-dq") ordered = v;
    else throw ConfigError(fmt::format("unknown flag '{}' (expected --models, --batch, --seq, --steps, --warmup, "
                                       "--gemm-algo, --plain, --wgrad-direct, --ordered-dq)", k));
  }
  if (plain != "on" && plain != "off")
    throw ConfigError(fmt::format("--plain {}: on (also time the first GEMM choice unfused) or off", plain));
  if (direct != "on" && direct != "off")
    throw ConfigError(fmt::format("--wgrad-direct {}: on (also time the first GEMM choice with direct weight-gradient "
                                  "GEMMs) or off", direct));
  if (ordered != "on" && ordered != "off")
    throw ConfigError(fmt::format("--ordered-dq {}: on (also step the default with attention's ordered-dQ backward) "
                                  "or off", ordered));
  std::vector<std::string> algos;
  for (size_t a = 0; a <= gemm_algo.size();) {
    const size_t b = std::min(gemm_algo.find(',', a), gemm_algo.size());
    const std::string one = gemm_algo.substr(a, b - a);
    if (one != "heuristic" && one != "timed")
      throw ConfigError(fmt::format("--gemm-algo {}: '{}' is neither heuristic nor timed (a comma list of them)",
                                    gemm_algo, one));
    algos.push_back(one);
    a = b + 1;
  }
  // In the order they are kept when memory runs short: the default (the first choice, fused, partial
  // weight gradients), the same with direct weight gradients (the partials' gain), unfused (the
  // epilogues' gain), then the other GEMM choices fused.
  std::vector<Variant> variants{{algos.front(), true, true}};
  if (ordered == "on") variants.push_back({algos.front(), true, true, true});
  if (direct == "on") variants.push_back({algos.front(), true, false});
  if (plain == "on") variants.push_back({algos.front(), false, true});
  for (size_t a = 1; a < algos.size(); ++a) variants.push_back({algos[a], true, true});
  cuda::require_device(0);
  const cuda::DeviceInfo info = cuda::device_info(0);
  // Each model's rows also as a line {"model_result":{...}} when it is done, and a model that fails
  // is named with its error while the next still runs (exit 1): a later kill or failure keeps them.
  std::string out;
  bool any_failed = false;
  for (const std::string name : {"gpt2-124m", "llama-1b"}) {
    if (models.find(name) == std::string::npos) continue;
    const size_t at = batch.find(name + "=");
    const int64_t B = at == std::string::npos ? 4 : std::stoll(batch.substr(at + name.size() + 1));
    std::string rows;
    try {
      rows = json_finite(run_model(name, B, T, steps, warmup, variants));
    } catch (const ConfigError&) {
      throw;
    } catch (const std::exception& e) {
      std::printf("%s: failed: %s\n", name.c_str(), e.what());
      rows = fmt::format("{{\"model\":\"{}\",\"batch\":{},\"error\":{}}}", name, B, nlohmann::json(std::string(e.what())).dump());
      any_failed = true;
    }
    std::printf("{\"model_result\":[%s]}\n", rows.c_str());
    out += (out.empty() ? "" : ",") + rows;
  }
  std::printf("{\"device\":\"%s\",\"models\":[%s]}\n", info.name.c_str(), out.c_str());
  return any_failed ? 1 : 0;
}

}  // namespace
}  // namespace dhelix

int main(int argc, char** argv) {
  return dhelix::bench_main("dhelix_bench_gpu_train", [&] { return dhelix::run(argc, argv); }, dhelix::OnFailure::kReturn);
}
