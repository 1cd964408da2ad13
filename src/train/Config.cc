// The key table and everything generated from it: TOML and flag parsing, range checks, help text
// and to_toml. Cross-field rules (divisibility, parallel sizes) are in validate_cross() below.
// Not here: the model presets themselves (model/ModelConfig.cc via ModelHooks).
#include "train/Config.h"

#include "tensor/Device.h"
#include "tensor/DeviceMemory.h"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <filesystem>
#include <limits>
#include <map>
#include <optional>
#include <sstream>
#include <toml++/toml.h>
#include <variant>

#include "base/CpuFeatures.h"
#include "base/Error.h"
#include "base/Files.h"
#include "base/Log.h"

namespace dhelix {
namespace {

enum class Kind { kInt, kFloat, kBool, kOnOff, kString, kFamily };

const char* kind_name(Kind k) {
  switch (k) {
    case Kind::kInt: return "integer";
    case Kind::kFloat: return "number";
    case Kind::kBool: return "bool";
    case Kind::kOnOff: return "on|off";
    case Kind::kString: return "string";
    case Kind::kFamily: return "gpt|llama|moe";
  }
  return "?";
}

constexpr double kInf = std::numeric_limits<double>::infinity();

struct Field {
  const char* section;
  const char* key;
  Kind kind;
  double lo, hi;  // inclusive range for kInt / kFloat
  const char* help;
  void* (*ref)(RunConfig&);
  std::string name() const { return std::string(section) + "." + key; }
};

#define DHX_F(sec, key, expr, kind, lo, hi, help) \
  Field{sec, key, Kind::kind, lo, hi, help, [](RunConfig& c) -> void* { return &(c.expr); }}

const std::vector<Field>& table() {
  static const std::vector<Field> t = {
      DHX_F("model", "preset", model_preset, kString, 0, 0, "built-in shape to start from; keys below override it"),
      DHX_F("model", "family", model.family, kFamily, 0, 0, "gpt (LayerNorm, GELU, learned positions), llama (RMSNorm, SwiGLU, RoPE, GQA) or moe (llama attention; the MLP a top-k router over n_experts SwiGLU experts)"),
      DHX_F("model", "vocab_size", model.vocab_size, kInt, 2, 1e9, "vocabulary size (must match the tokenizer)"),
      DHX_F("model", "seq_len", model.seq_len, kInt, 1, 1e9, "context length T of every training window"),
      DHX_F("model", "d_model", model.d_model, kInt, 1, 1e9, "hidden size"),
      DHX_F("model", "n_layers", model.n_layers, kInt, 1, 1e6, "transformer layers"),
      DHX_F("model", "n_heads", model.n_heads, kInt, 1, 1e6, "attention (query) heads"),
      DHX_F("model", "n_kv_heads", model.n_kv_heads, kInt, 1, 1e6, "key/value heads (GQA when < n_heads)"),
      DHX_F("model", "ffn_hidden", model.ffn_hidden, kInt, 1, 1e9, "MLP hidden size (GPT 4*d; Llama SwiGLU)"),
      DHX_F("model", "norm_eps", model.norm_eps, kFloat, 0, 1, "epsilon of LayerNorm/RMSNorm"),
      DHX_F("model", "rope_theta", model.rope_theta, kFloat, 1, kInf, "RoPE base (Llama)"),
      DHX_F("model", "tie_embeddings", model.tie_embeddings, kBool, 0, 0, "share the token embedding with the LM head"),
      DHX_F("model", "init_std", model.init_std, kFloat, 0, 10, "std of the normal weight init"),
      DHX_F("model", "n_experts", model.n_experts, kInt, 1, 1e6, "moe: experts per layer (ffn_hidden is each expert's SwiGLU hidden size)"),
      DHX_F("model", "top_k", model.top_k, kInt, 1, 1e6, "moe: experts each token is routed to (dropless: every token reaches all of them)"),
      DHX_F("model", "aux_loss_coef", model.aux_loss_coef, kFloat, 0, 1e3, "moe: coefficient of the load-balancing loss coef * E * sum_e f_e P_e per layer (Switch); 0 = off"),
      DHX_F("model", "norm_topk", model.norm_topk, kBool, 0, 0, "moe: renormalise the k gate weights to sum to 1 (Mixtral); false: the raw router probabilities"),
      DHX_F("training", "steps", training.steps, kInt, 1, 1e12, "optimizer steps"),
      DHX_F("training", "micro_batch_size", training.micro_batch_size, kInt, 1, 1e9, "sequences per micro-batch per dp rank"),
      DHX_F("training", "micro_batches", training.micro_batches, kInt, 1, 1e9, "micro-batches accumulated per step"),
      DHX_F("training", "lr", training.lr, kFloat, 0, 10, "peak learning rate (after warm-up)"),
      DHX_F("training", "min_lr", training.min_lr, kFloat, 0, 10, "learning rate at the end of the cosine decay"),
      DHX_F("training", "warmup_steps", training.warmup_steps, kInt, 0, 1e12, "linear warm-up steps"),
      DHX_F("training", "weight_decay", training.weight_decay, kFloat, 0, 10, "AdamW decoupled weight decay (matrices only)"),
      DHX_F("training", "beta1", training.beta1, kFloat, 0, 0.999999, "AdamW beta1"),
      DHX_F("training", "beta2", training.beta2, kFloat, 0, 0.999999999, "AdamW beta2"),
      DHX_F("training", "adam_eps", training.adam_eps, kFloat, 1e-30, 1, "AdamW epsilon"),
      DHX_F("training", "grad_clip", training.grad_clip, kFloat, 0, kInf, "clip the global gradient norm to this; 0 = off"),
      DHX_F("training", "seed", training.seed, kInt, 0, 9.2e18, "seed of init, data order and sampling"),
      DHX_F("training", "eval_interval", training.eval_interval, kInt, 0, 1e12, "steps between validation runs; 0 = never"),
      DHX_F("training", "eval_batches", training.eval_batches, kInt, 1, 1e9, "validation micro-batches per evaluation"),
      DHX_F("training", "log_interval", training.log_interval, kInt, 1, 1e12, "steps between metric lines"),
      DHX_F("training", "sample_tokens", training.sample_tokens, kInt, 0, 1e9, "tokens sampled and printed at the end"),
      DHX_F("training", "threads", training.threads, kInt, 0, 4096, "compute threads per rank; 0 = auto"),
      DHX_F("training", "nonfinite", training.nonfinite, kString, 0, 0, "a step with a non-finite loss or gradient norm: skip (no update; counted in the log and metrics) or stop (exit 3, naming the step and tensor); never reaches the weights or a checkpoint"),
      DHX_F("training", "precision", training.precision, kString, 0, 0, "fp32, or bf16: the linear layers' GEMMs (forward, input and weight gradient) and attention's tile products with bf16 operands and fp32 accumulation on AMX or AVX512-BF16 (oneDNN); weights, gradients, optimizer state, softmax, norms and the loss stay fp32"),
      DHX_F("training", "bf16_activations", training.bf16_activations, kOnOff, 0, 0, "with precision = bf16: keep each activation that the backward reads only as a weight-gradient GEMM's input in bf16 from its last forward use (half its bytes; results bitwise the same, since that GEMM rounds it anyway)"),
      DHX_F("training", "recompute", training.recompute, kString, 0, 0, "activation recomputation of the transformer layers (Megatron's granularity): none; selective, the attention core re-run in the layer's backward instead of keeping its output and softmax statistics; full, only each layer's input kept and its forward re-run (collectives too) at the start of its backward. Results bitwise the same; less activation memory, more compute"),
      DHX_F("training", "recompute_layers", training.recompute_layers, kInt, 0, 1e6, "with recompute selective or full: only the first N transformer layers of each pipeline chunk recompute (Megatron's recompute_num_layers, block method), the others keep their activations; 0 = every layer"),
      DHX_F("training", "device", training.device, kString, 0, 0, "cpu, or cuda / cuda:N (a GPU: the CUDA backend, docs/gpu.md); a device this build or machine cannot use is an error naming why, never a silent CPU run"),
      DHX_F("training", "gemm_algo", training.gemm_algo, kString, 0, 0, "GPU runs: how cuBLASLt's algorithm is chosen for each GEMM shape: heuristic (its heuristic's first answer: the same every run, results reproducible run to run) or timed (the fastest of its first 8 answers, timed on the first step's operands: faster where the heuristic misjudges a shape, but the choice may differ between runs, so results repeat only within a run)"),
      DHX_F("training", "gemm_choices", training.gemm_choices, kString, 0, 0, "GPU runs: a file of cuBLASLt algorithm choices (kernels/cuda/GemmChoices.h), one a rank (<stem>.rank<r><ext> when there are several): each GEMM shape it holds runs the algorithm recorded there, the others are chosen by gemm_algo and written to it after the step that first runs them, so a timed choice made once repeats on later runs (results reproducible run to run, as with heuristic). Made on another GPU model or cuBLASLt: refused, naming both. Empty (default): none"),
      DHX_F("training", "fuse_epilogues", training.fuse_epilogues, kString, 0, 0, "GEMM epilogue fusion (sharding/Epilogues.h): GELU after its GEMM, its derivative after the next layer's input-gradient GEMM, and a residual add after a row linear whose sum needs no collective run in those GEMMs' epilogues (cuBLASLt's GELU_AUX, DGELU, and the skip as C): auto (on a GPU, where it saves activation passes and launches), on (the CPU runs the same two kernels: the same bits) or off"),
      DHX_F("training", "wgrad_gemm", training.wgrad_gemm, kString, 0, 0, "GPU runs: how a weight gradient's GEMM runs (kernels/cuda/Gemm.h, Blas::Wgrad): direct (one GEMM adding into the fp32 gradient) or partials (where the gradient has few output tiles for the GPU's SMs, the tokens cut into 2-8 parts, one batched GEMM writing each part's fp32 gradient, then one pass adding them in part order: more SMs busy; the sums in another fixed order, so results stay reproducible run to run); auto = partials on a GPU. The CPU runs its own kernels (direct or auto)"),
      DHX_F("training", "nonfinite_max_skips", training.nonfinite_max_skips, kInt, 1, 1e9, "with nonfinite = skip: this many skipped steps in a row stop the run (exit 3)"),
      DHX_F("data", "prefix", data.prefix, kString, 0, 0, "path prefix of the tokenized <prefix>.bin/.idx"),
      DHX_F("data", "tokenizer", data.tokenizer, kString, 0, 0, "SentencePiece model file"),
      DHX_F("data", "corpus", data.corpus, kString, 0, 0, "text corpus, one document per line"),
      DHX_F("data", "val_fraction", data.val_fraction, kFloat, 0, 0.9, "last fraction of documents held out for validation"),
      DHX_F("parallel", "dp", parallel.dp, kInt, 1, 1e6, "data-parallel size"),
      DHX_F("parallel", "tp", parallel.tp, kInt, 1, 1e6, "tensor-parallel size"),
      DHX_F("parallel", "pp", parallel.pp, kInt, 1, 1e6, "pipeline-parallel stages"),
      DHX_F("parallel", "cp", parallel.cp, kInt, 1, 1e6, "context-parallel size"),
      DHX_F("parallel", "ep", parallel.ep, kInt, 1, 1e6, "moe: expert-parallel size, carved out of dp: ep consecutive dp ranks split the experts and exchange tokens (all-to-all); expert gradients reduce over the dp / ep ranks holding the same experts"),
      DHX_F("parallel", "tp_x", parallel.tp_x, kInt, 1, 1e6, "3D tensor parallelism (AxoNN): Gx, the axis that splits a normal (type A) layer's input features; exclusive with tp"),
      DHX_F("parallel", "tp_y", parallel.tp_y, kInt, 1, 1e6, "3D tensor parallelism: Gy, the axis that splits a type-A layer's output features and the attention heads (tp_x = tp_z = 1 is Megatron's tp)"),
      DHX_F("parallel", "tp_z", parallel.tp_z, kInt, 1, 1e6, "3D tensor parallelism: Gz, the depth axis: each weight block flattened and split over it (ZeRO-3 style), the batch split over it as over dp"),
      DHX_F("parallel", "tp_order", parallel.tp_order, kString, 0, 0, "3D axes from innermost (consecutive ranks) outward: a permutation of xyz"),
      DHX_F("parallel", "overlap_ar", parallel.overlap_ar, kOnOff, 0, 0, "3D TP: the input-gradient all-reduce runs under the weight-gradient GEMM (off: waited for at once)"),
      DHX_F("parallel", "overlap_rs", parallel.overlap_rs, kOnOff, 0, 0, "3D TP: weight-gradient reduce-scatters over z run in the background until the layer's backward ends (off: waited for at once)"),
      DHX_F("parallel", "accumulate_z_grads", parallel.accumulate_z_grads, kOnOff, 0, 0, "3D TP: weight gradients are summed over the step's micro-batches at block size and reduce-scattered over z once, by the last micro-batch (one block of memory per weight; off: a reduce-scatter per micro-batch, as AxoNN)"),
      DHX_F("parallel", "overlap_ag", parallel.overlap_ag, kOnOff, 0, 0, "3D TP: each layer's weight all-gathers over z are issued ahead, at the layer's start (off: each just before its GEMM, waited for at once)"),
      DHX_F("parallel", "keep_gathered", parallel.keep_gathered, kInt, 0, 1e6, "3D TP with tp_z > 1: the first N transformer layers of each pipeline chunk gather their weight blocks over z once a step, in the first micro-batch's forward, and keep them for every micro-batch's forward, backward and recompute (AxoNN's weight caching: per layer and step one gather instead of one per forward, backward and recompute of each micro-batch; memory: the layer's whole blocks held for the step); 0 = every layer gathers again"),
      DHX_F("parallel", "zero", parallel.zero, kInt, 0, 1, "0: replicated optimizer; 1: optimizer state sharded over dp"),
      DHX_F("parallel", "sparse_embed_grad", parallel.sparse_embed_grad, kOnOff, 0, 0, "dp > 1, tp = 1: the last micro-batch's token-embedding gradient is all-gathered as rows (when tokens x dp < 2 x vocab) instead of all-reduced whole at the end of backward"),
      DHX_F("schedule", "strand_interleaving", schedule.strand_interleaving, kOnOff, 0, 0, "co-execute fwd and bwd micro-batches"),
      DHX_F("schedule", "pipeline", schedule.pipeline, kString, 0, 0, "step schedule: 1f1b, interleaved (virtual stages) or w (the folded W: layer l beside layer L+1-l on one stage); `dhelix schedule` draws them"),
      DHX_F("schedule", "virtual_stages", schedule.virtual_stages, kInt, 1, 1e6, "interleaved: model chunks per pipeline rank"),
      DHX_F("schedule", "plan", schedule.plan, kString, 0, 0, "SI plan JSON from `dhelix plan`; empty = default plan"),
      DHX_F("schedule", "expose_collectives", schedule.expose_collectives, kBool, 0, 0, "wait for every collective as soon as it is issued (no overlap at all; for measuring what overlap hides)"),
      DHX_F("comm", "transport", comm.transport, kString, 0, 0, "how ranks move data: gloo (Gloo's TCP mesh; Open MPI launches and bootstraps it) or mpi (Open MPI's own transport)"),
      DHX_F("comm", "precision", comm.precision, kString, 0, 0, "element type of the activation collectives on the wire (TP/SP gathers and reduce-scatters, the context-parallel ring, the expert all-to-alls, 3D TP's activation all-reduces): auto (training.precision), fp32, or bf16 (half the bytes; reductions in fp32 per hop); weights and loss statistics always move in fp32, gradients as comm.grad_precision says"),
      DHX_F("comm", "grad_precision", comm.grad_precision, kString, 0, 0, "element type of the data-parallel gradient buckets on the wire: fp32, or bf16 (each bucket rounded before its all-reduce or ZeRO-1 reduce-scatter, every hop adding in fp32; half the bytes); gradients, their accumulation and the optimizer stay fp32"),
      DHX_F("comm", "timeout_s", comm.timeout_s, kFloat, 0, 1e7, "bound in seconds on every collective and point-to-point wait (a dead or missing rank ends the job); 0 = 120"),
      DHX_F("comm", "nice", comm.nice, kInt, -20, 19, "nice value of the comm threads (a higher scheduling weight lets them move data as soon as they wake on cores busy with compute); 0 = unchanged; best effort without the privilege"),
      DHX_F("comm", "mpi_poll_us", comm.mpi_poll_us, kInt, 1, 100000, "comm.transport = mpi: microseconds a comm thread sleeps between progress tests of a collective in flight"),
      DHX_F("comm", "max_message_bytes", comm.max_message_bytes, kInt, 1, 2147483647, "gloo: the largest single message an op hands to Gloo; larger ones are split into pieces (results unchanged)"),
      DHX_F("comm", "gloo_host", comm.gloo_host, kString, 0, 0, "gloo: the address this rank listens on; empty = loopback when all ranks share one host, else its first non-loopback IPv4 address (may differ between ranks)"),
      DHX_F("comm", "gpu_transport", comm.gpu_transport, kString, 0, 0, "GPU runs: how the ranks' device tensors move: staged (each collective copied to host memory and run over comm.transport; ranks may share one GPU) or nccl (NCCL communicators over the same groups, bootstrapped over them, each op on a stream of its own and its readers ordered after it on the GPU; one GPU per rank: rank i of a host takes the GPU training.device names plus i; pipeline messages stay staged)"),
      DHX_F("comm", "nccl_max_ctas", comm.nccl_max_ctas, kInt, 0, 64, "comm.gpu_transport = nccl: the most thread blocks (CTAs) each NCCL collective kernel occupies (NCCL's maxCTAs): the SMs a collective takes from the other strand's kernels beside it, DHeLlam's SM cap for communication (its libsmctrl does not work on Hopper); 0 = NCCL's own choice"),
      DHX_F("comm", "emulated_link_gbit", comm.emulated_link_gbit, kFloat, 0, 1e6, "GPU runs (training.device = cuda): an emulated link of this many Gbit/s per rank under the staged collectives of ranks sharing a GPU (each op held until its ring bytes at this rate have passed, as the CPU cluster's tc does to a NIC), so that how much of the communication Strand Interleaving hides can be measured on one GPU; 0 = none (the staging copies and the host transport only)"),
      DHX_F("sim", "clusters_dir", sim.clusters_dir, kString, 0, 0, "directory where a cluster preset name (--cluster, --cost-model) is looked up as <name>.toml; empty = <exe>/../configs/clusters, then ./configs/clusters"),
      DHX_F("checkpoint", "dir", checkpoint.dir, kString, 0, 0, "checkpoint directory; empty = <output.dir>/checkpoints"),
      DHX_F("checkpoint", "interval", checkpoint.interval, kInt, 0, 1e12, "steps between checkpoints; 0 = only at the end"),
      DHX_F("checkpoint", "resume", checkpoint.resume, kString, 0, 0, "\"\" (fresh), \"latest\", or a step_XXXXXXXX path"),
      DHX_F("checkpoint", "keep", checkpoint.keep, kInt, 0, 1e9, "checkpoints retained; 0 = all"),
      DHX_F("output", "dir", output.dir, kString, 0, 0, "run directory (resolved config, metrics)"),
      DHX_F("output", "metrics", output.metrics, kString, 0, 0, "metrics JSONL; empty = <output.dir>/metrics.jsonl"),
      DHX_F("output", "trace", output.trace, kString, 0, 0, "Chrome-trace JSON; empty = none"),
      DHX_F("output", "log_level", output.log_level, kString, 0, 0, "least severe log lines printed on stderr: debug, info, warn or error"),
      DHX_F("output", "overwrite", output.overwrite, kBool, 0, 0, "a fresh run (no checkpoint.resume) into a directory holding an earlier run's checkpoints or metrics deletes them; without it the run refuses (exit 2)"),
  };
  return t;
}
#undef DHX_F

const Field* find_field(const std::string& name) {
  for (const Field& f : table())
    if (f.name() == name) return &f;
  return nullptr;
}

size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diag = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diag = up;
    }
  }
  return row[b.size()];
}

