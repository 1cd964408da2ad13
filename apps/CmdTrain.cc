// `dhelix train` and `dhelix sample`: resolve the run config (TOML + flags), start the world
// (MPI when launched under mpirun with more than one rank, otherwise a single process) and run
// the Trainer. The resolved config is printed and saved with the run.
#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>

#include "Commands.h"
#include "FlagTable.h"
#include "base/Error.h"
#include "base/Checksum.h"
#include "base/Files.h"
#include "base/Signals.h"
#include "comm/MpiBackend.h"
#include "train/CheckpointStore.h"
#include "TrainMemory.h"
#include "train/Preflight.h"
#include "train/Trainer.h"

namespace dhelix {

namespace {

constexpr const char* kTrainUsage =
    "usage: dhelix train --config C.toml [--section.key value ...]\n"
    "       mpirun -np N dhelix train --config C.toml --parallel.dp D --parallel.tp T ...\n";

}  // namespace

CommOptions comm_options(const RunConfig& cfg) {
  CommOptions o;
  o.transport = parse_comm_transport(cfg.comm.transport);
  if (cfg.comm.timeout_s > 0) o.timeout_s = cfg.comm.timeout_s;
  o.nice = static_cast<int>(cfg.comm.nice);
  o.mpi_poll_us = static_cast<int>(cfg.comm.mpi_poll_us);
  o.max_message_bytes = cfg.comm.max_message_bytes;
  o.gloo_host = cfg.comm.gloo_host;
  return o;
}

int cmd_train(int argc, char** argv) {
  std::vector<std::string> words(argv + 1, argv + argc);
  std::optional<CliArgs> parsed = parse_verb_args(words, "train", kTrainUsage);
  if (!parsed) return 0;
  const CliArgs& args = *parsed;
  RunConfig cfg;
  {
    // Under mpirun every rank reads the config before the ranks connect; when it fails, the ranks
    // compare what failed so each distinct error is printed once (by the lowest rank that met
    // it), not once per rank.
    std::exception_ptr error;
    std::string text;
    try {
      cfg = load_config(args.config_path, args.overrides);
      apply_process_settings(cfg);
      // A layout that does not fit the ranks mpirun started is met by every rank alike: found here,
      // it is printed once (below), not once per rank.
      if (launched_by_mpirun() && mpi_world_size() != layout_config(cfg).world()) {
        const auto& p = cfg.parallel;
        throw ConfigError(fmt::format("layout does not fit the MPI world: world size {} != the layout's {} ranks "
                                      "(dp={} pp={} cp={} tp={} tp_x={} tp_y={} tp_z={})\nhint: launch with mpirun -np {}",
                                      mpi_world_size(), layout_config(cfg).world(), p.dp, p.pp, p.cp, p.tp, p.tp_x,
                                      p.tp_y, p.tp_z, layout_config(cfg).world()));
      }
    } catch (const Error& e) {
      error = std::current_exception();
      text = e.what();
    }
    if (launched_by_mpirun() && mpi_world_size() > 1) {
      const int64_t mine = error ? static_cast<int64_t>(crc32c(text.data(), text.size())) + 1 : 0;
      const std::vector<int64_t> all = mpi_world_allgather(mine);
      int rank = 0;
      if (const char* r = std::getenv("OMPI_COMM_WORLD_RANK")) rank = std::atoi(r);
      const bool any = std::any_of(all.begin(), all.end(), [](int64_t v) { return v != 0; });
      if (any) {
        const bool first_with_mine =
            error && std::find(all.begin(), all.end(), mine) - all.begin() == static_cast<std::ptrdiff_t>(rank);
        // The reporting ranks print before anyone exits: mpirun stops the whole job at the first
        // non-zero exit, which could otherwise cut a report off.
        int code = 2;
        if (first_with_mine) {
          code = report_error("train", error);
          std::fflush(stderr);
        }
        mpi_world_allgather(0);
        mpi_finalize_early();
        return code;
      }
    } else if (error) {
      std::rethrow_exception(error);
    }
  }
  std::unique_ptr<CommContext> comm;
  if (launched_by_mpirun() || layout_config(cfg).world() > 1)
    comm = make_mpi_world(layout_config(cfg), comm_options(cfg));
  const bool rank0 = !comm || comm->rank() == 0;
  int stopped_by = 0;
  try {
    // Every rank checks the same inputs, so every rank fails alike; rank 0 alone reports (below).
    if (comm && comm->world_size() > 1) check_ranks_agree(cfg, *comm);
    // The memory pre-check uses the step model, which prices neither cp nor ep layouts yet.
    if (cfg.parallel.cp == 1 && cfg.parallel.ep == 1) check_memory(estimate_rank_memory(cfg), ranks_on_this_host(nullptr));
    check_writable_paths(cfg);
    for (const std::string& line : prepare_run_directory(cfg, rank0))
      if (rank0) fmt::print("{}\n", line);
    if (rank0) fmt::print("# resolved configuration\n{}\n", to_toml(cfg));
    if (comm) comm->world().barrier();
    Trainer trainer(cfg, comm.get());
    stopped_by = trainer.run();
  } catch (const ConfigError&) {
    if (!rank0) return 2;
    throw;
  } catch (const DivergedError&) {
    if (!rank0) return 3;
    throw;
  } catch (const IoError& e) {
    if (!rank0) return 2;
    if (!file_exists(cfg.data.prefix + ".idx") || !file_exists(cfg.data.prefix + ".bin"))
      throw IoError(fmt::format("{}\nhint: make the dataset with `dhelix data prepare --config ...` "
                                "(scripts/setup does this for configs/demo.toml)", e.what()));
    throw;
  } catch (const std::exception& e) {
    if (comm && comm->world_size() > 1) comm->abort(e.what());
    throw;
  }
  return stopped_by == 0 ? 0 : 128 + stopped_by;
}

namespace {

// Sampling options are not run-config keys: the verb's own flags; the config words pass on.
const FlagTable& sample_flags() {
  static const FlagTable t{
      "sample",
      "usage: dhelix sample --config C.toml [--checkpoint DIR|latest] [--prompt TEXT] [--tokens N]\n"
      "                     [--temperature X] [--top-k K] [--seed S] [--section.key value ...]\n"
      "Generates text from a checkpoint of the run the config names (any layout it was trained in), on\n"
      "one process; the text streams as it is generated.\n",
      {
          {"--checkpoint", FlagType::kText, "latest", "a step directory, or latest (checkpoint.dir's newest that loads)",
           "DIR"},
          {"--prompt", FlagType::kAnyText, "In the beginning", "the text to continue (empty: from the start token)",
           "TEXT"},
          {"--tokens", FlagType::kInt, "64", "tokens to generate", "N", 1, double(1 << 20)},
          {"--temperature", FlagType::kNumber, "0.8", "softmax temperature (0: the most likely token)", "X", 0, 100},
          {"--top-k", FlagType::kInt, "40", "sample among the K most likely tokens (0: all)", "K", 0, double(1 << 30)},
          {"--seed", FlagType::kInt, "1", "the sampler's seed", "S", 0},
      },
      ConfigWords::kPassedOn};
  return t;
}

}  // namespace

int cmd_sample(int argc, char** argv) {
  FlagValues fl;
  const std::optional<CliArgs> parsed = parse_flags_and_config(sample_flags(), argc, argv, fl);
  if (!parsed) return 0;
  const CliArgs& args = *parsed;
  const std::string checkpoint = fl.text_or_default("--checkpoint"), prompt = fl.text_or_default("--prompt");
  const int64_t tokens = fl.integer("--tokens"), top_k = fl.integer("--top-k");
  const double temperature = fl.number("--temperature");
  const uint64_t seed = static_cast<uint64_t>(fl.integer("--seed"));
  RunConfig cfg = load_config(args.config_path, args.overrides);
  apply_process_settings(cfg);
  cfg.parallel.dp = cfg.parallel.tp = cfg.parallel.pp = 1;
  cfg.parallel.tp_x = cfg.parallel.tp_y = cfg.parallel.tp_z = 1;
  cfg.parallel.zero = 0;
  cfg.schedule.pipeline = "1f1b";  // the whole model on one rank, whatever layout trained it
  cfg.schedule.virtual_stages = 1;
  Trainer trainer(cfg, nullptr, Quiet::kYes, Trainer::Data::kNone);
  std::string skipped;
  try {
    trainer.load_resume(checkpoint.empty() ? "latest" : checkpoint, /*whole_state=*/false, &skipped);
  } catch (const IoError& e) {
    throw IoError(fmt::format("{}\nhint: train first, or pass --checkpoint DIR", e.what()));
  }
  if (!skipped.empty()) fmt::print(stderr, "warning: {}; sampling from the newest checkpoint that loads\n", skipped);
  stop_point("sample (loading the checkpoint)");
  // The text streams as it is generated (a long sample is never a silent wait).
  trainer.sample(prompt, tokens, temperature, top_k, seed, [](const std::string& piece) {
    fmt::print("{}", piece);
    std::fflush(stdout);
  });
  fmt::print("\n");
  if (const int sig = stop_signal(); sig != 0) {
    fmt::print(stderr, "dhelix sample: stopped by {}: the text above is cut short (exit {})\n", signal_name(sig), 128 + sig);
    return 128 + sig;
  }
  return 0;
}

}  // namespace dhelix
