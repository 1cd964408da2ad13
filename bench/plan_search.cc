// plan_search: the SI planner's two numbers.
//
//   search   (default mode, one process, no hardware): the time search_plans takes for one
//            Llama-70B-shaped layer pair (tp = 8, sequence parallel, B=1, T=4096) from a full
//            profile table — every fwd window, bwd window and legal pair priced by the
//            h100-8gpu cluster preset's pricer (CostModel) into a Profile, the search then reads only the table.
//            Median over --repeats runs; prints the table size and the JSON {"search_s": ...}.
//   compare  (--compare PLAN.json, every rank of an MPI world): training-step time with the
//            searched plan vs the default plan, measured in one run, round-robin per round so
//            drift hits both alike; a step = Trainer::compute_gradients (zero grads, fwd/bwd of
//            all micro-batches with SI on, gradient reductions; the AdamW update is the same for
//            both and not timed). Medians over rounds of the slowest rank's time. Remaining words
//            are run-config flags (--model.preset ..., --parallel.tp 2, ...); a synthetic
//            dataset is written to --workdir. Prints the JSON {"planned_t_s":..,"default_t_s":..}.
// bench/plan-search.sh runs both plus `dhelix profile` / `dhelix plan` on the emulated cluster.
#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "base/Clock.h"
#include "base/Error.h"
#include "base/Stats.h"
#include "comm/MpiBackend.h"
#include "plan/PlanRender.h"
#include "plan/Profile.h"
#include "schedule/PlanSearch.h"
#include "sim/CostModel.h"
#include "sim/StepModel.h"
#include "train/Config.h"
#include "train/IndexedDataset.h"
#include "train/Trainer.h"

