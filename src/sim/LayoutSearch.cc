// Layout enumeration and ranking for `dhelix tune`.
#include "sim/LayoutSearch.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>

#include "base/Error.h"
#include "base/Signals.h"

namespace dhelix {

namespace {

std::vector<int> divisors(int n) {
  std::vector<int> d;
  for (int i = 1; i <= n; ++i)
    if (n % i == 0) d.push_back(i);
  return d;
}

}  // namespace

std::vector<LayoutConfig> enumerate_layouts(int n) {
  DHX_CHECK(n >= 1, ConfigError, "rank count {} must be >= 1", n);
  std::vector<LayoutConfig> out;
  for (int tp : divisors(n))
    for (int pp : divisors(n / tp)) {
      LayoutConfig l;
      l.tp = tp, l.pp = pp, l.dp = n / tp / pp;
      l.sequence_parallel = tp > 1;
      out.push_back(l);
    }
  for (int x : divisors(n))
    for (int y : divisors(n / x))
      for (int z : divisors(n / x / y))
        for (int pp : divisors(n / x / y / z)) {
          if (x * y * z == 1) continue;  // pure data parallel: the Megatron tp = pp = 1 entry
          LayoutConfig l;
          l.tp_x = x, l.tp_y = y, l.tp_z = z, l.pp = pp, l.dp = n / x / y / z / pp;
          l.sequence_parallel = false;
          out.push_back(l);
        }
  return out;
}

std::string layout_label(const LayoutConfig& l) {
  if (l.is_3d())  // pp, cp and ep named only when they are not 1 (the plain grid keeps its old label)
    return fmt::format("x={} y={} z={}{}{} dp={}{}", l.tp_x, l.tp_y, l.tp_z, l.pp > 1 ? fmt::format(" pp={}", l.pp) : "",
                       l.cp > 1 ? fmt::format(" cp={}", l.cp) : "", l.dp, l.ep > 1 ? fmt::format(" ep={}", l.ep) : "");
  if (l.ep > 1) return fmt::format("tp={} pp={} dp={} ep={}", l.tp, l.pp, l.dp, l.ep);
  if (l.cp > 1) return fmt::format("tp={} pp={} cp={} dp={}", l.tp, l.pp, l.cp, l.dp);
  return fmt::format("tp={} pp={} dp={}", l.tp, l.pp, l.dp);
}

std::string schedule_label(PipelineKind kind, int virtual_stages) {
  if (kind == PipelineKind::kInterleaved) return fmt::format("interleaved v={}", virtual_stages);
  return pipeline_kind_name(kind);
}

std::string row_label(const LayoutConfig& lay, PipelineKind kind, int virtual_stages) {
  if (lay.pp == 1 || kind == PipelineKind::k1F1B) return layout_label(lay);
  return layout_label(lay) + " " + schedule_label(kind, virtual_stages);
}

namespace {

// One legal layout under o's schedule: its least recompute that fits (recompute_auto), its kept
// layers (keep_gathered), ranked or excluded with the reason.
void rank_one(const ModelConfig& m, const LayoutConfig& lay, const BatchSpec& batch, const ClusterPreset& cluster,
            const PredictOptions& opt, TuneResult& r) {
  LayoutConfig l = lay;
  l.fuse_epilogues = opt.fuse_epilogues;
  l.recompute = opt.recompute_auto ? Recompute::kNone : opt.recompute;
  StepPrediction p = predict(m, l, batch, cluster, opt);
  // The 3D closed form prices no schedule: its one row is the 1F1B one.
  if (p.pricer == PricerKind::kClosedForm3D && opt.pipeline != PipelineKind::k1F1B && l.pp > 1) return;
  for (Recompute more : {Recompute::kSelective, Recompute::kFull}) {  // auto: recompute what it takes to fit
    if (!opt.recompute_auto || p.fits) break;
    l.recompute = more;
    p = predict(m, l, batch, cluster, opt);
  }
  if (l.is_3d() && l.tp_z > 1 && (opt.keep_gathered > 0 || opt.keep_gathered_auto)) {
    // Kept blocks (AxoNN's weight caching): a fixed count, or the most layers of a stage that fit
    // (memory grows with each kept layer, so the largest that fits is found by bisection).
    // (per chunk of the schedule priced: a stage holds 2 under the W, v interleaved)
    const int layers =
        static_cast<int>(m.n_layers / int64_t(pipeline_chunks(pipeline_spec_of(m, l, batch, opt)).size()));
    if (!opt.keep_gathered_auto) {
      l.keep_gathered = std::min(opt.keep_gathered, layers);
      p = predict(m, l, batch, cluster, opt);
    } else if (p.fits) {
      int lo = 0, hi = layers;  // lo fits
      StepPrediction best = p;
      while (lo < hi) {
        LayoutConfig k = l;
        k.keep_gathered = (lo + hi + 1) / 2;
        StepPrediction q = predict(m, k, batch, cluster, opt);
        if (q.fits) lo = k.keep_gathered, best = std::move(q);
        else hi = k.keep_gathered - 1;
      }
      l.keep_gathered = lo;
      p = std::move(best);
    }
  }
  if (!p.fits && l.keep_gathered > 0)
    p.reason += fmt::format(" with the first {} layer(s) of each chunk keeping their gathered weight blocks "
                            "(--keep-gathered; auto keeps the most that fit)",
                            l.keep_gathered);
  if (!p.fits) r.excluded.push_back({l, p.reason, p.pipeline, p.virtual_stages});
  else r.ranked.push_back(std::move(p));
}

}  // namespace

TuneResult rank_layouts(const ModelConfig& m, int n, const BatchSpec& batch, const ClusterPreset& cluster,
                        const PredictOptions& opt) {
  TuneResult r;
  std::vector<LayoutConfig> layouts = enumerate_layouts(n);
  const size_t enumerated = layouts.size();
  for (size_t i = 0; i < enumerated; ++i) {  // Megatron's layouts and the 3D grids alike
    for (int k : divisors(layouts[i].dp)) {
      if (k == 1) continue;
      LayoutConfig l = layouts[i];
      if (m.is_moe()) {
        l.ep = k;  // expert parallelism carved out of the layout's dp ranks
      } else {
        l.cp = k, l.dp /= k;  // context parallelism: cp of the dp ranks cut each sequence instead
      }
      layouts.push_back(l);
    }
  }
  for (const LayoutConfig& lay : layouts) {
    if (stop_signal() != 0)
      stop_point(fmt::format("tune (ranking layouts: {} of {} priced; nothing written)", r.ranked.size() + r.excluded.size(),
                             layouts.size()));
    const std::vector<std::string> errs = layout_errors(m, lay, batch);
    if (!errs.empty()) {
      r.excluded.push_back({lay, fmt::format("{}", fmt::join(errs, "; "))});
      continue;
    }
    // A pipeline under each schedule asked for (one row each), else the one of opt.pipeline.
    std::vector<PipelineKind> kinds = {opt.pipeline};
    if (lay.pp > 1 && !opt.pipelines.empty()) kinds = opt.pipelines;
    for (PipelineKind kind : kinds) {
      PredictOptions o = opt;
      o.pipeline = kind;
      const PipelineSpec spec = pipeline_spec_of(m, lay, batch, o);
      if (const std::vector<std::string> perrs = pipeline_spec_errors(spec); !perrs.empty()) {
        r.excluded.push_back({lay, fmt::format("{}", fmt::join(perrs, "; ")), kind, spec.virtual_stages});
        continue;
      }
      rank_one(m, lay, batch, cluster, o, r);
    }
  }
  std::stable_sort(r.ranked.begin(), r.ranked.end(),
                   [](const StepPrediction& a, const StepPrediction& b) { return a.step_s < b.step_s; });
  return r;
}

}  // namespace dhelix
