// GradSync: per-op gradient readiness, tp partial-gradient all-reduce, bucketed dp all-reduce /
// reduce-scatter in the order buckets complete (identical on every rank: all run one program).
#include "parallel/GradSync.h"

#include <fmt/format.h>

#include <algorithm>

#include "base/Clock.h"
#include "base/Error.h"
#include "base/Trace.h"
#include "kernels/cpu/Bf16.h"
#if DHELIX_HAVE_CUDA
#include "kernels/cuda/Ops.h"
#endif

namespace dhelix {

namespace {
// fp32 `src` rounded to nearest even into bf16 `dst` (the host, or on the GPU in stream s), and back.
void round_into(const Tensor& src, const Tensor& dst, void* s) {
  if (src.device().is_host()) return cpu::round_to_bf16(src.f32(), dst.data<uint16_t>(), src.numel());
#if DHELIX_HAVE_CUDA
  cuda::cast_f32_to_bf16(src.f32(), static_cast<cuda::bf16*>(dst.raw()), src.numel(), static_cast<cudaStream_t>(s));
#else
  (void)s;
  throw InternalError(fmt::format("a gradient on {} in a build without CUDA", src.device().str()));
#endif
}
void widen_into(const Tensor& src, const Tensor& dst, void* s) {
  if (src.device().is_host()) return cpu::widen_bf16(src.data<uint16_t>(), dst.f32(), src.numel());
#if DHELIX_HAVE_CUDA
  cuda::cast_bf16_to_f32(static_cast<const cuda::bf16*>(src.raw()), dst.f32(), src.numel(),
                         static_cast<cudaStream_t>(s));
#else
  (void)s;
  throw InternalError(fmt::format("a gradient on {} in a build without CUDA", src.device().str()));
#endif
}
// A GPU stream `waiter` waits (on the GPU) for the work issued on stream `s` so far.
void order_after(void* waiter, void* s) {
#if DHELIX_HAVE_CUDA
  cudaEvent_t e;
  auto ok = [](cudaError_t r, const char* what) {
    DHX_CHECK(r == cudaSuccess, DeviceError, "{} failed: {}", what, cudaGetErrorString(r));
  };
  ok(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreate");
  ok(cudaEventRecord(e, static_cast<cudaStream_t>(s)), "cudaEventRecord");
  ok(cudaStreamWaitEvent(static_cast<cudaStream_t>(waiter), e, 0), "cudaStreamWaitEvent");
  ok(cudaEventDestroy(e), "cudaEventDestroy");  // released once the wait is done
#else
  (void)waiter, (void)s;
#endif
}
}  // namespace

// ZeRO-1's chunks live where the gradients do (a GPU run's on its device; zeroed so that a chunk
// never reduced reads 0). A chunk's first writer is a group's stream (the staged copy stream, the
// NCCL stream: non-blocking, so not ordered after the zeroing's stream), so the host waits for the
// zeros here (a 4-byte read on that stream is synchronous): once per step built.
Tensor GradSync::owned_chunk(int64_t n) const {
  if (!on_gpu()) return Tensor::zeros({n}, DType::kF32, tracker_);
  Tensor t = Tensor::empty({n}, DType::kF32, tracker_, params_.device(), producer_);
  t.zero_();
  if (n > 0) {
    float first = 0;
    device_copy(&first, Device::host(), t.raw(), t.device(), sizeof first, producer_);
  }
  return t;
}

GradSync::GradSync(ParamStore& params, const std::vector<UnitSpec>& units, const ModelPrograms& progs,
                   ProcessGroup* tp, ProcessGroup* dp, ZeroStage zero, MemoryTracker* tracker)
    : params_(params), units_(units), tp_(tp), dp_(dp), zero_(zero), tracker_(tracker) {
  const int n = dp ? dp->size() : 1;
  const auto& buckets = params_.buckets();
  if (zero_ == ZeroStage::kOne)
    for (auto& b : buckets) owned_grads_.push_back(owned_chunk((b.end - b.begin) / n));
  grad_ops_.assign(params_.entries().size(), 0);
  for (size_t u = 0; u < units_.size(); ++u) {
    if (!params_.owns_unit(static_cast<int>(u))) continue;  // another pipeline stage's
    const LayerProgram& p = units_[u].kind == "embed" ? progs.embed : units_[u].kind == "head" ? progs.head : progs.block;
    for (const Op& op : p.bwd)
      for (const auto& g : op.grads) {
        ParamEntry& e = params_.resolve(units_[u], g);
        ++grad_ops_[&e - params_.entries().data()];
      }
  }
  pending_ops_ = grad_ops_;
  for (auto& b : buckets) pending_params_.push_back(static_cast<int>(b.params.size()));
  issued_.assign(buckets.size(), 0);
}

void GradSync::issue_bucket(size_t b) {
  if (issued_[b]) return;
  issued_[b] = 1;
  const GradBucket& bk = params_.buckets()[b];
  Tensor range = params_.flat_grads().narrow0(bk.begin, bk.end - bk.begin);
  ProcessGroup* g = produced(shard_group(bk));  // edp for the experts' buckets under expert parallelism
  const char* gname = g == edp_ && bk.expert ? "edp" : "dp";
  const bool reduce = g && g->size() > 1;
  // A GPU's buffers are made and written on the backward's stream (producer_), after the kernels
  // that wrote the gradients; each op is ordered after that stream's work at its issue.
  auto make = [&](int64_t n, DType t) {
    return on_gpu() ? Tensor::empty({n}, t, tracker_, params_.device(), producer_) : Tensor::empty({n}, t, tracker_);
  };
  Tensor send = range;
  if (reduce && wire_ == DType::kBF16) {
    send = make(range.numel(), DType::kBF16);
    round_into(range, send, producer_);
  }
  if (zero_ == ZeroStage::kOne) {
    if (!reduce) {
      if (on_gpu())
        device_copy(owned_grads_[b].raw(), params_.device(), range.raw(), params_.device(), range.nbytes(), producer_);
      else
        owned_grads_[b].copy_from(range);
    } else if (wire_ == DType::kBF16) {
      Tensor out = make(owned_grads_[b].numel(), DType::kBF16);
      inflight_.push_back({g->reduce_scatter(send, out), fmt::format("{}.rs.bucket{}", gname, b), range.numel(), out,
                           owned_grads_[b], send});
    } else {
      inflight_.push_back({g->reduce_scatter(range, owned_grads_[b]), fmt::format("{}.rs.bucket{}", gname, b), range.numel(), {}, {}, {}});
    }
  } else if (reduce) {
    if (wire_ == DType::kBF16)
      inflight_.push_back({g->all_reduce(send), fmt::format("{}.ar.bucket{}", gname, b), range.numel(), send, range, {}});
    else
      inflight_.push_back({g->all_reduce(range), fmt::format("{}.ar.bucket{}", gname, b), range.numel(), {}, {}, {}});
  }
}

void GradSync::set_wire(DType wire) {
  DHX_CHECK(wire == DType::kF32 || wire == DType::kBF16, ConfigError,
            "gradient wire precision {} is neither f32 nor bf16", dtype_name(wire));
  wire_ = wire;
}

void GradSync::set_expert_group(ProcessGroup* edp) {
  expert_group_set_ = true;
  edp_ = edp;
  if (zero_ != ZeroStage::kOne) return;
  const auto& buckets = params_.buckets();
  for (size_t b = 0; b < buckets.size(); ++b)  // the experts' chunks are over edp, not dp
    if (buckets[b].expert)
      owned_grads_[b] = owned_chunk((buckets[b].end - buckets[b].begin) / shard_size(buckets[b]));
}

void GradSync::param_ready(size_t entry) {
  size_t b = params_.entries()[entry].bucket;
  if (--pending_params_[b] == 0 && overlap_ == GradOverlap::kOn && b != tied_bucket_) issue_bucket(b);
}

void GradSync::set_tied_peer(ProcessGroup* pp, int peer) {
  tied_pp_ = pp, tied_peer_ = peer;
  const ParamEntry* copy = params_.tied_copy();
  const ParamEntry& e = copy ? *copy : params_.get("wte");
  DHX_CHECK(params_.buckets()[e.bucket].params.size() == 1, InternalError,
            "the tied embedding shares gradient bucket {} with other parameters", e.bucket);
  tied_bucket_ = e.bucket;
}

bool GradSync::enable_sparse_embedding(int64_t tokens_per_mb) {
  if (!dp_ || dp_->size() <= 1 || (tp_ && tp_->size() > 1) || sparse_entry_ >= 0) return sparse_entry_ >= 0;
  if (units_.empty() || units_[0].kind != "embed" || !params_.owns_unit(0)) return false;
  const ParamEntry& e = params_.resolve(units_[0], "wte");
  const size_t i = static_cast<size_t>(&e - params_.entries().data());
  const int64_t V = e.grad.dim(0);
  if (tokens_per_mb * dp_->size() >= 2 * V) return false;
  DHX_CHECK(params_.buckets()[e.bucket].params.size() == 1, InternalError,
            "the token embedding shares gradient bucket {} with other parameters", e.bucket);
  DHX_CHECK(grad_ops_[i] >= 1, InternalError, "no backward op accumulates the token embedding");
  --grad_ops_[i];  // the last micro-batch's embedding backward no longer writes the dense gradient
  pending_ops_[i] = grad_ops_[i];
  sparse_entry_ = static_cast<int64_t>(i);
  return true;
}

bool GradSync::take_embedding_rows(const Tensor& tokens, const Tensor& dy) {
  if (sparse_entry_ < 0) return false;
  const ParamEntry& e = params_.entries()[static_cast<size_t>(sparse_entry_)];
  const int64_t N = tokens.numel(), C = e.grad.dim(1), n = dp_->size();
  DHX_CHECK(tokens.dtype() == DType::kI32 && dy.numel() == N * C, InternalError,
            "embedding rows: {} tokens but a gradient of {} elements (C = {})", N, dy.numel(), C);
  DHX_CHECK(!rows_taken_, InternalError, "embedding rows taken twice in one step");
  tokens_all_ = Tensor::empty({n * N}, DType::kI32, tracker_);
  rows_all_ = Tensor::empty({n * N, C}, DType::kF32, tracker_);
  inflight_.push_back({dp_->all_gather(tokens.view({N}), tokens_all_), "dp.ag.embed.tokens", tokens_all_.numel(), {}, {}, {}});
  inflight_.push_back({dp_->all_gather(dy.view({N, C}), rows_all_), "dp.ag.embed.rows", rows_all_.numel(), {}, {}, {}});
  rows_taken_ = true;
  return true;
}

// Every rank adds rank 0's rows, then rank 1's, ... in token order: the same sums on every rank.
// Without ZeRO into the dense gradient; with ZeRO-1 only the elements inside this rank's chunk.
void GradSync::add_gathered_rows() {
  const ParamEntry& e = params_.entries()[static_cast<size_t>(sparse_entry_)];
  const GradBucket& bk = params_.buckets()[e.bucket];
  const int64_t V = e.grad.dim(0), C = e.grad.dim(1), rows = tokens_all_.numel();
  int64_t lo = bk.begin, hi = bk.end;  // flat range this rank holds reduced
  float* dst = params_.flat_grads().f32() + lo;
  if (zero_ == ZeroStage::kOne) {
    const int64_t len = (bk.end - bk.begin) / dp_->size();
    lo = bk.begin + dp_->rank() * len, hi = lo + len;
    dst = owned_grads_[e.bucket].f32();
  }
  const int32_t* tok = tokens_all_.data<int32_t>();
  const float* src = rows_all_.f32();
  for (int64_t r = 0; r < rows; ++r) {
    if (tok[r] < 0 || tok[r] >= V) continue;  // as the embedding backward: ids outside the table add nothing
    const int64_t row = e.offset + tok[r] * C, a = std::max(row, lo), z = std::min(row + C, hi);
    for (int64_t k = a; k < z; ++k) dst[k - lo] += src[r * C + (k - row)];
  }
}

void GradSync::on_step_begin(int micro_batches) { last_mb_ = micro_batches - 1; }

void GradSync::on_grad_op(int mb, int unit, const Op& op) {
  if (mb != last_mb_) return;  // earlier micro-batches only accumulate
  if (!bwd_started_) {  // the token embedding's dense part is complete (sparse path, untied)
    bwd_started_ = true;
    if (sparse_entry_ >= 0 && grad_ops_[static_cast<size_t>(sparse_entry_)] == 0)
      param_ready(static_cast<size_t>(sparse_entry_));
  }
  for (const auto& g : op.grads) {
    ParamEntry& e = params_.resolve(units_.at(unit), g);
    size_t i = &e - params_.entries().data();
    if (--pending_ops_[i] == 0 && !tp_partial(e)) param_ready(i);
  }
}

void GradSync::on_unit_backward_done(int mb, int unit) {
  if (mb != last_mb_) return;
  drain_partials();  // the previous unit's (a GPU step's)
  std::vector<Work> works;
  std::vector<size_t> ready;
  for (size_t i = 0; i < params_.entries().size(); ++i) {
    ParamEntry& e = params_.entries()[i];
    if (ProcessGroup* g = e.unit == unit ? produced(partial_group(e)) : nullptr) {
      works.push_back(g->all_reduce(e.grad.view({e.grad.numel()})));
      ready.push_back(i);
    }
  }
  if (producer_ && !works.empty()) {
    // A GPU step: the host does not wait here (it would stall every launch behind the backward
    // strand's queue, which the reduction waits for); the unit's parameters become ready when the
    // next unit's backward is done or at finish(): points every rank reaches in the same order,
    // so the dp buckets they complete are issued in the same order everywhere.
    partials_.push_back({std::move(works), std::move(ready)});
    return;
  }
  for (auto& w : works) w.wait();
  for (size_t i : ready) param_ready(i);
}

void GradSync::drain_partials() {
  while (!partials_.empty()) {
    Partial& p = partials_.front();
    for (auto& w : p.works) w.wait();
    for (size_t i : p.ready) param_ready(i);
    partials_.pop_front();
  }
}

// E + H on both stages, before the bucket's dp reduction: each stage sends its copy's gradient and
// adds the other's (a + b == b + a in fp32: both stages get the same bits). On a GPU the exchange
// is staged after the backward strand's kernels (the producer stream), and the add runs there too,
// once the peer's gradient has arrived in device memory of that stream.
void GradSync::add_tied_peer() {
  const ParamEntry* copy = params_.tied_copy();
  Tensor mine = copy ? copy->grad : params_.get("wte").grad;
  if (mine.device().is_host()) {
    Tensor other = Tensor::empty(mine.shape(), mine.dtype(), tracker_);
    Tensor out = mine.clone();
    Work s = tied_pp_->send(out, tied_peer_, ProcessGroup::kMaxP2PTag);
    Work r = tied_pp_->recv(other, tied_peer_, ProcessGroup::kMaxP2PTag);
    r.wait();
    s.wait();
    float* g = mine.f32();
    const float* o = other.f32();
    for (int64_t i = 0; i < mine.numel(); ++i) g[i] += o[i];
    return;
  }
#if DHELIX_HAVE_CUDA
  // `mine` is read by the send's staging before the add below writes it: the add waits for both.
  Tensor other = Tensor::empty(mine.shape(), mine.dtype(), tracker_, mine.device(), producer_);
  Work s = produced(tied_pp_)->send(mine, tied_peer_, ProcessGroup::kMaxP2PTag);
  Work r = produced(tied_pp_)->recv(other, tied_peer_, ProcessGroup::kMaxP2PTag);
  r.wait();
  s.wait();
  cuda::add_inplace(mine.f32(), other.f32(), mine.numel(), static_cast<cudaStream_t>(producer_));
#else
  throw InternalError(fmt::format("a tied embedding gradient on {} in a build without CUDA", mine.device().str()));
#endif
}

double GradSync::finish() {
  double t0 = now_seconds();
  if (tied_pp_) add_tied_peer();
  drain_partials();  // a GPU step's tp partial sums still in flight
  for (size_t b = 0; b < issued_.size(); ++b) issue_bucket(b);  // anything held back (overlap off)
  double busy = 0;
  for (Inflight& f : inflight_) {
    f.work.wait();
    // (A GPU's reduced bf16 is in device memory once the op is done. It is widened on the stream
    // its buffer was made on, so the buffer's stream-ordered free follows the kernel reading it.)
    if (f.widen_to.defined()) widen_into(f.wire_out, f.widen_to, producer_);
    busy += f.work.end_time() - f.work.start_time();
    const double bytes = static_cast<double>(f.elems) * (f.wire_out.defined() ? 2 : 4);
    if (trace_)
      trace_->add("comm " + dp_->name(), f.name, f.work.start_time(), f.work.end_time(),
                  fmt::format(R"({{"mib":{:.3f},"queued_us":{:.3f}}})", bytes / 1048576.0,
                              (f.work.start_time() - f.work.issue_time()) * 1e6));
  }
  // The gradients' reader (the optimizer's stream) waits for what this sync ran on the backward's
  // stream (the widening kernels; ZeRO-1's chunk copies of buckets issued here).
  if (on_gpu() && update_ && update_ != producer_) order_after(update_, producer_);
  if (rows_taken_) add_gathered_rows();
  rows_taken_ = false, bwd_started_ = false;
  tokens_all_ = Tensor(), rows_all_ = Tensor();
  dp_comm_s_ = busy;
  inflight_.clear();
  pending_ops_ = grad_ops_;
  for (size_t b = 0; b < params_.buckets().size(); ++b)
    pending_params_[b] = static_cast<int>(params_.buckets()[b].params.size());
  std::fill(issued_.begin(), issued_.end(), 0);
  return now_seconds() - t0;
}

}  // namespace dhelix
