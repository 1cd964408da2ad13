// 3D tensor parallelism: what must not change a result, and what its special cases are.
//  - Strand Interleaving on vs off, and each of AxoNN's three overlaps on vs off: bitwise-equal
//    losses and gradients. Oracle: the same run with the switch flipped (only the order of
//    independent ops and where collectives are waited for changes; every kernel sees the same
//    inputs, and every reduction runs in its group's fixed order).
//  - The trace shows each overlapped pair: with the overlap on, the collective's window from issue
//    to wait holds the compute op it is meant to hide under (on this rank, same micro-batch); off,
//    the collective is waited for where it is issued, so no compute op of its strand runs inside.
//  - Gx = Gz = 1 is Megatron's 1D tensor parallelism, Gx = Gy = 1 ZeRO-3 along z: the same
//    losses and gradients as Megatron's tp (the reduction order differs: kGradRelTol/kLossRelTol,
//    ParallelHarness.h) and as the single-process run.
//  - Checkpoints are layout-free: a 3D run's checkpoint resumes bitwise on its own layout and
//    within kLossRelTol on other 3D grids, Megatron tp and one process.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cstring>
#include <mutex>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>

#include "../train/TempDir.h"
#include "ParallelHarness.h"
#include "base/Files.h"
#include "model/ModelConfig.h"
#include "sharding/ModelPrograms.h"
#include "sharding/ParamSharding.h"
#include "train/Trainer.h"

