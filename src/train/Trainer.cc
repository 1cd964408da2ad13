// Trainer: construction, one optimizer step, evaluation, the run loop with logging and metrics.
// Checkpointing and sampling live in TrainerIO.cc.
#include "train/Trainer.h"

#include <signal.h>
#include <stdio.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <limits>
#include <thread>

#include "base/Clock.h"
#include "base/Error.h"
#include "base/Files.h"
#include "base/Log.h"
#include "base/Signals.h"
#include "kernels/cpu/Bf16.h"
#include "kernels/cpu/Kernels.h"
#if DHELIX_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "kernels/cuda/Gemm.h"
#endif
#include "tensor/DeviceMemory.h"
#include "train/CheckpointStore.h"
#include "train/Metrics.h"
#include "train/Preflight.h"
#include "train/ProgressBar.h"

namespace dhelix {

double measure_sgemm_flops() {
  // The best of several runs: a run slowed by other work on the machine only lowers a sample, so
  // the best is the machine's rate, and a logged "fraction of sgemm" is not inflated by a slow one.
  const int64_t n = 1024;
  std::vector<float> a(n * n, 0.5f), b(n * n, 0.25f), c(n * n, 0.0f);
  double best = 0;
  for (int rep = 0; rep < 6; ++rep) {
    double t0 = now_seconds();
    cpu::gemm<float>(false, false, n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f, c.data(), n);
    double dt = now_seconds() - t0;
    if (rep > 0) best = std::max(best, 2.0 * n * n * n / dt);  // the first run warms the BLAS buffers
  }
  return best;
}

double measure_bf16_gemm_flops() {
  // As measure_sgemm_flops, through gemm_bf16 (the operands' rounding included, as in training).
  const int64_t n = 1024;
  std::vector<float> a(n * n, 0.5f), b(n * n, 0.25f), c(n * n, 0.0f);
  double best = 0;
  for (int rep = 0; rep < 6; ++rep) {
    double t0 = now_seconds();
    cpu::gemm_bf16(false, false, n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f, c.data(), n);
    double dt = now_seconds() - t0;
    if (rep > 0) best = std::max(best, 2.0 * n * n * n / dt);
  }
  return best;
}

#if DHELIX_HAVE_CUDA
double measure_gpu_gemm_flops(cuda::Blas& blas, Device d) {
  // cuBLASLt's bf16 rate on this GPU: 4096^3 (C = A B^T, bf16 out), ten products per timed run
  // (a sync's few microseconds off the 0.2 ms each takes), the best of five after a warm-up run.
  // Operands are not zeros (a GPU multiplies zeros at a lower power draw: a flattering rate).
  const int64_t n = 4096;
  Tensor h = Tensor::empty({n * n}, DType::kBF16);
  for (int64_t i = 0; i < n * n; ++i) h.data<uint16_t>()[i] = f32_to_bf16(0.25f + 0.01f * static_cast<float>(i % 97));
  Tensor a = h.to(d), b = h.to(d), c = Tensor::empty({n * n}, DType::kBF16, nullptr, d);
  auto* pa = static_cast<const cuda::bf16*>(a.raw());
  auto* pb = static_cast<const cuda::bf16*>(b.raw());
  double best = 0;
  for (int rep = 0; rep < 6; ++rep) {
    DHX_CUDA(cudaDeviceSynchronize());
    const double t0 = now_seconds();
    for (int i = 0; i < 10; ++i)
      blas.gemm(cuda::Blas::Op::kN, cuda::Blas::Op::kT, n, n, n, 1.0f, pa, n, pb, n, 0.0f, c.raw(), n,
                cuda::Blas::Out::kBf16, nullptr, nullptr);
    DHX_CUDA(cudaDeviceSynchronize());
    const double dt = now_seconds() - t0;
    if (rep > 0) best = std::max(best, 10 * 2.0 * n * n * n / dt);
  }
  return best;
}
#endif

namespace {

std::string human_bytes(double b) {
  const char* u[] = {"B", "KiB", "MiB", "GiB"};
  int i = 0;
  while (b >= 1024 && i < 3) b /= 1024, ++i;
  return fmt::format("{:.1f} {}", b, u[i]);
}

}  // namespace

Trainer::Trainer(const RunConfig& cfg, CommContext* comm, Quiet quiet, Data data) : cfg_(cfg), comm_(comm), quiet_(quiet) {
  const auto& p = cfg_.parallel;
  layout_ = layout_config(cfg_);
  if (comm_) {
    DHX_CHECK(comm_->world_size() == layout_.world(), ConfigError,
              "world size {} != the layout's {} ranks (dp={} pp={} cp={} tp={} tp_x={} tp_y={} tp_z={}); launch with "
              "mpirun -np {}",
              comm_->world_size(), layout_.world(), p.dp, p.pp, p.cp, p.tp, p.tp_x, p.tp_y, p.tp_z, layout_.world());
    tp_rank_ = comm_->layout().coord().tp;
    dp_rank_ = comm_->layout().coord().dp;
    pp_rank_ = comm_->layout().coord().pp;
    coord_ = comm_->layout().coord();
  } else {
    DHX_CHECK(layout_.world() == 1, ConfigError,
              "parallel.dp={} pp={} cp={} tp={} tp_x={} tp_y={} tp_z={} need {} processes; launch with mpirun -np {}",
              p.dp, p.pp, p.cp, p.tp, p.tp_x, p.tp_y, p.tp_z, layout_.world(), layout_.world());
  }
  // The kernels' threads and GEMM precision travel in the run's context (RunContext::kernels); this
  // thread's OpenMP count is set now for the work before the first step (StepRunner sets it per step).
  const cpu::KernelConfig kernels = cpu::kernel_config(
      threads_per_rank(cfg_, comm_),
      cfg_.training.precision == "bf16" ? cpu::GemmPrecision::kBf16 : cpu::GemmPrecision::kFp32);
  cpu::set_num_threads(kernels.threads);
  // Under context parallelism this rank's micro-batch holds seq_len / cp rows of each sequence.
  mb_ = MicroBatchShape{cfg_.training.micro_batch_size, cfg_.model.seq_len / layout_.cp};
  StepSpec spec;
  StepPartsSpec& ps = spec.parts;
  ps.model = cfg_.model;
  ps.layout = layout_;
  ps.tp_rank = tp_rank_;
  ps.pp_rank = pp_rank_;
  ps.coord = coord_;
  ps.mb = mb_;
  ps.pipeline = pipeline_spec(cfg_);
  ps.seed = static_cast<uint64_t>(cfg_.training.seed);
  ps.tokens_per_step = static_cast<double>(cfg_.tokens_per_step());
  spec.groups = StepGroups::of(comm_);
  // training.device = cuda[:N]: Config refuses what the GPU path does not run yet; under NCCL a GPU
  // per rank (rank_device).
  device_ = rank_device(cfg_, comm_);
  spec.nccl = !device_.is_host() && cfg_.comm.gpu_transport == "nccl";
  spec.gemms.timed = !device_.is_host() && cfg_.training.gemm_algo == "timed";
  spec.gemms.wgrad_partials = !device_.is_host() && cfg_.training.wgrad_gemm != "direct";
  spec.device = device_;
  if (!device_.is_host() && !cfg_.training.gemm_choices.empty())
    spec.gemms.choices = gemm_choices_for_rank(cfg_.training.gemm_choices, comm_ ? comm_->rank() : 0,
                                              comm_ ? comm_->world_size() : 1);
  spec.kernels = kernels;
  spec.zero = p.zero ? ZeroStage::kOne : ZeroStage::kNone;
  spec.adamw = AdamWConfig{cfg_.training.beta1, cfg_.training.beta2, cfg_.training.adam_eps,
                           cfg_.training.weight_decay, cfg_.training.grad_clip};
  spec.grad_wire = cfg_.comm.grad_precision == "bf16" ? DType::kBF16 : DType::kF32;
  spec.emulated_link_bytes_per_s = cfg_.comm.emulated_link_gbit * 1e9 / 8;
  spec.nccl_max_ctas = static_cast<int>(cfg_.comm.nccl_max_ctas);
  const std::string& wire = cfg_.comm.precision == "auto" ? cfg_.training.precision : cfg_.comm.precision;
  spec.activation_wire = wire == "bf16" ? WirePrecision::kBf16 : WirePrecision::kFp32;
  spec.bf16_saved_activations = cfg_.training.precision == "bf16" && cfg_.training.bf16_activations;
  spec.expose_collectives = cfg_.schedule.expose_collectives;
  spec.micro_batches = static_cast<int>(cfg_.training.micro_batches);
  spec.plan_path = cfg_.schedule.plan;
  built_ = std::make_unique<Step>(spec);
  parts_ = built_->parts.get();
  sync_ = built_->sync.get();
  opt_ = built_->opt.get();
  runner_ = built_->runner.get();
  cp_ = spec.groups.get(GroupRole::kCP);
  pp_ = spec.groups.get(GroupRole::kPP);
  z_ = spec.groups.get(GroupRole::kZ);
  // (With pp > 1 the first stage's embedding gradient takes the dense path; its bucket still
  // overlaps the stage's remaining backward.)
  // (On the CPU: its rows are added on the host. A GPU run reduces the embedding gradient whole.)
  if (p.sparse_embed_grad && device_.is_host() && layout_.pp == 1 && !layout_.is_3d() &&
      sync_->enable_sparse_embedding(mb_.B * mb_.T))
    sparse_rows_ = std::make_unique<SparseEmbeddingRows>(*sync_, last_tokens_);
  if (!cfg_.output.trace.empty()) {
    trace_ = std::make_unique<Trace>(comm_ ? comm_->rank() : 0);
    parts_->ctx.trace = trace_.get();
    sync_->set_trace(trace_.get());
  }
  // What watches the step, in the order their effects need: a test fault's NaN before GradSync
  // reduces it; GradSync's buckets; the sparse embedding rows; a test fault's kill once the
  // buckets are in flight.
  fault_ = FaultInjector::from_env(comm_ ? comm_->rank() : 0, static_cast<int>(parts_->units.size()),
                                   *parts_->params, comm_, step_);
  if (fault_) runner_->add_observer(&fault_->before_sync());
  runner_->add_observer(sync_);
  if (sparse_rows_) runner_->add_observer(sparse_rows_.get());
  if (fault_) runner_->add_observer(&fault_->after_sync());
  lr_ = std::make_unique<LrSchedule>(cfg_.training.lr, cfg_.training.min_lr, cfg_.training.warmup_steps,
                                     cfg_.training.steps);
  if (data == Data::kNone) return;
  dataset_ = std::make_unique<IndexedDataset>(cfg_.data.prefix);
  uint64_t seed = static_cast<uint64_t>(cfg_.training.seed);
  // Data replicas: dp, and z under 3D (AxoNN's sampler: replica z + Gz * data rank); the ranks of
  // one x-y plane read the same micro-batches.
  const int replica = dp_rank_ * layout_.tp_z + coord_.z;
  // Whole sequences: under context parallelism each rank then keeps its two chunks (local_rows).
  const int64_t T = cfg_.model.seq_len;
  train_loader_ = std::make_unique<DataLoader>(*dataset_, Split::kTrain, mb_.B, T, seed, replica,
                                               layout_.data_replicas(), cfg_.data.val_fraction);
  val_loader_ = std::make_unique<DataLoader>(*dataset_, Split::kVal, mb_.B, T, seed, replica,
                                             layout_.data_replicas(), cfg_.data.val_fraction);
}

Trainer::~Trainer() = default;

int Trainer::agreed_stop_signal(bool records_failed) {
  int sig = records_failed ? kRecordsFailed : stop_signal();
  if (comm_ && comm_->world_size() > 1) {
    // A signal may reach some ranks only: every rank stops if any got one (the largest number wins).
    Tensor t = Tensor::empty({1}, DType::kI64);
    t.data<int64_t>()[0] = sig;
    comm_->world().all_reduce(t, ReduceOp::kMax).wait();
    sig = static_cast<int>(t.data<int64_t>()[0]);
  }
  return sig;
}

bool Trainer::is_logger() const { return quiet_ == Quiet::kNo && (!comm_ || comm_->rank() == 0); }

void Trainer::log(const std::string& line) const {
  if (is_logger()) {
    std::fputs((line + "\n").c_str(), stdout);
    std::fflush(stdout);
  }
}

// The rows of [B, T] whole sequences this rank trains on: all, or under context parallelism its two
// chunks of each sequence in local-row order (cpu::cp_position), [B * T / cp].
Tensor Trainer::local_rows(const Tensor& seqs) const {
  const int cp = layout_.cp;
  if (cp == 1) return seqs.view({seqs.numel()});
  const int64_t T = cfg_.model.seq_len, Tl = T / cp, B = seqs.numel() / T;
  Tensor out = Tensor::empty({B * Tl}, seqs.dtype());
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < Tl; ++t)
      out.data<int32_t>()[b * Tl + t] = seqs.data<int32_t>()[b * T + cpu::cp_position(cp, coord_.cp, Tl, t)];
  return out;
}

