// The comm thread loop: FIFO tasks, failures recorded on the op's WorkState, and polling of
// posted ops with a pause that grows from 20 us to 1 ms while nothing else is queued.
#include "comm/CommStream.h"

#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <exception>
#include <string>

namespace dhelix {

namespace {

// The comm thread sleeps most of the time and needs the core briefly when data can move. With
// more busy threads than cores (two ranks' compute threads on a 2-core machine), an equal-weight
// comm thread waits behind compute for its time slice and the wire idles; a higher scheduling
// weight (nice comm.nice, default -10) lets it run as soon as it wakes. Best effort: without
// the privilege it keeps the default weight.
void raise_comm_thread_priority(int nice) {
  if (nice == 0) return;
  ::setpriority(PRIO_PROCESS, static_cast<id_t>(::syscall(SYS_gettid)), std::clamp(nice, -20, 19));
}

}  // namespace

CommStream::CommStream(std::string name, int nice, Poll poll) : name_(std::move(name)), poll_(std::move(poll)) {
  thread_ = std::thread([this, nice] {
    raise_comm_thread_priority(nice);
    loop();
  });
}

CommStream::~CommStream() {
  {
    std::lock_guard lk(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void CommStream::submit(std::shared_ptr<WorkState> state, Task task) {
  {
    std::lock_guard lk(mu_);
    queue_.push_back(Item{std::move(state), std::move(task)});
  }
  cv_.notify_one();
}

std::shared_ptr<WorkState> CommStream::oldest_unfinished() const {
  std::lock_guard lk(mu_);
  if (running_) return running_;
  return queue_.empty() ? nullptr : queue_.front().state;
}

void CommStream::loop() {
  auto pause = std::chrono::microseconds(20);
  for (;;) {
    bool outstanding = poll_ ? poll_() : false;
    std::unique_lock lk(mu_);
    if (queue_.empty()) {
      if (stop_) return;
      if (outstanding) {
        cv_.wait_for(lk, pause);
        pause = std::min(pause * 2, std::chrono::microseconds(1000));
      } else {
        cv_.wait(lk, [&] { return stop_ || !queue_.empty(); });
      }
      continue;
    }
    pause = std::chrono::microseconds(20);
    Item item = std::move(queue_.front());
    queue_.pop_front();
    running_ = item.state;
    item.state->mark_started();
    lk.unlock();
    bool finished = false;
    std::string error;
    try {
      finished = item.task(item.state);
    } catch (const std::exception& e) {
      error = e.what();
    } catch (...) {
      error = "unknown exception on comm thread " + name_;
    }
    // Drop the task (and the tensors it holds) before the waiter can see the op finish: once it
    // does, it may free what those tensors are charged to (a MemoryTracker, a whole trainer).
    item.task = nullptr;
    if (!error.empty())
      item.state->fail(error);
    else if (finished)
      item.state->complete();
    lk.lock();
    running_.reset();
  }
}

}  // namespace dhelix
