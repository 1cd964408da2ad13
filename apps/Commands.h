// Entry points of the `dhelix` verbs. Each takes the words after the program name (argv[0] is the
// verb itself, e.g. "data") and returns the exit code; ConfigError / IoError propagate to main(),
// which prints them and exits 2.
#pragma once
#include <exception>
#include <optional>
#include <string>
#include <vector>

#include "base/Log.h"
#include "train/Config.h"

namespace dhelix {

struct CommOptions;  // comm/CommContext.h

// The config words of a verb (`--config`, `--section.key value`): on --help prints `usage` and
// every key and returns nullopt (the verb exits 0); a positional word is a ConfigError naming the
// verb. apps/Commands.cc.
std::optional<CliArgs> parse_verb_args(const std::vector<std::string>& words, const char* verb, const char* usage);

// Prints the error `e` the way the exit-code table says (README) and returns its exit code:
// ConfigError ("configuration error:"), IoError, PlanError, out of memory -> 2; DivergedError -> 3;
// anything else -> 1. main() calls it for every verb; cmd_train also before its ranks part.
int report_error(const std::string& verb, const std::exception_ptr& e);

// What a resolved config sets for the whole process: the log threshold (output.log_level, checked
// by load_config). Every verb with a config calls it right after load_config.
inline void apply_process_settings(const RunConfig& cfg) {
  set_log_threshold(parse_log_level(cfg.output.log_level).value_or(LogLevel::kInfo));
}
// The comm backend's options from the [comm] keys (comm.timeout_s 0 = the default, 120 s);
// apps/CmdTrain.cc.
CommOptions comm_options(const RunConfig& cfg);

// dhelix data prepare --config C.toml [--section.key value ...]
int cmd_data(int argc, char** argv);
// dhelix train --config C.toml [...]; under mpirun: one rank of the world.
int cmd_train(int argc, char** argv);
// dhelix sample --config C.toml [--checkpoint DIR] [--prompt TEXT] ...
int cmd_sample(int argc, char** argv);
// dhelix profile / dhelix plan (apps/CmdPlan.cc).
int cmd_profile(int argc, char** argv);
int cmd_plan(int argc, char** argv);
// dhelix simulate --config C.toml --cluster PRESET [...]: one step simulated op by op (apps/CmdPlan.cc).
int cmd_simulate(int argc, char** argv);
// dhelix schedule [--pp P] [--micro-batches N] [--pipeline K] ... [--svg FILE]: a pipeline step
// schedule printed and drawn; no config file (apps/CmdSchedule.cc).
int cmd_schedule(int argc, char** argv);
// dhelix tune --model PRESET --gpus N --cluster PRESET [...]: layouts ranked by the step model
// (apps/CmdTune.cc).
int cmd_tune(int argc, char** argv);

}  // namespace dhelix
