// `dhelix data prepare`: resolves the run config and makes the corpus, tokenizer and tokenized
// dataset it names (train/DataPrepare). Argument splitting and help come from the config table.
#include <fmt/format.h>

#include <cstdio>
#include <string>
#include <vector>

#include "Commands.h"
#include "base/Error.h"
#include "train/Config.h"
#include "train/DataPrepare.h"

namespace dhelix {

namespace {
constexpr const char* kUsage =
    "usage: dhelix data prepare --config C.toml [--section.key value ...]\n"
    "Makes what data.* names, each only when missing or older than its inputs:\n"
    "  data.corpus     text, one document per line (from `bible`, package bible-kjv, if missing)\n"
    "  data.tokenizer  SentencePiece BPE with model.vocab_size pieces, trained on the corpus\n"
    "  data.prefix     <prefix>.bin/.idx, Megatron MMIDIDX, one EOS-terminated document per line\n";
}  // namespace

int cmd_data(int argc, char** argv) {
  std::vector<std::string> words(argv + (argc > 0 ? 1 : 0), argv + argc);  // skip the verb
  CliArgs args = parse_cli_args(words);
  if (args.help) {
    fmt::print("{}\n{}", kUsage, help_text());
    return 0;
  }
  if (args.positional.size() != 1 || args.positional[0] != "prepare")
    throw ConfigError(fmt::format("dhelix data: expected the action `prepare`, got '{}'\n{}",
                                  args.positional.empty() ? "" : args.positional[0], kUsage));
  RunConfig cfg = load_config(args.config_path, args.overrides);
  apply_process_settings(cfg);
  // Each progress line is flushed as it is said: with stdout in a file (a job's log) it would wait in
  // the buffer until exit, and a long tokenization would show nothing until it ended.
  PrepareReport r = prepare_data(cfg, [](const std::string& line) {
    fmt::print("data: {}\n", line);
    std::fflush(stdout);
  });
  fmt::print("data: ready: {} documents, {} tokens in {}.bin/.idx\n", r.documents, r.tokens, cfg.data.prefix);
  return 0;
}

}  // namespace dhelix
