// `dhelix profile` and `dhelix plan`: the automatic half of Strand Interleaving (profiling the
// operator windows of the folded layer pair, then the DP plan search with final validation).
// Command-specific flags are peeled off here; every other word goes to the run-config parser,
// so any config key (--model.preset, --parallel.tp, ...) is a flag of both commands.
#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <map>
#include <sstream>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <thread>
#include <tuple>

#include "Commands.h"
#include "VerbFlags.h"
#include "base/Clock.h"
#include "base/Error.h"
#include "base/Files.h"
#include "base/Signals.h"
#include "comm/LocalBackend.h"
#include "comm/MpiBackend.h"
#include "kernels/cpu/Kernels.h"
#if DHELIX_HAVE_CUDA
#include "kernels/cuda/SmPartition.h"
#endif
#include "plan/PlanCheck.h"
#include "plan/PlanIO.h"
#include "plan/PlanRender.h"
#include "plan/PlanSvg.h"
#include "profile/PlanValidation.h"
#include "profile/Profiler.h"
#include "runtime/StepBuilder.h"
#include "TuneConfirm.h"
#include "sim/CostModel.h"
#include "sim/Interference.h"
#include "sim/ClusterPreset.h"
#include "sim/StepSim.h"
#include "train/Preflight.h"
#include "base/Trace.h"
#include "schedule/BasicPlans.h"
#include "schedule/Pipelines.h"
#include "train/Config.h"
#include "train/ProgressBar.h"

