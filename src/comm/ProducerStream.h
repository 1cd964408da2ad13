// ProducerStream: the CUDA stream whose kernels write the tensors a GPU process group's later ops
// read (ProcessGroup::set_producer_stream), and the point on it an op must follow: an event
// recorded there on the issuing thread when the op is issued. Shared by the NCCL and the staged
// groups; only in a CUDA build (include it under DHELIX_HAVE_CUDA).
#pragma once
#include <cuda_runtime_api.h>

#include <mutex>

#include "base/Error.h"

namespace dhelix {

class ProducerStream {
 public:
  void set(void* stream) {
    std::lock_guard lk(mu_);
    stream_ = static_cast<cudaStream_t>(stream);
  }
  // A new event recorded on the stream now (the caller destroys it), or null without a stream.
  cudaEvent_t point() {
    std::lock_guard lk(mu_);
    if (!stream_) return nullptr;
    cudaEvent_t ev = nullptr;
    check(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming), "cudaEventCreate");
    check(cudaEventRecord(ev, stream_), "cudaEventRecord (producer stream)");
    return ev;
  }

 private:
  static void check(cudaError_t e, const char* what) {
    DHX_CHECK(e == cudaSuccess, DeviceError, "{}: {}", what, cudaGetErrorString(e));
  }
  std::mutex mu_;
  cudaStream_t stream_ = nullptr;
};

}  // namespace dhelix
