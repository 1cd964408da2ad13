// Profile table: storage, lookup and JSON.
#include "plan/Profile.h"

#include <fmt/format.h>

#include <cmath>
#include <limits>

#include "base/Error.h"
#include "base/Files.h"

namespace dhelix {

using nlohmann::json;

namespace {

void check_seconds(double s, const char* what, Window f, Window b) {
  DHX_CHECK(std::isfinite(s) && s >= 0, PlanError,
            "profile entry {} fwd [{},{}) bwd [{},{}) has time {} (must be finite and >= 0)", what,
            f.begin, f.end, b.begin, b.end, s);
  DHX_CHECK(f.begin >= 0 && f.begin <= f.end && b.begin >= 0 && b.begin <= b.end, PlanError,
            "profile entry {}: bad windows fwd [{},{}) bwd [{},{})", what, f.begin, f.end,
            b.begin, b.end);
}

template <class Map, class Key>
std::optional<double> find_in(const Map& m, const Key& k) {
  auto it = m.find(k);
  if (it == m.end()) return std::nullopt;
  return it->second;
}

// A JSON integer that fits an int, or PlanError naming `what`. nlohmann's get<int>() of a float or
// a wider integer converts unchecked (5e50 -> int is undefined behaviour; found by fuzz/fuzz_plan).
int int_of(const json& v, const std::string& origin, const std::string& what) {
  constexpr int64_t kMin = std::numeric_limits<int>::min(), kMax = std::numeric_limits<int>::max();
  const bool fits = v.is_number_unsigned() ? v.get<uint64_t>() <= uint64_t{kMax}
                    : v.is_number_integer() ? v.get<int64_t>() >= kMin && v.get<int64_t>() <= kMax
                                            : false;
  DHX_CHECK(fits, PlanError, "{}: {} is {}, expected an integer", origin, what, v.dump());
  return static_cast<int>(v.get<int64_t>());
}

std::vector<std::string> op_names(const std::vector<Op>& ops) {
  std::vector<std::string> n;
  for (const Op& op : ops) n.push_back(op.name);
  return n;
}

}  // namespace

void Profile::describe_program(const LayerProgram& prog) {
  meta.pair = prog.name;
  meta.fwd_ops = op_names(prog.fwd);
  meta.bwd_ops = op_names(prog.bwd);
}

void Profile::check_matches(const LayerProgram& prog) const {
  DHX_CHECK(meta.pair == prog.name, PlanError, "profile is for pair '{}', program is '{}'",
            meta.pair, prog.name);
  auto same = [&](const std::vector<std::string>& names, const std::vector<Op>& ops,
                  const char* sname) {
    DHX_CHECK(names.size() == ops.size(), PlanError,
              "profile has {} {} ops, program '{}' has {} (profiled another layout?)",
              names.size(), sname, prog.name, ops.size());
    for (size_t i = 0; i < ops.size(); ++i)
      DHX_CHECK(names[i] == ops[i].name, PlanError,
                "profile {} op #{} is '{}', program has '{}' (profiled another layout?)", sname,
                i, names[i], ops[i].name);
  };
  same(meta.fwd_ops, prog.fwd, "fwd");
  same(meta.bwd_ops, prog.bwd, "bwd");
}

void Profile::set_solo_fwd(Window f, double s) {
  check_seconds(s, "solo_fwd", f, {});
  solo_fwd_[{f.begin, f.end}] = s;
}
void Profile::set_solo_bwd(Window b, double s) {
  check_seconds(s, "solo_bwd", {}, b);
  solo_bwd_[{b.begin, b.end}] = s;
}
void Profile::set_pair(Window f, Window b, double s) {
  check_seconds(s, "pair", f, b);
  pairs_[{f.begin, f.end, b.begin, b.end}] = s;
}

std::optional<double> Profile::find_solo_fwd(Window f) const {
  return find_in(solo_fwd_, std::array<int, 2>{f.begin, f.end});
}
std::optional<double> Profile::find_solo_bwd(Window b) const {
  return find_in(solo_bwd_, std::array<int, 2>{b.begin, b.end});
}
std::optional<double> Profile::find_pair(Window f, Window b) const {
  return find_in(pairs_, std::array<int, 4>{f.begin, f.end, b.begin, b.end});
}

double Profile::solo_fwd(int a, int b) const { return find_solo_fwd({a, b}).value_or(kNoCost); }
double Profile::solo_bwd(int c, int d) const { return find_solo_bwd({c, d}).value_or(kNoCost); }
double Profile::pair(int a, int b, int c, int d) const {
  return find_pair({a, b}, {c, d}).value_or(kNoCost);
}

json Profile::to_json() const {
  json sf = json::array(), sb = json::array(), pr = json::array();
  for (auto& [k, s] : solo_fwd_) sf.push_back({k[0], k[1], s});
  for (auto& [k, s] : solo_bwd_) sb.push_back({k[0], k[1], s});
  for (auto& [k, s] : pairs_) pr.push_back({k[0], k[1], k[2], k[3], s});
  json m = {{"model", meta.model},         {"layout", meta.layout},   {"shapes", meta.shapes},
            {"machine", meta.machine},     {"timestamp", meta.timestamp},
            {"pair", meta.pair},           {"repeats", meta.repeats}, {"warmup", meta.warmup},
            {"fwd_ops", meta.fwd_ops},     {"bwd_ops", meta.bwd_ops}, {"precision", meta.precision},
            {"timing_overhead_s", meta.timing_overhead_s}};
  return {{"format", kProfileFormat}, {"version", kVersion}, {"meta", m},
          {"solo_fwd", sf},           {"solo_bwd", sb},      {"pairs", pr}};
}

Profile Profile::from_json(const json& j, const std::string& origin) {
  DHX_CHECK(j.is_object(), PlanError, "{}: a profile must be a JSON object", origin);
  Profile p;
  try {  // json::exception: a value of a JSON type no check below expected ("format": [1])
    const std::string format = j.value("format", std::string());
    DHX_CHECK(format == kProfileFormat, PlanError, "{}: format is '{}', expected '{}'", origin,
              format, kProfileFormat);
    const int version = j.contains("version") ? int_of(j["version"], origin, "'version'") : -1;
    DHX_CHECK(version == kVersion, PlanError,
              "{}: profile version {} is not supported (this build reads version {})", origin,
              version, kVersion);
    const json& m = j.at("meta");
    p.meta.model = m.value("model", "");
    p.meta.layout = m.value("layout", "");
    p.meta.shapes = m.value("shapes", "");
    p.meta.machine = m.value("machine", "");
    p.meta.timestamp = m.value("timestamp", "");
    p.meta.pair = m.value("pair", "");
    p.meta.precision = m.value("precision", "");
    p.meta.repeats = m.contains("repeats") ? int_of(m["repeats"], origin, "meta 'repeats'") : 0;
    p.meta.warmup = m.contains("warmup") ? int_of(m["warmup"], origin, "meta 'warmup'") : 0;
    if (m.contains("timing_overhead_s")) {
      DHX_CHECK(m["timing_overhead_s"].is_number(), PlanError, "{}: meta 'timing_overhead_s' is {}, not a number",
                origin, m["timing_overhead_s"].dump());
      p.meta.timing_overhead_s = m["timing_overhead_s"].get<double>();
      DHX_CHECK(std::isfinite(p.meta.timing_overhead_s) && p.meta.timing_overhead_s >= 0, PlanError,
                "{}: meta 'timing_overhead_s' = {} (seconds: finite, >= 0)", origin, p.meta.timing_overhead_s);
    }
    p.meta.fwd_ops = m.value("fwd_ops", std::vector<std::string>{});
    p.meta.bwd_ops = m.value("bwd_ops", std::vector<std::string>{});
    for (const json& e : j.at("solo_fwd")) {
      DHX_CHECK(e.is_array() && e.size() == 3, PlanError, "{}: solo_fwd entry {} is not [a,b,s]",
                origin, e.dump());
      p.set_solo_fwd({int_of(e[0], origin, "solo_fwd a"), int_of(e[1], origin, "solo_fwd b")}, e[2].get<double>());
    }
    for (const json& e : j.at("solo_bwd")) {
      DHX_CHECK(e.is_array() && e.size() == 3, PlanError, "{}: solo_bwd entry {} is not [c,d,s]",
                origin, e.dump());
      p.set_solo_bwd({int_of(e[0], origin, "solo_bwd c"), int_of(e[1], origin, "solo_bwd d")}, e[2].get<double>());
    }
    for (const json& e : j.at("pairs")) {
      DHX_CHECK(e.is_array() && e.size() == 5, PlanError,
                "{}: pairs entry {} is not [a,b,c,d,s]", origin, e.dump());
      p.set_pair({int_of(e[0], origin, "pairs a"), int_of(e[1], origin, "pairs b")},
                 {int_of(e[2], origin, "pairs c"), int_of(e[3], origin, "pairs d")}, e[4].get<double>());
    }
  } catch (const json::exception& e) {
    throw PlanError(fmt::format("{}: malformed profile: {}", origin, e.what()));
  }
  return p;
}

void Profile::save(const std::string& path) const {
  write_file_atomic(path, to_json().dump(1) + "\n");
}

Profile Profile::load(const std::string& path) {
  json j = json::parse(read_file(path), nullptr, /*allow_exceptions=*/false);
  DHX_CHECK(!j.is_discarded(), PlanError, "{}: not valid JSON", path);
  return from_json(j, path);
}

}  // namespace dhelix
