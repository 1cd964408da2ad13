// Stream and Event: the executor's seam to a device's ordering primitives. The executor launches
// every compute op on its compute stream and, before an op reads a collective's output, makes the
// stream wait on that collective's completion event; it never synchronises a whole device.
//   host (HostStream): work runs inline on the calling thread (the rank's compute thread), so
//     issue order is run order; an Event is a point already reached, or a collective's
//     completion (WorkEvent over comm's Work: its comm thread finishes it), and waiting is a join.
//   cuda (a build with DHELIX_ENABLE_CUDA): a CUDA stream; launch() runs the host function that
//     enqueues the kernels on it (handle() is the cudaStream_t they take), record() records a CUDA
//     event, and waiting on a CUDA event is enqueued (cudaStreamWaitEvent) without blocking the
//     host; waiting on a collective (a WorkEvent) is Work::wait_on: enqueued on the GPU too when
//     the op's group published its end as an event (NCCL), else (a CPU or staged group's op, which
//     completes on the host) the host thread blocks first, so everything launched after it is
//     ordered after it. A build without CUDA, or
//     a machine without a GPU, answers make_stream(cuda:N) with DeviceError.
//
//   compute stream : [op a][op b]....wait(ev AG)[op c reads AG]
//   comm tp thread :    [AG ...........]--> ev AG
#pragma once
#include <functional>
#include <memory>

#include "comm/Work.h"
#include "tensor/Device.h"
#include "tensor/DeviceMemory.h"

namespace dhelix {

class Event {
 public:
  virtual ~Event() = default;
  virtual bool ready() const = 0;  // completed (does not block)
  virtual void host_wait() = 0;    // blocks the calling thread until completed; throws its failure
  // Seconds from `earlier` to this event, both recorded with timing (Stream::record(true)) and
  // both completed; DeviceError for events that were not (a host event, an untimed CUDA event).
  virtual double seconds_since(const Event& earlier) const;
};

// A collective's completion (the Work its ProcessGroup call returned; not owned).
class WorkEvent final : public Event {
 public:
  explicit WorkEvent(const Work& w) : work_(w) {}
  bool ready() const override { return work_.is_completed(); }
  void host_wait() override { work_.wait(); }
  // Orders `stream` (a cudaStream_t) after the op: Work::wait_on (on the GPU for an NCCL op).
  void stream_wait(StreamHandle stream) { work_.wait_on(stream); }

 private:
  const Work& work_;
};

class Stream {
 public:
  virtual ~Stream() = default;
  virtual Device device() const = 0;
  // Issues `work` (a kernel launch) after everything issued on this stream before it.
  virtual void launch(const std::function<void()>& work) = 0;
  // Work issued on this stream after this call starts after `e` completed.
  virtual void wait(Event& e) = 0;
  // An event that completes once the work issued on this stream so far has; `timed`: it also
  // keeps the time it completed at, for Event::seconds_since (a CUDA event with timing).
  virtual std::unique_ptr<Event> record(bool timed = false) = 0;
  // The device stream kernels are enqueued on (a cudaStream_t); nullptr for the host.
  virtual StreamHandle handle() const { return nullptr; }
};

// A compute stream on `d`: the host's, a new CUDA stream on GPU d.index, or DeviceError (naming the
// device and why: no CUDA in this build, no such GPU).
std::unique_ptr<Stream> make_stream(Device d);

}  // namespace dhelix
