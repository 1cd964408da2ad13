// One verb's own flags as a table -- {name, type, default, help} -- and what is generated from it:
// the parser (`--name value`, `--name=value`, switches; every bad word collected and thrown as one
// ConfigError naming the flag and the value, with a hint: main exits 2) and the help text, so the
// two cannot drift. The config's keys (`--config`, `--section.key value`) have their own table
// (train/Config.cc); a verb that takes a config passes the words that are not its flags on to it.
#pragma once
#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "train/Config.h"  // CliArgs

namespace dhelix {

enum class FlagType {
  kInt,     // a whole number (FlagSpec::min: the least accepted)
  kNumber,  // a real number (FlagSpec::min likewise)
  kText,    // any word (a path, a preset, a list)
  kAnyText, // any word, the empty one too (a prompt)
  kOnOff,   // on | off
  kChoice,  // one of FlagSpec::value's '|'-separated words
  kSwitch,  // no value: given or not
};
enum class Need { kOptional, kRequired };
// Whether the verb takes a config (`--config C.toml`, `--section.key value`): its words are passed
// on (to parse_verb_args), else they are errors like any unknown flag.
enum class ConfigWords { kRejected, kPassedOn };

struct FlagSpec {
  FlagSpec(std::string name_, FlagType type_, std::string def_, std::string help_, std::string value_ = "",
           std::optional<double> min_ = std::nullopt, std::optional<double> max_ = std::nullopt,
           Need need_ = Need::kOptional)
      : name(std::move(name_)), type(type_), def(std::move(def_)), help(std::move(help_)), value(std::move(value_)),
        min(min_), max(max_), need(need_) {}
  std::string name;                 // "--pp"
  FlagType type = FlagType::kText;
  std::string def;                  // the default as text ("" = none, or one the help describes)
  std::string help;                 // may span lines ('\n'); continuation lines are indented
  std::string value;                // the value's name in help ("P", "FILE"); kChoice: "a|b|c"
  std::optional<double> min, max;   // kInt, kNumber: the range accepted
  Need need = Need::kOptional;
};

struct FlagTable {
  std::string verb;    // "schedule"
  std::string usage;   // the usage lines and what the verb does, printed above the flags
  std::vector<FlagSpec> flags;
  ConfigWords config = ConfigWords::kRejected;
};

// The flags a command line gave. Getters take a flag of the table (InternalError otherwise); a
// value that did not parse was reported by parse_flags and reads as the default here.
class FlagValues {
 public:
  FlagValues() = default;
  FlagValues(const FlagTable* table, std::map<std::string, std::string> given, std::set<std::string> bad)
      : table_(table), given_(std::move(given)), bad_(std::move(bad)) {}
  bool given(const std::string& name) const;
  // False when the flag was given a value that did not parse (reported); its getters give the default.
  bool ok(const std::string& name) const;
  // The word given, or nullopt.
  std::optional<std::string> text(const std::string& name) const;
  // The value given, else the table's default (InternalError when it has none: check given()).
  std::string text_or_default(const std::string& name) const;
  int64_t integer(const std::string& name) const;
  double number(const std::string& name) const;
  // kSwitch: given; kOnOff: "on".
  bool on(const std::string& name) const;

 private:
  const FlagSpec& spec(const std::string& name) const;
  const FlagTable* table_ = nullptr;
  std::map<std::string, std::string> given_;
  std::set<std::string> bad_;
};

struct ParsedFlags {
  FlagValues values;
  std::vector<std::string> config_words;  // ConfigWords::kPassedOn: the words for parse_verb_args
  bool help = false;                      // -h / --help
};

// Parses the words after the verb (argv[0] is the verb). Every unknown flag, missing or repeated
// value, bad number or choice, and missing required flag is appended to `errors` (nothing thrown),
// so one run names every bad word. Required flags are not asked for when --help is given.
ParsedFlags parse_flags(const FlagTable& t, int argc, char** argv, std::vector<std::string>& errors);
// parse_flags for a verb without a config: its values, or nullopt after printing --help (the flags'
// help). Errors are appended to `errors` as above.
std::optional<FlagValues> parse_flags_or_help(const FlagTable& t, int argc, char** argv, std::vector<std::string>& errors);
// ConfigError: "N error(s):" and one line per error, `extra` (more lines, may be empty) and the hint
// "run `dhelix VERB --help` for the flags". Does nothing when `errors` is empty.
void throw_flag_errors(const FlagTable& t, const std::vector<std::string>& errors, const std::string& extra = "");
// A verb that takes a config: its flags (into `out`; bad ones thrown together as above), then the
// config words through parse_verb_args; nullopt after printing --help (the flags' help, then the
// config keys').
std::optional<CliArgs> parse_flags_and_config(const FlagTable& t, int argc, char** argv, FlagValues& out);
// The usage, then one line per flag: "  --name VALUE   help (default: D)", continuation lines indented.
std::string flag_help(const FlagTable& t);

// A whole word as a number, strictly: no trailing characters, no overflow (parse_int); finite
// (parse_number: no inf or nan). nullopt otherwise.
std::optional<int64_t> parse_int(const std::string& w);
std::optional<double> parse_number(const std::string& w);

}  // namespace dhelix
