// GradSync: per-op gradient readiness, tp partial-gradient all-reduce, bucketed dp all-reduce /
// reduce-scatter in the order buckets complete (identical on every rank: all run one program).
#include "parallel/GradSync.h"

#include <fmt/format.h>

#include <algorithm>

#include "base/Clock.h"
#include "base/Error.h"
#include "base/Trace.h"

namespace dhelix {

GradSync::GradSync(ParamStore& params, const std::vector<UnitSpec>& units, const ModelPrograms& progs,
                   ProcessGroup* tp, ProcessGroup* dp, ZeroStage zero, MemoryTracker* tracker)
    : params_(params), units_(units), tp_(tp), dp_(dp), zero_(zero) {
  const int n = dp ? dp->size() : 1;
  const auto& buckets = params_.buckets();
  if (zero_ == ZeroStage::kOne)
    for (auto& b : buckets) owned_grads_.push_back(Tensor::zeros({(b.end - b.begin) / n}, DType::kF32, tracker));
  grad_ops_.assign(params_.entries().size(), 0);
  for (size_t u = 0; u < units_.size(); ++u) {
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
  if (zero_ == ZeroStage::kOne) {
    if (dp_ && dp_->size() > 1)
      inflight_.push_back(dp_->reduce_scatter(range, owned_grads_[b])), inflight_bucket_.push_back(b);
    else
      owned_grads_[b].copy_from(range);
  } else if (dp_ && dp_->size() > 1) {
    inflight_.push_back(dp_->all_reduce(range)), inflight_bucket_.push_back(b);
  }
}

void GradSync::param_ready(size_t entry) {
  size_t b = params_.entries()[entry].bucket;
  if (--pending_params_[b] == 0 && overlap_ == GradOverlap::kOn) issue_bucket(b);
}

void GradSync::on_grad_op(int unit, const Op& op) {
  for (const auto& g : op.grads) {
    ParamEntry& e = params_.resolve(units_.at(unit), g);
    size_t i = &e - params_.entries().data();
    if (--pending_ops_[i] == 0 && !tp_partial(e)) param_ready(i);
  }
}

void GradSync::on_unit_done(int unit) {
  if (!tp_ || tp_->size() <= 1) return;
  std::vector<Work> works;
  std::vector<size_t> ready;
  for (size_t i = 0; i < params_.entries().size(); ++i) {
    ParamEntry& e = params_.entries()[i];
    if (e.unit == unit && tp_partial(e)) {
      works.push_back(tp_->all_reduce(e.grad.view({e.grad.numel()})));
      ready.push_back(i);
    }
  }
  for (auto& w : works) w.wait();
  for (size_t i : ready) param_ready(i);
}

double GradSync::finish() {
  double t0 = now_seconds();
  for (size_t b = 0; b < issued_.size(); ++b) issue_bucket(b);  // anything held back (overlap off)
  double busy = 0;
  for (size_t i = 0; i < inflight_.size(); ++i) {
    Work& w = inflight_[i];
    w.wait();
    busy += w.end_time() - w.start_time();
    if (trace_) {
      const GradBucket& bk = params_.buckets()[inflight_bucket_[i]];
      trace_->add("comm " + dp_->name(), fmt::format("dp.{}.bucket{}", zero_ == ZeroStage::kOne ? "rs" : "ar", inflight_bucket_[i]),
                  w.start_time(), w.end_time(), fmt::format(R"({{"mib":{:.3f}}})", (bk.end - bk.begin) * 4 / 1048576.0));
    }
  }
  dp_comm_s_ = busy;
  inflight_.clear(), inflight_bucket_.clear();
  pending_ops_ = grad_ops_;
  for (size_t b = 0; b < params_.buckets().size(); ++b)
    pending_params_[b] = static_cast<int>(params_.buckets()[b].params.size());
  std::fill(issued_.begin(), issued_.end(), 0);
  return now_seconds() - t0;
}

}  // namespace dhelix
