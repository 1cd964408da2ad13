// Cluster presets from TOML files, where they are looked up, and the placement rule for a group's
// bandwidth.
#include "sim/ClusterPreset.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <set>
#include <toml++/toml.h>

#include "base/Error.h"
#include "base/Files.h"

namespace dhelix {

namespace fs = std::filesystem;

const char* precision_name(Precision p) { return p == Precision::kFp32 ? "fp32" : "bf16"; }
int element_bytes(Precision p) { return p == Precision::kFp32 ? 4 : 2; }

double ClusterPreset::gemm_rate(Precision p) const {
  const double measured = p == Precision::kFp32 ? gemm_flops_fp32 : gemm_flops_bf16;
  if (measured > 0) return measured;
  const double peak = p == Precision::kFp32 ? peak_flops_fp32 : peak_flops_bf16;
  DHX_CHECK(peak > 0, ConfigError,
            "cluster '{}' ({}) has no {} figure: device.peak_flops_{} and device.gemm_flops_{} are absent\n"
            "hint: use --precision {} or add the figure to the preset",
            name, origin, precision_name(p), precision_name(p), precision_name(p),
            p == Precision::kFp32 ? "bf16" : "fp32");
  DHX_CHECK(gemm_efficiency > 0, ConfigError,
            "cluster '{}' ({}): device.gemm_flops_{} is absent, so device.gemm_efficiency is needed "
            "(the fraction of peak a GEMM reaches)",
            name, origin, precision_name(p));
  return peak * gemm_efficiency;
}

AttentionRates ClusterPreset::attention_rates(Precision p) const {
  if (attention_efficiency <= 0) return {};
  const double peak = peak_flops(p);
  return {peak * attention_efficiency, peak * (attention_bwd_efficiency > 0 ? attention_bwd_efficiency : attention_efficiency)};
}

double ClusterPreset::peak_flops(Precision p) const {
  const double peak = p == Precision::kFp32 ? peak_flops_fp32 : peak_flops_bf16;
  DHX_CHECK(peak > 0, ConfigError, "cluster '{}' ({}) has no device.peak_flops_{}", name, origin, precision_name(p));
  return peak;
}

namespace {

// Reads the fields of one table, refusing unknown keys (a typo is an error, not a default).
class TableReader {
 public:
  TableReader(const toml::table& t, std::string section, const std::string& origin)
      : t_(t), section_(std::move(section)), origin_(origin) {}

  double number(const std::string& key, bool required, const char* hint) {
    seen_.insert(key);
    const toml::node* n = t_.get(key);
    if (!n) {
      DHX_CHECK(!required, ConfigError, "{}: missing field {}{}\nhint: {}", origin_, prefix(), key, hint);
      return 0;
    }
    std::optional<double> v = n->value<double>();  // integers convert too
    DHX_CHECK(v && std::isfinite(*v) && *v > 0, ConfigError,
              "{}: field {}{} must be a positive number, got {}\nhint: {}", origin_, prefix(), key,
              describe(*n), hint);
    return *v;
  }
  bool boolean(const std::string& key, const char* hint) {
    seen_.insert(key);
    const toml::node* n = t_.get(key);
    if (!n) return false;
    DHX_CHECK(n->is_boolean(), ConfigError, "{}: field {}{} must be true or false, got {}\nhint: {}", origin_, prefix(),
              key, describe(*n), hint);
    return *n->value<bool>();
  }
  int integer(const std::string& key, const char* hint) {
    seen_.insert(key);
    const toml::node* n = t_.get(key);
    DHX_CHECK(n, ConfigError, "{}: missing field {}{}\nhint: {}", origin_, prefix(), key, hint);
    std::optional<int64_t> v = n->is_integer() ? n->value<int64_t>() : std::nullopt;
    DHX_CHECK(v && *v >= 1 && *v <= (1 << 20), ConfigError,
              "{}: field {}{} must be a whole number >= 1, got {}\nhint: {}", origin_, prefix(), key,
              describe(*n), hint);
    return static_cast<int>(*v);
  }
  void mark(const std::string& key) { seen_.insert(key); }
  const toml::table& sub(const std::string& key) {
    seen_.insert(key);
    const toml::table* s = t_.get_as<toml::table>(key);
    DHX_CHECK(s, ConfigError, "{}: missing table [{}{}]\nhint: see configs/clusters/perlmutter-a100.toml", origin_,
              prefix(), key);
    return *s;
  }
  const toml::array* array(const std::string& key, const char* of) {
    seen_.insert(key);
    const toml::node* n = t_.get(key);
    if (!n) return nullptr;
    DHX_CHECK(n->is_array(), ConfigError, "{}: field {}{} must be an array of {}", origin_, prefix(), key, of);
    return n->as_array();
  }
  void no_unknown_keys() const {
    for (const auto& [k, v] : t_) {
      const std::string key(k.str());
      DHX_CHECK(seen_.count(key), ConfigError, "{}: unknown field {}{} (known: {})", origin_, prefix(), key,
                fmt::join(seen_, ", "));
    }
  }

