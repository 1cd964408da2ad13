// StepSim: the step runner's order of passes over the pair simulator (StepSim.h).
#include "sim/StepSim.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "base/Error.h"
#include "model/Params.h"
#include "model/Programs.h"

namespace dhelix {

namespace {

SIPlan one_block(const std::vector<Op>* f, const std::vector<Op>* b) {
  SIPlan p;
  p.source = "alone";
  p.blocks = {{0, f ? static_cast<int>(f->size()) : 0, 0, b ? static_cast<int>(b->size()) : 0}};
  return p;
}

}  // namespace

StepSimResult simulate_step(const ModelConfig& m, const LayoutConfig& lay, const BatchSpec& batch,
                            const ClusterPreset& cluster, const StepSimOptions& opt) {
  const std::vector<std::string> errs = layout_errors(m, lay, batch);
  DHX_CHECK(errs.empty(), ConfigError, "layout cannot run: {}", fmt::join(errs, "; "));
  DHX_CHECK(lay.pp == 1, ConfigError,
            "pp={}: the step simulator runs one pipeline stage in this build (dhelix tune prices pipelines)", lay.pp);
  const bool si = opt.si == StrandInterleaving::kOn;
  DHX_CHECK(!si || opt.plan_for, InternalError, "simulate_step: Strand Interleaving needs a pair planner");
  LayoutConfig plain = lay;
  plain.sequence_parallel = lay.tp > 1;
  const ModelPrograms progs = build_programs(m, plain, {batch.micro_batch, batch.seq / lay.cp});
  const std::vector<UnitSpec> units = model_units(m, plain, 0);
  const auto groups = group_links(lay, cluster);
  const double elem = element_bytes(opt.precision);
  const DeviceRates rates{cluster.gemm_rate(opt.precision), cluster.mem_bw, elem / 4.0, {}};
  const OpTimer time = [&](const Op& o) { return op_time(o, groups, rates); };
  const PairSimOptions popt{opt.compute_slowdown};
  const int L = static_cast<int>(m.n_layers), U = L + 2;
  const int64_t M = batch.global_batch / (int64_t{lay.data_replicas()} * batch.micro_batch);
  auto prog = [&](int u) -> const LayerProgram& { return u == 0 ? progs.embed : u == U - 1 ? progs.head : progs.block; };

  StepSimResult r;
  r.micro_batches = M;
  double now = 0;
  std::vector<double> last_bwd(static_cast<size_t>(U), 0.0);  // the last micro-batch's backward, per unit
  // One pair (or a unit alone) at `now`: fwd of unit fu for micro-batch fm, bwd of unit bu for bm.
  auto run = [&](int fm, int fu, int bm, int bu) {
    const std::vector<Op>* f = fu >= 0 ? &prog(fu).fwd : nullptr;
    const std::vector<Op>* b = bu >= 0 ? &prog(bu).bwd : nullptr;
    const SIPlan plan = f && b ? opt.plan_for(prog(fu), prog(bu)) : one_block(f, b);
    const PairSimResult p = simulate_pair(f, b, plan, time, popt);
    for (const SimOp& o : p.ops) {
      const bool fw = o.strand == StrandKind::kForward;
      const Op& op = (fw ? *f : *b)[static_cast<size_t>(o.index)];
      r.events.push_back({o.lane, fmt::format("{} mb{} u{}", op.name, fw ? fm : bm, fw ? fu : bu), now + o.begin_s,
                          now + o.end_s});
    }
    for (const auto& [g, s] : p.channel_busy_s) r.channel_busy_s[g] += s;
    r.compute_s += p.compute_s;
    now += p.span_s;
    return p.span_s;
  };
  if (si) {
    for (int u = 0; u < U; ++u) run(0, u, -1, -1);
    for (int64_t i = 1; i < M; ++i)
      for (int u = 0; u < U; ++u) run(static_cast<int>(i), u, static_cast<int>(i - 1), U - 1 - u);
  } else {
    for (int64_t i = 0; i + 1 < M; ++i) {
      for (int u = 0; u < U; ++u) run(static_cast<int>(i), u, -1, -1);
      for (int u = U - 1; u >= 0; --u) run(-1, -1, static_cast<int>(i), u);
    }
    for (int u = 0; u < U; ++u) run(static_cast<int>(M - 1), u, -1, -1);
  }
  for (int u = U - 1; u >= 0; --u) last_bwd[static_cast<size_t>(u)] = run(-1, -1, static_cast<int>(M - 1), u);
  r.body_s = now;

  std::vector<int> mine(static_cast<size_t>(U));
  std::vector<double> grad_bytes, expert_bytes;
  double elems = 0;
  for (int u = 0; u < U; ++u) {
    mine[static_cast<size_t>(u)] = u;
    double all = 0, experts = 0;
    for (const ParamSpec& q : units[static_cast<size_t>(u)].params) {
      all += double(shape_numel(q.shard));
      if (lay.ep > 1 && q.role == ShardRole::kExpert) experts += double(shape_numel(q.shard));
    }
    grad_bytes.push_back((all - experts) * 4), expert_bytes.push_back(experts * 4), elems += all;
  }
  r.tail_s = gradient_tail(lay, groups, units, mine, last_bwd, grad_bytes, expert_bytes, elems, elem, opt.zero,
                           r.tail_axes);
  r.step_s = r.body_s + r.tail_s;
  r.exposed_s = r.step_s - r.compute_s;
  const double tokens = double(batch.global_batch) * double(batch.seq);
  r.tokens_per_s = tokens / r.step_s;
  r.model_flops_per_s_per_rank = m.flops_per_token(batch.seq) * tokens / r.step_s / double(lay.world());
  r.memory = memory_per_rank(m, lay, batch, opt.precision, opt.zero, opt.si);
  return r;
}

}  // namespace dhelix
