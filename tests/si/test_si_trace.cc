// The trace of a tp = 2 Strand-Interleaving run (threads-as-ranks). Oracle: the executor's
// contract (DESIGN.md, Strand Interleaving) read off the Chrome trace it writes — in a paired
// block the collective of one micro-batch runs on the comm lane while the other micro-batch's
// compute runs on its strand lane, so at least one comm interval must intersect a compute
// interval of a *different* micro-batch (the sequential schedule never has two micro-batches in
// flight, so such an intersection can only come from interleaving). Every lane and op is named.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <string>
#include <vector>

#include "SiRun.h"
#include "base/Files.h"
#include "train/Trainer.h"

namespace dhelix {
namespace {

struct Interval {
  std::string lane, name;
  int mb = -1;
  double begin = 0, end = 0;  // microseconds
};

// "attn.qkv mb3 u2" -> 3
int mb_of(const std::string& name) {
  static const std::regex re(R"( mb(\d+) u\d+$)");
  std::smatch m;
  return std::regex_search(name, m, re) ? std::stoi(m[1]) : -1;
}

TEST(SiTrace, CollectiveOfOneStrandOverlapsComputeOfTheOther) {
  testing::TempDir dir;
  testing::write_synthetic_dataset(dir.path() + "/data", 200, 300, 17);
  RunConfig cfg = testing::si_config(dir.path(), "llama", /*dp=*/1, /*tp=*/2, /*interleave=*/true);
  cfg.training.steps = 3;
  cfg.output.trace = dir.path() + "/trace.json";
  testing::on_local_ranks(cfg, [&](CommContext& comm) { Trainer(cfg, &comm, Quiet::kYes).run(); });

  const std::string path = cfg.output.trace + ".rank0";
  ASSERT_TRUE(std::filesystem::exists(path)) << path;
  const auto doc = nlohmann::json::parse(read_file(path));
  ASSERT_TRUE(doc.contains("traceEvents"));

  std::map<int, std::string> lanes;  // tid -> lane name
  for (const auto& e : doc["traceEvents"])
    if (e.value("ph", "") == "M" && e.value("name", "") == "thread_name")
      lanes[e["tid"].get<int>()] = e["args"]["name"].get<std::string>();

  std::vector<Interval> comm, compute;
  for (const auto& e : doc["traceEvents"]) {
    if (e.value("ph", "") != "X") continue;
    const int tid = e["tid"].get<int>();
    ASSERT_TRUE(lanes.count(tid)) << "event " << e.dump() << " is on an unnamed lane";
    Interval iv{lanes[tid], e.value("name", ""), -1, e["ts"].get<double>(), 0};
    iv.end = iv.begin + e["dur"].get<double>();
    ASSERT_FALSE(iv.name.empty()) << "unnamed op on lane " << iv.lane;
    iv.mb = mb_of(iv.name);
    ASSERT_GE(iv.mb, 0) << "op '" << iv.name << "' does not name its micro-batch";
    if (iv.lane.rfind("comm tp[", 0) == 0)
      comm.push_back(iv);
    else if (iv.lane == "compute fwd" || iv.lane == "compute bwd")
      compute.push_back(iv);
    else
      ADD_FAILURE() << "unexpected lane '" << iv.lane << "'";
  }
  std::vector<std::string> names;
  for (auto& [tid, n] : lanes) names.push_back(n);
  for (const char* want : {"compute fwd", "compute bwd"})
    EXPECT_NE(std::find(names.begin(), names.end(), want), names.end()) << "no lane '" << want << "'";
  EXPECT_TRUE(std::any_of(names.begin(), names.end(), [](const std::string& n) { return n == "comm tp[0/2]"; }))
      << "no lane for rank 0's tp group";
  ASSERT_FALSE(comm.empty());
  ASSERT_FALSE(compute.empty());

  // Intervals that intersect with positive length: a collective of micro-batch a against compute
  // of micro-batch b != a (the other strand of the same slot).
  int overlaps = 0;
  std::string example;
  for (const auto& c : comm)
    for (const auto& x : compute)
      if (c.mb != x.mb && std::max(c.begin, x.begin) < std::min(c.end, x.end)) {
        if (overlaps++ == 0) example = "'" + c.name + "' [" + c.lane + "] under '" + x.name + "' [" + x.lane + "]";
      }
  EXPECT_GT(overlaps, 0) << comm.size() << " collectives, " << compute.size()
                         << " compute ops, none overlapping the other strand";
  std::printf("%d collective/other-strand-compute overlaps, e.g. %s\n", overlaps, example.c_str());
}

}  // namespace
}  // namespace dhelix