 private:
  std::string prefix() const { return section_.empty() ? "" : section_ + "."; }
  static std::string describe(const toml::node& n) {
    if (auto s = n.value<std::string>()) return fmt::format("\"{}\"", *s);
    if (auto d = n.value<double>()) return fmt::format("{}", *d);
    return "a non-number";
  }
  const toml::table& t_;
  std::string section_;
  const std::string& origin_;
  std::set<std::string> seen_;
};

}  // namespace

ClusterPreset parse_cluster(const std::string& text, const std::string& origin) {
  toml::table root;
  try {
    root = toml::parse(text, origin);
  } catch (const toml::parse_error& e) {
    throw ConfigError(fmt::format("{}: not valid TOML: {} (line {})", origin, e.description(),
                                  e.source().begin.line));
  }
  ClusterPreset c;
  c.origin = origin;
  TableReader top(root, "", origin);
  if (const toml::node* n = root.get("name")) {
    auto s = n->value<std::string>();
    DHX_CHECK(s && !s->empty(), ConfigError, "{}: field name must be a non-empty string", origin);
    c.name = *s;
  } else {
    c.name = fs::path(origin).stem().string();
  }
  top.mark("name");
  TableReader dev(top.sub("device"), "device", origin);
  c.memory_bytes = dev.number("memory_bytes", true, "device memory one rank may use, in bytes");
  c.mem_bw = dev.number("mem_bw", true, "device memory bandwidth in bytes/s");
  c.peak_flops_fp32 = dev.number("peak_flops_fp32", true, "peak fp32 FLOP/s of one device (vendor spec)");
  c.peak_flops_bf16 = dev.number("peak_flops_bf16", false, "peak bf16 FLOP/s (dense)");
  c.gemm_efficiency = dev.number("gemm_efficiency", false, "fraction of peak a large GEMM reaches, in (0, 1]");
  c.attention_efficiency =
      dev.number("attention_efficiency", false, "fraction of peak causal attention's forward reaches, in (0, 1]");
  c.attention_bwd_efficiency =
      dev.number("attention_bwd_efficiency", false, "fraction of peak attention's backward reaches, in (0, 1]");
  c.gemm_flops_fp32 = dev.number("gemm_flops_fp32", false, "measured fp32 GEMM FLOP/s per device");
  c.gemm_flops_bf16 = dev.number("gemm_flops_bf16", false, "measured bf16 GEMM FLOP/s per device");
  c.core_share = dev.number("core_share", false, "share of one core each rank computes with (presets of this machine)");
  c.optimizer_elems_per_s = dev.number("optimizer_elems_per_s", false, "measured AdamW elements per second per device");
  for (auto [key, k] : {std::pair{"compute_slowdown", &c.compute_slowdown}, std::pair{"comm_slowdown", &c.comm_slowdown}}) {
    const double v = dev.number(key, false, "co-execution interference factor, >= 1 (1: none)");  // 0: absent
    DHX_CHECK(v == 0 || (v >= 1 && v <= 100), ConfigError,
              "{}: device.{}={} must be in [1, 100]\nhint: 1 is no interference; a measured figure is the fit "
              "`dhelix simulate --profile` prints", origin, key, v);
    if (v > 0) *k = v;
  }
  c.gemm_tiling.units = static_cast<int>(dev.number("gemm_units", false, "streaming multiprocessors a GEMM's tiles run on"));
  if (const toml::array* tile = dev.array("gemm_tile", "two integers [tm, tn]")) {
    DHX_CHECK(tile->size() == 2 && tile->get(0)->value<int64_t>() && tile->get(1)->value<int64_t>() &&
                  *tile->get(0)->value<int64_t>() > 0 && *tile->get(1)->value<int64_t>() > 0,
              ConfigError, "{}: device.gemm_tile must be two positive integers [tm, tn] (the GEMM's output tile)", origin);
    c.gemm_tiling.tile_m = *tile->get(0)->value<int64_t>(), c.gemm_tiling.tile_n = *tile->get(1)->value<int64_t>();
  }
  DHX_CHECK((c.gemm_tiling.units > 0) == (c.gemm_tiling.tile_m > 0), ConfigError,
            "{}: device.gemm_units ({}) and device.gemm_tile go together (give both or neither)\nhint: e.g. gemm_units = "
            "108 and gemm_tile = [256, 128] for an A100", origin, c.gemm_tiling.units);
  dev.no_unknown_keys();
  DHX_CHECK(c.gemm_efficiency <= 1, ConfigError, "{}: device.gemm_efficiency={} must be in (0, 1]", origin,
            c.gemm_efficiency);
  DHX_CHECK(c.attention_efficiency >= 0 && c.attention_efficiency <= 1 && c.attention_bwd_efficiency >= 0 &&
                c.attention_bwd_efficiency <= 1 && (c.attention_bwd_efficiency == 0 || c.attention_efficiency > 0),
            ConfigError,
            "{}: device.attention_efficiency={} and attention_bwd_efficiency={} must be in (0, 1] (the backward's "
            "only with the forward's)",
            origin, c.attention_efficiency, c.attention_bwd_efficiency);
  DHX_CHECK(c.gemm_efficiency > 0 || c.gemm_flops_fp32 > 0, ConfigError,
            "{}: missing field device.gemm_efficiency (or device.gemm_flops_fp32)\nhint: the fraction of peak a "
            "GEMM reaches, or a measured GEMM rate",
            origin);

  TableReader node(top.sub("node"), "node", origin);
  c.devices_per_node = node.integer("devices", "devices (ranks) per node");
  c.intra_node.bandwidth = node.number("intra_bw", true, "bus bandwidth of a collective inside a node, bytes/s");
  c.intra_node.latency = node.number("intra_latency", true, "seconds per ring step inside a node");
  c.inter_node.bandwidth = node.number("inter_bw", true, "per-node injection bandwidth across nodes, bytes/s");
  c.inter_node.latency = node.number("inter_latency", true, "seconds per ring step across nodes");
  c.inter_shared_min_op_s = node.number("inter_shared_min_op_s", false,
                                        "least seconds of a collective spanning nodes with several members on a node");
  c.intra_node.tree_allreduce = c.inter_node.tree_allreduce =
      node.boolean("allreduce_trees", "true where the collective library runs all-reduce as a ring or a double "
                                      "binary tree, whichever is faster (NCCL >= 2.4)");
  if (const toml::array* table = node.array("intra_table", "{ip, g, bw} tables")) {
    for (size_t i = 0; i < table->size(); ++i) {
      const toml::table* e = table->get(i)->as_table();
      DHX_CHECK(e, ConfigError, "{}: node.intra_table[{}] must be a table {{ip = .., g = .., bw = ..}}", origin, i);
      TableReader r(*e, fmt::format("node.intra_table[{}]", i), origin);
      IntraNodeEntry x;
      x.ip = r.integer("ip", "stride between the group's ranks");
      x.g = r.integer("g", "ranks in the group");
      x.bandwidth = r.number("bw", true, "bus bandwidth in bytes/s");
      r.no_unknown_keys();
      DHX_CHECK(x.ip * x.g <= c.devices_per_node, ConfigError,
                "{}: node.intra_table[{}] (ip={}, g={}) spans {} ranks, more than node.devices={}: the table holds "
                "patterns inside one node only",
                origin, i, x.ip, x.g, x.ip * x.g, c.devices_per_node);
      c.intra_table.push_back(x);
    }
  }
  node.no_unknown_keys();
  top.no_unknown_keys();
  return c;
}

std::vector<std::string> cluster_search_dirs(const std::string& clusters_dir) {
  if (!clusters_dir.empty()) return {clusters_dir};
  std::vector<std::string> dirs;
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) dirs.push_back((exe.parent_path().parent_path() / "configs" / "clusters").lexically_normal().string());
  dirs.push_back("configs/clusters");
  return dirs;
}

