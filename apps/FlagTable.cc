// The flag-table layer (FlagTable.h): one parser and one help generator for every verb's own flags.
// Messages name the flag and the word given: "--pp expects an integer, got 'x'", "--si 'maybe' must
// be on or off", "unknown flag '--stages'".
#include "FlagTable.h"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <string_view>

#include "Commands.h"
#include "base/Error.h"

namespace dhelix {
namespace {

bool is_flag_word(const std::string& w) { return w.rfind("--", 0) == 0; }

const FlagSpec* find_spec(const FlagTable& t, const std::string& name) {
  for (const FlagSpec& f : t.flags)
    if (f.name == name) return &f;
  return nullptr;
}

std::vector<std::string> choices_of(const FlagSpec& f) {
  std::vector<std::string> out;
  std::string_view rest = f.value;
  for (size_t at; !rest.empty(); rest = at == std::string_view::npos ? "" : rest.substr(at + 1)) {
    at = rest.find('|');
    out.emplace_back(rest.substr(0, at));
  }
  return out;
}

// The error for value `w` of flag `f`, or "" when it is good.
std::string check_value(const FlagSpec& f, const std::string& w) {
  switch (f.type) {
    case FlagType::kInt: {
      const std::optional<int64_t> x = parse_int(w);
      // Without a stated bound a whole number stays below 2^40, so sizes computed from it cannot overflow.
      const double hi = f.max.value_or(double(int64_t{1} << 40));
      const bool in_range = x && (!f.min || double(*x) >= *f.min) && double(*x) <= hi;
      if (in_range) return "";
      if (x && double(*x) > hi) return fmt::format("{} {} must be <= {:.0f}", f.name, w, hi);
      if (f.min) return fmt::format("{} expects a whole number >= {:g}, got '{}'", f.name, *f.min, w);
      return fmt::format("{} expects an integer, got '{}'", f.name, w);
    }
    case FlagType::kNumber: {
      const std::optional<double> x = parse_number(w);
      if (!x) {
        // A whole word that reads as inf or nan is a number, but not a finite one.
        char* end = nullptr;
        const double v = std::strtod(w.c_str(), &end);
        const bool non_finite = !w.empty() && end == w.c_str() + w.size() && !std::isfinite(v);
        return fmt::format("{} expects a {}number, got '{}'", f.name, non_finite ? "finite " : "", w);
      }
      if (f.min && *x < *f.min) return fmt::format("{} {} must be >= {:g}", f.name, w, *f.min);
      if (f.max && *x > *f.max) return fmt::format("{} {} must be <= {:g}", f.name, w, *f.max);
      return "";
    }
    case FlagType::kOnOff:
      return w == "on" || w == "off" ? "" : fmt::format("{} '{}' must be on or off", f.name, w);
    case FlagType::kChoice: {
      const std::vector<std::string> c = choices_of(f);
      if (std::find(c.begin(), c.end(), w) != c.end()) return "";
      if (c.size() == 2) return fmt::format("{} '{}' must be {} or {}", f.name, w, c[0], c[1]);
      return fmt::format("{} '{}' is not one of {}", f.name, w, fmt::join(c, ", "));
    }
    case FlagType::kText:
      return w.empty() ? fmt::format("{} needs a value", f.name) : "";
    case FlagType::kAnyText:
      return "";
    case FlagType::kSwitch:
      return "";
  }
  return "";
}

}  // namespace

std::optional<int64_t> parse_int(const std::string& w) {
  int64_t x = 0;
  const auto [end, ec] = std::from_chars(w.data(), w.data() + w.size(), x);
  if (w.empty() || ec != std::errc() || end != w.data() + w.size()) return std::nullopt;
  return x;
}

std::optional<double> parse_number(const std::string& w) {
  try {
    size_t used = 0;
    const double x = std::stod(w, &used);
    if (used == w.size() && std::isfinite(x)) return x;
  } catch (const std::exception&) {
  }
  return std::nullopt;
}

std::optional<FlagValues> parse_flags_or_help(const FlagTable& t, int argc, char** argv, std::vector<std::string>& errors) {
  ParsedFlags parsed = parse_flags(t, argc, argv, errors);
  if (parsed.help) {
    fmt::print("{}", flag_help(t));
    return std::nullopt;
  }
  return std::move(parsed.values);
}

ParsedFlags parse_flags(const FlagTable& t, int argc, char** argv, std::vector<std::string>& errors) {
  ParsedFlags out;
  std::map<std::string, std::string> given;
  std::set<std::string> bad;
  const bool pass_on = t.config == ConfigWords::kPassedOn;
  for (int i = 1; i < argc; ++i) {
    std::string w = argv[i], value;
    if (w == "--help" || w == "-h") {
      out.help = true;
      if (pass_on) out.config_words.push_back(w);
      continue;
    }
    bool has_value = false;
    if (size_t eq = w.find('='); is_flag_word(w) && eq != std::string::npos)
      value = w.substr(eq + 1), w = w.substr(0, eq), has_value = true;
    const FlagSpec* f = find_spec(t, w);
    if (f == nullptr) {
      if (pass_on) {  // a config word (or a stray one: parse_verb_args names it)
        out.config_words.emplace_back(argv[i]);
        continue;
      }
      errors.push_back(is_flag_word(w) ? fmt::format("unknown flag '{}'", w) : fmt::format("unexpected argument '{}'", w));
      // An unknown flag's value goes with it, so it is not reported again as a stray word.
      if (is_flag_word(w) && !has_value && i + 1 < argc && !is_flag_word(argv[i + 1])) ++i;
      continue;
    }
    if (f->type == FlagType::kSwitch) {
      if (has_value) errors.push_back(fmt::format("{} takes no value (got '{}')", w, value));
      given[w] = "on";
      continue;
    }
    if (!has_value) {
      if (i + 1 >= argc) {
        errors.push_back(fmt::format("{} needs a value", w));
        continue;
      }
      value = argv[++i];
    }
    if (given.count(w)) {
      errors.push_back(fmt::format("{} is given twice ('{}' and '{}')", w, given[w], value));
      continue;
    }
    if (std::string e = check_value(*f, value); !e.empty()) {
      errors.push_back(e);
      bad.insert(w);
      continue;
    }
    given[w] = value;
  }
  if (!out.help)
    for (const FlagSpec& f : t.flags)
      if (f.need == Need::kRequired && !given.count(f.name) && !bad.count(f.name)) errors.push_back(fmt::format("{} is required", f.name));
  out.values = FlagValues(&t, std::move(given), std::move(bad));
  return out;
}

void throw_flag_errors(const FlagTable& t, const std::vector<std::string>& errors, const std::string& extra) {
  if (errors.empty()) return;
  std::string msg = fmt::format("{} error{}:", errors.size(), errors.size() == 1 ? "" : "s");
  for (const std::string& e : errors) msg += "\n  - " + e;
  throw ConfigError(fmt::format("{}{}\nrun `dhelix {} --help` for the flags", msg, extra, t.verb));
}

std::optional<CliArgs> parse_flags_and_config(const FlagTable& t, int argc, char** argv, FlagValues& out) {
  std::vector<std::string> errors;
  ParsedFlags parsed = parse_flags(t, argc, argv, errors);
  if (!parsed.help) throw_flag_errors(t, errors);
  out = std::move(parsed.values);
  return parse_verb_args(parsed.config_words, t.verb.c_str(), flag_help(t).c_str());
}

std::string flag_help(const FlagTable& t) {
  constexpr size_t kColumn = 25;  // where the help text starts
  std::string s = t.usage;
  for (const FlagSpec& f : t.flags) {
    std::string head = "  " + f.name;
    if (f.type != FlagType::kSwitch) head += " " + (f.value.empty() ? std::string("VALUE") : f.value);
    head += head.size() + 1 < kColumn ? std::string(kColumn - head.size(), ' ') : std::string("  ");
    std::string text = f.help;
    if (!f.def.empty()) text += fmt::format(" (default {})", f.def);
    std::string indented;
    for (char c : text) indented += c == '\n' ? "\n" + std::string(kColumn, ' ') : std::string(1, c);
    s += head + indented + "\n";
  }
  return s;
}

const FlagSpec& FlagValues::spec(const std::string& name) const {
  const FlagSpec* f = table_ ? find_spec(*table_, name) : nullptr;
  DHX_CHECK(f != nullptr, InternalError, "flag {} is not in the table of dhelix {}", name, table_ ? table_->verb : "?");
  return *f;
}

bool FlagValues::given(const std::string& name) const {
  (void)spec(name);
  return given_.count(name) > 0;
}

bool FlagValues::ok(const std::string& name) const {
  (void)spec(name);
  return bad_.count(name) == 0;
}

std::optional<std::string> FlagValues::text(const std::string& name) const {
  (void)spec(name);
  auto it = given_.find(name);
  return it == given_.end() ? std::nullopt : std::optional<std::string>(it->second);
}

std::string FlagValues::text_or_default(const std::string& name) const {
  const FlagSpec& f = spec(name);
  auto it = given_.find(name);
  if (it != given_.end()) return it->second;
  DHX_CHECK(!f.def.empty(), InternalError, "flag {} of dhelix {} has no default", name, table_->verb);
  return f.def;
}

int64_t FlagValues::integer(const std::string& name) const {
  const std::optional<int64_t> x = parse_int(text_or_default(name));
  DHX_CHECK(x.has_value(), InternalError, "flag {}: value '{}' read as an integer", name, text_or_default(name));
  return *x;
}

double FlagValues::number(const std::string& name) const {
  const std::optional<double> x = parse_number(text_or_default(name));
  DHX_CHECK(x.has_value(), InternalError, "flag {}: value '{}' read as a number", name, text_or_default(name));
  return *x;
}

bool FlagValues::on(const std::string& name) const {
  const FlagSpec& f = spec(name);
  if (f.type == FlagType::kSwitch) return given_.count(name) > 0;
  return text_or_default(name) == "on";
}

}  // namespace dhelix
