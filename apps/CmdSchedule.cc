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
#include "FlagTable.h"
#include "base/Error.h"
#include "base/Files.h"
#include "plan/ScheduleSvg.h"
#include "plan/StepSchedule.h"
#include "schedule/Pipelines.h"

namespace dhelix {

namespace {

constexpr double kIntMax = std::numeric_limits<int>::max();

const FlagTable& schedule_flags() {
  static const FlagTable t{
      "schedule",
      "usage: dhelix schedule [--pp P] [--micro-batches N] [--pipeline 1f1b|interleaved|w]\n"
      "                       [--virtual-stages V] [--si on|off] [--layers L] [--bwd-over-fwd R] [--svg FILE]\n"
      "Generates the step schedule of a P-stage pipeline over N micro-batches, checks it, prints its\n"
      "slots per rank and its bubble: on the timeline of uniform layers (a chunk's forward costs its\n"
      "transformer layers, its backward R times that, no communication time) and by formula.\n",
      {
          {"--pp", FlagType::kInt, "2", "pipeline ranks", "P", std::nullopt, kIntMax},
          {"--micro-batches", FlagType::kInt, "8", "micro-batches per step", "N", std::nullopt, kIntMax},
          {"--pipeline", FlagType::kChoice, "1f1b", "interleaved (V chunks per rank) or w (the folded W)",
           "1f1b|interleaved|w"},
          {"--virtual-stages", FlagType::kInt, "1", "chunks per rank of interleaved", "V", std::nullopt, kIntMax},
          {"--si", FlagType::kOnOff, "off", "co-execute a forward and a backward per slot (Strand Interleaving)",
           "on|off"},
          {"--layers", FlagType::kInt, "", "transformer layers (default 2 x chunks: P for 1f1b, P x V interleaved, 2P w)",
           "L", std::nullopt, kIntMax},
          {"--bwd-over-fwd", FlagType::kNumber, "2", "backward cost over forward cost (> 0)", "R", 0, 1000},
          {"--svg", FlagType::kText, "", "also draw the schedule's timeline as SVG", "FILE"},
      }};
  return t;
}

constexpr double kMaxPasses = 1e6;

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
  const FlagTable& t = schedule_flags();
  std::vector<std::string> errors;
  const std::optional<FlagValues> parsed = parse_flags_or_help(t, argc, argv, errors);
  if (!parsed) return std::nullopt;
  const FlagValues& f = *parsed;
  ScheduleRequest req;
  const int pp = static_cast<int>(f.integer("--pp")), mbs = static_cast<int>(f.integer("--micro-batches"));
  const int v = static_cast<int>(f.integer("--virtual-stages"));
  const PipelineKind kind = parse_pipeline_kind(f.text_or_default("--pipeline")).value_or(PipelineKind::k1F1B);
  const double ratio = f.number("--bwd-over-fwd");
  if (f.ok("--bwd-over-fwd") && !(ratio > 0))
    errors.push_back(fmt::format("--bwd-over-fwd expects a positive number, got '{}'", *f.text("--bwd-over-fwd")));
  else req.bwd_over_fwd = ratio;
  req.svg_path = f.text("--svg");
  // The default layer count needs the chunk count.
  const int64_t def_layers = std::clamp<int64_t>(2 * chunks_of(kind, pp, v), 2, std::numeric_limits<int>::max());
  const int layers = static_cast<int>(f.given("--layers") ? f.integer("--layers") : def_layers);

  // The spec's own rules, once every value it reads parsed (an unknown flag does not hide them).
  std::string hint;
  bool values_ok = true;
  for (const char* flag : {"--pp", "--micro-batches", "--virtual-stages", "--pipeline", "--layers", "--si"})
    values_ok = values_ok && f.ok(flag);
  if (values_ok) {
    PipelineSpec& spec = req.spec;
    spec.kind = kind;
    spec.pp = pp;
    spec.micro_batches = mbs;
    spec.virtual_stages = v;
    spec.n_layers = layers;
    spec.co_execute = f.on("--si") ? CoExecute::kOn : CoExecute::kOff;
    // A bound on the work (about 1 s and 40 MB of SVG per 100k passes), not a rule of schedules:
    // past it the spec's own errors are not looked for.
    const double passes = 2.0 * static_cast<double>(chunks_of(kind, pp, v)) * mbs;
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
  throw_flag_errors(t, errors, hint);
  return req;
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
