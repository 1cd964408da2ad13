// The trainer GPU tests' runs (test_trainer_gpu.cc): a config trained on its layout, the ranks as
// threads of one process sharing the GPU, and the oracles those tests share -- the one-rank run's
// losses step by step and its step-1 gradients.
#pragma once
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "comm/LocalBackend.h"
#include "kernels/cuda/SmPartition.h"
#include "train/Trainer.h"

namespace dhelix::gpu_runs {

inline std::vector<double> losses_of(Trainer& t, int64_t steps) {
  std::vector<double> out;
  for (int64_t i = 0; i < steps; ++i) out.push_back(t.train_step().loss);
  return out;
}

// k steps of `cfg`, a checkpoint saved, a fresh trainer loading it and k more steps: the 2k losses
// (this rank's; `comm` null for one rank).
inline std::vector<double> losses_resumed_at(const RunConfig& cfg, CommContext* comm, int64_t k) {
  std::vector<double> out;
  std::string ck;
  {
    Trainer a(cfg, comm, Quiet::kYes);
    out = losses_of(a, k);
    ck = a.save_checkpoint();
  }
  Trainer b(cfg, comm, Quiet::kYes);
  b.load_checkpoint(ck);
  EXPECT_EQ(b.step(), k);
  for (double l : losses_of(b, k)) out.push_back(l);
  return out;
}

// The losses of `steps` steps of `cfg` on its layout (parallel.dp/tp/pp/cp/ep, the 3D grid), the ranks as threads of
// this process sharing the GPU. Every rank must report the same loss bit for bit (it is all-reduced);
// rank 0's are returned. `own_sms`: each rank thread runs in its own SM partition of the GPU
// (cuda::SmPartition, as bench/gpu_si.cc --sm-split ranks), not on the whole shared device.
// The in-process ranks' groups time out as the run's config says (comm.timeout_s; run_local_ranks'
// own default is 120 s).
inline CommOptions comm_options_of(const RunConfig& cfg) {
  CommOptions o;
  o.timeout_s = cfg.comm.timeout_s;
  return o;
}

inline LayoutConfig layout_of(const RunConfig& cfg) {
  LayoutConfig lay;
  lay.dp = static_cast<int>(cfg.parallel.dp);
  lay.tp = static_cast<int>(cfg.parallel.tp);
  lay.pp = static_cast<int>(cfg.parallel.pp);
  lay.ep = static_cast<int>(cfg.parallel.ep);
  lay.cp = static_cast<int>(cfg.parallel.cp);
  lay.tp_x = static_cast<int>(cfg.parallel.tp_x);
  lay.tp_y = static_cast<int>(cfg.parallel.tp_y);
  lay.tp_z = static_cast<int>(cfg.parallel.tp_z);
  lay.sequence_parallel = lay.tp > 1;
  return lay;
}

enum class OwnSms { kNo, kYes };
inline std::vector<double> rank_losses(const RunConfig& cfg, int64_t steps, OwnSms own_sms = OwnSms::kNo) {
  const LayoutConfig lay = layout_of(cfg);
  std::vector<std::vector<double>> got(static_cast<size_t>(lay.world()));
  std::vector<std::unique_ptr<cuda::SmPartition>> parts;
  if (own_sms == OwnSms::kYes) parts = cuda::SmPartition::split(0, lay.world());
  run_local_ranks(lay, [&](CommContext& comm) {
    cuda::SmPartitionScope in(parts.empty() ? nullptr : parts[static_cast<size_t>(comm.rank())].get());
    Trainer t(cfg, &comm, Quiet::kYes);
    got[static_cast<size_t>(comm.rank())] = losses_of(t, steps);
  }, comm_options_of(cfg));
  for (size_t r = 1; r < got.size(); ++r) EXPECT_EQ(got[r], got[0]) << "rank " << r << " disagrees on the loss";
  return got[0];
}

// Each step's loss `got` within `bound` of the one-rank `ref`, relative; every step printed.
inline void expect_tracks(const std::vector<double>& ref, const std::vector<double>& got, double bound,
                   const std::string& what) {
  ASSERT_EQ(got.size(), ref.size()) << what;
  for (size_t i = 0; i < ref.size(); ++i) {
    const double rel = std::abs(got[i] - ref[i]) / std::abs(ref[i]);
    std::printf("[ info ] %s step %zu: one rank %.9f, %.9f (rel %.2e)\n", what.c_str(), i + 1, ref[i], got[i], rel);
    EXPECT_LE(rel, bound) << what << " step " << i + 1;
  }
}

// The first step's gradients, full and layout-free (Trainer::gather_full_grads, which every rank
// gets: rank 0's), on `cfg`'s layout, its ranks sharing the GPU. Plain data parallelism only (the
// gradients of ZeRO-1 live in each rank's chunks).
inline std::map<std::string, Tensor> first_grads(const RunConfig& cfg) {
  const LayoutConfig lay = layout_of(cfg);
  if (lay.world() == 1) {
    Trainer t(cfg, nullptr, Quiet::kYes);
    t.compute_gradients();
    return t.gather_full_grads();
  }
  std::map<std::string, Tensor> out;
  run_local_ranks(lay, [&](CommContext& comm) {
    Trainer t(cfg, &comm, Quiet::kYes);
    t.compute_gradients();
    std::map<std::string, Tensor> g = t.gather_full_grads();  // (a collective: every rank)
    if (comm.rank() == 0) out = std::move(g);
  }, comm_options_of(cfg));
  return out;
}

// The losses alone cannot see a gradient scaled as a whole -- a missing data-parallel all-reduce
// (each rank stepping on its half of the batch), a missing 1/2, a partial sum left out: AdamW's
// step is close to the sign of the gradient, and the first loss is ~ln V whatever the layers compute
// (a review, 2026-11-29). So the layout tests also compare step 1's gradients with the one-rank
// run's: every tensor that carries at least 1% of the whole gradient's norm (at initialisation some
// are mostly cancellation, their relative error meaningless) within kGradTrackBound relative (L2).
// The bound is test_model_gpu.cc's for these tiny models' GPU gradients against the CPU's fp32 run
// (0.15, bf16 roundings through the layers), an upper bound for two bf16 runs of the same model;
// a tensor scaled by 1/2 or 2 is off by 0.5 or 1. Under MoE, the experts' and the router's tensors
// are left out: a token whose top-k choice flips between two runs (their reduction orders differ)
// moves one expert's gradient by ~1/sqrt(its tokens), which is not a layout error. The measured
// worst is printed, for the bound to be tightened from a device run.
constexpr double kGradTrackBound = 0.15;
inline void expect_grads_track(const RunConfig& one, const RunConfig& layout, const std::string& what) {
  const std::map<std::string, Tensor> ref = first_grads(one), got = first_grads(layout);
  ASSERT_EQ(got.size(), ref.size()) << what;
  double total = 0;
  for (const auto& [name, t] : ref)
    for (int64_t i = 0; i < t.numel(); ++i) total += double(t.f32()[i]) * t.f32()[i];
  const bool moe = one.model.n_experts > 0;
  double worst = 0;
  std::string worst_name;
  size_t checked = 0;
  for (const auto& [name, r] : ref) {
    const auto it = got.find(name);
    ASSERT_NE(it, got.end()) << what << ": no gradient " << name;
    const Tensor& g = it->second;
    ASSERT_EQ(g.numel(), r.numel()) << what << ": " << name;
    if (moe && (name.find("experts") != std::string::npos || name.find("router") != std::string::npos)) continue;
    double dd = 0, rr = 0;
    for (int64_t i = 0; i < r.numel(); ++i) {
      const double d = double(g.f32()[i]) - r.f32()[i];
      dd += d * d, rr += double(r.f32()[i]) * r.f32()[i];
    }
    if (rr < 1e-4 * total) continue;  // under 1% of the norm
    ++checked;
    const double rel = std::sqrt(dd / rr);
    if (rel > worst) worst = rel, worst_name = name;
    EXPECT_LE(rel, kGradTrackBound) << what << ": gradient " << name;
  }
  std::printf("[ info ] %s: step-1 gradients of %zu tensors against one rank, worst %.3e (%s)\n", what.c_str(),
              checked, worst, worst_name.c_str());
  EXPECT_GT(checked, 0u) << what;
}

// The one-rank run's losses: the oracle of the layout tests below.
inline std::vector<double> one_rank_losses(const RunConfig& cfg, int64_t steps) {
  Trainer t(cfg, nullptr, Quiet::kYes);
  return losses_of(t, steps);
}

// The layout tests' shape: `one`'s one-rank GPU losses are the oracle; `layout` turns a copy into the
// layout under test (its ranks sharing the GPU, its own output directory), whose losses must track
// them within `bound` relative, step by step.
inline void expect_layout_tracks_one_rank(const RunConfig& one, const std::function<void(RunConfig&)>& layout,
                                   int64_t steps, double bound, const std::string& what) {
  const std::vector<double> ref = one_rank_losses(one, steps);
  RunConfig lay = one;
  layout(lay);
  lay.output.dir = one.output.dir + "/layout";
  expect_tracks(ref, rank_losses(lay, steps), bound, what);
  expect_grads_track(one, lay, what);
}

// `on` (SI on, its layout's ranks sharing the GPU) against the same run with SI off: bitwise equal
// losses, every rank agreeing.
inline void expect_interleaving_bitwise(const RunConfig& on, int64_t steps) {
  RunConfig off = on;
  off.schedule.strand_interleaving = false;
  off.output.dir = on.output.dir + "/off";
  EXPECT_EQ(rank_losses(on, steps), rank_losses(off, steps));
}

}  // namespace dhelix::gpu_runs