std::string unknown_key_message(const std::string& name, const std::string& origin) {
  std::string best;
  size_t best_d = std::numeric_limits<size_t>::max();
  for (const Field& f : table()) {
    size_t d = edit_distance(name, f.name());
    if (d < best_d) best_d = d, best = f.name();
  }
  std::string msg = fmt::format("unknown key '{}' ({})", name, origin);
  if (best_d <= std::max<size_t>(3, name.size() / 3)) msg += fmt::format(": did you mean '{}'?", best);
  else msg += "; see --help for the list of keys";
  return msg;
}

// A scalar as it arrived: TOML values keep their type, flag values are text to be parsed.
using Scalar = std::variant<int64_t, double, bool, std::string>;
struct Incoming {
  Scalar value;
  bool from_flag;
  std::string origin;  // "demo.toml:12" or "--training.steps"
};

std::string scalar_str(const Scalar& s) {
  return std::visit([](const auto& v) -> std::string {
    using V = std::decay_t<decltype(v)>;
    if constexpr (std::is_same_v<V, std::string>) return "\"" + v + "\"";
    else if constexpr (std::is_same_v<V, bool>) return v ? "true" : "false";
    else return fmt::format("{}", v);
  }, s);
}

std::optional<bool> parse_bool(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  if (s == "on" || s == "true" || s == "1" || s == "yes") return true;
  if (s == "off" || s == "false" || s == "0" || s == "no") return false;
  return std::nullopt;
}

