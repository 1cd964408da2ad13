// The step model. Oracles: hand-worked timelines of small hand-built strands (the overlap rule of
// StepModel.h), the Megatron tp=2 volume per axis counted by hand from the program's collectives
// (sequence parallelism: an all-gather before each column GEMM, a reduce-scatter after each row
// GEMM, axonn.md §2.3's ring factors), the memory of a small layout counted by hand, the 1F1B bubble
// fraction (p-1)/(M+p-1), and a brute-force count of the layouts of n ranks.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "base/Error.h"
#include "model/Params.h"
#include "sim/LayoutSearch.h"
#include "sim/StepMemory.h"
#include "sim/StepModel.h"

namespace dhelix {
namespace {

Op comp(const std::string& name, double seconds, std::vector<std::string> in, std::vector<std::string> out) {
  Op op;
  op.name = name;
  op.code = "linear";
  op.inputs = std::move(in);
  op.outputs = std::move(out);
  op.cost.flops = seconds * 1e9;  // at 1 GFLOP/s
  return op;
}

Op coll(const std::string& name, CollOp c, double seconds, std::vector<std::string> in, std::string out) {
  Op op;
  op.name = name;
  op.kind = OpKind::kCollective;
  op.coll = c;
  op.group = "tp";
  op.inputs = std::move(in);
  op.outputs = {std::move(out)};
  // 2 ranks at 1 GB/s, no latency: all-reduce moves B, all-gather / reduce-scatter B/2.
  op.cost.comm_bytes = seconds * 1e9 * (c == CollOp::kAllReduce ? 1 : 2);
  return op;
}

const std::map<std::string, GroupLink> kTp2 = {{"tp", {2, {1e9, 0}}}};
const DeviceRates kRates{1e9, 1e30, 1.0};

// GEMM ops under a tiled device (GemmTiling): the time of each GEMM kind is its FLOPs at the rate
// times the quantization efficiency of its own output C. Oracle: by hand on a device of 4 units
// and 100 x 100 tiles at 1 GFLOP/s. rows 200, in 300, out 100: forward C [200, 100] = 2 tiles, one
// wave of 4 units -> 1/2; input gradient (attrs in 100, out 300) C [200, 300] = 6 tiles, 2 waves ->
// 6/8; weight gradient C [in 300, out 100] = 3 tiles -> 3/4; two experts' forward (twice the
// FLOPs) fill 4 units -> 1.
TEST(PriceStrand, GemmTimeFollowsItsOutputTiles) {
  DeviceRates r{1e9, 1e30, 1.0};
  r.tiling = GemmTiling{4, 100, 100};
  auto gemm = [](const std::string& code, int64_t rows, int64_t in, int64_t out, double groups) {
    Op op;
    op.name = op.code = code;
    op.cost.flops = groups * 2.0 * double(rows * in * out);
    op.attrs = {{"gemm_rows", rows}, {"gemm_in", in}, {"gemm_out", out}};
    return op;
  };
  const double f = 2.0 * 200 * 300 * 100 / 1e9;
  EXPECT_DOUBLE_EQ(op_time(gemm("linear", 200, 300, 100, 1), {}, r), f / 0.5);
  EXPECT_DOUBLE_EQ(op_time(gemm("linear_dgrad", 200, 100, 300, 1), {}, r), f / 0.75);
  EXPECT_DOUBLE_EQ(op_time(gemm("linear_wgrad", 200, 300, 100, 1), {}, r), f / 0.75);
  EXPECT_DOUBLE_EQ(op_time(gemm("expert_linear", 200, 300, 100, 2), {}, r), 2 * f);
  EXPECT_DOUBLE_EQ(op_time(gemm("linear", 200, 300, 100, 1), {}, kRates), f);  // no tiling
  // A measured GEMM timer (simulate --measure-gemm) times one GEMM of the shape; the experts'
  // grouped GEMM is that many of them (a timer of 1 ms a GEMM: 8 experts, 8 ms). Before this was
  // counted, moe-demo's expert GEMMs were simulated ~9x fast against the profiled ops.
  DeviceRates timed{1e9, 1e30, 1.0};
  timed.gemm_timer = [](const Op&) { return 1e-3; };
  EXPECT_DOUBLE_EQ(op_time(gemm("expert_linear", 200, 300, 100, 8), {}, timed), 8e-3);
  EXPECT_DOUBLE_EQ(op_time(gemm("linear", 200, 300, 100, 1), {}, timed), 1e-3);
}

// Attention at its own measured rates (DeviceRates::attention; a preset's attention_efficiency):
// the forward ops (attention, ring_attention) at the forward rate, their backward ops at the
// backward rate, any other op as before; without rates, attention at the GEMM rate. Oracle: FLOPs
// over the rate, by hand (1 GFLOP at 1e9, 2e8 and 1e8 FLOP/s: 1, 5 and 10 s); a memory-bound op
// stays at its bytes over the bandwidth whatever the attention rates.
TEST(PriceStrand, AttentionRunsAtItsOwnRates) {
  auto op = [](const std::string& code, double flops, double bytes = 0) {
    Op o;
    o.name = o.code = code;
    o.cost.flops = flops;
    o.cost.bytes = bytes;
    return o;
  };
  DeviceRates r{1e9, 1e9, 1.0};
  EXPECT_DOUBLE_EQ(op_time(op("attention", 1e9), {}, r), 1.0);  // no rates: the GEMM rate
  r.attention = AttentionRates{2e8, 1e8};
  EXPECT_DOUBLE_EQ(op_time(op("attention", 1e9), {}, r), 5.0);
  EXPECT_DOUBLE_EQ(op_time(op("ring_attention", 1e9), {}, r), 5.0);
  EXPECT_DOUBLE_EQ(op_time(op("attention_bwd", 1e9), {}, r), 10.0);
  EXPECT_DOUBLE_EQ(op_time(op("ring_attention_bwd", 1e9), {}, r), 10.0);
  EXPECT_DOUBLE_EQ(op_time(op("linear", 1e9), {}, r), 1.0);
  EXPECT_DOUBLE_EQ(op_time(op("attention", 1e6, 2e10), {}, r), 20.0);  // bytes bound: 2e10 / 1e9
  // The cost model (plan --cost-model) prices them alike, and its JSON carries the rates.
  CostModelConfig c;
  c.flop_rate = 1e9, c.mem_bw = 1e9;
  c.attention = AttentionRates{2e8, 1e8};
  const CostModelConfig back = CostModelConfig::from_json(c.to_json());
  EXPECT_DOUBLE_EQ(back.attention.fwd, 2e8);
  EXPECT_DOUBLE_EQ(back.attention.bwd, 1e8);
  c.attention.bwd = -1;
  EXPECT_THROW(c.validate(), ConfigError);
}

TEST(PriceStrand, DependentAllReduceIsExposed) {
  // engine: [c1 1s]......[c2 1s]   tp: [AR 2s] -> span 4, exposed 2
  const StrandPrice p = price_strand({comp("c1", 1, {"x"}, {"a"}), coll("ar", CollOp::kAllReduce, 2, {"a"}, "b"),
                                      comp("c2", 1, {"b"}, {"y"})},
                                     kTp2, kRates, Prefetch::kOff);
  EXPECT_DOUBLE_EQ(p.compute_s, 2);
  EXPECT_DOUBLE_EQ(p.span_s, 4);
  EXPECT_DOUBLE_EQ(p.axes.at("tp").exposed_s, 2);
  EXPECT_DOUBLE_EQ(p.axes.at("tp").bytes, 2e9);  // 2(n-1)/n x 2e9 bytes
}

TEST(PriceStrand, IndependentComputeHidesReduceScatter) {
  // engine: [c1 1][c3 3........][c4 1]   tp: [RS 2] (1..3) -> span 5, nothing exposed
  std::vector<Op> ops = {comp("c1", 1, {"x"}, {"a"}), coll("rs", CollOp::kReduceScatter, 2, {"a"}, "b"),
                         comp("c3", 3, {"a"}, {"c"}), comp("c4", 1, {"b", "c"}, {"y"})};
  StrandPrice p = price_strand(ops, kTp2, kRates, Prefetch::kOff);
  EXPECT_DOUBLE_EQ(p.span_s, 5);
  EXPECT_DOUBLE_EQ(p.axes.at("tp").exposed_s, 0);
  // Marked blocking, the engine waits for it at issue: 1 + 2 + 3 + 1.
  ops[1].attrs["blocking"] = 1;
  p = price_strand(ops, kTp2, kRates, Prefetch::kOff);
  EXPECT_DOUBLE_EQ(p.span_s, 7);
  EXPECT_DOUBLE_EQ(p.axes.at("tp").exposed_s, 2);
}

// Co-execution interference in a strand (price_strand under PairSimOptions), on the strand above:
// engine [c1 1][c3 3][c4 1], tp [RS 2] from 1 to 3, c4 reading RS's output. Oracle: by hand with
// the pair simulator's rules (PairSim.h). Compute x2: c3 runs at half speed while RS is in flight
// (1 to 3: 1 s of its work), its other 2 s after: c3 ends at 5, c4 at 6. Collectives x2: RS
// progresses half as fast beside c3 (1 to 4: 1.5 s of its 2), its last 0.5 s alone after c3, and
// c4 waits for it: span 5.5 (the fixed point; the first pass, RS stretched over c4's old interval
// too, overshoots to 6). The ops' own compute stays 5 s.
TEST(PriceStrand, InterferenceSlowsOpsAsThePairSimulatorDoes) {
  const std::vector<Op> ops = {comp("c1", 1, {"x"}, {"a"}), coll("rs", CollOp::kReduceScatter, 2, {"a"}, "b"),
                               comp("c3", 3, {"a"}, {"c"}), comp("c4", 1, {"b", "c"}, {"y"})};
  const StrandPrice ks = price_strand(ops, kTp2, kRates, Prefetch::kOff, {2.0, 1.0});
  EXPECT_DOUBLE_EQ(ks.span_s, 6);
  EXPECT_DOUBLE_EQ(ks.interference_s, 1);
  EXPECT_DOUBLE_EQ(ks.compute_s, 5);
  const StrandPrice kc = price_strand(ops, kTp2, kRates, Prefetch::kOff, {1.0, 2.0});
  EXPECT_DOUBLE_EQ(kc.span_s, 5.5);
  EXPECT_DOUBLE_EQ(kc.interference_s, 0.5);
  EXPECT_DOUBLE_EQ(kc.axes.at("tp").seconds, 2);  // the link's time; the channel is held 3.5 s
  EXPECT_DOUBLE_EQ(price_strand(ops, kTp2, kRates, Prefetch::kOff, {1.0, 1.0}).interference_s, 0);
}

TEST(PriceStrand, BackgroundCollectiveCostsOnlyPastTheLayer) {
  // A reduce-scatter nobody reads (ORS): 5 s on the channel against a 2 s layer -> 3 s exposed.
  const StrandPrice p = price_strand({comp("c1", 1, {"x"}, {"a"}), coll("rs", CollOp::kReduceScatter, 5, {"a"}, "g"),
                                      comp("c2", 1, {"a"}, {"y"})},
                                     kTp2, kRates, Prefetch::kOff);
  EXPECT_DOUBLE_EQ(p.span_s, 5);
  EXPECT_DOUBLE_EQ(p.axes.at("tp").exposed_s, 3);
}

// A weight gather (no inputs) before a 3 s GEMM, and the layer's prefetch op for the next layer's
// gather of it (OAG across layers, Grid3D.h: no bytes of its own) before a last 1 s GEMM. Oracle: by
// hand. Steady state (Prefetch::kOn, as the pair simulator runs it): the previous layer's prefetch
// op issued this layer's gather, so it costs nothing here; the prefetch op takes the gather's 2 s
// (and bytes) on the channel from 3 s, under the last GEMM and past it, and the layer hands over
// when it ends, 5 s (the next layer's first GEMM reads what it gathers), as the pair simulator has
// it. kOff (the layer as written): the gather's 2 s exposed before the GEMM, 6 s. (Before 2026-11-29 the step model let every parameter gather start a layer early on a free
// channel and priced the prefetch op at its zero bytes: on a channel busier than the layer, the
// gathers of two layers overlapped.)
TEST(PriceStrand, WeightAllGatherIsPrefetched) {
  Op pf = coll("ag.next", CollOp::kAllGather, 0, {}, "w.g.next");
  pf.attrs["prefetch_unit"] = 1;
  const std::vector<Op> ops = {coll("ag", CollOp::kAllGather, 2, {}, "w.g"), comp("c", 3, {"x", "w.g"}, {"y1"}), pf,
                               comp("c2", 1, {"y1"}, {"y"})};
  const StrandPrice on = price_strand(ops, kTp2, kRates, Prefetch::kOn);
  EXPECT_DOUBLE_EQ(on.span_s, 5);
  EXPECT_DOUBLE_EQ(on.axes.at("tp").seconds, 2);  // the prefetch op's, as the gather it stands for
  EXPECT_DOUBLE_EQ(on.axes.at("tp").bytes, price_strand({ops[0]}, kTp2, kRates, Prefetch::kOff).axes.at("tp").bytes);
  const StrandPrice off = price_strand(ops, kTp2, kRates, Prefetch::kOff);
  EXPECT_DOUBLE_EQ(off.span_s, 6);
  EXPECT_DOUBLE_EQ(off.axes.at("tp").exposed_s, 2);
  // A second gather of 3 s after the first GEMM, read by the last: the first GEMM 0-3 s, the second
  // gather 3-6 s on the channel, the prefetch op queued behind it 6-8 s, the last GEMM waits for
  // the second gather until 6 s and ends at 7 s; the layer hands over at 8 s.
  std::vector<Op> two = ops;
  two.insert(two.begin() + 2, coll("ag2", CollOp::kAllGather, 3, {}, "v.g"));
  two.back().inputs.push_back("v.g");
  const StrandPrice busy = price_strand(two, kTp2, kRates, Prefetch::kOn);
  EXPECT_DOUBLE_EQ(busy.span_s, 8);
  EXPECT_DOUBLE_EQ(busy.axes.at("tp").seconds, 5);
}

ModelConfig small_gpt() {
  ModelConfig m = model_preset("gpt2-124m");
  m.vocab_size = 256, m.seq_len = 32, m.d_model = 64, m.n_layers = 2, m.n_heads = 4, m.n_kv_heads = 4;
  m.ffn_hidden = 256;
  return m;
}

ClusterPreset cpu() {
  return load_cluster(std::string(DHELIX_SOURCE_DIR) + "/configs/clusters/cpu-emulated.toml");
}

TEST(StepModel, MegatronTp2VolumePerAxisByHand) {
  const ModelConfig m = small_gpt();
  LayoutConfig lay;
  lay.tp = 2;
  const StepPrediction p = predict(m, lay, {1, 32, 1}, cpu(), {});
  // N = 32 tokens, one [N, C] fp32 buffer = 32 * 64 * 4 = 8192 bytes; ring factor 1/2 for AG / RS
  // and 1 for AR on 2 ranks.
  const double NC = 32 * 64 * 4.0;
  const double block = 8 * NC / 2;        // fwd AG qkv, RS out, AG fc, RS proj; and their 4 backward mirrors
  const double embed = 2 * NC / 2;        // fwd RS of the vocab-parallel lookup, bwd AG
  const double head = 2 * NC / 2 + 32 * 4 + 2 * 32 * 4;  // AG + bwd RS of lm_head; AR(max) [N], AR(sum) [2N]
  const double partial = (2 * 6 * 64 + 32 * 64 + 2 * 64) * 4.0;  // SP partial grads: 6C per block, wpe, final norm
  EXPECT_DOUBLE_EQ(p.axes.at("tp").bytes, 2 * block + embed + head + partial);
  EXPECT_EQ(p.axes.count("dp"), 0u);
  EXPECT_EQ(p.pricer, PricerKind::kPrograms);
}

TEST(StepModel, MemoryOfASmallLayoutByHand) {
  const ModelConfig m = small_gpt();
  LayoutConfig lay;
  lay.dp = 2;
  PredictOptions opt;
  opt.zero = Zero::kZero1;
  const StepPrediction p = predict(m, lay, {2, 32, 1}, cpu(), opt);
  const double P = double(m.num_params());  // vocab 256 needs no padding
  EXPECT_DOUBLE_EQ(p.memory.params, 4 * P);
  EXPECT_DOUBLE_EQ(p.memory.grads, 4 * P);
  EXPECT_DOUBLE_EQ(p.memory.optimizer, 8 * P / 2);  // AdamW moments over dp = 2
  // Saved for backward, per block: x, h1, att, x2, h2 [N, C]; qkv [N, 3C]; fc, act [N, F];
  // ln1/ln2 mean and rstd [N]; att.lse [N, heads]. Head: x, hf [N, C], its mean/rstd [N],
  // dlogits [N, V]. Embed: tokens [N].
  const double N = 32, C = 64, F = 256, H = 4, V = 256;
  const double block = N * (5 * C + 3 * C + 2 * F + 4 + H);
  const double head = N * (2 * C + 2 + V), embed = N;
  EXPECT_DOUBLE_EQ(p.memory.activations, 4 * (2 * block + head + embed));
  EXPECT_TRUE(p.notes.empty()) << p.notes[0];
  EXPECT_TRUE(p.fits);
}

// Expert parallelism, counted by hand: moe-demo shrunk to 2 layers, dp = 4 with ep = 2 against ep = 1.
// Each rank holds half the experts' weights, so the parameter memory drops by half of the experts'
// elements; the experts' gradients are all-reduced over edp (dp / ep = 2 ranks: ring factor
// 2 (n-1)/n = 1) and the rest over dp (4 ranks: 3/2); the step's token exchanges appear on "ep".
TEST(StepModel, ExpertParallelMemoryAndGradientVolumeByHand) {
  ModelConfig m = model_preset("moe-demo");
  m.n_layers = 2;
  LayoutConfig plain, ep;
  plain.dp = ep.dp = 4;
  ep.ep = 2;
  const BatchSpec batch{4, 32, 1};
  const StepPrediction a = predict(m, plain, batch, cpu(), {}), b = predict(m, ep, batch, cpu(), {});
  const double C = double(m.d_model), F = double(m.ffn_hidden), E = double(m.n_experts);
  const double experts = double(m.n_layers) * E * 3 * C * F;  // wgu [E 2F, C] + wdown [E C, F] per layer
  // Stored parameters: the vocabulary padded to 2048 rows (tied table, counted once).
  const double P = double(m.num_params()) + double(padded_vocab(m, 1) - m.vocab_size) * C, dense = P - experts;
  EXPECT_DOUBLE_EQ(a.memory.params, 4 * P);
  EXPECT_DOUBLE_EQ(b.memory.params, 4 * (dense + experts / 2));
  EXPECT_DOUBLE_EQ(a.axes.at("dp").bytes, 1.5 * 4 * P);
  EXPECT_DOUBLE_EQ(b.axes.at("dp").bytes, 1.5 * 4 * dense);
  EXPECT_DOUBLE_EQ(b.axes.at("edp").bytes, 1.0 * 4 * experts / 2);
  EXPECT_GT(b.axes.at("ep").bytes, 0.0);
  EXPECT_EQ(a.axes.count("ep"), 0u);
  // Tune lists the ep layouts of a moe model, labelled with their ep.
  const TuneResult r = rank_layouts(m, 4, batch, cpu(), {});
  bool listed = false;
  for (const StepPrediction& q : r.ranked) listed |= layout_label(q.layout) == "tp=1 pp=1 dp=4 ep=2";
  EXPECT_TRUE(listed);
}

// Tune with the GEMM epilogues fused (PredictOptions::fuse_epilogues, what a GPU run trains by
// default) prices each layout's fused programs. Oracle: the fusion rule (sharding/Epilogues.h): every
// Megatron layout fuses at least GPT's GELU pair (its column linear and GELU are local at any tp),
// whose fused op keeps the GEMM's FLOPs and drops the pair's link traffic, so its compute is shorter
// on a GPU preset; the 3D grids fuse nothing (their GEMMs are their own ops), so theirs are
// unchanged; the saved activations are the same either way (pre and act are kept as the pair kept
// the GEMM's output and GELU's).
TEST(StepModel, TuneWithFusedEpiloguesPricesTheFusedPrograms) {
  const ModelConfig m = small_gpt();
  const ClusterPreset gpu = load_cluster(std::string(DHELIX_SOURCE_DIR) + "/configs/clusters/h100-8gpu.toml");
  ASSERT_TRUE(gpu.is_gpu());
  EXPECT_FALSE(cpu().is_gpu());
  PredictOptions plain_opt, fused_opt;
  plain_opt.precision = fused_opt.precision = Precision::kBf16;
  fused_opt.fuse_epilogues = true;
  const BatchSpec batch{8, 32, 1};
  const TuneResult plain = rank_layouts(m, 4, batch, gpu, plain_opt), fused = rank_layouts(m, 4, batch, gpu, fused_opt);
  ASSERT_EQ(plain.ranked.size(), fused.ranked.size());
  int megatron = 0, grids = 0;
  for (const StepPrediction& f : fused.ranked) {
    const std::string label = layout_label(f.layout);
    const auto p = std::find_if(plain.ranked.begin(), plain.ranked.end(),
                                [&](const StepPrediction& q) { return layout_label(q.layout) == label; });
    ASSERT_NE(p, plain.ranked.end()) << label;
    EXPECT_TRUE(f.layout.fuse_epilogues) << label;
    EXPECT_FALSE(p->layout.fuse_epilogues) << label;
    EXPECT_DOUBLE_EQ(f.memory.activations, p->memory.activations) << label;
    if (f.layout.is_3d()) {
      ++grids;
      EXPECT_DOUBLE_EQ(f.compute_s, p->compute_s) << label;
    } else {
      ++megatron;
      EXPECT_LT(f.compute_s, p->compute_s) << label;
    }
  }
  EXPECT_GT(megatron, 0);
  EXPECT_GT(grids, 0);
}

// Context parallelism, counted by hand: the small GPT at dp = 2 with ZeRO-1 against cp = 2 of those
// ranks. The weights are replicated over dp x cp, so the AdamW moments are split over 2 ranks either
// way and the gradients all-reduced over 2 ranks (on "dpcp" instead of "dp", same bytes); each rank
// holds T / cp = 16 of the 32 rows of its sequences, 2 of them (all 4 sequences of the micro-batch
// are on every cp rank instead of split over dp), so the saved activations are the same per rank;
// the ring moves 3 (cp - 1) key/value buffers [2 x 16, 2 C] per layer and micro-batch on "cp".
TEST(StepModel, ContextParallelMemoryAndVolumeByHand) {
  const ModelConfig m = small_gpt();
  LayoutConfig dp2, cp2;
  dp2.dp = 2;
  cp2.cp = 2;
  PredictOptions opt;
  opt.zero = Zero::kZero1;
  const StepPrediction a = predict(m, dp2, {4, 32, 2}, cpu(), opt), b = predict(m, cp2, {4, 32, 4}, cpu(), opt);
  const double P = double(m.num_params()), C = 64;
  EXPECT_DOUBLE_EQ(b.memory.optimizer, 8 * P / 2);
  EXPECT_DOUBLE_EQ(b.memory.activations, a.memory.activations);
  EXPECT_DOUBLE_EQ(b.axes.at("dpcp").bytes, a.axes.at("dp").bytes);
  EXPECT_EQ(b.axes.count("dp"), 0u);
  const double kv = 4.0 * (4 * 16) * 2 * C;  // B = 4 sequences x 16 rows, k and v [C] each, fp32
  EXPECT_DOUBLE_EQ(b.axes.at("cp").bytes, 3 * 1 * kv * double(m.n_layers) * 1);  // M = 1 micro-batch
  EXPECT_TRUE(b.notes.empty()) << b.notes[0];
  // A sequence that does not cut into 2 cp chunks is named.
  const std::vector<std::string> e = layout_errors(m, cp2, {4, 30, 4});
  ASSERT_FALSE(e.empty());
  EXPECT_NE(e[0].find("sequence 30 is not divisible by 2 x cp = 4"), std::string::npos) << e[0];
}

TEST(StepModel, EverySavedBufferHasASizeRule) {
  for (int ep : {1, 2}) {  // MoE, with and without expert parallelism
    LayoutConfig lay;
    lay.dp = 2, lay.ep = ep;
    ModelConfig m = model_preset("moe-demo");
    m.n_layers = 2;
    const StepPrediction p = predict(m, lay, {2, 64, 1}, cpu(), {});
    EXPECT_TRUE(p.notes.empty()) << "moe-demo ep=" << ep << ": " << p.notes[0];
  }
  for (const char* name : {"gpt2-124m", "llama-8b"})
    for (int tp : {1, 2}) {
      LayoutConfig lay;
      lay.tp = tp;
      ModelConfig m = model_preset(name);
      m.n_layers = 2;
      const StepPrediction p = predict(m, lay, {1, 64, 1}, cpu(), {});
      EXPECT_TRUE(p.notes.empty()) << name << " tp=" << tp << ": " << p.notes[0];
    }
}

// The pipeline's bubble is the walked body less the critical stage's passes (stage_mb_s: a
// micro-batch's, M of them): bubble_s = (step - optimizer) - M x stage_mb_s[critical] (dp = tp = 1:
// only the optimizer step follows the body), the critical stage one of the two. The body lies
// between the busiest stage's work and the two stages' work one after the other plus a message each
// way per micro-batch (no overlap at all). (The walk itself is checked against the op-by-op
// simulator, equal for every schedule, in StepSim.StepModelWalksEachPipelineScheduleAsTheSimulatorDoes;
// with stages of equal times it gives 1F1B's (p - 1) / (M + p - 1) of the body, tests/schedule.)
TEST(StepModel, PipelineBubbleIsTheBodyLessTheBusiestStagesWork) {
  const ModelConfig m = small_gpt();
  LayoutConfig lay;
  lay.pp = 2;
  ClusterPreset own_cores = cpu();
  own_cores.core_share = 0;  // every rank on a core of its own: no stage fills another's bubble
  const StepPrediction p = predict(m, lay, {4, 32, 1}, own_cores, {});  // M = 4 micro-batches
  EXPECT_EQ(p.micro_batches, 4);
  EXPECT_EQ(p.stages_per_core, 1);
  EXPECT_GT(p.optimizer_s, 0);
  ASSERT_EQ(p.stage_mb_s.size(), 2u);
  const double M = 4, t0 = p.stage_mb_s[0], t1 = p.stage_mb_s[1], body = p.step_s - p.optimizer_s;
  const AxisCost& pp = p.axes.at("pp");
  EXPECT_GT(pp.bytes, 0);
  EXPECT_TRUE(std::abs(p.bubble_s - (body - M * t0)) < 1e-12 * body ||
              std::abs(p.bubble_s - (body - M * t1)) < 1e-12 * body)
      << p.bubble_s << " vs " << body - M * t0 << " and " << body - M * t1;
  EXPECT_GT(body, M * std::max(t0, t1));
  EXPECT_LT(body, M * (t0 + t1) + pp.seconds);  // pp.seconds: both stages' messages of the step
}

// cpu-emulated: 2 ranks per node on one core (core_share 0.5), so pp = 2 puts both stages on one
// core. Oracle: the rule of StepModel.h from the per-stage times and the walked body of the same
// pipeline on cores of its own, which both predictions price alike: shared body = max(M (t0 + t1),
// unshared body) x 0.5.
TEST(StepModel, StagesSharingACoreFillEachOthersBubbles) {
  const ModelConfig m = small_gpt();
  LayoutConfig lay;
  lay.pp = 2;
  ClusterPreset own_cores = cpu();
  own_cores.core_share = 0;
  const StepPrediction shared = predict(m, lay, {4, 32, 1}, cpu(), {});
  const StepPrediction alone = predict(m, lay, {4, 32, 1}, own_cores, {});
  ASSERT_EQ(shared.stage_mb_s.size(), 2u);
  EXPECT_EQ(shared.stages_per_core, 2);
  const double t0 = shared.stage_mb_s[0], t1 = shared.stage_mb_s[1], M = 4;
  EXPECT_DOUBLE_EQ(alone.stage_mb_s[0], t0);
  // dp = tp = 1: only the optimizer step follows the pipeline body (no gradient all-reduce), so
  // step = body + that.
  const double alone_body = alone.step_s - alone.optimizer_s;
  EXPECT_GT(alone_body, M * std::max(t0, t1));  // its bubble
  EXPECT_NEAR(shared.step_s - shared.optimizer_s, std::max(M * (t0 + t1), alone_body) * 0.5, 1e-12);
  EXPECT_LT(shared.step_s, alone.step_s);
}

// The memory rule of tune's exclusion (and simulate's refusal, tests/sim/cli_simulate.sh):
// a layout fits when its per-rank figure is at most the device's memory_bytes. Oracle: the model's
// own figure T (an integer of bytes: element counts times element sizes): a device of T - 1 bytes
// does not hold it, one of T or T + 1 does, and only the figure decides (the prediction is the same).
TEST(StepModel, FitsUpToTheDeviceMemoryByTheByte) {
  const ModelConfig m = small_gpt();
  LayoutConfig lay;
  lay.dp = 2;
  ClusterPreset c = cpu();
  const double T = predict(m, lay, {2, 32, 1}, c, {}).memory.total();
  ASSERT_EQ(T, std::floor(T));
  for (const double d : {-1.0, 0.0, 1.0}) {
    c.memory_bytes = T + d;
    const StepPrediction p = predict(m, lay, {2, 32, 1}, c, {});
    EXPECT_EQ(p.memory.total(), T);
    EXPECT_EQ(p.fits, d >= 0) << "device memory T" << (d < 0 ? "-1" : d > 0 ? "+1" : "");
  }
}

// memory_per_stage (simulate's per-stage column): the stages' model states partition the model's.
// Oracle: with an untied head, the parameters, gradients and optimizer states summed over the pp = 2
// stages equal the pp = 1 rank's exactly (every unit lives on one stage); with GPT-2's tied table,
// the last stage also holds the token table's copy (V x d elements; not the learned positions,
// which stay on the first stage, as the trainer's ParamStore::tied_copy), each element with its
// bf16 weight (2 bytes), fp32 gradient (4) and, with bf16, AdamW's fp32 master and two moments
// (12): exactly 18 V d bytes more. (That memory_per_rank is the largest stage is its definition,
// checked as such.)
TEST(StepModel, StagesPartitionTheModelStatesAndTheTiedCopyIsTheTokenTable) {
  ModelConfig m = small_gpt();
  m.n_layers = 4;
  const BatchSpec batch{4, 32, 1};
  LayoutConfig one, two;
  two.pp = 2;
  auto states = [](const MemoryUse& u) { return u.params + u.grads + u.optimizer; };
  for (const bool tied : {false, true}) {
    m.tie_embeddings = tied;
    const std::vector<MemoryUse> whole =
        memory_per_stage(m, one, batch, Precision::kBf16, Zero::kNone, StrandInterleaving::kOff);
    const std::vector<MemoryUse> st =
        memory_per_stage(m, two, batch, Precision::kBf16, Zero::kNone, StrandInterleaving::kOff);
    ASSERT_EQ(whole.size(), 1u);
    ASSERT_EQ(st.size(), 2u);
    const double sum = states(st[0]) + states(st[1]);
    if (!tied) EXPECT_DOUBLE_EQ(sum, states(whole[0]));
    else EXPECT_DOUBLE_EQ(sum - states(whole[0]), 18.0 * double(m.vocab_size * m.d_model));
    const MemoryUse worst = memory_per_rank(m, two, batch, Precision::kBf16, Zero::kNone, StrandInterleaving::kOff);
    EXPECT_EQ(worst.total(), std::max(st[0].total(), st[1].total())) << (tied ? "tied" : "untied");
  }
}

TEST(StepModel, IllegalLayoutsNameTheReason) {
  const ModelConfig m = small_gpt();
  LayoutConfig lay;
  lay.tp_y = 3, lay.dp = 1;
  std::vector<std::string> e = layout_errors(m, lay, {3, 32, 1});
  ASSERT_FALSE(e.empty());
  EXPECT_NE(e[0].find("heads=4 is not divisible by Gy=3"), std::string::npos) << e[0];
  lay = {};
  lay.dp = 4;
  e = layout_errors(m, lay, {6, 32, 1});
  ASSERT_EQ(e.size(), 1u);
  EXPECT_NE(e[0].find("batch 6 is not divisible by dp = 4"), std::string::npos) << e[0];
  EXPECT_THROW(predict(m, lay, {6, 32, 1}, cpu(), {}), ConfigError);
}

TEST(LayoutSearch, CountsMatchBruteForce) {
  for (int n = 1; n <= 24; ++n) {
    int megatron = 0, grids = 0;
    for (int a = 1; a <= n; ++a)
      for (int b = 1; b <= n; ++b)
        for (int c = 1; c <= n; ++c) {
          if (a * b * c == n) ++megatron;
          for (int d = 1; d <= n; ++d)
            for (int p = 1; p <= n; ++p)  // grids with a pipeline too
              if (a * b * c * d * p == n && a * b * c > 1) ++grids;
        }
    EXPECT_EQ(int(enumerate_layouts(n).size()), megatron + grids) << "n=" << n;
  }
}

}  // namespace
}  // namespace dhelix

