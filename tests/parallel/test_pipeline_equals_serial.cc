// Pipeline parallelism equals serial, on threads-as-ranks. Oracle: the single-process run (1F1B at
// pp = 1, co-execution off: forward then backward per micro-batch) of the same 8-layer model on the
// same batches. A pipeline only changes where and when each micro-batch's passes run: every
// parameter's gradient still accumulates micro-batch 0, 1, ... through the same kernels, the loss
// is summed in micro-batch order on the stage holding the head, and the gradient norm adds the same
// per-parameter parts in the same order (Optimizer), so losses over 10 steps and the step-1
// gradients are bitwise equal (Llama, untied here) -- except for a tied embedding (GPT), whose
// table gets the head's and the embedding's backward of every micro-batch. One process adds them
// h0 + e0 + h1 + e1 + ...; a pipeline cannot keep that order: with 1F1B and interleaved the two
// copies live on different stages (E = e0 + e1 + ... and H = h0 + h1 + ..., summed as E + H), and the
// W's stage 0 runs the head's backward of micro-batches j+1 ... j+p-1 before the embedding's
// backward of j. That tensor's step-1 gradient is held to kGradRelTol (ParallelHarness.h: fp32
// regrouping) and, as the updates then differ by rounding, the losses to kLossRelTol; every other
// step-1 gradient stays bitwise.
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <mutex>
#include <tuple>

#include "../train/TempDir.h"
#include "ParallelHarness.h"
#include "schedule/Pipelines.h"
#include "sim/StepModel.h"
#include "train/Config.h"
#include "train/Trainer.h"