// Writes `in` into the field, or appends one message to `errors`.
void assign(const Field& f, const Incoming& in, RunConfig& cfg, std::vector<std::string>& errors) {
  auto bad = [&](const std::string& why) {
    errors.push_back(fmt::format("{} = {} ({}): {}", f.name(), scalar_str(in.value), in.origin, why));
  };
  const std::string* text = std::get_if<std::string>(&in.value);
  void* p = f.ref(cfg);
  auto check_range = [&](double v) {
    if (!(v >= f.lo && v <= f.hi)) {
      bad(f.hi == kInf ? fmt::format("must be >= {}", f.lo) : fmt::format("must be in [{}, {}]", f.lo, f.hi));
      return false;
    }
    return true;
  };
  switch (f.kind) {
    case Kind::kInt: {
      int64_t v = 0;
      if (auto* i = std::get_if<int64_t>(&in.value)) v = *i;
      else if (text && in.from_flag) {
        auto [end, ec] = std::from_chars(text->data(), text->data() + text->size(), v);
        if (ec != std::errc() || end != text->data() + text->size()) return bad("not an integer");
      } else return bad(fmt::format("wrong type: expected an integer"));
      if (check_range(static_cast<double>(v))) *static_cast<int64_t*>(p) = v;
      return;
    }
    case Kind::kFloat: {
      double v = 0;
      if (auto* d = std::get_if<double>(&in.value)) v = *d;
      else if (auto* i = std::get_if<int64_t>(&in.value)) v = static_cast<double>(*i);
      else if (text && in.from_flag) {
        char* end = nullptr;
        v = std::strtod(text->c_str(), &end);
        if (text->empty() || end != text->c_str() + text->size()) return bad("not a number");
      } else return bad("wrong type: expected a number");
      if (!std::isfinite(v)) return bad("not a finite number");
      if (check_range(v)) *static_cast<double*>(p) = v;
      return;
    }
    case Kind::kBool:
    case Kind::kOnOff: {
      std::optional<bool> v;
      if (auto* b = std::get_if<bool>(&in.value)) v = *b;
      else if (text) v = parse_bool(*text);
      if (!v) return bad("expected on|off|true|false");
      *static_cast<bool*>(p) = *v;
      return;
    }
    case Kind::kString:
      if (!text) return bad("wrong type: expected a string");
      *static_cast<std::string*>(p) = *text;
      return;
    case Kind::kFamily:
      if (text && *text == "gpt") *static_cast<ModelFamily*>(p) = ModelFamily::kGPT;
      else if (text && *text == "llama") *static_cast<ModelFamily*>(p) = ModelFamily::kLlama;
      else if (text && *text == "moe") *static_cast<ModelFamily*>(p) = ModelFamily::kMoE;
      else bad("expected \"gpt\", \"llama\" or \"moe\"");
      return;
  }
}

