// Helpers for the SI tests: a tiny run config for a dp x tp layout (tests/e2e/TinyRun.h's model
// and synthetic dataset), and running a function on every rank of that layout as threads
// (local backend). Not here: what is compared (each test states its oracle).
#pragma once
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "../e2e/TinyRun.h"
#include "comm/LocalBackend.h"
#include "train/Trainer.h"

namespace dhelix::testing {

// TinyRun's model (d_model 64, 2 layers, 4 heads, seq_len 32, vocab 200) on dp x tp ranks, 3
// micro-batches of 2 sequences per rank (slot 0 fwd-only, slots 1-2 paired, slot 3 bwd-only).
inline RunConfig si_config(const std::string& dir, const std::string& family, int dp, int tp, bool interleave) {
  RunConfig cfg = tiny_config(dir, family);
  cfg.parallel.dp = dp;
  cfg.parallel.tp = tp;
  cfg.training.micro_batches = 3;
  cfg.training.steps = 20;
  cfg.schedule.strand_interleaving = interleave;
  cfg.output.dir = dir + (interleave ? "/run_si" : "/run_seq");
  return cfg;
}

inline void on_local_ranks(const RunConfig& cfg, const std::function<void(CommContext&)>& fn) {
  LayoutConfig layout;
  layout.dp = static_cast<int>(cfg.parallel.dp);
  layout.tp = static_cast<int>(cfg.parallel.tp);
  layout.sequence_parallel = layout.tp > 1;
  run_local_ranks(layout, fn);
}

struct SiResult {
  std::vector<double> losses;           // per step, rank 0
  std::map<std::string, Tensor> grads;  // full gradients of the first step, before any update
};

// Rank 0's losses over cfg.training.steps steps, and (from a separate fresh trainer, same seed
// and data) the full step-1 gradients.
inline SiResult run_si(const RunConfig& cfg) {
  SiResult out;
  std::mutex mu;
  on_local_ranks(cfg, [&](CommContext& comm) {
    SiResult r;
    {
      Trainer t(cfg, &comm, Quiet::kYes);
      t.compute_gradients();
      r.grads = t.gather_full_grads();
    }
    Trainer t(cfg, &comm, Quiet::kYes);
    for (int64_t s = 0; s < cfg.training.steps; ++s) r.losses.push_back(t.train_step().loss);
    if (comm.rank() == 0) {
      std::lock_guard lk(mu);
      out = std::move(r);
    }
  });
  return out;
}

}  // namespace dhelix::testing
