// The step model: strand list schedules over the layer programs, pipeline and data-parallel
// composition, memory per rank (its rule in StepMemory.cc), and the closed-form path for 3D grids
// the programs do not yet write.
#include "sim/StepModel.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <optional>
#include <limits>
#include <map>
#include <numeric>
#include <set>
#include <tuple>

#include "base/Error.h"
#include "model/Params.h"
#include "sharding/ModelPrograms.h"
#include "sharding/ParamSharding.h"
#include "schedule/BasicPlans.h"
#include "sim/AxonnModel.h"
#include "sim/PairSim.h"
#include "sim/StepMemory.h"

namespace dhelix {

using namespace sim_detail;  // the memory rule and activation sizes (StepMemory.h)

const char* pricer_name(PricerKind p) { return p == PricerKind::kPrograms ? "programs" : "closed-form"; }

double ring_bytes(CollOp coll, double bytes, int n) {
  if (n <= 1) return 0;
  const double f = double(n - 1) / n;
  switch (coll) {
    case CollOp::kAllGather:
    case CollOp::kReduceScatter:
    case CollOp::kAllToAll: return f * bytes;
    case CollOp::kAllReduce: return 2 * f * bytes;
    case CollOp::kBroadcast:
    case CollOp::kSendRecv: return bytes;
    case CollOp::kNone: break;
  }
  throw InternalError("ring_bytes: not a collective");
}

std::map<std::string, GroupLink> group_links(const LayoutConfig& lay, const ClusterPreset& cluster) {
  const Layout layout(lay, 0);
  std::map<std::string, GroupLink> out;
  for (GroupRole r : all_group_roles())
    out[group_role_name(r)] = {layout.size(r), group_link(cluster, layout.group_ranks(r, 0), lay.world())};
  return out;
}

CostModelConfig cost_model_config(const ClusterPreset& cluster, const LayoutConfig& lay, Precision p) {
  CostModelConfig c;
  c.name = fmt::format("{} ({})", cluster.name, precision_name(p));
  c.flop_rate = cluster.gemm_rate(p);
  c.mem_bw = cluster.mem_bw;
  c.element_bytes = element_bytes(p);
  c.tiling = cluster.gemm_tiling;
  c.attention = cluster.attention_rates(p);
  for (const auto& [role, g] : group_links(lay, cluster)) {
    c.group_sizes[role] = g.size;
    if (g.size > 1) c.links[role] = g.link;
  }
  c.validate();
  return c;
}

std::vector<std::string> layout_errors(const ModelConfig& m, const LayoutConfig& lay, const BatchSpec& batch) {
  std::vector<std::string> e = validate_layout(lay, lay.world());
  for (const std::string& x : m.validate()) e.push_back(x);
  if (lay.cp > 1 && batch.seq % (2 * lay.cp) != 0)
    e.push_back(fmt::format("sequence {} is not divisible by 2 x cp = {} (context parallelism's chunks)", batch.seq,
                            2 * lay.cp));
  if (lay.ep > 1 && !m.is_moe())
    e.push_back(fmt::format("ep={}: expert parallelism needs the moe family (model {} is {})", lay.ep, m.name,
                            family_name(m.family)));
  if (lay.ep > 1 && m.is_moe() && m.n_experts % lay.ep != 0)
    e.push_back(fmt::format("experts={} is not divisible by ep={}", m.n_experts, lay.ep));
  if (m.is_moe() && lay.is_3d() && lay.cp >= 1 && lay.tp_x >= 1 && lay.tp_y >= 1 &&
      (batch.micro_batch * (batch.seq / lay.cp)) % (int64_t(lay.tp_x) * lay.tp_y) != 0)
    e.push_back(fmt::format("micro-batch tokens {} are not divisible by Gx x Gy = {} (the MoE MLP on the 3D grid "
                            "splits them over the x-y plane)",
                            batch.micro_batch * (batch.seq / lay.cp), int64_t(lay.tp_x) * lay.tp_y));
  auto div = [&](int64_t v, int64_t by, const std::string& what, const std::string& axis) {
    if (by > 1 && v % by != 0) e.push_back(fmt::format("{}={} is not divisible by {}={}", what, v, axis, by));
  };
  div(m.n_heads, lay.tp, "heads", "tp");
  div(m.n_kv_heads, lay.tp, "kv heads", "tp");
  div(m.ffn_hidden, lay.tp, "ffn_hidden", "tp");
  div(m.n_heads, lay.tp_y, "heads", "Gy");
  div(m.n_kv_heads, lay.tp_y, "kv heads", "Gy");
  div(m.ffn_hidden, lay.tp_y, "ffn_hidden", "Gy");
  div(m.d_model, lay.tp_x, "d_model", "Gx");
  if (lay.tp_z > 1) {
    // Each Gx x Gy block of a weight is flattened and split over z: the smallest (attention-out).
    const int64_t blk = m.n_heads * m.head_dim() * m.d_model / (int64_t{lay.tp_x} * lay.tp_y);
    div(blk, lay.tp_z, "the attention-out weight block (elements)", "Gz");
  }
  div(m.n_layers, lay.pp, "layers", "pp");
  const int64_t replicas = int64_t{lay.data_replicas()};
  if (batch.micro_batch < 1 || batch.seq < 1 || batch.global_batch < 1) {
    e.push_back(fmt::format("global batch {}, sequence {} and micro-batch {} must be >= 1", batch.global_batch,
                            batch.seq, batch.micro_batch));
  } else if (batch.global_batch % (replicas * batch.micro_batch) != 0) {
    e.push_back(fmt::format("batch {} is not divisible by {} x micro-batch {} = {}", batch.global_batch,
                            lay.is_3d() ? fmt::format("Gz x Gdata = {}", replicas) : fmt::format("dp = {}", replicas),
                            batch.micro_batch, replicas * batch.micro_batch));
  } else if (lay.tp > 1 && batch.micro_batch * (batch.seq / lay.cp) % lay.tp != 0) {
    e.push_back(fmt::format("micro-batch tokens {} per rank are not divisible by tp={}",
                            batch.micro_batch * (batch.seq / lay.cp), lay.tp));
  }
  if (batch.micro_batch >= 1 && batch.global_batch >= 1 && lay.pp > 1 &&
      batch.global_batch / (replicas * batch.micro_batch) < lay.pp) {
    // The engine's pipelines refuse it too (schedule/Pipelines.h pipeline_spec_errors).
    e.push_back(fmt::format("{} micro-batches (batch {} / ({} replicas x micro-batch {})) are below pp={}: the "
                            "pipeline would never fill",
                            batch.global_batch / (replicas * batch.micro_batch), batch.global_batch, replicas,
                            batch.micro_batch, lay.pp));
  }
  return e;
}

namespace {

struct UnitTimes {
  StrandPrice fwd, bwd;
};

// One transfer of the gradient tail on a group's comm thread (channel()).
struct ChannelItem {
  std::string name;
  double ready_s = 0, bytes = 0;
  CollOp coll = CollOp::kAllReduce;
  int order = 0;  // ties of ready_s: the larger goes first (the later unit, as backward produces them)
};

// Transfers on one group's comm thread: each goes when it is ready and the thread is free, in the
// order they become ready. Returns when the thread is done (0 when nothing goes); adds the traffic
// to `axis` and, when given, each transfer's span to `spans`.
double channel(std::vector<ChannelItem> items, const std::string& group, const GroupLink& link, AxisCost& axis,
               std::vector<ChannelSpan>* spans) {
  if (link.size <= 1) return 0;
  std::stable_sort(items.begin(), items.end(), [](const ChannelItem& a, const ChannelItem& b) {
    return a.ready_s != b.ready_s ? a.ready_s < b.ready_s : a.order > b.order;
  });
  double free_at = 0;
  for (const ChannelItem& it : items) {
    const double c = CostModel::collective_time(it.coll, it.bytes, link.size, link.link);
    const double begin = std::max(free_at, it.ready_s);
    free_at = begin + c;
    axis.bytes += ring_bytes(it.coll, it.bytes, link.size);
    axis.seconds += c;
    if (spans) spans->push_back({group, it.name, begin, free_at});
  }
  return free_at;
}

// The buckets of a stage's units: unit mine[i]'s bucket of bytes[i], ready at rd.ready_s[i].
std::vector<ChannelItem> unit_buckets(const std::vector<int>& mine, const GradReadiness& rd,
                                      const std::vector<double>& bytes, Zero zero) {
  std::vector<ChannelItem> items;
  for (size_t i = 0; i < mine.size(); ++i)
    items.push_back({fmt::format("grad bucket u{}", mine[i]), rd.ready_s[i], bytes[i],
                     zero == Zero::kZero1 ? CollOp::kReduceScatter : CollOp::kAllReduce, static_cast<int>(i)});
  return items;
}

// The executor's buckets of a stage's gradients (plan_grad_buckets over the units of `mine`, at
// ParamStore's automatic size): the dense parameters' (experts = false; with ep = 1 the experts'
// weights are among them, as GradSync reduces them over dp) or, under ep, the experts' (over edp).
// A bucket carries its members' share by elements of their unit's `bytes` (which follow the wire's
// element size), and goes once the last backward of its min_unit has ended. Under the sparse
// embedding exchange the table (unit 0's "wte") is priced by its own items, not here.
std::vector<ChannelItem> param_buckets(const LayoutConfig& lay, const std::vector<UnitSpec>& units,
                                       const std::vector<int>& mine, const GradReadiness& rd,
                                       const std::vector<double>& bytes, bool experts, Zero zero, bool sparse) {
  std::vector<UnitSpec> held(units.size());
  std::map<int, size_t> at;  // unit -> its index in mine
  int64_t total = 0;
  for (size_t i = 0; i < mine.size(); ++i) {
    held[static_cast<size_t>(mine[i])] = units[static_cast<size_t>(mine[i])];
    at[mine[i]] = i;
    for (const ParamSpec& q : units[static_cast<size_t>(mine[i])].params) total += shape_numel(q.shard);
  }
  auto here = [&](int u, const ParamSpec& q) {
    if (sparse && u == 0 && q.local == "wte") return false;
    return experts == (lay.ep > 1 && q.role == ShardRole::kExpert);
  };
  std::vector<double> unit_elems(mine.size(), 0.0);  // per unit, its elements on this channel
  for (size_t i = 0; i < mine.size(); ++i)
    for (const ParamSpec& q : units[static_cast<size_t>(mine[i])].params)
      if (here(mine[i], q)) unit_elems[i] += double(shape_numel(q.shard));
  const std::vector<GradBucketPlan> plan = plan_grad_buckets(held, auto_bucket_elems(total));
  std::vector<ChannelItem> items;
  for (size_t b = 0; b < plan.size(); ++b) {
    double sum = 0;
    for (const auto& [u, k] : plan[b].members) {
      const ParamSpec& q = held[static_cast<size_t>(u)].params[static_cast<size_t>(k)];
      const size_t i = at.at(u);
      if (here(u, q)) sum += bytes[i] * double(shape_numel(q.shard)) / unit_elems[i];
    }
    if (sum <= 0) continue;
    items.push_back({fmt::format("grad bucket {} u{}", b, plan[b].min_unit), rd.ready_s[at.at(plan[b].min_unit)], sum,
                     zero == Zero::kZero1 ? CollOp::kReduceScatter : CollOp::kAllReduce,
                     static_cast<int>(plan.size() - b)});  // ties: the bucket laid out first goes first
  }
  return items;
}

// The data-parallel gradient reduction of one stage whose last backward runs alone (unit i taking
// bwd_span[i], in reverse order). Returns seconds past the end of the backward pass, and adds the
// traffic to `axis`.
double dp_exposed(const std::vector<double>& bwd_span, const std::vector<double>& grad_bytes, const GroupLink& dp,
                  Zero zero, AxisCost& axis) {
  if (dp.size <= 1) return 0;
  const GradReadiness rd = readiness_after(bwd_span);
  std::vector<int> index(bwd_span.size());
  std::iota(index.begin(), index.end(), 0);
  const double exposed =
      std::max(0.0, channel(unit_buckets(index, rd, grad_bytes, zero), "dp", dp, axis, nullptr) - rd.end_s);
  axis.exposed_s += exposed;
  return exposed;
}

void add_axes(std::map<std::string, AxisCost>& into, const std::map<std::string, AxisCost>& from, double times,
              double exposed_scale = 1.0) {
  for (const auto& [g, a] : from) {
    AxisCost& x = into[g];
    x.bytes += a.bytes * times;
    x.seconds += a.seconds * times;
    x.exposed_s += a.exposed_s * times * exposed_scale;
  }
}

bool writes_3d(const ModelPrograms& p) {
  for (const LayerProgram* lp : {&p.embed, &p.block, &p.head})
    for (const auto* ops : {&lp->fwd, &lp->bwd})
      for (const Op& op : *ops)
        if (op.group == "x" || op.group == "y" || op.group == "z") return true;
  return false;
}

void check_fits(StepPrediction& r, const ClusterPreset& c) {
  r.memory_limit = c.memory_bytes;
  r.fits = r.memory.total() <= c.memory_bytes;
  if (!r.fits)
    r.reason = fmt::format("does not fit memory: needs {:.2f} GiB of {:.2f} GiB (params {:.2f}, grads {:.2f}, "
                           "optimizer {:.2f}, gathered {:.2f}, activations {:.2f})",
                           r.memory.total() / (1 << 30), c.memory_bytes / (1 << 30), r.memory.params / (1 << 30),
                           r.memory.grads / (1 << 30), r.memory.optimizer / (1 << 30), r.memory.gathered / (1 << 30),
                           r.memory.activations / (1 << 30));
}

StepPrediction predict_closed_form(const ModelConfig& m, const LayoutConfig& lay, const BatchSpec& batch,
                                   const ClusterPreset& cluster, const PredictOptions& opt, StepPrediction r);

}  // namespace

std::vector<Op> without_kept_gathers(const std::vector<Op>& ops) {
  auto kept = [](const Op& op) { return op.is_collective() && op.flag("kept"); };
  std::set<const Op*> left_out;
  for (const Op& op : ops)
    if (kept(op)) left_out.insert(&op);
  for (const Prefetch3D& p : prefetches_of(ops))
    if (p.gather && kept(*p.gather)) left_out.insert(p.op);
  std::vector<Op> out;
  for (const Op& op : ops)
    if (!left_out.count(&op)) out.push_back(op);
  return out;
}

double pipeline_message_bytes(const ModelConfig& m, const LayoutConfig& lay, const BatchSpec& batch, double elem) {
  return double(batch.micro_batch * (batch.seq / lay.cp)) / lay.tp * double(m.d_model) / lay.tp_x * elem;
}

std::vector<Op> folding_variant(const std::vector<Op>& ops) {
  std::vector<Op> out;
  std::set<std::string> deferred;
  for (const Op& op : ops) {
    if (std::any_of(op.inputs.begin(), op.inputs.end(), [&](const std::string& b) { return deferred.count(b) > 0; })) {
      Op nothing;  // reads what the last micro-batch reduces: nothing to do now (Executor::run_op)
      nothing.name = op.name + ".deferred";
      nothing.code = "deferred";
      out.push_back(nothing);
      continue;
    }
    if (op.is_collective() && op.flag("last_micro_batch")) {
      deferred.insert(op.outputs.begin(), op.outputs.end());
      Op add;
      add.name = op.name + ".fold";
      add.code = "block_sum_add";
      add.inputs = op.inputs;
      add.cost.bytes = 3 * op.cost.comm_bytes;
      out.push_back(add);
      continue;
    }
    out.push_back(op);
  }
  return out;
}

bool sparse_embedding_applies(const ModelConfig& m, const LayoutConfig& lay, const BatchSpec& batch,
                              SparseEmbedGrad s) {
  return s == SparseEmbedGrad::kOn && lay.pp == 1 && !lay.is_3d() && lay.tp == 1 && lay.cp == 1 && lay.ep == 1 &&
         lay.dp > 1 && batch.micro_batch * batch.seq * lay.dp < 2 * m.vocab_size;
}

SparseEmbedTail sparse_embed_tail(const ModelConfig& m, const LayoutConfig& lay, const BatchSpec& batch,
                                  const std::vector<UnitSpec>& units, const std::vector<int>& mine,
                                  const GradReadiness& rd, double last_bwd_start_s, std::vector<double>& grad_bytes,
                                  double grad_wire_bytes) {
  auto at = [&](int unit) {
    const auto it = std::find(mine.begin(), mine.end(), unit);
    DHX_ASSERT(it != mine.end(), "sparse embedding: unit {} is not on this stage", unit);
    return static_cast<size_t>(it - mine.begin());
  };
  double table = 0;
  for (const ParamSpec& q : units.at(0).params)
    if (q.local == "wte") table = double(shape_numel(q.shard)) * grad_wire_bytes;
  DHX_ASSERT(table > 0, "sparse embedding: the embedding unit has no wte");
  grad_bytes[at(0)] -= table;
  const double tokens = double(batch.micro_batch * batch.seq) * lay.dp;  // gathered over dp
  SparseEmbedTail t;
  t.table_bytes = table;
  t.rows_bytes = tokens * double(m.d_model) * 4;
  t.tokens_bytes = tokens * 4;  // int32 ids
  // Tied, the head's backward adds its part to the table first.
  t.table_ready_s = m.tie_embeddings ? rd.ready_s[at(static_cast<int>(units.size()) - 1)] : last_bwd_start_s;
  t.rows_ready_s = rd.ready_s[at(1)];  // the first layer's input gradient
  return t;
}

GradReadiness readiness_after(const std::vector<double>& bwd_span) {
  GradReadiness rd;
  rd.ready_s.assign(bwd_span.size(), 0.0);
  double t = 0;
  for (size_t i = bwd_span.size(); i-- > 0;) rd.ready_s[i] = t += bwd_span[i];
  rd.end_s = t;
  return rd;
}

double gradient_tail(const LayoutConfig& lay, const std::map<std::string, GroupLink>& groups,
                     const std::vector<UnitSpec>& units, const std::vector<int>& mine, const GradReadiness& ready,
                     const std::vector<double>& grad_bytes, const std::vector<double>& expert_bytes, double elems,
                     double elem, Zero zero, std::map<std::string, AxisCost>& axes, std::vector<ChannelSpan>* spans,
                     const SparseEmbedTail* sparse) {
  // Data parallel: each unit's bucket as its last backward ends, then ZeRO-1's all-gather; under
  // context parallelism over the dp x cp replicas of the weights (the dpcp group). Expert buckets
  // go over edp (edp x cp under context parallelism) on that group's own comm thread, beside them.
  const std::string dpg = lay.cp > 1 ? "dpcp" : "dp", edpg = lay.cp > 1 ? "edpcp" : "edp";
  const GroupLink& dp = groups.at(dpg);
  auto past_end = [&](const std::string& g, const GroupLink& link, std::vector<ChannelItem> items) {
    AxisCost& axis = axes[g];
    if (link.size <= 1) return 0.0;
    const double t = std::max(0.0, channel(std::move(items), g, link, axis, spans) - ready.end_s);
    axis.exposed_s += t;
    return t;
  };
  std::vector<ChannelItem> dp_items = param_buckets(lay, units, mine, ready, grad_bytes, false, zero, sparse != nullptr);
  if (sparse) {  // the token table's own bucket, then the last micro-batch's rows and their ids
    dp_items.push_back({"grad bucket wte (table)", sparse->table_ready_s, sparse->table_bytes,
                        zero == Zero::kZero1 ? CollOp::kReduceScatter : CollOp::kAllReduce, -1});
    dp_items.push_back({"embedding token ids", sparse->rows_ready_s, sparse->tokens_bytes, CollOp::kAllGather, -2});
    dp_items.push_back({"embedding rows", sparse->rows_ready_s, sparse->rows_bytes, CollOp::kAllGather, -3});
  }
  double tail = past_end(dpg, dp, std::move(dp_items));
  if (lay.ep > 1) {
    tail = std::max(tail, past_end(edpg, groups.at(edpg),
                                   param_buckets(lay, units, mine, ready, expert_bytes, true, zero, false)));
    if (axes[edpg].bytes == 0) axes.erase(edpg);
  }
  // Then, one after another on the compute thread's wait: ZeRO-1's all-gathers, the partial
  // gradients' all-reduce.
  auto after = [&](const std::string& g, const std::string& name, CollOp c, double bytes, const GroupLink& link) {
    const double t = CostModel::collective_time(c, bytes, link.size, link.link);
    axes[g].bytes += ring_bytes(c, bytes, link.size);
    axes[g].seconds += t, axes[g].exposed_s += t;
    if (spans) spans->push_back({g, name, ready.end_s + tail, ready.end_s + tail + t});
    tail += t;
  };
  if (zero == Zero::kZero1 && dp.size > 1) {
    double expert_elems = 0;  // under ep the experts' all-gather goes over edp
    for (double b : expert_bytes) expert_elems += b / 4;
    after(dpg, "zero1 all-gather", CollOp::kAllGather, (elems - expert_elems) * elem, dp);
    const GroupLink& edp = groups.at(edpg);
    if (expert_elems > 0 && edp.size > 1) after(edpg, "zero1 all-gather (experts)", CollOp::kAllGather, expert_elems * elem, edp);
  }
  // Sequence-parallel partial gradients (norms, row biases) all-reduced over tp before the step.
  // On the 3D grid the MoE MLP's (partial_grad_block) over the whole block.
  double partial = 0, partial_block = 0;
  for (int u : mine)
    for (const ParamSpec& q : units[u].params) {
      if (q.partial_grad) partial += double(shape_numel(q.shard)) * 4;
      if (q.partial_grad_block) partial_block += double(shape_numel(q.shard)) * 4;
    }
  const std::string pg = lay.is_3d() ? "z" : "tp";  // the group the tokens are split over
  if (partial > 0 && groups.at(pg).size > 1) after(pg, "partial grads all-reduce", CollOp::kAllReduce, partial, groups.at(pg));
  if (partial_block > 0 && groups.at("tpblock").size > 1)
    after("tpblock", "MoE grads all-reduce", CollOp::kAllReduce, partial_block, groups.at("tpblock"));
  return tail;
}

double optimizer_time(double elems, int dp, Zero zero, Precision p, const ClusterPreset& cluster) {
  const double owned = zero == Zero::kZero1 ? elems / std::max(1, dp) : elems;
  const double bytes = 4 * elems + (4 + 28 + (p == Precision::kBf16 ? 2 : 0)) * owned;
  double t = bytes / cluster.mem_bw;
  if (cluster.optimizer_elems_per_s > 0) t = std::max(t, owned / cluster.optimizer_elems_per_s);
  return t;
}

PipelineSpec pipeline_spec_of(const ModelConfig& m, const LayoutConfig& lay, const BatchSpec& batch,
                              const PredictOptions& opt) {
  PipelineSpec spec;
  spec.kind = lay.pp > 1 ? opt.pipeline : PipelineKind::k1F1B;
  spec.pp = lay.pp;
  spec.virtual_stages = spec.kind == PipelineKind::kInterleaved ? opt.virtual_stages : 1;
  spec.n_layers = static_cast<int>(m.n_layers);
  spec.micro_batches = static_cast<int>(batch.global_batch / (int64_t{lay.data_replicas()} * batch.micro_batch));
  spec.co_execute = opt.si == StrandInterleaving::kOn ? CoExecute::kOn : CoExecute::kOff;
  return spec;
}

PairSimOptions interference_of(const PredictOptions& opt, const ClusterPreset& cluster) {
  return {opt.compute_slowdown > 0 ? opt.compute_slowdown : cluster.compute_slowdown,
          opt.comm_slowdown > 0 ? opt.comm_slowdown : cluster.comm_slowdown};
}

StepPrediction predict(const ModelConfig& m, const LayoutConfig& lay, const BatchSpec& batch,
                       const ClusterPreset& cluster, const PredictOptions& opt) {
  const std::vector<std::string> errs = layout_errors(m, lay, batch);
  DHX_CHECK(errs.empty(), ConfigError, "layout cannot run: {}", fmt::join(errs, "; "));
  const PairSimOptions io = interference_of(opt, cluster);
  DHX_CHECK(io.compute_slowdown >= 1 && io.comm_slowdown >= 1, ConfigError,
            "predict: compute_slowdown={} comm_slowdown={} must be >= 1 (1: no interference)", io.compute_slowdown,
            io.comm_slowdown);
  StepPrediction r;
  r.layout = lay;
  r.micro_batches = batch.global_batch / (int64_t{lay.data_replicas()} * batch.micro_batch);
  const MicroBatchShape mb{batch.micro_batch, batch.seq / lay.cp};  // one rank's rows
  LayoutConfig plain = lay;
  plain.sequence_parallel = lay.tp > 1;  // the engine always runs tp with sequence parallelism
  const ModelPrograms progs = build_programs(m, plain, mb);
  if (lay.is_3d() && !writes_3d(progs)) return predict_closed_form(m, lay, batch, cluster, opt, r);

  const double elem = element_bytes(opt.precision);
  const DeviceRates rates = device_rates(cluster, opt.precision, opt.gemm_timer);
  const std::map<std::string, GroupLink> groups = group_links(lay, cluster);
  r.interference = io;  // (the closed-form 3D pricer, above, charges none: {1, 1})
  const UnitTimes embed{price_strand(progs.embed.fwd, groups, rates, Prefetch::kOn, io),
                        price_strand(progs.embed.bwd, groups, rates, Prefetch::kOn, io)};
  // Each block program (the per-layer options' variants too: ModelPrograms::variants), by name; and
  // its forward as the micro-batches after a step's first run it, whose kept weight blocks
  // (LayoutConfig::keep_gathered) the first gathered for the whole step (without_kept_gathers).
  std::map<std::string, UnitTimes> block_of, block_fold_of, block_cached_of, block_fold_cached_of;
  for (const LayerProgram* bp : progs.all()) {
    if (bp == &progs.embed || bp == &progs.head) continue;
    const UnitTimes t{price_strand(bp->fwd, groups, rates, Prefetch::kOn, io),
                      price_strand(bp->bwd, groups, rates, Prefetch::kOn, io)};
    const StrandPrice folded = price_strand(folding_variant(bp->bwd), groups, rates, Prefetch::kOn, io);
    const StrandPrice cached = price_strand(without_kept_gathers(bp->fwd), groups, rates, Prefetch::kOn, io);
    block_of.emplace(bp->name, t);
    block_fold_of.emplace(bp->name, UnitTimes{t.fwd, folded});
    block_cached_of.emplace(bp->name, UnitTimes{cached, t.bwd});
    block_fold_cached_of.emplace(bp->name, UnitTimes{cached, folded});
  }
  const UnitTimes head{price_strand(progs.head.fwd, groups, rates, Prefetch::kOn, io),
                       price_strand(progs.head.bwd, groups, rates, Prefetch::kOn, io)};
  // The backward strands as the micro-batches before the last run them (3D z reduce-scatters
  // folded into block sums, LayoutConfig::overlap3d.accumulate_z); the same strands otherwise.
  const UnitTimes embed_fold{embed.fwd, price_strand(folding_variant(progs.embed.bwd), groups, rates, Prefetch::kOn, io)};
  const UnitTimes head_fold{head.fwd, price_strand(folding_variant(progs.head.bwd), groups, rates, Prefetch::kOn, io)};
  const int L = static_cast<int>(m.n_layers), p = lay.pp;
  const int64_t M = r.micro_batches;
  const std::vector<UnitSpec> units = model_units(m, plain, 0);
  // The pipeline's schedule: its chunks place the units on the stages, its slots hold the
  // activations the memory rule walks (one stage at pp = 1: 1F1B's).
  const PipelineSpec spec = pipeline_spec_of(m, lay, batch, opt);
  {
    const std::vector<std::string> perrs = pipeline_spec_errors(spec);
    DHX_CHECK(perrs.empty(), ConfigError, "{} cannot run this layout: {}", pipeline_kind_name(spec.kind),
              fmt::join(perrs, "; "));
  }
  const StepSchedule sch = walk_schedule(spec);  // its chunks as the run's; its slots enough for the walk
  r.pipeline = spec.kind, r.virtual_stages = spec.virtual_stages;
  // Stage s's units in forward order with the block each layer runs (the per-layer options count
  // each chunk's layers from its first), and its sends a micro-batch: an activation where the next
  // chunk lives on another rank, a gradient where the previous one does.
  struct StageUnits {
    std::vector<int> units;
    std::vector<std::string> blocks;  // per unit: the block variant ("" for the embedding and head)
    int fwd_sends = 0, bwd_sends = 0;
  };
  std::vector<StageUnits> placed(static_cast<size_t>(p));
  for (int s = 0; s < p; ++s) {
    StageUnits& su = placed[static_cast<size_t>(s)];
    for (int c : sch.chunks_of(s)) {
      const Chunk& ch = sch.chunks[static_cast<size_t>(c)];
      int layer = 0;
      for (int u = ch.unit_begin; u < ch.unit_end; ++u) {
        su.units.push_back(u);
        su.blocks.push_back(u != 0 && u != L + 1 ? block_variant_name(lay, layer++) : "");
      }
      const size_t next = static_cast<size_t>(c) + 1;
      su.fwd_sends += next < sch.chunks.size() && sch.chunks[next].rank != s;
      su.bwd_sends += c > 0 && sch.chunks[static_cast<size_t>(c) - 1].rank != s;
    }
  }
  const GroupLink& pp_link = groups.at("pp");
  // Activation (forward) or gradient (backward) of one micro-batch crossing a stage boundary.
  const double p2p_bytes = pipeline_message_bytes(m, lay, batch, elem);
  const double p2p_s = p > 1 ? CostModel::collective_time(CollOp::kSendRecv, p2p_bytes, 2, pp_link.link) : 0;

  std::vector<std::string> notes;

  // Pipeline stages that share one core (a node holding several stages of one pipeline, its ranks
  // on fewer cores than ranks: the preset's core_share < 1) fill each other's bubbles: while one
  // stage waits for its neighbour, the other computes on the whole core. Measured on the emulated
  // cluster (2 ranks per core, pp inside a node): pp=2 dp=2 steps 2.06-2.13 s, the no-pipeline
  // dp=4 2.09-2.19 s, where the bubble rule alone predicted 25% more.
  int stages_per_core = 1;
  if (p > 1 && cluster.core_share > 0 && cluster.core_share < 1) {
    const Layout layout(lay, 0);
    const int node0 = 0, per = cluster.devices_per_node;
    int on_node = 0;
    for (int rk : layout.group_ranks(GroupRole::kPP, 0)) on_node += rk / per == node0;
    stages_per_core = std::min(on_node, static_cast<int>(std::lround(1.0 / cluster.core_share)));
  }
  // Strand Interleaving's co-executed passes as the simulator runs them (StepSim's run and
  // run_slot): the forward units in order beside the backward units in reverse, each pair one SI
  // pair of strand programs (simulate_pair with the default pair plan of the two programs, these op
  // prices and this interference), the units left over alone. A micro-batch after the step's first
  // (`cached`) binds the kept weight blocks: their gathers take no time (the program and its plan
  // unchanged); one before the step's last (`fold`) runs its backward with the 3D reduce-scatters
  // folded into block sums (folding_variant).
  const bool si = opt.si == StrandInterleaving::kOn;
  std::map<std::string, const LayerProgram*> program_of;
  for (const LayerProgram* bp : progs.all()) program_of.emplace(bp->name, bp);
  std::map<std::pair<const std::vector<Op>*, std::string>, bool> has_flag;  // (program, flag) -> a collective has it
  auto has = [&](const std::vector<Op>& ops, const char* flag) {
    auto [it, fresh] = has_flag.try_emplace({&ops, flag}, false);
    if (fresh)
      it->second = std::any_of(ops.begin(), ops.end(), [&](const Op& o) { return o.is_collective() && o.flag(flag); });
    return it->second;
  };
  std::map<const LayerProgram*, std::vector<Op>> folded_bwd;  // built once each
  auto strand_ops = [&](int u, const std::string& bname, bool forward, bool fold) -> const std::vector<Op>* {
    const LayerProgram* lp = u == 0 ? &progs.embed : u == L + 1 ? &progs.head : program_of.at(bname);
    if (forward || !fold || !has(lp->bwd, "last_micro_batch")) return forward ? &lp->fwd : &lp->bwd;
    auto [it, fresh] = folded_bwd.try_emplace(lp);
    if (fresh) it->second = folding_variant(lp->bwd);
    return &it->second;
  };
  const OpTimer op_seconds = [&](const Op& o) { return op_time(o, groups, rates); };
  const OpTimer cached_seconds = [&](const Op& o) {
    return o.is_collective() && o.flag("kept") ? 0.0 : op_time(o, groups, rates);
  };
  std::map<std::tuple<const std::vector<Op>*, const std::vector<Op>*, bool>, double> pair_spans;
  auto pair_span = [&](const std::vector<Op>* f, const std::vector<Op>* b, bool cached) {
    cached = cached && ((f && has(*f, "kept")) || (b && has(*b, "kept")));  // the same pair otherwise
    auto [it, fresh] = pair_spans.try_emplace({f, b, cached}, 0.0);
    if (fresh) {
      const SIPlan plan = f && b ? pair_default_plan(*f, *b) : one_block_plan(f, b);
      it->second = simulate_pair(f, b, plan, cached ? cached_seconds : op_seconds, io).span_s;
    }
    return it->second;
  };
  // fwd: the forward's units (and their block variants) in order; bwd: the backward's, in forward
  // order (paired from its last).
  using UnitList = std::vector<std::pair<int, std::string>>;
  auto co_executed = [&](const UnitList& fwd, const UnitList& bwd, bool cached, bool fold) {
    double t = 0;
    for (size_t i = 0; i < std::max(fwd.size(), bwd.size()); ++i) {
      const std::vector<Op>* f = i < fwd.size() ? strand_ops(fwd[i].first, fwd[i].second, true, false) : nullptr;
      const size_t j = bwd.size() - 1 - i;
      const std::vector<Op>* b = i < bwd.size() ? strand_ops(bwd[j].first, bwd[j].second, false, fold) : nullptr;
      t += pair_span(f, b, cached);
    }
    return t;
  };
  struct StageMb {
    double Ff = 0, Bb = 0, Cf = 0, Cb = 0, elems = 0;
    double co_s = 0;  // under SI: its forward beside its backward, co_executed (the stage's units)
    std::map<std::string, AxisCost> axes;  // one micro-batch, forward and backward
    std::vector<double> fwd_span, bwd_span, grad_bytes;  // per unit of the stage, in placed[s] order
    std::vector<double> expert_bytes;  // under ep: the experts' gradients (reduced over edp, not dp)
  };
  // One micro-batch's strands on stage s: `fold`, its 3D weight-gradient reduce-scatters folded into
  // block sums (a micro-batch before the step's last); `cached`, its kept weight blocks not gathered
  // (a micro-batch after the step's first).
  // Unit u's strands (its block variant `bname`) as such a micro-batch runs them.
  auto unit_times = [&](int u, const std::string& bname, bool fold, bool cached) -> const UnitTimes& {
    const auto& blocks = fold ? (cached ? block_fold_cached_of : block_fold_of) : (cached ? block_cached_of : block_of);
    return u == 0 ? (fold ? embed_fold : embed) : u == L + 1 ? (fold ? head_fold : head) : blocks.at(bname);
  };
  auto stage_mb = [&](int s, bool fold, bool cached) {
    StageMb g;
    const StageUnits& su = placed[static_cast<size_t>(s)];
    for (size_t k = 0; k < su.units.size(); ++k) {
      const int u = su.units[k];
      const UnitTimes& t = unit_times(u, su.blocks[k], fold, cached);
      g.Ff += t.fwd.span_s, g.Bb += t.bwd.span_s, g.Cf += t.fwd.compute_s, g.Cb += t.bwd.compute_s;
      add_axes(g.axes, t.fwd.axes, 1);
      add_axes(g.axes, t.bwd.axes, 1);
      g.fwd_span.push_back(t.fwd.span_s);
      g.bwd_span.push_back(t.bwd.span_s);
      double experts = 0;  // expert shards, when ep > 1 puts them on their own channel
      if (lay.ep > 1)
        for (const ParamSpec& q : units[u].params)
          if (q.role == ShardRole::kExpert) experts += double(shape_numel(q.shard));
      g.grad_bytes.push_back((unit_elems(units[u]) - experts) * opt.grad_wire_bytes);
      g.expert_bytes.push_back(experts * opt.grad_wire_bytes);
      g.elems += unit_elems(units[u]);
    }
    const bool has_embed = std::find(su.units.begin(), su.units.end(), 0) != su.units.end();
    const bool has_head = std::find(su.units.begin(), su.units.end(), L + 1) != su.units.end();
    if (has_head && !has_embed && m.tie_embeddings) g.elems += tied_copy_elems(units[0]);
    // Its messages to the neighbouring stages: on the pp link while the next slot runs (the walk
    // below delays a receiver until they have crossed), not in the passes.
    AxisCost& pa = g.axes["pp"];
    pa.bytes += (su.fwd_sends + su.bwd_sends) * p2p_bytes, pa.seconds += (su.fwd_sends + su.bwd_sends) * p2p_s;
    if (si) {
      UnitList all;
      for (size_t k = 0; k < su.units.size(); ++k) all.emplace_back(su.units[k], su.blocks[k]);
      g.co_s = co_executed(all, all, cached, fold);
    }
    return g;
  };
  // The last micro-batch's strands, the middle ones', the first's (M > 1; with M = 1 the last is the
  // first); without kept blocks `first` equals `folding`.
  // Under a pipeline (p > 1) every micro-batch is priced as the last; `first_unfolded`, the first's
  // strands so, with the kept gathers.
  std::vector<StageMb> stages, folding, first, first_unfolded;
  for (int s = 0; s < p; ++s) {
    stages.push_back(stage_mb(s, false, M > 1));
    folding.push_back(stage_mb(s, true, true));
    first.push_back(stage_mb(s, M > 1, false));
    first_unfolded.push_back(stage_mb(s, false, false));
  }
  // Strand Interleaving: a slot co-executes fwd(mb i) and bwd(mb i-1), pair by pair (co_executed:
  // both strands' compute shares one engine, both strands' collectives on a group its one channel;
  // measured: 3D x=2 z=2 on the emulated cluster, whose z channel carries 2.8 s of a 3.4-3.8 s step,
  // ran slower with SI). Without SI, a micro-batch's forward then its backward.
  auto slot_of = [&](const StageMb& g) { return si ? g.co_s : g.Ff + g.Bb; };
  // The pipeline's body (p > 1), walked slot by slot (simulate_slots) as the simulator walks it:
  // each pass as its chunk's units run it for its micro-batch (a forward after the step's first
  // binds the kept blocks, a backward before the step's last folds its reduce-scatters), a
  // co-executed slot's pairs as co_executed times them, each message a stage sends crossing the pp
  // link after the slot that made it while the next slot runs (one at a time per link), its
  // receiver's slot starting when it has crossed. (The bubble formulas this replaces held for
  // uniform stages, and the interleaved one for M a multiple of p only: with M = p + 1 and p = 8 the
  // walk is 31% longer; they also charged every message in its pass.) The walk runs the memory
  // walk's shortened schedule (walk_schedule: M mod p the same) and adds the rest at the rate of p
  // more micro-batches (the steady state); each stage's busy seconds likewise. With stages sharing
  // a core, the body is the most of that and the core's work at the core's whole rate (the programs
  // are priced at core_share of it).
  // Per stage: when its last pass ends (its body: the tail and optimizer follow it; the last stage
  // is done with its passes before the first drains), its passes' seconds, the body less them.
  std::vector<double> stage_end(static_cast<size_t>(p), 0.0), stage_busy(static_cast<size_t>(p), 0.0),
      stage_bubble(static_cast<size_t>(p), 0.0);
  ScheduleTimeline walk;  // the shortened schedule's timeline (readiness_of reads its last slots)
  if (p > 1) {
    std::map<int, UnitList> chunk_units;  // chunk -> its units and their block variants, in forward order
    for (int s = 0; s < p; ++s) {
      const StageUnits& su = placed[static_cast<size_t>(s)];
      size_t k = 0;
      for (int c : sch.chunks_of(s))
        for (int i = 0; i < sch.chunks[static_cast<size_t>(c)].size(); ++i, ++k)
          chunk_units[c].emplace_back(su.units[k], su.blocks[k]);
    }
    std::map<std::tuple<int, bool, bool>, double> alone;                // (chunk, forward?, variant) -> span
    std::map<std::tuple<int, int, bool, bool>, double> together;        // (fwd chunk, bwd chunk, cached, fold)
    auto lone = [&](int c, bool forward, bool variant) {
      auto [it, fresh] = alone.try_emplace({c, forward, variant}, 0.0);
      if (fresh)
        for (const auto& [u, bname] : chunk_units.at(c)) {
          const UnitTimes& t = unit_times(u, bname, !forward && variant, forward && variant);
          it->second += forward ? t.fwd.span_s : t.bwd.span_s;
        }
      return it->second;
    };
    auto cost_of = [&](int last) -> SlotCost {  // `last`: the walked schedule's last micro-batch
      return [&, last](int, int, const Slot& sl) {
        const bool cached = sl.fwd.active() && sl.fwd.mb > 0, fold = sl.bwd.active() && sl.bwd.mb != last;
        if (!si || !sl.fwd.active() || !sl.bwd.active())
          return (sl.fwd.active() ? lone(sl.fwd.chunk, true, cached) : 0.0) +
                 (sl.bwd.active() ? lone(sl.bwd.chunk, false, fold) : 0.0);
        auto [it, fresh] = together.try_emplace({sl.fwd.chunk, sl.bwd.chunk, cached, fold}, 0.0);
        if (fresh) it->second = co_executed(chunk_units.at(sl.fwd.chunk), chunk_units.at(sl.bwd.chunk), cached, fold);
        return it->second;
      };
    };
    const TransferCost link = [&](const Transfer&) { return p2p_s; };
    walk = simulate_slots(sch, cost_of(sch.micro_batches - 1), link);
    stage_busy = walk.busy;
    for (int s = 0; s < p; ++s) stage_end[s] = walk.ranks[s].empty() ? 0.0 : walk.ranks[s].back().end;
    if (M > sch.micro_batches) {
      // The steady rate: what p more micro-batches add to the walk (the warm-up's and drain's lone
      // passes, which cost more than co-executed pairs, stay in the walk's own makespan). M less the
      // walk's count is a multiple of p (walk_micro_batches keeps M mod p).
      PipelineSpec longer = spec;
      longer.micro_batches = sch.micro_batches + p;
      const ScheduleTimeline more = simulate_slots(make_schedule(longer), cost_of(longer.micro_batches - 1), link);
      const double times = double(M - sch.micro_batches) / p;
      for (int s = 0; s < p; ++s) {
        const double more_end = more.ranks[s].empty() ? 0.0 : more.ranks[s].back().end;
        stage_end[s] += times * (more_end - stage_end[s]);  // (stage_end: the walk's, so far)
        stage_busy[s] += times * (more.busy[s] - walk.busy[s]);
      }
    }
    for (int s = 0; s < p; ++s) stage_bubble[s] = std::max(0.0, stage_end[s] - stage_busy[s]);
    if (stages_per_core > 1) {
      double core_work = 0;  // the busiest core's stages, consecutive stages of the pipeline
      for (int s0 = 0; s0 < p; s0 += stages_per_core) {
        double w = 0;
        for (int s = s0; s < std::min(p, s0 + stages_per_core); ++s) w += stage_busy[s];
        core_work = std::max(core_work, w);
      }
      const double body = std::max(core_work, *std::max_element(stage_end.begin(), stage_end.end())) * cluster.core_share;
      std::fill(stage_end.begin(), stage_end.end(), body);
      std::fill(stage_bubble.begin(), stage_bubble.end(), body - core_work * cluster.core_share);
    }
  }
  auto scale_of = [&](const StageMb& x) {  // SI's share of a micro-batch's exposed time left exposed
    const double own = x.Ff + x.Bb - x.Cf - x.Cb;
    return own > 0 ? (slot_of(x) - x.Cf - x.Cb) / own : 0.0;
  };

  // When the stage's gradients are ready for the data-parallel tail: its last backward pass, on a
  // clock ending when the stage's last backward ends. One chunk: one pass over its units, the last
  // unit first (readiness_after). Several (the W, interleaved): each chunk's backward of the step's
  // last micro-batch ends as many seconds before the stage's last as the walk says (its slots' end
  // times; the shortened walk ends as the whole step does), its units in turn within its pass.
  auto readiness_of = [&](int s, const StageMb& g) {
    const std::vector<int> chunks = sch.chunks_of(s);
    if (chunks.size() == 1) return readiness_after(g.bwd_span);
    std::map<int, size_t> first;  // chunk -> its first unit's index in the stage's units
    std::map<int, double> cb;     // chunk -> the last micro-batch's backward seconds
    for (size_t k = 0; int c : chunks) {
      first[c] = k;
      for (int i = 0; i < sch.chunks[static_cast<size_t>(c)].size(); ++i, ++k) cb[c] += g.bwd_span[k];
    }
    const std::vector<Slot>& slots = sch.ranks[static_cast<size_t>(s)];
    const std::vector<SlotTime>& times = walk.ranks[static_cast<size_t>(s)];
    std::map<int, double> end;  // chunk -> when its last backward ends
    for (size_t i = 0; i < slots.size(); ++i)
      if (slots[i].bwd.active() && slots[i].bwd.mb == sch.micro_batches - 1) end[slots[i].bwd.chunk] = times[i].end;
    GradReadiness rd;
    rd.ready_s.assign(g.bwd_span.size(), 0.0);
    double last = 0;
    for (int c : chunks) last = std::max(last, end.at(c));
    for (int c : chunks) rd.end_s = std::max(rd.end_s, last - end.at(c) + cb[c]);
    for (int c : chunks) {
      double t_unit = rd.end_s - (last - end.at(c)) - cb[c];  // the chunk's backward starts here, its last unit first
      for (size_t k = first[c] + static_cast<size_t>(sch.chunks[static_cast<size_t>(c)].size()); k-- > first[c];)
        rd.ready_s[k] = t_unit += g.bwd_span[k];
    }
    return rd;
  };
  for (int s = 0; s < p; ++s)  // a micro-batch's seconds on each stage (p = 1: as its slot prices it)
    r.stage_mb_s.push_back(p > 1 ? stage_busy[s] / double(M) : slot_of(stages[s]));
  r.stages_per_core = stages_per_core;
  double worst = -1;
  for (int s = 0; s < p; ++s) {
    StepPrediction st = r;
    st.axes.clear(), st.bubble_s = 0;
    const std::vector<int>& mine = placed[static_cast<size_t>(s)].units;
    const StageMb& g = stages[s];
    const StageMb& gf = folding[s];
    const double Ff = g.Ff, Bb = g.Bb, Cf = g.Cf, Cb = g.Cb, elems = g.elems;
    const std::map<std::string, AxisCost>& axes_mb = g.axes;
    const double slot = slot_of(g);
    const double own_exposed = Ff + Bb - Cf - Cb;
    const double si_scale = own_exposed > 0 ? (slot - Cf - Cb) / own_exposed : 0.0;
    double body = 0;
    if (p == 1) {
      // The last micro-batch as written; the M - 1 before it with their z reduce-scatters folded, the
      // first of them gathering the kept weight blocks for the step. Under SI, as the simulator runs
      // it: the first forward alone (gathering the kept blocks), M - 1 slots of a forward (kept
      // blocks bound) beside the backward before it (folded), the last backward alone.
      const StageMb& g1 = first[s];
      const double middle = M > 1 ? double(M - 2) : 0.0, firsts = M > 1 ? 1.0 : 0.0;
      body = !si    ? Ff + Bb + middle * (gf.Ff + gf.Bb) + firsts * (g1.Ff + g1.Bb)
             : M > 1 ? first_unfolded[s].Ff + Bb + double(M - 1) * slot_of(gf)
                     : Ff + Bb;
      add_axes(st.axes, axes_mb, 1);
      add_axes(st.axes, gf.axes, middle, si ? scale_of(gf) : 1.0);
      add_axes(st.axes, g1.axes, firsts, si ? scale_of(g1) : 1.0);
    } else {
      // The walked body; the axes: every micro-batch as the last (its reduce-scatters not folded),
      // the first also gathering the kept blocks: their bytes and channel time once.
      body = stage_end[s];
      st.bubble_s = stage_bubble[s];
      add_axes(st.axes, axes_mb, double(M - 1), si ? si_scale : 1.0);
      const StageMb& g1 = M > 1 ? first_unfolded[s] : g;
      add_axes(st.axes, g1.axes, 1.0, si ? scale_of(g1) : 1.0);
    }
    st.compute_s = p == 1 ? double(M - 1) * (gf.Cf + gf.Cb) + Cf + Cb : double(M) * (Cf + Cb);
    const GradReadiness rd = readiness_of(s, g);
    std::vector<double> grad_bytes = g.grad_bytes;
    std::optional<SparseEmbedTail> sparse;  // the last backward starts at 0 on the readiness clock
    if (sparse_embedding_applies(m, lay, batch, opt.sparse_embed))
      sparse = sparse_embed_tail(m, lay, batch, units, mine, rd, 0.0, grad_bytes, opt.grad_wire_bytes);
    const double tail = gradient_tail(lay, groups, units, mine, rd, grad_bytes, g.expert_bytes, elems, elem, opt.zero,
                                      st.axes, nullptr, sparse ? &*sparse : nullptr);
    const double optimizer_s = optimizer_time(elems, lay.dp, opt.zero, opt.precision, cluster);
    st.compute_s += optimizer_s, st.optimizer_s = optimizer_s;
    st.step_s = body + tail + optimizer_s;
    st.exposed_comm_s = st.step_s - st.compute_s - st.bubble_s;
    // The slowest stage sets the step.
    if (st.step_s > worst) r = st, worst = st.step_s;
  }
  r.memory = worst_of(
      stage_memory_of(m, plain, progs, units, batch, opt.precision, opt.zero, sch, &notes));
  r.notes = notes;
  std::vector<std::pair<std::string, const UnitTimes*>> strands = {{"embed", &embed}, {"head", &head}};
  for (const auto& [name, t] : block_of) strands.emplace_back(name, &t);  // "block" and its variants
  for (const auto& [unit, t] : strands) {
    r.strands[unit + " fwd"] = t->fwd.ops;
    r.strands[unit + " bwd"] = t->bwd.ops;
  }
  for (auto it = r.axes.begin(); it != r.axes.end();) it = it->second.bytes > 0 ? std::next(it) : r.axes.erase(it);
  check_fits(r, cluster);
  if (io.compute_slowdown > 1 || io.comm_slowdown > 1) {
    PredictOptions none = opt;
    none.compute_slowdown = none.comm_slowdown = 1;
    const StepPrediction without = predict(m, lay, batch, cluster, none);
    r.interference_s = std::max(0.0, r.step_s - without.step_s);
    // What lengthens the pipeline's bubble stays in bubble_s; the rest came into exposed_comm_s.
    const double in_bubble = std::clamp(r.bubble_s - without.bubble_s, 0.0, r.interference_s);
    r.exposed_comm_s = std::max(0.0, r.exposed_comm_s - (r.interference_s - in_bubble));
  }
  return r;
}

namespace {

// 3D grids the programs do not write yet: the corrected AxoNN closed form for communication, the
// single-rank programs' compute divided over the grid (GEMMs over Gx·Gy, attention over its Gy
// heads, the other ops over Gx), AxoNN's overlaps as closed rules:
//   forward all-reduces exposed; backward input-gradient all-reduces under the weight-gradient
//   GEMMs (OAR); z all-gathers and reduce-scatters under all compute (OAG, ORS); data as dp_exposed.
StepPrediction predict_closed_form(const ModelConfig& m, const LayoutConfig& lay, const BatchSpec& batch,
                                   const ClusterPreset& cluster, const PredictOptions& opt, StepPrediction r) {
  r.pricer = PricerKind::kClosedForm3D;
  const double elem = element_bytes(opt.precision);
  const DeviceRates rates = device_rates(cluster, opt.precision, opt.gemm_timer);
  LayoutConfig one;  // the single-rank programs
  const ModelPrograms progs = build_programs(m, one, {batch.micro_batch, batch.seq});
  const double gx = lay.tp_x, gy = lay.tp_y, gxy = gx * gy;
  auto divided = [&](const std::vector<Op>& ops, double& gemm_wgrad) {
    double t = 0;
    for (const Op& op : ops) {
      const bool gemm = op.code.starts_with("linear");
      const double share = gemm ? gxy : op.code.starts_with("attention") ? gy : gx;
      const double c = op_time(op, {}, rates) / share;
      if (op.code == "linear_wgrad") gemm_wgrad += c;
      t += c;
    }
    return t;
  };
  const int64_t M = r.micro_batches, L = m.n_layers;
  double wg_block = 0, wg_other = 0;
  const double bf = divided(progs.block.fwd, wg_other), bb = divided(progs.block.bwd, wg_block);
  const double ef = divided(progs.embed.fwd, wg_other), eb = divided(progs.embed.bwd, wg_other);
  const double hf = divided(progs.head.fwd, wg_other), hb = divided(progs.head.bwd, wg_other);
  r.compute_s = double(M) * (ef + eb + hf + hb + double(L) * (bf + bb));

  const AxonnGrid grid{lay.tp_x, lay.tp_y, lay.tp_z, lay.dp};
  const AxonnShape shape{m.d_model, m.n_layers, batch.seq, batch.global_batch, M};
  const AxonnComm c = axonn_comm(shape, grid, cluster, {AxonnMode::kCorrected, int(elem), Recompute::kNone});
  auto secs = [&](double bytes, int ip, int g) { return g <= 1 ? 0.0 : bytes / placement_link(cluster, ip, g).bandwidth; };
  const double fx = secs(c.fwd_x, 1, lay.tp_x), bx = secs(c.bwd_x, 1, lay.tp_x);
  const double fy = secs(c.fwd_y, lay.tp_x, lay.tp_y), by = secs(c.bwd_y, lay.tp_x, lay.tp_y);
  const double wgrad_all = double(M * L) * wg_block;
  const double bwd_hidden = std::min(bx + by, wgrad_all);
  const double bwd_share = bx + by > 0 ? (bx + by - bwd_hidden) / (bx + by) : 0;
  r.axes["x"] = {c.bytes_x(), c.x_s, fx + bx * bwd_share};
  r.axes["y"] = {c.bytes_y(), c.y_s, fy + by * bwd_share};
  r.axes["z"] = {c.bytes_z(), c.z_s, std::max(0.0, c.z_s - r.compute_s)};
  for (auto it = r.axes.begin(); it != r.axes.end();) it = it->second.bytes > 0 ? std::next(it) : r.axes.erase(it);

  // Parameter shards by hand (AxoNN §2.2): block weights over Gx·Gy·Gz, norms over Gx, the
  // vocabulary over the x-y plane.
  const std::vector<UnitSpec> units = model_units(m, one, 0);
  const double gxyz = gxy * lay.tp_z;
  std::vector<double> bwd_span, grad_bytes;
  double elems = 0, biggest = 0;
  for (const UnitSpec& u : units) {
    double n = 0;
    for (const ParamSpec& q : u.params) {
      const double full = double(shape_numel(q.full));
      const bool matrix = q.full.size() == 2;
      if (u.kind == "block" && matrix) biggest = std::max(biggest, full / gxy);
      n += !matrix ? full / gx : u.kind == "block" ? full / gxyz : full / gxy;
    }
    elems += n;
    grad_bytes.push_back(n * opt.grad_wire_bytes);
    bwd_span.push_back(u.kind == "embed" ? eb : u.kind == "head" ? hb : bb);
  }
  const GroupLink dp{lay.dp, placement_link(cluster, lay.tp_x * lay.tp_y * lay.tp_z, lay.dp)};
  double tail = dp_exposed(bwd_span, grad_bytes, dp, opt.zero, r.axes["dp"]);
  if (r.axes["dp"].bytes == 0) r.axes.erase("dp");
  double exposed = tail;
  for (const auto& [g, a] : r.axes)
    if (g != "dp") exposed += a.exposed_s;
  r.optimizer_s = optimizer_time(elems, lay.dp, opt.zero, opt.precision, cluster);
  r.compute_s += r.optimizer_s;
  r.step_s = r.compute_s + exposed;
  r.exposed_comm_s = exposed;
  add_states(r.memory, elems, elem, lay.dp, opt.zero);
  r.memory.gathered = 2 * biggest * elem;
  ActDims d = act_dims(m, lay, batch);
  std::vector<std::string> notes;
  r.memory.activations = double(L) * saved_bytes(progs.block, d, elem, notes) + saved_bytes(progs.head, d, elem, notes) +
                         (opt.si == StrandInterleaving::kOn ? saved_bytes(progs.block, d, elem, notes) : 0) +
                         recompute_bytes(progs.block, d, elem, notes);
  r.notes = notes;
  r.notes.push_back("3D grid priced by the corrected AxoNN closed form (the layer programs do not write 3D ops yet); "
                    "GEMMs as GPT's four (K = 3, 1, 4, 4), no recompute; Strand Interleaving not modelled");
  check_fits(r, cluster);
  return r;
}

}  // namespace

}  // namespace dhelix