namespace dhelix {

namespace {

// One rank's micro-batch: under context parallelism each rank holds seq_len / cp rows of a sequence.
MicroBatchShape micro_batch_of(const RunConfig& cfg) {
  return MicroBatchShape{cfg.training.micro_batch_size, cfg.model.seq_len / std::max<int64_t>(1, cfg.parallel.cp)};
}

// Compute threads per rank on this (the timing) thread: the config's, else the cores shared by
// this host's ranks (train/Preflight.h).
void set_threads(const RunConfig& cfg, const CommContext* comm) {
  cpu::set_num_threads(threads_per_rank(cfg, comm));
}

// The world for timing on real process groups: MPI under mpirun or when the layout needs more
// than one rank (make_mpi_world then names the mismatch), else none.
std::unique_ptr<CommContext> make_world(const LayoutConfig& lay, const CommOptions& options) {
  if (launched_by_mpirun() || lay.world() > 1) return make_mpi_world(lay, options);
  return nullptr;
}

// How a timing rank's collectives move device tensors on a GPU: the trainer's comm.* keys (NCCL or
// staged groups, NCCL's CTA cap, the staged groups' emulated link).
DeviceGroupOptions device_groups(const RunConfig& cfg, Device d) {
  return DeviceGroupOptions{!d.is_host() && cfg.comm.gpu_transport == "nccl", static_cast<int>(cfg.comm.nccl_max_ctas),
                            cfg.comm.emulated_link_gbit * 1e9 / 8};
}

// How the layer pair's ops run, as the run's would (the trainer's keys: seed, training.precision's
// GEMMs and comm.precision's activation wire on the host, comm.* for a GPU's groups).
LayerPairRun layer_pair_run(const RunConfig& cfg, Device d) {
  LayerPairRun r;
  r.seed = static_cast<uint64_t>(cfg.training.seed);
  r.device = d;
  r.groups = device_groups(cfg, d);
  r.gemm = cfg.training.precision == "bf16" ? cpu::GemmPrecision::kBf16 : cpu::GemmPrecision::kFp32;
  const std::string& wire = cfg.comm.precision == "auto" ? cfg.training.precision : cfg.comm.precision;
  r.activation_wire = wire == "bf16" ? WirePrecision::kBf16 : WirePrecision::kFp32;
  r.gemms.timed = !d.is_host() && cfg.training.gemm_algo == "timed";  // as the trainer sets them
  r.gemms.wgrad_partials = !d.is_host() && cfg.training.wgrad_gemm != "direct";
  return r;
}

// The precision a profile of this config is measured in (a profile's meta.precision).
std::string run_precision(const RunConfig& cfg) {
  return describe_precision(layer_pair_run(cfg, parse_device(cfg.training.device)));
}

// A timing rank: its world (null: one process, no world); whether it is a thread of this process
// (its errors are left to run_local_ranks, which stops the other ranks, instead of aborting an MPI
// world); and what the profile's machine line adds about the ranks.
struct TimingRank {
  CommContext* comm = nullptr;
  bool thread = false;
  std::string note;
  bool lead() const { return !comm || comm->rank() == 0; }
  // In a catch block, the error in flight: a ConfigError goes up as it is. A signal's stop: a rank
  // process other than rank 0 exits quietly with 128 + the signal (rank 0 reports; mpirun ends the
  // others), a rank thread rethrows (run_local_ranks then stops a peer that may already wait in a
  // collective: the plan search and the fit stop each rank on its own). Any other error first
  // aborts an MPI world (every rank must end; the others may wait in a collective).
  int settle_error() const {
    try {
      throw;
    } catch (const ConfigError&) {
      throw;
    } catch (const StopRequested& s) {
      if (!lead() && !thread) return 128 + s.sig();
      throw;
    } catch (const std::exception& e) {
      if (comm && comm->world_size() > 1 && !thread) comm->abort(e.what());
      throw;
    }
  }
};

// Runs fn on every rank of the layout this process holds and returns rank 0's exit code (--ranks):
// processes -- this process is one rank (make_world); threads -- every rank a thread of this
// process (comm/LocalBackend.h: its groups meet in memory; on a GPU the executor stages device
// tensors through host memory over them, as ranks sharing one GPU do), each rank thread on a GPU in
// its own SM partition unless --sm-split off (where the driver has none, the ranks share the GPU
// and a line says so).
int on_timing_ranks(const FlagValues& fl, const std::string& verb, const RunConfig& cfg, const LayoutConfig& lay,
                    const std::function<int(const TimingRank&)>& fn) {
  const bool threads = fl.text_or_default("--ranks") == "threads";
  const Device dev = parse_device(cfg.training.device);
  DHX_CHECK(!fl.given("--sm-split") || (threads && !dev.is_host() && lay.world() > 1), ConfigError,
            "dhelix {}: --sm-split {}: the flag says how ranks run as threads share one GPU's SMs; it needs --ranks "
            "threads, training.device=cuda and more than one rank (here --ranks {}, training.device={}, {} rank(s))\n"
            "hint: leave --sm-split out, or add --ranks threads --training.device cuda --parallel.tp 2",
            verb, fl.text_or_default("--sm-split"), fl.text_or_default("--ranks"), cfg.training.device, lay.world());
  // A GPU's staged groups pace their collectives to comm.emulated_link_gbit (the profile says so).
  const bool staged = !dev.is_host() && cfg.comm.gpu_transport != "nccl";
  const std::string link = staged && cfg.comm.emulated_link_gbit > 0
                               ? fmt::format(", staged link {:g} Gbit/s emulated", cfg.comm.emulated_link_gbit)
                               : "";
  if (!threads) {
    std::unique_ptr<CommContext> comm = make_world(lay, comm_options(cfg));
    set_threads(cfg, nullptr);  // under mpirun the launcher's local size shares the cores
    return fn(TimingRank{comm.get(), false, link});
  }
  DHX_CHECK(dev.is_host() || lay.world() == 1 || cfg.comm.gpu_transport != "nccl", ConfigError,
            "dhelix {}: --ranks threads shares one GPU between the {} ranks over staged groups, and "
            "comm.gpu_transport=\"nccl\" takes a GPU per rank\nhint: --comm.gpu_transport staged, or mpirun -np {} "
            "without --ranks threads on a machine with a GPU per rank", verb, lay.world(), lay.world());
  DHX_CHECK(!launched_by_mpirun(), ConfigError,
            "dhelix {}: --ranks threads runs all {} ranks of the layout in this one process, but it was started by "
            "mpirun\nhint: drop mpirun (one process, --ranks threads), or drop --ranks threads (a rank per process)",
            verb, lay.world());
  std::string note = ", ranks as threads of one process";
#if DHELIX_HAVE_CUDA
  std::vector<std::unique_ptr<cuda::SmPartition>> parts;
  if (!dev.is_host() && lay.world() > 1) {
    if (fl.text_or_default("--sm-split") == "ranks") {
      try {
        parts = cuda::SmPartition::split(dev.index, lay.world());
        note += fmt::format(" sharing {}, {} SMs each", dev.str(), parts[0]->sms());
      } catch (const DeviceError& e) {
        fmt::print("{}: no SM partitions ({}): the ranks share the whole GPU\n", verb, e.what());
      }
    }
    if (parts.empty()) note += fmt::format(" sharing all of {}", dev.str());
  }
#endif
  note += link;
  std::atomic<int> lead_rc{0};
  run_local_ranks(lay, [&](CommContext& comm) {
#if DHELIX_HAVE_CUDA
    cuda::SmPartitionScope own(parts.empty() ? nullptr : parts[static_cast<size_t>(comm.rank())].get());
#endif
    set_threads(cfg, &comm);  // this host's cores shared by the rank threads
    const int rc = fn(TimingRank{&comm, true, note});
    if (comm.rank() == 0) lead_rc = rc;
  }, comm_options(cfg));
  return lead_rc;
}

std::string default_path(const RunConfig& cfg, const char* file) { return cfg.output.dir + "/" + file; }

void make_parent_dir(const std::string& path) {
  auto parent = std::filesystem::path(path).parent_path();
  std::error_code ec;
  if (!parent.empty()) std::filesystem::create_directories(parent, ec);
  DHX_CHECK(!ec, IoError, "cannot create directory '{}': {}", parent.string(), ec.message());
}

std::string svg_path_for(const std::string& plan_path) {
  std::filesystem::path p(plan_path);
  return (p.extension() == ".json" ? p.replace_extension(".svg") : std::filesystem::path(plan_path + ".svg")).string();
}

// Whether a --cost-model argument names a JSON file of CostModelConfig fields (else a cluster preset).
bool is_cost_model_json(const std::string& arg) { return arg.size() > 5 && arg.ends_with(".json"); }

// The step simulator's settings the config fixes (Strand Interleaving, ZeRO-1, the sparse embedding
// exchange, the gradients' wire precision), and its batch; `simulate` and `plan` alike.
StepSimOptions step_sim_options(const RunConfig& cfg) {
  StepSimOptions so;
  so.si = cfg.schedule.strand_interleaving ? StrandInterleaving::kOn : StrandInterleaving::kOff;
  so.zero = cfg.parallel.zero ? Zero::kZero1 : Zero::kNone;
  so.sparse_embed = cfg.parallel.sparse_embed_grad ? SparseEmbedGrad::kOn : SparseEmbedGrad::kOff;
  so.grad_wire_bytes = cfg.comm.grad_precision == "bf16" ? 2 : 4;
  return so;
}
BatchSpec step_batch(const RunConfig& cfg) {
  return {cfg.global_batch(), cfg.model.seq_len, cfg.training.micro_batch_size};
}

// A cluster preset (name or .toml path: the same figures `dhelix simulate` and `tune` price with,
// in the preset's native precision), or a JSON file of CostModelConfig fields.
CostModelConfig cost_model_config(const std::string& arg, const LayoutConfig& lay, const std::string& clusters_dir) {
  if (!is_cost_model_json(arg)) {
    const ClusterPreset cluster = load_cluster(arg, clusters_dir);
    return cost_model_config(cluster, lay, cluster.native_precision());
  }
  DHX_CHECK(file_exists(arg), IoError, "dhelix plan: cost-model file '{}' does not exist", arg);
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(read_file(arg));
  } catch (const nlohmann::json::parse_error& e) {
    throw ConfigError(fmt::format("dhelix plan: cost-model file '{}' is not JSON: {}", arg, e.what()));
  }
  CostModelConfig c = CostModelConfig::from_json(j, arg);
  c.group_sizes = {{"tp", lay.tp},     {"dp", lay.dp},     {"pp", lay.pp},    {"cp", lay.cp},
                   {"ep", lay.ep},     {"x", lay.tp_x},    {"y", lay.tp_y},   {"z", lay.tp_z}};
  c.validate();
  return c;
}

}  // namespace

