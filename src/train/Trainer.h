// Trainer: one training run, top to bottom. Builds the layout, the layer programs and the
// parameter shards, then per step: this rank's micro-batches -> StepRunner (sequential or Strand
// Interleaving) -> GradSync (tp partial grads, dp buckets overlapped with backward) -> AdamW.
// Logs one line per step, writes metrics JSONL, evaluates held-out loss, checkpoints (atomic,
// layout-free HF tensors) and resumes bitwise. Works single-process (comm == nullptr) or as one
// rank of an MPI / local-threads world.
#pragma once
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "comm/CommContext.h"
#include "parallel/GradSync.h"
#include "parallel/Optimizer.h"
#include "parallel/ParamStore.h"
#include "runtime/StepBuilder.h"
#include "runtime/StepParts.h"
#include "runtime/StepRunner.h"
#include "train/CheckpointStore.h"
#include "train/Config.h"
#include "train/DataLoader.h"
#include "train/IndexedDataset.h"
#include "train/LrSchedule.h"
#include "train/Metrics.h"
#include "train/StepObservers.h"

namespace dhelix {

struct StepReport {
  int64_t step = 0;      // 1-based optimizer step just completed
  double loss = 0;       // mean per-token loss over the global batch
  double lr = 0;
  double grad_norm = 0;
  double seconds = 0;
  double tokens_per_s = 0;
  double model_flops_per_s = 0;
  int64_t peak_activation_bytes = 0;
  int64_t peak_bytes = 0;  // activations + model/optimizer states
  bool skipped = false;    // a non-finite loss or gradient norm: no update (training.nonfinite = skip)
  // MoE (else 0 / empty): the load-balancing term the objective adds (sum over layers of the
  // token-weighted mean over micro-batches), and the global batch's tokens routed to each expert,
  // [layer * n_experts + e], summed over all ranks.
  double aux_loss = 0;
  std::vector<int64_t> expert_tokens;
};

enum class Quiet { kNo, kYes };

class Trainer {
 public:
  // `comm` may be null for a single process; it must outlive the trainer.
  // Without data (`dhelix sample`): no dataset is opened; only load_model() and sample() work.
  enum class Data { kOpen, kNone };
  Trainer(const RunConfig& cfg, CommContext* comm, Quiet quiet = Quiet::kNo, Data data = Data::kOpen);
  ~Trainer();

  // The whole run: resume if asked, train cfg.training.steps steps, eval, checkpoint, sample.
  // Returns 0, or the stop signal (base/Signals.h) after which it saved a checkpoint and stopped
  // early (checked between steps, agreed over the world).
  int run();
  // One step; a non-finite loss or gradient norm skips the update (training.nonfinite = skip, up to
  // nonfinite_max_skips in a row) or throws DivergedError (stop, or too many in a row).
  StepReport train_step();
  // The first half of a step: zero gradients, forward+backward of this rank's micro-batches, and
  // the gradient reductions (tp partial grads, dp buckets). train_step() = this + the update.
  StepStats compute_gradients();
  // Mean held-out loss (same on every rank); nullopt when a stop signal cut it short (agreed by all).
  std::optional<double> evaluate(int64_t batches);
  // Saves a checkpoint of the current state; returns its directory (every rank calls it).
  std::string save_checkpoint();
  void load_checkpoint(const std::string& step_dir);
  // checkpoint.resume's checkpoint loaded (the whole state, or the weights only): for "latest" the
  // one `latest` names or, when it is missing or fails to load, the newest that loads, saying which
  // and why (IoError listing each one's failure when none does); otherwise the path given. Returns
  // the directory loaded and, in `note`, what was skipped ("" when nothing was).
  std::string load_resume(const std::string& resume, bool whole_state, std::string* note = nullptr);
  // The weights only, from the checkpoint's model file (the same checks: exact tensor set,
  // checksums, finite values).
  void load_model(const std::string& step_dir);
  // Top-k sampling from the current weights; returns the text on world rank 0 and "" elsewhere.
  // Collective over tp and pp when the model is split (it is gathered to rank 0 first).
  // `stream`, when given, is called on world rank 0 with each new piece of the text as it is generated
  // (the prompt first); the pieces add up to the returned text.
  std::string sample(const std::string& prompt, int64_t tokens, double temperature, int64_t top_k, uint64_t seed,
                     const std::function<void(const std::string&)>& stream = {});

