// The host's copies of small GPU buffers (HostCopies.h).
#include "runtime/HostCopies.h"

#if DHELIX_HAVE_CUDA

#include <cuda_runtime_api.h>

#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include "base/Error.h"
#include "kernels/cuda/Cuda.h"
#include "runtime/Stream.h"

namespace dhelix {
namespace {

// Host buffers whose copies had not run when their owner let go (CopyLanded's destructor): each
// kept, with its copy's event, until the event has passed, looked at again whenever one more is
// parked -- so letting go never waits for a stream (a UnitEnv freed in the middle of a step would
// otherwise stop the issuing thread until its strand reached the copy).
class Parked {
 public:
  static void park(cudaEvent_t ev, Tensor keep) {
    static Parked* p = new Parked;  // never destroyed: buffers may be parked until the process ends
    std::lock_guard<std::mutex> g(p->mu_);
    std::erase_if(p->items_, [](Item& i) {
      const cudaError_t e = cudaEventQuery(i.ev);
      if (e == cudaErrorNotReady) {
        (void)cudaGetLastError();
        return false;
      }
      cudaEventDestroy(i.ev);  // passed (or failed: the run's error surfaces elsewhere)
      return true;
    });
    p->items_.push_back({ev, std::move(keep)});
  }

 private:
  struct Item {
    cudaEvent_t ev;
    Tensor keep;
  };
  std::mutex mu_;
  std::vector<Item> items_;
};

// A copy between the host and the GPU started on a stream: complete once a CUDA event recorded
// behind it is. It holds the host buffer (`keep`, a reference to its storage) until then: destroyed
// before, it parks both instead of waiting, so the buffer is never given back while the copy may
// still read or write it.
class CopyLanded final : public Event {
 public:
  CopyLanded(cudaStream_t s, Tensor keep) : keep_(std::move(keep)) {
    DHX_CUDA(cudaEventCreateWithFlags(&ev_, cudaEventDisableTiming));
    if (const cudaError_t e = cudaEventRecord(ev_, s); e != cudaSuccess) {
      cudaEventDestroy(ev_);
      DHX_CUDA(e);
    }
  }
  ~CopyLanded() override {
    if (ready()) {
      cudaEventDestroy(ev_);
      return;
    }
    try {
      Parked::park(ev_, std::move(keep_));
    } catch (...) {  // (no memory for the list: wait instead)
      cudaEventSynchronize(ev_);
      cudaEventDestroy(ev_);
    }
  }
  CopyLanded(const CopyLanded&) = delete;
  CopyLanded& operator=(const CopyLanded&) = delete;
  bool ready() const override {
    const cudaError_t e = cudaEventQuery(ev_);
    if (e == cudaErrorNotReady) (void)cudaGetLastError();  // (not a failure: must not meet the next launch's check)
    return e == cudaSuccess;
  }
  void host_wait() override { DHX_CUDA(cudaEventSynchronize(ev_)); }

 private:
  cudaEvent_t ev_{};
  Tensor keep_;
};

}  // namespace

// Starts the host mirror of buffer `name` (written on the op's stream, or waited for there): a
// page-locked copy, so the copy does not block the host (pageable memory, where none can be had,
// makes it synchronous). Returns it.
const HostMirror& start_host_mirror(OpCall& c, const std::string& name) {
  const Tensor& t = c.env.at(name);
  HostMirror m;
  m.host = Tensor::empty_pinned(t.shape(), t.dtype());
  DHX_CUDA(cudaMemcpyAsync(m.host.raw(), t.raw(), t.nbytes(), cudaMemcpyDeviceToHost, static_cast<cudaStream_t>(c.stream)));
  m.ready = std::make_shared<CopyLanded>(static_cast<cudaStream_t>(c.stream), m.host);
  c.env.drop_mirror(name);  // (a mirror replaced in place would free its buffer before its copy landed)
  return c.env.mirrors.emplace(name, std::move(m)).first->second;
}
// Input `i` on the host (its mirror; made by a copy on the op's stream, not the one the buffer was
// allocated on: a backward op reading its forward's statistics must not wait behind the other
// strand's queue).
const Tensor& host_input(OpCall& c, size_t i, DType dt) {
  const Tensor& h = c.env.host_view(c.op.inputs.at(i), c.stream);
  DHX_CHECK(h.dtype() == dt, InternalError, "{}: input {} is {}, expected {}", c.op.name, c.op.inputs.at(i),
            h.describe(), dtype_name(dt));
  return h;
}

}  // namespace dhelix

#endif  // DHELIX_HAVE_CUDA
