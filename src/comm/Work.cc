// WorkState completion and bounded waiting.
#include "comm/Work.h"

#include <chrono>

#include "base/Clock.h"
#include "base/Error.h"

namespace dhelix {

WorkState::WorkState(std::string signature, std::string group, int64_t seq, int world_rank, double timeout_s)
    : signature_(std::move(signature)),
      description_(fmt::format("{} on {} seq={}", signature_, group, seq)),
      seq_(seq),
      world_rank_(world_rank),
      timeout_s_(timeout_s),
      issue_time_(now_seconds()) {}

void WorkState::mark_started() {
  std::lock_guard lk(mu_);
  start_time_ = now_seconds();
}

double WorkState::start_time() const {
  std::lock_guard lk(mu_);
  return start_time_ > 0 ? start_time_ : issue_time_;
}

double WorkState::end_time() const {
  std::lock_guard lk(mu_);
  return end_time_;
}

void WorkState::complete() {
  {
    std::lock_guard lk(mu_);
    if (status_ != Status::kPending) return;
    status_ = Status::kDone;
    end_time_ = now_seconds();
  }
  cv_.notify_all();
}

void WorkState::fail(const std::string& error) {
  {
    std::lock_guard lk(mu_);
    if (status_ != Status::kPending) return;
    status_ = Status::kFailed;
    end_time_ = now_seconds();
    error_ = error;
  }
  cv_.notify_all();
}

bool WorkState::is_completed() const {
  std::lock_guard lk(mu_);
  return status_ != Status::kPending;
}

void WorkState::set_device_wait(std::function<void(void*)> fn) {
  {
    std::lock_guard lk(mu_);
    device_wait_ = std::move(fn);
  }
  cv_.notify_all();
}

// Blocks until `ready` holds (under mu_), bounded by the timeout; throws as wait() does when it does
// not, or when the op failed.
template <typename Ready>
void WorkState::wait_until(std::unique_lock<std::mutex>& lk, Ready ready) const {
  auto limit = std::chrono::duration<double>(timeout_s_);
  bool finished = cv_.wait_for(lk, limit, [&] { return status_ != Status::kPending || ready(); });
  if (!finished) {
    lk.unlock();
    const std::string why = diagnose_ ? diagnose_() : "";
    throw CommError(fmt::format("rank {}: {} did not complete within {:.3g} s (comm.timeout_s){}", world_rank_,
                                description_, timeout_s_, why.empty() ? "" : "; " + why));
  }
  DHX_CHECK(status_ != Status::kFailed, CommError, "rank {}: {} failed: {}", world_rank_, description_, error_);
}

void WorkState::wait() const {
  std::unique_lock lk(mu_);
  wait_until(lk, [] { return false; });
}

void WorkState::wait_on(void* stream) const {
  std::unique_lock lk(mu_);
  wait_until(lk, [&] { return static_cast<bool>(device_wait_); });
  if (!device_wait_) return;  // finished, with no end on a device: nothing left to order
  const std::function<void(void*)> fn = device_wait_;
  lk.unlock();
  fn(stream);
}

}  // namespace dhelix