std::vector<MicroBatch> Trainer::next_micro_batches(DataLoader& loader) {
  std::vector<MicroBatch> mbs;
  for (int64_t i = 0; i < cfg_.training.micro_batches; ++i) {
    Batch b = loader.next();
    mbs.push_back({local_rows(b.tokens), local_rows(b.targets)});
  }
  return mbs;
}

StepStats Trainer::compute_gradients() {
  parts_->params->zero_grads();
  std::vector<MicroBatch> mbs = next_micro_batches(*train_loader_);
  last_tokens_ = mbs.back().tokens;
  StepStats st = runner_->run(mbs);
  sync_->finish();
  return st;
}

StepReport Trainer::train_step() {
  double t0 = now_seconds();
  if (fault_ && fault_->nan_weight_step() == step_ + 1) {
    ParamEntry& e = parts_->params->entries().front();
    Tensor nan = Tensor::empty({1});
    nan.f32()[0] = std::numeric_limits<float>::quiet_NaN();
    parts_->params->flat_values().narrow0(e.offset, 1).copy_from(nan);  // wherever the weights live
    parts_->params->refresh_bf16(runner_->executor().compute_stream());
  }
  if (fault_ && fault_->sigterm_step() == step_ + 1) raise(SIGTERM);
  StepStats st = compute_gradients();
  StepReport r;
  r.step = step_ + 1;
  r.lr = lr_->at(step_);
  // [loss sum, tokens, MoE aux sum, tokens per layer and expert...]: each stage adds its layers'.
  const int64_t routed = cfg_.model.is_moe() ? cfg_.model.n_layers * cfg_.model.n_experts : 0;
  Tensor agg = Tensor::zeros({3 + routed}, DType::kF64);
  double* a = agg.data<double>();
  a[0] = st.loss_sum;
  a[1] = static_cast<double>(st.tokens);
  a[2] = st.aux_weighted;
  for (int64_t i = 0; i < std::min<int64_t>(routed, static_cast<int64_t>(st.expert_tokens.size())); ++i)
    a[3 + i] = static_cast<double>(st.expert_tokens[i]);
  if (pp_) pp_->all_reduce(agg).wait();  // the stage holding the head has the loss; the others add 0
  if (z_) z_->all_reduce(agg).wait();    // 3D: each z rank's tokens (x and y ranks hold copies)
  if (cp_) cp_->all_reduce(agg).wait();  // context parallelism: each cp rank's chunks of the sequences
  if (comm_ && layout_.dp > 1) comm_->group(GroupRole::kDP).all_reduce(agg).wait();
  r.loss = a[0] / a[1];
  r.aux_loss = a[2] / a[1];
  for (int64_t i = 0; i < routed; ++i) r.expert_tokens.push_back(static_cast<int64_t>(a[3 + i]));
  const double t_opt = now_seconds();
  r.grad_norm = opt_->grad_norm();
  // Every rank holds the same loss and norm (both reduced over every group), so all decide alike.
  if (std::isfinite(r.loss) && std::isfinite(r.grad_norm)) {
    opt_->update(r.lr, opt_->steps_taken() + 1, r.grad_norm);
    skipped_in_a_row_ = 0;
  } else {
    r.skipped = true;
    ++skipped_total_;
    ++skipped_in_a_row_;
    const int64_t bad = opt_->nonfinite_entry();
    const std::string what = fmt::format(
        "step {}: loss {}, gradient norm {}{}", r.step, r.loss, r.grad_norm,
        bad >= 0 ? fmt::format(" (first non-finite gradient: '{}')", parts_->params->global_name(bad)) : "");
    const std::string hint = fmt::format(
        "the weights were not updated; the last checkpoint is the newest good state (resume it with "
        "--checkpoint.resume latest, e.g. with a lower training.lr={})",
        cfg_.training.lr);
    if (cfg_.training.nonfinite == "stop")
      throw DivergedError(fmt::format("{}; training.nonfinite=stop: stopping.\n{}", what, hint));
    if (skipped_in_a_row_ >= cfg_.training.nonfinite_max_skips)
      throw DivergedError(fmt::format("{} steps in a row had a non-finite loss or gradient, the last {}; "
                                      "training.nonfinite_max_skips={}: stopping.\n{}",
                                      skipped_in_a_row_, what, cfg_.training.nonfinite_max_skips, hint));
  }
  if (trace_) trace_->add("compute optimizer", r.skipped ? "skipped update" : "adamw", t_opt, now_seconds());
  r.seconds = now_seconds() - t0;
  double tokens = static_cast<double>(cfg_.tokens_per_step());
  r.tokens_per_s = tokens / r.seconds;
  r.model_flops_per_s = cfg_.model.flops_per_token(cfg_.model.seq_len) * tokens / r.seconds;
  r.peak_activation_bytes = st.peak_activation_bytes;
  r.peak_bytes = st.peak_activation_bytes + parts_->state_mem.current();
  ++step_;
  // training.wgrad_gemm: what the first step ran, said once (a GPU run).
  if (!device_.is_host() && !told_wgrad_) {
    told_wgrad_ = true;
    log(fmt::format("weight-gradient GEMMs (training.wgrad_gemm={}): {} call(s) in the first step ran as partials{}",
                    cfg_.training.wgrad_gemm, built_->partial_wgrads(),
                    cfg_.training.wgrad_gemm == "direct"
                        ? ""
                        : " (where a gradient has few output tiles for the GPU's SMs; the others direct)"));
  }
  // training.gemm_choices: the algorithms chosen for shapes the file did not hold, written after the
  // step that first ran them (a no-op when nothing is new).
  if (const Step::GemmChoiceCounts g = built_->save_gemm_choices(); g.written > 0)
    log(fmt::format("GEMM choices (training.gemm_choices): {} read from the file and used{}, {} chosen now (gemm_algo={}) "
                    "and written to {}{}",
                    g.from_file, g.unusable > 0 ? fmt::format(" ({} no longer offered: chosen anew)", g.unusable) : "",
                    g.written, cfg_.training.gemm_algo, cfg_.training.gemm_choices,
                    comm_ && comm_->world_size() > 1 ? " (one file a rank: .rank<r> before the extension)" : ""));
  return r;
}

