// RunConfig: everything one `dhelix train` run is told, resolved from defaults, a model preset,
// a TOML file and `--section.key value` flags (in that order of precedence, lowest first).
// One table of keys (Config.cc) drives the TOML parser, the flags, help text, validation and the
// printed/saved TOML, so they cannot drift. Not here: the CLI verb dispatch (apps/), the model math.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "layout/Layout.h"
#include "model/ModelConfig.h"
#include "schedule/Pipelines.h"

namespace dhelix {

struct TrainingConfig {
  int64_t steps = 200;
  int64_t micro_batch_size = 8;   // B per dp rank per micro-batch
  int64_t micro_batches = 2;      // gradient-accumulation count per optimizer step
  double lr = 3e-3;
  double min_lr = 3e-4;
  int64_t warmup_steps = 20;
  double weight_decay = 0.1;
  double beta1 = 0.9;
  double beta2 = 0.95;
  double adam_eps = 1e-8;
  double grad_clip = 1.0;         // global-norm clip; 0 = off
  int64_t seed = 1234;
  int64_t eval_interval = 50;     // 0 = never
  int64_t eval_batches = 8;
  int64_t log_interval = 1;
  int64_t sample_tokens = 64;     // tokens sampled and printed at the end; 0 = none
  int64_t threads = 0;            // compute threads per rank; 0 = auto
  std::string nonfinite = "skip"; // a non-finite loss or gradient norm: "skip" the update or "stop" (exit 3)
  int64_t nonfinite_max_skips = 3;  // consecutive skipped steps after which the run stops (exit 3)
  std::string precision = "fp32";    // "bf16": the linear layers' GEMMs in bf16 (kernels/cpu/Bf16.h)
  bool bf16_activations = true;      // bf16: keep activations only weight-gradient GEMMs read in bf16
  std::string recompute = "none";    // activation recomputation of the layers: none, selective, full
  int64_t recompute_layers = 0;      // with recompute: the first N layers of each pipeline chunk; 0: all
  std::string device = "cpu";        // where the step runs: cpu, or cuda / cuda:N (docs/gpu.md)
  std::string gemm_algo = "heuristic";  // a GPU's cuBLASLt algorithms: heuristic (reproducible) or timed
  std::string gemm_choices;              // a GPU's cuBLASLt choices file (per rank), read and written; "" none
  std::string fuse_epilogues = "auto";  // GELU and residual adds in GEMM epilogues: auto (on a GPU), on, off
  std::string wgrad_gemm = "auto";      // a GPU's weight-gradient GEMMs: auto (partials), direct or partials
};

struct DataConfig {
  std::string prefix = "data/kjv";              // <prefix>.bin / <prefix>.idx (MMIDIDX)
  std::string tokenizer = "data/kjv_bpe.model"; // SentencePiece model
  std::string corpus = "data/kjv.txt";          // one document per line
  double val_fraction = 0.05;                   // last fraction of documents -> validation
};

struct ParallelConfig {
  int64_t dp = 1, tp = 1, pp = 1, cp = 1, ep = 1;
  // AxoNN's 3D tensor parallelism (exclusive with tp > 1): the grid Gx x Gy x Gz, and which of its
  // axes is innermost (consecutive ranks) first.
  int64_t tp_x = 1, tp_y = 1, tp_z = 1;
  std::string tp_order = "xyz";
  // The three overlaps of 3D tensor parallelism (each on by default; off runs the same kernels with
  // the collective waited for where it is issued): the input-gradient all-reduce under the
  // weight-gradient GEMM, the weight-gradient reduce-scatters in the background, the next weights'
  // all-gather prefetched.
  bool overlap_ar = true, overlap_rs = true, overlap_ag = true, accumulate_z_grads = true;
  // AxoNN's weight caching: the first N layers of each pipeline chunk keep their forward's gathered
  // weight blocks for the backward (LayoutConfig::keep_gathered); 0: none.
  int64_t keep_gathered = 0;
  int64_t zero = 0;  // 0: replicated optimizer state; 1: sharded over dp
  bool sparse_embed_grad = true;  // GradSync::enable_sparse_embedding (when it pays)
};

struct ScheduleConfig {
  bool strand_interleaving = true;  // "on" | "off"
  std::string pipeline = "1f1b";    // step schedule: "1f1b" | "interleaved" | "w" (schedule/Pipelines.h)
  int64_t virtual_stages = 1;       // interleaved: chunks per pp rank
  std::string plan;                 // SI plan JSON; empty = the built-in default plan
  bool expose_collectives = false;  // wait for each collective at issue (measurement only)
};

struct CommConfig {
  std::string transport = "gloo";  // "gloo" (Gloo's TCP mesh, bootstrapped by Open MPI) | "mpi"
  double timeout_s = 120;          // bound on every collective wait; 0 = 120 (the default)
  std::string precision = "auto";  // activation collectives on the wire: "auto" (training.precision) | "fp32" | "bf16"
  std::string grad_precision = "fp32";  // data-parallel gradient buckets on the wire: "fp32" | "bf16"
  int64_t nice = -10;              // comm threads' nice value; 0 = unchanged (CommOptions::nice)
  int64_t mpi_poll_us = 200;       // mpi transport: sleep between progress tests of an op in flight
  int64_t max_message_bytes = int64_t{1} << 30;  // Gloo: larger messages are split into pieces
  std::string gloo_host;           // Gloo's listening address; empty = loopback or first external IPv4
  double emulated_link_gbit = 0;   // GPU runs: each rank's staged collectives paced to this link (0 = none)
  std::string gpu_transport = "staged";  // GPU runs: "staged" (ranks may share a GPU) | "nccl" (a GPU per rank)
  int64_t nccl_max_ctas = 0;       // gpu_transport = nccl: the CTAs an NCCL collective may occupy (0 = NCCL's choice)
};

struct SimConfig {
  std::string clusters_dir;  // where a cluster preset name is looked up; empty = the default places
};

struct CheckpointConfig {
  std::string dir;      // empty = <output.dir>/checkpoints
  int64_t interval = 0; // steps between saves; 0 = only at the end
  std::string resume;   // "" | "latest" | path of a step_XXXXXXXX directory
  int64_t keep = 3;     // checkpoints retained; 0 = all
};

struct OutputConfig {
  std::string dir = "runs/demo";
  std::string metrics;  // empty = <dir>/metrics.jsonl
  std::string trace;    // Chrome-trace JSON path; empty = no trace
  std::string log_level = "info";  // stderr threshold: "debug" | "info" | "warn" | "error"
  bool overwrite = false;  // a fresh run may replace an earlier run's checkpoints and metrics
};

struct RunConfig {
  std::string model_preset = "demo";
  ModelConfig model;  // the preset's fields with explicit keys applied on top
  TrainingConfig training;
  DataConfig data;
  ParallelConfig parallel;
  ScheduleConfig schedule;
  CommConfig comm;
  SimConfig sim;
  CheckpointConfig checkpoint;
  OutputConfig output;

