// LayerPairBench: unit/parameter setup, strand snapshots, timed runs and cross-rank agreement.
#include "profile/LayerPairBench.h"

#include <fmt/format.h>

#include <algorithm>
#include <random>

#include "base/Clock.h"
#include "base/Error.h"
#include "base/Stats.h"
#include "kernels/cpu/Kernels.h"
#include "model/Params.h"
#include "runtime/StepBuilder.h"

namespace dhelix {

namespace {

// [Ns, C] of N(0, 1) values; seeded per (seed, rank) so ranks hold different shards. Made on the
// host and copied to `d` (ordered on stream s) when that is a GPU.
Tensor random_rows(int64_t rows, int64_t cols, uint64_t seed, MemoryTracker* mem, Device d, StreamHandle s) {
  Tensor t = Tensor::empty({rows, cols}, DType::kF32, d.is_host() ? mem : nullptr);
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  float* p = t.f32();
  for (int64_t i = 0; i < rows * cols; ++i) p[i] = nd(rng);
  return d.is_host() ? t : t.to(d, mem, s);
}

}  // namespace

std::string describe_precision(const LayerPairRun& run) {
  if (!run.device.is_host()) return "GPU (bf16)";
  return fmt::format("{} GEMMs, {} wire", run.gemm == cpu::GemmPrecision::kBf16 ? "bf16" : "fp32",
                     run.activation_wire == WirePrecision::kBf16 ? "bf16" : "fp32");
}

LayerPairBench::LayerPairBench(const ModelConfig& model, const LayoutConfig& layout, const MicroBatchShape& mb,
                               CommContext* comm, const LayerPairRun& run)
    : model_(model), layout_(layout), run_(run), mb_(mb), comm_(comm) {
  const uint64_t seed = run.seed;
  const Device device = run.device;
  if (comm_) {
    DHX_CHECK(comm_->world_size() == layout_.world(), ConfigError,
              "world size {} != layout world {} (dp={} cp={} tp={} tp_x={} tp_y={} tp_z={}); launch with mpirun -np {}",
              comm_->world_size(), layout_.world(), layout_.dp, layout_.cp, layout_.tp, layout_.tp_x, layout_.tp_y, layout_.tp_z,
              layout_.world());
    tp_rank_ = comm_->layout().coord().tp;
    coord_ = comm_->layout().coord();
  } else {
    DHX_CHECK(layout_.world() == 1, ConfigError, "layout dp={} tp={} needs {} processes; launch with mpirun -np {}",
              layout_.dp, layout_.tp, layout_.world(), layout_.world());
  }
  DHX_CHECK(model_.n_layers >= 1, ConfigError, "model.n_layers={} has no transformer layer to profile",
            model_.n_layers);
  // Model folding pairs forward layer l with backward layer L+1-l: two weight sets, as in training:
  // the first block (unit 1) and the last (unit L); only their parameters are stored.
  const int first = 1, last = static_cast<int>(model_.n_layers);
  StepPartsSpec ps;
  ps.model = model_;
  ps.layout = layout_;
  ps.tp_rank = tp_rank_;
  ps.coord = coord_;
  ps.mb = mb_;
  ps.owned_units = first == last ? std::vector<int>{first} : std::vector<int>{first, last};
  ps.seed = seed;
  ps.tokens_per_step = static_cast<double>(std::max<int64_t>(1, mb_.tokens()));
  parts_ = std::make_unique<StepParts>(ps);
  // As a training step's: the weights move, the ops bind to its kernels, its GEMMs run as the
  // run's would (LayerPairRun::gemms).
  blas_ = place_on_device(*parts_, device, run.gemms);
  // and, on a GPU, its collectives move device tensors over staged groups (CPU groups would read
  // device memory on the host).
  parts_->ctx.groups = place_groups_on_device(StepGroups::of(comm_), device, run.groups, staged_);
  // The host's GEMM precision and activation wire, as the run's (StepRunner makes its bf16 weight
  // copies per step; the bench's weights never change, so once).
  if (device.is_host()) {
    parts_->ctx.kernels = cpu::kernel_config(cpu::num_threads(), run.gemm);
    parts_->ctx.activation_wire = run.activation_wire;
    if (run.gemm == cpu::GemmPrecision::kBf16) {
      weights16_ = std::make_unique<Bf16Weights>(&parts_->state_mem);
      parts_->ctx.bf16_weights = weights16_.get();
    }
  }
  exec_ = std::make_unique<Executor>(parts_->ctx, parts_->units, parts_->progs);
  fslot_ = StrandSlot{1, first, &fenv_};
  bslot_ = StrandSlot{0, last, &benv_};
  build_snapshots(seed);
}

// A GPU bench's staged groups go first, after the prefetches no unit adopted (as ~Step's).
LayerPairBench::~LayerPairBench() {
  if (staged_.empty()) return;
  try {
    exec_->drain_prefetches();
  } catch (const std::exception&) {  // a run failed already; its error is the one reported
  }
  staged_.clear();
}

void LayerPairBench::build_snapshots(uint64_t seed) {
  // The block's input: Megatron's sequence shard [N/tp, C], or 3D's feature shard [N, C/Gx].
  const int64_t Ns = mb_.tokens() / layout_.tp, C = model_.d_model / layout_.tp_x;
  const uint64_t rank = comm_ ? static_cast<uint64_t>(comm_->rank()) : 0;
  const auto& fwd = parts_->progs.block.fwd;
  const auto& bwd = parts_->progs.block.bwd;
  const Device dev = parts_->ctx.device;
  const StreamHandle fstream = exec_->strand_stream(StrandKind::kForward);
  const StreamHandle bstream = exec_->strand_stream(StrandKind::kBackward);
  exec_->after_default_stream();  // the parameters' upload (place_on_device: the default stream) first
  // Forward strand: ops one at a time (collectives included, so every rank runs the same).
  fenv_.bufs.clear();
  fenv_.bufs["x"] = random_rows(Ns, C, seed * 1000003 + 2 * rank + 1, &parts_->act_mem, dev, fstream);
  fsnap_.assign(1, fenv_.bufs);
  for (int k = 0; k < static_cast<int>(fwd.size()); ++k) {
    Block b;
    b.fwd_begin = k, b.fwd_end = k + 1;
    exec_->run_pair(&fslot_, nullptr, {b});
    fsnap_.push_back(fenv_.bufs);
  }
  // Backward strand: another micro-batch's forward, then dy, then the backward ops one at a time.
  benv_.bufs.clear();
  benv_.bufs["x"] = random_rows(Ns, C, seed * 1000003 + 2 * rank + 2, &parts_->act_mem, dev, fstream);
  exec_->run_alone(bslot_, StrandKind::kForward);
  benv_.bufs["dy"] = random_rows(Ns, C, seed * 1000003 + 2 * rank + 7919, &parts_->act_mem, dev, bstream);
  bsnap_.assign(1, benv_.bufs);
  for (int k = 0; k < static_cast<int>(bwd.size()); ++k) {
    Block b;
    b.bwd_begin = k, b.bwd_end = k + 1;
    exec_->run_pair(nullptr, &bslot_, {b});
    bsnap_.push_back(benv_.bufs);
  }
  drain();
  fenv_.bufs.clear();
  benv_.bufs.clear();
}

// A background collective whose reader lies outside the windows run (3D TP's weight-gradient
// reduce-scatter) and a prefetch for a unit the bench never runs: waited for, so nothing is in
// flight when the environments are restored or cleared.
void LayerPairBench::drain() {
  exec_->drain(fenv_);
  exec_->drain(benv_);
  exec_->drain_prefetches();
}

void LayerPairBench::restore(UnitEnv& env, const std::vector<std::map<std::string, Tensor>>& snaps, int k,
                             const std::vector<Op>& ops, int begin, int end) {
  DHX_ASSERT(env.pending.empty(), "restoring an environment with collectives in flight");
  env.bufs = snaps.at(k);
  env.mirrors.clear();  // host copies the previous run made: this one reads (and waits) as a step does
  parts_->ctx.router.clear();  // (what a GPU's moe_aux left pending: no step end settles it here)
  // The executor's all-reduce writes its input in place: give it a private copy so the snapshot
  // (and the next run) sees the original values.
  for (int i = begin; i < end; ++i) {
    const Op& op = ops[i];
    if (op.is_collective() && op.coll == CollOp::kAllReduce) {
      auto it = env.bufs.find(op.inputs.at(0));
      if (it != env.bufs.end()) it->second = it->second.clone(&parts_->act_mem);
    }
    // Compute ops that update an input in place (the ring attention's running output, dq, dK/dV).
    if (op.flag("in_place"))
      for (const std::string& in : op.inputs) {
        auto it = env.bufs.find(in);
        if (it != env.bufs.end()) it->second = it->second.clone(&parts_->act_mem);
      }
  }
}

double LayerPairBench::run_once(const std::vector<Block>& blocks) {
  DHX_CHECK(!blocks.empty(), InternalError, "run_once: no blocks");
  int f0 = -1, f1 = -1, b0 = -1, b1 = -1;
  for (const Block& k : blocks) {
    if (k.has_fwd()) {
      if (f0 < 0) f0 = k.fwd_begin;
      f1 = k.fwd_end;
    }
    if (k.has_bwd()) {
      if (b0 < 0) b0 = k.bwd_begin;
      b1 = k.bwd_end;
    }
  }
  if (f0 >= 0) restore(fenv_, fsnap_, f0, parts_->progs.block.fwd, f0, f1);
  if (b0 >= 0) restore(benv_, bsnap_, b0, parts_->progs.block.bwd, b0, b1);
  exec_->synchronize();  // a GPU's restored copies are done before the clock starts
  if (comm_) comm_->world().barrier();  // ranks start together: a collective's time is not a late peer's
  const double t0 = now_seconds();
  exec_->run_pair(f0 >= 0 ? &fslot_ : nullptr, b0 >= 0 ? &bslot_ : nullptr, blocks);
  drain();  // inside the timing: the windows are charged for all the traffic they issued
  exec_->synchronize();  // and, on a GPU, for the kernels they launched
  const double dt = now_seconds() - t0;
  fenv_.bufs.clear();
  benv_.bufs.clear();
  return dt;
}

double LayerPairBench::local_median(const std::vector<Block>& blocks, const BenchTiming& t) {
  DHX_CHECK(t.repeats >= 1 && t.warmup >= 0, ConfigError, "repeats={} must be >= 1 and warmup={} >= 0", t.repeats,
            t.warmup);
  for (int i = 0; i < t.warmup; ++i) run_once(blocks);
  std::vector<double> s;
  for (int i = 0; i < t.repeats; ++i) s.push_back(run_once(blocks));
  return median(s);
}

double LayerPairBench::local_overhead(const BenchTiming& t) {
  auto once = [&] {
    exec_->synchronize();
    if (comm_) comm_->world().barrier();
    const double t0 = now_seconds();
    exec_->run_pair(nullptr, nullptr, {});  // the pair's bracket (its stream joins on a GPU), no op
    drain();
    exec_->synchronize();
    return now_seconds() - t0;
  };
  for (int i = 0; i < t.warmup; ++i) once();
  std::vector<double> s;
  for (int i = 0; i < std::max(t.repeats, 9); ++i) s.push_back(once());
  return median(s);
}

std::vector<double> LayerPairBench::agree_max(const std::vector<double>& local) {
  if (!comm_ || comm_->world_size() == 1 || local.empty()) return local;
  Tensor t = Tensor::empty({static_cast<int64_t>(local.size())}, DType::kF64);
  std::copy(local.begin(), local.end(), t.data<double>());
  comm_->world().all_reduce(t, ReduceOp::kMax).wait();
  const double* p = t.data<double>();
  return std::vector<double>(p, p + local.size());
}

double LayerPairBench::time_plan(const SIPlan& plan, const BenchTiming& t) {
  return agree_max({local_median(plan.blocks, t)}).front();
}

}  // namespace dhelix
