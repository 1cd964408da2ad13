// Context parallelism (causal ring attention over cp ranks, each holding chunks r and 2cp-1-r of
// every sequence) equals the single process. Oracle: the one-process run of the same model on the
// same global batches: cp only cuts each sequence over ranks (the data loader hands every cp rank
// the same sequences; each keeps its two chunks), so losses and gradients must match up to fp32
// regrouping: the ring merges each query row's attention over cp key blocks (one more rounding of
// the softmax normalisation per merge) and the weight gradients are summed over cp as over dp.
// Tolerances: ParallelHarness.h's (measured deviations printed by each case). MoE: each cp rank
// routes its chunks; the router's statistics are summed over cp (and tp), so the load-balancing
// loss's gradient -- in the router's -- is the whole micro-batch's, as in the single process. (MoE
// with dp > 1 is not in this list: its load-balancing loss is over each dp rank's micro-batch, a
// different loss than the one process's over the global one; MoeDataParallel in
// test_parallel_equals_serial.cc and MoeWithExpertParallelism below compare it against per-rank
// micro-batches.)
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cstring>
#include <mutex>

#include "../train/TempDir.h"
#include "ParallelHarness.h"
#include "train/Trainer.h"

namespace dhelix::testing {
namespace {

struct CpCase {
  ModelFamily family;
  int dp, tp, cp;
};

std::string cp_case_name(const ::testing::TestParamInfo<CpCase>& info) {
  const CpCase& c = info.param;
  return fmt::format("{}_cp{}_dp{}_tp{}", family_name(c.family), c.cp, c.dp, c.tp);
}

// seq_len 48: divisible by 2 * cp for cp = 2, 3, 4, and each rank's 48 / cp rows by tp = 2.
RunConfig cp_config(ModelFamily family, int dp, int tp, int cp, const std::string& prefix, const std::string& out) {
  RunConfig c = tiny_config(family, dp, tp, 0, prefix, out);
  c.model.seq_len = 48;
  c.parallel.cp = cp;
  c.training.steps = 10;
  return c;
}

class ContextParallelEqualsSerial : public ::testing::TestWithParam<CpCase> {};

// combination: cp si
// combination: cp dp si
// combination: cp tp si
// combination: cp dp tp si
TEST_P(ContextParallelEqualsSerial, LossesAndFirstGradients) {
  const CpCase c = GetParam();
  TempDir dir;
  const std::string prefix = write_walk_dataset(dir.path());
  RunResult serial = run_serial(cp_config(c.family, 1, 1, 1, prefix, dir / "serial"), Grads::kCollect);
  RunResult par = run_local(cp_config(c.family, c.dp, c.tp, c.cp, prefix, dir / "par"), Grads::kCollect);
  std::string worst;
  const double grad_dev = max_grad_deviation(par.first_grads, serial.first_grads, &worst);
  const double loss_dev = max_rel_deviation(par.losses, serial.losses);
  fmt::print("[measured] {} cp={} dp={} tp={}: grad max rel dev {:.2e} ({}), 10-step loss max rel dev {:.2e}; "
             "loss {:.4f} -> {:.4f}\n",
             family_name(c.family), c.cp, c.dp, c.tp, grad_dev, worst, loss_dev, serial.losses.front(),
             serial.losses.back());
  EXPECT_EQ(par.first_grads.size(), serial.first_grads.size());
  EXPECT_LE(grad_dev, kGradRelTol) << "worst tensor " << worst;
  EXPECT_LE(loss_dev, kLossRelTol);
  EXPECT_LT(serial.losses.back(), serial.losses.front() - 0.1);  // it learns, so equal losses mean something
}

INSTANTIATE_TEST_SUITE_P(Layouts, ContextParallelEqualsSerial,
                         ::testing::Values(CpCase{ModelFamily::kLlama, 1, 1, 2}, CpCase{ModelFamily::kLlama, 1, 1, 3},
                                           CpCase{ModelFamily::kLlama, 1, 1, 4}, CpCase{ModelFamily::kLlama, 2, 1, 2},
                                           CpCase{ModelFamily::kLlama, 2, 1, 3}, CpCase{ModelFamily::kLlama, 2, 1, 4},
                                           CpCase{ModelFamily::kLlama, 1, 2, 2}, CpCase{ModelFamily::kLlama, 1, 2, 3},
                                           CpCase{ModelFamily::kLlama, 1, 2, 4}, CpCase{ModelFamily::kGPT, 1, 1, 3},
                                           CpCase{ModelFamily::kGPT, 2, 2, 2}, CpCase{ModelFamily::kMoE, 1, 1, 2},
                                           CpCase{ModelFamily::kMoE, 1, 1, 3}, CpCase{ModelFamily::kMoE, 1, 2, 2}),
                         cp_case_name);

// MoE with cp and expert parallelism (cp 2 x dp 2, ep = 2): the experts' all-to-alls run between
// the two dp ranks of each cp rank, and each expert's gradient is summed over the ranks holding it:
// the edp x cp group (here the 2 cp ranks), as dense weights are over dp x cp. Oracle: the single
// process over per-rank micro-batches (MoeDataParallel's: the load-balancing loss is over each dp
// rank's micro-batch), losses over 10 steps and the first gradients within ParallelHarness.h's
// tolerances; with ZeRO-1 (the experts' optimizer state cut over edp x cp) its losses.
// combination: cp dp ep si
// combination: cp dp ep zero1 si
TEST(ContextParallel, MoeWithExpertParallelism) {
  TempDir dir;
  const std::string prefix = write_walk_dataset(dir.path());
  RunConfig par = cp_config(ModelFamily::kMoE, 2, 1, 2, prefix, dir / "ep");
  par.parallel.ep = 2;
  RunConfig s = cp_config(ModelFamily::kMoE, 1, 1, 1, prefix, dir / "serial");
  s.training.micro_batch_size = par.training.micro_batch_size;
  s.training.micro_batches = par.parallel.dp * par.training.micro_batches;
  ASSERT_EQ(s.tokens_per_step(), par.tokens_per_step());
  const RunResult serial = run_serial(s, Grads::kCollect);
  const RunResult ep = run_local(par, Grads::kCollect);
  std::string worst;
  const double grad_dev = max_grad_deviation(ep.first_grads, serial.first_grads, &worst);
  const double loss_dev = max_rel_deviation(ep.losses, serial.losses);
  fmt::print("[measured] moe cp2 dp2 ep2: grad max rel dev {:.2e} ({}), loss max rel dev {:.2e}; loss {:.4f} -> {:.4f}\n",
             grad_dev, worst, loss_dev, serial.losses.front(), serial.losses.back());
  EXPECT_EQ(ep.first_grads.size(), serial.first_grads.size());
  EXPECT_LE(grad_dev, kGradRelTol) << "worst tensor " << worst;
  EXPECT_LE(loss_dev, kLossRelTol);
  EXPECT_LT(serial.losses.back(), serial.losses.front() - 0.1);

  par.parallel.zero = 1;
  par.output.dir = dir / "ep_zero";
  const RunResult zero = run_local(par);
  const double zero_dev = max_rel_deviation(zero.losses, serial.losses);
  fmt::print("[measured] moe cp2 dp2 ep2 zero1: loss max rel dev {:.2e}\n", zero_dev);
  EXPECT_LE(zero_dev, kLossRelTol);
}

// Strand Interleaving with cp = 2: the ring steps' key/value exchanges are ops of the layer program,
// so SI only reorders whole ops of two micro-batches (the forward strand's ring beside the backward
// strand's, both on the one cp group). Oracle: the same run with SI off; losses bitwise equal
// (M = 3, so fwd(mb i) runs beside bwd(mb i-1)).
// combination: cp si
TEST(ContextParallel, StrandInterleavingOnOffBitwise) {
  TempDir dir;
  const std::string prefix = write_walk_dataset(dir.path());
  RunConfig on = cp_config(ModelFamily::kLlama, 1, 1, 2, prefix, dir / "on");
  on.training.micro_batches = 3;
  EXPECT_EQ(si_on_off_difference(on, dir / "off"), "");
}

// cp with the other axes that keep their own groups: a pp = 2 W pipeline with co-execution (the
// activations between stages are each rank's local rows), and ZeRO-1 over the dp x cp replicas
// (the optimizer state cut over 4 ranks of dp 2 x cp 2, and over the 2 cp ranks at dp = 1). Oracle: the single process on the same
// batches, within ParallelHarness.h's tolerances; ZeRO-1 holds reduced gradients only in chunks, so
// its step-1 gradients are not compared (its losses are, over 10 steps).
// combination: cp w si
// combination: cp dp zero1 si
// combination: cp zero1 si
TEST(ContextParallel, WithPipelineAndZeroOne) {
  TempDir dir;
  const std::string prefix = write_walk_dataset(dir.path());
  RunConfig s = cp_config(ModelFamily::kLlama, 1, 1, 1, prefix, dir / "serial");
  s.model.n_layers = 4;
  s.training.micro_batches = 4;
  const RunResult serial = run_serial(s, Grads::kCollect);

  RunConfig pc = cp_config(ModelFamily::kLlama, 1, 1, 2, prefix, dir / "pipe");
  pc.model.n_layers = 4;
  pc.training.micro_batches = 4;
  pc.parallel.pp = 2;
  pc.schedule.pipeline = "w";
  const RunResult pipe = run_local(pc, Grads::kCollect);
  std::string worst;
  const double grad_dev = max_grad_deviation(pipe.first_grads, serial.first_grads, &worst);
  const double loss_dev = max_rel_deviation(pipe.losses, serial.losses);
  fmt::print("[measured] llama cp2 pp2 (W, SI): grad max rel dev {:.2e} ({}), loss max rel dev {:.2e}\n", grad_dev,
             worst, loss_dev);
  EXPECT_EQ(pipe.first_grads.size(), serial.first_grads.size());
  EXPECT_LE(grad_dev, kGradRelTol) << "worst tensor " << worst;
  EXPECT_LE(loss_dev, kLossRelTol);

  RunConfig zc = cp_config(ModelFamily::kLlama, 2, 1, 2, prefix, dir / "zero");
  zc.model.n_layers = 4;
  zc.training.micro_batches = 4;  // B = 2 per dp rank: each global micro-batch is the serial run's 4 sequences
  zc.parallel.zero = 1;
  const RunResult zero = run_local(zc);
  const double zero_dev = max_rel_deviation(zero.losses, serial.losses);
  fmt::print("[measured] llama cp2 dp2 zero1: loss max rel dev {:.2e}\n", zero_dev);
  EXPECT_LE(zero_dev, kLossRelTol);

  // dp = 1: the replicas of the weights are the cp ranks alone, and ZeRO-1 shards over them.
  RunConfig z1 = cp_config(ModelFamily::kLlama, 1, 1, 2, prefix, dir / "zero_dp1");
  z1.model.n_layers = 4;
  z1.training.micro_batches = 4;
  z1.parallel.zero = 1;
  const RunResult zero1 = run_local(z1);
  const double zero1_dev = max_rel_deviation(zero1.losses, serial.losses);
  fmt::print("[measured] llama cp2 dp1 zero1: loss max rel dev {:.2e}\n", zero1_dev);
  EXPECT_LE(zero1_dev, kLossRelTol);
}

// The ring's traffic per step. Oracle: the closed form. Per layer and micro-batch the keys/values
// ([B * T/cp rows, 2 * kv_heads * head_dim] floats) move cp - 1 times forward and cp - 1 times
// backward, and the travelling dK/dV (same shape) cp - 1 times (it starts at the keys' first
// visitor, not at their owner); ProcessGroup::traffic counts every byte a ring_shift sends. The
// gradient reductions go over dpcp, so nothing else is on the cp group in compute_gradients.
TEST(ContextParallel, RingTrafficIsThreeTripsOfTheKeysPerLayer) {
  TempDir dir;
  const std::string prefix = write_walk_dataset(dir.path());
  for (int cp : {2, 3}) {
    const RunConfig cfg = cp_config(ModelFamily::kLlama, 1, 1, cp, prefix, dir / fmt::format("cp{}", cp));
    double measured = -1;
    std::mutex mu;
    on_local_ranks(cfg, [&](CommContext* comm) {
      Trainer t(cfg, comm, Quiet::kYes);
      comm->group(GroupRole::kCP).reset_traffic();
      t.compute_gradients();
      comm->world().barrier();
      if (comm->rank() != 0) return;
      std::lock_guard lk(mu);
      measured = comm->group(GroupRole::kCP).traffic().bytes;
    });
    const ModelConfig& m = cfg.model;
    const double kv_bytes = 4.0 * double(cfg.training.micro_batch_size * (m.seq_len / cp)) * 2.0 *
                            double(m.n_kv_heads * m.head_dim());
    const double expect = 3.0 * (cp - 1) * kv_bytes * double(m.n_layers) * double(cfg.training.micro_batches);
    EXPECT_DOUBLE_EQ(measured, expect) << "cp=" << cp;
  }
}

}  // namespace
}  // namespace dhelix::testing