namespace dhelix {
namespace {

int run_search(int repeats, int top_k) {
  ModelConfig m = model_preset("llama-70b");
  LayoutConfig lay;
  lay.tp = 8;
  lay.sequence_parallel = true;
  const MicroBatchShape mb{1, 4096};
  const LayerProgram prog = build_programs(m, lay, mb).block;
  const ClusterPreset h100 = load_cluster("h100-8gpu");  // scripts/bench runs from the repository root
  CostModel model(prog, cost_model_config(h100, lay, Precision::kBf16));
  // The profile table, as `dhelix profile` would write it on the real cluster.
  Profile table;
  table.describe_program(prog);
  for (const Window& w : strand_windows(prog.fwd, WindowRule::kWithinSegments))
    table.set_solo_fwd(w, model.solo_fwd(w.begin, w.end));
  for (const Window& w : strand_windows(prog.bwd, WindowRule::kWithinSegments))
    table.set_solo_bwd(w, model.solo_bwd(w.begin, w.end));
  for (const auto& [f, b] : legal_pairs(prog, WindowRule::kWithinSegments))
    table.set_pair(f, b, model.pair(f.begin, f.end, b.begin, b.end));
  SearchOptions so;
  so.top_k = top_k;
  std::vector<double> t;
  SearchResult r;
  for (int i = 0; i < repeats; ++i) {
    const double t0 = now_seconds();
    r = search_plans(prog, table, so);
    t.push_back(now_seconds() - t0);
  }
  const double s = median(t);
  fmt::print("plan search: llama-70b layer pair, tp=8 + SP, B=1 T=4096, h100-8gpu prices in a profile table\n");
  fmt::print("  {:<34} {}\n", "fwd ops / bwd ops", fmt::format("{} / {}", prog.fwd.size(), prog.bwd.size()));
  fmt::print("  {:<34} {} solo fwd, {} solo bwd, {} pairs\n", "profile entries", table.num_solo_fwd(),
             table.num_solo_bwd(), table.num_pairs());
  fmt::print("  {:<34} {}\n", "top-k", top_k);
  fmt::print("  {:<34} {}\n", "blocks priced per search", r.blocks_priced);
  fmt::print("  {:<34} {} ({} blocks)\n", "best plan (predicted)", format_seconds(r.plans.front().predicted_s),
             r.plans.front().blocks.size());
  fmt::print("  {:<34} {:.6f} s (median of {}; target < 1 s)\n", "search time", s, repeats);
  fmt::print("{}\n", nlohmann::json{{"search_s", s}, {"search_blocks_priced", r.blocks_priced}}.dump());
  return 0;
}

void write_dataset(const std::string& prefix, int64_t vocab) {
  IndexedDatasetWriter w(prefix, IndexDType::kU16);
  std::mt19937_64 rng(5);
  for (int d = 0; d < 200; ++d) {
    std::vector<int32_t> toks(1500);
    for (auto& t : toks) t = static_cast<int32_t>(rng() % static_cast<uint64_t>(vocab));
    w.add_document(toks);
  }
  w.finish();
}

int run_compare(const std::string& plan, const std::string& workdir, int rounds, const std::vector<std::string>& rest) {
  CliArgs args = parse_cli_args(rest);
  ConfigOverrides ov = args.overrides;
  ov.push_back({"data.prefix", workdir + "/data"});
  ov.push_back({"output.dir", workdir + "/run"});
  ov.push_back({"training.eval_interval", "0"});
  ov.push_back({"training.sample_tokens", "0"});
  ov.push_back({"data.val_fraction", "0.1"});
  RunConfig base = load_config(args.config_path, ov);
  LayoutConfig lay;
  lay.dp = static_cast<int>(base.parallel.dp);
  lay.tp = static_cast<int>(base.parallel.tp);
  lay.sequence_parallel = lay.tp > 1;
  auto comm = make_mpi_world(lay);
  const bool rank0 = comm->rank() == 0;
  if (rank0) {
    std::filesystem::create_directories(workdir);
    write_dataset(workdir + "/data", base.model.vocab_size);
  }
  comm->world().barrier();
  RunConfig with_plan = base;
  with_plan.schedule.plan = plan;
  with_plan.schedule.strand_interleaving = true;
  RunConfig def = base;
  def.schedule.plan.clear();
  def.schedule.strand_interleaving = true;
  Trainer planned(with_plan, comm.get(), Quiet::kYes), deflt(def, comm.get(), Quiet::kYes);
  auto step = [&](Trainer& t) {
    comm->world().barrier();
    const double t0 = now_seconds();
    t.compute_gradients();
    Tensor x = Tensor::empty({1}, DType::kF64);
    x.data<double>()[0] = now_seconds() - t0;
    comm->world().all_reduce(x, ReduceOp::kMax).wait();
    return x.data<double>()[0];
  };
  step(planned), step(deflt);  // warm-up
  std::vector<double> tp_, td_;
  for (int r = 0; r < rounds; ++r) {
    if (r % 2 == 0) tp_.push_back(step(planned)), td_.push_back(step(deflt));
    else td_.push_back(step(deflt)), tp_.push_back(step(planned));
    if (rank0) fmt::print("  round {}: planned {:.3f} s, default {:.3f} s\n", r + 1, tp_.back(), td_.back());
  }
  if (rank0) {
    const double a = median(tp_), b = median(td_);
    fmt::print("step time (SI on, {} micro-batches of B={} T={}, {}):\n", base.training.micro_batches,
               base.training.micro_batch_size, base.model.seq_len, comm->layout().describe());
    fmt::print("  {:<24} {:.3f} s\n  {:<24} {:.3f} s\n  {:<24} {:.3f}\n", "searched plan", a, "default plan", b,
               "default / planned", b / a);
    fmt::print("{}\n", nlohmann::json{{"planned_t_s", a}, {"default_t_s", b}}.dump());
  }
  return 0;
}

}  // namespace
}  // namespace dhelix

int main(int argc, char** argv) {
  std::vector<std::string> rest;
  std::string plan, workdir = "/tmp/dhelix_plan_search";
  int repeats = 5, top_k = 4, rounds = 3;
  try {
    for (int i = 1; i < argc; ++i) {
      std::string w = argv[i];
      auto val = [&]() -> std::string {
        if (i + 1 >= argc) throw dhelix::ConfigError(w + " needs a value");
        return argv[++i];
      };
      if (w == "--compare") plan = val();
      else if (w == "--workdir") workdir = val();
      else if (w == "--repeats") repeats = std::stoi(val());
      else if (w == "--top-k") top_k = std::stoi(val());
      else if (w == "--rounds") rounds = std::stoi(val());
      else rest.push_back(w);
    }
    if (plan.empty()) return dhelix::run_search(std::max(1, repeats), std::max(1, top_k));
    return dhelix::run_compare(plan, workdir, std::max(1, rounds), rest);
  } catch (const std::exception& e) {
    fmt::print(stderr, "plan_search: {}\n", e.what());
    return 2;
  }
}