std::vector<std::string> cluster_names(const std::string& clusters_dir) {
  std::set<std::string> names;
  for (const std::string& d : cluster_search_dirs(clusters_dir)) {
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(d, ec))
      if (e.path().extension() == ".toml") names.insert(e.path().stem().string());
  }
  return {names.begin(), names.end()};
}

ClusterPreset load_cluster(const std::string& name_or_path, const std::string& clusters_dir) {
  const bool is_path = name_or_path.find('/') != std::string::npos ||
                       (name_or_path.size() > 5 && name_or_path.ends_with(".toml"));
  if (is_path) {
    DHX_CHECK(file_exists(name_or_path), ConfigError, "cluster file '{}' does not exist", name_or_path);
    return parse_cluster(read_file(name_or_path), name_or_path);
  }
  const std::vector<std::string> dirs = cluster_search_dirs(clusters_dir);
  for (const std::string& d : dirs) {
    const std::string path = (fs::path(d) / (name_or_path + ".toml")).string();
    if (file_exists(path)) return parse_cluster(read_file(path), path);
  }
  const std::vector<std::string> names = cluster_names(clusters_dir);
  throw ConfigError(fmt::format(
      "unknown cluster preset '{}' (looked for {}.toml in {}); known presets: {}\nhint: give a preset name, a "
      "path to a .toml file, or another presets directory (sim.clusters_dir; tune: --clusters-dir)",
      name_or_path, name_or_path, fmt::join(dirs, ", "), names.empty() ? "none found" : fmt::to_string(fmt::join(names, ", "))));
}