std::optional<double> Trainer::evaluate(int64_t batches) {
  if (fault_ && fault_->sigterm_at(step_ == 0 ? "eval0" : "eval")) raise(SIGTERM);
  val_loader_->reset();  // the same held-out batches every time, so evaluations compare
  double loss = 0, tokens = 0;
  for (int64_t i = 0; i < batches; ++i) {
    if (agreed_stop_signal(false) != 0) return std::nullopt;  // every rank leaves at the same batch
    Batch b = val_loader_->next();
    StepStats st = runner_->forward_only({{local_rows(b.tokens), local_rows(b.targets)}});
    loss += st.loss_sum;
    tokens += static_cast<double>(st.tokens);
  }
  Tensor agg = Tensor::empty({2}, DType::kF64);
  agg.data<double>()[0] = loss;
  agg.data<double>()[1] = tokens;
  if (pp_) pp_->all_reduce(agg).wait();
  if (z_) z_->all_reduce(agg).wait();
  if (cp_) cp_->all_reduce(agg).wait();
  if (comm_ && layout_.dp > 1) comm_->group(GroupRole::kDP).all_reduce(agg).wait();
  return agg.data<double>()[0] / agg.data<double>()[1];
}

// "aux 0.0102 | tokens per expert (all layers) 812 790 ... | busiest/mean 1.08": the balance the
// load-balancing loss drives toward 1.
namespace {
std::string describe_routing(const StepReport& r, int64_t n_experts) {
  std::string out = fmt::format("aux {:.4f}", r.aux_loss);
  if (r.expert_tokens.empty() || n_experts <= 0) return out;
  std::vector<int64_t> per(n_experts, 0);
  for (size_t i = 0; i < r.expert_tokens.size(); ++i) per[i % n_experts] += r.expert_tokens[i];
  int64_t total = 0, busiest = 0;
  for (int64_t v : per) total += v, busiest = std::max(busiest, v);
  out += " | tokens per expert (all layers)";
  for (int64_t v : per) out += fmt::format(" {}", v);
  if (total > 0) out += fmt::format(" | busiest/mean {:.2f}", double(busiest) * double(n_experts) / double(total));
  return out;
}
}  // namespace

