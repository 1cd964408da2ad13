// GradSync: tp partial-gradient all-reduce and bucketed dp all-reduce / reduce-scatter.
#include "parallel/GradSync.h"

#include "base/Clock.h"
#include "base/Error.h"

namespace dhelix {

GradSync::GradSync(ParamStore& params, ProcessGroup* tp, ProcessGroup* dp, ZeroStage zero, MemoryTracker* tracker)
    : params_(params), tp_(tp), dp_(dp), zero_(zero) {
  const int n = dp ? dp->size() : 1;
  if (zero_ == ZeroStage::kOne)
    for (auto& b : params_.buckets()) owned_grads_.push_back(Tensor::zeros({(b.end - b.begin) / n}, DType::kF32, tracker));
}

void GradSync::on_unit_done(int unit) {
  if (tp_ && tp_->size() > 1) {
    std::vector<Work> works;
    for (auto& e : params_.entries())
      if (e.unit == unit && e.spec.tp_partial_grad) works.push_back(tp_->all_reduce(e.grad.view({e.grad.numel()})));
    for (auto& w : works) w.wait();
  }
  const auto& buckets = params_.buckets();
  while (next_bucket_ < buckets.size() && buckets[next_bucket_].min_unit >= unit) {
    const GradBucket& b = buckets[next_bucket_];
    Tensor range = params_.flat_grads().narrow0(b.begin, b.end - b.begin);
    if (zero_ == ZeroStage::kOne) {
      if (dp_ && dp_->size() > 1)
        inflight_.push_back(dp_->reduce_scatter(range, owned_grads_[next_bucket_]));
      else
        owned_grads_[next_bucket_].copy_from(range);
    } else if (dp_ && dp_->size() > 1) {
      inflight_.push_back(dp_->all_reduce(range));
    }
    ++next_bucket_;
  }
}

double GradSync::finish() {
  double t0 = now_seconds();
  on_unit_done(-1);  // flush anything left (no-op when every unit reported)
  double first_start = 0, last_end = 0, busy = 0;
  for (auto& w : inflight_) {
    w.wait();
    busy += w.end_time() - w.start_time();
    if (first_start == 0 || w.start_time() < first_start) first_start = w.start_time();
    last_end = std::max(last_end, w.end_time());
  }
  dp_comm_s_ = busy;
  inflight_.clear();
  next_bucket_ = 0;
  return now_seconds() - t0;
}

}  // namespace dhelix
