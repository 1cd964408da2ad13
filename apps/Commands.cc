// What the verbs share: the config-word parsing with --help and the positional-word check.
#include "Commands.h"

#include <fmt/format.h>

#include "base/Error.h"

namespace dhelix {

std::optional<CliArgs> parse_verb_args(const std::vector<std::string>& words, const char* verb, const char* usage) {
  CliArgs args = parse_cli_args(words);
  if (args.help) {
    fmt::print("{}\n{}", usage, help_text());
    return std::nullopt;
  }
  DHX_CHECK(args.positional.empty(), ConfigError, "dhelix {}: unexpected argument '{}'\n{}", verb, args.positional[0],
            usage);
  return args;
}

}  // namespace dhelix