int cmd_profile(int argc, char** argv) {
  FlagValues fl;
  std::optional<CliArgs> parsed = parse_flags_and_config(profile_flags(), argc, argv, fl);
  if (!parsed) return 0;
  const std::optional<std::string> out = fl.text("--out");
  ProfileOptions opts;
  opts.timing.repeats = static_cast<int>(fl.integer("--repeats"));
  opts.timing.warmup = static_cast<int>(fl.integer("--warmup"));
  opts.max_window = static_cast<int>(fl.integer("--max-window"));
  const CliArgs& args = *parsed;
  RunConfig cfg = load_config(args.config_path, args.overrides);
  apply_process_settings(cfg);
  const std::string path = out.value_or(default_path(cfg, "profile.json"));
  const LayoutConfig lay = layout_config(cfg);
  return on_timing_ranks(fl, "profile", cfg, lay, [&](const TimingRank& me) -> int {
    CommContext* comm = me.comm;
    const bool rank0 = me.lead();
    try {
      const double t0 = now_seconds();
      const Device dev = rank_device(cfg, comm);
      LayerPairBench bench(cfg.model, lay, micro_batch_of(cfg), comm, layer_pair_run(cfg, dev));
      const int64_t total = profile_entry_count(bench.program(), opts.windows, opts.max_window);
      if (rank0)
        fmt::print("profile: {} | {} | {} | {} fwd ops, {} bwd ops | {} entries x ({} warm-up + {} timed){}\n",
                   describe_model(cfg.model), describe_layout(lay), describe_shapes(bench.micro_batch()),
                   bench.program().fwd.size(), bench.program().bwd.size(), total, opts.timing.warmup,
                   opts.timing.repeats, me.note);
      std::optional<ProgressBar> bar;
      if (rank0) bar.emplace(total, "profile");
      const int64_t every = std::max<int64_t>(1, total / 10);
      ProfileOptions mine = opts;
      mine.progress = [&](int64_t done, int64_t n) {
        if (!rank0) return;
        bar->update(done);
        if (!bar->enabled() && (done % every == 0 || done == n))
          fmt::print("  {}/{} entries timed ({:.0f} s)\n", done, n, now_seconds() - t0), std::fflush(stdout);
      };
      Profile p = profile_layer_pair(bench, cfg.model, lay, comm, mine);
      if (bar) bar->finish();
      stop_point("profiling (all entries timed; no profile written)");
      if (rank0) {
        p.meta.machine += me.note;
        make_parent_dir(path);
        p.save(path);
        fmt::print("profile: {} solo fwd, {} solo bwd, {} pairs in {:.1f} s (the timing bracket's {:.1f} us taken out "
                   "of each entry) -> {}\n",
                   p.num_solo_fwd(), p.num_solo_bwd(), p.num_pairs(), now_seconds() - t0,
                   p.meta.timing_overhead_s * 1e6, path);
      }
    } catch (...) {
      return me.settle_error();  // (every rank stops after the same entry: the profiler agrees first)
    }
    return 0;
  });
}

namespace {

// --layout "tp=2 pp=2 dp=2" (or "x=2 y=1 z=2 dp=1"; dp from --gpus when not named) as config
// overrides of every parallel axis; ConfigError naming the bad word.
ConfigOverrides layout_overrides(const std::string& spec, int gpus) {
  static const std::map<std::string, std::string> kKeys = {{"tp", "tp"}, {"pp", "pp"},   {"dp", "dp"},
                                                           {"cp", "cp"}, {"ep", "ep"},   {"x", "tp_x"},
                                                           {"y", "tp_y"}, {"z", "tp_z"}};
  std::map<std::string, int64_t> v;
  std::istringstream words(spec);
  for (std::string w; words >> w;) {
    const size_t eq = w.find('=');
    const std::string k = w.substr(0, eq);
    int64_t n = 0;
    const char* digits = eq == std::string::npos ? nullptr : w.c_str() + eq + 1;
    const auto [end, ec] = digits ? std::from_chars(digits, w.c_str() + w.size(), n) : std::from_chars_result{};
    DHX_CHECK(digits && kKeys.count(k) && ec == std::errc() && *end == '\0' && n >= 1 && !v.count(k), ConfigError,
              "dhelix simulate: --layout '{}': '{}' is not an axis=count (axes tp pp dp cp ep, or x y z dp; each once, "
              "counts >= 1)\nhint: --layout \"tp=2 pp=2 dp=2\" or --layout \"x=2 y=1 z=2 dp=1\"", spec, w);
    v[k] = n;
  }
  DHX_CHECK(!v.empty(), ConfigError, "dhelix simulate: --layout is empty\nhint: --layout \"tp=2 pp=1 dp=2\"");
  if (!v.count("dp")) {
    int64_t others = 1;
    for (const auto& [k, n] : v) others *= k == "ep" ? 1 : n;  // ep is carved out of dp
    DHX_CHECK(gpus == 0 || gpus % others == 0, ConfigError,
              "dhelix simulate: --layout '{}' uses {} ranks per data replica, which does not divide --gpus {}", spec,
              others, gpus);
    v["dp"] = gpus == 0 ? 1 : gpus / others;
  }
  ConfigOverrides o;
  for (const auto& [k, key] : kKeys) o.emplace_back("parallel." + key, std::to_string(v.count(k) ? v[k] : 1));
  return o;
}

// "124.4M", "41.87B": a parameter count for a header line.
std::string parameter_count(double n) { return n < 1e9 ? fmt::format("{:.1f}M", n / 1e6) : fmt::format("{:.2f}B", n / 1e9); }

// Whether the config's model is its preset's (model.preset's extents, not reshaped by model.* keys;
// the context length aside, which the run sets).
bool has_preset_shape(const RunConfig& cfg) {
  const ModelConfig p = model_preset(cfg.model_preset), &m = cfg.model;
  return p.family == m.family && p.vocab_size == m.vocab_size && p.d_model == m.d_model && p.n_layers == m.n_layers &&
         p.n_heads == m.n_heads && p.n_kv_heads == m.n_kv_heads && p.ffn_hidden == m.ffn_hidden &&
         p.tie_embeddings == m.tie_embeddings && (!m.is_moe() || (p.n_experts == m.n_experts && p.top_k == m.top_k));
}

// The simulated model as the config shapes it: family, parameters and extents, named after its
// preset only when it has that preset's shape ("gpt2-124m: gpt of 124.4M parameters (12 layers,
// ...)"); a config without model.preset starts from "demo"'s keys, whose name would misdescribe
// it, and a preset reshaped by the config's keys says so.
std::string describe_simulated_model(const RunConfig& cfg) {
  const ModelConfig& m = cfg.model;
  std::string s = fmt::format("{} of {} parameters ({} layers, d_model {}, heads {}/{}, ffn {}, vocab {}",
                              family_name(m.family), parameter_count(double(m.num_params())), m.n_layers, m.d_model,
                              m.n_heads, m.n_kv_heads, m.ffn_hidden, m.vocab_size);
  if (m.is_moe()) {  // each token's MLP is top_k of the n_experts experts (3 C F each per layer)
    const double idle = double(m.n_layers) * double(m.n_experts - m.top_k) * 3 * double(m.d_model) * double(m.ffn_hidden);
    s += fmt::format(", {} experts, top-{}: {} active", m.n_experts, m.top_k,
                     parameter_count(double(m.num_params()) - idle));
  }
  s += ")";
  if (has_preset_shape(cfg)) return cfg.model_preset + ": " + s;
  return cfg.model_preset == "demo" ? s : s + fmt::format(" (preset {} reshaped by the config)", cfg.model_preset);
}

}  // namespace