// Reads the TOML text into (key -> Incoming); structural problems go to `errors`.
void collect_toml(const std::string& text, const std::string& origin, std::map<std::string, Incoming>& out,
                  std::vector<std::string>& errors) {
  toml::table root;
  try {
    root = toml::parse(text, origin);
  } catch (const toml::parse_error& e) {
    const auto& b = e.source().begin;
    throw ConfigError(fmt::format("{}:{}:{}: TOML syntax error: {}", origin, b.line, b.column, e.description()));
  }
  for (const auto& [sec_key, sec_node] : root) {
    std::string sec(sec_key.str());
    const toml::table* sec_table = sec_node.as_table();
    if (!sec_table) {
      errors.push_back(fmt::format("{}:{}: top-level key '{}' is not a [section]; keys live in sections "
                                   "like [training]", origin, sec_node.source().begin.line, sec));
      continue;
    }
    for (const auto& [key, node] : *sec_table) {
      std::string name = sec + "." + std::string(key.str());
      std::string where = fmt::format("{}:{}", origin, node.source().begin.line);
      if (!find_field(name)) {
        errors.push_back(unknown_key_message(name, where));
        continue;
      }
      Scalar s;
      if (auto v = node.value_exact<int64_t>()) s = *v;
      else if (auto d = node.value_exact<double>()) s = *d;
      else if (auto b = node.value_exact<bool>()) s = *b;
      else if (auto str = node.value_exact<std::string>()) s = *str;
      else {
        const char* got = node.is_array() ? "array" : node.is_table() ? "table" : "date/time";
        errors.push_back(fmt::format("{} ({}): wrong type: expected a {}, got a {}", name, where,
                                     kind_name(find_field(name)->kind), got));
        continue;
      }
      out[name] = Incoming{s, false, where};
    }
  }
}

