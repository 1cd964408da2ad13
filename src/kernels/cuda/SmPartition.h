// SM partitions of one GPU (CUDA green contexts, driver 12.4+): a partition is a share of the
// device's streaming multiprocessors that the kernels launched under it may use, and no others.
// Issue 39 uses them where several ranks share the one lent GPU: each rank (a thread) enters its own
// partition, so a rank's kernels cannot take SMs from another rank while it waits for a collective
// -- each rank is then a smaller GPU of its own, as the simulator's "half the device per rank"
// assumes, instead of a share that grows whenever the other rank stalls. (DHeLlam caps the SMs of
// communication kernels with libsmctrl, which does not work on Hopper; green contexts are Hopper's
// means.)
//
//   GPU, 132 SMs:  [ partition 0: 64 SMs ][ partition 1: 64 SMs ][ 4 left over, unused ]
//   rank 0 thread: enter(p0) -> its streams, events, cuBLASLt handle, launches, copies: on p0's SMs
//   rank 1 thread: enter(p1) -> ... on p1's SMs
//
// Memory is the device's: a pointer allocated under any partition (or none) is valid under every
// other, and a stream may wait for an event of any partition. What a thread creates while inside a
// partition (streams, events, handles) belongs to that partition: only that thread drives it (a
// green context is current to one thread at a time), an event is recorded only on its own
// partition's streams, and it is destroyed before the partition (whose destructor waits for its
// work first). So a helper thread of a rank (a staged group's comm thread) keeps its own streams
// in the device's primary context; NCCL groups are not made inside partitions (one GPU per rank). The driver's functions are looked up at run time (cudaGetDriverEntryPointByVersion),
// so the project links no driver library and a driver without green contexts is a DeviceError that
// names what is missing.
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace dhelix::cuda {

class SmPartition {
 public:
  // `parts` partitions of GPU `device` of equal SM count: the device's SMs / parts, rounded down to
  // the granularity green contexts allow (the driver's smCoscheduledAlignment: 8 SMs on Hopper).
  // DeviceError naming the counts when a part would be smaller than the driver's minimum, when the
  // GPU does not exist, or when the driver lacks green contexts.
  static std::vector<std::unique_ptr<SmPartition>> split(int device, int parts);
  ~SmPartition();
  SmPartition(const SmPartition&) = delete;
  SmPartition& operator=(const SmPartition&) = delete;

  int device() const { return device_; }
  int sms() const { return sms_; }
  // Pushes this partition onto the calling thread's context stack: the thread's CUDA calls until
  // leave() run in it (use_device() keeps it; a bare cudaSetDevice would replace it).
  void enter() const;
  // Pops it; InternalError when it is not the calling thread's current context.
  void leave() const;
  // leave() without throwing: "" when it was left, else why not.
  std::string try_leave() const noexcept;

 private:
  SmPartition(int device, int sms, void* green, void* ctx) : device_(device), sms_(sms), green_(green), ctx_(ctx) {}
  int device_ = 0, sms_ = 0;
  void* green_ = nullptr;  // CUgreenCtx
  void* ctx_ = nullptr;    // its CUcontext (cuCtxFromGreenCtx)
};

// enter() for a scope (null: none). Its end leaves the partition without throwing (a destructor):
// a failure to leave is printed to stderr; call leave() yourself to have it thrown.
class SmPartitionScope {
 public:
  explicit SmPartitionScope(const SmPartition* p) : p_(p) {
    if (p_) p_->enter();
  }
  ~SmPartitionScope();
  SmPartitionScope(const SmPartitionScope&) = delete;
  SmPartitionScope& operator=(const SmPartitionScope&) = delete;

 private:
  const SmPartition* p_;
};

// The SMs the calling thread's kernels may use on GPU `device`: those of the SM partition it is in,
// else the device's. Never throws for want of green contexts (a driver without them has no
// partitions: the device's count).
int current_sm_count(int device);

// Launches `blocks` blocks of `threads` threads on `stream`, each block spinning for about `spin_us`
// microseconds (so that the blocks are resident together and spread over every SM they may use)
// and writing the SM it ran on (%smid) to out[block] (device memory, `blocks` int32s). A diagnostic:
// which SMs a partition's kernels reach.
void sm_ids_of_blocks(int32_t* out, int blocks, int threads, int spin_us, cudaStream_t stream);

}  // namespace dhelix::cuda