  // Sequences (of seq_len tokens) per optimizer step, over all data replicas (dp, times tp_z under
  // 3D tensor parallelism: the batch is split over z as well).
  int64_t global_batch() const {
    return training.micro_batch_size * training.micro_batches * parallel.dp * parallel.tp_z;
  }
  int64_t tokens_per_step() const { return global_batch() * model.seq_len; }
};

// The model layer is linked by the trainer but not by every test: load_config reaches presets and
// ModelConfig::validate through these hooks. default_model_hooks() (ConfigModelHooks.cc) binds the
// real ones; a null `validate` falls back to the basic divisibility checks in Config.cc.
struct ModelHooks {
  std::function<ModelConfig(const std::string&)> preset;                  // throws ConfigError
  std::function<std::vector<std::string>(const ModelConfig&)> validate;   // one message per rule
};
ModelHooks default_model_hooks();

using ConfigOverrides = std::vector<std::pair<std::string, std::string>>;  // ("training.steps", "10")

// The rank grid a run asks for (sequence parallelism on whenever tp > 1; there is no TP without it).
// Its GEMM epilogues are fused as fuse_epilogues_for says of the run's device (training.device).
LayoutConfig layout_config(const RunConfig& cfg);
// training.fuse_epilogues for a run on a GPU (gpu) or not: on, off, or auto = gpu. The trainer and
// profile ask it of training.device (layout_config); simulate, tune and plan --cost-model, which
// price a run on a cluster preset's devices, ask it of the preset (ClusterPreset::is_gpu).
bool fuse_epilogues_for(const RunConfig& cfg, bool gpu);

// The step schedule a run asks for (kind, pp, virtual stages, layers, micro-batches, co-execution
// from schedule.strand_interleaving). Call on a validated config (the kind name then parses).
PipelineSpec pipeline_spec(const RunConfig& cfg);

// Resolves defaults <- model preset <- TOML file (empty path: none) <- overrides. Every problem
// (unknown key with a "did you mean", wrong type, bad value, inconsistent sizes) is collected and
// thrown as one ConfigError listing them all, one per line. A TOML file that cannot be read or
// parsed throws at once (IoError / ConfigError naming the file and position).
RunConfig load_config(const std::string& toml_path, const ConfigOverrides& overrides,
                      const ModelHooks& hooks = default_model_hooks());
// Same, from TOML text (the `origin` names it in messages).
RunConfig load_config_text(const std::string& toml_text, const std::string& origin,
                           const ConfigOverrides& overrides, const ModelHooks& hooks = default_model_hooks());

// Every key of the table with its resolved value, grouped by section, in table order; loading it
// back gives the same RunConfig. Derived paths (metrics, checkpoint dir) are written resolved.
std::string to_toml(const RunConfig& cfg);
// The ("section.key", value text) pairs of a to_toml() text, in its order (other lines skipped),
// for comparing resolved configs key by key (across ranks, against a checkpoint's).
std::vector<std::pair<std::string, std::string>> toml_entries(const std::string& to_toml_text);

// "--section.key <type>   help (default: value)" for every key, generated from the table.
std::string help_text();

// Splits command-line words into `--config PATH`, `--section.key value` / `--section.key=value`
// overrides (a bare boolean flag means "on") and everything else (positional, in order).
struct CliArgs {
  std::string config_path;
  ConfigOverrides overrides;
  std::vector<std::string> positional;
  bool help = false;  // -h / --help seen
};
CliArgs parse_cli_args(const std::vector<std::string>& words);

// All "section.key" names of the table, in order (for tests and completion).
std::vector<std::string> config_keys();

}  // namespace dhelix