// Basic model rules, used when no ModelConfig::validate hook is bound.
std::vector<std::string> basic_model_checks(const ModelConfig& m) {
  std::vector<std::string> e;
  if (m.n_heads > 0 && m.d_model % m.n_heads != 0)
    e.push_back(fmt::format("model.d_model={} is not divisible by model.n_heads={}", m.d_model, m.n_heads));
  if (m.n_kv_heads > 0 && m.n_heads % m.n_kv_heads != 0)
    e.push_back(fmt::format("model.n_heads={} is not divisible by model.n_kv_heads={}", m.n_heads, m.n_kv_heads));
  if (m.family == ModelFamily::kGPT && m.n_kv_heads != m.n_heads)
    e.push_back(fmt::format("model.family=gpt needs n_kv_heads == n_heads (got {} and {})", m.n_kv_heads, m.n_heads));
  return e;
}

// training.device: cpu, or a GPU this build and machine can use (the reason otherwise), and on a
// GPU only what the GPU path runs so far: data, tensor, pipeline and expert parallelism (ranks with
// one GPU each or sharing one, their collectives and pipeline messages over staged groups), GPT-2 /
// Llama models and MoE ones at tp = 1, bf16 mixed precision, attention head sizes the GPU kernels have (a trace is written: its compute
// lanes come from CUDA events, Executor::flush_trace). Every refusal names the key, its value and
// what to change; all are listed together.
void check_device(const RunConfig& c, std::vector<std::string>& e) {
  const std::string& fe = c.training.fuse_epilogues;
  if (fe != "auto" && fe != "on" && fe != "off")
    e.push_back(fmt::format("training.fuse_epilogues=\"{}\" is not a choice; use auto (fused on a GPU), on or off", fe));
  const std::string& text = c.training.device;
  Device d;
  try {
    d = parse_device(text);
  } catch (const ConfigError& x) {
    e.push_back(fmt::format("training.{}", x.what()));
    return;
  }
  const std::string& gt = c.comm.gpu_transport;
  if (gt != "staged" && gt != "nccl")
    e.push_back(fmt::format("comm.gpu_transport=\"{}\" is not a GPU transport; use staged or nccl", gt));
  const std::string& ga = c.training.gemm_algo;
  if (ga != "heuristic" && ga != "timed")
    e.push_back(fmt::format("training.gemm_algo=\"{}\" is not a way to choose GEMM algorithms; use heuristic or timed", ga));
  const std::string& wg = c.training.wgrad_gemm;
  if (wg != "auto" && wg != "direct" && wg != "partials")
    e.push_back(fmt::format("training.wgrad_gemm=\"{}\" is not a way to run weight-gradient GEMMs; use auto, direct or "
                            "partials",
                            wg));
  if (d.is_host()) {
    if (!c.training.gemm_choices.empty())
      e.push_back(fmt::format("training.gemm_choices=\"{}\" records cuBLASLt's algorithms on a GPU; training.device=\"{}\" "
                              "trains on the CPU; leave it empty, or use cuda",
                              c.training.gemm_choices, text));
    if (wg == "partials")
      e.push_back(fmt::format("training.wgrad_gemm=\"partials\" runs cuBLASLt's batched GEMMs on a GPU; "
                              "training.device=\"{}\" trains on the CPU; set it to auto or direct, or use cuda",
                              text));
    if (ga == "timed")
      e.push_back(fmt::format("training.gemm_algo=\"timed\" chooses cuBLASLt's algorithms on a GPU; training.device=\"{}\" "
                              "trains on the CPU; set it to heuristic, or use cuda",
                              text));
    if (gt == "nccl")
      e.push_back(fmt::format("comm.gpu_transport=\"nccl\" moves GPU tensors; training.device=\"{}\" trains on the "
                              "CPU (its ranks move their bytes over comm.transport); set it to staged, or use cuda",
                              text));
    if (c.comm.nccl_max_ctas > 0)
      e.push_back(fmt::format("comm.nccl_max_ctas={} caps NCCL's kernels on a GPU; training.device=\"{}\" trains on the "
                              "CPU; set it to 0, or use cuda with comm.gpu_transport=\"nccl\"",
                              c.comm.nccl_max_ctas, text));
    if (c.comm.emulated_link_gbit > 0)
      e.push_back(fmt::format("comm.emulated_link_gbit={} paces a GPU run's staged collectives; training.device=\"{}\" "
                              "moves its bytes over the real transport (emulate a CPU cluster's links with "
                              "scripts/cluster); set it to 0",
                              c.comm.emulated_link_gbit, text));
    return;
  }
  const std::string why = device_unavailable(d);
  if (!why.empty()) e.push_back(fmt::format("training.device=\"{}\": {}; use cpu", text, why));
  const ParallelConfig& p = c.parallel;
  const std::string on = fmt::format("training.device=\"{}\"", text);
  if (gt != "nccl" && c.comm.nccl_max_ctas > 0)
    e.push_back(fmt::format("{}: comm.nccl_max_ctas={} caps NCCL's collective kernels, and comm.gpu_transport=\"{}\" "
                            "moves the bytes with copies (no kernels to cap); set it to 0, or use the nccl transport",
                            on, c.comm.nccl_max_ctas, gt));
  if (gt == "nccl" && c.comm.emulated_link_gbit > 0)
    e.push_back(fmt::format("{}: comm.emulated_link_gbit={} paces staged collectives, and comm.gpu_transport=\"nccl\" "
                            "moves them over the real links; set it to 0, or use the staged transport",
                            on, c.comm.emulated_link_gbit));
  if (c.comm.emulated_link_gbit > 0 && p.dp * p.tp * p.pp * p.cp * p.tp_x * p.tp_y * p.tp_z == 1)
    e.push_back(fmt::format("{}: comm.emulated_link_gbit={} paces the collectives between ranks, and this run has one "
                            "rank (parallel.dp = tp = pp = cp = 1, no 3D grid); set it to 0, or run more ranks",
                            on, c.comm.emulated_link_gbit));
  if (c.training.precision != "bf16")
    e.push_back(fmt::format("{} trains in bf16 mixed precision (bf16 GEMMs and attention, fp32 weights, optimizer "
                            "and loss); training.precision=\"{}\": set it to bf16",
                            on, c.training.precision));
  if (c.model.n_heads > 0 && c.model.d_model % c.model.n_heads == 0) {
    const int64_t D = c.model.head_dim();
    if (D != 32 && D != 64 && D != 128)
      e.push_back(fmt::format("{}: the GPU attention runs head sizes 32, 64 and 128; model.d_model / model.n_heads "
                              "= {} / {} = {}",
                              on, c.model.d_model, c.model.n_heads, D));
  }
}