namespace dhelix::testing {
namespace {

struct PipeCase {
  ModelFamily family;
  PipelineKind kind;
  int pp;
  CoExecute si;
};

std::string case_name(const ::testing::TestParamInfo<PipeCase>& info) {
  const PipeCase& c = info.param;
  return fmt::format("{}_{}_pp{}_si{}", family_name(c.family), pipeline_kind_name(c.kind), c.pp,
                     c.si == CoExecute::kOn ? "on" : "off");
}

// The tiny model with 8 layers (W at pp = 4 needs L % 8 == 0) and 2 pp micro-batches per step.
RunConfig pipe_config(ModelFamily family, int dp, int tp, int pp, PipelineKind kind, CoExecute si,
                      const std::string& prefix, const std::string& out) {
  RunConfig cfg = tiny_config(family, dp, tp, 0, prefix, out);
  cfg.model.n_layers = 8;
  cfg.model.tie_embeddings = family == ModelFamily::kGPT;
  cfg.parallel.pp = pp;
  cfg.schedule.pipeline = pipeline_kind_name(kind);
  cfg.schedule.virtual_stages = kind == PipelineKind::kInterleaved ? 2 : 1;
  cfg.schedule.strand_interleaving = si == CoExecute::kOn;
  cfg.training.micro_batches = 2 * pp;
  cfg.training.steps = 10;
  return cfg;
}

bool bitwise_equal(const Tensor& a, const Tensor& b) {
  return a.nbytes() == b.nbytes() && std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
}

class PipelineEqualsSerial : public ::testing::TestWithParam<PipeCase> {};

// combination: 1f1b
// combination: 1f1b si
// combination: interleaved
// combination: interleaved si
// combination: w
// combination: w si
TEST_P(PipelineEqualsSerial, LossesAndFirstGradients) {
  const PipeCase c = GetParam();
  TempDir dir;
  const std::string prefix = write_walk_dataset(dir.path());
  RunConfig serial_cfg = pipe_config(c.family, 1, 1, 1, PipelineKind::k1F1B, CoExecute::kOff, prefix, dir / "serial");
  serial_cfg.training.micro_batches = 2 * c.pp;
  RunResult serial = run_serial(serial_cfg, Grads::kCollect);
  RunResult par = run_local(pipe_config(c.family, 1, 1, c.pp, c.kind, c.si, prefix, dir / "pipe"), Grads::kCollect);

  const bool split_tied = c.family == ModelFamily::kGPT;  // tied "wte" (above)
  ASSERT_EQ(par.first_grads.size(), serial.first_grads.size());
  for (const auto& [name, g] : serial.first_grads) {
    const Tensor& p = par.first_grads.at(name);
    if (split_tied && name == "wte") {
      const double dev = max_grad_deviation({{name, p}}, {{name, g}});
      fmt::print("[measured] {}: tied wte step-1 gradient rel dev {:.2e}\n", case_name({c, 0}), dev);
      EXPECT_LE(dev, kGradRelTol);
    } else {
      EXPECT_TRUE(bitwise_equal(p, g)) << name << " differs (max rel dev " << max_grad_deviation({{name, p}}, {{name, g}})
                                       << ")";
    }
  }
  ASSERT_EQ(par.losses.size(), serial.losses.size());
  if (split_tied) {
    EXPECT_LE(max_rel_deviation(par.losses, serial.losses), kLossRelTol);
  } else {
    for (size_t i = 0; i < serial.losses.size(); ++i)
      EXPECT_EQ(std::memcmp(&par.losses[i], &serial.losses[i], sizeof(double)), 0)
          << "step " << i + 1 << ": " << par.losses[i] << " vs " << serial.losses[i];
  }
  EXPECT_LT(serial.losses.back(), serial.losses.front() - 0.1);  // it trains, or equality proves little
}

std::vector<PipeCase> all_cases() {
  std::vector<PipeCase> v;
  for (ModelFamily f : {ModelFamily::kGPT, ModelFamily::kLlama})
    for (PipelineKind k : {PipelineKind::k1F1B, PipelineKind::kInterleaved, PipelineKind::kW})
      for (int pp : {2, 4})
        for (CoExecute si : {CoExecute::kOff, CoExecute::kOn}) v.push_back({f, k, pp, si});
  // MoE: each stage routes its own layers' tokens; the folded W and 1F1B with co-execution.
  for (PipelineKind k : {PipelineKind::k1F1B, PipelineKind::kW}) v.push_back({ModelFamily::kMoE, k, 2, CoExecute::kOn});
  return v;
}

INSTANTIATE_TEST_SUITE_P(Pipelines, PipelineEqualsSerial, ::testing::ValuesIn(all_cases()), case_name);

// pp = 2 x tp = 2 x dp = 2 (8 ranks), the W with co-execution, against the single process within
// the dp/tp tolerances of ParallelHarness.h (tp and dp regroup fp32 sums); GPT with plain dp, Llama
// with ZeRO-1 (each stage's buckets reduce-scattered over its dp group).
// combination: dp tp w si
// combination: dp tp w si zero1
TEST(PipelineTpDp, WithinTolerances) {
  for (ModelFamily f : {ModelFamily::kGPT, ModelFamily::kLlama}) {
    TempDir dir;
    const std::string prefix = write_walk_dataset(dir.path());
    RunConfig s = pipe_config(f, 1, 1, 1, PipelineKind::k1F1B, CoExecute::kOff, prefix, dir / "serial");
    s.training.micro_batches = 4;
    RunResult serial = run_serial(s, Grads::kCollect);
    RunConfig pc = pipe_config(f, 2, 2, 2, PipelineKind::kW, CoExecute::kOn, prefix, dir / "pipe");
    const bool zero = f == ModelFamily::kLlama;
    pc.parallel.zero = zero ? 1 : 0;
    // ZeRO-1 holds reduced gradients only in chunks: the step-1 gradients come from the plain-dp run.
    RunResult par = run_local(pc, zero ? Grads::kSkip : Grads::kCollect);
    if (zero) {
      pc.parallel.zero = 0;
      par.first_grads = run_local(pc, Grads::kCollect).first_grads;
    }
    std::string worst;
    const double grad_dev = max_grad_deviation(par.first_grads, serial.first_grads, &worst);
    const double loss_dev = max_rel_deviation(par.losses, serial.losses);
    fmt::print("[measured] {} pp2 tp2 dp2{} w+si: grad max rel dev {:.2e} ({}), loss max rel dev {:.2e}\n",
               family_name(f), zero ? " zero1" : "", grad_dev, worst, loss_dev);
    EXPECT_EQ(par.first_grads.size(), serial.first_grads.size());
    EXPECT_LE(grad_dev, kGradRelTol) << family_name(f) << " worst tensor " << worst;
    EXPECT_LE(loss_dev, kLossRelTol) << family_name(f);
  }
}

}  // namespace
}  // namespace dhelix::testing

