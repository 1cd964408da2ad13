// What the verbs share: the config-word parsing with --help and the positional-word check, and
// the error report with its exit code.
#include "Commands.h"

#include <fmt/format.h>

#include <cstdio>
#include <new>

#include "base/Error.h"
#include "base/Signals.h"

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

int report_error(const std::string& verb, const std::exception_ptr& e) {
  try {
    std::rethrow_exception(e);
  } catch (const StopRequested& x) {
    fmt::print(stderr, "dhelix {}: {}; nothing half-written is left (exit {})\n", verb, x.what(), 128 + x.sig());
    return 128 + x.sig();
  } catch (const ConfigError& x) {
    // A list of errors carries its own head ("3 configuration errors:"): not a second one.
    const std::string what = x.what();
    const size_t digits = what.find_first_not_of("0123456789");
    const bool headed = digits > 0 && digits != std::string::npos &&
                        (what.compare(digits, 20, " configuration error") == 0 || what.compare(digits, 6, " error") == 0);
    if (headed)
      fmt::print(stderr, "dhelix {}: {}\n", verb, what);
    else
      fmt::print(stderr, "dhelix {}: configuration error:\n{}\n", verb, what);
    return 2;
  } catch (const IoError& x) {
    fmt::print(stderr, "dhelix {}: {}\n", verb, x.what());
    return 2;
  } catch (const PlanError& x) {
    fmt::print(stderr, "dhelix {}: invalid plan: {}\n", verb, x.what());
    return 2;
  } catch (const DivergedError& x) {
    fmt::print(stderr, "dhelix {}: training diverged: {}\n", verb, x.what());
    return 3;
  } catch (const std::bad_alloc&) {
    fmt::print(stderr,
               "dhelix {}: out of memory: the run needs more memory than this machine has free.\nhint: a smaller "
               "model, training.micro_batch_size or model.seq_len, more tp or pp ranks, or parallel.zero 1\n",
               verb);
    return 2;
  } catch (const std::exception& x) {
    fmt::print(stderr, "dhelix {}: error: {}\n", verb, x.what());
    return 1;
  }
}

}  // namespace dhelix