void validate_cross(const RunConfig& c, const ModelHooks& hooks, std::vector<std::string>& e) {
  const ModelConfig& m = c.model;
  for (auto& msg : hooks.validate ? hooks.validate(m) : basic_model_checks(m)) e.push_back(msg);
  const TrainingConfig& t = c.training;
  const ParallelConfig& p = c.parallel;
  if (t.min_lr > t.lr) e.push_back(fmt::format("training.min_lr={} exceeds training.lr={}", t.min_lr, t.lr));
  auto divides = [&](const char* what, int64_t value, const char* by, int64_t n) {
    if (n > 0 && value % n != 0)
      e.push_back(fmt::format("{}={} is not divisible by {}={}", what, value, by, n));
  };
  // Products of sizes, computed wide: a world or batch past its type is refused before anything
  // multiplies it in int (which would wrap into "launch with mpirun -np 0").
  const double ranks = double(p.dp) * double(p.pp) * double(p.cp) * double(p.tp) * double(p.tp_x) * double(p.tp_y) *
                       double(p.tp_z);
  if (ranks > 1e6)
    e.push_back(fmt::format("parallel.dp x pp x cp x tp x tp_x x tp_y x tp_z = {:.4g} ranks; at most 1000000", ranks));
  const double tokens = double(t.micro_batch_size) * double(t.micro_batches) * double(p.dp) * double(p.tp_z) *
                        double(m.seq_len);
  if (tokens > 1e15)
    e.push_back(fmt::format("training.micro_batch_size x micro_batches x parallel.dp x tp_z x model.seq_len = {:.4g} "
                            "tokens per step; at most 1e15",
                            tokens));
  if (ranks > 1e6 || tokens > 1e15) return;  // the checks below multiply these sizes in int
  divides("model.n_heads", m.n_heads, "parallel.tp", p.tp);
  divides("model.n_kv_heads", m.n_kv_heads, "parallel.tp", p.tp);
  divides("model.ffn_hidden", m.ffn_hidden, "parallel.tp", p.tp);
  if (p.cp > 1) {
    // Context parallelism cuts each sequence into 2*cp chunks (rank r holds chunks r and 2cp-1-r).
    if (m.seq_len % (2 * p.cp) != 0)
      e.push_back(fmt::format("model.seq_len={} is not divisible by 2*parallel.cp={} (context parallelism cuts each "
                              "sequence into 2*cp chunks; e.g. seq_len={})",
                              m.seq_len, 2 * p.cp, (m.seq_len / (2 * p.cp) + 1) * 2 * p.cp));
    else if (p.tp > 1 && (m.seq_len / p.cp) % p.tp != 0)
      e.push_back(fmt::format("model.seq_len / parallel.cp = {} local rows are not divisible by parallel.tp={} "
                              "(sequence parallelism shards each rank's rows)", m.seq_len / p.cp, p.tp));
  }
  divides("parallel.dp", p.dp, "parallel.ep", p.ep);
  // tp > 1 always runs Megatron's sequence parallelism: norms, residuals and dropout see T / tp rows.
  divides("model.seq_len", m.seq_len, "parallel.tp (sequence parallelism shards the sequence)", p.tp);
  // 3D tensor parallelism (AxoNN): residual features split over x, heads and MLP features over y,
  // every weight block flattened and split over z.
  const bool grid3d = p.tp_x * p.tp_y * p.tp_z > 1;
  // refused: tp 3d -- Megatron's tp is the 3D grid with Gx = Gz = 1: set one or the other
  if (grid3d && p.tp > 1)
    e.push_back(fmt::format("parallel.tp={} cannot be mixed with the 3D grid parallel.tp_x={} tp_y={} tp_z={}: Megatron's "
                            "tp is the 3D grid with Gx = Gz = 1 (set tp=1, tp_y={}), or set tp_x = tp_y = tp_z = 1",
                            p.tp, p.tp_x, p.tp_y, p.tp_z, p.tp));
  {
    std::string o = c.parallel.tp_order;
    std::sort(o.begin(), o.end());
    if (o != "xyz")
      e.push_back(fmt::format("parallel.tp_order=\"{}\" is not an order of the axes x, y, z (e.g. xyz, yxz, zyx)",
                              c.parallel.tp_order));
  }
  if (grid3d) {
    divides("model.d_model", m.d_model, "parallel.tp_x (the residual stream's features are split over x)", p.tp_x);
    divides("model.n_heads", m.n_heads, "parallel.tp_y (attention heads are split over y)", p.tp_y);
    divides("model.n_kv_heads", m.n_kv_heads, "parallel.tp_y (attention heads are split over y)", p.tp_y);
    divides("model.ffn_hidden", m.ffn_hidden, "parallel.tp_y (MLP features are split over y)", p.tp_y);
  }
  // keep_gathered needs a depth axis: only the 3D grid's z gathers weight blocks
  if (p.keep_gathered > 0 && p.tp_z == 1)
    e.push_back(fmt::format("parallel.keep_gathered={} keeps the weight blocks gathered over z, but parallel.tp_z=1 "
                            "gathers none; set tp_z > 1 (the 3D grid's depth axis), or keep_gathered to 0",
                            p.keep_gathered));
  if (m.is_moe()) {
    divides("model.n_experts", m.n_experts, "parallel.ep (each expert-parallel rank holds n_experts / ep whole experts)",
            p.ep);
    // On the 3D grid the MoE MLP splits each micro-batch's tokens over the x-y plane (Lowering3D.cc).
    if (grid3d && p.cp >= 1 && p.tp_x >= 1 && p.tp_y >= 1 && (t.micro_batch_size * (m.seq_len / p.cp)) % (int64_t(p.tp_x) * p.tp_y) != 0)
      e.push_back(fmt::format("training.micro_batch_size x model.seq_len / parallel.cp = {} tokens are not divisible "
                              "by parallel.tp_x x tp_y = {} (the MoE MLP on the 3D grid splits each micro-batch's "
                              "tokens over the x-y plane)",
                              t.micro_batch_size * (m.seq_len / p.cp), int64_t(p.tp_x) * p.tp_y));
  } else if (p.ep > 1) {
    e.push_back(fmt::format("parallel.ep={} splits experts, but model.family={} has none; set ep=1 or family=moe", p.ep,
                            family_name(m.family)));
  }
  if (!parse_pipeline_kind(c.schedule.pipeline))
    e.push_back(fmt::format("schedule.pipeline=\"{}\" is not a step schedule; use 1f1b, interleaved or w",
                            c.schedule.pipeline));
  else
    for (auto& msg : pipeline_spec_errors(pipeline_spec(c))) e.push_back(msg);
  // In double: global_batch()'s int64 product itself overflows at the ranges' ends (1e9 x 1e9 x 1e6).
  if (static_cast<double>(t.micro_batch_size) * static_cast<double>(t.micro_batches) * static_cast<double>(p.dp) *
          static_cast<double>(p.tp_z) >
      static_cast<double>(int64_t{1} << 40))
    e.push_back(fmt::format("global batch micro_batch_size {} x micro_batches {} x dp {} overflows", t.micro_batch_size,
                            t.micro_batches, p.dp));
  // ZeRO-1 shards over the replicas of the weights: dp, times cp under context parallelism.
  if (p.zero == 1 && p.dp * p.cp == 1)
    e.push_back("parallel.zero=1 shards optimizer state over dp (x cp), but parallel.dp=1 and cp=1; set zero=0, or "
                "dp>1 or cp>1");
  if (c.comm.precision != "auto" && c.comm.precision != "fp32" && c.comm.precision != "bf16")
    e.push_back(fmt::format("comm.precision=\"{}\" is not a wire precision; use auto, fp32 or bf16", c.comm.precision));
  if (c.comm.grad_precision != "fp32" && c.comm.grad_precision != "bf16")
    e.push_back(fmt::format("comm.grad_precision=\"{}\" is not a gradient wire precision; use fp32 or bf16",
                            c.comm.grad_precision));
  if (c.comm.transport != "gloo" && c.comm.transport != "mpi")
    e.push_back(fmt::format("comm.transport=\"{}\" is not a transport; use gloo or mpi", c.comm.transport));
  if (!parse_log_level(c.output.log_level))
    e.push_back(fmt::format("output.log_level=\"{}\" is not a log level; use debug, info, warn or error",
                            c.output.log_level));
  if (t.precision != "fp32" && t.precision != "bf16")
    e.push_back(fmt::format("training.precision=\"{}\" is not a precision; use fp32 or bf16", t.precision));
  else if (t.precision == "bf16" && t.device == "cpu" && !cpu::bf16_support().usable())
    e.push_back("training.precision=\"bf16\" needs a CPU with AMX-BF16 or AVX512-BF16; this one has neither "
                "(cpuid: amx_bf16 and avx512_bf16 absent); use fp32");
  if (Recompute r; !parse_recompute(t.recompute, r))
    e.push_back(fmt::format("training.recompute=\"{}\" is not a recompute granularity; use none, selective or full",
                            t.recompute));
  else if (r == Recompute::kNone && t.recompute_layers > 0)
    e.push_back(fmt::format("training.recompute_layers={} chooses which layers recompute, but training.recompute="
                            "\"none\"; set recompute to selective or full, or recompute_layers to 0",
                            t.recompute_layers));
  if (t.nonfinite != "skip" && t.nonfinite != "stop")
    e.push_back(fmt::format("training.nonfinite=\"{}\" is not a policy; use skip or stop", t.nonfinite));
  check_device(c, e);
  if (c.data.prefix.empty()) e.push_back("data.prefix is empty");
  if (c.output.dir.empty()) e.push_back("output.dir is empty");
}

