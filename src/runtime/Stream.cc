// The host's Stream and Event (see Stream.h): inline work, joins; in a CUDA build, CUDA streams
// and events.
#include "runtime/Stream.h"

#include "base/Error.h"

#if DHELIX_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

namespace dhelix {

double Event::seconds_since(const Event&) const {
  throw DeviceError("this event keeps no device time (only CUDA events recorded with timing do)");
}

namespace {

// Work launched on the host stream has finished by the time launch() returns.
class ReachedEvent final : public Event {
 public:
  bool ready() const override { return true; }
  void host_wait() override {}
};

class HostStream final : public Stream {
 public:
  Device device() const override { return Device::host(); }
  void launch(const std::function<void()>& work) override { work(); }
  void wait(Event& e) override { e.host_wait(); }
  std::unique_ptr<Event> record(bool) override { return std::make_unique<ReachedEvent>(); }
};

#if DHELIX_HAVE_CUDA
void check(cudaError_t e, const char* what, Device d) {
  if (e != cudaSuccess)
    throw DeviceError(fmt::format("{} on {} failed: {} ({})", what, d.str(), cudaGetErrorName(e), cudaGetErrorString(e)));
}

class CudaEvent final : public Event {
 public:
  CudaEvent(Device d, cudaStream_t s, bool timed) : d_(d), timed_(timed) {
    check(cudaEventCreateWithFlags(&ev_, timed ? cudaEventDefault : cudaEventDisableTiming), "cudaEventCreate", d);
    check(cudaEventRecord(ev_, s), "cudaEventRecord", d);
  }
  ~CudaEvent() override { cudaEventDestroy(ev_); }
  bool ready() const override {
    const cudaError_t e = cudaEventQuery(ev_);
    if (e == cudaErrorNotReady) return false;
    check(e, "cudaEventQuery", d_);
    return true;
  }
  void host_wait() override { check(cudaEventSynchronize(ev_), "cudaEventSynchronize", d_); }
  double seconds_since(const Event& earlier) const override {
    const auto* e = dynamic_cast<const CudaEvent*>(&earlier);
    DHX_CHECK(e && e->timed_ && timed_, DeviceError, "seconds between two events of {} need both recorded with timing",
              d_.str());
    float ms = 0;
    check(cudaEventElapsedTime(&ms, e->ev_, ev_), "cudaEventElapsedTime", d_);
    return ms * 1e-3;
  }
  cudaEvent_t get() const { return ev_; }

 private:
  Device d_;
  bool timed_ = false;
  cudaEvent_t ev_ = nullptr;
};

class CudaStream final : public Stream {
 public:
  explicit CudaStream(Device d) : d_(d) {
    use_device(d);
    // A blocking stream: work on the default stream (the parameter store's zeroing and copies, a
    // step's results read back) is ordered against it, so nothing outside the executor races a
    // step's kernels; two blocking streams (two strands) still run concurrently. The places where a
    // step meets the default stream also order it explicitly (Executor::after_default_stream, the
    // optimizer's default_stream_after), since inside an SM partition (a green context, whose own
    // streams the driver makes non-blocking: cuGreenCtxStreamCreate) that implicit order is not
    // documented; where a blocking stream is refused there, a non-blocking one is made instead.
    cudaError_t e = cudaStreamCreateWithFlags(&s_, cudaStreamDefault);
    if (e != cudaSuccess) {
      (void)cudaGetLastError();
      e = cudaStreamCreateWithFlags(&s_, cudaStreamNonBlocking);
    }
    check(e, "cudaStreamCreate", d);
  }
  ~CudaStream() override { cudaStreamDestroy(s_); }
  Device device() const override { return d_; }
  void launch(const std::function<void()>& work) override { work(); }
  void wait(Event& e) override {
    if (auto* ce = dynamic_cast<CudaEvent*>(&e)) check(cudaStreamWaitEvent(s_, ce->get(), 0), "cudaStreamWaitEvent", d_);
    else if (auto* we = dynamic_cast<WorkEvent*>(&e)) we->stream_wait(s_);
    else e.host_wait();
  }
  std::unique_ptr<Event> record(bool timed) override { return std::make_unique<CudaEvent>(d_, s_, timed); }
  StreamHandle handle() const override { return s_; }

 private:
  Device d_;
  cudaStream_t s_ = nullptr;
};
#endif

}  // namespace

std::unique_ptr<Stream> make_stream(Device d) {
  if (d.is_host()) return std::make_unique<HostStream>();
#if DHELIX_HAVE_CUDA
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) (void)cudaGetLastError();
  DHX_CHECK(e == cudaSuccess && n > 0, DeviceError,
            "device {} asked for, but this machine has no GPU ({}); run on cpu", d.str(),
            e != cudaSuccess ? cudaGetErrorString(e) : "no CUDA device");
  DHX_CHECK(d.index < n, DeviceError, "device {} asked for, but this machine has {} GPU(s)", d.str(), n);
  return std::make_unique<CudaStream>(d);
#else
  throw DeviceError(fmt::format("device {} asked for, but this build has no CUDA backend (configure with "
                                "-DDHELIX_ENABLE_CUDA=ON on a machine with the CUDA toolkit); run on cpu",
                                d.str()));
#endif
}

}  // namespace dhelix