namespace dhelix::testing {
namespace {

// Layout-free checkpoints across pipelines. Oracle: the pp = 2 W run itself, continued past its
// step-6 checkpoint; a run resumed from that checkpoint at pp = 2 (W), pp = 1 and pp = 4 (1F1B) must
// take bitwise the same next steps (untied Llama: no layout here changes a reduction order, as the
// tests above show), at tp = 2 within kLossRelTol (tp regroups fp32 sums).
// combination: w si
// combination: 1f1b si
// combination: tp si
TEST(PipelineResharding, WCheckpointResumesOnOtherPipelinesAndTp) {
  TempDir dir;
  const std::string prefix = write_walk_dataset(dir.path());
  constexpr int kBefore = 6, kAfter = 4;
  auto cfg_of = [&](int tp, int pp, PipelineKind kind, const std::string& out) {
    RunConfig c = pipe_config(ModelFamily::kLlama, 1, tp, pp, kind, CoExecute::kOn, prefix, dir / out);
    c.model.tie_embeddings = false;
    c.training.micro_batches = 4;
    c.checkpoint.dir = dir / "ck";
    c.checkpoint.keep = 0;
    return c;
  };
  const CheckpointedRun base = run_with_checkpoint(cfg_of(1, 2, PipelineKind::kW, "w2"), kBefore, kAfter);
  const std::vector<double>& ref = base.after;
  ASSERT_EQ(ref.size(), size_t(kAfter));
  for (auto [tp, pp, kind] : {std::tuple{1, 2, PipelineKind::kW}, std::tuple{1, 1, PipelineKind::k1F1B},
                              std::tuple{1, 4, PipelineKind::k1F1B}, std::tuple{2, 1, PipelineKind::k1F1B}}) {
    const RunConfig c = cfg_of(tp, pp, kind, fmt::format("resume_tp{}_pp{}_{}", tp, pp, pipeline_kind_name(kind)));
    const std::vector<double> got = resume_losses(c, base.checkpoint, kAfter, kBefore);
    const double dev = max_rel_deviation(got, ref);
    fmt::print("[measured] resume pp=2 w step-{} checkpoint on tp={} pp={} {}: max rel dev over {} steps {:.2e}\n",
               kBefore, tp, pp, pipeline_kind_name(kind), kAfter, dev);
    if (tp == 1) EXPECT_EQ(got, ref) << "pp=" << pp << " " << pipeline_kind_name(kind) << " must resume bitwise";
    else EXPECT_LE(dev, kLossRelTol) << "tp=" << tp;
  }
}

}  // namespace
}  // namespace dhelix::testing

