// Shared by the parallel-equals-serial tests (threads-as-ranks and MPI): a tiny learnable
// dataset, tiny model configs for both families, and runs that collect per-step losses and full
// (layout-free) gradients from any layout. Not here: the tolerances (each test states its own).
#pragma once
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "comm/CommContext.h"
#include "tensor/Tensor.h"
#include "train/Config.h"

namespace dhelix {
class Trainer;
}

namespace dhelix::testing {

// Tolerances of parallel vs serial. TP splits the matmul reductions (row-parallel outputs are
// summed over tp ranks, the vocab-parallel loss sums partial softmax denominators) and DP adds
// per-rank partial gradients, so fp32 sums are regrouped: each regrouping perturbs a sum of n
// terms by up to ~n * 2^-24 (6e-8 per term) of its magnitude. Measured on these shapes (the tests
// print it; the runs are deterministic): step-1 gradients <= 9.7e-7 of each tensor's largest
// entry (worst: norm weights and row biases, whose gradients sum over all tokens and tp ranks);
// losses <= 3.1e-8 relative over 20 steps (the loss is a mean over 4096 tokens, accumulated in
// double, and 20 Adam steps do not amplify 1e-7 perturbations of the weights visibly). Bounds are
// ~10x and ~30x those. A real bug (a missing all-reduce, a wrong shard, a dropped micro-batch)
// moves the loss by > 1e-2 and gradients by O(1).
constexpr double kGradRelTol = 1e-5;  // per tensor, ||par - serial||_inf / ||serial||_inf, step 1
constexpr double kLossRelTol = 1e-6;  // |par - serial| / serial, max over 20 steps

// Writes <dir>/walk.bin/.idx and returns the prefix: 120 documents x 200 tokens of a seeded
// random walk over 256 ids (next = prev + U{0..7} mod 256), so the model has something to learn
// and the loss moves during 20 steps.
std::string write_walk_dataset(const std::string& dir, uint64_t seed = 7);

// A tiny model (d_model 64, 2 layers, seq_len 32, vocab 256) of `family` for dp x tp (zero 0/1).
// Llama uses grouped-query attention with 2 * kv_heads query heads (n_kv_heads must divide by tp,
// so tp = 4 needs kv_heads = 4); GPT has 4 heads. `global_B` sequences per global micro-batch
// (micro_batch_size = global_B / dp), 2 micro-batches per step, one compute thread per rank.
RunConfig tiny_config(ModelFamily family, int dp, int tp, int zero, const std::string& data_prefix,
                      const std::string& out_dir, int64_t kv_heads = 2, int64_t global_B = 4);

// The same tiny model on AxoNN's 4D grid Gx x Gy x Gz x dp (tp = 1): global_B sequences per
// global micro-batch over dp * Gz data replicas.
RunConfig tiny_config_3d(ModelFamily family, int dp, int gx, int gy, int gz, const std::string& data_prefix,
                         const std::string& out_dir, int64_t kv_heads = 2, int64_t global_B = 8);

struct RunResult {
  std::vector<double> losses;                 // one per step, as rank 0 reports it
  std::map<std::string, Tensor> first_grads;  // full gradients before the first update (if asked)
};

enum class Grads { kSkip, kCollect };

// Runs fn on every rank of cfg's dp x pp x tp layout: in this thread with a null context when the
// layout is one rank, else on threads-as-ranks (run_local_ranks).
void on_local_ranks(const RunConfig& cfg, const std::function<void(CommContext*)>& fn);

// Called on every fresh trainer before it runs (e.g. to set weights); may be empty.
using Prepare = std::function<void(Trainer&)>;

// Trains cfg.training.steps steps, in one process (cfg dp = tp = 1) or on threads-as-ranks.
// With Grads::kCollect a separate fresh trainer first computes the step-1 gradients.
RunResult run_serial(const RunConfig& cfg, Grads grads = Grads::kSkip, const Prepare& prepare = {});
RunResult run_local(const RunConfig& cfg, Grads grads = Grads::kSkip, const Prepare& prepare = {});
// The same on this rank of a real world (every rank calls it; rank 0's result is meaningful).
RunResult run_on(const RunConfig& cfg, CommContext* comm, Grads grads, const Prepare& prepare = {});

// Trains `before` steps of cfg, saves a checkpoint, trains `after` more (any layout, local ranks):
// rank 0's losses of those `after` steps and the checkpoint's directory.
struct CheckpointedRun {
  std::vector<double> after;
  std::string checkpoint;
};
CheckpointedRun run_with_checkpoint(const RunConfig& cfg, int before, int after);
// A fresh trainer of cfg (any layout) loads `checkpoint` and trains `after` steps: rank 0's losses.
// The loaded step must be `expect_step`.
std::vector<double> resume_losses(const RunConfig& cfg, const std::string& checkpoint, int after, int64_t expect_step);

// Runs `on` (Strand Interleaving as configured) and the same with SI off (output in `off_dir`) on
// local ranks; returns "" when every step's loss is bitwise equal, else the first difference.
std::string si_on_off_difference(const RunConfig& on, const std::string& off_dir);

// The bytes the comm layer counts (ProcessGroup::traffic: the ring bytes of every collective) per
// group role of size > 1 ("x", "y", "z", "xy", "tpblock", "tp", "dp", "cp", "dpcp") over one step's forward and
// backward of every micro-batch and its gradient reductions (Trainer::compute_gradients), on rank 0.
std::map<std::string, double> counted_step_bytes(const RunConfig& cfg);

// max_i |a_i - b_i| / max(|b_i|, floor): relative deviation of a loss curve.
double max_rel_deviation(const std::vector<double>& a, const std::vector<double>& b);
// Per tensor ||a - b||_inf / ||b||_inf, maximised over tensors; `worst` names the tensor.
double max_grad_deviation(const std::map<std::string, Tensor>& a, const std::map<std::string, Tensor>& b,
                          std::string* worst = nullptr);

}  // namespace dhelix::testing
