// Parallel equals serial, on threads-as-ranks (the local backend runs the same collectives, in
// the same per-group order, as MPI). Oracle: the single-process run of the same model on the same
// global batches (the DataLoader gives dp rank r windows [r*B, (r+1)*B) of each global
// micro-batch, so dp=D with B per rank sees exactly what one process with D*B sees).
// Tolerances: ParallelHarness.h.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <mutex>

#include "../train/TempDir.h"
#include "ParallelHarness.h"
#include "train/Trainer.h"

namespace dhelix::testing {
namespace {

struct Case {
  ModelFamily family;
  int dp, tp;
};

std::string case_name(const ::testing::TestParamInfo<Case>& info) {
  return fmt::format("{}_dp{}_tp{}", family_name(info.param.family), info.param.dp, info.param.tp);
}

class ParallelEqualsSerial : public ::testing::TestWithParam<Case> {};

// combination: dp si
// combination: tp si
// combination: dp tp si
TEST_P(ParallelEqualsSerial, LossesAndFirstGradients) {
  const Case c = GetParam();
  TempDir dir;
  const std::string prefix = write_walk_dataset(dir.path());
  const int64_t kv = c.tp == 4 ? 4 : 2;
  RunResult serial = run_serial(tiny_config(c.family, 1, 1, 0, prefix, dir / "serial", kv), Grads::kCollect);
  RunResult par = run_local(tiny_config(c.family, c.dp, c.tp, 0, prefix, dir / "par", kv), Grads::kCollect);

  std::string worst;
  const double grad_dev = max_grad_deviation(par.first_grads, serial.first_grads, &worst);
  const double loss_dev = max_rel_deviation(par.losses, serial.losses);
  const double step1_dev = std::abs(par.losses[0] - serial.losses[0]) / serial.losses[0];
  fmt::print("[measured] {} dp={} tp={}: grad max rel dev {:.2e} ({}), loss step-1 rel dev {:.2e}, "
             "20-step max rel dev {:.2e}; loss {:.4f} -> {:.4f}\n",
             family_name(c.family), c.dp, c.tp, grad_dev, worst, step1_dev, loss_dev, serial.losses.front(),
             serial.losses.back());
  EXPECT_EQ(par.first_grads.size(), serial.first_grads.size());
  EXPECT_LE(grad_dev, kGradRelTol) << "worst tensor " << worst;
  EXPECT_LE(loss_dev, kLossRelTol);
  // The data must actually train, or equal losses would prove little.
  EXPECT_LT(serial.losses.back(), serial.losses.front() - 0.1);
}

INSTANTIATE_TEST_SUITE_P(Layouts, ParallelEqualsSerial,
                         ::testing::Values(Case{ModelFamily::kLlama, 2, 1}, Case{ModelFamily::kLlama, 1, 2},
                                           Case{ModelFamily::kLlama, 2, 2}, Case{ModelFamily::kLlama, 1, 4},
                                           Case{ModelFamily::kGPT, 2, 1}, Case{ModelFamily::kGPT, 1, 2},
                                           Case{ModelFamily::kGPT, 2, 2}, Case{ModelFamily::kGPT, 1, 4},
                                           Case{ModelFamily::kMoE, 1, 2}),
                         case_name);

// MoE under data parallelism (experts replicated, their gradients reduced with the rest). The
// load-balancing loss is computed per rank and micro-batch (as Megatron does per rank), so the
// oracle is the single process running each dp rank's share of a global micro-batch as a micro-batch
// of its own: micro_batch_size B/dp and dp*M micro-batches (the DataLoader hands dp rank r window r of
// each global micro-batch; the one process reads the same windows in the same order). Routing, aux
// terms and per-token losses are then identical; only the gradient sums regroup (tolerances:
// ParallelHarness.h). Also with ZeRO-1, with tp = 2 inside each replica (sequence-parallel
// attention; each tp rank routes its sequence shard and the router statistics are summed over tp),
// and with expert parallelism (ep = 2 of dp = 2 or 4, ep = 4 of dp = 4, alone and with tp = 2: each
// rank holds E / ep of the 4 experts, tokens go to them and back by all-to-all, expert gradients
// are reduced over the edp ranks), also with ZeRO-1 (the experts' optimizer state sharded over edp).
// combination: dp si
// combination: dp si zero1
// combination: dp tp si
// combination: dp ep si
// combination: dp tp ep si
// combination: dp ep si zero1
TEST(MoeDataParallel, EqualsSerialOverPerRankMicroBatches) {
  TempDir dir;
  const std::string prefix = write_walk_dataset(dir.path());
  RunConfig serial_cfg = tiny_config(ModelFamily::kMoE, 1, 1, 0, prefix, dir / "serial");
  struct Lay {
    int dp, tp, ep, zero;
  };
  for (const Lay& l : {Lay{2, 1, 1, 0}, Lay{2, 1, 1, 1}, Lay{2, 2, 1, 0}, Lay{2, 1, 2, 0}, Lay{4, 1, 2, 0},
                       Lay{4, 1, 4, 0}, Lay{2, 2, 2, 0}, Lay{4, 2, 4, 0}, Lay{2, 1, 2, 1}, Lay{4, 1, 2, 1}}) {
    const int tp = l.tp, zero = l.zero, dp = l.dp;
    RunConfig par_cfg = tiny_config(ModelFamily::kMoE, dp, tp, zero, prefix,
                                    dir / fmt::format("dp{}_tp{}_ep{}_zero{}", dp, tp, l.ep, zero));
    par_cfg.parallel.ep = l.ep;
    RunConfig s = serial_cfg;
    s.training.micro_batch_size = par_cfg.training.micro_batch_size;
    s.training.micro_batches = dp * par_cfg.training.micro_batches;
    ASSERT_EQ(s.tokens_per_step(), par_cfg.tokens_per_step());
    // ZeRO-1 shards the gradients over dp (no full copy to gather): losses only there.
    const Grads grads = zero == 0 ? Grads::kCollect : Grads::kSkip;
    RunResult serial = run_serial(s, grads);
    RunResult par = run_local(par_cfg, grads);
    std::string worst;
    const double grad_dev = zero == 0 ? max_grad_deviation(par.first_grads, serial.first_grads, &worst) : 0.0;
    const double loss_dev = max_rel_deviation(par.losses, serial.losses);
    fmt::print("[measured] moe dp={} tp={} ep={} zero={}: grad max rel dev {:.2e} ({}), 20-step max rel loss dev "
               "{:.2e}; loss {:.4f} -> {:.4f}\n",
               dp, tp, l.ep, zero, grad_dev, worst, loss_dev, serial.losses.front(), serial.losses.back());
    EXPECT_EQ(par.first_grads.size(), serial.first_grads.size());
    EXPECT_LE(grad_dev, kGradRelTol) << "worst tensor " << worst;
    EXPECT_LE(loss_dev, kLossRelTol);
    EXPECT_LT(serial.losses.back(), serial.losses.front() - 0.1);
  }
}

// Expert parallelism under Strand Interleaving: the all-to-alls are ops of the layer program, so SI
// only reorders whole ops between two micro-batches. Oracle: the same ep = 2 run with SI off;
// losses bitwise equal over 20 steps (M = 3, so fwd(mb i) runs beside bwd(mb i-1) with both strands'
// token exchanges on the one ep group).
// combination: dp ep si
TEST(MoeExpertParallel, StrandInterleavingOnOffBitwise) {
  TempDir dir;
  const std::string prefix = write_walk_dataset(dir.path());
  RunConfig on = tiny_config(ModelFamily::kMoE, 2, 1, 0, prefix, dir / "on");
  on.parallel.ep = 2;
  on.training.micro_batches = 3;
  EXPECT_EQ(si_on_off_difference(on, dir / "off"), "");
}

// An ep = 2 checkpoint is layout-free: the experts gathered over ep on save, cut again on load.
// Oracle: the ep = 2 run itself continued (same layout: bitwise) and the plain dp = 2 run resumed
// from it (ep = 1, every rank all experts: the same model, within kLossRelTol since the expert
// gradients' sums regroup).
// combination: dp ep si
// combination: dp si
TEST(MoeExpertParallel, CheckpointResumesOnOtherLayouts) {
  TempDir dir;
  const std::string prefix = write_walk_dataset(dir.path());
  constexpr int kBefore = 4, kAfter = 4;
  auto cfg_of = [&](int ep, const std::string& out) {
    RunConfig c = tiny_config(ModelFamily::kMoE, 2, 1, 0, prefix, dir / out);
    c.parallel.ep = ep;
    c.checkpoint.dir = dir / "ck";
    c.checkpoint.keep = 0;
    return c;
  };
  const CheckpointedRun base = run_with_checkpoint(cfg_of(2, "ep2"), kBefore, kAfter);
  for (int ep : {2, 1}) {
    const std::vector<double> got = resume_losses(cfg_of(ep, fmt::format("resume_ep{}", ep)), base.checkpoint, kAfter,
                                                  kBefore);
    const double dev = max_rel_deviation(got, base.after);
    fmt::print("[measured] resume ep=2 checkpoint on ep={}: max rel loss dev over {} steps {:.2e}\n", ep, kAfter, dev);
    if (ep == 2) EXPECT_EQ(got, base.after) << "same-layout resume must be bitwise";
    else EXPECT_LE(dev, kLossRelTol);
  }
}

// Routing edge cases through expert parallelism (dp = ep = 2, each rank 2 of the 4 experts): every
// router weight zero, so every gate ties (all logits equal; top-k keeps the lower indices). With
// top_k = 1 every token goes to expert 0: experts 1-3 receive nothing and ep rank 1 (experts 2, 3)
// gets no rows at all; with top_k = 2 every token goes to experts 0 and 1. Oracle: the single process
// on each rank's micro-batches (as EqualsSerialOverPerRankMicroBatches), its routers zeroed alike:
// step-1 gradients (the tied routing) and 5 steps of losses within ParallelHarness.h's tolerances.
// combination: dp ep si
TEST(MoeExpertParallel, RoutingEdgeCasesEqualSerial) {
  TempDir dir;
  const std::string prefix = write_walk_dataset(dir.path());
  const Prepare zero_routers = [](Trainer& t) {
    for (ParamEntry& e : t.params().entries())
      if (e.spec.name.ends_with(".router")) e.value.zero_();
  };
  for (int k : {1, 2}) {
    RunConfig par = tiny_config(ModelFamily::kMoE, 2, 1, 0, prefix, dir / fmt::format("ep_k{}", k));
    par.parallel.ep = 2;
    par.model.top_k = k;
    par.training.steps = 5;
    RunConfig ser = tiny_config(ModelFamily::kMoE, 1, 1, 0, prefix, dir / fmt::format("serial_k{}", k));
    ser.model.top_k = k;
    ser.training.steps = 5;
    ser.training.micro_batch_size = par.training.micro_batch_size;
    ser.training.micro_batches = 2 * par.training.micro_batches;
    const RunResult a = run_local(par, Grads::kCollect, zero_routers);
    const RunResult b = run_serial(ser, Grads::kCollect, zero_routers);
    std::string worst;
    const double grad_dev = max_grad_deviation(a.first_grads, b.first_grads, &worst);
    const double loss_dev = max_rel_deviation(a.losses, b.losses);
    fmt::print("[measured] moe ep=2 zero routers top_k={}: grad max rel dev {:.2e} ({}), loss max rel dev {:.2e}\n", k,
               grad_dev, worst, loss_dev);
    // The experts that got no tokens have no gradient on either side; those that did, do.
    const Tensor& w = b.first_grads.at("layers.0.experts.wgu");
    const int64_t per = w.numel() / 4;
    double used = 0, unused = 0;
    for (int64_t i = 0; i < w.numel(); ++i) (i / per < k ? used : unused) += std::abs(w.f32()[i]);
    EXPECT_GT(used, 0.0);
    EXPECT_EQ(unused, 0.0);
    EXPECT_EQ(a.first_grads.size(), b.first_grads.size());
    EXPECT_LE(grad_dev, kGradRelTol) << "worst tensor " << worst;
    EXPECT_LE(loss_dev, kLossRelTol);
  }
}

// ZeRO-1 with expert parallelism: dp = 4, ep = 2, so the dense buckets are sharded over the 4 dp
// ranks and the experts' over the 2 edp ranks holding the same experts. Oracles: the plain (ZeRO-0)
// run of the same layout, within kLossRelTol (the gradient sums of 4 dp ranks regroup between
// reduce-scatter and all-reduce); its checkpoint (optimizer state gathered over dp and edp, experts
// over ep) resumed on the same layout (bitwise) and without ZeRO (within kLossRelTol).
// combination: dp ep si zero1
// combination: dp ep si
TEST(MoeExpertParallel, ZeroOneShardsExpertsOverEdp) {
  TempDir dir;
  const std::string prefix = write_walk_dataset(dir.path());
  constexpr int kBefore = 4, kAfter = 4;
  auto cfg_of = [&](int zero, const std::string& out) {
    RunConfig c = tiny_config(ModelFamily::kMoE, 4, 1, zero, prefix, dir / out);
    c.parallel.ep = 2;
    c.checkpoint.dir = dir / "ck";
    c.checkpoint.keep = 0;
    return c;
  };
  RunConfig plain = cfg_of(0, "plain"), zero = cfg_of(1, "zero");
  plain.training.steps = zero.training.steps = 10;
  const double dev = max_rel_deviation(run_local(zero).losses, run_local(plain).losses);
  fmt::print("[measured] moe dp=4 ep=2 zero=1 vs zero=0: max rel loss dev over 10 steps {:.2e}\n", dev);
  EXPECT_LE(dev, kLossRelTol);
  const CheckpointedRun base = run_with_checkpoint(cfg_of(1, "zero_ck"), kBefore, kAfter);
  for (int z : {1, 0}) {
    const std::vector<double> got = resume_losses(cfg_of(z, fmt::format("resume_zero{}", z)), base.checkpoint, kAfter,
                                                  kBefore);
    const double rdev = max_rel_deviation(got, base.after);
    fmt::print("[measured] resume dp=4 ep=2 zero=1 checkpoint with zero={}: max rel loss dev {:.2e}\n", z, rdev);
    if (z == 1) EXPECT_EQ(got, base.after) << "same-layout resume must be bitwise";
    else EXPECT_LE(rdev, kLossRelTol);
  }
}

// ZeRO-1 against plain data parallelism, same layout. Oracle: the plain dp run; bitwise-equal
// losses. Why bitwise: with dp = 2 every reduced gradient element is one fp32 addition a + b, and
// fp addition is commutative, so reduce-scatter and all-reduce give the same bits; AdamW is
// elementwise; the only regrouped sum is the global grad norm (ZeRO sums squares per owned chunk,
// then all-reduces), which is accumulated in double, so the clip factor, rounded to fp32, comes out
// the same (a one-ulp flip would need the double sums to straddle an fp32 rounding boundary;
// measured: 20 of 20 steps bitwise in all four cases). With dp > 2 the order of three or more
// addends could differ and this would become a tolerance.
// combination: dp si zero1
// combination: dp tp si zero1
TEST(ZeroOne, EqualsPlainDataParallel) {
  TempDir dir;
  const std::string prefix = write_walk_dataset(dir.path());
  for (ModelFamily f : {ModelFamily::kLlama, ModelFamily::kGPT}) {
    for (int tp : {1, 2}) {
      RunResult plain = run_local(tiny_config(f, 2, tp, 0, prefix, dir / "plain"));
      RunResult zero = run_local(tiny_config(f, 2, tp, 1, prefix, dir / "zero"));
      const double dev = max_rel_deviation(zero.losses, plain.losses);
      int bitwise_steps = 0;
      for (size_t i = 0; i < plain.losses.size(); ++i) bitwise_steps += zero.losses[i] == plain.losses[i];
      fmt::print("[measured] ZeRO-1 vs plain, {} dp=2 tp={}: max rel loss dev {:.2e}, {} of {} steps bitwise\n",
                 family_name(f), tp, dev, bitwise_steps, plain.losses.size());
      EXPECT_EQ(zero.losses, plain.losses) << family_name(f) << " tp=" << tp << ": max rel dev " << dev;
    }
  }
}

// A GPU step's GradSync (GradSync::set_producer_stream: the backward strand's stream) does not wait
// for a unit's tp partial-gradient all-reduces where it issues them but when the next unit's backward
// is done (or at finish), so those parameters become ready later and, with dp > 1, the gradient
// buckets they complete are issued then. CPU groups ignore the stream, so the deferred path runs
// here as it will on a GPU. Oracle: the same run waiting at issue (no stream set): bitwise equal
// losses, since the same sums are taken and only when they are waited for moves -- and the run
// ends, which buckets issued in different orders on different ranks (mismatched collectives)
// would not. dp = tp = 2, SI on and off, both families.
TEST(GradSyncDeferred, TpPartialSumsWaitedOneUnitLaterEqualWaitingAtOnce) {
  TempDir dir;
  const std::string prefix = write_walk_dataset(dir.path());
  int stream_stand_in = 0;  // any non-null handle: the CPU groups never read it
  for (ModelFamily f : {ModelFamily::kLlama, ModelFamily::kGPT}) {
    for (bool si : {false, true}) {
      RunConfig cfg = tiny_config(f, 2, 2, 0, prefix, dir / "at_once");
      cfg.training.steps = 6;
      cfg.schedule.strand_interleaving = si;
      const RunResult at_once = run_local(cfg);
      cfg.output.dir = dir / "deferred";
      const RunResult deferred = run_local(
          cfg, Grads::kSkip, [&](Trainer& t) { t.grad_sync().set_producer_stream(&stream_stand_in); });
      EXPECT_EQ(deferred.losses, at_once.losses) << family_name(f) << " si=" << si;
    }
  }
}

// Resharding through a layout-free checkpoint. Oracle: the tp = 2 run itself, continued past the
// checkpoint; a resumed run (tp = 2 again: bitwise, the DESIGN's resume oracle; tp = 1 dp = 2 and
// one process: within kLossRelTol, the reduction order changes) must take the same next steps.
// combination: tp si
// combination: dp si
TEST(Resharding, Tp2CheckpointResumesOnOtherLayouts) {
  TempDir dir;
  const std::string prefix = write_walk_dataset(dir.path());
  constexpr int kBefore = 6, kAfter = 6;
  auto cfg_of = [&](int dp, int tp, const std::string& out) {
    RunConfig c = tiny_config(ModelFamily::kLlama, dp, tp, 0, prefix, dir / out);
    c.checkpoint.dir = dir / "ck";
    c.checkpoint.keep = 0;
    return c;
  };
  const RunConfig tp2 = cfg_of(1, 2, "tp2");
  // Losses of steps kBefore+1 .. kBefore+kAfter of the tp = 2 run, and its step-kBefore checkpoint.
  const CheckpointedRun base = run_with_checkpoint(tp2, kBefore, kAfter);
  const std::vector<double>& ref = base.after;
  ASSERT_EQ(ref.size(), size_t(kAfter));
  for (auto [dp, tp] : {std::pair{1, 2}, std::pair{2, 1}, std::pair{1, 1}}) {
    const RunConfig c = cfg_of(dp, tp, fmt::format("resume_dp{}_tp{}", dp, tp));
    const std::vector<double> got = resume_losses(c, base.checkpoint, kAfter, kBefore);
    const double dev = max_rel_deviation(got, ref);
    fmt::print("[measured] resume tp=2 step-{} checkpoint on dp={} tp={}: next-step rel dev {:.2e}, "
               "max over {} steps {:.2e}\n",
               kBefore, dp, tp, std::abs(got[0] - ref[0]) / ref[0], kAfter, dev);
    if (tp == 2) EXPECT_EQ(got, ref) << "same-layout resume must be bitwise";
    else EXPECT_LE(dev, kLossRelTol) << "dp=" << dp << " tp=" << tp;
  }
}

// The sparse exchange of the last micro-batch's token-embedding gradient (GradSync::
// enable_sparse_embedding: rows all-gathered over dp and added in rank order, instead of the
// whole table all-reduced at the end). Oracle: the same run with parallel.sparse_embed_grad=off
// (the dense bucket all-reduce). Only the grouping of the embedding's fp32 sums changes, so the
// step-1 gradients and the losses agree within the parallel-vs-serial tolerances (ParallelHarness.h:
// regrouped fp32 sums). The test also checks the path is on where it should be (dp = 2, tp = 1,
// 64 tokens x 2 ranks < 2 x 256 vocab rows) and off with tp = 2 and with the key off.
// combination: dp si
// combination: dp si zero1
TEST(SparseEmbeddingGrad, EqualsDenseAllReduce) {
  TempDir dir;
  const std::string prefix = write_walk_dataset(dir.path());
  auto sparse_on = [](const RunConfig& c) {
    bool on = false;
    std::mutex mu;
    on_local_ranks(c, [&](CommContext* comm) {
      Trainer t(c, comm, Quiet::kYes);
      std::lock_guard<std::mutex> lock(mu);
      on = t.grad_sync().sparse_embedding();
    });
    return on;
  };
  for (ModelFamily f : {ModelFamily::kLlama, ModelFamily::kGPT}) {  // untied, tied embedding
    for (int zero : {0, 1}) {
      RunConfig sparse = tiny_config(f, 2, 1, zero, prefix, dir / "sparse");
      RunConfig dense = tiny_config(f, 2, 1, zero, prefix, dir / "dense");
      dense.parallel.sparse_embed_grad = false;
      ASSERT_TRUE(sparse_on(sparse)) << family_name(f);
      ASSERT_FALSE(sparse_on(dense)) << family_name(f);
      // With ZeRO-1 the reduced gradients live in each rank's owned chunks, not in the full
      // gradient tensors gather_full_grads reads, so only the losses are compared there.
      const Grads g = zero ? Grads::kSkip : Grads::kCollect;
      RunResult a = run_local(sparse, g), b = run_local(dense, g);
      std::string worst;
      const double grad_dev = zero ? 0 : max_grad_deviation(a.first_grads, b.first_grads, &worst);
      const double loss_dev = max_rel_deviation(a.losses, b.losses);
      fmt::print("[measured] sparse vs dense embedding gradient, {} dp=2 zero={}: grad max rel dev {:.2e} ({}), "
                 "20-step loss max rel dev {:.2e}\n",
                 family_name(f), zero, grad_dev, worst, loss_dev);
      EXPECT_LE(grad_dev, kGradRelTol) << "worst tensor " << worst;
      EXPECT_LE(loss_dev, kLossRelTol);
      if (!zero) {
        EXPECT_TRUE(std::any_of(a.first_grads.begin(), a.first_grads.end(),
                                [](const auto& kv) { return kv.first.find("wte") != std::string::npos; }))
            << "no embedding gradient compared";
      }
    }
  }
  EXPECT_FALSE(sparse_on(tiny_config(ModelFamily::kLlama, 2, 2, 0, prefix, dir / "tp2"))) << "tp > 1 keeps the dense path";
}

}  // namespace
}  // namespace dhelix::testing