namespace dhelix::testing {
namespace {

// Per-stage peak activation bytes of one step (each rank's StepReport), pp ranks in order.
std::vector<int64_t> stage_peaks(const RunConfig& cfg) {
  std::vector<int64_t> peaks(static_cast<size_t>(cfg.parallel.pp), 0);
  std::mutex mu;
  on_local_ranks(cfg, [&](CommContext* comm) {
    Trainer t(cfg, comm, Quiet::kYes);
    const int64_t peak = t.train_step().peak_activation_bytes;
    std::lock_guard<std::mutex> lock(mu);
    peaks[static_cast<size_t>(comm ? comm->layout().coord().pp : 0)] = peak;
  });
  return peaks;
}

// The W's memory claim (reference/dhelix.md §8.4): every stage holds about one micro-batch of the
// whole model, as 1F1B's first stage does, and no more. Oracle: the largest per-stage peak of 1F1B
// (co-execution off, Megatron's schedule) on the same model and batches; bound 1.05 x that (the
// issue's 5%). The claim is about the W with co-execution (DHeLlam's schedule): a co-executed
// slot's backward frees its layer's activations as the forward allocates the mirror layer's. Run
// one after the other (co-execution off) the W's forward allocates before the backward frees, and
// stage 0's first chunk keeps a micro-batch from its forward's first pass to its backward's last,
// ~2p slots: measured 1.27x (pp = 2) and 1.16x (pp = 4) 1F1B's largest stage, near Megatron's
// interleaved schedule with the same two chunks per stage. Those are printed, not bounded.
// combination: w si
TEST(PipelineMemory, WWithStrandInterleavingPeakPerStageWithinOneF1BLargestStage) {
  TempDir dir;
  const std::string prefix = write_walk_dataset(dir.path());
  for (int pp : {2, 4}) {
    auto peaks_of = [&](PipelineKind k, CoExecute si) {
      RunConfig c = pipe_config(ModelFamily::kLlama, 1, 1, pp, k, si, prefix,
                                dir / fmt::format("mem_{}_{}_{}", pp, pipeline_kind_name(k), si == CoExecute::kOn));
      c.training.micro_batches = 4 * pp;
      std::vector<int64_t> p = stage_peaks(c);
      fmt::print("[measured] pp={} N={} {}{}: per-stage peak activations {} (max {})\n", pp, 4 * pp,
                 pipeline_kind_name(k), si == CoExecute::kOn ? "+si" : "", fmt::join(p, " "),
                 *std::max_element(p.begin(), p.end()));
      return *std::max_element(p.begin(), p.end());
    };
    const double f1b = static_cast<double>(peaks_of(PipelineKind::k1F1B, CoExecute::kOff));
    const double w_si = static_cast<double>(peaks_of(PipelineKind::kW, CoExecute::kOn));
    const double w = static_cast<double>(peaks_of(PipelineKind::kW, CoExecute::kOff));
    const double il = static_cast<double>(peaks_of(PipelineKind::kInterleaved, CoExecute::kOff));
    fmt::print("[measured] pp={}: largest stage over 1F1B's: W+SI {:.3f}, W {:.3f}, interleaved v=2 {:.3f}\n", pp,
               w_si / f1b, w / f1b, il / f1b);
    EXPECT_LE(w_si, 1.05 * f1b) << "pp=" << pp;
  }
}

}  // namespace
}  // namespace dhelix::testing