namespace {

// The run's records (rank 0's metrics file; none elsewhere). A write that fails is kept and acted on
// at the step's end, where every rank agrees (agreed_stop_signal): save, then stop (exit 2). Later
// writes are not tried.
class RunRecords {
 public:
  explicit RunRecords(std::unique_ptr<MetricsWriter> w) : w_(std::move(w)) {}
  template <class Write>
  void write(const Write& f) {
    if (!w_ || !error_.empty()) return;
    try {
      f(*w_);
    } catch (const IoError& e) {
      error_ = e.what();
    }
  }
  bool failed() const { return !error_.empty(); }
  const std::string& error() const { return error_; }

 private:
  std::unique_ptr<MetricsWriter> w_;
  std::string error_;
};

}  // namespace

// Rank 0: the run directory's config.toml and its metrics file (on resume, rows after the resumed
// step dropped, then appended to); nothing on the other ranks.
std::unique_ptr<MetricsWriter> Trainer::open_metrics() {
  if (!is_logger()) return nullptr;
  std::filesystem::create_directories(cfg_.output.dir);
  write_file_atomic(cfg_.output.dir + "/config.toml", to_toml(cfg_));
  const std::string mpath = cfg_.output.metrics.empty() ? cfg_.output.dir + "/metrics.jsonl" : cfg_.output.metrics;
  if (step_ > 0) {
    const int64_t dropped = truncate_metrics_after(mpath, step_);
    if (dropped > 0) log(fmt::format("metrics: dropped {} line(s) after step {} from {} (they are re-run)", dropped, step_, mpath));
  }
  return std::make_unique<MetricsWriter>(mpath, step_ > 0 ? MetricsMode::kAppend : MetricsMode::kTruncate);
}