namespace dhelix::testing {
namespace {

int64_t differing(const std::map<std::string, Tensor>& a, const std::map<std::string, Tensor>& b, std::string* which) {
  int64_t n = 0;
  for (const auto& [name, tb] : b) {
    auto it = a.find(name);
    if (it == a.end() || it->second.numel() != tb.numel()) {
      *which = name;
      return -1;
    }
    for (int64_t i = 0; i < tb.numel(); ++i)
      if (std::memcmp(it->second.f32() + i, tb.f32() + i, sizeof(float)) != 0) ++n, *which = name;
  }
  return n;
}

void expect_bitwise(const RunResult& a, const RunResult& b, const std::string& what) {
  EXPECT_EQ(a.losses, b.losses) << what;
  std::string which;
  EXPECT_EQ(differing(a.first_grads, b.first_grads, &which), 0) << what << ": gradient " << which;
}

// combination: 3d si
TEST(Grid3D, StrandInterleavingOnOffBitwise) {
  TempDir dir;
  const std::string prefix = write_walk_dataset(dir.path());
  for (ModelFamily f : {ModelFamily::kLlama, ModelFamily::kGPT}) {
    RunConfig on = tiny_config_3d(f, 1, 2, 2, 2, prefix, dir / "on");
    RunConfig off = on;
    off.output.dir = dir / "off";
    on.schedule.strand_interleaving = true;
    off.schedule.strand_interleaving = false;
    expect_bitwise(run_local(on, Grads::kCollect), run_local(off, Grads::kCollect),
                   fmt::format("{} SI on vs off", family_name(f)));
  }
}

// combination: 3d si
TEST(Grid3D, EachOverlapOnOffBitwise) {
  TempDir dir;
  const std::string prefix = write_walk_dataset(dir.path());
  for (ModelFamily f : {ModelFamily::kLlama, ModelFamily::kGPT}) {
    const RunConfig base = tiny_config_3d(f, 1, 2, 2, 2, prefix, dir / "base");
    const RunResult ref = run_local(base, Grads::kCollect);
    for (const char* which : {"ar", "rs", "ag"}) {
      RunConfig c = base;
      c.output.dir = dir / which;
      if (std::string(which) == "ar") c.parallel.overlap_ar = false;
      if (std::string(which) == "rs") c.parallel.overlap_rs = false;
      if (std::string(which) == "ag") c.parallel.overlap_ag = false;
      expect_bitwise(run_local(c, Grads::kCollect), ref, fmt::format("{} overlap_{} off vs on", family_name(f), which));
    }
  }
}

// Weight gradients summed over the micro-batches and reduce-scattered once (accumulate_z_grads, the
// default) against a reduce-scatter per micro-batch (AxoNN's order). Oracle: the per-micro-batch
// run; the sums differ only in order (over micro-batches, then z; or z, then micro-batches), so
// ParallelHarness.h's TP/DP bounds hold. SI on vs off stays bitwise under it (the test above).
// combination: 3d si
TEST(Grid3D, AccumulatedZGradientsEqualPerMicroBatch) {
  TempDir dir;
  const std::string prefix = write_walk_dataset(dir.path());
  for (ModelFamily f : {ModelFamily::kLlama, ModelFamily::kGPT}) {
    RunConfig on = tiny_config_3d(f, 1, 1, 2, 2, prefix, dir / "on");
    on.training.micro_batches = 4;
    RunConfig off = on;
    off.output.dir = dir / "off";
    off.parallel.accumulate_z_grads = false;
    const RunResult a = run_local(on, Grads::kCollect), b = run_local(off, Grads::kCollect);
    std::string worst;
    const double grad_dev = max_grad_deviation(a.first_grads, b.first_grads, &worst);
    const double loss_dev = max_rel_deviation(a.losses, b.losses);
    fmt::print("[measured] {} accumulate_z on vs off: grad max rel dev {:.2e} ({}), loss max rel dev {:.2e}\n",
               family_name(f), grad_dev, worst, loss_dev);
    EXPECT_EQ(a.first_grads.size(), b.first_grads.size());
    EXPECT_LE(grad_dev, kGradRelTol) << family_name(f) << " worst tensor " << worst;
    EXPECT_LE(loss_dev, kLossRelTol) << family_name(f);
  }
}

struct Iv {
  std::string lane, name;
  double begin, end, issued, waited;
};

// Rank 0's trace of 2 steps (SI off: a strand's collective can only hide under its own compute).
std::vector<Iv> traced(RunConfig c, const std::string& path) {
  c.training.steps = 2;
  c.schedule.strand_interleaving = false;
  on_local_ranks(c, [&](CommContext* comm) {
    Trainer t(c, comm, Quiet::kYes);
    for (int s = 0; s < 2; ++s) t.train_step();
    if (comm->rank() == 0) t.trace()->write(path);
  });
  std::vector<Iv> out;
  const auto doc = nlohmann::json::parse(read_file(path));
  std::map<int, std::string> lanes;
  for (const auto& e : doc["traceEvents"])
    if (e.value("ph", "") == "M" && e.value("name", "") == "thread_name") lanes[e["tid"].get<int>()] = e["args"]["name"];
  for (const auto& e : doc["traceEvents"]) {
    if (e.value("ph", "") != "X") continue;
    Iv iv{lanes[e["tid"].get<int>()], e["name"], e["ts"].get<double>(), 0, 0, 0};
    iv.end = iv.begin + e["dur"].get<double>();
    iv.issued = iv.begin - (e["args"].contains("queued_us") ? e["args"]["queued_us"].get<double>() : 0.0);
    iv.waited = e["args"].contains("wait_us") ? iv.begin + e["args"]["wait_us"].get<double>() : iv.end;
    out.push_back(iv);
  }
  return out;
}

// How many of the collective `coll`'s instances ("<coll> mbK uU") have compute op "<op> mbK uU"
// inside their issue-to-wait window, and how many instances there are.
std::pair<int, int> overlapped(const std::vector<Iv>& t, const std::string& coll, const std::string& op) {
  int hits = 0, n = 0;
  const std::regex re("^" + std::regex_replace(coll, std::regex(R"(\.)"), R"(\.)") + R"( (mb\d+ u\d+)$)");
  for (const Iv& c : t) {
    std::smatch m;
    if (c.lane.rfind("comm ", 0) != 0 || !std::regex_match(c.name, m, re)) continue;
    ++n;
    for (const Iv& k : t)
      if (k.lane.rfind("compute", 0) == 0 && k.name == op + " " + m[1].str() && k.begin >= c.issued && k.end <= c.waited)
        ++hits;
  }
  return {hits, n};
}

// combination: 3d
TEST(Grid3D, TraceShowsEachOverlappedPair) {
  TempDir dir;
  const std::string prefix = write_walk_dataset(dir.path());
  RunConfig base = tiny_config_3d(ModelFamily::kLlama, 1, 2, 2, 2, prefix, dir / "t");
  base.output.trace = dir / "trace.json";
  // (switch, collective, the compute op it hides under)
  const std::vector<std::array<std::string, 3>> pairs = {
      {"ar", "y.ar.attn.qkv.bwd", "attn.qkv.wgrad"},  // OAR: dX all-reduce under the dW GEMM
      {"rs", "z.rs.mlp.fc", "attn.out.dgrad"},        // ORS: dW reduce-scatter under later backward GEMMs
      {"ag", "z.ag.attn.out", "attn.qkv"},            // OAG: the next block gathered under this GEMM
  };
  for (const auto& [sw, coll, op] : pairs) {
    for (bool on : {true, false}) {
      RunConfig c = base;
      if (sw == "ar") c.parallel.overlap_ar = on;
      if (sw == "rs") c.parallel.overlap_rs = on;
      if (sw == "ag") c.parallel.overlap_ag = on;
      const auto t = traced(c, dir / fmt::format("trace_{}_{}.json", sw, on));
      auto [hits, n] = overlapped(t, coll, op);
      fmt::print("[measured] overlap_{} {}: {} of {} '{}' windows hold '{}'\n", sw, on ? "on" : "off", hits, n, coll, op);
      ASSERT_GT(n, 0) << coll << " not in the trace";
      if (on) EXPECT_EQ(hits, n) << sw << " on: every " << coll << " must span " << op;
      else EXPECT_EQ(hits, 0) << sw << " off: " << coll << " must be waited for at issue";
      if (sw != "ag") continue;
      // Across layers: the next block's first weight ("z.ag.next.attn.qkv ... u<U+1>", named by the
      // unit it gathers for) is in flight under this block's last GEMM ("mlp.proj ... u<U>") and
      // adopted by the next block; with OAG off there is no such op.
      const std::regex next(R"(^z\.ag\.next\.attn\.qkv mb(\d+) u(\d+)$)");
      int prefetches = 0, spanned = 0;
      for (const Iv& c : t) {
        std::smatch m;
        if (c.lane.rfind("comm ", 0) != 0 || !std::regex_match(c.name, m, next)) continue;
        ++prefetches;
        const std::string under = fmt::format("mlp.proj mb{} u{}", m[1].str(), std::stoi(m[2].str()) - 1);
        for (const Iv& k : t)
          if (k.lane.rfind("compute", 0) == 0 && k.name == under && k.begin >= c.issued && k.end <= c.waited) ++spanned;
      }
      fmt::print("[measured] overlap_ag {}: {} cross-layer prefetches, {} under the previous block's last GEMM\n",
                 on ? "on" : "off", prefetches, spanned);
      if (on) {
        EXPECT_GT(prefetches, 0);
        EXPECT_EQ(spanned, prefetches);
      } else {
        EXPECT_EQ(prefetches, 0);
      }
    }
  }
}

// combination: dp 3d si
TEST(Grid3D, MegatronAndZero3SpecialCases) {
  TempDir dir;
  const std::string prefix = write_walk_dataset(dir.path());
  for (ModelFamily f : {ModelFamily::kLlama, ModelFamily::kGPT}) {
    // Gx = Gz = 1, Gy = 2 against Megatron tp = 2 (sequence parallel), dp = 2, same global batch.
    const RunResult mega = run_local(tiny_config(f, 2, 2, 0, prefix, dir / "mega", 2, 8), Grads::kCollect);
    const RunResult y2 = run_local(tiny_config_3d(f, 2, 1, 2, 1, prefix, dir / "y2"), Grads::kCollect);
    std::string worst;
    const double g = max_grad_deviation(y2.first_grads, mega.first_grads, &worst);
    const double l = max_rel_deviation(y2.losses, mega.losses);
    fmt::print("[measured] {} Gy=2 dp=2 vs Megatron tp=2 dp=2: grad {:.2e} ({}), loss {:.2e}\n", family_name(f), g,
               worst, l);
    EXPECT_LE(g, kGradRelTol) << worst;
    EXPECT_LE(l, kLossRelTol);
  }
}

// The collectives of a block's program, as "group:op" per strand (closed form: axonn.md §2.2,
// special cases).
std::set<std::string> colls(const std::vector<Op>& ops, const std::string& prefix = "") {
  std::set<std::string> out;
  for (const Op& op : ops)
    if (op.is_collective() && op.name.find(prefix) != std::string::npos)
      out.insert(op.group + ":" + coll_op_name(op.coll));
  return out;
}

TEST(Grid3D, SpecialCasesHaveTheirCollectives) {
  ModelConfig m = model_preset("gpt2-124m");
  const MicroBatchShape mb{1, 64};
  auto lay = [](int gx, int gy, int gz) {
    LayoutConfig l;
    l.tp_x = gx, l.tp_y = gy, l.tp_z = gz;
    return l;
  };
  // Gx = Gy = 1: ZeRO-3 / FSDP along z — only weight all-gathers and gradient reduce-scatters over
  // z, every weight matrix stored 1/Gz per rank, nothing on activations.
  const ModelPrograms z4 = build_programs(m, lay(1, 1, 4), mb);
  EXPECT_EQ(colls(z4.block.fwd), (std::set<std::string>{"z:all_gather"}));
  EXPECT_EQ(colls(z4.block.bwd), (std::set<std::string>{"z:all_gather", "z:reduce_scatter"}));
  for (const UnitSpec& u : model_units(m, lay(1, 1, 4), 0))
    for (const ParamSpec& p : u.params) {
      if (p.z_flat) {
        EXPECT_EQ(shape_numel(p.shard) * 4, shape_numel(p.full)) << p.name;
      }
    }
  // Gx = Gz = 1: Megatron's 1D TP — a type-A layer (QKV) communicates nothing forward and
  // all-reduces its input gradient over y backward (column-parallel); a type-B layer (attention
  // out) all-reduces its output over y forward and nothing backward (row-parallel).
  const ModelPrograms y4 = build_programs(m, lay(1, 4, 1), mb);
  EXPECT_EQ(colls(y4.block.fwd, "attn.qkv"), std::set<std::string>{});
  EXPECT_EQ(colls(y4.block.bwd, "attn.qkv"), (std::set<std::string>{"y:all_reduce"}));
  EXPECT_EQ(colls(y4.block.fwd, "attn.out"), (std::set<std::string>{"y:all_reduce"}));
  EXPECT_EQ(colls(y4.block.bwd, "attn.out"), std::set<std::string>{});
  EXPECT_EQ(colls(y4.block.fwd), (std::set<std::string>{"y:all_reduce"}));
}

// combination: 3d si
// combination: dp 3d si
// combination: dp tp si
TEST(Grid3D, CheckpointReshardsAcrossLayouts) {
  TempDir dir;
  const std::string prefix = write_walk_dataset(dir.path());
  constexpr int kBefore = 4, kAfter = 4;
  auto with_ck = [&](RunConfig c) {
    c.checkpoint.dir = dir / "ck";
    c.checkpoint.keep = 0;
    return c;
  };
  const RunConfig grid = with_ck(tiny_config_3d(ModelFamily::kGPT, 1, 2, 2, 2, prefix, dir / "g222"));
  const CheckpointedRun base = run_with_checkpoint(grid, kBefore, kAfter);
  ASSERT_EQ(base.after.size(), size_t(kAfter));
  struct Target {
    const char* name;
    RunConfig cfg;
  };
  const std::vector<Target> targets = {
      {"same grid 2x2x2", grid},
      {"grid 1x2x2 dp2", with_ck(tiny_config_3d(ModelFamily::kGPT, 2, 1, 2, 2, prefix, dir / "g122"))},
      {"grid 4x1x1", with_ck(tiny_config_3d(ModelFamily::kGPT, 1, 4, 1, 1, prefix, dir / "g411"))},
      {"Megatron tp2 dp2", with_ck(tiny_config(ModelFamily::kGPT, 2, 2, 0, prefix, dir / "mega", 2, 8))},
      {"one process", with_ck(tiny_config_3d(ModelFamily::kGPT, 1, 1, 1, 1, prefix, dir / "one"))},
  };
  for (const Target& t : targets) {
    const std::vector<double> got = resume_losses(t.cfg, base.checkpoint, kAfter, kBefore);
    const double dev = max_rel_deviation(got, base.after);
    fmt::print("[measured] 2x2x2 checkpoint resumed on {}: max rel dev {:.2e} over {} steps\n", t.name, dev, kAfter);
    if (std::string(t.name).rfind("same", 0) == 0) EXPECT_EQ(got, base.after) << "same-layout resume must be bitwise";
    else EXPECT_LE(dev, kLossRelTol) << t.name;
  }
}

}  // namespace
}  // namespace dhelix::testing
