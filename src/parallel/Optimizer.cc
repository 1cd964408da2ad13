// Optimizer: clip + AdamW on owned elements; ZeRO-1 all-gather of updated parameters.
#include "parallel/Optimizer.h"

#include <cmath>
#include <map>

#include "base/Error.h"
#include "kernels/cpu/Kernels.h"
#if DHELIX_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "kernels/cuda/Ops.h"
#endif

namespace dhelix {

Optimizer::Optimizer(ParamStore& params, GradSync& sync, ProcessGroup* tp, ProcessGroup* dp, const AdamWConfig& cfg,
                     MemoryTracker* tracker)
    : params_(params), sync_(sync), tp_(tp), dp_(dp), cfg_(cfg), tracker_(tracker) {
  allocate_state();
}

// m and v for the elements this rank updates: all, or with ZeRO-1 its chunk of every bucket over
// the bucket's shard group (GradSync::shard_group, which set_expert_group changes for experts).
void Optimizer::allocate_state() {
  int64_t n = 0;
  if (sync_.zero() == ZeroStage::kOne)
    for (auto& b : params_.buckets()) n += (b.end - b.begin) / sync_.shard_size(b);
  else
    n = params_.flat_values().numel();
  if (on_gpu()) {
    // On the GPU as on the host: all this rank holds, or with ZeRO-1 its chunks.
    m_ = Tensor::empty({n}, DType::kF32, tracker_, params_.device(), stream_);
    v_ = Tensor::empty({n}, DType::kF32, tracker_, params_.device(), stream_);
    m_.zero_();
    v_.zero_();
    return;
  }
  m_ = Tensor::zeros({n}, DType::kF32, tracker_);
  v_ = Tensor::zeros({n}, DType::kF32, tracker_);
}

void Optimizer::set_expert_group(ProcessGroup* ep, ProcessGroup* edp) {
  DHX_CHECK(steps_ == 0, InternalError, "Optimizer::set_expert_group after {} updates", steps_);
  ep_ = ep, edp_ = edp;
  allocate_state();  // the experts' chunks follow GradSync's groups (call GradSync's first)
}

// Visits every (param, element range) this rank updates: all of them without ZeRO; the
// intersection of each param with this rank's chunk of its bucket with ZeRO-1 (chunk r of n over
// the bucket's shard group: dp, or edp for experts). `owned` is the offset of the range's first
// element in m_/v_ (and in the ZeRO owned-grad chunks).
template <typename Fn>
void Optimizer::for_each_owned(Fn fn) {
  const bool zero = sync_.zero() == ZeroStage::kOne;
  int64_t owned_base = 0;
  const auto& buckets = params_.buckets();
  for (size_t bi = 0; bi < buckets.size(); ++bi) {
    const GradBucket& b = buckets[bi];
    const int n = sync_.shard_size(b), r = sync_.shard_rank(b);
    int64_t chunk = (b.end - b.begin) / n;
    int64_t lo = zero ? b.begin + r * chunk : b.begin, hi = zero ? lo + chunk : b.end;
    for (size_t pi : b.params) {
      ParamEntry& e = params_.entries()[pi];
      int64_t s = std::max(lo, e.offset), t = std::min(hi, e.offset + e.value.numel());
      if (s < t) fn(e, bi, s, t, zero ? owned_base + (s - lo) : s);
    }
    owned_base += zero ? chunk : 0;
  }
}

float* Optimizer::grad_ptr(size_t bi, int64_t s) {
  // The gradient of flat element s: the flat buffer, or with ZeRO-1 the owned reduced chunk.
  if (sync_.zero() != ZeroStage::kOne) return params_.flat_grads().f32() + s;
  const GradBucket& b = params_.buckets()[bi];
  int64_t lo = b.begin + sync_.shard_rank(b) * ((b.end - b.begin) / sync_.shard_size(b));
  return sync_.owned_grad(bi).f32() + (s - lo);
}

double Optimizer::step(double lr, int64_t step) {
  const double norm = grad_norm();
  update(lr, step, norm);
  return norm;
}

double Optimizer::grad_norm() {
  if (on_gpu()) return grad_norm_gpu();
  // Global norm^2: an element held identically by `replicas` ranks of the tensor-parallel block
  // (tp-replicated norms; 3D shards replicated over the axes that do not split them) counts
  // 1/replicas on each.
  // Each entry's part goes to its slot of the whole model's entry list (ParamStore global order);
  // the slots are summed over the groups that split the parameters (a slot is filled on one rank of
  // pp, so that sum is exact) and then added in slot order, so a pipeline adds the same parts in the
  // same order as one process does. A tied embedding's second copy is not counted.
  norm_parts_ = Tensor::zeros({params_.num_global_entries()}, DType::kF64);
  double* pt = norm_parts_.data<double>();
  const ParamEntry* copy = params_.tied_copy();
  for_each_owned([&](ParamEntry& e, size_t bi, int64_t s, int64_t t, int64_t) {
    if (&e == copy) return;
    double part = cpu::sum_squares<float>(grad_ptr(bi, s), t - s);
    pt[e.global_index] += e.spec.replicas > 1 ? part / e.spec.replicas : part;
  });
  return sum_norm_parts();
}

// norm_parts_ (host, one slot per global entry, each rank's own parts) summed over the groups that
// split the parameters, then added in slot order: the global norm.
double Optimizer::sum_norm_parts() {
  const bool zero = sync_.zero() == ZeroStage::kOne;
  double* pt = norm_parts_.data<double>();
  // The experts' slots: with ZeRO-1 each edp rank holds a chunk of its experts' gradients (summed
  // over edp), and the ep ranks hold different experts (summed over ep). The other slots: with
  // ZeRO-1 chunks over dp (summed over dp).
  std::vector<int64_t> slots;
  if (ep_ && ep_->size() > 1)
    for (const ParamEntry& e : params_.entries())
      if (e.spec.role == ShardRole::kExpert) slots.push_back(e.global_index);
  Tensor ex = Tensor::zeros({norm_parts_.numel()}, DType::kF64);
  for (int64_t i : slots) ex.data<double>()[i] = pt[i], pt[i] = 0;
  if (!slots.empty()) {
    if (zero && edp_ && edp_->size() > 1) edp_->all_reduce(ex).wait();
    ep_->all_reduce(ex).wait();
  }
  if (zero && dp_ && dp_->size() > 1) dp_->all_reduce(norm_parts_).wait();
  for (int64_t i : slots) pt[i] = ex.data<double>()[i];
  if (tp_ && tp_->size() > 1) tp_->all_reduce(norm_parts_).wait();
  if (pp_ && pp_->size() > 1) pp_->all_reduce(norm_parts_).wait();
  double ss = 0;
  for (int64_t i = 0; i < norm_parts_.numel(); ++i) ss += pt[i];
  return std::sqrt(ss);
}

int64_t Optimizer::nonfinite_entry() const {
  if (!norm_parts_.defined()) return -1;
  const double* pt = norm_parts_.data<double>();
  for (int64_t i = 0; i < norm_parts_.numel(); ++i)
    if (!std::isfinite(pt[i])) return i;
  return -1;
}

void Optimizer::update(double lr, int64_t step, double norm) {
  const bool zero = sync_.zero() == ZeroStage::kOne;
  const double clip = (cfg_.grad_clip > 0 && norm > cfg_.grad_clip) ? cfg_.grad_clip / (norm + 1e-6) : 1.0;
  if (on_gpu()) {
    update_gpu(lr, step, clip);
    if (zero) gather_updated();  // each rank updated its chunks only
    // The update is on the step's compute stream; what follows on the default stream (the next
    // step's zeroing of the gradients the update read, a checkpoint's read-back of the weights)
    // waits for it (explicit: DeviceMemory.h's default_stream_after).
    default_stream_after(params_.device(), stream_);
    steps_ = step;
    return;
  }
  float* flat_p = params_.flat_values().f32();

  cpu::AdamWParams a{lr, cfg_.beta1, cfg_.beta2, cfg_.eps, 0.0, step};
  for_each_owned([&](ParamEntry& e, size_t bi, int64_t s, int64_t t, int64_t o) {
    float* g = grad_ptr(bi, s);
    if (clip != 1.0) cpu::scale_inplace<float>(g, static_cast<float>(clip), t - s);
    cpu::AdamWParams ap = a;
    ap.weight_decay = e.spec.weight_decay ? cfg_.weight_decay : 0.0;
    cpu::adamw_step<float>(flat_p + s, g, m_.f32() + o, v_.f32() + o, t - s, ap);
  });
  if (zero) gather_updated();
  steps_ = step;
}

// ZeRO-1: every rank's updated chunk of each bucket all-gathered over the bucket's shard group. On a
// GPU the chunks are copied and gathered after the update's kernels (the group's producer stream is
// the optimizer's), and the gathered ranges' bf16 copies rewritten there, as the update does for
// the rank's own chunk.
void Optimizer::gather_updated() {
  std::vector<Work> works;
  std::vector<Tensor> sends;
  Tensor& flat = params_.flat_values();
  for (auto& b : params_.buckets()) {
    ProcessGroup* g = sync_.shard_group(b);
    if (!g || g->size() == 1) continue;
    const int n = g->size(), r = g->rank();
    const int64_t chunk = (b.end - b.begin) / n;
    const Tensor mine = flat.narrow0(b.begin + r * chunk, chunk);
    if (on_gpu()) {
      sends.push_back(Tensor::empty({chunk}, DType::kF32, nullptr, params_.device(), stream_));
      device_copy(sends.back().raw(), params_.device(), mine.raw(), params_.device(), mine.nbytes(), stream_);
      g->set_producer_stream(stream_);
    } else {
      sends.push_back(mine.clone());
    }
    works.push_back(g->all_gather(sends.back(), flat.narrow0(b.begin, b.end - b.begin)));
    // The producer point was taken at the issue: the group is left as found (no producer stream),
    // not ordering some later op after the optimizer's stream.
    if (on_gpu()) g->set_producer_stream(nullptr);
  }
  for (auto& w : works) w.wait();
  if (on_gpu()) refresh_gathered_bf16();
}

// The GPU path: the same parts and the same update formula (kernels/cuda's twins of sum_squares
// and adamw_step, each tested against the CPU's), on the store's GPU.
#if DHELIX_HAVE_CUDA
double Optimizer::grad_norm_gpu() {
  const Device d = params_.device();
  const auto st = static_cast<cudaStream_t>(stream_);
  Tensor parts = Tensor::empty({params_.num_global_entries()}, DType::kF64, nullptr, d, stream_);
  parts.zero_();
  double* slot = parts.data<double>();
  const ParamEntry* copy = params_.tied_copy();
  std::vector<const ParamEntry*> replicated;
  std::vector<cuda::SumSquaresItem> items;  // every owned range, summed in two launches
  for_each_owned([&](ParamEntry& e, size_t bi, int64_t s, int64_t t, int64_t) {
    if (&e == copy) return;
    items.push_back({grad_ptr(bi, s), t - s, e.global_index});
    if (e.spec.replicas > 1) replicated.push_back(&e);
  });
  cuda::sum_squares_many(items, slot, st);
  norm_parts_ = parts.to(Device::host(), nullptr, stream_);  // waits for the sums
  double* pt = norm_parts_.data<double>();
  // As on the host: an element held by `replicas` ranks of the tensor-parallel block (the norms
  // under tp) counts 1/replicas on each; the slots are summed over ep (the experts'), tp and pp, then
  // added in slot order.
  for (const ParamEntry* e : replicated) pt[e->global_index] /= e->spec.replicas;
  return sum_norm_parts();
}

void Optimizer::update_gpu(double lr, int64_t step, double clip) {
  const auto st = static_cast<cudaStream_t>(stream_);
  float* p = params_.flat_values().f32();
  auto* p16 = static_cast<cuda::bf16*>(params_.flat_bf16().raw());
  // Runs of entries adjacent in the flat values, in the state (m, v) and in the gradient (one
  // bucket's chunk with ZeRO-1), with the same weight decay; adamw_step_many updates them, the large
  // ones a launch each and the small ones together (the kernels are elementwise with one per-element
  // formula: how the range is cut changes no bit).
  int64_t lo = -1, hi = -1, state = 0;
  size_t bucket = 0;
  bool decay = false;
  const bool zero = sync_.zero() == ZeroStage::kOne;
  std::vector<cuda::AdamWRun> runs;  // updated by adamw_step_many: the small runs share launches
  auto flush = [&] {
    if (lo < 0 || hi <= lo) return;
    runs.push_back({p + lo, grad_ptr(bucket, lo), m_.f32() + state, v_.f32() + state, p16 + lo, hi - lo, decay});
  };
  for_each_owned([&](ParamEntry& e, size_t bi, int64_t s, int64_t t, int64_t o) {
    if (s == hi && o == state + (hi - lo) && e.spec.weight_decay == decay && (!zero || bi == bucket)) {
      hi = t;
      return;
    }
    flush();
    lo = s, hi = t, state = o, bucket = bi, decay = e.spec.weight_decay;
  });
  flush();
  const cuda::AdamWParams a{lr, cfg_.beta1, cfg_.beta2, cfg_.eps, cfg_.weight_decay, step};
  cuda::adamw_step_many(runs, a, static_cast<float>(clip), st);
}

// The bf16 copies of the values other ranks updated (each bucket's range outside this rank's
// chunk), cast on the optimizer's stream as adamw_step casts its own: round to nearest even.
void Optimizer::refresh_gathered_bf16() {
  const auto st = static_cast<cudaStream_t>(stream_);
  const float* p = params_.flat_values().f32();
  auto* p16 = static_cast<cuda::bf16*>(params_.flat_bf16().raw());
  for (auto& b : params_.buckets()) {
    ProcessGroup* g = sync_.shard_group(b);
    if (!g || g->size() == 1) continue;
    const int64_t chunk = (b.end - b.begin) / g->size(), mine = b.begin + g->rank() * chunk;
    if (mine > b.begin) cuda::cast_f32_to_bf16(p + b.begin, p16 + b.begin, mine - b.begin, st);
    if (b.end > mine + chunk) cuda::cast_f32_to_bf16(p + mine + chunk, p16 + mine + chunk, b.end - mine - chunk, st);
  }
}
#else
double Optimizer::grad_norm_gpu() { throw DeviceError("the GPU optimizer needs a CUDA build (DHELIX_ENABLE_CUDA)"); }
void Optimizer::update_gpu(double, int64_t, double) {
  throw DeviceError("the GPU optimizer needs a CUDA build (DHELIX_ENABLE_CUDA)");
}
void Optimizer::refresh_gathered_bf16() {
  throw DeviceError("the GPU optimizer needs a CUDA build (DHELIX_ENABLE_CUDA)");
}
#endif

std::vector<std::pair<std::string, Tensor>> Optimizer::shard_state() {
  const bool zero = sync_.zero() == ZeroStage::kOne;
  // A GPU's state is read back first: checkpoints hold host tensors.
  const Tensor m_here = on_gpu() ? m_.to(Device::host(), nullptr, stream_) : m_;
  const Tensor v_here = on_gpu() ? v_.to(Device::host(), nullptr, stream_) : v_;
  Tensor m_full = m_here, v_full = v_here;
  if (zero) {
    // Reassemble flat full-size m/v: all-gather each bucket's chunks over dp.
    m_full = Tensor::zeros({params_.flat_values().numel()});
    v_full = Tensor::zeros({params_.flat_values().numel()});
    int64_t base = 0;
    for (auto& b : params_.buckets()) {
      ProcessGroup* g = sync_.shard_group(b);
      const int n = sync_.shard_size(b);
      int64_t chunk = (b.end - b.begin) / n;
      for (auto [src, dst] : {std::pair{&m_here, &m_full}, std::pair{&v_here, &v_full}}) {
        Tensor mine = src->narrow0(base, chunk);
        Tensor out = dst->narrow0(b.begin, b.end - b.begin);
        if (g && n > 1)
          g->all_gather(mine, out).wait();
        else
          out.copy_from(mine);
      }
      base += chunk;
    }
  }
  std::vector<std::pair<std::string, Tensor>> out;
  for (auto& e : params_.entries()) {
    int64_t k = e.value.numel();
    out.push_back({e.spec.name + ".exp_avg", m_full.narrow0(e.offset, k).view(e.spec.shard).clone()});
    out.push_back({e.spec.name + ".exp_avg_sq", v_full.narrow0(e.offset, k).view(e.spec.shard).clone()});
  }
  return out;
}

void Optimizer::load_shard_state(const std::vector<std::pair<std::string, Tensor>>& state, int64_t steps) {
  Tensor m_full = Tensor::zeros({params_.flat_values().numel()});
  Tensor v_full = Tensor::zeros({params_.flat_values().numel()});
  std::map<std::string, const Tensor*> byname;
  for (auto& [k, t] : state) byname[k] = &t;
  for (auto& e : params_.entries()) {
    for (auto [suffix, dst] : {std::pair{".exp_avg", &m_full}, std::pair{".exp_avg_sq", &v_full}}) {
      auto it = byname.find(e.spec.name + suffix);
      DHX_CHECK(it != byname.end(), IoError, "optimizer state lacks '{}{}'", e.spec.name, suffix);
      DHX_CHECK(it->second->numel() == e.value.numel(), IoError, "optimizer state '{}{}' has {} elements, expected {}",
                e.spec.name, suffix, it->second->numel(), e.value.numel());
      dst->narrow0(e.offset, e.value.numel()).copy_from(it->second->view({e.value.numel()}));
    }
  }
  if (sync_.zero() == ZeroStage::kOne) {
    int64_t base = 0;
    for (auto& b : params_.buckets()) {
      const int n = sync_.shard_size(b), r = sync_.shard_rank(b);
      int64_t chunk = (b.end - b.begin) / n;
      m_.narrow0(base, chunk).copy_from(m_full.narrow0(b.begin + r * chunk, chunk));
      v_.narrow0(base, chunk).copy_from(v_full.narrow0(b.begin + r * chunk, chunk));
      base += chunk;
    }
  } else {
    m_.copy_from(m_full);
    v_.copy_from(v_full);
  }
  steps_ = steps;
}

}  // namespace dhelix