std::string toml_quote(const std::string& s) {
  std::string out = "\"";
  for (unsigned char ch : s) {
    if (ch == '"' || ch == '\\') out += '\\', out += static_cast<char>(ch);
    else if (ch == '\n') out += "\\n";
    else if (ch == '\t') out += "\\t";
    else if (ch < 0x20 || ch == 0x7f) out += fmt::format("\\u{:04x}", ch);
    else out += static_cast<char>(ch);
  }
  return out + "\"";
}

std::string value_str(const Field& f, const RunConfig& cfg) {
  void* p = f.ref(const_cast<RunConfig&>(cfg));
  switch (f.kind) {
    case Kind::kInt: return fmt::format("{}", *static_cast<int64_t*>(p));
    case Kind::kFloat: {
      double v = *static_cast<double*>(p);
      std::string s = fmt::format("{}", v);  // shortest text that reads back to the same double
      if (std::isfinite(v) && s.find_first_of(".e") == std::string::npos) s += ".0";
      return s;
    }
    case Kind::kBool: return *static_cast<bool*>(p) ? "true" : "false";
    case Kind::kOnOff: return *static_cast<bool*>(p) ? "\"on\"" : "\"off\"";
    case Kind::kString: return toml_quote(*static_cast<std::string*>(p));
    case Kind::kFamily:
      return fmt::format("\"{}\"", family_name(*static_cast<ModelFamily*>(p)));
  }
  return "";
}

RunConfig resolve(std::map<std::string, Incoming> incoming, const ModelHooks& hooks, std::vector<std::string>& errors) {
  RunConfig cfg;
  // 1. The preset replaces the whole model section; explicit model.* keys then override it.
  auto it = incoming.find("model.preset");
  if (it != incoming.end()) assign(*find_field("model.preset"), it->second, cfg, errors);
  if (hooks.preset) {
    try {
      cfg.model = hooks.preset(cfg.model_preset);
    } catch (const ConfigError& e) {
      errors.push_back(fmt::format("model.preset = \"{}\": {}", cfg.model_preset, e.what()));
    }
  }
  cfg.model.name = cfg.model_preset;
  // 2. Everything else, in table order.
  for (const Field& f : table()) {
    auto in = incoming.find(f.name());
    if (in != incoming.end() && f.name() != "model.preset") assign(f, in->second, cfg, errors);
  }
  // 3. Derived defaults.
  if (cfg.output.metrics.empty()) cfg.output.metrics = cfg.output.dir + "/metrics.jsonl";
  if (cfg.checkpoint.dir.empty()) cfg.checkpoint.dir = cfg.output.dir + "/checkpoints";
  validate_cross(cfg, hooks, errors);
  return cfg;
}

}  // namespace

RunConfig load_config_text(const std::string& toml_text, const std::string& origin, const ConfigOverrides& overrides,
                           const ModelHooks& hooks) {
  std::vector<std::string> errors;
  std::map<std::string, Incoming> incoming;
  collect_toml(toml_text, origin, incoming, errors);
  for (const auto& [name, value] : overrides) {
    if (!find_field(name)) {
      errors.push_back(unknown_key_message(name, "--" + name));
      continue;
    }
    incoming[name] = Incoming{value, true, "--" + name};
  }
  RunConfig cfg = resolve(std::move(incoming), hooks, errors);
  if (!errors.empty()) {
    std::string msg = fmt::format("{} configuration error{}:", errors.size(), errors.size() == 1 ? "" : "s");
    for (const auto& e : errors) msg += "\n  - " + e;
    throw ConfigError(msg);
  }
  return cfg;
}