namespace dhelix::testing {
namespace {

// A tied embedding split over stages (GPT, 1F1B: the table on stage 0, the head's copy on stage 1),
// with dp = 2, plain and ZeRO-1. Oracles: the two copies stay bitwise equal after 8 updates (both
// stages sum E + H, then reduce and update it identically), and the losses follow the single
// process within kLossRelTol (the tied table's sum is regrouped, above).
// combination: dp 1f1b si
// combination: dp 1f1b si zero1
TEST(PipelineTiedEmbedding, CopiesStayEqualWithPlainDpAndZero1) {
  TempDir dir;
  const std::string prefix = write_walk_dataset(dir.path());
  RunConfig s = pipe_config(ModelFamily::kGPT, 1, 1, 1, PipelineKind::k1F1B, CoExecute::kOff, prefix, dir / "serial");
  s.training.steps = 8;
  s.training.micro_batches = 4;  // the same global batches as the dp = 2 runs (4 sequences per micro-batch)
  const RunResult serial = run_serial(s);
  for (int zero : {0, 1}) {
    RunConfig c = pipe_config(ModelFamily::kGPT, 2, 1, 2, PipelineKind::k1F1B, CoExecute::kOn, prefix,
                              dir / fmt::format("tied_zero{}", zero));
    c.parallel.zero = zero;
    c.training.micro_batches = 4;
    c.training.steps = 8;
    std::map<std::pair<int, int>, Tensor> tables;  // (dp, pp) -> this rank's "wte" after training
    std::vector<double> losses;
    std::mutex mu;
    on_local_ranks(c, [&](CommContext* comm) {
      Trainer t(c, comm, Quiet::kYes);
      std::vector<double> l;
      for (int64_t i = 0; i < c.training.steps; ++i) l.push_back(t.train_step().loss);
      std::lock_guard<std::mutex> lock(mu);
      tables[{comm->layout().coord().dp, comm->layout().coord().pp}] = t.params().get("wte").value.clone();
      if (comm->rank() == 0) losses = l;
    });
    ASSERT_EQ(tables.size(), 4u);
    for (int dp = 0; dp < 2; ++dp)
      EXPECT_TRUE(bitwise_equal(tables.at({dp, 0}), tables.at({dp, 1}))) << "zero=" << zero << " dp rank " << dp;
    EXPECT_TRUE(bitwise_equal(tables.at({0, 0}), tables.at({1, 0}))) << "zero=" << zero << ": dp replicas differ";
    const double dev = max_rel_deviation(losses, serial.losses);
    fmt::print("[measured] gpt 1f1b+si pp2 dp2 zero{} (tied table split over stages): loss max rel dev {:.2e}\n",
               zero, dev);
    EXPECT_LE(dev, kLossRelTol) << "zero=" << zero;
  }
}


// The step model's memory rule (sim/StepModel.h memory_per_stage, which `dhelix simulate` and the
// trainer's memory check run on the config's schedule) walks each rank's slots: a forward keeps its
// units' saved buffers, a backward frees them, a co-executed pair's forward keeps its unit as the
// backward frees its mirror. Oracle: the engine's measured peak activation bytes of each stage over
// one step (each rank's StepReport), for the three families, pp 1, 2 and 4, each schedule (1F1B,
// interleaved v = 2, W), Strand Interleaving off and on. Bound: the rule counts the saved buffers
// live at unit boundaries, so it may not exceed the measured peak; what it leaves out is the working
// buffers of the unit running, which come to less than that unit's own saved buffers -- so the
// measured peak lies within one transformer layer's saved bytes of one micro-batch above it (measured
// 0.05-0.81 of a layer over these 114 stages). The rule before the walk counted every schedule as
// 1F1B: 26% low on the W's largest stage (pp = 2) and 31% low on the interleaved one (pp = 4).
// combination: 1f1b si
// combination: interleaved si
// combination: w si
TEST(PipelineMemory, StepModelWalksEachScheduleToWithinOneLayerOfTheMeasuredPeak) {
  TempDir dir;
  const std::string prefix = write_walk_dataset(dir.path());
  int stages = 0;
  for (ModelFamily fam : {ModelFamily::kLlama, ModelFamily::kGPT, ModelFamily::kMoE})
    for (int pp : {1, 2, 4})
      for (PipelineKind k : {PipelineKind::k1F1B, PipelineKind::kInterleaved, PipelineKind::kW})
        for (CoExecute si : {CoExecute::kOff, CoExecute::kOn}) {
          if (pp == 1 && k != PipelineKind::k1F1B) continue;
          const std::string label = fmt::format("{} pp={} {}{}", family_name(fam), pp, pipeline_kind_name(k),
                                                si == CoExecute::kOn ? "+si" : "");
          RunConfig c = pipe_config(fam, 1, 1, pp, k, si, prefix,
                                    dir / fmt::format("walk_{}_{}_{}_{}", family_name(fam), pp, pipeline_kind_name(k),
                                                      si == CoExecute::kOn));
          c.training.micro_batches = 2 * pp + 2;
          const std::vector<int64_t> measured = stage_peaks(c);
          const LayoutConfig lay = layout_config(c);
          const int64_t mb = c.training.micro_batch_size;
          const StepSchedule sch = make_schedule(pipeline_spec(c));
          const std::vector<MemoryUse> rule =
              memory_per_stage(c.model, lay, {mb * c.training.micro_batches, c.model.seq_len, mb}, Precision::kFp32,
                               Zero::kNone, si == CoExecute::kOn ? StrandInterleaving::kOn : StrandInterleaving::kOff,
                               nullptr, &sch);
          // One layer's saved bytes of one micro-batch: the rule's one-stage figure for L layers less
          // that for L - 1.
          ModelConfig fewer = c.model;
          fewer.n_layers -= 1;
          const BatchSpec one{mb, c.model.seq_len, mb};
          const double layer =
              memory_per_rank(c.model, {}, one, Precision::kFp32, Zero::kNone, StrandInterleaving::kOff).activations -
              memory_per_rank(fewer, {}, one, Precision::kFp32, Zero::kNone, StrandInterleaving::kOff).activations;
          ASSERT_GT(layer, 0) << label;
          ASSERT_EQ(rule.size(), measured.size()) << label;
          for (size_t s = 0; s < rule.size(); ++s, ++stages) {
            const double got = rule[s].activations, want = double(measured[s]);
            EXPECT_LE(got, want) << label << " stage " << s;
            EXPECT_GE(got, want - layer) << label << " stage " << s << " (layer " << layer << " bytes)";
          }
        }
  EXPECT_EQ(stages, 114);
}
}  // namespace
}  // namespace dhelix::testing