// The reference rate MFU is quoted against: sgemm, or in bf16 the bf16 GEMM (gemm_bf16, rounding
// included) the run uses, or cuBLAS's bf16 GEMM on a GPU.
size_t Trainer::partial_wgrads() const { return built_->partial_wgrads(); }

const char* Trainer::reference_name() const {
  return !device_.is_host() ? "cuBLAS bf16" : cfg_.training.precision == "bf16" ? "bf16 gemm" : "sgemm";
}

double Trainer::measure_reference() {
#if DHELIX_HAVE_CUDA
  if (!device_.is_host()) return measure_gpu_gemm_flops(*built_->blas, device_);
#endif
  return cfg_.training.precision == "bf16" ? measure_bf16_gemm_flops() : measure_sgemm_flops();
}

void Trainer::log_run_header() const {
  const auto& m = cfg_.model;
  const bool gpu = !device_.is_host();
  log(fmt::format("model {} ({}): {:.2f}M parameters, {} layers, d={}, heads={}/{} | layout {} | {} {} | "
                  "B={} T={} x {} micro-batches x dp {} = {} tokens/step",
                  m.name, family_name(m.family), m.num_params() / 1e6, m.n_layers, m.d_model, m.n_heads, m.n_kv_heads,
                  comm_ ? comm_->layout().describe() : gpu ? "single process on " + cfg_.training.device : "single process",
                  fmt::format("schedule {},", cfg_.schedule.pipeline),
                  cfg_.schedule.strand_interleaving ? "strand interleaving on" : "strand interleaving off", mb_.B,
                  m.seq_len, cfg_.training.micro_batches, layout_.dp, cfg_.tokens_per_step()));
  log(fmt::format("{} {:.1f} GFLOP/s measured now; model FLOPs/token = 6*N_matmul + 6*L*T*d = {:.3g}", reference_name(),
                  sgemm_flops_ / 1e9, m.flops_per_token(m.seq_len)));
  if (layout_.recompute != Recompute::kNone)
    log(fmt::format("activation recomputation: {} (the recompute ops run at the start of each layer's backward), {}",
                    recompute_name(layout_.recompute),
                    layout_.recompute_layers > 0
                        ? fmt::format("the first {} layer(s) of each pipeline chunk", layout_.recompute_layers)
                        : std::string("every layer")));
  if (layout_.keep_gathered > 0)
    log(fmt::format("weight blocks kept (parallel.keep_gathered={}): the first {} layer(s) of each pipeline chunk "
                    "gather their blocks over z once a step and keep them for every micro-batch; the others gather "
                    "them in each forward and again in each backward{}",
                    layout_.keep_gathered, layout_.keep_gathered,
                    layout_.recompute == Recompute::kFull ? " and recompute" : ""));
  if (layout_.fuse_epilogues) {
    const EpilogueFusions& f = built_->parts->progs.fusions;
    log(fmt::format("GEMM epilogues fused (training.fuse_epilogues={}): {} GELU, {} GELU gradient and {} residual "
                    "add op(s) into their GEMMs, over the distinct layer programs{}",
                    cfg_.training.fuse_epilogues, f.gelu, f.dgelu, f.residual,
                    f.total() == 0 ? " -- none in this model and layout" : ""));
  }
  // parallel.sparse_embed_grad is on by default: where it could pay (dp > 1) but this layout keeps the
  // dense exchange, say why once.
  if (cfg_.parallel.sparse_embed_grad && layout_.dp > 1 && !sparse_rows_) {
    std::string why;
    if (layout_.pp > 1)
      why = fmt::format("pp={}: not implemented for pipelines in this build (a tied table's two stage copies are "
                        "summed dense between the first and last stage)", layout_.pp);
    else if (layout_.is_3d())
      why = "the 3D grid splits the table over x and y and its batch over z; the rows exchange is not implemented there";
    else if (layout_.tp > 1)
      why = fmt::format("tp={}: each tp rank holds a vocabulary shard of the table", layout_.tp);
    else if (layout_.cp > 1)
      why = fmt::format("cp={}: the table's gradient is reduced over dp x cp", layout_.cp);
    else
      why = "the step's tokens x dp reach 2 x vocabulary rows: the dense all-reduce moves fewer bytes";
    log(fmt::format("parallel.sparse_embed_grad: the token embedding's gradient is all-reduced dense ({})", why));
  }
}

