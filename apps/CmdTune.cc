// `dhelix tune`: ranks every layout of N ranks (Megatron tp x pp x dp and AxoNN's 3D grids) by the
// step model's predicted time on a cluster preset, prints the table and the excluded layouts with
// their reasons, optionally as JSON. --paper-compat ranks the 3D grids by AxoNN's own closed form
// (communication only, axonn.md §4.2) instead. Runs nothing; no hardware.
#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "Commands.h"
#include "VerbFlags.h"
#include "FlagTable.h"
#include "base/Error.h"
#include "base/Files.h"
#include "sim/AxonnModel.h"
#include "TuneConfirm.h"
#include "comm/MpiBackend.h"
#include "sim/LayoutSearch.h"

namespace dhelix {

namespace {

const FlagTable& tune_flags() {
  static const FlagTable t{
      "tune",
      "usage: dhelix tune --model PRESET --gpus N --cluster PRESET [--top K] [--global-batch B] [--seq T]\n"
      "                   [--micro-batch-size b] [--precision native|fp32|bf16] [--grad-precision fp32|bf16]\n"
      "                   [--zero 0|1] [--si on|off] [--sparse-embed-grad on|off]\n"
      "                   [--recompute none|selective|full|auto] [--keep-gathered K|auto]\n"
      "                   [--fuse-epilogues auto|on|off] [--pipeline 1f1b|interleaved|w|all]\n"
      "                   [--virtual-stages V] [--compute-slowdown K] [--comm-slowdown K]\n"
      "                   [--d-model C] [--layers L] [--heads H] [--vocab V] [--only LAYOUTS]\n"
      "                   [--paper-compat] [--json FILE] [--clusters-dir DIR]\n"
      "                   [--confirm STEPS --config C.toml [--rounds R] [--launch CMD] [--workdir DIR]\n"
      "                    [--trace]]\n"
      "Ranks every layout of N ranks -- Megatron tp x pp x dp and the 3D grids x * y * z * pp * dp (all\n"
      "factorisations), each also with cp (dense models) or ep (MoE) cut out of its dp -- by predicted step\n"
      "time on a cluster preset (configs/clusters/*.toml, or a path),\n"
      "then lists the excluded layouts with the reason. Nothing runs.\n",
      {
          {"--model", FlagType::kText, "", "model preset (gpt2-124m, llama-8b, gpt-18b, ...)", "PRESET", {}, {},
           Need::kRequired},
          {"--gpus", FlagType::kInt, "", "ranks (devices)", "N", 1, double(1 << 20), Need::kRequired},
          {"--cluster", FlagType::kText, "",
           "cluster preset name (looked up in --clusters-dir, else <exe>/../configs/clusters,\nthen "
           "./configs/clusters) or a .toml path",
           "PRESET", {}, {}, Need::kRequired},
          {"--clusters-dir", FlagType::kText, "", "directory of the cluster presets that --cluster names", "DIR"},
          {"--top", FlagType::kInt, "10", "rows of the ranked table", "K", 1, double(1 << 20)},
          {"--global-batch", FlagType::kInt, "", "sequences per step (default 8 x N)", "B", 1, double(1 << 30)},
          {"--seq", FlagType::kInt, "", "tokens per sequence (default the model's seq_len)", "T", 1, double(1 << 24)},
          {"--micro-batch-size", FlagType::kInt, "1", "sequences per micro-batch per data replica", "b", 1, double(1 << 20)},
          {"--precision", FlagType::kChoice, "native",
           "native: the preset's (bf16 where it has a bf16 rate, as every GPU preset),\nor fp32 or bf16 (element size 2)",
           "native|fp32|bf16"},
          {"--grad-precision", FlagType::kChoice, "fp32",
           "data-parallel gradient buckets on the wire: fp32 or bf16\n(comm.grad_precision: 2 bytes an element)",
           "fp32|bf16"},
          {"--zero", FlagType::kChoice, "0", "ZeRO-1: optimizer state sharded over dp", "0|1"},
          {"--recompute", FlagType::kChoice, "none",
           "activation recomputation priced for every layout (training.recompute);\nauto: for each layout the least "
           "of none, selective, full with which it fits",
           "none|selective|full|auto"},
          {"--keep-gathered", FlagType::kText, "0",
           "3D layouts with z > 1: the first K layers of each stage keep the weight\nblocks their forward gathered for "
           "the backward (parallel.keep_gathered,\nAxoNN's weight caching); auto: the most layers with which the layout "
           "fits\n(after --recompute's choice)",
           "K|auto"},
          {"--fuse-epilogues", FlagType::kChoice, "auto",
           "price the programs with the GEMM epilogues fused (training.fuse_epilogues):\nauto: on for a preset with a bf16 "
           "figure (the GPUs, whose runs fuse by\ndefault), off for this machine's; --confirm runs set it alike",
           "auto|on|off"},
          {"--pipeline", FlagType::kChoice, "1f1b",
           "the schedule layouts with pp > 1 are priced under (schedule.pipeline): its\nchunks' placement, sends, "
           "bubble and activations in flight; all: a row per\nschedule (--confirm runs set it alike)",
           "1f1b|interleaved|w|all"},
          {"--virtual-stages", FlagType::kInt, "2", "chunks a rank for the interleaved schedule (schedule.virtual_stages)",
           "V", 2, double(1 << 16)},
          {"--si", FlagType::kOnOff, "off", "Strand Interleaving", "on|off"},
          compute_slowdown_flag(),
          comm_slowdown_flag(),
          {"--sparse-embed-grad", FlagType::kOnOff, "off",
           "price parallel.sparse_embed_grad: with dp > 1 and tp = 1 the last\nmicro-batch's token-embedding rows "
           "all-gathered instead of the whole table\nall-reduced (--confirm runs set it alike)",
           "on|off"},
          {"--d-model", FlagType::kInt, "", "override the preset's d_model (GPT: ffn = 4 x d-model)", "C", 1, double(1 << 20)},
          {"--layers", FlagType::kInt, "", "override the preset's layer count", "L", 1, double(1 << 16)},
          {"--heads", FlagType::kInt, "", "override the preset's head count", "H", 1, double(1 << 16)},
          {"--vocab", FlagType::kInt, "", "override the preset's vocabulary", "V", 1, double(1 << 24)},
          {"--only", FlagType::kText, "",
           "rank only these layouts: labels as printed, separated by commas\n(\"tp=2 pp=1 dp=2,x=2 y=1 z=2 dp=1\")",
           "LAYOUTS"},
          {"--paper-compat", FlagType::kSwitch, "",
           "rank the 3D grids by AxoNN's closed form as coded (bf16, communication\nseconds only; axonn.md §4.2), "
           "memory from the step model"},
          {"--json", FlagType::kText, "", "also write the table and the exclusions as JSON", "FILE"},
          {"--confirm", FlagType::kInt, "",
           "run the top K layouts for STEPS steps each with `dhelix train` (the first step\nis a warm-up) and print "
           "the measured median step beside the prediction, with\nKendall's tau, the top-1 regret and the median "
           "error; needs --config (data and\ntraining settings; the model, batch and layout keys are set from tune's)",
           "STEPS", 2, 1e6},
          {"--config", FlagType::kText, "", "with --confirm: the runs' config (data and training settings)", "C.toml"},
          {"--rounds", FlagType::kInt, "1", "runs per layout, alternating the layouts between rounds", "R", 1, double(1000)},
          {"--launch", FlagType::kText, "",
           "launcher prefix, {np} = the layout's ranks (default\n\"mpirun --oversubscribe --bind-to none -np {np}\"; "
           "the emulated cluster:\n\"scripts/cluster --hosts 2 --np-per-host 2 --map-by slot --\")",
           "CMD"},
          {"--workdir", FlagType::kText, "runs/tune", "run directories and logs of --confirm", "DIR"},
          {"--explain", FlagType::kSwitch, "",
           "with --only: print each listed layout's priced ops per strand (one\nmicro-batch: start and seconds of "
           "every compute op and collective)"},
          {"--trace", FlagType::kSwitch, "",
           "each --confirm run also writes a Chrome trace per rank (trace.json.rank<r> in\nits run directory; the "
           "counted steps' op and collective times)"},
          {"--measure-gemm", FlagType::kSwitch, "",
           "price every GEMM op by timing its shape on this machine (one core, scaled by\nthe preset's "
           "device.core_share) instead of the preset's one GEMM rate: for\npresets of this machine (cpu-emulated)"},
      }};
  return t;
}

struct TuneRequest {
  ModelConfig model;
  int gpus = 0;
  ClusterPreset cluster;
  int top = 10;
  BatchSpec batch;
  PredictOptions opt;
  bool paper = false;
  bool measure_gemm = false;
  bool trace = false;    // --confirm runs write Chrome traces
  bool explain = false;  // print the --only layouts' priced ops
  std::optional<std::string> json_path;
  std::vector<std::string> only;  // layout labels
  std::optional<ConfirmOptions> confirm;
};

// The preset named by --model with --d-model, --layers, --heads and --vocab applied.
void apply_model_flags(const FlagValues& f, TuneRequest& req, std::vector<std::string>& errors) {
  if (!f.given("--model")) return;
  try {
    req.model = model_preset(*f.text("--model"));
  } catch (const ConfigError& e) {
    errors.push_back(e.what());
    return;
  }
  const int64_t d = f.given("--d-model") ? f.integer("--d-model") : req.model.d_model;
  const int64_t layers = f.given("--layers") ? f.integer("--layers") : req.model.n_layers;
  const int64_t heads = f.given("--heads") ? f.integer("--heads") : req.model.n_heads;
  if (req.model.family == ModelFamily::kGPT && d != req.model.d_model) req.model.ffn_hidden = 4 * d;
  if (req.model.n_kv_heads == req.model.n_heads) req.model.n_kv_heads = heads;
  req.model.d_model = d, req.model.n_layers = layers, req.model.n_heads = heads;
  if (f.given("--d-model") || f.given("--layers") || f.given("--heads")) req.model.name += " (overridden)";
  if (f.given("--vocab"))
    req.model.vocab_size = f.integer("--vocab"), req.model.name += f.given("--d-model") ? "" : " (overridden)";
}

// --confirm's options, or the errors of its flags given without it.
void apply_confirm_flags(const FlagValues& f, TuneRequest& req, std::vector<std::string>& errors) {
  if (!f.given("--confirm") && f.ok("--confirm")) {  // a bad --confirm was asked for: its errors still show
    for (const char* flag : {"--config", "--rounds", "--launch", "--workdir"})
      if (f.given(flag)) errors.push_back(fmt::format("{} is only for --confirm", flag));
    if (req.trace) errors.push_back("--trace is only for --confirm");
    return;
  }
  ConfirmOptions c;
  if (f.given("--confirm")) c.steps = static_cast<int>(f.integer("--confirm"));
  c.rounds = static_cast<int>(f.integer("--rounds"));
  const std::optional<std::string> config = f.text("--config");
  if (!config) errors.push_back("--confirm needs --config FILE (the runs' data and training settings)");
  else if (!file_exists(*config)) errors.push_back(fmt::format("--config '{}' does not exist", *config));
  c.config_path = config.value_or("");
  if (f.given("--launch")) c.launch = *f.text("--launch");
  c.workdir = f.text_or_default("--workdir");
  c.trace = req.trace;
  if (launched_by_mpirun())
    errors.push_back("--confirm launches its own runs: start dhelix tune directly, not under mpirun");
  if (req.paper) errors.push_back("--confirm runs the step model's ranking; drop --paper-compat");
  req.confirm = c;
}

std::optional<TuneRequest> parse_request(int argc, char** argv) {
  const FlagTable& t = tune_flags();
  std::vector<std::string> errors;
  const std::optional<FlagValues> parsed = parse_flags_or_help(t, argc, argv, errors);
  if (!parsed) return std::nullopt;
  const FlagValues& f = *parsed;
  TuneRequest req;
  req.paper = f.on("--paper-compat"), req.measure_gemm = f.on("--measure-gemm");
  req.trace = f.on("--trace"), req.explain = f.on("--explain");
  apply_model_flags(f, req, errors);
  if (const std::optional<std::string> only = f.text("--only")) {
    std::string rest = *only;
    for (size_t at; !rest.empty(); rest = at == std::string::npos ? "" : rest.substr(at + 1)) {
      at = rest.find(',');
      std::string label = rest.substr(0, at);
      while (!label.empty() && label.front() == ' ') label.erase(label.begin());
      while (!label.empty() && label.back() == ' ') label.pop_back();
      if (!label.empty()) req.only.push_back(label);
    }
    if (req.only.empty()) errors.push_back("--only needs at least one layout label, e.g. \"x=2 y=1 z=2 dp=1\"");
  }
  apply_confirm_flags(f, req, errors);
  const int64_t gpus = f.given("--gpus") ? f.integer("--gpus") : 1;
  const std::string prec = f.text_or_default("--precision");
  req.opt.precision = prec == "bf16" || req.paper ? Precision::kBf16 : Precision::kFp32;
  req.opt.grad_wire_bytes = f.text_or_default("--grad-precision") == "bf16" ? 2 : 4;
  req.opt.zero = f.text_or_default("--zero") == "1" ? Zero::kZero1 : Zero::kNone;
  req.opt.recompute_auto = f.text_or_default("--recompute") == "auto";
  if (!req.opt.recompute_auto) parse_recompute(f.text_or_default("--recompute"), req.opt.recompute);
  {
    const std::string keep = f.text_or_default("--keep-gathered");
    req.opt.keep_gathered_auto = keep == "auto";
    if (!req.opt.keep_gathered_auto) {
      char* end = nullptr;
      const long k = std::strtol(keep.c_str(), &end, 10);
      if (keep.empty() || *end != '\0' || k < 0 || k > 1000000)
        errors.push_back(fmt::format("--keep-gathered \"{}\" is not a layer count (0..1000000) or auto; e.g. "
                                     "--keep-gathered 4 or --keep-gathered auto",
                                     keep));
      else
        req.opt.keep_gathered = static_cast<int>(k);
    }
  }
  req.opt.si = f.on("--si") ? StrandInterleaving::kOn : StrandInterleaving::kOff;
  {
    const std::string pipe = f.text_or_default("--pipeline");
    if (pipe == "all") req.opt.pipelines = {PipelineKind::k1F1B, PipelineKind::kInterleaved, PipelineKind::kW};
    else req.opt.pipeline = parse_pipeline_kind(pipe).value_or(PipelineKind::k1F1B);
    req.opt.virtual_stages = static_cast<int>(f.integer("--virtual-stages"));
    if (f.given("--virtual-stages") && pipe != "interleaved" && pipe != "all")
      errors.push_back(fmt::format("--virtual-stages applies to --pipeline interleaved (or all), not {}", pipe));
  }
  req.opt.sparse_embed = f.on("--sparse-embed-grad") ? SparseEmbedGrad::kOn : SparseEmbedGrad::kOff;
  if (f.given("--compute-slowdown")) req.opt.compute_slowdown = f.number("--compute-slowdown");
  if (f.given("--comm-slowdown")) req.opt.comm_slowdown = f.number("--comm-slowdown");
  if (req.paper && (f.given("--compute-slowdown") || f.given("--comm-slowdown")))
    errors.push_back("--compute-slowdown and --comm-slowdown price the step model's ranking; --paper-compat ranks "
                     "by AxoNN's closed form, which charges no interference: drop one");
  req.json_path = f.text("--json");
  if (f.given("--cluster")) {
    try {
      req.cluster = load_cluster(*f.text("--cluster"), f.text("--clusters-dir").value_or(""));
      if (prec == "native" && !req.paper) req.opt.precision = req.cluster.native_precision();
      const std::string fuse = f.text_or_default("--fuse-epilogues");
      req.opt.fuse_epilogues = fuse == "on" || (fuse == "auto" && req.cluster.is_gpu());
      if (f.ok("--precision")) (void)req.cluster.gemm_rate(req.opt.precision);
    } catch (const ConfigError& e) {
      errors.push_back(e.what());
    }
  }
  if (req.explain && req.only.empty())
    errors.push_back("--explain prints the layouts of --only: name them, e.g. --only \"tp=2 pp=1 dp=2\"");
  if (req.measure_gemm && errors.empty()) {
    try {
      req.opt.gemm_timer = measured_gemm_timer(req.cluster.core_share);
    } catch (const ConfigError& e) {
      errors.push_back(e.what());
    }
  }
  req.gpus = static_cast<int>(std::min<int64_t>(gpus, 1 << 20));
  req.top = static_cast<int>(f.integer("--top"));
  // --seq is the run's context length: the model's too (GPT's learned positions have a row a token,
  // and --confirm trains with model.seq_len = --seq), as simulate and train read it.
  if (f.given("--seq")) req.model.seq_len = f.integer("--seq");
  req.batch = {f.given("--global-batch") ? f.integer("--global-batch") : 8 * gpus, req.model.seq_len,
               f.integer("--micro-batch-size")};
  if (gpus > 65536) errors.push_back(fmt::format("--gpus {} is above the 65536 ranks tune enumerates", gpus));
  throw_flag_errors(t, errors);
  return req;
}

constexpr double kMiB = 1 << 20, kGiB = 1 << 30;

std::string axes_text(const std::map<std::string, AxisCost>& axes) {
  std::string s;
  for (const char* g : {"tp", "x", "y", "z", "xy", "ep", "cp", "pp", "dp", "edp", "dpcp"})
    if (auto it = axes.find(g); it != axes.end() && it->second.bytes > 0)
      s += fmt::format("{}{}:{:.1f}", s.empty() ? "" : " ", g, it->second.bytes / kMiB);
  return s.empty() ? "-" : s;
}

// The JSON's "pipeline": the schedule's name, null without a pipeline.
nlohmann::json pipeline_json(const LayoutConfig& lay, PipelineKind kind) {
  return lay.pp > 1 ? nlohmann::json(pipeline_kind_name(kind)) : nlohmann::json(nullptr);
}

nlohmann::json to_json(const StepPrediction& p, int rank) {
  nlohmann::json axes = nlohmann::json::object();
  for (const auto& [g, a] : p.axes)
    axes[g] = {{"bytes", a.bytes}, {"seconds", a.seconds}, {"exposed_s", a.exposed_s}};
  return {{"rank", rank},
          {"layout", layout_label(p.layout)},
          {"pipeline", pipeline_json(p.layout, p.pipeline)},
          {"virtual_stages", p.virtual_stages},
          {"recompute", recompute_name(p.layout.recompute)},
          {"keep_gathered", p.layout.keep_gathered},
          {"pricer", pricer_name(p.pricer)},
          {"step_s", p.step_s},
          {"compute_s", p.compute_s},
          {"exposed_comm_s", p.exposed_comm_s},
          {"bubble_s", p.bubble_s},
          {"interference_s", p.interference_s},
          {"micro_batches", p.micro_batches},
          {"axes", axes},
          {"memory_bytes",
           {{"params", p.memory.params},
            {"grads", p.memory.grads},
            {"optimizer", p.memory.optimizer},
            {"gathered", p.memory.gathered},
            {"activations", p.memory.activations},
            {"total", p.memory.total()},
            {"limit", p.memory_limit}}},
          {"fits", p.fits},
          {"notes", p.notes}};
}

void print_excluded(const std::vector<ExcludedLayout>& ex, nlohmann::json& j) {
  if (!ex.empty()) fmt::print("\nexcluded ({}):\n", ex.size());
  for (const ExcludedLayout& e : ex) {
    fmt::print("  {:<30} {}\n", row_label(e.layout, e.pipeline, e.virtual_stages), e.reason);
    j["excluded"].push_back(
        {{"layout", layout_label(e.layout)},
         {"pipeline", pipeline_json(e.layout, e.pipeline)},
         {"virtual_stages", e.virtual_stages},
         {"reason", e.reason}});
  }
}

// --explain: every priced op of each strand, one micro-batch, in program order.
void print_explain(const std::vector<StepPrediction>& ranked) {
  for (const StepPrediction& p : ranked) {
    if (p.strands.empty()) {
      fmt::print("\n{}: priced by the {} pricer, which has no per-op schedule\n", layout_label(p.layout),
                 pricer_name(p.pricer));
      continue;
    }
    fmt::print("\n{}: priced ops per strand, one micro-batch (start s from the strand's start, seconds)\n",
               layout_label(p.layout));
    for (const auto& [strand, ops] : p.strands) {
      double compute = 0;
      for (const OpPrice& o : ops) compute += o.group.empty() ? o.seconds : 0;
      fmt::print("  {} ({} ops, compute {:.4f} s):\n", strand, ops.size(), compute);
      for (const OpPrice& o : ops)
        fmt::print("    {:>9.5f} {:>9.5f}  {:<10} {:<28} {}\n", o.start_s, o.seconds,
                   o.group.empty() ? "compute" : "comm " + o.group, o.code, o.name);
    }
  }
}

// AxoNN's own ranking: the 3D grids by the paper-compatible closed form.
nlohmann::json run_paper(const TuneRequest& req) {
  nlohmann::json j = {{"mode", "paper-compat"}, {"ranked", nlohmann::json::array()},
                      {"excluded", nlohmann::json::array()}};
  struct Row {
    LayoutConfig lay;
    AxonnComm c;
    double mem;
  };
  std::vector<Row> rows;
  std::vector<ExcludedLayout> ex;
  const AxonnShape shape{req.model.d_model, req.model.n_layers, req.batch.seq, req.batch.global_batch, 1};
  for (const LayoutConfig& lay : enumerate_layouts(req.gpus)) {
    if (!lay.is_3d() && !(lay.tp == 1 && lay.pp == 1)) continue;  // grids only (pure dp is x=y=z=1)
    if (lay.pp > 1) continue;  // AxoNN's closed form prices grids without pipelines
    const std::vector<std::string> errs = layout_errors(req.model, lay, req.batch);
    if (!errs.empty()) {
      ex.push_back({lay, fmt::format("{}", fmt::join(errs, "; "))});
      continue;
    }
    const StepPrediction p = predict(req.model, lay, req.batch, req.cluster, req.opt);
    if (!p.fits) {
      ex.push_back({lay, p.reason});
      continue;
    }
    const AxonnGrid g{lay.tp_x, lay.tp_y, lay.tp_z, lay.dp};
    rows.push_back({lay, axonn_comm(shape, g, req.cluster, {AxonnMode::kPaperCompat, 2, Recompute::kFull}),
                    p.memory.total()});
  }
  std::stable_sort(rows.begin(), rows.end(), [](const Row& a, const Row& b) { return a.c.total_s() < b.c.total_s(); });
  fmt::print("{:>4}  {:<30} {:>10} {:>8} {:>8} {:>8} {:>8} {:>10}\n", "rank", "grid (Gx Gy Gz Gdata)", "comm s", "x s",
             "y s", "z s", "data s", "mem GiB");
  for (size_t i = 0; i < rows.size(); ++i) {
    const Row& r = rows[i];
    const std::string grid = fmt::format("{} {} {} {}", r.lay.tp_x, r.lay.tp_y, r.lay.tp_z, r.lay.dp);
    if (int(i) < req.top)
      fmt::print("{:>4}  {:<30} {:>10.2f} {:>8.2f} {:>8.2f} {:>8.2f} {:>8.2f} {:>10.2f}\n", i + 1, grid,
                 r.c.total_s(), r.c.x_s, r.c.y_s, r.c.z_s, r.c.data_s, r.mem / kGiB);
    j["ranked"].push_back({{"rank", i + 1}, {"grid", grid}, {"comm_s", r.c.total_s()}, {"x_s", r.c.x_s},
                           {"y_s", r.c.y_s}, {"z_s", r.c.z_s}, {"data_s", r.c.data_s}, {"memory_bytes", r.mem}});
  }
  print_excluded(ex, j);
  return j;
}

}  // namespace

int cmd_tune(int argc, char** argv) {
  const std::optional<TuneRequest> req = parse_request(argc, argv);
  if (!req) return 0;
  fmt::print("model {} (L={} C={} heads={}), {} ranks on {} ({} per node), global batch {} x {} tokens, "
             "micro-batch {}, {}{}\n",
             req->model.name, req->model.n_layers, req->model.d_model, req->model.n_heads, req->gpus,
             req->cluster.name, req->cluster.devices_per_node, req->batch.global_batch, req->batch.seq,
             req->batch.micro_batch, precision_name(req->opt.precision),
             req->opt.fuse_epilogues && !req->paper ? ", GEMM epilogues fused" : "");
  const PairSimOptions io = interference_of(req->opt, req->cluster);
  const double ks = io.compute_slowdown, kc = io.comm_slowdown;
  if ((ks > 1 || kc > 1) && !req->paper)
    fmt::print("co-execution interference: compute x{:.2f} beside a collective ({}), collectives x{:.2f} beside "
               "compute ({}); the closed-form 3D pricer charges none\n",
               ks, req->opt.compute_slowdown > 0 ? "--compute-slowdown" : "the preset's", kc,
               req->opt.comm_slowdown > 0 ? "--comm-slowdown" : "the preset's");
  nlohmann::json j;
  if (req->paper) {
    fmt::print("AxoNN closed form as coded (axonn.md §4.2: bf16, full recompute, GiB over GB/s), "
               "communication seconds per step:\n");
    j = run_paper(*req);
  } else {
    TuneResult res = rank_layouts(req->model, req->gpus, req->batch, req->cluster, req->opt);
    if (!req->only.empty()) {
      std::vector<std::string> unknown = req->only;
      // A layout's label lists it under every schedule; "... w" (row_label) under that one.
      auto listed = [&](const LayoutConfig& l, PipelineKind k, int v) {
        bool hit = false;
        const std::string named = layout_label(l) + " " + schedule_label(k, v);  // "... 1f1b" too
        for (const std::string& label : {layout_label(l), row_label(l, k, v), named}) {
          unknown.erase(std::remove(unknown.begin(), unknown.end(), label), unknown.end());
          hit = hit || std::find(req->only.begin(), req->only.end(), label) != req->only.end();
        }
        return hit;
      };
      std::erase_if(res.ranked,
                    [&](const StepPrediction& p) { return !listed(p.layout, p.pipeline, p.virtual_stages); });
      std::erase_if(res.excluded,
                    [&](const ExcludedLayout& e) { return !listed(e.layout, e.pipeline, e.virtual_stages); });
      DHX_CHECK(unknown.empty(), ConfigError,
                "--only: '{}' is not a layout of {} ranks; labels look like \"tp=2 pp=1 dp=2\" or \"x=2 y=1 z=2 dp=1\"",
                fmt::join(unknown, "', '"), req->gpus);
    }
    DHX_CHECK(!res.ranked.empty(), ConfigError,
              "no layout of {} ranks can run {} with global batch {} x micro-batch {} on {}: {} excluded, e.g. "
              "{}: {}\nhint: a global batch divisible by more data-replica counts, a smaller --micro-batch-size, "
              "or more memory per device",
              req->gpus, req->model.name, req->batch.global_batch, req->batch.micro_batch, req->cluster.name,
              res.excluded.size(), res.excluded.empty() ? "-" : layout_label(res.excluded[0].layout),
              res.excluded.empty() ? "-" : res.excluded[0].reason);
    j = {{"mode", "step-model"}, {"ranked", nlohmann::json::array()}, {"excluded", nlohmann::json::array()},
         {"interference", {{"compute_slowdown", ks}, {"comm_slowdown", kc}}}};
    size_t width = 30;  // the layout column: the widest label shown ("x=2 y=1 z=2 pp=2 dp=1 interleaved v=2")
    for (size_t i = 0; i < res.ranked.size() && int(i) < req->top; ++i)
      width = std::max(width, row_label(res.ranked[i].layout, res.ranked[i].pipeline, res.ranked[i].virtual_stages).size());
    fmt::print("{:>4}  {:<{}} {:<11} {:>9} {:>9} {:>9}  {:<32} {:>8} {:>4}  {:<9} {}\n", "rank", "layout", width,
               "pricer", "step s", "compute s", "exposed s", "comm MiB per axis (per rank)", "mem GiB", "fits",
               "recompute", "kept");
    for (size_t i = 0; i < res.ranked.size(); ++i) {
      const StepPrediction& p = res.ranked[i];
      if (int(i) < req->top)
        fmt::print("{:>4}  {:<{}} {:<11} {:>9.4f} {:>9.4f} {:>9.4f}  {:<32} {:>8.2f} {:>4}  {:<9} {}\n", i + 1,
                   row_label(p.layout, p.pipeline, p.virtual_stages), width, pricer_name(p.pricer), p.step_s,
                   p.compute_s, p.exposed_comm_s, axes_text(p.axes), p.memory.total() / kGiB, p.fits ? "yes" : "no",
                   recompute_name(p.layout.recompute), p.layout.keep_gathered);
      j["ranked"].push_back(to_json(p, int(i) + 1));
    }
    if (res.ranked.size() > size_t(req->top))
      fmt::print("  ... {} more (--top)\n", res.ranked.size() - size_t(req->top));
    print_excluded(res.excluded, j);
    std::vector<std::string> notes;
    for (const StepPrediction& p : res.ranked)
      for (const std::string& n : p.notes)
        if (std::find(notes.begin(), notes.end(), n) == notes.end()) notes.push_back(n);
    for (const std::string& n : notes) fmt::print("note: {}\n", n);
    if (req->explain) print_explain(res.ranked);
    if (req->confirm) {
      std::vector<StepPrediction> top(res.ranked.begin(),
                                      res.ranked.begin() + std::min<size_t>(res.ranked.size(), size_t(req->top)));
      fmt::print("\nconfirming {} layout{} ({} steps each, {} round{}, launcher: {}):\n", top.size(),
                 top.size() == 1 ? "" : "s", req->confirm->steps, req->confirm->rounds,
                 req->confirm->rounds == 1 ? "" : "s", req->confirm->launch);
      const std::vector<Confirmed> conf = confirm_layouts(req->model, req->batch, req->opt, top, *req->confirm);
      fmt::print("\n{:>4}  {:<30} {:>11} {:>11} {:>17} {:>8}\n", "rank", "layout", "predicted s", "measured s",
                 "spread (min-max)", "error");
      j["confirmed"] = nlohmann::json::array();
      for (size_t i = 0; i < conf.size(); ++i) {
        const Confirmed& c = conf[i];
        if (!c.ok) {
          fmt::print("{:>4}  {:<30} {:>11.3f} {:>11}   {}\n", i + 1, row_label(c.layout, c.pipeline, c.virtual_stages),
                     c.predicted_s, "failed", c.error);
          j["confirmed"].push_back({{"layout", layout_label(c.layout)},
                                    {"pipeline", pipeline_json(c.layout, c.pipeline)},
                                    {"predicted_s", c.predicted_s},
                                    {"error", c.error}});
          continue;
        }
        const auto [lo, hi] = std::minmax_element(c.step_s.begin(), c.step_s.end());
        fmt::print("{:>4}  {:<30} {:>11.3f} {:>11.3f} {:>8.3f}-{:<8.3f} {:>+7.1f}%\n", i + 1,
                   row_label(c.layout, c.pipeline, c.virtual_stages),
                   c.predicted_s, c.measured_s, *lo, *hi, 100 * (c.predicted_s - c.measured_s) / c.measured_s);
        j["confirmed"].push_back({{"layout", layout_label(c.layout)},
                                  {"pipeline", pipeline_json(c.layout, c.pipeline)},
                                  {"virtual_stages", c.virtual_stages},
                                  {"predicted_s", c.predicted_s},
                                  {"measured_s", c.measured_s},
                                  {"step_s", c.step_s}});
      }
      const RankAgreement a = agreement(conf);
      fmt::print("agreement over {} layouts: Kendall tau {:.3f}, top-1 regret {:.1f}%, median |error| {:.1f}%\n",
                 a.layouts, a.kendall_tau, 100 * a.top1_regret, 100 * a.median_abs_error);
      j["kendall_tau"] = a.kendall_tau;
      j["top1_regret"] = a.top1_regret;
      j["median_abs_error"] = a.median_abs_error;
      j["layouts"] = a.layouts;
    }
  }
  j["model"] = req->model.name;
  j["gpus"] = req->gpus;
  j["cluster"] = req->cluster.name;
  j["cluster_file"] = req->cluster.origin;
  j["global_batch"] = req->batch.global_batch;
  j["seq"] = req->batch.seq;
  j["micro_batch"] = req->batch.micro_batch;
  j["precision"] = precision_name(req->opt.precision);
  j["fuse_epilogues"] = req->opt.fuse_epilogues;
  if (req->json_path) {
    write_file_atomic(*req->json_path, j.dump(1) + "\n");
    fmt::print("wrote {}\n", *req->json_path);
  }
  return 0;
}

}  // namespace dhelix
