// PairSim: the executor's block rules over simulated time (see PairSim.h).
#include "sim/PairSim.h"

#include <algorithm>
#include <cmath>
#include <set>

#include "base/Error.h"
#include "plan/IssueOrder.h"

namespace dhelix {

using Intervals = std::vector<std::pair<double, double>>;  // sorted, disjoint [begin, end)

double compute_end_beside_comm(double begin, double t, double k, double comm_busy_until) {
  const double busy = comm_busy_until;
  if (k == 1.0 || busy <= begin) return begin + t;
  return begin + t * k <= busy ? begin + t * k : busy + (t - (busy - begin) / k);
}

double comm_end_beside_compute(double begin, double t, double k, const Intervals& busy) {
  if (k == 1.0) return begin + t;
  double cur = begin, left = t;
  for (const auto& [s, e] : busy) {
    if (e <= cur) continue;
    if (s > cur) {
      if (left <= s - cur) return cur + left;
      left -= s - cur, cur = s;
    }
    if (left * k <= e - cur) return cur + left * k;
    left -= (e - cur) / k, cur = e;
  }
  return cur + left;
}

namespace {

struct Sim {
  Sim(const OpTimer& t, const PairSimOptions& o, const Intervals& c) : time(t), opt(o), computing(c) {}
  const OpTimer& time;
  const PairSimOptions& opt;
  const Intervals& computing;  // the previous pass's compute intervals (comm_slowdown != 1)
  PairSimResult r;
  double engine = 0;                                // when the compute engine is next free
  std::map<std::string, double> channel_free;       // group -> when its comm thread is next free
  std::map<std::pair<int, std::string>, double> ready;  // (strand, buffer) -> when it is ready
  std::set<std::pair<int, std::string>> prefetched;      // (strand, buffer) a prefetch op fills
  std::map<const Op*, const Op*> stands_for;              // a prefetch op -> the gather it issues early
  std::map<std::pair<int, std::string>, std::string> producer;  // (strand, buffer) -> the collective that wrote it
  std::map<std::string, std::string> channel_last;               // group -> its latest collective

  // The engine waits until `until` for collective `by`: the wait is charged to it.
  void wait_for(double until, const std::string& by) {
    if (until <= engine) return;
    r.exposed_s[by] += until - engine;
    engine = until;
  }

  // A prefetch op issues the neighbouring block's gather of a weight (OAG across layers, Grid3D.h
  // prefetch_block) and carries no bytes itself (the adopting gather's count them): on the channel it
  // takes the time of that gather, which is this program's gather of the same buffer.
  void note_prefetches(StrandKind kind, const std::vector<Op>* ops) {
    if (!ops) return;
    for (const Prefetch3D& p : prefetches_of(*ops)) {
      prefetched.insert({static_cast<int>(kind), p.buffer});
      if (p.gather) stands_for[p.op] = p.gather;
    }
  }

  // When the inputs of `op` are ready; `by`: the collective that wrote the latest ("" if none did).
  double ready_at(int strand, const Op& op, std::string* by) const {
    double t = 0;
    for (const std::string& b : op.inputs) {
      auto it = ready.find({strand, b});
      if (it != ready.end() && it->second > t) {
        t = it->second;
        auto p = producer.find({strand, b});
        *by = p == producer.end() ? "" : p->second;
      }
    }
    return t;
  }

