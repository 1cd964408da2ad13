// Config table tests. Oracles: hand-written TOML with known errors (every one must be listed),
// to_toml -> load round trip (same resolved text and fields), precedence defaults < preset <
// TOML < flags. Fake model hooks stand in for the model layer (see tests/train/CMakeLists.txt).
#include <gtest/gtest.h>

#include "base/CpuFeatures.h"
#include "base/Error.h"
#include "train/Config.h"
#include "tensor/DeviceMemory.h"

namespace dhelix {
namespace {

ModelHooks fake_hooks() {
  ModelHooks h;
  h.preset = [](const std::string& name) {
    ModelConfig m;
    if (name == "demo") {
      m.vocab_size = 2000, m.seq_len = 128, m.d_model = 256, m.n_layers = 4, m.n_heads = 8, m.n_kv_heads = 4;
      m.ffn_hidden = 688;
    } else if (name == "gpt2-124m") {
      m.family = ModelFamily::kGPT, m.vocab_size = 50257, m.seq_len = 1024, m.d_model = 768, m.n_layers = 12;
      m.n_heads = 12, m.n_kv_heads = 12, m.ffn_hidden = 3072;
    } else {
      throw ConfigError("unknown model preset '" + name + "'; known: demo, gpt2-124m");
    }
    m.name = name;
    return m;
  };
  return h;  // validate: null -> Config.cc's basic checks
}

RunConfig load(const std::string& toml, const ConfigOverrides& ov = {}) {
  return load_config_text(toml, "test.toml", ov, fake_hooks());
}

std::string error_of(const std::string& toml, const ConfigOverrides& ov = {}) {
  try {
    load(toml, ov);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

TEST(Config, DefaultsComeFromThePresetAndDerivedPaths) {
  RunConfig c = load("");
  EXPECT_EQ(c.model_preset, "demo");
  EXPECT_EQ(c.model.d_model, 256);
  EXPECT_EQ(c.model.n_kv_heads, 4);
  EXPECT_EQ(c.output.metrics, c.output.dir + "/metrics.jsonl");
  EXPECT_EQ(c.checkpoint.dir, c.output.dir + "/checkpoints");
  EXPECT_EQ(c.global_batch(), c.training.micro_batch_size * c.training.micro_batches);
}

TEST(Config, ThreeErrorsAreAllListed) {
  // Oracle: three independent mistakes, each must appear in the single ConfigError.
  std::string msg = error_of(
      "[training]\n"
      "stpes = 10\n"          // unknown key -> did you mean training.steps
      "lr = \"fast\"\n"       // wrong type
      "min_lr = 1.0\n"        // cross-field: exceeds lr (default 0.003)
  );
  EXPECT_NE(msg.find("3 configuration errors"), std::string::npos) << msg;
  EXPECT_NE(msg.find("unknown key 'training.stpes' (test.toml:2): did you mean 'training.steps'?"), std::string::npos) << msg;
  EXPECT_NE(msg.find("training.lr = \"fast\" (test.toml:3): wrong type"), std::string::npos) << msg;
  EXPECT_NE(msg.find("training.min_lr=1 exceeds training.lr=0.003"), std::string::npos) << msg;
}

TEST(Config, ModelAndParallelRulesNameTheValues) {
  std::string msg = error_of("[model]\nn_heads = 6\n[parallel]\ntp = 4\n");
  EXPECT_NE(msg.find("model.d_model=256 is not divisible by model.n_heads=6"), std::string::npos) << msg;
  EXPECT_NE(msg.find("model.n_heads=6 is not divisible by model.n_kv_heads=4"), std::string::npos) << msg;
  EXPECT_NE(msg.find("model.n_heads=6 is not divisible by parallel.tp=4"), std::string::npos) << msg;
  msg = error_of("[parallel]\npp = 4\n[training]\nmicro_batches = 2\n");
  EXPECT_NE(msg.find("training.micro_batches=2 is below parallel.pp=4"), std::string::npos) << msg;
  msg = error_of("", {{"model.preset", "gpt5"}});
  EXPECT_NE(msg.find("unknown model preset 'gpt5'"), std::string::npos) << msg;
  msg = error_of("", {{"training.steps", "ten"}, {"training.beta1", "1.5"}, {"model.family", "rnn"}});
  EXPECT_NE(msg.find("training.steps = \"ten\" (--training.steps): not an integer"), std::string::npos) << msg;
  EXPECT_NE(msg.find("training.beta1 = \"1.5\" (--training.beta1): must be in [0, "), std::string::npos) << msg;
  EXPECT_NE(msg.find("expected \"gpt\", \"llama\" or \"moe\""), std::string::npos) << msg;
  msg = error_of("steps = 3\n");
  EXPECT_NE(msg.find("top-level key 'steps' is not a [section]"), std::string::npos) << msg;
}

// Oracle: every impossible pipeline combination of the list is reported in the one error.
TEST(Config, PipelineRulesAreAllReported) {
  std::string msg = error_of(
      "[model]\nn_layers = 12\n[parallel]\npp = 4\n[training]\nmicro_batches = 3\n"
      "[schedule]\npipeline = \"w\"\nvirtual_stages = 2\n");
  EXPECT_NE(msg.find("3 configuration errors"), std::string::npos) << msg;
  EXPECT_NE(msg.find("schedule.virtual_stages=2 applies to schedule.pipeline=interleaved only"), std::string::npos)
      << msg;
  EXPECT_NE(msg.find("model.n_layers=12 is not divisible by 2 x parallel.pp = 8"), std::string::npos) << msg;
  EXPECT_NE(msg.find("training.micro_batches=3 is below parallel.pp=4"), std::string::npos) << msg;
  msg = error_of("[model]\nn_layers = 6\n[parallel]\npp = 2\n[training]\nmicro_batches = 4\n"
                 "[schedule]\npipeline = \"interleaved\"\nvirtual_stages = 2\n");
  EXPECT_NE(msg.find("model.n_layers=6 is not divisible by parallel.pp x schedule.virtual_stages = 2 x 2 = 4"),
            std::string::npos)
      << msg;
  msg = error_of("[schedule]\npipeline = \"zigzag\"\n");
  EXPECT_NE(msg.find("schedule.pipeline=\"zigzag\" is not a step schedule; use 1f1b, interleaved or w"),
            std::string::npos)
      << msg;
  RunConfig ok = load("[model]\nn_layers = 8\n[parallel]\npp = 2\n[training]\nmicro_batches = 4\n"
                      "[schedule]\npipeline = \"w\"\n");
  PipelineSpec s = pipeline_spec(ok);
  EXPECT_EQ(s.kind, PipelineKind::kW);
  EXPECT_EQ(s.pp, 2);
  EXPECT_EQ(s.n_layers, 8);
  EXPECT_EQ(s.micro_batches, 4);
  EXPECT_EQ(s.co_execute, CoExecute::kOn);  // schedule.strand_interleaving defaults to on
}

// The knobs that were environment variables (issue 34): config keys with the old defaults and
// ranges; a bad value names the key, the value and the allowed range or words. Oracle: the
// defaults the environment readers had (nice -10, poll 200 us, 1 GiB, 120 s, info).
// training.device: cpu by default; a misspelt device names the text; a GPU is refused naming why --
// this build has no CUDA (oracle: cuda_built()), this machine has no GPU (device_unavailable), or the
// trainer does not run there yet -- never a silent CPU run.
TEST(Config, DeviceIsCpuOrAGpuRefusedWithTheReason) {
  EXPECT_EQ(load("").training.device, "cpu");
  EXPECT_EQ(load("", {{"training.device", "cpu"}}).training.device, "cpu");
  std::string msg = error_of("", {{"training.device", "gpu"}});
  EXPECT_NE(msg.find("device 'gpu' is not one of cpu, cuda, cuda:N"), std::string::npos) << msg;
  // Oracle: what this build and machine have (cuda_built, device_unavailable, tested on their own):
  // the demo preset in bf16 loads on a usable GPU and is refused with the reason anywhere else.
  const ConfigOverrides gpu_ok = {{"training.device", "cuda"}, {"training.precision", "bf16"}};
  msg = error_of("", gpu_ok);
  const std::string why = !cuda_built()                                  ? "this build has no CUDA backend"
                          : !device_unavailable(Device::cuda(0)).empty() ? "this machine has no GPU"
                                                                         : "";
  if (why.empty())
    EXPECT_EQ(msg, "");
  else
    EXPECT_NE(msg.find("training.device=\"cuda\": " + why), std::string::npos) << msg;
}

// What the GPU path does not run yet is refused by name whether or not this machine has a GPU
// (the checks read the config only), all in one message. Oracle: each key's value in the message.
// training.gemm_algo: heuristic (the default) or timed; anything else is refused naming the value,
// and timed on the CPU (no cuBLASLt to choose from) is refused naming the device. Oracle: the
// values in the messages; timed with cuda is not refused for itself (this machine may lack the GPU,
// which is another message).
TEST(Config, GemmAlgoIsHeuristicOrTimedOnAGpu) {
  EXPECT_EQ(load("").training.gemm_algo, "heuristic");
  const std::string bad = error_of("", {{"training.gemm_algo", "fastest"}});
  EXPECT_NE(bad.find("training.gemm_algo=\"fastest\" is not a way to choose GEMM algorithms; use heuristic or timed"),
            std::string::npos) << bad;
  const std::string cpu = error_of("", {{"training.gemm_algo", "timed"}});
  EXPECT_NE(cpu.find("training.gemm_algo=\"timed\" chooses cuBLASLt's algorithms on a GPU; training.device=\"cpu\""),
            std::string::npos) << cpu;
  const std::string gpu = error_of("", {{"training.gemm_algo", "timed"}, {"training.device", "cuda"},
                                        {"training.precision", "bf16"}});
  EXPECT_EQ(gpu.find("gemm_algo"), std::string::npos) << gpu;
  // training.gemm_choices: empty by default; a file on the CPU is refused naming it and the device,
  // on a GPU it is not refused for itself.
  EXPECT_EQ(load("").training.gemm_choices, "");
  const std::string file_cpu = error_of("", {{"training.gemm_choices", "g.json"}});
  EXPECT_NE(file_cpu.find("training.gemm_choices=\"g.json\" records cuBLASLt's algorithms on a GPU; "
                          "training.device=\"cpu\""),
            std::string::npos) << file_cpu;
  const std::string file_gpu = error_of("", {{"training.gemm_choices", "g.json"}, {"training.device", "cuda"},
                                             {"training.precision", "bf16"}});
  EXPECT_EQ(file_gpu.find("gemm_choices"), std::string::npos) << file_gpu;
}

// training.wgrad_gemm: auto (the default), direct or partials; anything else refused naming the
// value; partials on the CPU (no cuBLASLt) refused naming the device; auto and direct run anywhere.
// Oracle: the values in the messages.
TEST(Config, WgradGemmIsAutoDirectOrPartialsOnAGpu) {
  EXPECT_EQ(load("").training.wgrad_gemm, "auto");
  const std::string bad = error_of("", {{"training.wgrad_gemm", "split"}});
  EXPECT_NE(bad.find("training.wgrad_gemm=\"split\" is not a way to run weight-gradient GEMMs; use auto, direct or "
                     "partials"),
            std::string::npos) << bad;
  const std::string cpu = error_of("", {{"training.wgrad_gemm", "partials"}});
  EXPECT_NE(cpu.find("training.wgrad_gemm=\"partials\" runs cuBLASLt's batched GEMMs on a GPU; training.device=\"cpu\""),
            std::string::npos) << cpu;
  EXPECT_EQ(load("", {{"training.wgrad_gemm", "direct"}}).training.wgrad_gemm, "direct");
  const std::string gpu = error_of("", {{"training.wgrad_gemm", "partials"}, {"training.device", "cuda"},
                                        {"training.precision", "bf16"}});
  EXPECT_EQ(gpu.find("wgrad_gemm"), std::string::npos) << gpu;
}

// training.fuse_epilogues: auto (the default) fuses the programs' GEMM epilogues on a GPU only, on
// and off say so on any device, anything else is refused naming the value. Oracle: the layout the
// config gives every command (layout_config: the trainer, profile, plan and simulate build their
// programs from it), and the value in the message.
TEST(Config, FuseEpiloguesIsAutoOnOrOffAndAutoMeansOnAGpu) {
  RunConfig c = load("");
  EXPECT_EQ(c.training.fuse_epilogues, "auto");
  EXPECT_FALSE(layout_config(c).fuse_epilogues);
  // (The device set after loading: loading cuda here would be refused on a machine without a GPU.)
  c.training.device = "cuda";
  EXPECT_TRUE(layout_config(c).fuse_epilogues);
  c.training.fuse_epilogues = "off";
  EXPECT_FALSE(layout_config(c).fuse_epilogues);
  EXPECT_TRUE(layout_config(load("", {{"training.fuse_epilogues", "on"}})).fuse_epilogues);
  const std::string bad = error_of("", {{"training.fuse_epilogues", "yes"}});
  EXPECT_NE(bad.find("training.fuse_epilogues=\"yes\" is not a choice; use auto (fused on a GPU), on or off"),
            std::string::npos) << bad;
  EXPECT_EQ(error_of("", {{"training.fuse_epilogues", "on"}}), "");
  // The same rule asked of a cluster preset's devices (simulate, tune, plan --cost-model): auto is
  // the device's kind, on and off are what they say.
  for (const char* fe : {"auto", "on", "off"}) {
    c.training.fuse_epilogues = fe;
    const bool auto_ = std::string(fe) == "auto", on = std::string(fe) == "on";
    EXPECT_EQ(fuse_epilogues_for(c, true), auto_ || on) << fe;
    EXPECT_EQ(fuse_epilogues_for(c, false), on) << fe;
  }
}

TEST(Config, DeviceCudaRefusesWhatTheGpuPathDoesNotRunYet) {
  const std::string msg = error_of("", {{"training.device", "cuda:0"},
                                        {"training.precision", "fp32"},
                                        {"parallel.dp", "2"},
                                        {"parallel.tp", "2"},
                                        {"parallel.pp", "2"},
                                        {"parallel.cp", "2"},
                                        {"parallel.zero", "1"},
                                        {"comm.grad_precision", "bf16"},
                                        {"model.n_heads", "2"},
                                        {"model.n_kv_heads", "2"},
                                        {"output.trace", "t.json"}});
  // Every layout runs on GPUs (issue 39): tp = 2, pp = 2 and cp = 2 are not refused.
  EXPECT_EQ(msg.find("parallelism so far"), std::string::npos) << msg;
  EXPECT_EQ(msg.find("parallel.cp"), std::string::npos) << msg;
  // ZeRO-1 and the bf16 gradient wire run on GPUs (issue 39, session 30): not refused.
  EXPECT_EQ(msg.find("comm.grad_precision"), std::string::npos) << msg;
  EXPECT_EQ(msg.find("parallel.zero"), std::string::npos) << msg;
  EXPECT_NE(msg.find("training.precision=\"fp32\": set it to bf16"), std::string::npos) << msg;
  EXPECT_EQ(msg.find("head sizes"), std::string::npos) << msg;  // 256 / 2 = 128 has a kernel: no refusal
  // A trace is written on a GPU too (its compute lanes from CUDA events): not refused.
  EXPECT_EQ(msg.find("output.trace"), std::string::npos) << msg;
  const std::string heads = error_of("", {{"training.device", "cuda"}, {"training.precision", "bf16"},
                                          {"model.n_heads", "16"}, {"model.n_kv_heads", "4"}});
  EXPECT_NE(heads.find("model.d_model / model.n_heads = 256 / 16 = 16"), std::string::npos) << heads;
  // MoE runs on the GPU with tensor, context and expert parallelism and on the 3D grid (session 30).
  for (const char* axis : {"parallel.tp", "parallel.cp", "parallel.tp_x"}) {
    const std::string moe = error_of("", {{"training.device", "cuda"}, {"training.precision", "bf16"},
                                          {"model.family", "moe"}, {"model.n_experts", "4"}, {"model.top_k", "2"},
                                          {axis, "2"}});
    EXPECT_EQ(moe.find("MoE models"), std::string::npos) << axis << ": " << moe;
    EXPECT_EQ(moe.find("so far"), std::string::npos) << axis << ": " << moe;
  }
  // A dense model at cp = 2 (and cp x tp), and on the 3D grid, runs on the GPU: no layout refused (a
  // machine without a GPU still says so).
  const std::string cp_tp = error_of("", {{"training.device", "cuda"}, {"training.precision", "bf16"},
                                          {"parallel.cp", "2"}, {"parallel.tp", "2"}});
  EXPECT_EQ(cp_tp.find("so far"), std::string::npos) << cp_tp;
  EXPECT_EQ(cp_tp.find("parallel."), std::string::npos) << cp_tp;
  const std::string grid = error_of("", {{"training.device", "cuda"}, {"training.precision", "bf16"},
                                         {"parallel.tp_x", "2"}, {"parallel.tp_y", "2"}, {"parallel.tp_z", "2"}});
  EXPECT_EQ(grid.find("parallel."), std::string::npos) << grid;
  const std::string moe_ep = error_of("", {{"training.device", "cuda"}, {"training.precision", "bf16"},
                                           {"model.family", "moe"}, {"model.n_experts", "4"}, {"model.top_k", "2"},
                                           {"parallel.dp", "2"}, {"parallel.ep", "2"}});
  EXPECT_EQ(moe_ep.find("MoE"), std::string::npos) << moe_ep;
  EXPECT_EQ(moe_ep.find("parallelism so far"), std::string::npos) << moe_ep;
  // The emulated link paces a GPU run's staged collectives between ranks: refused with one rank,
  // and on the CPU (whose links are emulated by scripts/cluster's tc).
  const std::string one = error_of("", {{"training.device", "cuda"}, {"training.precision", "bf16"},
                                        {"comm.emulated_link_gbit", "10"}});
  EXPECT_NE(one.find("comm.emulated_link_gbit=10 paces the collectives between ranks, and this run has one rank"),
            std::string::npos)
      << one;
  const std::string cpu = error_of("", {{"comm.emulated_link_gbit", "10"}});
  EXPECT_NE(cpu.find("comm.emulated_link_gbit=10 paces a GPU run's staged collectives; training.device=\"cpu\""),
            std::string::npos)
      << cpu;
  EXPECT_EQ(error_of("", {{"training.device", "cuda"}, {"training.precision", "bf16"}, {"parallel.tp", "2"},
                          {"comm.emulated_link_gbit", "10"}})
                .find("emulated_link_gbit"),
            std::string::npos);
  // comm.gpu_transport: staged or nccl; nccl moves GPU tensors over the real links (refused on the
  // CPU and beside the emulated link, which paces staged collectives), each refusal naming the keys.
  EXPECT_NE(error_of("", {{"comm.gpu_transport", "ib"}}).find("comm.gpu_transport=\"ib\" is not a GPU transport"),
            std::string::npos);
  EXPECT_NE(error_of("", {{"comm.gpu_transport", "nccl"}}).find("comm.gpu_transport=\"nccl\" moves GPU tensors; "
                                                                  "training.device=\"cpu\""),
            std::string::npos);
  const std::string nccl_link = error_of("", {{"training.device", "cuda"}, {"training.precision", "bf16"},
                                              {"parallel.tp", "2"}, {"comm.gpu_transport", "nccl"},
                                              {"comm.emulated_link_gbit", "10"}});
  EXPECT_NE(nccl_link.find("comm.emulated_link_gbit=10 paces staged collectives, and comm.gpu_transport=\"nccl\""),
            std::string::npos)
      << nccl_link;
  EXPECT_EQ(error_of("", {{"training.device", "cuda"}, {"training.precision", "bf16"}, {"parallel.tp", "2"},
                          {"comm.gpu_transport", "nccl"}})
                .find("gpu_transport"),
            std::string::npos);
  // comm.nccl_max_ctas caps NCCL's collective kernels: refused on the CPU and with the staged
  // transport (no kernels to cap), each naming the value; accepted with nccl; out of range by value.
  EXPECT_EQ(load("").comm.nccl_max_ctas, 0);
  const std::string ctas_cpu = error_of("", {{"comm.nccl_max_ctas", "4"}});
  EXPECT_NE(ctas_cpu.find("comm.nccl_max_ctas=4 caps NCCL's kernels on a GPU; training.device=\"cpu\""),
            std::string::npos)
      << ctas_cpu;
  const std::string ctas_staged = error_of("", {{"training.device", "cuda"}, {"training.precision", "bf16"},
                                                {"parallel.tp", "2"}, {"comm.nccl_max_ctas", "4"}});
  EXPECT_NE(ctas_staged.find("comm.nccl_max_ctas=4 caps NCCL's collective kernels, and comm.gpu_transport=\"staged\""),
            std::string::npos)
      << ctas_staged;
  EXPECT_EQ(error_of("", {{"training.device", "cuda"}, {"training.precision", "bf16"}, {"parallel.tp", "2"},
                          {"comm.gpu_transport", "nccl"}, {"comm.nccl_max_ctas", "4"}})
                .find("nccl_max_ctas"),
            std::string::npos);
  EXPECT_NE(error_of("", {{"comm.nccl_max_ctas", "65"}}).find("comm.nccl_max_ctas"), std::string::npos);
}

TEST(Config, FormerEnvironmentKnobsAreKeys) {
  const RunConfig d = load("");
  EXPECT_EQ(d.comm.nice, -10);
  EXPECT_EQ(d.comm.mpi_poll_us, 200);
  EXPECT_EQ(d.comm.max_message_bytes, int64_t{1} << 30);
  EXPECT_EQ(d.comm.gloo_host, "");
  EXPECT_EQ(d.comm.timeout_s, 120);
  EXPECT_EQ(d.output.log_level, "info");
  EXPECT_EQ(d.sim.clusters_dir, "");
  const RunConfig c = load("[comm]\nnice = 0\ngloo_host = \"10.0.0.2\"\n",
                           {{"comm.timeout_s", "20"}, {"comm.max_message_bytes", "65536"},
                            {"output.log_level", "warn"}, {"sim.clusters_dir", "/tmp/presets"}});
  EXPECT_EQ(c.comm.nice, 0);
  EXPECT_EQ(c.comm.gloo_host, "10.0.0.2");
  EXPECT_EQ(c.comm.timeout_s, 20);
  EXPECT_EQ(c.comm.max_message_bytes, 65536);
  EXPECT_EQ(c.output.log_level, "warn");
  EXPECT_EQ(c.sim.clusters_dir, "/tmp/presets");
  const std::string msg = error_of("", {{"comm.nice", "30"}, {"comm.mpi_poll_us", "0"}, {"comm.timeout_s", "-1"},
                                        {"output.log_level", "loud"}});
  EXPECT_NE(msg.find("comm.nice = \"30\" (--comm.nice): must be in [-20, 19]"), std::string::npos) << msg;
  EXPECT_NE(msg.find("comm.mpi_poll_us = \"0\""), std::string::npos) << msg;
  EXPECT_NE(msg.find("comm.timeout_s = \"-1\""), std::string::npos) << msg;
  EXPECT_NE(msg.find("output.log_level=\"loud\" is not a log level; use debug, info, warn or error"),
            std::string::npos)
      << msg;
}

TEST(Config, TomlSyntaxErrorNamesFileAndLine) {
  try {
    load("[training]\nsteps = = 3\n");
    FAIL() << "expected ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("test.toml:2:"), std::string::npos) << e.what();
  }
}

TEST(Config, FlagOverridesTomlAndExplicitKeysOverridePreset) {
  RunConfig c = load("[training]\nsteps = 100\nlr = 1e-3\n[model]\npreset = \"gpt2-124m\"\nn_layers = 2\n",
                     {{"training.steps", "7"}, {"schedule.strand_interleaving", "off"},
                      {"parallel.sparse_embed_grad", "off"}});
  EXPECT_EQ(c.training.steps, 7);               // flag beats TOML
  EXPECT_DOUBLE_EQ(c.training.lr, 1e-3);        // TOML beats default
  EXPECT_EQ(c.model.family, ModelFamily::kGPT); // preset beats default
  EXPECT_EQ(c.model.d_model, 768);
  EXPECT_EQ(c.model.n_layers, 2);               // explicit key beats preset
  EXPECT_FALSE(c.schedule.strand_interleaving);
  EXPECT_FALSE(c.parallel.sparse_embed_grad);
  EXPECT_EQ(c.model.name, "gpt2-124m");
}

TEST(Config, BooleansAcceptOnOffTrueFalse) {
  EXPECT_FALSE(load("[schedule]\nstrand_interleaving = \"off\"\n").schedule.strand_interleaving);
  EXPECT_FALSE(load("[schedule]\nstrand_interleaving = false\n").schedule.strand_interleaving);
  EXPECT_TRUE(load("[schedule]\nexpose_collectives = \"on\"\n").schedule.expose_collectives);
  EXPECT_TRUE(load("", {{"model.tie_embeddings", "true"}}).model.tie_embeddings);
  EXPECT_FALSE(load("", {{"model.tie_embeddings", "off"}}).model.tie_embeddings);
}

TEST(Config, RoundTripThroughToToml) {
  RunConfig a = load(
      "[model]\nfamily = \"llama\"\nnorm_eps = 1e-6\nrope_theta = 500000\n"
      "[training]\nlr = 0.0006\nmin_lr = 6e-05\nbeta2 = 0.999\nseed = 42\n"
      "[data]\nprefix = \"some dir/with \\\"quotes\\\"\"\nval_fraction = 0.1\n"
      "[parallel]\ndp = 2\nzero = 1\n[checkpoint]\nresume = \"latest\"\n[output]\ntrace = \"t.json\"\n");
  std::string text = to_toml(a);
  RunConfig b = load(text);
  EXPECT_EQ(to_toml(b), text);
  EXPECT_EQ(b.data.prefix, "some dir/with \"quotes\"");
  EXPECT_EQ(b.model.norm_eps, 1e-6);  // bitwise: shortest round-trip formatting
  EXPECT_EQ(b.training.min_lr, 6e-05);
  EXPECT_EQ(b.model.rope_theta, 500000.0);
  EXPECT_EQ(b.parallel.zero, 1);
  EXPECT_EQ(b.output.metrics, a.output.metrics);
}

// training.precision = bf16 on a CPU without AMX-BF16 or AVX512-BF16 is refused before anything
// runs, naming what cpuid lacks (oracle: the documented message); with the features it loads.
// The CPU is injected (CpuFeatures.h's test hook), so the refusal is checked on any machine.
TEST(Config, Bf16IsRefusedOnACpuWithoutBf16) {
  const ConfigOverrides bf16 = {{"training.precision", "bf16"}};
  cpu::set_bf16_support_for_tests(cpu::Bf16Support{});
  const std::string msg = error_of("", bf16);
  cpu::set_bf16_support_for_tests(cpu::Bf16Support{false, true});
  const std::string amx = error_of("", bf16);
  cpu::set_bf16_support_for_tests(cpu::Bf16Support{true, false});
  const std::string avx = error_of("", bf16);
  cpu::reset_bf16_support_for_tests();
  EXPECT_NE(msg.find("training.precision=\"bf16\" needs a CPU with AMX-BF16 or AVX512-BF16"), std::string::npos) << msg;
  EXPECT_NE(msg.find("use fp32"), std::string::npos) << msg;
  EXPECT_EQ(amx, "");
  EXPECT_EQ(avx, "");
}

TEST(Config, HelpListsEveryKey) {
  std::string help = help_text();
  for (const auto& k : config_keys()) EXPECT_NE(help.find("--" + k + " "), std::string::npos) << k;
  EXPECT_EQ(config_keys().size(), 91u);  // the table in Config.cc: update when a key is added
}

TEST(Config, CliArgsSplitConfigFlagsAndPositional) {
  CliArgs a = parse_cli_args({"prepare", "--config", "c.toml", "--training.steps", "5", "--model.d_model=64",
                              "--schedule.expose_collectives", "--training.lr", "1e-3"});
  EXPECT_EQ(a.config_path, "c.toml");
  ASSERT_EQ(a.positional.size(), 1u);
  EXPECT_EQ(a.positional[0], "prepare");
  ConfigOverrides want = {{"training.steps", "5"}, {"model.d_model", "64"}, {"schedule.expose_collectives", "on"},
                          {"training.lr", "1e-3"}};
  EXPECT_EQ(a.overrides, want);
  EXPECT_THROW(parse_cli_args({"--training.steps"}), ConfigError);
  CliArgs b = parse_cli_args({"--schedule.expose_collectives", "prepare", "--schedule.strand_interleaving", "off"});
  EXPECT_EQ(b.positional, std::vector<std::string>{"prepare"});
  ConfigOverrides want_b = {{"schedule.expose_collectives", "on"}, {"schedule.strand_interleaving", "off"}};
  EXPECT_EQ(b.overrides, want_b);
  std::string msg = error_of("", {{"trainig.steps", "3"}});
  EXPECT_NE(msg.find("did you mean 'training.steps'"), std::string::npos) << msg;
}

}  // namespace
}  // namespace dhelix