  int64_t step() const { return step_; }
  const RunConfig& config() const { return cfg_; }
  ParamStore& params() { return *parts_->params; }
  StepRunner& runner() { return *runner_; }
  GradSync& grad_sync() { return *sync_; }  // dp_comm_seconds() of the last step (benchmarks)
  Trace* trace() { return trace_.get(); }   // non-null when output.trace is set
  const ModelPrograms& programs() const { return parts_->progs; }
  // Weight-gradient GEMMs run as partials so far (training.wgrad_gemm; 0 on the CPU).
  size_t partial_wgrads() const;
  // Full (unsharded, layout-free) internal tensors; collective over tp (and dp for the optimizer).
  std::map<std::string, Tensor> gather_full_params();
  // Full gradients (layout-free) after compute_gradients(); plain dp (no ZeRO) only.
  std::map<std::string, Tensor> gather_full_grads();
  double sgemm_flops_per_s() const { return sgemm_flops_; }
  MemoryTracker& activation_memory() { return parts_->act_mem; }

 private:
  // The phases of run(), in its order.
  std::unique_ptr<MetricsWriter> open_metrics();
  const char* reference_name() const;
  double measure_reference();
  void log_run_header() const;
  double fraction_of_reference(const StepReport& r);
  void log_step(const StepReport& r, double frac) const;
  StepMetrics step_metrics(const StepReport& r, double frac) const;
  [[noreturn]] void stop_for_records(const std::string& records_error);
  int finish_run();

  std::vector<MicroBatch> next_micro_batches(DataLoader& loader);
  Tensor local_rows(const Tensor& seqs) const;
  std::map<std::string, Tensor> load_full_params(const Checkpoint& ck);
  std::map<std::string, Tensor> gather_full(const std::function<Tensor(const ParamEntry&)>& get,
                                            const std::string& suffix);
  bool is_logger() const;
  // The stop signal any rank got (base/Signals.h), or kRecordsFailed when a rank's run records
  // could not be written; the largest over the world (collective).
  static constexpr int kRecordsFailed = 1000;
  int agreed_stop_signal(bool records_failed = false);
  void log(const std::string& line) const;

  RunConfig cfg_;
  CommContext* comm_;
  Quiet quiet_;
  LayoutConfig layout_;
  int tp_rank_ = 0, dp_rank_ = 0, pp_rank_ = 0;
  ProcessGroup* pp_ = nullptr;  // the pipeline group (pp > 1)
  ProcessGroup* z_ = nullptr;   // the depth axis of 3D tensor parallelism (tp_z > 1)
  ProcessGroup* cp_ = nullptr;  // context parallelism's ring (cp > 1)
  RankCoord coord_;             // this rank's grid coordinates
  MicroBatchShape mb_;
  Device device_;  // training.device: where the model states live and the step runs
  bool told_wgrad_ = false;  // the weight-gradient GEMMs' form said once, after the first GPU step
  std::unique_ptr<Step> built_;  // the step, wired once (runtime/StepBuilder.h); the four below point into it
  StepParts* parts_ = nullptr;   // units, programs, this stage's parameters, the run context
  GradSync* sync_ = nullptr;
  Optimizer* opt_ = nullptr;
  StepRunner* runner_ = nullptr;
  std::unique_ptr<Trace> trace_;
  Tensor last_tokens_;  // the step's last micro-batch's tokens (GradSync's sparse embedding rows)
  std::unique_ptr<IndexedDataset> dataset_;
  std::unique_ptr<DataLoader> train_loader_, val_loader_;
  std::unique_ptr<LrSchedule> lr_;
  int64_t step_ = 0;
  int64_t skipped_total_ = 0, skipped_in_a_row_ = 0;  // steps skipped for non-finite values
  std::unique_ptr<SparseEmbeddingRows> sparse_rows_;  // GradSync's sparse embedding exchange, when on
  std::unique_ptr<FaultInjector> fault_;              // the test hook DHELIX_FAULT_INJECT, when set for this rank
  double sgemm_flops_ = 0;
};

// sgemm FLOP/s of this machine (1024^3, the best of five runs, current thread count).
double measure_sgemm_flops();
// The same through gemm_bf16 (bf16 operands, fp32 accumulation; the rounding pass included).
double measure_bf16_gemm_flops();

}  // namespace dhelix
