// The step model's strand pricer (StepModel.h): each op's seconds on a cluster preset's device and
// links, one strand's list schedule with its overlaps (price_strand), the co-execution
// interference by the pair simulator's op rules (PairSim.h).
#include <algorithm>
#include <cmath>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "base/Error.h"
#include "sim/StepModel.h"

namespace dhelix {

namespace {

const std::set<std::string>& boundary_out() {
  static const std::set<std::string> s = {"y", "dx", "loss"};
  return s;
}

double compute_time(const Op& op, const DeviceRates& r) {
  if (r.gemm_timer && op.attrs.count("gemm_rows")) {
    // The timer times one GEMM of the shape; a grouped GEMM (the experts') runs gemm_groups of them.
    const double t = r.gemm_timer(op);
    if (t >= 0) return std::max(t * double(gemm_groups(op)), op.cost.bytes * r.byte_scale / r.mem_bw);
  }
  return compute_seconds(op, r.gemm_rate, r.mem_bw, r.byte_scale, r.tiling, r.attention);
}

}  // namespace

DeviceRates device_rates(const ClusterPreset& cluster, Precision p, GemmTimer gemm_timer) {
  return {cluster.gemm_rate(p),         cluster.mem_bw,          element_bytes(p) / 4.0,
          std::move(gemm_timer),       cluster.gemm_tiling,     cluster.attention_rates(p)};
}

double op_time(const Op& op, const std::map<std::string, GroupLink>& groups, const DeviceRates& rates) {
  if (!op.is_collective()) return compute_time(op, rates);
  auto g = groups.find(op.group);
  DHX_CHECK(g != groups.end(), ConfigError, "op '{}' runs on group '{}', which the layout does not have", op.name,
            op.group);
  return CostModel::collective_time(op.coll, op.cost.comm_bytes * rates.byte_scale, g->second.size, g->second.link);
}

namespace {

using Intervals = std::vector<std::pair<double, double>>;

// One pass of price_strand's list schedule; under `io` a compute op slows beside the collectives
// issued before it and a collective beside `computing` (the previous pass's compute intervals).
StrandPrice strand_pass(const std::vector<Op>& ops, const std::map<std::string, GroupLink>& groups,
                        const DeviceRates& rates, Prefetch prefetch, const PairSimOptions& io,
                        const Intervals& computing) {
  StrandPrice p;
  for (const Op& op : ops)
    if (!op.is_collective()) p.compute_s += compute_time(op, rates);
  // Prefetch (the steady state of a stack of these layers, as the pair simulator runs it): a weight
  // gather that a prefetch op of the strand issues for the next layer (OAG, Grid3D.h prefetch_block)
  // is there already in this one, and the prefetch op takes that gather's time and bytes on the
  // channel. Without it (the first layer), the layer's gathers run where they stand.
  std::set<std::string> prefetched;
  std::map<const Op*, const Op*> stands_for;  // a prefetch op -> the gather it issues early
  if (prefetch == Prefetch::kOn)
    for (const Prefetch3D& pf : prefetches_of(ops)) {
      prefetched.insert(pf.buffer);
      if (pf.gather) stands_for[pf.op] = pf.gather;
    }

  std::set<std::string> produced;  // buffers written by an earlier op of the strand
  std::map<std::string, std::pair<double, std::string>> ready;  // buffer -> (time, producing group or "")
  std::map<std::string, double> channel_free, busy;
  std::vector<std::pair<double, std::string>> needed_ends;  // collectives the layer's end waits for
  double engine = 0;
  for (size_t i = 0; i < ops.size(); ++i) {
    const Op& op = ops[i];
    double in_ready = 0;
    std::string waited_on;
    for (const std::string& b : op.inputs) {
      if (!produced.count(b)) continue;
      const auto& [t, g] = ready[b];
      if (t > in_ready) in_ready = t, waited_on = g;
    }
    if (!op.is_collective()) {
      const double start = std::max(engine, in_ready);
      if (in_ready > engine && !waited_on.empty()) p.axes[waited_on].exposed_s += in_ready - engine;
      double comm_busy = start;  // the collectives in flight keep the channels busy till the latest ends
      for (const auto& [g, free] : channel_free) comm_busy = std::max(comm_busy, free);
      engine = compute_end_beside_comm(start, compute_time(op, rates), io.compute_slowdown, comm_busy);
      p.ops.push_back({op.name, op.code, "", start, engine - start});
      for (const std::string& b : op.outputs) produced.insert(b), ready[b] = {engine, ""};
      continue;
    }
    if (op.coll == CollOp::kAllGather && op.inputs.empty() && !op.outputs.empty() && prefetched.count(op.outputs[0])) {
      p.ops.push_back({op.name, op.code, op.group, engine, 0.0});  // issued by the layer before (its prefetch op)
      continue;
    }
    const auto adopted = stands_for.find(&op);
    const Op& priced = adopted == stands_for.end() ? op : *adopted->second;
    const double t = op_time(priced, groups, rates);
    const double bytes = priced.cost.comm_bytes * rates.byte_scale;
    auto g = groups.find(op.group);
    AxisCost& axis = p.axes[op.group];
    axis.bytes += ring_bytes(op.coll, bytes, g->second.size);
    // Issued by the compute thread when it reaches the op (after the compute before it in program
    // order) and its inputs are ready; its group's channel takes one collective at a time.
    const double earliest = std::max(engine, in_ready);
    auto [cf, fresh] = channel_free.emplace(op.group, 0.0);
    const double begin = std::max(earliest, cf->second);
    const double end = comm_end_beside_compute(begin, t, io.comm_slowdown, computing);
    cf->second = end;
    axis.seconds += t;  // the link's time; its channel is occupied for the slowed time
    busy[op.group] += end - begin;
    p.ops.push_back({op.name, op.code, op.group, begin, end - begin});
    bool read_later = false;
    for (const std::string& b : op.outputs) {
      produced.insert(b), ready[b] = {end, op.group};
      if (boundary_out().count(b)) read_later = true;
      for (size_t j = i + 1; j < ops.size() && !read_later; ++j)
        read_later = std::find(ops[j].inputs.begin(), ops[j].inputs.end(), b) != ops[j].inputs.end();
    }
    // A prefetch op's gather is read by the next layer's first GEMM: the layer hands over when it ends.
    if (read_later || adopted != stands_for.end()) needed_ends.push_back({end, op.group});
    if (op.flag("blocking") && end > engine) {
      // Waited for at issue: the engine idles until it completes.
      axis.exposed_s += end - engine;
      engine = end;
    }
  }
  // The layer ends when the engine and every collective something waits for are done; a channel
  // busier than that (background reduce-scatters) sets the pace of a stack of such layers.
  double span = engine;
  for (const auto& [end, g] : needed_ends)
    if (end > span) p.axes[g].exposed_s += end - span, span = end;
  for (const auto& [g, b] : busy)
    if (b > span) p.axes[g].exposed_s += b - span, span = b;
  p.span_s = span;
  return p;
}

}  // namespace

// Timeline of one strand (times from the strand's start; a gather the previous layer prefetched
// takes no time here, the prefetch op for the next layer takes its time):
//   engine : [op0][op1]......[op3 waits for AR]....
//   tp     :      [AR of op1's output]
// A compute op's wait is charged to the group of the collective that produced its latest input.
// Under interference, the pair simulator's op rules (PairSim.h), and its fixed point when
// collectives slow: each pass stretches them by the previous pass's compute intervals.
StrandPrice price_strand(const std::vector<Op>& ops, const std::map<std::string, GroupLink>& groups,
                         const DeviceRates& rates, Prefetch prefetch, const PairSimOptions& interference) {
  StrandPrice p = strand_pass(ops, groups, rates, prefetch, {}, {});
  if (interference.compute_slowdown == 1.0 && interference.comm_slowdown == 1.0) return p;
  const double alone = p.span_s;
  Intervals computing;
  for (int pass = 0; pass < 17; ++pass) {  // PairSim's bound: a first pass and 16 more
    StrandPrice next = strand_pass(ops, groups, rates, prefetch, interference, computing);
    const bool settled = pass > 0 && std::abs(next.span_s - p.span_s) <= 1e-12 * std::max(1e-9, p.span_s);
    p = std::move(next);
    if (settled || interference.comm_slowdown == 1.0) break;
    computing.clear();
    for (const OpPrice& o : p.ops)
      if (o.group.empty() && o.seconds > 0) computing.push_back({o.start_s, o.start_s + o.seconds});
  }
  p.interference_s = p.span_s - alone;
  return p;
}

}  // namespace dhelix
