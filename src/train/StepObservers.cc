// The trainer's step observers (see StepObservers.h).
#include "train/StepObservers.h"

#include <signal.h>
#include <stdio.h>

#include <algorithm>
#include <cstdlib>
#include <limits>
#include <string>

#include "base/Error.h"

namespace dhelix {

void SparseEmbeddingRows::on_op_done(int mb, int unit, const Op& op, const UnitBuffers& bufs) {
  if (mb == last_mb_ && unit == 1 && std::find(op.outputs.begin(), op.outputs.end(), "dx") != op.outputs.end())
    sync_.take_embedding_rows(last_tokens_, bufs.at("dx"));
}

bool SparseEmbeddingRows::divert_grad_op(int mb, int unit, const Op& op) {
  if (mb != last_mb_ || op.code != "embed_bwd") return false;
  DHX_CHECK(sync_.embedding_rows_taken(), InternalError,
            "the last micro-batch's embedding rows were not handed to GradSync before its embedding backward");
  return true;
}

std::unique_ptr<FaultInjector> FaultInjector::from_env(int world_rank, int n_units, ParamStore& params,
                                                       CommContext* comm, const int64_t& step) {
  const char* v = std::getenv("DHELIX_FAULT_INJECT");
  if (v == nullptr || *v == '\0') return nullptr;
  int rank = -1;
  long fault_step = 0;
  char mode[16] = {0}, point[16] = {0};
  int n = std::sscanf(v, "%d:%ld:%15s", &rank, &fault_step, mode);
  std::string m = mode, named;
  if (n < 2 && std::sscanf(v, "%d:%15[a-z0-9]:%15s", &rank, point, mode) == 3) {
    named = point;
    m = mode;
    fault_step = 1;
    n = 3;
  }
  const bool mode_ok = n == 2 || m == "kill" || m == "throw" || m == "nan-grad" || m == "nan-weight" || m == "sigterm";
  const bool point_ok = named.empty() || (m == "sigterm" && (named == "setup" || named == "eval0" || named == "eval" ||
                                                             named == "save" || named == "sample"));
  DHX_CHECK(n >= 2 && rank >= 0 && fault_step >= 1 && mode_ok && point_ok, ConfigError,
            "DHELIX_FAULT_INJECT='{}' is not RANK:STEP[:kill|throw|nan-grad|nan-weight|sigterm] or "
            "RANK:setup|eval0|eval|save|sample:sigterm (rank >= 0, step >= 1)",
            v);
  if (rank != world_rank) return nullptr;
  const FaultMode f = m == "throw"        ? FaultMode::kThrow
                      : m == "nan-grad"   ? FaultMode::kNanGrad
                      : m == "nan-weight" ? FaultMode::kNanWeight
                      : m == "sigterm"    ? FaultMode::kSigterm
                                          : FaultMode::kKill;
  auto fi = std::unique_ptr<FaultInjector>(new FaultInjector(f, rank, fault_step, n_units / 2, params, comm, step));
  fi->point_ = named;
  return fi;
}

FaultInjector::FaultInjector(FaultMode mode, int rank, int64_t fault_step, int unit, ParamStore& params,
                             CommContext* comm, const int64_t& step)
    : mode_(mode), rank_(rank), fault_step_(fault_step), unit_(unit), params_(params), comm_(comm), step_(step) {
  before_.self = this;
  before_.phase = 0;
  after_.self = this;
  after_.phase = 1;
}

void FaultInjector::Phase::on_unit_backward_done(int mb, int unit) {
  if (!self->here(mb, unit)) return;
  if (phase == 0 && self->mode_ == FaultMode::kNanGrad) {
    for (ParamEntry& e : self->params_.entries())
      if (e.unit == unit) {
        e.grad.f32()[0] = std::numeric_limits<float>::quiet_NaN();
        break;
      }
  }
  if (phase == 1 && (self->mode_ == FaultMode::kKill || self->mode_ == FaultMode::kThrow)) self->fail();
}

void FaultInjector::fail() const {
  std::string where = fmt::format("DHELIX_FAULT_INJECT: failing in step {} (backward of unit {})", fault_step_, unit_);
  if (mode_ == FaultMode::kThrow) throw CommError(where);
  std::fputs(fmt::format("rank {}: {} by SIGKILL; last collective: {}\n", rank_, where,
                         comm_ ? comm_->last_collective() : "none")
                 .c_str(),
             stderr);
  std::fflush(stderr);
  raise(SIGKILL);
  std::abort();  // not reached: SIGKILL cannot be caught
}

}  // namespace dhelix