int cmd_simulate(int argc, char** argv) {
  FlagValues fl;
  std::optional<CliArgs> parsed = parse_flags_and_config(simulate_flags(), argc, argv, fl);
  if (!parsed) return 0;
  const std::optional<std::string> cluster_arg = fl.text("--cluster"), trace_path = fl.text("--trace"),
                                   json_path = fl.text("--json"), profile_path = fl.text("--profile"),
                                   layout_arg = fl.text("--layout");
  const bool measure_gemm = fl.on("--measure-gemm"), profile_times = fl.on("--profile-op-times");
  const int gpus = fl.given("--gpus") ? static_cast<int>(fl.integer("--gpus")) : 0;
  if (layout_arg) {
    const ConfigOverrides lo = layout_overrides(*layout_arg, gpus);
    for (const auto& [k, val] : parsed->overrides)
      for (const auto& [lk, lv] : lo)
        DHX_CHECK(k != lk, ConfigError, "dhelix simulate: --{} and --layout both set the layout; give one", k);
    parsed->overrides.insert(parsed->overrides.end(), lo.begin(), lo.end());
  }
  const RunConfig cfg = load_config(parsed->config_path, parsed->overrides);
  apply_process_settings(cfg);
  LayoutConfig lay = layout_config(cfg);
  DHX_CHECK(gpus == 0 || gpus == lay.world(), ConfigError,
            "dhelix simulate: --gpus {} but the layout has {} ranks (dp={} pp={} cp={} tp={} tp_x={} tp_y={} tp_z={}); "
            "set parallel.dp to {}", gpus, lay.world(), lay.dp, lay.pp, lay.cp, lay.tp, lay.tp_x, lay.tp_y, lay.tp_z,
            gpus * lay.dp / std::max(1, lay.world()));
  const ClusterPreset cluster = load_cluster(*cluster_arg, cfg.sim.clusters_dir);
  lay.fuse_epilogues = fuse_epilogues_for(cfg, cluster.is_gpu());  // the run priced is on the preset's devices
  StepSimOptions so = step_sim_options(cfg);
  const std::string prec = fl.text_or_default("--precision");
  so.precision = prec == "native" ? cluster.native_precision() : prec == "bf16" ? Precision::kBf16 : Precision::kFp32;
  (void)cluster.gemm_rate(so.precision);  // the preset must have that precision's rate
  so.compute_slowdown = cluster.compute_slowdown, so.comm_slowdown = cluster.comm_slowdown;  // 1 where it has none
  for (const auto& [flag, k] : {std::pair{"--compute-slowdown", &so.compute_slowdown},
                                std::pair{"--comm-slowdown", &so.comm_slowdown}}) {
    if (!fl.given(flag)) continue;
    *k = fl.number(flag);  // >= 1 (1: no slowdown), checked by the flag table
    DHX_CHECK(!profile_path, ConfigError,
              "dhelix simulate: give {} or --profile, not both (the profile fits the slowdowns)", flag);
  }
  std::optional<InterferenceFit> fit;
  if (profile_path) {
    DHX_CHECK(file_exists(*profile_path), IoError, "dhelix simulate: profile file '{}' does not exist (make it with "
              "`dhelix profile --config ... --out {}`)", *profile_path, *profile_path);
    const Profile p = Profile::load(*profile_path);
    const ModelPrograms progs = build_programs(cfg.model, lay, micro_batch_of(cfg));
    check_profile_fits(p, cfg.model, lay, micro_batch_of(cfg), progs.block, run_precision(cfg));
    fmt::print("simulate: fitting the co-execution interference on {} ...\n", *profile_path), std::fflush(stdout);
    fit = fit_interference_alternating(progs.block, p);
    so.compute_slowdown = fit->compute_slowdown, so.comm_slowdown = fit->comm_slowdown;
    if (profile_times) so.op_timer = profile_op_timer(progs, p);
  }
  DHX_CHECK(!profile_times || profile_path, ConfigError,
            "dhelix simulate: --profile-op-times takes the op times from a profile: give --profile FILE too");
  if (measure_gemm) so.gemm_timer = measured_gemm_timer(cluster.core_share);
  const BatchSpec batch = step_batch(cfg);
  std::optional<SIPlan> block_plan;
  if (!cfg.schedule.plan.empty()) {
    LayoutConfig plain = lay;
    plain.sequence_parallel = lay.tp > 1;
    const ModelPrograms progs = build_programs(cfg.model, plain, micro_batch_of(cfg));
    block_plan = load_plan(cfg.schedule.plan, progs.block);
    check_plan(*block_plan, progs.block);
  }
  so.plan_for = [&](const LayerProgram& f, const LayerProgram& b) {
    if (block_plan && f.name == "block" && b.name == "block") return *block_plan;
    return pair_default_plan(f.fwd, b.bwd);
  };
  const StepSchedule schedule = make_schedule(pipeline_spec(cfg));  // the step runner's slots
  so.schedule = &schedule;
  int slow_rank = -1;
  if (const std::optional<std::string> s = fl.text("--straggler")) {
    const size_t colon = s->find(':');
    const std::optional<int64_t> rank = colon == std::string::npos ? std::nullopt : parse_int(s->substr(0, colon));
    const std::optional<double> factor = colon == std::string::npos ? std::nullopt : parse_number(s->substr(colon + 1));
    DHX_CHECK(rank && factor && std::isfinite(*factor), ConfigError,
              "dhelix simulate: --straggler '{}' is not RANK:FACTOR\nhint: --straggler 5:1.1 (rank 5 computes 10% slower)",
              *s);
    DHX_CHECK(*rank >= 0 && *rank < lay.world() && *factor >= 1 && *factor <= 100, ConfigError,
              "dhelix simulate: --straggler {}: the rank must be in 0..{} (the layout's {} ranks) and the factor in 1..100",
              *s, lay.world() - 1, lay.world());
    slow_rank = static_cast<int>(*rank);
    so.slow_stage = Layout(lay, slow_rank).coord().pp;
    so.slow_factor = *factor;
  }
  so.expert_imbalance = fl.number("--moe-imbalance");
  DHX_CHECK(so.expert_imbalance == 1.0 || (cfg.model.is_moe() && lay.ep > 1 && so.expert_imbalance >= 1 &&
                                           so.expert_imbalance <= lay.ep),
            ConfigError,
            "dhelix simulate: --moe-imbalance {} must be in 1..ep={} and needs the moe family with parallel.ep > 1 "
            "(model.family={})\nhint: the trainer's moe line gives busiest/mean per expert, e.g. --moe-imbalance 1.3",
            so.expert_imbalance, lay.ep, family_name(cfg.model.family));
  const double sim_t0 = now_seconds();
  const StepSimResult r = simulate_step(cfg.model, lay, batch, cluster, so);
  const double sim_s = now_seconds() - sim_t0;
  const double peak = cluster.peak_flops(so.precision);
  FlopConvention conv = FlopConvention::kDhelix;
  parse_flop_convention(fl.text_or_default("--flops"), conv);  // a choice of the flag table
  const double flops_per_rank = cfg.model.flops_per_token(batch.seq, conv) * r.tokens_per_s / double(lay.world());
  const double gib = double(1 << 30);
  const bool oom = cluster.memory_bytes > 0 && r.memory.total() > cluster.memory_bytes;
  DHX_CHECK(!oom || fl.on("--allow-oom"), ConfigError,
            "dhelix simulate: the layout does not fit the device memory of cluster {}: {:.2f} GiB per rank (parameters "
            "{:.2f}, gradients {:.2f}, optimizer {:.2f}, gathered blocks {:.2f}, activations {:.2f}) of {:.2f} GiB\n"
            "hint: training.recompute selective|full, more pp or tp, parallel.zero 1, a smaller micro-batch; "
            "--allow-oom prints the step anyway",
            cluster.name, r.memory.total() / gib, r.memory.params / gib, r.memory.grads / gib, r.memory.optimizer / gib,
            r.memory.gathered / gib, r.memory.activations / gib, cluster.memory_bytes / gib);
  fmt::print("simulate: {} | {} | B={} T={} x {} micro-batches | SI {}{} | {} | {}{} | cluster {}\n",
             describe_simulated_model(cfg), describe_layout(lay), batch.micro_batch, batch.seq, r.micro_batches,
             cfg.schedule.strand_interleaving ? "on" : "off",
             cfg.schedule.plan.empty() ? "" : " (plan " + cfg.schedule.plan + ")", so.zero == Zero::kZero1 ? "ZeRO-1" : "no ZeRO",
             precision_name(so.precision), prec == "native" ? " (the preset's)" : "", cluster.name);
  if (fit)
    fmt::print("interference from {}: compute x{:.2f} beside a collective, collectives x{:.2f} beside compute, "
               "fitted on {} measured pairs; held-back {} pairs within median {:.1f}% / max {:.1f}% (without it: "
               "{:.1f}% / {:.1f}%)\n",
               *profile_path, fit->compute_slowdown, fit->comm_slowdown, fit->calibration_pairs, fit->held_back_pairs,
               100 * fit->held_back_median_error, 100 * fit->held_back_max_error,
               100 * fit->held_back_median_error_without, 100 * fit->held_back_max_error_without);
  else if (so.compute_slowdown > 1 || so.comm_slowdown > 1)
    fmt::print("interference: compute x{:.2f} beside a collective ({}), collectives x{:.2f} beside compute ({})\n",
               so.compute_slowdown, fl.given("--compute-slowdown") ? "--compute-slowdown" : "the preset's",
               so.comm_slowdown, fl.given("--comm-slowdown") ? "--comm-slowdown" : "the preset's");
  if (measure_gemm) fmt::print("GEMMs timed for their shapes on this machine (core share {})\n", cluster.core_share);
  if (slow_rank >= 0)
    fmt::print("straggler: rank {} computes {:g}x slower; its pipeline stage {} waits for it at every collective\n",
               slow_rank, so.slow_factor, so.slow_stage);
  if (so.expert_imbalance != 1.0)
    fmt::print("uneven expert loads: the busiest ep rank receives {:g}x the mean of the routed rows and paces its ep "
               "group\n", so.expert_imbalance);
  if (profile_times) fmt::print("the layer's compute ops at their profiled single-op times ({})\n", *profile_path);
  for (const StepSimResult::ReplicaClass& c : r.replica_classes)
    if (c.wait_s > 0)
      fmt::print("{} of {} data replicas without the straggler: passes end {:.4f} s, then wait {:.4f} s for its "
                 "gradients\n", c.replicas, lay.dp, c.passes_end_s, c.wait_s);
  fmt::print("  {:<44} {:>12}\n", "step (s)", fmt::format("{:.4f}", r.step_s));
  fmt::print("  {:<44} {:>12}\n", "  passes of the micro-batches (s)", fmt::format("{:.4f}", r.body_s));
  fmt::print("  {:<44} {:>12}\n", "  gradient tail past the last backward (s)", fmt::format("{:.4f}", r.tail_s));
  fmt::print("  {:<44} {:>12}\n", "    of which the optimizer step (s)", fmt::format("{:.4f}", r.optimizer_s));
  if (lay.pp > 1)
    fmt::print("  {:<44} {:>12}\n", "  pipeline bubble of the slowest stage (s)", fmt::format("{:.4f}", r.bubble_s));
  fmt::print("  {:<44} {:>12}\n", "compute, engine busy (s)", fmt::format("{:.4f}", r.compute_s));
  fmt::print("  {:<44} {:>12}\n", "exposed communication (s)", fmt::format("{:.4f}", r.exposed_s));
  for (const auto& [g, t] : r.channel_busy_s)
    fmt::print("  {:<44} {:>12}\n", fmt::format("  {} channel busy in the passes (s)", g), fmt::format("{:.4f}", t));
  {  // the passes' waits by the collective waited for (the critical stage's), the three longest
    std::vector<std::pair<double, std::string>> waits;
    for (const auto& [name, u] : r.stages[size_t(r.critical_stage)].collectives)
      if (u.exposed_s > 0) waits.push_back({u.exposed_s, fmt::format("{} ({})", name, u.group)});
    std::sort(waits.rbegin(), waits.rend());
    for (size_t i = 0; i < std::min<size_t>(3, waits.size()); ++i)
      fmt::print("  {:<44} {:>12}\n", fmt::format("  waited for {}", waits[i].second), fmt::format("{:.4f}", waits[i].first));
  }
  fmt::print("  {:<44} {:>12}\n", "tokens/s", fmt::format("{:.0f}", r.tokens_per_s));
  fmt::print("  {:<44} {:>12}\n", fmt::format("model FLOP/s per rank ({})", flop_convention_formula(conv)),
             fmt::format("{:.3g}", flops_per_rank));
  fmt::print("  {:<44} {:>12}\n", fmt::format("  MFU: share of the peak {:.3g} FLOP/s", peak), fmt::format("{:.3f}", flops_per_rank / peak));
  fmt::print("  {:<44} {:>12}\n", "memory per rank (GiB)", fmt::format("{:.3f}{}", r.memory.total() / gib,
                                                                     oom ? " (does not fit)" : ""));
  fmt::print("  {:<44} {:>12}\n", "  parameters / gradients / optimizer",
             fmt::format("{:.3f} / {:.3f} / {:.3f}", r.memory.params / gib, r.memory.grads / gib, r.memory.optimizer / gib));
  fmt::print("  {:<44} {:>12}\n", "  gathered blocks / activations (peak)",
             fmt::format("{:.3f} / {:.3f}", r.memory.gathered / gib, r.memory.activations / gib));
  if (lay.pp > 1) {
    fmt::print("  per stage (s): {:>5} {:>9} {:>9} {:>9} {:>9} {:>9} {:>10}\n", "stage", "passes", "tail", "compute",
               "bubble", "exposed", "mem (GiB)");
    for (size_t i = 0; i < r.stages.size(); ++i) {
      const StepSimStage& g = r.stages[i];
      const double bytes = i < r.stage_memory.size() ? r.stage_memory[i].total() : 0;
      fmt::print("                 {:>5} {:>9.4f} {:>9.4f} {:>9.4f} {:>9.4f} {:>9.4f} {:>10.3f}{}{}\n", i, g.end_s,
                 g.tail_s, g.compute_s, g.bubble_s, g.exposed_s, bytes / gib,
                 static_cast<int>(i) == r.critical_stage ? "  (sets the step)" : "",
                 cluster.memory_bytes > 0 && bytes > cluster.memory_bytes ? "  (does not fit)" : "");
    }
  }
  fmt::print("simulated in {:.3f} s ({} ranks as {} rank class{}, {} simulated ops)\n", sim_s, lay.world(),
             r.rank_classes, r.rank_classes == 1 ? "" : "es", r.events.size());
  if (trace_path) {
    Trace t(0);
    for (const StepSimEvent& e : r.events) t.add(e.lane.ends_with("compute") ? e.lane : "comm " + e.lane, e.name, e.begin_s, e.end_s);
    t.write(*trace_path);
    fmt::print("trace of the simulated step: {}\n", *trace_path);
  }
  if (json_path) {
    nlohmann::json j = {{"step_s", r.step_s},
                        {"body_s", r.body_s},
                        {"bubble_s", r.bubble_s},
                        {"tail_s", r.tail_s},
                        {"compute_s", r.compute_s},
                        {"exposed_s", r.exposed_s},
                        {"tokens_per_s", r.tokens_per_s},
                        {"model_flops_per_s_per_rank", flops_per_rank},
                        {"flops_convention", flop_convention_name(conv)},
                        {"straggler_rank", slow_rank},
                        {"straggler_factor", so.slow_factor},
                        {"moe_imbalance", so.expert_imbalance},
                        {"mfu", flops_per_rank / peak},
                        {"memory_bytes", r.memory.total()},
                        {"memory_limit_bytes", cluster.memory_bytes},
                        {"fits", !oom},
                        {"precision", precision_name(so.precision)},
                        {"recompute", recompute_name(lay.recompute)},
                        {"recompute_layers", lay.recompute_layers},  // 0: every layer of each chunk
                        {"fuse_epilogues", lay.fuse_epilogues},
                        {"model", {{"preset", has_preset_shape(cfg) ? nlohmann::json(cfg.model_preset) : nlohmann::json()},
                                   {"family", family_name(cfg.model.family)},
                                   {"layers", cfg.model.n_layers},
                                   {"d_model", cfg.model.d_model},
                                   {"parameters", cfg.model.num_params()}}},
                        {"ranks", lay.world()},
                        {"rank_classes", r.rank_classes},
                        {"memory_per_stage_bytes", [&] {
                           nlohmann::json a = nlohmann::json::array();
                           for (const MemoryUse& mu : r.stage_memory) a.push_back(mu.total());
                           return a;
                         }()},
                        {"memory", {{"params", r.memory.params},
                                    {"grads", r.memory.grads},
                                    {"optimizer", r.memory.optimizer},
                                    {"gathered", r.memory.gathered},
                                    {"activations", r.memory.activations}}},
                        {"critical_stage", r.critical_stage},
                        {"simulated_in_s", sim_s},
                        {"micro_batches", r.micro_batches},
                        {"optimizer_s", r.optimizer_s},
                        {"compute_slowdown", so.compute_slowdown},
                        {"comm_slowdown", so.comm_slowdown},
                        {"peak_flops", peak}};
    if (fit)
      j["interference_fit"] = {{"calibration_pairs", fit->calibration_pairs},
                               {"held_back_pairs", fit->held_back_pairs},
                               {"held_back_median_error", fit->held_back_median_error},
                               {"held_back_median_error_without", fit->held_back_median_error_without}};
    for (const StepSimStage& g : r.stages)
      j["stages"].push_back({{"end_s", g.end_s}, {"tail_s", g.tail_s}, {"compute_s", g.compute_s}, {"bubble_s", g.bubble_s},
                             {"exposed_s", g.exposed_s}, {"channel_busy_s", g.channel_busy_s}});
    // Where the critical stage's communication goes: each collective (op name) summed over the
    // step's micro-batches and layers, busiest first; and the gradient tail per group.
    std::vector<std::pair<std::string, CollectiveUse>> uses(r.stages[size_t(r.critical_stage)].collectives.begin(),
                                                            r.stages[size_t(r.critical_stage)].collectives.end());
    std::stable_sort(uses.begin(), uses.end(), [](const auto& a, const auto& b) { return a.second.busy_s > b.second.busy_s; });
    j["collectives"] = nlohmann::json::array();
    for (const auto& [name, u] : uses)
      j["collectives"].push_back(
          {{"name", name}, {"group", u.group}, {"count", u.count}, {"busy_s", u.busy_s}, {"exposed_s", u.exposed_s}});
    for (const StepSimResult::ReplicaClass& c : r.replica_classes)
      j["replica_classes"].push_back(
          {{"name", c.name}, {"replicas", c.replicas}, {"passes_end_s", c.passes_end_s}, {"wait_s", c.wait_s}});
    for (const auto& [g, a] : r.tail_axes)
      j["tail_axes"][g] = {{"bytes", a.bytes}, {"seconds", a.seconds}, {"exposed_s", a.exposed_s}};
    make_parent_dir(*json_path);
    write_file_atomic(*json_path, j.dump(2) + "\n");
  }
  return 0;
}

