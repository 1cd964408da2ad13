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

// Rank 0's peak activation bytes over one training step.
int64_t peak_activation_bytes(const RunConfig& cfg) {
  int64_t peak = 0;
  on_local_ranks(cfg, [&](CommContext* comm) {
    Trainer t(cfg, comm, Quiet::kYes);
    const int64_t p = t.train_step().peak_activation_bytes;
    if (!comm || comm->rank() == 0) peak = p;
  });
  return peak;
}

// AxoNN's weight caching (parallel.keep_gathered): a layer that keeps its weight blocks gathered over
// z gathers them once a step -- in the forward of the step's first micro-batch -- and every
// micro-batch's forward, backward and recompute reads them. Oracle for the results: the same run
// gathering again (keep_gathered = 0). A kept block holds the bytes a second gather of the same
// shard would (no update comes between), so every kernel sees the same inputs: losses and gradients
// bitwise equal -- with SI on and off, no and full recompute, every layer kept or only each chunk's
// first (the others run "block_gathering"), a W pipeline. Oracle for the traffic: the comm layer's
// count on z (ProcessGroup::traffic, rank 0) drops by exactly the gathers a kept layer no longer
// makes, from the closed form: per kept layer, with M micro-batches, the forward's gathers of its
// four weight blocks but the first micro-batch's (M - 1), the backward's (M) and, with full
// recompute, the recompute's (M) of all but the MLP's down projection (its output feeds only the
// residual add, which no backward op reads, so the recompute stops before it), each moving
// (Gz - 1) / Gz of the block's fp32 bytes. A layer's
// blocks hold (4 C^2 + 2 C F) / (Gx Gy) elements (GPT: qkv 3C x C, out C x C, fc F x C, proj C x F)
// or (C (H + 2 Hkv) D + C^2 + 3 C F) / (Gx Gy) (Llama: gate and up fused); the down projection's
// C F / (Gx Gy).
// combination: 3d si
// combination: 3d si recompute
// combination: 3d w si
TEST(Grid3D, KeptWeightBlocksGiveTheGatheredAgainBitsWithoutTheirZBytes) {
  TempDir dir;
  const std::string prefix = write_walk_dataset(dir.path());
  struct Case {
    const char* name;
    ModelFamily family;
    int gx, gy, gz, pp, keep;
    bool si;
    Recompute recompute;
    int micro_batches;
  };
  const std::vector<Case> cases = {
      {"gpt y2z2 every layer kept, SI", ModelFamily::kGPT, 1, 2, 2, 1, 2, true, Recompute::kNone, 2},
      {"llama x2z2 first layer kept, full recompute, SI, 3 micro-batches", ModelFamily::kLlama, 2, 1, 2, 1, 1, true,
       Recompute::kFull, 3},
      {"gpt x2z2 every layer kept, full recompute, SI off", ModelFamily::kGPT, 2, 1, 2, 1, 2, false, Recompute::kFull,
       2},
      {"llama z2 pp2 W, each chunk's first kept, SI", ModelFamily::kLlama, 1, 1, 2, 2, 1, true, Recompute::kNone, 2},
  };
  for (const Case& c : cases) {
    RunConfig base = tiny_config_3d(c.family, 1, c.gx, c.gy, c.gz, prefix, dir / "base");
    base.training.steps = 4;
    base.training.micro_batches = c.micro_batches;
    base.training.recompute = recompute_name(c.recompute);
    base.schedule.strand_interleaving = c.si;
    if (c.pp > 1) {
      base.model.n_layers = 8;  // the W at pp = 2 needs L % 4 == 0; two layers a chunk
      base.model.tie_embeddings = false;
      base.parallel.pp = c.pp;
      base.schedule.pipeline = "w";
    }
    RunConfig kept = base;
    kept.output.dir = dir / "kept";
    kept.parallel.keep_gathered = c.keep;
    expect_bitwise(run_local(kept, Grads::kCollect), run_local(base, Grads::kCollect), c.name);

    const ModelConfig& m = base.model;
    const double C = double(m.d_model), F = double(m.ffn_hidden);
    const double layer = m.family == ModelFamily::kGPT
                             ? 4 * C * C + 2 * C * F
                             : C * double((m.n_heads + 2 * m.n_kv_heads) * m.head_dim()) + C * C + 3 * C * F;
    // Layers kept on rank 0's stage: the first `keep` of its one chunk (the W's first stage holds
    // two chunks of L / 4 layers each).
    const int chunks = c.pp > 1 ? 2 : 1;
    const int per_chunk = int(m.n_layers) / (c.pp * chunks);
    const double kept_layers = chunks * std::min(c.keep, per_chunk);
    const double M = double(base.training.micro_batches);
    const double gathered = (M - 1) * layer + M * layer + (c.recompute == Recompute::kFull ? M * (layer - C * F) : 0);
    const double saved = kept_layers * double(c.gz - 1) / double(c.gz) * 4.0 * gathered / double(c.gx * c.gy);
    const double z_base = counted_step_bytes(base).at("z"), z_kept = counted_step_bytes(kept).at("z");
    fmt::print("[measured] {}: z bytes per step {:.0f} -> {:.0f} (closed form: {:.0f} fewer)\n", c.name, z_base, z_kept,
               saved);
    EXPECT_NEAR(z_base - z_kept, saved, 1e-9 * z_base) << c.name;
    // The kept blocks are held, and counted: rank 0's measured peak of activation memory (the
    // trainer's tracker) grows. By how much depends on where the peak falls (the micro-batches in
    // flight, the gathers a kept layer no longer makes in its backward), so only the growth is
    // asserted; the step model's rule for it is test_step_model.cc's
    // KeptBlocksAreSavedBuffersOfTheirLayers.
    const double peak_base = double(peak_activation_bytes(base)), peak_kept = double(peak_activation_bytes(kept));
    fmt::print("[measured] {}: peak activation bytes {:.0f} -> {:.0f} (one kept layer's blocks: {:.0f})\n", c.name,
               peak_base, peak_kept, 4.0 * layer / double(c.gx * c.gy));
    EXPECT_GT(peak_kept, peak_base) << c.name;
    // Evaluation's forward-only passes (one micro-batch each, between training steps of M) gather the
    // kept blocks anew and drop them at the pass's end: the held-out loss after a step equals the
    // gathering run's bit for bit (Trainer::evaluate, rank 0).
    auto eval_after_step = [](const RunConfig& cfg) {
      double v = 0;
      on_local_ranks(cfg, [&](CommContext* comm) {
        Trainer t(cfg, comm, Quiet::kYes);
        t.train_step();
        const double e = t.evaluate(3).value_or(-1.0);
        t.train_step();  // and a step after it still runs
        if (!comm || comm->rank() == 0) v = e;
      });
      return v;
    };
    const double e_kept = eval_after_step(kept), e_base = eval_after_step(base);
    EXPECT_EQ(std::memcmp(&e_kept, &e_base, sizeof(double)), 0) << c.name << ": " << e_kept << " vs " << e_base;
    EXPECT_GT(e_base, 0) << c.name;
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