// The step's model FLOP rate as a fraction of the reference rate (the world's).
double Trainer::fraction_of_reference(const StepReport& r) {
  const int world = comm_ ? comm_->world_size() : 1;
  double frac = r.model_flops_per_s / (sgemm_flops_ * world);
  if (frac > 1) {
    // Above the machine's rate: the start-up reference was measured while the machine was busy.
    sgemm_flops_ = std::max(sgemm_flops_, measure_reference());
    frac = r.model_flops_per_s / (sgemm_flops_ * world);
    if (frac > 1) log(fmt::format("warning: step {} ran at {:.2f} of the {} rate measured twice; the reference is "
                                  "not this machine's peak (other load?)", r.step, frac, reference_name()));
  }
  return frac;
}

void Trainer::log_step(const StepReport& r, double frac) const {
  const auto& tc = cfg_.training;
  if (r.skipped) {
    log(fmt::format("step {:>5}/{} | loss {:.4f} | grad {:.3f} | SKIPPED: non-finite, no update ({} in a row, {} in the run; "
                    "training.nonfinite_max_skips={})",
                    r.step, tc.steps, r.loss, r.grad_norm, skipped_in_a_row_, skipped_total_, tc.nonfinite_max_skips));
    return;
  }
  if (!is_logger() || (r.step % std::max<int64_t>(1, tc.log_interval) != 0 && r.step != tc.steps)) return;
  log(fmt::format("step {:>5}/{} | loss {:.4f} | lr {:.2e} | grad {:.3f} | {:.0f} tok/s | {:.1f} GFLOP/s "
                  "({:.2f} of {}) | peak act {} | {:.3f} s",
                  r.step, tc.steps, r.loss, r.lr, r.grad_norm, r.tokens_per_s, r.model_flops_per_s / 1e9, frac,
                  reference_name(), human_bytes(double(r.peak_activation_bytes)), r.seconds));
  if (cfg_.model.is_moe()) log(fmt::format("step {:>5}/{} | moe | {}", r.step, tc.steps, describe_routing(r, cfg_.model.n_experts)));
}