int cmd_plan(int argc, char** argv) {
  FlagValues fl;
  std::optional<CliArgs> parsed = parse_flags_and_config(plan_flags(), argc, argv, fl);
  if (!parsed) return 0;
  const CliArgs& args = *parsed;
  const std::optional<std::string> out = fl.text("--out"), profile_path = fl.text("--profile"),
                                   json_out = fl.text("--json"), cost_arg = fl.text("--cost-model");
  SearchOptions sopts;
  sopts.top_k = static_cast<int>(fl.integer("--top-k"));
  sopts.max_window = static_cast<int>(fl.integer("--max-window"));
  BenchTiming timing;
  timing.repeats = static_cast<int>(fl.integer("--repeats"));
  timing.warmup = static_cast<int>(fl.integer("--warmup"));
  const bool no_validate = fl.on("--no-validate");
  const double min_gain = fl.given("--min-gain") ? fl.number("--min-gain") : kDefaultMinGain;
  DHX_CHECK(min_gain < 1, ConfigError, "dhelix plan: --min-gain {} must be in [0, 1)", min_gain);
  DHX_CHECK(profile_path.has_value() != cost_arg.has_value(), ConfigError,
            "dhelix plan: give exactly one of --profile FILE or --cost-model PRESET\n{}", flag_help(plan_flags()));
  RunConfig cfg = load_config(args.config_path, args.overrides);
  apply_process_settings(cfg);
  LayoutConfig lay = layout_config(cfg);
  // A cluster preset as the cost model prices a run on its devices: auto fuses the GEMM epilogues
  // on a GPU's, so the plan fits the programs a run there trains.
  if (cost_arg && !is_cost_model_json(*cost_arg))
    lay.fuse_epilogues = fuse_epilogues_for(cfg, load_cluster(*cost_arg, cfg.sim.clusters_dir).is_gpu());
  const MicroBatchShape mb = micro_batch_of(cfg);
  // Programs only: no dataset, no parameters, no world (a cost model plans a 70B layer on a laptop).
  const ModelPrograms progs = build_programs(cfg.model, lay, mb);
  const LayerProgram& prog = progs.block;
  const std::string path = out.value_or(default_path(cfg, "plan.json"));

  std::unique_ptr<BlockCost> cost;
  std::string cost_name;
  if (profile_path) {
    DHX_CHECK(file_exists(*profile_path), IoError, "dhelix plan: profile file '{}' does not exist (make it with "
              "`dhelix profile --config ... --out {}`)", *profile_path, *profile_path);
    auto p = std::make_unique<Profile>(Profile::load(*profile_path));
    check_profile_fits(*p, cfg.model, lay, mb, prog, run_precision(cfg));
    cost_name = fmt::format("profile {} ({})", *profile_path, p->meta.machine);
    cost = std::move(p);
  } else {
    CostModelConfig c = cost_model_config(*cost_arg, lay, cfg.sim.clusters_dir);
    cost_name = "cost model " + c.name;
    cost = std::make_unique<CostModel>(prog, c);
  }

  const bool validate = profile_path && !no_validate;
  DHX_CHECK(validate || (!fl.given("--ranks") && !fl.given("--sm-split")), ConfigError,
            "dhelix plan: --ranks and --sm-split say how the candidates are timed, and with {} none is\n"
            "hint: leave them out, or time the candidates: --profile FILE without --no-validate",
            profile_path ? "--no-validate" : "--cost-model");
  // The search and its validation, on every timing rank (one, without validation).
  const auto run = [&](const TimingRank& me) -> int {
    CommContext* comm = me.comm;
    const bool rank0 = me.lead();
    std::unique_ptr<LayerPairBench> bench;
    PlanChoice choice;
    try {
      if (validate) {
        const Device dev = rank_device(cfg, comm);
        bench = std::make_unique<LayerPairBench>(cfg.model, lay, mb, comm, layer_pair_run(cfg, dev));
      }
      // The search's candidates are ranked by simulating the whole pair from the single ops' times
      // (not by their summed blocks): the profile's, with the co-execution interference fitted on its
      // pairs, or the cost model's, with none (a preset gives none). Every rank computes the same fit
      // from the same file, so every rank validates the same plans.
      std::optional<InterferenceFit> fit;
      OpTimer solo;
      std::string no_sim;
      try {
        solo = solo_op_timer(prog, *cost);
        if (profile_path) {
          if (rank0) fmt::print("plan: fitting the co-execution interference on the profile's pairs ...\n"), std::fflush(stdout);
          fit = fit_interference_alternating(prog, *cost);
        }
      } catch (const ConfigError& e) {
        no_sim = e.what();
        solo = {};
      }
      PlanSimulator simulate;
      const bool simulated = static_cast<bool>(solo);
      if (simulated)
        simulate = [&](const SIPlan& p) {
          const PairSimOptions o = fit ? PairSimOptions{fit->compute_slowdown, fit->comm_slowdown} : PairSimOptions{};
          return simulate_pair(&prog.fwd, &prog.bwd, p, solo, o).span_s;
        };
      // With a cluster preset, each candidate is priced by the whole step it would run in (the step
      // simulator with the plan on every pair of transformer layers, the config's batch, schedule and
      // ZeRO; the preset's native precision): a plan that wins its pair alone can lose in the step
      // (the pairs' carried ops and prefetches, the embedding and head pairs, the pipeline slots).
      std::optional<ClusterPreset> preset;
      std::optional<StepSchedule> step_schedule;
      StepSimOptions step_opt = step_sim_options(cfg);
      const bool step_simulated = simulated && cost_arg && !is_cost_model_json(*cost_arg);
      if (step_simulated) {
        preset = load_cluster(*cost_arg, cfg.sim.clusters_dir);
        step_schedule = make_schedule(pipeline_spec(cfg));
        step_opt.precision = preset->native_precision();
        step_opt.compute_slowdown = preset->compute_slowdown, step_opt.comm_slowdown = preset->comm_slowdown;
        step_opt.si = StrandInterleaving::kOn;
        step_opt.schedule = &*step_schedule;
        simulate = [&](const SIPlan& p) {
          StepSimOptions so = step_opt;
          so.plan_for = [&](const LayerProgram& f, const LayerProgram& b) {
            if (f.name == "block" && b.name == "block") return p;
            return pair_default_plan(f.fwd, b.bwd);
          };
          return simulate_step(cfg.model, lay, step_batch(cfg), *preset, so).step_s;
        };
      }
      const double t0 = now_seconds();
      // Timing the candidates takes minutes on a large model: rank 0 shows the runs as they finish.
      // Without a terminal, a line every tenth of the runs.
      std::optional<ProgressBar> bar;
      choice = search_and_validate(prog, *cost, sopts, bench.get(), timing, min_gain, simulate,
                                   [&](int64_t done, int64_t total) {
                                     if (!rank0) return;
                                     if (!bar) bar.emplace(total, "plan: timing");
                                     bar->update(done);
                                     if (!bar->enabled() && (done % std::max<int64_t>(1, total / 10) == 0 || done == total))
                                       fmt::print("  {}/{} candidate runs timed\n", done, total), std::fflush(stdout);
                                   });
      if (bar) bar->finish();
      if (rank0) {
        fmt::print("plan: {} | {} | {} | {}\n", describe_model(cfg.model), describe_layout(lay), describe_shapes(mb),
                   cost_name);
        if (!no_sim.empty()) fmt::print("(no pair simulation: {})\n", no_sim);
        if (step_simulated)
          fmt::print("simulated: the whole step on {} ({} micro-batches, this plan on every transformer-layer pair)\n",
                     preset->name, cfg.training.micro_batches);
        if (fit)
          fmt::print("interference: compute x{:.2f} beside a collective, collectives x{:.2f} beside compute, fitted "
                     "on {} measured pairs; held-back {} pairs simulated within median {:.1f}% / max {:.1f}% (without "
                     "it: {:.1f}% / {:.1f}%)\n",
                     fit->compute_slowdown, fit->comm_slowdown, fit->calibration_pairs, fit->held_back_pairs,
                     100 * fit->held_back_median_error, 100 * fit->held_back_max_error,
                     100 * fit->held_back_median_error_without, 100 * fit->held_back_max_error_without);
        fmt::print("{:>4}  {:<18} {:>7} {:>12} {:>12} {:>12}\n", "#", "source", "blocks", "predicted", "simulated",
                   "measured");
        for (size_t i = 0; i < choice.candidates.size(); ++i) {
          const auto& k = choice.candidates[i];
          const std::string sim = simulated ? format_seconds(k.simulated_s) : "-";
          fmt::print("{:>4}  {:<18} {:>7} {:>12} {:>12} {:>12}{}\n", i + 1, k.plan.source, k.plan.blocks.size(),
                     format_seconds(k.predicted_s), sim, bench ? format_seconds(k.measured_s) : "-",
                     static_cast<int>(i) == choice.chosen ? "  <- kept" : "");
        }
        if (!bench)
          fmt::print("(not validated: {})\n", profile_path ? "--no-validate" : "a cost model needs no hardware");
        fmt::print("search{} took {:.3f} s\n\n", bench ? " + validation" : "", now_seconds() - t0);
        if (json_out) {
          nlohmann::json j = {{"candidates", nlohmann::json::array()}, {"chosen", choice.chosen},
                              {"validated", bench != nullptr}};
          for (const auto& k : choice.candidates)
            j["candidates"].push_back({{"source", k.plan.source},
                                       {"blocks", k.plan.blocks.size()},
                                       {"predicted_s", k.predicted_s},
                                       {"simulated_s", simulated ? k.simulated_s : 0.0},
                                       {"measured_s", k.measured_s}});
          if (fit)
            j["interference"] = {{"compute_slowdown", fit->compute_slowdown},
                                 {"comm_slowdown", fit->comm_slowdown},
                                 {"held_back_median_error", fit->held_back_median_error},
                                 {"held_back_median_error_without", fit->held_back_median_error_without}};
          make_parent_dir(*json_out);
          write_file_atomic(*json_out, j.dump(2) + "\n");
        }
      }
    } catch (...) {
      return me.settle_error();
    }
    if (rank0) {
      const SIPlan& plan = choice.plan();
      check_plan(plan, prog);
      make_parent_dir(path);
      save_plan(path, plan, prog);
      const std::string svg = svg_path_for(path);
      write_file_atomic(svg, render_plan_svg(plan, prog, cost.get()));
      fmt::print("{}\nwrote {} and {}\ntrain with it: dhelix train --config ... --schedule.plan {}\n",
                 render_plan(plan, prog, cost.get()), path, svg, path);
    }
    return 0;
  };
  return validate ? on_timing_ranks(fl, "plan", cfg, lay, run) : run(TimingRank{});
}

}  // namespace dhelix