LinkSpec placement_link(const ClusterPreset& c, int ip, int g) {
  DHX_ASSERT(ip >= 1 && g >= 1, "placement_link(ip={}, g={})", ip, g);
  if (g <= 1) return c.intra_node;
  if (static_cast<int64_t>(ip) * g <= c.devices_per_node) {
    for (const IntraNodeEntry& e : c.intra_table)
      if (e.ip == ip && e.g == g) return {e.bandwidth, c.intra_node.latency, 0.0, c.intra_node.tree_allreduce};
    return c.intra_node;
  }
  return {c.inter_node.bandwidth / std::min(ip, c.devices_per_node), c.inter_node.latency,
          ip < c.devices_per_node ? c.inter_shared_min_op_s : 0.0, c.inter_node.tree_allreduce};
}

LinkSpec group_link(const ClusterPreset& c, const std::vector<int>& ranks, int world) {
  const int g = static_cast<int>(ranks.size());
  if (g <= 1) return c.intra_node;
  const int per = c.devices_per_node;
  std::map<int, int> members;  // node -> members of the group on it
  for (int r : ranks) ++members[r / per];
  if (members.size() == 1) {
    const int ip = std::abs(ranks[1] - ranks[0]);
    for (const IntraNodeEntry& e : c.intra_table)
      if (e.ip == ip && e.g == g) return {e.bandwidth, c.intra_node.latency, 0.0, c.intra_node.tree_allreduce};
    return c.intra_node;
  }
  const int node = ranks[0] / per;
  const int on_node = std::min(per, world - node * per);  // ranks of the world on that node
  const double sharing = std::max(1.0, static_cast<double>(on_node) / members[node]);
  return {c.inter_node.bandwidth / sharing, c.inter_node.latency, members[node] > 1 ? c.inter_shared_min_op_s : 0.0,
          c.inter_node.tree_allreduce};
}

}  // namespace dhelix
