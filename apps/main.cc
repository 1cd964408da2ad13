// The `dhelix` command line: dispatches verbs and turns errors into exit codes -- the contract the
// README states and tests/apps/exit_codes_test.sh checks:
//   0  success
//   1  internal error (a bug in dhelix, or a peer rank that failed: CommError, InternalError, ...)
//   2  bad input: configuration, files, paths, a plan, a model that does not fit in memory
//   3  training diverged (a non-finite loss or gradient under training.nonfinite = stop, or too
//      many skipped steps in a row; no non-finite checkpoint is ever written)
//   128 + N  stopped by signal N (SIGTERM 143, SIGINT 130): train after saving a checkpoint (or
//            before its first step, with nothing to save); the other long verbs at their next stop
//            point, leaving no half-written file
// Multi-rank, an error every rank meets alike is printed by rank 0 only (CmdTrain.cc).
#include <fmt/format.h>

#include <cstring>
#include <string>

#include "Commands.h"
#include "base/Error.h"
#include "base/Signals.h"

namespace {

constexpr const char* kUsage =
    "usage: dhelix <command> [--config C.toml] [--section.key value ...]\n"
    "commands:\n"
    "  train      train a model (one process, or N under mpirun -np N)\n"
    "  sample     generate text from a checkpoint\n"
    "  data       data prepare: corpus, tokenizer, tokenized dataset\n"
    "  profile    time every legal pair of operator windows of the two strands\n"
    "  plan       search the best Strand-Interleaving plan for a profile\n"
    "  schedule   print and draw a pipeline step schedule (1f1b, interleaved, w); no hardware\n"
    "  tune       rank every parallel layout of N ranks by predicted step time on a cluster preset\n"
    "  simulate   simulate one training step op by op on a cluster preset\n"
    "run `dhelix <command> --help` for the keys a command takes.\n";

int run_verb(const std::string& verb, int argc, char** argv) {
  if (verb == "train") return dhelix::cmd_train(argc - 1, argv + 1);
  if (verb == "sample") return dhelix::cmd_sample(argc - 1, argv + 1);
  if (verb == "data") return dhelix::cmd_data(argc - 1, argv + 1);
  if (verb == "profile") return dhelix::cmd_profile(argc - 1, argv + 1);
  if (verb == "plan") return dhelix::cmd_plan(argc - 1, argv + 1);
  if (verb == "simulate") return dhelix::cmd_simulate(argc - 1, argv + 1);
  if (verb == "schedule") return dhelix::cmd_schedule(argc - 1, argv + 1);
  if (verb == "tune") return dhelix::cmd_tune(argc - 1, argv + 1);
  fmt::print(stderr, "dhelix: unknown command '{}'\n{}", verb, kUsage);
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || !std::strcmp(argv[1], "--help") || !std::strcmp(argv[1], "-h")) {
    std::fputs(kUsage, argc < 2 ? stderr : stdout);
    return argc < 2 ? 2 : 0;
  }
  const std::string verb = argv[1];
  // The verbs that run for long honour a first SIGTERM / SIGINT at their stop points (base/Signals.h)
  // and end with 128 + N; simulate and schedule, which finish in seconds and write their files
  // atomically, keep the default action (the first signal ends them at once).
  if (verb == "train" || verb == "sample" || verb == "data" || verb == "profile" || verb == "plan" || verb == "tune")
    dhelix::install_stop_handlers();
  try {
    const int rc = run_verb(verb, argc, argv);
    // A first signal that no stop point met (it came as the command finished): the work is done and
    // written, and the exit status still says the command was signalled.
    if (const int sig = dhelix::stop_signal(); sig != 0 && rc == 0) {
      fmt::print(stderr, "dhelix {}: {} arrived as the command finished; its output is complete (exit {})\n", verb,
                 dhelix::signal_name(sig), 128 + sig);
      return 128 + sig;
    }
    return rc;
  } catch (...) {
    return dhelix::report_error(verb, std::current_exception());
  }
}
