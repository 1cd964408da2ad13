// CommStream: one thread that runs a process group's ops in issue order — the CPU analogue of a
// CUDA stream. A task returns true when its op is complete, false when it only posted the op
// (a non-blocking send/recv) that poll() or a peer completes later. Not here: what ops do.
#pragma once
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "comm/Work.h"

namespace dhelix {

// The comm threads' default nice value (comm.nice; CommStream.cc says why).
constexpr int kDefaultCommNice = -10;

class CommStream {
 public:
  using Task = std::function<bool(const std::shared_ptr<WorkState>&)>;
  // Runs on the stream thread between tasks and while idle; returns true while posted ops are
  // still outstanding (the thread then polls again after a short, growing pause).
  using Poll = std::function<bool()>;

  // nice: the thread's nice value (CommOptions::nice; 0 = unchanged).
  CommStream(std::string name, int nice, Poll poll = {});
  ~CommStream();  // runs what is queued, then joins; posted-but-unfinished ops are left behind
  CommStream(const CommStream&) = delete;
  CommStream& operator=(const CommStream&) = delete;

  void submit(std::shared_ptr<WorkState> state, Task task);
  // The op running now, else the oldest queued one; nullptr when the queue is empty.
  std::shared_ptr<WorkState> oldest_unfinished() const;

 private:
  void loop();

  struct Item {
    std::shared_ptr<WorkState> state;
    Task task;
  };
  std::string name_;
  Poll poll_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Item> queue_;
  std::shared_ptr<WorkState> running_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace dhelix
