// SI plan <-> JSON, with names mapped back to windows and the checker run on load.
#include "plan/PlanIO.h"

#include <fmt/format.h>

#include <cmath>
#include <limits>
#include <map>

#include "base/Error.h"
#include "base/Files.h"
#include "plan/PlanCheck.h"

namespace dhelix {

using nlohmann::json;

namespace {

json names_of(const std::vector<Op>& ops, int a, int b) {
  json arr = json::array();
  for (int i = a; i < b; ++i) arr.push_back(ops[i].name);
  return arr;
}

// Checks that the file's full op list for a strand equals the program's.
void check_op_list(const json& j, const char* key, const std::vector<Op>& ops,
                   const std::string& origin) {
  DHX_CHECK(j.contains(key) && j[key].is_array(), PlanError, "{}: missing array '{}'", origin,
            key);
  const json& arr = j[key];
  DHX_CHECK(arr.size() == ops.size(), PlanError,
            "{}: '{}' lists {} ops, the program has {} (plan made for another program? e.g. with the GEMM "
            "epilogues fused or not: training.fuse_epilogues, auto = on a GPU or a GPU's preset)", origin,
            key, arr.size(), ops.size());
  for (size_t i = 0; i < ops.size(); ++i)
    DHX_CHECK(arr[i].is_string() && arr[i].get<std::string>() == ops[i].name, PlanError,
              "{}: '{}'[{}] is {}, the program has '{}' (plan made for another program? e.g. with the GEMM "
              "epilogues fused or not: training.fuse_epilogues, auto = on a GPU or a GPU's preset)",
              origin, key, i, arr[i].dump(), ops[i].name);
}

// Maps a block's op names to a window: names must be known and consecutive in program order.
void window_from_names(const json& names, const std::map<std::string, int>& index,
                       const std::vector<Op>& ops, int block, const char* sname,
                       const std::string& origin, int& begin, int& end) {
  begin = end = 0;
  if (names.is_null()) return;
  DHX_CHECK(names.is_array(), PlanError, "{}: block {}: '{}' must be an array of op names",
            origin, block, sname);
  if (names.empty()) return;
  int prev = -1;
  for (size_t p = 0; p < names.size(); ++p) {
    DHX_CHECK(names[p].is_string(), PlanError, "{}: block {}: {} entry {} is not a string",
              origin, block, sname, names[p].dump());
    std::string name = names[p].get<std::string>();
    auto it = index.find(name);
    DHX_CHECK(it != index.end(), PlanError, "{}: block {}: unknown {} op '{}'", origin, block,
              sname, name);
    DHX_CHECK(p == 0 || it->second == prev + 1, PlanError,
              "{}: block {}: {} op '{}' (#{}) does not follow '{}' (#{}); a block's ops must be "
              "a contiguous run in program order",
              origin, block, sname, name, it->second, ops[prev].name, prev);
    if (p == 0) begin = it->second;
    prev = it->second;
  }
  end = prev + 1;
}

std::map<std::string, int> index_of(const std::vector<Op>& ops) {
  std::map<std::string, int> m;
  for (size_t i = 0; i < ops.size(); ++i) m.emplace(ops[i].name, static_cast<int>(i));
  return m;
}

}  // namespace

json plan_to_json(const SIPlan& plan, const LayerProgram& prog) {
  json blocks = json::array();
  for (const Block& k : plan.blocks)
    blocks.push_back({{"fwd", names_of(prog.fwd, k.fwd_begin, k.fwd_end)},
                      {"bwd", names_of(prog.bwd, k.bwd_begin, k.bwd_end)}});
  json j = {{"format", kPlanFormat},
            {"version", SIPlan::kVersion},
            {"pair", plan.pair.empty() ? prog.name : plan.pair},
            {"source", plan.source},
            {"fwd_ops", names_of(prog.fwd, 0, static_cast<int>(prog.fwd.size()))},
            {"bwd_ops", names_of(prog.bwd, 0, static_cast<int>(prog.bwd.size()))},
            {"carry_bwd", names_of(prog.bwd, static_cast<int>(prog.bwd.size()) - plan.carry,
                                   static_cast<int>(prog.bwd.size()))},
            {"blocks", blocks}};
  // JSON has no NaN or inf (nlohmann writes them as null): an unknown time is left out.
  if (std::isfinite(plan.predicted_s)) j["predicted_s"] = plan.predicted_s;
  return j;
}

namespace {

SIPlan read_plan(const json& j, const LayerProgram& prog, const std::string& origin) {
  DHX_CHECK(j.is_object(), PlanError, "{}: an SI plan must be a JSON object", origin);
  const json format = j.value("format", json());
  const std::string format_name = format.is_string() ? format.get<std::string>() : format.dump();
  DHX_CHECK(format.is_string() && format_name == kPlanFormat, PlanError, "{}: format is '{}', expected '{}'",
            origin, format_name, kPlanFormat);
  DHX_CHECK(j.contains("version") && j["version"].is_number_integer(), PlanError,
            "{}: missing integer 'version'", origin);
  // int64: get<int>() would wrap, reading version 2^32 + 1 as 1.
  const int64_t version = j["version"].get<int64_t>();
  DHX_CHECK(version == 1 || version == SIPlan::kVersion, PlanError,
            "{}: plan version {} is not supported (this build reads versions 1 and {})", origin,
            version, SIPlan::kVersion);
  SIPlan plan;
  try {
    plan.pair = j.value("pair", std::string());
    plan.source = j.value("source", std::string());
    const json p = j.value("predicted_s", json());
    DHX_CHECK(p.is_null() || p.is_number(), PlanError,
              "{}: 'predicted_s' is {}, expected a number of seconds (or none when unknown)", origin,
              p.dump());
    plan.predicted_s = p.is_null() ? std::numeric_limits<double>::quiet_NaN() : p.get<double>();
  } catch (const json::exception& e) {
    throw PlanError(fmt::format("{}: bad plan header: {}", origin, e.what()));
  }
  DHX_CHECK(plan.pair == prog.name, PlanError, "{}: plan is for pair '{}', program is '{}'",
            origin, plan.pair, prog.name);
  check_op_list(j, "fwd_ops", prog.fwd, origin);
  check_op_list(j, "bwd_ops", prog.bwd, origin);
  DHX_CHECK(j.contains("blocks") && j["blocks"].is_array(), PlanError,
            "{}: missing array 'blocks'", origin);
  auto fwd_index = index_of(prog.fwd), bwd_index = index_of(prog.bwd);
  // carry_bwd (version 2): the trailing backward ops run in the next pair, named in program order.
  if (version >= 2 && j.contains("carry_bwd")) {
    const json& c = j["carry_bwd"];
    DHX_CHECK(c.is_array(), PlanError, "{}: 'carry_bwd' must be an array of op names", origin);
    const int n = static_cast<int>(prog.bwd.size());
    const int nc = static_cast<int>(c.size());
    DHX_CHECK(nc <= n, PlanError, "{}: 'carry_bwd' names {} ops, the backward program has {}", origin, nc, n);
    for (int i = 0; i < nc; ++i)
      DHX_CHECK(c[i].is_string() && c[i].get<std::string>() == prog.bwd[n - nc + i].name, PlanError,
                "{}: 'carry_bwd'[{}] is {}, expected '{}': carried ops must be the last {} backward ops, "
                "in program order",
                origin, i, c[i].dump(), prog.bwd[n - nc + i].name, nc);
    plan.carry = nc;
  }
  int k = 0;
  for (const json& jb : j["blocks"]) {
    DHX_CHECK(jb.is_object(), PlanError, "{}: block {} must be an object", origin, k);
    Block b;
    window_from_names(jb.value("fwd", json()), fwd_index, prog.fwd, k, "fwd", origin,
                      b.fwd_begin, b.fwd_end);
    window_from_names(jb.value("bwd", json()), bwd_index, prog.bwd, k, "bwd", origin,
                      b.bwd_begin, b.bwd_end);
    plan.blocks.push_back(b);
    ++k;
  }
  try {
    check_plan(plan, prog);
  } catch (const PlanError& e) {
    throw PlanError(fmt::format("{}: {}", origin, e.what()));
  }
  return plan;
}

}  // namespace

SIPlan plan_from_json(const json& j, const LayerProgram& prog, const std::string& origin) {
  try {
    return read_plan(j, prog, origin);
  } catch (const json::exception& e) {  // a value of a JSON type no check above expected
    throw PlanError(fmt::format("{}: malformed plan: {}", origin, e.what()));
  }
}

void save_plan(const std::string& path, const SIPlan& plan, const LayerProgram& prog) {
  write_file_atomic(path, plan_to_json(plan, prog).dump(2) + "\n");
}

SIPlan plan_from_text(const std::string& text, const LayerProgram& prog, const std::string& origin) {
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  DHX_CHECK(!j.is_discarded(), PlanError, "{}: not valid JSON", origin);
  return plan_from_json(j, prog, origin);
}

SIPlan load_plan(const std::string& path, const LayerProgram& prog) {
  return plan_from_text(read_file(path), prog, path);
}

}  // namespace dhelix