RunConfig load_config(const std::string& toml_path, const ConfigOverrides& overrides, const ModelHooks& hooks) {
  if (toml_path.empty()) return load_config_text("", "(defaults)", overrides, hooks);
  DHX_CHECK(file_exists(toml_path), IoError, "config file '{}' does not exist", toml_path);
  DHX_CHECK(std::filesystem::is_regular_file(toml_path), IoError,
            "config '{}' is not a regular file (a directory?); pass the path of a TOML file, e.g. configs/demo.toml",
            toml_path);
  return load_config_text(read_file(toml_path), toml_path, overrides, hooks);
}

std::string to_toml(const RunConfig& cfg) {
  std::string out = "# dhelix resolved configuration (every key; `dhelix train --help` explains them)\n";
  std::string section;
  for (const Field& f : table()) {
    if (section != f.section) {
      section = f.section;
      out += fmt::format("\n[{}]\n", section);
    }
    out += fmt::format("{} = {}\n", f.key, value_str(f, cfg));
  }
  return out;
}

std::vector<std::pair<std::string, std::string>> toml_entries(const std::string& to_toml_text) {
  std::vector<std::pair<std::string, std::string>> out;
  std::istringstream in(to_toml_text);
  std::string line, section;
  while (std::getline(in, line)) {
    if (!line.empty() && line[0] == '[') section = line.substr(1, line.find(']') - 1);
    const size_t eq = line.find(" = ");
    if (eq != std::string::npos && line[0] != '#') out.emplace_back(section + "." + line.substr(0, eq), line.substr(eq + 3));
  }
  return out;
}

std::string help_text() {
  RunConfig defaults;
  defaults.output.metrics = "<output.dir>/metrics.jsonl";
  defaults.checkpoint.dir = "<output.dir>/checkpoints";
  std::string out =
      "Every key may be set in the TOML file ([section] key = value) or as a flag --section.key value.\n"
      "Precedence: built-in defaults < model.preset < TOML file < flags. Booleans take on/off/true/false.\n";
  std::string section;
  for (const Field& f : table()) {
    if (section != f.section) out += fmt::format("\n[{}]\n", section = f.section);
    std::string flag = fmt::format("--{} <{}>", f.name(), kind_name(f.kind));
    std::string def = std::string(f.name()) == "model.preset" ? "\"demo\"" : value_str(f, defaults);
    if (std::string(f.section) == "model" && f.name() != "model.preset") def = "from preset";
    out += fmt::format("  {:<44} {} (default: {})\n", flag, f.help, def);
  }
  return out;
}

CliArgs parse_cli_args(const std::vector<std::string>& words) {
  CliArgs args;
  for (size_t i = 0; i < words.size(); ++i) {
    const std::string& w = words[i];
    if (w == "-h" || w == "--help") {
      args.help = true;
    } else if (w == "--config" || w.rfind("--config=", 0) == 0) {
      if (w.size() > 8) args.config_path = w.substr(9);
      else {
        DHX_CHECK(i + 1 < words.size(), ConfigError, "--config needs a path");
        args.config_path = words[++i];
      }
    } else if (w.rfind("--", 0) == 0) {
      std::string name = w.substr(2), value;
      size_t eq = name.find('=');
      const Field* f = find_field(eq == std::string::npos ? name : name.substr(0, eq));
      if (eq != std::string::npos) {
        value = name.substr(eq + 1);
        name.resize(eq);
      } else if (f && (f->kind == Kind::kBool || f->kind == Kind::kOnOff)) {
        // A bare boolean flag means "on"; the next word is its value only if it reads as a boolean.
        if (i + 1 < words.size() && parse_bool(words[i + 1])) value = words[++i];
        else value = "on";
      } else if (i + 1 < words.size() && words[i + 1].rfind("--", 0) != 0) {
        value = words[++i];
      } else {
        throw ConfigError(fmt::format("flag --{} needs a value", name));
      }
      args.overrides.emplace_back(name, value);  // unknown names are reported by load_config
    } else {
      args.positional.push_back(w);
    }
  }
  return args;
}

std::vector<std::string> config_keys() {
  std::vector<std::string> keys;
  for (const Field& f : table()) keys.push_back(f.name());
  return keys;
}

bool fuse_epilogues_for(const RunConfig& cfg, bool gpu) {
  const std::string& fe = cfg.training.fuse_epilogues;
  return fe == "on" || (fe == "auto" && gpu);
}

LayoutConfig layout_config(const RunConfig& cfg) {
  LayoutConfig l;
  l.dp = static_cast<int>(cfg.parallel.dp);
  l.tp = static_cast<int>(cfg.parallel.tp);
  l.pp = static_cast<int>(cfg.parallel.pp);
  l.cp = static_cast<int>(cfg.parallel.cp);
  l.ep = static_cast<int>(cfg.parallel.ep);
  l.sequence_parallel = cfg.parallel.tp > 1;
  parse_recompute(cfg.training.recompute, l.recompute);  // validated: none when unknown
  l.recompute_layers = static_cast<int>(cfg.training.recompute_layers);
  // auto: fused on a GPU (a device string that does not parse is refused by check_device).
  bool gpu = false;
  try {
    gpu = !parse_device(cfg.training.device).is_host();
  } catch (const ConfigError&) {
  }
  l.fuse_epilogues = fuse_epilogues_for(cfg, gpu);
  l.tp_x = static_cast<int>(cfg.parallel.tp_x);
  l.tp_y = static_cast<int>(cfg.parallel.tp_y);
  l.tp_z = static_cast<int>(cfg.parallel.tp_z);
  l.tp_order = cfg.parallel.tp_order;
  l.overlap3d = {cfg.parallel.overlap_ar, cfg.parallel.overlap_rs, cfg.parallel.overlap_ag,
                 cfg.parallel.accumulate_z_grads};
  l.keep_gathered = static_cast<int>(cfg.parallel.keep_gathered);
  return l;
}

PipelineSpec pipeline_spec(const RunConfig& cfg) {
  PipelineSpec s;
  s.kind = parse_pipeline_kind(cfg.schedule.pipeline).value_or(PipelineKind::k1F1B);
  s.pp = static_cast<int>(cfg.parallel.pp);
  s.virtual_stages = static_cast<int>(cfg.schedule.virtual_stages);
  s.n_layers = static_cast<int>(cfg.model.n_layers);
  s.micro_batches = static_cast<int>(cfg.training.micro_batches);
  s.co_execute = cfg.schedule.strand_interleaving ? CoExecute::kOn : CoExecute::kOff;
  return s;
}

}  // namespace dhelix
