// `dhelix schedule`: generates one pipeline step schedule (1F1B, interleaved, W; co-execution on or
// off), checks it, prints its slot table and its bubble on a uniform-layer timeline next to the
// closed form, and draws it as SVG. No hardware, no config file, no model: the flags are the spec.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "Commands.h"
#include "base/Error.h"
#include "base/Files.h"
#include "plan/ScheduleSvg.h"
#include "plan/StepSchedule.h"
#include "schedule/Pipelines.h"

namespace dhelix {

namespace {

constexpr const char* kScheduleUsage =
    "usage: dhelix schedule [--pp P] [--micro-batches N] [--pipeline 1f1b|interleaved|w]\n"
    "                       [--virtual-stages V] [--si on|off] [--layers L] [--bwd-over-fwd R] [--svg FILE]\n"
    "Generates the step schedule of a P-stage pipeline over N micro-batches, checks it, prints its\n"
    "slots per rank and its bubble: on the timeline of uniform layers (a chunk's forward costs its\n"
    "transformer layers, its backward R times that, no communication time) and by formula.\n"
    "  --pp P              pipeline ranks (default 2)\n"
    "  --micro-batches N   micro-batches per step (default 8)\n"
    "  --pipeline K        1f1b (default), interleaved (V chunks per rank) or w (the folded W)\n"
    "  --virtual-stages V  chunks per rank of interleaved (default 1)\n"
    "  --si on|off         co-execute a forward and a backward per slot (Strand Interleaving; default off)\n"
    "  --layers L          transformer layers (default 2 x chunks: P for 1f1b, P x V interleaved, 2P w)\n"
    "  --bwd-over-fwd R    backward cost over forward cost (default 2)\n"
    "  --svg FILE          also draw the schedule's timeline as SVG\n";

constexpr double kMaxPasses = 1e6;

// The words after the verb as flag -> value.
struct ScheduleArgs {
  std::map<std::string, std::string> values;
  bool help = false;
};

const std::vector<std::string> kFlags = {"--pp", "--micro-batches", "--pipeline", "--virtual-stages",
                                         "--si", "--layers",        "--bwd-over-fwd", "--svg"};

// Every unknown flag or missing value is added to `errors` rather than thrown, so one run names
// every bad word.
ScheduleArgs split_words(int argc, char** argv, std::vector<std::string>& errors) {
  ScheduleArgs a;
  for (int i = 1; i < argc; ++i) {
    std::string w = argv[i], value;
    if (w == "--help" || w == "-h") {
      a.help = true;
      continue;
    }
    bool has_value = false;
    if (size_t eq = w.find('='); w.rfind("--", 0) == 0 && eq != std::string::npos) {
      value = w.substr(eq + 1), w = w.substr(0, eq), has_value = true;
    }
    if (std::find(kFlags.begin(), kFlags.end(), w) == kFlags.end()) {
      const bool flag = w.rfind("--", 0) == 0;
      errors.push_back(flag ? fmt::format("unknown flag '{}'", w) : fmt::format("unexpected argument '{}'", w));
      // An unknown flag's value goes with it, so it is not reported again as a stray word.
      if (flag && !has_value && i + 1 < argc && std::string(argv[i + 1]).rfind("--", 0) != 0) ++i;
      continue;
    }
    if (!has_value) {
      if (i + 1 >= argc) {
        errors.push_back(fmt::format("{} needs a value", w));
        continue;
      }
      value = argv[++i];
    }
    if (a.values.count(w)) errors.push_back(fmt::format("{} is given twice ('{}' and '{}')", w, a.values[w], value));
    a.values[w] = value;
  }
  return a;
}

// The flag's integer, or `def` when absent; a non-integer is added to `errors` (nullopt).
std::optional<int> int_flag(const ScheduleArgs& a, const std::string& flag, int def, std::vector<std::string>& errors) {
  auto it = a.values.find(flag);
  if (it == a.values.end()) return def;
  try {
    size_t used = 0;
    const int x = std::stoi(it->second, &used);
    if (used == it->second.size()) return x;
  } catch (const std::exception&) {
  }
  errors.push_back(fmt::format("{} expects an integer, got '{}'", flag, it->second));
  return std::nullopt;
}

// In 64 bits: the bound on passes below must see a count past int's range.
int64_t chunks_of(PipelineKind k, int pp, int v) {
  return k == PipelineKind::kW ? 2 * int64_t{pp} : k == PipelineKind::kInterleaved ? int64_t{pp} * v : pp;
}

struct ScheduleRequest {
  PipelineSpec spec;
  double bwd_over_fwd = 2.0;
  std::optional<std::string> svg_path;
};

// The request of the words after the verb, or nullopt after printing --help. Throws ConfigError
// listing every bad word and, once the values it reads parsed, every error of pipeline_spec_errors.
std::optional<ScheduleRequest> parse_request(int argc, char** argv) {
  std::vector<std::string> errors;
  const ScheduleArgs args = split_words(argc, argv, errors);
  if (args.help) {
    fmt::print("{}", kScheduleUsage);
    return std::nullopt;
  }
  auto value = [&](const std::string& flag, const char* def) {
    auto it = args.values.find(flag);
    return it == args.values.end() ? std::string(def) : it->second;
  };
  ScheduleRequest req;
  const std::optional<int> pp = int_flag(args, "--pp", 2, errors);
  const std::optional<int> mbs = int_flag(args, "--micro-batches", 8, errors);
  const std::optional<int> v = int_flag(args, "--virtual-stages", 1, errors);
  const std::string kind_word = value("--pipeline", "1f1b");
  const std::optional<PipelineKind> kind = parse_pipeline_kind(kind_word);
  if (!kind) errors.push_back(fmt::format("--pipeline '{}' is not one of 1f1b, interleaved, w", kind_word));
  const std::string si = value("--si", "off");
  const bool si_ok = si == "on" || si == "off";
  if (!si_ok) errors.push_back(fmt::format("--si '{}' must be on or off", si));
  if (auto it = args.values.find("--bwd-over-fwd"); it != args.values.end()) {
    double r = NAN;
    try {
      size_t used = 0;
      r = std::stod(it->second, &used);
      if (used != it->second.size()) r = NAN;
    } catch (const std::exception&) {
    }
    if (std::isfinite(r) && r > 0) req.bwd_over_fwd = r;
    else errors.push_back(fmt::format("--bwd-over-fwd expects a positive number, got '{}'", it->second));
  }
  if (auto it = args.values.find("--svg"); it != args.values.end()) {
    if (it->second.empty()) errors.push_back("--svg needs a file name");
    req.svg_path = it->second;
  }
  // The default layer count needs the chunk count, so only a well-formed pp, v and kind give one.
  std::optional<int> layers;
  if (pp && v && kind) {
    const int64_t def = std::clamp<int64_t>(2 * chunks_of(*kind, *pp, *v), 2, std::numeric_limits<int>::max());
    layers = int_flag(args, "--layers", static_cast<int>(def), errors);
  }
  else if (args.values.count("--layers")) layers = int_flag(args, "--layers", 0, errors);

  // The spec's own rules, once every value it reads parsed (an unknown flag does not hide them).
  std::string hint;
  if (pp && mbs && v && kind && layers && si_ok) {
    PipelineSpec& spec = req.spec;
    spec.kind = *kind;
    spec.pp = *pp;
    spec.micro_batches = *mbs;
    spec.virtual_stages = *v;
    spec.n_layers = *layers;
    spec.co_execute = si == "on" ? CoExecute::kOn : CoExecute::kOff;
    // A bound on the work (about 1 s and 40 MB of SVG per 100k passes), not a rule of schedules:
    // past it the spec's own errors are not looked for.
    const double passes = 2.0 * static_cast<double>(chunks_of(*kind, *pp, *v)) * *mbs;
    const std::vector<std::string> spec_errors =
        passes > kMaxPasses ? std::vector<std::string>{} : pipeline_spec_errors(spec);
    if (passes > kMaxPasses)
      errors.push_back(fmt::format("the schedule would hold {:.0f} passes (2 x chunks x micro-batches); dhelix "
                                   "schedule draws at most {:.0f}", passes, kMaxPasses));
    errors.insert(errors.end(), spec_errors.begin(), spec_errors.end());
    if (!spec_errors.empty())
      hint = "\n(--pp is parallel.pp, --micro-batches training.micro_batches, --layers model.n_layers, "
             "--virtual-stages schedule.virtual_stages, --pipeline schedule.pipeline)";
  }
  if (errors.empty()) return req;
  std::string msg = fmt::format("{} error{}:", errors.size(), errors.size() == 1 ? "" : "s");
  for (const std::string& e : errors) msg += "\n  - " + e;
  throw ConfigError(msg + hint + "\nrun `dhelix schedule --help` for the flags");
}

}  // namespace

int cmd_schedule(int argc, char** argv) {
  const std::optional<ScheduleRequest> req = parse_request(argc, argv);
  if (!req) return 0;
  const PipelineSpec& spec = req->spec;
  const StepSchedule sch = make_schedule(spec);
  try {
    check_schedule(sch);
  } catch (const PlanError& e) {  // the generator's output breaks the checker: a dhelix bug, not bad input
    throw InternalError(fmt::format("the generated schedule is illegal: {}", e.what()));
  }
  const double ratio = req->bwd_over_fwd;
  const PassCost cost = uniform_layer_cost(sch.num_units, ratio);
  const ScheduleTimeline tl = simulate_timeline(sch, cost);
  // Rendered before anything is written: a failure leaves no file behind.
  const std::string svg = req->svg_path ? render_schedule_svg(sch, cost) : std::string();
  fmt::print("{}", render_schedule(sch));
  std::string idle;
  for (int r = 0; r < sch.pp; ++r) idle += fmt::format("{}r{} {:.1f}%", r ? ", " : "", r, 100 * tl.bubble(r));
  fmt::print("bubble (most idle rank): timeline {:.2f}%, formula {:.2f}% (uniform layers, backward = {:g} x forward, "
             "no communication time)\nmakespan {:g} layer-forwards; idle per rank: {}\n",
             100 * tl.max_bubble(), 100 * bubble_formula(spec, ratio), ratio, tl.makespan, idle);
  if (req->svg_path) {
    write_file_atomic(*req->svg_path, svg);
    fmt::print("wrote {}\n", *req->svg_path);
  }
  return 0;
}

}  // namespace dhelix
