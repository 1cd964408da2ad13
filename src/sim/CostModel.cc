// Analytical block prices: roofline compute, ring collectives, executor-order replay.
#include "sim/CostModel.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "base/Error.h"

namespace dhelix {

using nlohmann::json;

void CostModelConfig::validate() const {
  auto positive = [&](double v, const char* field) {
    DHX_CHECK(std::isfinite(v) && v > 0, ConfigError, "cost model '{}': {}={} must be > 0", name,
              field, v);
  };
  positive(flop_rate, "flop_rate");
  positive(mem_bw, "mem_bw");
  positive(element_bytes, "element_bytes");
  DHX_CHECK(op_overhead_s >= 0 && block_overhead_s >= 0, ConfigError,
            "cost model '{}': op_overhead_s={} block_overhead_s={} must be >= 0", name,
            op_overhead_s, block_overhead_s);
  DHX_CHECK(overlap_slowdown >= 1 && comm_comm_slowdown >= 1, ConfigError,
            "cost model '{}': overlap_slowdown={} comm_comm_slowdown={} must be >= 1", name,
            overlap_slowdown, comm_comm_slowdown);
  for (auto& [role, l] : links)
    DHX_CHECK(l.bandwidth > 0 && l.latency >= 0, ConfigError,
              "cost model '{}': link '{}' bandwidth={} latency={} (need bandwidth > 0, "
              "latency >= 0)",
              name, role, l.bandwidth, l.latency);
  DHX_CHECK(tiling.units >= 0 && (tiling.units == 0 || (tiling.tile_m > 0 && tiling.tile_n > 0)), ConfigError,
            "cost model '{}': gemm_units={} needs gemm_tile [tm, tn] > 0 (got [{}, {}])", name, tiling.units,
            tiling.tile_m, tiling.tile_n);
  for (auto& [role, n] : group_sizes)
    DHX_CHECK(n >= 1, ConfigError, "cost model '{}': group_sizes.{}={} must be >= 1", name, role,
              n);
  DHX_CHECK(std::isfinite(attention.fwd) && std::isfinite(attention.bwd) && attention.fwd >= 0 && attention.bwd >= 0,
            ConfigError, "cost model '{}': attention_rate={} attention_bwd_rate={} must be >= 0 (0: flop_rate)", name,
            attention.fwd, attention.bwd);
}

json CostModelConfig::to_json() const {
  json l = json::object(), g = json::object();
  for (auto& [role, s] : links) {
    l[role] = {{"bandwidth", s.bandwidth}, {"latency", s.latency}};
    if (s.min_op_s > 0) l[role]["min_op_s"] = s.min_op_s;
    if (s.tree_allreduce) l[role]["tree_allreduce"] = true;
  }
  for (auto& [role, n] : group_sizes) g[role] = n;
  return {{"name", name},
          {"flop_rate", flop_rate},
          {"mem_bw", mem_bw},
          {"op_overhead_s", op_overhead_s},
          {"block_overhead_s", block_overhead_s},
          {"overlap_slowdown", overlap_slowdown},
          {"comm_comm_slowdown", comm_comm_slowdown},
          {"element_bytes", element_bytes},
          {"gemm_units", tiling.units},
          {"gemm_tile", {tiling.tile_m, tiling.tile_n}},
          {"attention_rate", attention.fwd},
          {"attention_bwd_rate", attention.bwd},
          {"links", l},
          {"group_sizes", g}};
}

CostModelConfig CostModelConfig::from_json(const json& j, const std::string& origin) {
  DHX_CHECK(j.is_object(), ConfigError, "{}: a cost model must be a JSON object", origin);
  CostModelConfig c;
  try {
    DHX_CHECK(!j.contains("preset"), ConfigError,
              "{}: \"preset\" is gone from cost-model files: give the figures, or pass a cluster preset "
              "(configs/clusters/*.toml) to --cost-model instead of the file", origin);
    c.name = j.value("name", c.name);
    c.flop_rate = j.value("flop_rate", c.flop_rate);
    c.mem_bw = j.value("mem_bw", c.mem_bw);
    c.op_overhead_s = j.value("op_overhead_s", c.op_overhead_s);
    c.block_overhead_s = j.value("block_overhead_s", c.block_overhead_s);
    c.overlap_slowdown = j.value("overlap_slowdown", c.overlap_slowdown);
    c.comm_comm_slowdown = j.value("comm_comm_slowdown", c.comm_comm_slowdown);
    c.element_bytes = j.value("element_bytes", c.element_bytes);
    c.tiling.units = j.value("gemm_units", 0);
    c.attention.fwd = j.value("attention_rate", 0.0);
    c.attention.bwd = j.value("attention_bwd_rate", 0.0);
    if (j.contains("gemm_tile"))
      c.tiling.tile_m = j.at("gemm_tile").at(0).get<int64_t>(), c.tiling.tile_n = j.at("gemm_tile").at(1).get<int64_t>();
    if (j.contains("links"))
      for (auto& [role, l] : j.at("links").items())
        c.links[role] = {l.at("bandwidth").get<double>(), l.value("latency", 0.0), l.value("min_op_s", 0.0),
                         l.value("tree_allreduce", false)};
    if (j.contains("group_sizes"))
      for (auto& [role, n] : j.at("group_sizes").items()) c.group_sizes[role] = n.get<int>();
  } catch (const json::exception& e) {
    throw ConfigError(fmt::format("{}: malformed cost model: {}", origin, e.what()));
  }
  c.validate();
  return c;
}

double CostModel::collective_time(CollOp coll, double bytes, int n, const LinkSpec& link) {
  if (n <= 1) return 0;
  const double steps = n - 1;
  const double ring = steps / n * bytes / link.bandwidth + steps * link.latency;
  switch (coll) {
    case CollOp::kAllGather:
    case CollOp::kReduceScatter:
    case CollOp::kAllToAll: return std::max(link.min_op_s, ring);
    case CollOp::kAllReduce: {
      double t = 2 * ring;
      if (link.tree_allreduce)
        t = std::min(t, 2 * bytes / link.bandwidth + 2 * std::ceil(std::log2(double(n))) * link.latency);
      return std::max(link.min_op_s, t);
    }
    case CollOp::kBroadcast: return std::max(link.min_op_s, bytes / link.bandwidth + steps * link.latency);
    case CollOp::kSendRecv: return bytes / link.bandwidth + link.latency;
    case CollOp::kNone: break;
  }
  throw InternalError(fmt::format("collective_time: not a collective ({})", coll_op_name(coll)));
}

double GemmTiling::efficiency(int64_t m, int64_t n, int64_t groups) const {
  if (units <= 0 || m <= 0 || n <= 0) return 1.0;
  const int64_t tiles = std::max<int64_t>(1, groups) * ((m + tile_m - 1) / tile_m) * ((n + tile_n - 1) / tile_n);
  const int64_t waves = (tiles + units - 1) / units;
  return double(std::max<int64_t>(1, groups)) * double(m) * double(n) / (double(tiles) * double(tile_m * tile_n)) *
         double(tiles) / double(waves * units);
}

double compute_seconds(const Op& op, double gemm_rate, double mem_bw, double byte_scale, const GemmTiling& tiling,
                       const AttentionRates& attention) {
  double rate = gemm_rate;
  // (The code is compared only when a rate is given: this runs for every op of every simulated
  // pair, millions of times in a profile's interference fit.)
  if (attention.fwd > 0 || attention.bwd > 0) {
    if ((op.code == "attention" || op.code == "ring_attention") && attention.fwd > 0) rate = attention.fwd;
    if ((op.code == "attention_bwd" || op.code == "ring_attention_bwd") && attention.bwd > 0) rate = attention.bwd;
  }
  if (op.attrs.count("gemm_rows")) {
    // C is [rows, out], or [in, out] for a weight gradient (the gemm_* attrs of sharding/OpFactory.h's
    // gemm_cost); a grouped GEMM (the experts') launches the tiles of flops / (2 rows in out) such
    // GEMMs at once.
    const int64_t rows = op.attrs.at("gemm_rows"), out = op.attrs.at("gemm_out");
    rate *= tiling.efficiency(op.code.ends_with("wgrad") ? op.attrs.at("gemm_in") : rows, out, gemm_groups(op));
  }
  return std::max(op.cost.flops / rate, byte_scale * op.cost.bytes / mem_bw);
}

int64_t gemm_groups(const Op& op) {
  if (!op.attrs.count("gemm_rows")) return 1;
  const double one = 2.0 * double(op.attrs.at("gemm_rows")) * double(op.attrs.at("gemm_in")) * double(op.attrs.at("gemm_out"));
  return one > 0 ? std::max<int64_t>(1, std::llround(op.cost.flops / one)) : 1;
}

CostModel::CostModel(const LayerProgram& prog, CostModelConfig cfg) : cfg_(std::move(cfg)) {
  cfg_.validate();
  std::map<std::string, int> group_index;
  const double scale = cfg_.element_bytes / 4.0;  // the programs count fp32 elements
  auto price = [&](const std::vector<Op>& ops, const char* sname) {
    std::vector<OpTime> out;
    for (const Op& op : ops) {
      if (!op.is_collective()) {
        out.push_back(
            {cfg_.op_overhead_s + compute_seconds(op, cfg_.flop_rate, cfg_.mem_bw, scale, cfg_.tiling, cfg_.attention),
             -1});
        continue;
      }
      auto link = cfg_.links.find(op.group);
      if (link == cfg_.links.end()) link = cfg_.links.find("default");
      DHX_CHECK(link != cfg_.links.end(), ConfigError,
                "cost model '{}': no link for group '{}' of {} op '{}' (and no 'default')",
                cfg_.name, op.group, sname, op.name);
      int n = 0;
      if (auto a = op.attrs.find("group_size"); a != op.attrs.end()) {
        n = static_cast<int>(a->second);
      } else {
        auto g = cfg_.group_sizes.find(op.group);
        DHX_CHECK(g != cfg_.group_sizes.end(), ConfigError,
                  "cost model '{}': size of group '{}' unknown for {} op '{}' (set "
                  "group_sizes.{} or the op's attrs[\"group_size\"])",
                  cfg_.name, op.group, sname, op.name, op.group);
        n = g->second;
      }
      auto [it, fresh] = group_index.emplace(op.group, static_cast<int>(group_index.size()));
      double t = collective_time(op.coll, scale * op.cost.comm_bytes, n, link->second);
      out.push_back({cfg_.op_overhead_s + t, it->second});
    }
    return out;
  };
  fwd_ = price(prog.fwd, "fwd");
  bwd_ = price(prog.bwd, "bwd");
  num_groups_ = static_cast<int>(group_index.size());
}

double CostModel::op_time(StrandKind strand, int i) const {
  const auto& v = strand == StrandKind::kForward ? fwd_ : bwd_;
  DHX_ASSERT(i >= 0 && i < static_cast<int>(v.size()), "op {} of {}", i, v.size());
  return v[i].t;
}

// Replays the issue order: `first` strand's window [a,b), then `second`'s [c,d). Timeline of a
// compute ∥ comm block (fwd collective, bwd compute queued first):
//   comm[tp]: |==== fwd all_gather ====|
//   engine:   |== bwd dgrad ==|== bwd wgrad ==|        -> makespan = max(M, C)
double CostModel::makespan(const std::vector<OpTime>* first, int a, int b,
                           const std::vector<OpTime>* second, int c, int d) const {
  std::vector<double> channel_free(num_groups_, 0.0);
  double engine_free = 0, end = 0;
  auto run = [&](const std::vector<OpTime>* ops, int lo, int hi) {
    double ready = 0;  // the strand's previous op has finished
    for (int i = lo; i < hi; ++i) {
      const OpTime& op = (*ops)[i];
      double& resource = op.group < 0 ? engine_free : channel_free[op.group];
      double start = std::max(ready, resource);
      ready = resource = start + op.t;
    }
    end = std::max(end, ready);
  };
  if (first) run(first, a, b);
  if (second) run(second, c, d);
  return end;
}

double CostModel::solo_fwd(int a, int b) const {
  return makespan(&fwd_, a, b, nullptr, 0, 0) + cfg_.block_overhead_s;
}

double CostModel::solo_bwd(int c, int d) const {
  return makespan(&bwd_, c, d, nullptr, 0, 0) + cfg_.block_overhead_s;
}

double CostModel::pair(int a, int b, int c, int d) const {
  auto has = [](const std::vector<OpTime>& ops, int lo, int hi, bool want_comm) {
    for (int i = lo; i < hi; ++i)
      if ((ops[i].group >= 0) == want_comm) return true;
    return false;
  };
  // Two collectives of one group cannot share a block: the executor would reject it.
  for (int i = a; i < b; ++i)
    for (int j = c; j < d; ++j)
      if (fwd_[i].group >= 0 && fwd_[i].group == bwd_[j].group) return kNoCost;
  const bool f_comm = has(fwd_, a, b, true), b_comm = has(bwd_, c, d, true);
  const bool f_comp = has(fwd_, a, b, false), b_comp = has(bwd_, c, d, false);
  // How this approximates plan/IssueOrder (the executor's and PairSim's order): it prices the
  // block as two FIFO lanes (engine, channels) without issuing leading collectives ahead, without
  // carried-in ops (SIPlan::carry is priced by PairSim and the step simulator, not here), and with
  // "waits" read as "has a collective"; so ties (both strands or neither have one) queue the forward
  // strand first where IssueOrder runs the backward first. With neither, the makespan is the same
  // sum either way; with both, the additive model's slowdown factor is what the search prices.
  const bool bwd_first = f_comm && !b_comm;
  double t = bwd_first ? makespan(&bwd_, c, d, &fwd_, a, b) : makespan(&fwd_, a, b, &bwd_, c, d);
  if ((f_comm && b_comp) || (b_comm && f_comp))
    t *= cfg_.overlap_slowdown;
  else if (f_comm && b_comm)
    t *= cfg_.comm_comm_slowdown;
  return t + cfg_.block_overhead_s;
}

}  // namespace dhelix