StepMetrics Trainer::step_metrics(const StepReport& r, double frac) const {
  StepMetrics m;
  m.step = r.step;
  m.loss = r.loss;
  m.lr = r.lr;
  m.grad_norm = r.grad_norm;
  m.tokens_per_s = r.tokens_per_s;
  m.model_flops_per_s = r.model_flops_per_s;
  m.sgemm_fraction = frac;
  m.peak_bytes = r.peak_bytes;
  m.extras["peak_activation_bytes"] = r.peak_activation_bytes;
  m.extras["step_s"] = r.seconds;
  m.extras["skipped_steps"] = skipped_total_;
  if (r.skipped) m.extras["skipped"] = true;
  if (cfg_.model.is_moe()) {
    // Per layer, the tokens each expert received this step (global batch, all ranks).
    const int64_t E = cfg_.model.n_experts;
    nlohmann::json layers = nlohmann::json::array();
    for (int64_t l = 0; l < cfg_.model.n_layers; ++l)
      layers.push_back(std::vector<int64_t>(r.expert_tokens.begin() + l * E, r.expert_tokens.begin() + (l + 1) * E));
    m.extras["aux_loss"] = r.aux_loss;
    m.extras["expert_tokens"] = layers;
  }
  return m;
}

// The run's records could not be written (a full disk under the metrics, say): the step is saved
// first, wherever the checkpoints still have room, then the run stops naming both.
void Trainer::stop_for_records(const std::string& records_error) {
  const std::string why = records_error.empty() ? "rank 0 could not write the run's metrics" : records_error;
  std::string path;
  try {
    path = save_checkpoint();
  } catch (const std::exception& e) {
    throw IoError(fmt::format("{}\nand no checkpoint could be saved either: {}", why, e.what()));
  }
  throw IoError(fmt::format("{}\nsaved {} (step {}) before stopping; free space for the metrics and resume "
                            "with --checkpoint.resume latest",
                            why, path, step_));
}

