// Work: the move-only handle every ProcessGroup op returns, and WorkState, the completion record
// a comm thread (or, for a local recv, the sending rank) fills in. wait() is bounded by the
// group's timeout and throws CommError naming the rank and the op. Not here: queuing (CommStream).
#pragma once
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>

namespace dhelix {

class WorkState {
 public:
  // signature: the op and its tensor ("all_reduce f32[4096]"), identical on every rank that
  // issues the matching op; describe(): signature + " on tp[1/2] seq=17".
  WorkState(std::string signature, std::string group, int64_t seq, int world_rank, double timeout_s);

  void complete();
  void fail(const std::string& error);
  bool is_completed() const;  // finished, successfully or not
  // Blocks until finished; throws CommError on failure or after timeout_s.
  void wait() const;
  // A GPU group's op whose end is an event on the group's stream (NCCL): the group publishes, once
  // the op is enqueued, a function that makes a given stream (a cudaStream_t) wait for that end.
  void set_device_wait(std::function<void(void*)> fn);
  // Orders work issued on `stream` after this op: on the GPU (cudaStreamWaitEvent) as soon as the
  // group published the op's end, without waiting for the op itself; else, an op that finishes on
  // the host (CPU and staged groups), by blocking until it finished. Throws as wait() does when the
  // op failed or neither happened within timeout_s. A failure that comes after a device wait was
  // enqueued is seen by a later wait() (the executor waits for every such op at a step's end).
  void wait_on(void* stream) const;

  const std::string& signature() const { return signature_; }
  const std::string& describe() const { return description_; }
  int64_t seq() const { return seq_; }
  int world_rank() const { return world_rank_; }
  double issue_time() const { return issue_time_; }
  // When the comm thread started running the op, and when it finished (0 until then): the
  // trace draws the op from start to end.
  void mark_started();
  // Called when wait() times out, to say why (which ranks never arrived); set before the op runs.
  void set_diagnose(std::function<std::string()> fn) { diagnose_ = std::move(fn); }
  double start_time() const;
  double end_time() const;

 private:
  enum class Status { kPending, kDone, kFailed };
  std::string signature_, description_;
  int64_t seq_;
  int world_rank_;
  double timeout_s_;
  double issue_time_;
  double start_time_ = 0, end_time_ = 0;
  mutable std::mutex mu_;
  mutable std::condition_variable cv_;
  Status status_ = Status::kPending;
  std::string error_;
  std::function<std::string()> diagnose_;
  std::function<void(void*)> device_wait_;  // set_device_wait

  template <typename Ready>
  void wait_until(std::unique_lock<std::mutex>& lk, Ready ready) const;
};

class [[nodiscard]] Work {
 public:
  Work() = default;  // an empty handle: already complete, describe() == "(no op)"
  explicit Work(std::shared_ptr<WorkState> state) : state_(std::move(state)) {}
  Work(Work&&) noexcept = default;
  Work& operator=(Work&&) noexcept = default;
  Work(const Work&) = delete;
  Work& operator=(const Work&) = delete;

  bool is_completed() const { return !state_ || state_->is_completed(); }
  // Blocks the caller until the op finished; throws CommError on failure or timeout.
  void wait() const {
    if (state_) state_->wait();
  }
  // Work issued on `stream` (a cudaStream_t) afterwards runs after the op (WorkState::wait_on): on
  // the GPU for an NCCL op, without blocking the caller; blocking for the others.
  void wait_on(void* stream) const {
    if (state_) state_->wait_on(stream);
  }
  std::string describe() const { return state_ ? state_->describe() : "(no op)"; }
  int64_t seq() const { return state_ ? state_->seq() : -1; }
  double issue_time() const { return state_ ? state_->issue_time() : 0; }
  double start_time() const { return state_ ? state_->start_time() : 0; }
  double end_time() const { return state_ ? state_->end_time() : 0; }

 private:
  std::shared_ptr<WorkState> state_;
};

}  // namespace dhelix