  // Runs (compute) or issues (collective) op `i` of `ops`; a collective's end goes to `issued`
  // unless it is background or blocking (waited for at once).
  void run(StrandKind kind, const std::vector<Op>& ops, int i, std::vector<std::pair<double, std::string>>& issued) {
    const Op& op = ops[static_cast<size_t>(i)];
    const int s = static_cast<int>(kind);
    std::string by;
    const double inputs = ready_at(s, op, &by);
    // A compute op's outputs are ready at the engine's time, never later: only a collective's output
    // can make the engine wait.
    if (inputs > engine) wait_for(inputs, by.empty() ? op.name : by);
    if (!op.is_collective()) {
      const double begin = engine, t = time(op);
      DHX_CHECK(t >= 0, InternalError, "op {}: negative time {}", op.name, t);
      // Every collective in flight was issued before this op (the compute thread issues them), so
      // the rank's channels are busy without a gap from `begin` to the latest end, `busy`.
      double busy = begin;
      for (const auto& [g, free] : channel_free) busy = std::max(busy, free);
      const double end = compute_end_beside_comm(begin, t, opt.compute_slowdown, busy);
      engine = end;
      r.compute_s += end - begin;
      r.ops.push_back({kind, i, "compute", begin, engine});
      for (const std::string& b : op.outputs) ready[{s, b}] = engine, producer.erase({s, b});
      return;
    }
    // A weight all-gather the previous layer prefetched (steady state: this layer's own prefetch
    // op, below, stands for it on the channel) is there already.
    if (op.coll == CollOp::kAllGather && op.inputs.empty() && prefetched.count({s, op.outputs.at(0)})) {
      r.ops.push_back({kind, i, op.group, engine, engine});
      return;
    }
    // The compute thread waits for the collective's inputs (above), then hands it to the group's thread.
    const auto adopted = stands_for.find(&op);
    const double t = time(adopted == stands_for.end() ? op : *adopted->second);
    DHX_CHECK(t >= 0, InternalError, "collective {}: negative time {}", op.name, t);
    double& free = channel_free[op.group];
    const double begin = std::max(engine, free);
    free = comm_end_beside_compute(begin, t, opt.comm_slowdown, computing);
    r.channel_busy_s[op.group] += free - begin;
    r.ops.push_back({kind, i, op.group, begin, free});
    channel_last[op.group] = op.name;
    for (const std::string& b : op.outputs) ready[{s, b}] = free, producer[{s, b}] = op.name;
    if (op.flag("blocking")) wait_for(free, op.name);
    else if (!op.flag("background") && !op.attrs.count("prefetch_unit")) issued.push_back({free, op.name});
  }
};

PairSimResult simulate_once(const std::vector<Op>* fwd, const std::vector<Op>* bwd, const SIPlan& plan,
                            const OpTimer& time, const PairSimOptions& opt, const Intervals& computing) {
  Sim sim(time, opt, computing);
  sim.note_prefetches(StrandKind::kForward, fwd);
  sim.note_prefetches(StrandKind::kBackward, bwd);
  // Steady state: the ops this pair carries out stand for those the previous pair carried in.
  const int nb = bwd ? static_cast<int>(bwd->size()) : 0;
  const int carry = std::clamp(plan.carry, 0, nb);
  std::vector<std::pair<double, std::string>> issued;  // (end, name) of the block's collectives
  auto complete = [&] {  // the block's end waits for each in the order they end
    std::sort(issued.begin(), issued.end());
    for (const auto& [e, name] : issued) sim.wait_for(e, name);
    issued.clear();
  };
  for (const IssueStep& st : IssueOrder(PairStrands{fwd, bwd, carry, carry}, plan.blocks)) {
    switch (st.kind) {
      case IssueStep::Kind::kOp:
        sim.run(st.strand, st.strand == StrandKind::kForward ? *fwd : *bwd, st.op, issued);
        break;
      case IssueStep::Kind::kCarried:
        sim.run(StrandKind::kBackward, *bwd, nb - carry + st.op, issued);
        break;
      case IssueStep::Kind::kBlockEnd:
        complete();
        sim.r.block_end_s.push_back(sim.engine);
        break;
    }
  }
  complete();  // carried ops after the last block
  // Background collectives still in flight end the pair too (their readers are in a later pair).
  double span = sim.engine;
  std::string last;
  for (const auto& [g, free] : sim.channel_free)
    if (free > span) span = free, last = sim.channel_last[g];
  if (!last.empty()) sim.wait_for(span, last);
  sim.r.span_s = span;
  sim.r.idle_s = span - sim.r.compute_s;
  return sim.r;
}

}  // namespace

std::vector<Prefetch3D> prefetches_of(const std::vector<Op>& ops) {
  std::vector<Prefetch3D> out;
  for (const Op& op : ops)
    if (op.attrs.count("prefetch_unit") && !op.outputs.empty() && op.outputs[0].ends_with(".next")) {
      Prefetch3D p{&op, op.outputs[0].substr(0, op.outputs[0].size() - 5), nullptr};
      for (const Op& g : ops)
        if (&g != &op && g.is_collective() && !g.outputs.empty() && g.outputs[0] == p.buffer) p.gather = &g;
      out.push_back(std::move(p));
    }
  return out;
}

SIPlan one_block_plan(const std::vector<Op>* f, const std::vector<Op>* b) {
  SIPlan p;
  p.source = "alone";
  p.blocks = {{0, f ? static_cast<int>(f->size()) : 0, 0, b ? static_cast<int>(b->size()) : 0}};
  return p;
}

PairSimResult simulate_pair(const std::vector<Op>* fwd, const std::vector<Op>* bwd, const SIPlan& plan,
                            const OpTimer& time, const PairSimOptions& opt) {
  DHX_CHECK(opt.compute_slowdown >= 1.0, ConfigError, "compute_slowdown={} must be >= 1", opt.compute_slowdown);
  DHX_CHECK(opt.comm_slowdown >= 1.0, ConfigError, "comm_slowdown={} must be >= 1", opt.comm_slowdown);
  Intervals computing;
  PairSimResult r = simulate_once(fwd, bwd, plan, time, opt, computing);
  if (opt.comm_slowdown == 1.0) return r;
  // Each pass stretches the collectives by the previous pass's compute; stretched collectives slow
  // more compute in turn. The span grows towards the fixed point; 16 passes bound a pathological
  // alternation (the tests' pairs settle in 3-4).
  for (int pass = 0; pass < 16; ++pass) {
    computing.clear();
    for (const SimOp& o : r.ops)
      if (o.lane == "compute" && o.end_s > o.begin_s) computing.push_back({o.begin_s, o.end_s});
    std::sort(computing.begin(), computing.end());
    PairSimResult next = simulate_once(fwd, bwd, plan, time, opt, computing);
    const bool settled = std::abs(next.span_s - r.span_s) <= 1e-12 * std::max(1e-9, r.span_s);
    r = std::move(next);
    if (settled) break;
  }
  return r;
}

}  // namespace dhelix