// After the last step: the final checkpoint, the trace, and the sample. A stop signal during the
// save (or the trace) is honoured once they are written; one during the sample ends the text early.
int Trainer::finish_run() {
  const auto& tc = cfg_.training;
  const int world = comm_ ? comm_->world_size() : 1;
  log("saved " + save_checkpoint());
  if (trace_) {
    std::string path = cfg_.output.trace;
    if (world > 1) path += fmt::format(".rank{}", comm_->rank());
    trace_->write(path);
    log("trace written to " + path + (world > 1 ? " (one file per rank)" : ""));
  }
  if (const int sig = agreed_stop_signal(false); sig != 0) {
    log(fmt::format("stopped by {} after the last step, its checkpoint saved (exit {})", signal_name(sig), 128 + sig));
    return sig;
  }
  if (tc.sample_tokens > 0) {
    // Every rank calls: with the model split over tp or pp, sampling gathers it first. Rank 0 alone
    // generates.
    const std::string s = sample("In the beginning", tc.sample_tokens, 0.8, 40, static_cast<uint64_t>(tc.seed));
    if (!s.empty()) log("sample: " + s);
    if (const int sig = stop_signal(); sig != 0) {
      log(fmt::format("stopped by {} while sampling (the text above is cut short; the checkpoint is saved) (exit {})",
                      signal_name(sig), 128 + sig));
      return sig;
    }
  }
  return 0;
}

int Trainer::run() {
  const auto& tc = cfg_.training;
  check_tokens(cfg_, *dataset_);
  if (!cfg_.checkpoint.resume.empty()) {
    std::string skipped;
    const std::string path = load_resume(cfg_.checkpoint.resume, /*whole_state=*/true, &skipped);
    if (!skipped.empty()) log(fmt::format("warning: {}; resuming from the newest checkpoint that loads", skipped));
    log(fmt::format("resumed from {} at step {}", path, step_));
  }
  RunRecords records(open_metrics());
  sgemm_flops_ = measure_reference();
  log_run_header();

  // A first stop signal before the first step (while the data, the model or the reference rate were
  // set up, or during the first evaluation): no step has run since the last checkpoint, nothing to save.
  auto stopped_before_training = [&](int sig) {
    log(fmt::format("stopped by {} before step {}: no step ran, nothing new to save (exit {})", signal_name(sig),
                    step_ + 1, 128 + sig));
    return sig;
  };
  if (fault_ && fault_->sigterm_at("setup")) raise(SIGTERM);
  if (const int sig = agreed_stop_signal(false); sig != 0) return stopped_before_training(sig);
  if (tc.eval_interval > 0 && step_ == 0) {
    const std::optional<double> v = evaluate(tc.eval_batches);
    if (!v) return stopped_before_training(agreed_stop_signal(false));
    log(fmt::format("step {} | val loss {:.4f}", step_, *v));
    records.write([&](MetricsWriter& w) { w.write_json({{"step", step_}, {"val_loss", *v}}); });
  }

  ProgressBar bar(tc.steps, "train");
  while (step_ < tc.steps) {
    const StepReport r = train_step();
    const double frac = fraction_of_reference(r);
    log_step(r, frac);
    records.write([&](MetricsWriter& w) { w.write(step_metrics(r, frac)); });
    bar.update(r.step, fmt::format("loss {:.3f}", r.loss));
    if (tc.eval_interval > 0 && (r.step % tc.eval_interval == 0 || r.step == tc.steps)) {
      // Cut short by a stop signal: no val loss this time; the stop below saves the step.
      if (const std::optional<double> v = evaluate(tc.eval_batches)) {
        log(fmt::format("step {} | val loss {:.4f}", r.step, *v));
        records.write([&](MetricsWriter& w) { w.write_json({{"step", r.step}, {"val_loss", *v}}); });
      }
    }
    // Every rank agrees whether to stop here: a signal on any rank, or rank 0's records failing.
    const int sig = agreed_stop_signal(records.failed());
    if (sig != 0) bar.finish();
    if (sig == kRecordsFailed) stop_for_records(records.error());
    if (sig != 0) {
      const std::string path = save_checkpoint();
      log(fmt::format("stopped by {} after step {}: saved {}; resume with --checkpoint.resume latest (exit {})",
                      signal_name(sig), step_, path, 128 + sig));
      return sig;
    }
    if (cfg_.checkpoint.interval > 0 && r.step % cfg_.checkpoint.interval == 0 && r.step < tc.steps)
      log("saved " + save_checkpoint());
  }
  bar.finish();
  return finish_run();
}

}  // namespace dhelix
