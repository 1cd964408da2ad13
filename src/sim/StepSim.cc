// StepSim: the step runner's order of passes over the pair simulator (StepSim.h).
#include "sim/StepSim.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <limits>
#include <map>
#include <optional>

#include "base/Error.h"
#include "model/Params.h"
#include "sharding/ModelPrograms.h"
#include "sharding/ParamSharding.h"
#include "sim/StepMemory.h"

namespace dhelix {

namespace {

// The ops whose work is the rows routed to this rank's experts (ExpertDispatch.h): the grouped
// expert GEMMs, the regrouping of the received rows, and the rows' all-to-alls over ep (the token
// counts' exchange is not).
bool rides_expert_load(const Op& o) {
  if (o.is_collective()) return o.group == "ep" && o.coll == CollOp::kAllToAll && o.inputs.size() == 3;
  return o.code.starts_with("expert_linear") || o.code == "moe_ep_sort" || o.code == "moe_ep_unsort";
}

}  // namespace

StepSimResult simulate_step(const ModelConfig& m, const LayoutConfig& lay, const BatchSpec& batch,
                            const ClusterPreset& cluster, const StepSimOptions& opt) {
  const std::vector<std::string> errs = layout_errors(m, lay, batch);
  DHX_CHECK(errs.empty(), ConfigError, "layout cannot run: {}", fmt::join(errs, "; "));
  DHX_CHECK(opt.expert_imbalance == 1.0 || (m.is_moe() && lay.ep > 1 && opt.expert_imbalance >= 1 &&
                                             opt.expert_imbalance <= lay.ep),
            ConfigError,
            "an expert imbalance of {} needs expert parallelism (moe family, ep > 1; here ep={}) and lies in 1..ep (a "
            "rank receives at most every routed row)",
            opt.expert_imbalance, lay.ep);
  DHX_CHECK(lay.pp == 1 || opt.schedule, ConfigError,
            "pp={}: the step simulator needs the step schedule of the pipeline (dhelix simulate builds it)", lay.pp);
  LayoutConfig plain = lay;
  plain.sequence_parallel = lay.tp > 1;
  ModelPrograms progs = build_programs(m, plain, {batch.micro_batch, batch.seq / lay.cp});
  const std::vector<UnitSpec> units = model_units(m, plain, 0);
  // recompute_layers, keep_gathered: which layers run which block (the schedule's chunks, or the one
  // chunk of a single stage).
  select_block_variants(progs, plain,
                          opt.schedule ? opt.schedule->chunks
                                       : std::vector<Chunk>{Chunk{0, 0, static_cast<int>(m.n_layers) + 2}});
  const auto groups = group_links(lay, cluster);
  const double elem = element_bytes(opt.precision);
  const DeviceRates rates = device_rates(cluster, opt.precision, opt.gemm_timer);
  const OpTimer time = [&](const Op& o) {
    const double t = opt.op_timer ? opt.op_timer(o) : -1;
    return t >= 0 ? t : op_time(o, groups, rates);
  };
  const PairSimOptions popt{opt.compute_slowdown, opt.comm_slowdown};
  const int L = static_cast<int>(m.n_layers), U = L + 2;
  const int64_t M = batch.global_batch / (int64_t{lay.data_replicas()} * batch.micro_batch);
  auto kind = [&](int u) { return u == 0 ? "embed" : u == U - 1 ? "head" : "block"; };
  auto prog = [&](int u) -> const LayerProgram& { return progs.program(u, kind(u)); };
  // The backward of a micro-batch before the last under accumulate_z (3D TP): its weight-gradient
  // reduce-scatters become block-sum adds, as the executor runs them (folding_variant).
  auto folded = [](LayerProgram p) {
    p.bwd = folding_variant(p.bwd);
    return p;
  };
  ModelPrograms early = progs;
  for (LayerProgram* p : early.all()) *p = folded(*p);
  auto bwd_prog = [&](int u, int mb) -> const LayerProgram& {
    if (mb == M - 1) return prog(u);
    return early.program(u, kind(u));
  };

  // Per rank: events relative to the slot being priced, engine and channel time.
  struct RankStats {
    double compute = 0;
    std::map<std::string, double> busy;
    std::map<std::string, CollectiveUse> collectives;
    std::vector<StepSimEvent> events;
  };
  std::vector<RankStats> ranks(static_cast<size_t>(lay.pp));
  int slow_stage = opt.slow_stage;  // the straggler's stage in the replica class being simulated
  // One pair (or a unit alone): fwd of unit fu for micro-batch fm beside bwd of unit bu for bm,
  // at `at` on rank `rk`. Returns its span.
  auto run = [&](int rk, double at, int fm, int fu, int bm, int bu) {
    const std::vector<Op>* f = fu >= 0 ? &prog(fu).fwd : nullptr;
    const std::vector<Op>* b = bu >= 0 ? &bwd_prog(bu, bm).bwd : nullptr;
    DHX_CHECK(!(f && b) || opt.plan_for, InternalError, "simulate_step: a co-executed slot needs a pair planner");
    const SIPlan plan = f && b ? opt.plan_for(prog(fu), bwd_prog(bu, bm)) : one_block_plan(f, b);
    const bool slow = rk == slow_stage;
    // A micro-batch after the step's first binds the kept weight blocks the first gathered
    // (LayoutConfig::keep_gathered; the executor's kept_blocks_): those gathers take no time.
    const bool cached = M > 1 && fm > 0;
    const OpTimer stage_time = [&](const Op& o) {
      if (cached && o.is_collective() && o.flag("kept")) return 0.0;
      double t = time(o);
      if (lay.ep > 1 && opt.expert_imbalance != 1.0 && rides_expert_load(o)) t *= opt.expert_imbalance;
      return slow && !o.is_collective() ? t * opt.slow_factor : t;
    };
    const PairSimResult p = simulate_pair(f, b, plan, stage_time, popt);
    RankStats& st = ranks[static_cast<size_t>(rk)];
    for (const SimOp& o : p.ops) {
      const bool fw = o.strand == StrandKind::kForward;
      const Op& op = (fw ? *f : *b)[static_cast<size_t>(o.index)];
      st.events.push_back({o.lane, fmt::format("{} mb{} u{}", op.name, fw ? fm : bm, fw ? fu : bu), at + o.begin_s,
                           at + o.end_s, fw ? fm : bm, fw ? fu : bu, o.strand});
      if (op.is_collective() && !(cached && op.flag("kept"))) {  // a kept block bound, not gathered
        CollectiveUse& c = st.collectives[op.name];
        c.group = o.lane, c.count += 1, c.busy_s += o.end_s - o.begin_s;
      }
    }
    for (const auto& [g, t] : p.channel_busy_s) st.busy[g] += t;
    for (const auto& [name, t] : p.exposed_s) st.collectives[name].exposed_s += t;
    st.compute += p.compute_s;
    return p.span_s;
  };
  // A slot's passes over a chunk's units: forward units in order, backward units in reverse;
  // co-executed, forward unit i beside backward unit i of that reverse order, the rest alone.
  auto run_slot = [&](int rk, double at, int fm, std::vector<int> fu, int bm, std::vector<int> bu) {
    std::reverse(bu.begin(), bu.end());
    const size_t n = std::max(fu.size(), bu.size());
    double t = 0;
    for (size_t i = 0; i < n; ++i) {
      const int f = i < fu.size() ? fu[i] : -1, b = i < bu.size() ? bu[i] : -1;
      t += run(rk, at + t, f >= 0 ? fm : -1, f, b >= 0 ? bm : -1, b);
    }
    return t;
  };
  auto range = [](int lo, int hi) {
    std::vector<int> v;
    for (int u = lo; u < hi; ++u) v.push_back(u);
    return v;
  };

  StepSimResult r;
  r.micro_batches = M;
  std::vector<double> rank_end(static_cast<size_t>(lay.pp), 0.0), rank_busy(static_cast<size_t>(lay.pp), 0.0);
  // Every micro-batch's passes on every stage of one replica class (`slow_stage` says whether it
  // holds the straggler): fills ranks, rank_end and rank_busy.
  auto simulate_passes = [&] {
    ranks.assign(static_cast<size_t>(lay.pp), RankStats{});
    std::fill(rank_end.begin(), rank_end.end(), 0.0), std::fill(rank_busy.begin(), rank_busy.end(), 0.0);
    if (opt.schedule) {
      const StepSchedule& sch = *opt.schedule;
      DHX_CHECK(sch.pp == lay.pp && sch.micro_batches == M && sch.num_units == U, ConfigError,
                "the step schedule (pp={} micro-batches={} units={}) is not this run's (pp={} micro-batches={} units={})",
                sch.pp, sch.micro_batches, sch.num_units, lay.pp, M, U);
      std::map<std::pair<int, int>, std::vector<StepSimEvent>> slot_events;  // relative to the slot's start
      const SlotCost cost = [&](int rk, int k, const Slot& sl) {
        RankStats& st = ranks[static_cast<size_t>(rk)];
        const size_t before = st.events.size();
        const Chunk* fc = sl.fwd.active() ? &sch.chunks[static_cast<size_t>(sl.fwd.chunk)] : nullptr;
        const Chunk* bc = sl.bwd.active() ? &sch.chunks[static_cast<size_t>(sl.bwd.chunk)] : nullptr;
        const double d = run_slot(rk, 0, sl.fwd.mb, fc ? range(fc->unit_begin, fc->unit_end) : std::vector<int>{},
                                  sl.bwd.mb, bc ? range(bc->unit_begin, bc->unit_end) : std::vector<int>{});
        slot_events[{rk, k}].assign(st.events.begin() + static_cast<std::ptrdiff_t>(before), st.events.end());
        st.events.resize(before);
        return d;
      };
      const GroupLink& pp_link = groups.at("pp");
      // The residual stream between stages: [N / tp, C] (Megatron's sequence shard) or [N, C / Gx] (3D).
      const double p2p_bytes = pipeline_message_bytes(m, lay, batch, elem);
      Op p2p;  // one activation or gradient message, for a stand-in timer
      p2p.name = p2p.code = "pp.p2p", p2p.kind = OpKind::kCollective, p2p.coll = CollOp::kSendRecv, p2p.group = "pp";
      p2p.cost.comm_bytes = p2p_bytes;
      const double asked = lay.pp > 1 && opt.op_timer ? opt.op_timer(p2p) : -1;
      const double p2p_s = lay.pp == 1  ? 0
                           : asked >= 0 ? asked
                                        : CostModel::collective_time(CollOp::kSendRecv, p2p_bytes, 2, pp_link.link);
      const ScheduleTimeline tl = simulate_slots(sch, cost, [&](const Transfer&) { return p2p_s; });
      for (int rk = 0; rk < lay.pp; ++rk) {
        const auto& slots = tl.ranks[static_cast<size_t>(rk)];
        for (size_t k = 0; k < slots.size(); ++k)
          for (StepSimEvent e : slot_events[{rk, static_cast<int>(k)}]) {
            e.begin_s += slots[k].start, e.end_s += slots[k].start;
            if (lay.pp > 1) e.lane = fmt::format("stage {} {}", rk, e.lane);
            ranks[static_cast<size_t>(rk)].events.push_back(e);
          }
        rank_end[static_cast<size_t>(rk)] = slots.empty() ? 0 : slots.back().end;
        rank_busy[static_cast<size_t>(rk)] = tl.busy[static_cast<size_t>(rk)];
      }
    } else {
      const bool si = opt.si == StrandInterleaving::kOn;
      double now = 0;
      const std::vector<int> all = range(0, U);
      if (si) {
        now += run_slot(0, now, 0, all, -1, {});
        for (int64_t i = 1; i < M; ++i) now += run_slot(0, now, static_cast<int>(i), all, static_cast<int>(i - 1), all);
      } else {
        for (int64_t i = 0; i + 1 < M; ++i) {
          now += run_slot(0, now, static_cast<int>(i), all, -1, {});
          now += run_slot(0, now, -1, {}, static_cast<int>(i), all);
        }
        now += run_slot(0, now, static_cast<int>(M - 1), all, -1, {});
      }
      now += run_slot(0, now, -1, {}, static_cast<int>(M - 1), all);
      rank_end[0] = rank_busy[0] = now;
    }
  };
  // The data replicas (issue 38's rank classes). Every rank of a replica's stage runs the same
  // programs (its tp / cp / grid peers, experts balanced or all priced as the busiest), so one rank
  // per stage stands for the stage; replicas differ only by a straggler. The replica holding it
  // (with, under ep, the replicas of its ep group, whose all-to-alls wait for it) is simulated with
  // it, the other replicas without; each unit's gradient buckets complete when the last replica's
  // arrive (the tail below starts from the latest), and the others' wait is reported.
  // Per stage of the class just simulated: when the last micro-batch's backward began, and when it
  // ended in each unit.
  struct LastBackward {
    double start = std::numeric_limits<double>::infinity();
    std::map<int, double> end;
  };
  auto last_backward = [&] {
    std::vector<LastBackward> out(static_cast<size_t>(lay.pp));
    for (int rk = 0; rk < lay.pp; ++rk)
      for (const StepSimEvent& e : ranks[static_cast<size_t>(rk)].events)
        if (e.strand == StrandKind::kBackward && e.mb == M - 1) {
          LastBackward& lb = out[size_t(rk)];
          lb.start = std::min(lb.start, e.begin_s);
          double& end = lb.end.try_emplace(e.unit, e.end_s).first->second;
          end = std::max(end, e.end_s);
        }
    return out;
  };
  const int slow_replicas = opt.slow_stage >= 0 ? std::min(lay.dp, std::max(1, lay.ep)) : lay.dp;
  std::vector<LastBackward> others_last;  // the replicas without the straggler, if any
  std::vector<double> others_rank_end;
  if (opt.slow_stage >= 0 && slow_replicas < lay.dp) {
    slow_stage = -1;
    simulate_passes();
    others_last = last_backward();
    others_rank_end = rank_end;
  }
  slow_stage = opt.slow_stage;
  simulate_passes();
  const std::vector<LastBackward> last = last_backward();

  // Each rank's gradient tail after its last slot: a unit's buckets go as its last backward (of
  // micro-batch M-1) ends in the simulated passes; the step ends with the latest rank.
  int critical = 0;
  double step = -1;
  r.stages.resize(static_cast<size_t>(lay.pp));
  for (int rk = 0; rk < lay.pp; ++rk) {
    std::vector<int> mine;
    if (opt.schedule) {
      for (int c : opt.schedule->chunks_of(rk))
        for (int u : range(opt.schedule->chunks[static_cast<size_t>(c)].unit_begin,
                           opt.schedule->chunks[static_cast<size_t>(c)].unit_end))
          mine.push_back(u);
      std::sort(mine.begin(), mine.end());
    } else {
      mine = range(0, U);
    }
    RankStats& st = ranks[static_cast<size_t>(rk)];
    GradReadiness ready;
    ready.end_s = rank_end[static_cast<size_t>(rk)];
    if (!others_rank_end.empty()) ready.end_s = std::max(ready.end_s, others_rank_end[size_t(rk)]);
    const LastBackward& lb = last[size_t(rk)];
    const double last_bwd_start = std::min(ready.end_s, lb.start);
    std::vector<double> grad_bytes, expert_bytes;
    double elems = 0;
    for (int u : mine) {
      const auto done = lb.end.find(u);
      DHX_ASSERT(done != lb.end.end(), "simulate_step: stage {} never ran the last backward of unit {}", rk, u);
      double at = done->second;  // a bucket's reduction completes when the last replica's arrives
      if (!others_last.empty()) at = std::max(at, others_last[size_t(rk)].end.at(u));
      ready.ready_s.push_back(at);
      double all = 0, experts = 0;
      for (const ParamSpec& q : units[static_cast<size_t>(u)].params) {
        all += double(shape_numel(q.shard));
        if (lay.ep > 1 && q.role == ShardRole::kExpert) experts += double(shape_numel(q.shard));
      }
      grad_bytes.push_back((all - experts) * opt.grad_wire_bytes), expert_bytes.push_back(experts * opt.grad_wire_bytes),
          elems += all;
    }
    // A tied head on another stage than the embedding holds the token table's copy, which its
    // optimizer step updates too (as the step model and the memory rule count it).
    const bool has_embed = std::find(mine.begin(), mine.end(), 0) != mine.end();
    const bool has_head = std::find(mine.begin(), mine.end(), U - 1) != mine.end();
    if (has_head && !has_embed && m.tie_embeddings) elems += sim_detail::tied_copy_elems(units[0]);
    std::optional<SparseEmbedTail> sparse;
    if (sparse_embedding_applies(m, lay, batch, opt.sparse_embed))
      sparse = sparse_embed_tail(m, lay, batch, units, mine, ready, last_bwd_start, grad_bytes, opt.grad_wire_bytes);
    std::map<std::string, AxisCost> axes;
    std::vector<ChannelSpan> spans;
    StepSimStage& sg = r.stages[static_cast<size_t>(rk)];
    sg.tail_s = gradient_tail(lay, groups, units, mine, ready, grad_bytes, expert_bytes, elems, elem, opt.zero, axes,
                              &spans, sparse ? &*sparse : nullptr);
    for (const ChannelSpan& c : spans) {
      st.events.push_back({lay.pp > 1 ? fmt::format("stage {} {}", rk, c.group) : c.group, c.name, c.begin_s, c.end_s});
      CollectiveUse& u = st.collectives[c.name];
      u.group = c.group, u.count += 1, u.busy_s += c.end_s - c.begin_s;
    }
    // The optimizer step on the compute thread after the tail (optimizer_time, StepModel.h). The
    // executor runs it before ZeRO-1's all-gather, which the tail holds; both are exposed, so the
    // step's length is the same, only the trace's order differs under ZeRO-1.
    double optimizer_s = -1;
    if (opt.op_timer) {  // a stand-in timer may price it, as the compute op "optimizer.step"
      Op step_op;
      step_op.name = step_op.code = "optimizer.step";
      optimizer_s = opt.op_timer(step_op);
    }
    if (optimizer_s < 0) optimizer_s = optimizer_time(elems, lay.dp, opt.zero, opt.precision, cluster);
    if (rk == opt.slow_stage) optimizer_s *= opt.slow_factor;
    const double opt_begin = ready.end_s + sg.tail_s;
    st.events.push_back({lay.pp > 1 ? fmt::format("stage {} compute", rk) : "compute", "optimizer step", opt_begin,
                         opt_begin + optimizer_s});
    sg.tail_s += optimizer_s, sg.optimizer_s = optimizer_s;
    sg.end_s = rank_end[static_cast<size_t>(rk)];
    sg.compute_s = st.compute + optimizer_s;
    sg.channel_busy_s = st.busy;
    sg.collectives = st.collectives;
    sg.bubble_s = sg.end_s - rank_busy[static_cast<size_t>(rk)];  // waiting for its neighbours' messages
    sg.exposed_s = std::max(0.0, sg.end_s + sg.tail_s - sg.compute_s - sg.bubble_s);  // rounding aside
    if (rk == 0 || sg.end_s + sg.tail_s > step) step = sg.end_s + sg.tail_s, critical = rk, r.tail_axes = axes;
  }
  const StepSimStage& c = r.stages[static_cast<size_t>(critical)];
  r.critical_stage = critical;
  r.body_s = c.end_s;
  r.tail_s = c.tail_s;
  r.optimizer_s = c.optimizer_s;
  r.step_s = step;
  r.compute_s = c.compute_s;
  r.channel_busy_s = c.channel_busy_s;
  r.bubble_s = c.bubble_s;
  r.exposed_s = c.exposed_s;
  const double slow_end = *std::max_element(rank_end.begin(), rank_end.end());
  if (others_rank_end.empty()) {
    r.replica_classes.push_back({opt.slow_stage >= 0 ? "with the straggler" : "all", slow_replicas, slow_end, 0});
  } else {
    const double others_end = *std::max_element(others_rank_end.begin(), others_rank_end.end());
    r.replica_classes.push_back({"with the straggler", slow_replicas, slow_end, std::max(0.0, others_end - slow_end)});
    r.replica_classes.push_back({"the others", lay.dp - slow_replicas, others_end, std::max(0.0, slow_end - others_end)});
  }
  r.rank_classes = lay.pp * static_cast<int>(r.replica_classes.size());
  for (const RankStats& st : ranks) r.events.insert(r.events.end(), st.events.begin(), st.events.end());
  const double tokens = double(batch.global_batch) * double(batch.seq);
  r.tokens_per_s = tokens / r.step_s;
  r.model_flops_per_s_per_rank = m.flops_per_token(batch.seq) * tokens / r.step_s / double(lay.world());
  r.stage_memory = memory_per_stage(m, lay, batch, opt.precision, opt.zero, opt.si, nullptr, opt.schedule);
  for (const MemoryUse& mu : r.stage_memory)  // the largest stage: memory_per_rank's rule
    if (mu.total() > r.memory.total()) r.memory = mu;
  return r;
}

}  // namespace dhelix