namespace dhelix {
namespace {

// The FLOP conventions against the published formulas, on GPT-2 124M's shape (a GPT block's
// matmuls are 12 h^2: qkv 3h^2, out h^2, MLP 8h^2). Oracles, per iteration of B sequences of s:
//   Megatron-LM (Narayanan et al. 2021, eq. 3 without recompute): 72 B s l h^2 (1 + s/6h + V/12lh)
//   AxoNN (with full recompute, Megatron's eq. 3):               96 B s l h^2 (1 + s/6h + V/16lh)
//   dhelix: 6 N + 6 l s h per token (causal attention counted once).
// Divided by B s; compared to 1e-12 relative (the same sums in another order).
TEST(FlopConventions, EqualThePublishedFormulas) {
  const ModelConfig m = model_preset("gpt2-124m");
  const double l = double(m.n_layers), h = double(m.d_model), V = double(m.vocab_size), s = 1024;
  ASSERT_EQ(m.ffn_hidden, 4 * m.d_model);
  const double megatron = 72 * l * h * h * (1 + s / (6 * h) + V / (12 * l * h));
  const double axonn = 96 * l * h * h * (1 + s / (6 * h) + V / (16 * l * h));
  const double dhelix = 6 * (12 * l * h * h + V * h) + 6 * l * s * h;
  EXPECT_NEAR(m.flops_per_token(1024, FlopConvention::kMegatron), megatron, 1e-12 * megatron);
  EXPECT_NEAR(m.flops_per_token(1024, FlopConvention::kAxonn), axonn, 1e-12 * axonn);
  EXPECT_NEAR(m.flops_per_token(1024, FlopConvention::kDhelix), dhelix, 1e-12 * dhelix);
  EXPECT_EQ(m.flops_per_token(1024, FlopConvention::kDhelix), m.flops_per_token(1024));
  // Llama-3.1 8B (GQA, SwiGLU, untied head) at T = 8192, counted by hand. C 4096, L 32, 32 heads of
  // D 128, 8 kv heads, F 14336, V 128256. Per layer: q 4096 x 4096 = 16,777,216; k, v 2 x 4096 x 1024
  // = 8,388,608; o 16,777,216; SwiGLU gate, up, down 3 x 4096 x 14336 = 176,160,768: 218,103,808;
  // x 32 = M_l 6,979,321,856; head V C = 525,336,576 (the input table is a lookup, no matmul); M =
  // 7,504,658,432. L T C = 32 x 8192 x 4096 = 1,073,741,824. dhelix 6 M + 6 LTC = 51,470,401,536;
  // megatron 6 M + 12 LTC = 57,912,852,480; axonn 8 M_l + 6 V C + 16 LTC = 76,166,463,488. Every
  // figure an integer below 2^53, so exact in double.
  const ModelConfig llama = model_preset("llama-8b");
  EXPECT_EQ(llama.flops_per_token(8192, FlopConvention::kDhelix), 51470401536.0);
  EXPECT_EQ(llama.flops_per_token(8192, FlopConvention::kMegatron), 57912852480.0);
  EXPECT_EQ(llama.flops_per_token(8192, FlopConvention::kAxonn), 76166463488.0);
  // Phi-3.5-MoE (16 SwiGLU experts of F 6400, top-2; GQA 32/8 heads; untied head) at T = 4096: only
  // the top-2 experts a token is routed to count, and the router. Per layer: attention q + o 2 x
  // 16,777,216 + k, v 8,388,608 = 41,943,040; 2 experts x 3 x 4096 x 6400 = 157,286,400; router
  // 16 x 4096 = 65,536: 199,294,976; x 32 = M_l 6,377,439,232; head 32064 x 4096 = 131,334,144; M =
  // 6,508,773,376. LTC = 32 x 4096 x 4096 = 536,870,912. dhelix 6 M + 6 LTC = 42,273,865,728;
  // megatron 6 M + 12 LTC = 45,495,091,200; axonn 8 M_l + 6 V C + 16 LTC = 60,397,453,312.
  const ModelConfig phi = model_preset("phi-3.5-moe");
  ASSERT_EQ(phi.n_experts, 16);
  ASSERT_EQ(phi.top_k, 2);
  EXPECT_EQ(phi.flops_per_token(4096, FlopConvention::kDhelix), 42273865728.0);
  EXPECT_EQ(phi.flops_per_token(4096, FlopConvention::kMegatron), 45495091200.0);
  EXPECT_EQ(phi.flops_per_token(4096, FlopConvention::kAxonn), 60397453312.0);
  FlopConvention c;
  EXPECT_TRUE(parse_flop_convention("axonn", c));
  EXPECT_EQ(c, FlopConvention::kAxonn);
  EXPECT_FALSE(parse_flop_convention("palm", c));
}

// Recomputation in the step model's memory rule (StepModel.h memory_per_rank): at pp = 1 a stage
// holds one micro-batch's saved buffers per layer; under full recompute each layer keeps its input
// x alone, and one layer's recomputed buffers (what none keeps, less x) are live while its backward
// runs. So none - full = (L - 1) (S - x), with S a GPT layer's saved elements per token written out
// by hand (test_recompute.cc's list: x, ln1 out + mean + rstd, qkv, attention out + lse, x2, ln2 out +
// mean + rstd, fc, gelu out = 8C + 2F + H + 4) times N tokens at the simulated element size.
TEST(StepModelRecompute, FullRecomputeMemoryFollowsTheClosedForm) {
  const ModelConfig m = model_preset("gpt2-124m");
  const BatchSpec batch{8, 1024, 1};
  LayoutConfig none;
  LayoutConfig full = none;
  full.recompute = Recompute::kFull;
  const MemoryUse a = memory_per_rank(m, none, batch, Precision::kBf16, Zero::kNone, StrandInterleaving::kOff, nullptr);
  const MemoryUse b = memory_per_rank(m, full, batch, Precision::kBf16, Zero::kNone, StrandInterleaving::kOff, nullptr);
  EXPECT_EQ(a.params, b.params);
  EXPECT_EQ(a.optimizer, b.optimizer);
  const double N = 1024, C = double(m.d_model), F = double(m.ffn_hidden), H = double(m.n_heads);
  const double L = double(m.n_layers), elem = 2;
  const double S = N * (8 * C + 2 * F + H + 4) * elem, x = N * C * elem;
  EXPECT_NEAR(a.activations - b.activations, (L - 1) * (S - x), 1e-9 * a.activations);
  // recompute_layers = n: n layers keep x, the other L - n keep S, one recomputing layer's buffers
  // live: none - rc = (n - 1) (S - x).
  LayoutConfig six = full;
  six.recompute_layers = 6;
  const MemoryUse c = memory_per_rank(m, six, batch, Precision::kBf16, Zero::kNone, StrandInterleaving::kOff, nullptr);
  EXPECT_NEAR(a.activations - c.activations, 5 * (S - x), 1e-9 * a.activations);
}

// The memory walk of a long step walks a shortened schedule (sim_detail::walk_schedule: the slots
// repeat after the warm-up). Oracle: the walk of the whole schedule, for every schedule (1F1B,
// interleaved v = 2 and 3, W), co-execution off and on, p = 1..4 and every M from p to 6pv + 2p,
// with units of unequal saved bytes; the peak per rank must be exactly equal.
TEST(StepModelMemoryWalk, AShortenedScheduleReachesTheWholeStepsPeak) {
  int checked = 0, shortened = 0;
  for (const PipelineKind kind : {PipelineKind::k1F1B, PipelineKind::kInterleaved, PipelineKind::kW})
    for (const int v : {1, 2, 3})
      for (const CoExecute co : {CoExecute::kOff, CoExecute::kOn})
        for (int p = 1; p <= 4; ++p) {
          if ((kind == PipelineKind::kInterleaved) != (v > 1)) continue;
          PipelineSpec spec;
          spec.kind = kind, spec.pp = p, spec.virtual_stages = v, spec.co_execute = co;
          spec.n_layers = p * (kind == PipelineKind::kW ? 2 : v) * 2;
          std::vector<double> saved;
          for (int u = 0; u < spec.n_layers + 2; ++u) saved.push_back(1 + (u * 7) % 5);
          for (int M = p; M <= 6 * p * v + 2 * p; ++M) {
            spec.micro_batches = M;
            if (!pipeline_spec_errors(spec).empty()) continue;
            const StepSchedule whole = make_schedule(spec), walked = sim_detail::walk_schedule(spec);
            shortened += walked.micro_batches < M;
            for (int r = 0; r < p; ++r, ++checked)
              EXPECT_EQ(sim_detail::walk_peak(walked, r, saved), sim_detail::walk_peak(whole, r, saved))
                  << pipeline_kind_name(kind) << " v=" << v << " co=" << int(co) << " p=" << p << " M=" << M
                  << " rank " << r << " (walked " << walked.micro_batches << ")";
          }
        }
  EXPECT_GT(shortened, 0);
  EXPECT_GT(checked, 500);
}

// AxoNN's weight caching (LayoutConfig::keep_gathered) in the memory rule: a layer that keeps its
// gathered weight blocks holds them once for the step (the first micro-batch gathers them, the
// last's backward is their last reader), so the activations grow by K kept layers times one layer's
// whole blocks: (4 C^2 + 2 C F) / (Gx Gy) elements for GPT (qkv, out, fc, proj; biases are not
// gathered) at the simulated element size -- with and without full recompute (a kept block is never
// remade, and a remade one is read only by recompute ops, so the recompute's live buffers do not
// change), and with Strand Interleaving's second micro-batch in flight too (the blocks are shared,
// not held per micro-batch). Model states do not change.
TEST(StepModelKeepGathered, KeptBlocksAreSavedBuffersOfTheirLayers) {
  const ModelConfig m = model_preset("gpt2-124m");
  const BatchSpec batch{8, 1024, 1};
  const double C = double(m.d_model), F = double(m.ffn_hidden), L = double(m.n_layers), elem = 2;
  for (const auto& [r, si] : {std::pair{Recompute::kNone, StrandInterleaving::kOff},
                             std::pair{Recompute::kFull, StrandInterleaving::kOff},
                             std::pair{Recompute::kFull, StrandInterleaving::kOn}}) {
    LayoutConfig gather;
    gather.tp_y = 2, gather.tp_z = 4, gather.dp = 1;
    gather.recompute = r;
    const double blocks = (4 * C * C + 2 * C * F) / double(gather.tp_x * gather.tp_y) * elem;
    const MemoryUse a = memory_per_rank(m, gather, batch, Precision::kBf16, Zero::kNone, si, nullptr);
    for (const int keep : {3, int(L)}) {
      LayoutConfig kept = gather;
      kept.keep_gathered = keep;
      std::vector<std::string> notes;
      const MemoryUse b = memory_per_rank(m, kept, batch, Precision::kBf16, Zero::kNone, si, &notes);
      EXPECT_TRUE(notes.empty()) << notes.front();  // every saved buffer has a size rule
      EXPECT_EQ(a.params + a.grads + a.optimizer, b.params + b.grads + b.optimizer);
      EXPECT_NEAR(b.activations - a.activations, keep * blocks, 1e-9 * b.activations)
          << recompute_name(r) << " keep_gathered=" << keep;
    }
  }
  // Under 1F1B at pp = 2 the first stage holds two micro-batches' saved buffers (M = 2 in flight),
  // but its kept blocks once: 3 of its 6 layers kept add 3 layers' blocks, not 6.
  LayoutConfig piped;
  piped.tp_y = 2, piped.tp_z = 4, piped.pp = 2, piped.dp = 1;
  LayoutConfig kept = piped;
  kept.keep_gathered = 3;
  const std::vector<MemoryUse> a =
      memory_per_stage(m, piped, batch, Precision::kBf16, Zero::kNone, StrandInterleaving::kOff, nullptr);
  const std::vector<MemoryUse> b =
      memory_per_stage(m, kept, batch, Precision::kBf16, Zero::kNone, StrandInterleaving::kOff, nullptr);
  ASSERT_EQ(a.size(), 2u);
  const double blocks = (4 * C * C + 2 * C * F) / double(piped.tp_y) * elem;
  EXPECT_NEAR(b[0].activations - a[0].activations, 3 * blocks, 1e-9 * b[0].activations) << "pp=2 stage 0";
}

}  // namespace
}  // namespace dhelix
