// Staged process groups (StagedGroup.h): each op's device tensors copied to host buffers on the
// group's copy stream, moved by the CPU group, copied back; point-to-point ops posted and polled.
#include "comm/StagedGroup.h"

#include <fmt/format.h>

#include "base/Error.h"

#if DHELIX_HAVE_CUDA
#include <cuda_runtime_api.h>

#include <atomic>
#include <chrono>
#include <deque>
#include <mutex>
#include <thread>

#include "base/Clock.h"
#include "comm/ProducerStream.h"
#endif

namespace dhelix {

#if DHELIX_HAVE_CUDA

namespace {

void cuda_check(cudaError_t e, const char* what) {
  DHX_CHECK(e == cudaSuccess, DeviceError, "{}: {}", what, cudaGetErrorString(e));
}

class StagedGroup final : public ProcessGroup {
 public:
  StagedGroup(ProcessGroup& host, int device, const StagedOptions& o)
      : ProcessGroup(role_of(host), host.rank(), host.size(), host.world_rank(), host.timeout_s()),
        host_(host),
        device_(device),
        link_bytes_per_s_(o.link_bytes_per_s) {
    check_rate(o.link_bytes_per_s);
    start_stream(kDefaultCommNice, [this] { return poll(); });
  }
  ~StagedGroup() override {
    stop_stream();
    // Receives and sends still posted are abandoned (their CPU ops hold their own references to the
    // host buffers and end with the CPU group) and fail, naming why: a waiter would otherwise block
    // for the whole timeout (a review, 2026-11-29; NcclGroup's destructor does the same).
    for (Posted& p : posted_) {
      if (p.ready) cudaEventDestroy(p.ready);
      p.ready = nullptr;
      p.device = Tensor();
      p.st->fail(fmt::format("{}: the staged group {} was destroyed with it posted", p.st->describe(), name()));
    }
    posted_.clear();
    if (copy_) cudaStreamDestroy(copy_);
  }

  std::string transport() const override { return "staged over " + host_.transport(); }

  void set_producer_stream(void* s) override { producer_.set(s); }
  void set_link_rate(double bytes_per_s) {
    check_rate(bytes_per_s);
    link_bytes_per_s_ = bytes_per_s;
  }

 protected:
  Task all_reduce_task(Tensor t, ReduceOp op) override {
    const double bytes = 2.0 * (size() - 1) / size() * static_cast<double>(t.nbytes());
    return collective(t, [this, t, op](Tensor h) {
      host_.all_reduce(h, op).wait();
      return std::make_pair(h, t);
    }, bytes);
  }
  Task all_gather_task(Tensor in, Tensor out) override {
    check_like(in, out, "all_gather");
    const double bytes = static_cast<double>(size() - 1) * static_cast<double>(in.nbytes());
    return collective(in, [this, out](Tensor h) {
      Tensor ho = Tensor::empty_pinned(out.shape(), out.dtype());
      host_.all_gather(h, ho).wait();
      return std::make_pair(ho, out);
    }, bytes);
  }
  Task reduce_scatter_task(Tensor in, Tensor out, ReduceOp op) override {
    check_like(in, out, "reduce_scatter");
    const double bytes = static_cast<double>(size() - 1) / size() * static_cast<double>(in.nbytes());
    return collective(in, [this, out, op](Tensor h) {
      Tensor ho = Tensor::empty_pinned(out.shape(), out.dtype());
      host_.reduce_scatter(h, ho, op).wait();
      return std::make_pair(ho, out);
    }, bytes);
  }
  Task all_to_all_task(Tensor in, Tensor out) override {
    check_like(in, out, "all_to_all");
    const double bytes = static_cast<double>(size() - 1) / size() * static_cast<double>(in.nbytes());
    return collective(in, [this, out](Tensor h) {
      Tensor ho = Tensor::empty_pinned(out.shape(), out.dtype());
      host_.all_to_all(h, ho).wait();
      return std::make_pair(ho, out);
    }, bytes);
  }
  Task all_to_all_v_task(Tensor in, std::vector<int64_t> send, Tensor out, std::vector<int64_t> recv) override {
    check_like(in, out, "all_to_all_v");
    // The CPU group's public call counts rows; the task's counts are elements.
    const int64_t row = row_elems(in.numel() > 0 ? in : out);
    double bytes = 0;
    for (int j = 0; j < size(); ++j)
      if (j != rank()) bytes += static_cast<double>(send[size_t(j)]) * static_cast<double>(dtype_size(in.dtype()));
    auto rows = [row](std::vector<int64_t> v) {
      if (row > 0)  // (rows of no elements: every count is 0 already)
        for (int64_t& x : v) x /= row;
      return v;
    };
    return collective(in, [this, out, s = rows(std::move(send)), r = rows(std::move(recv))](Tensor h) {
      Tensor ho = Tensor::empty_pinned(out.shape(), out.dtype());
      host_.all_to_all_v(h, s, ho, r).wait();
      return std::make_pair(ho, out);
    }, bytes);
  }
  Task ring_shift_task(Tensor in, Tensor out) override {
    check_like(in, out, "ring_shift");
    const double bytes = static_cast<double>(in.nbytes());
    return collective(in, [this, out](Tensor h) {
      Tensor ho = Tensor::empty_pinned(out.shape(), out.dtype());
      host_.ring_shift(h, ho).wait();
      return std::make_pair(ho, out);
    }, bytes);
  }
  Task broadcast_task(Tensor t, int root) override {
    const double bytes = static_cast<double>(t.nbytes());
    return collective(t, [this, t, root](Tensor h) {
      host_.broadcast(h, root).wait();
      return std::make_pair(h, t);
    }, bytes);
  }
  Task barrier_task() override {
    return [this](const std::shared_ptr<WorkState>&) {
      host_.barrier();
      return true;
    };
  }
  // A send: staged, paced (the link carries it before the peer can have it), then posted.
  Task send_task(Tensor t, int peer, int tag) override {
    check_tensor(t, "send");
    cudaEvent_t ready = t.device().is_host() ? nullptr : producer_point();
    return [this, t, peer, tag, ready](const std::shared_ptr<WorkState>& st) {
      const double t0 = link_start(ready);
      Tensor h = stage_in(t, ready);
      pace(t0, static_cast<double>(t.nbytes()));
      Posted p{st, host_.send(h, peer, tag), h, Tensor(), nullptr};
      posted_.push_back(std::move(p));
      return false;
    };
  }
  // A receive: posted into a host buffer; poll() copies it to the device when it arrived.
  Task recv_task(Tensor t, int peer, int tag) override {
    check_tensor(t, "recv");
    // The destination may be fresh memory of the producer stream's pool: the copy into it follows
    // the producer's point too. A host destination receives directly.
    const bool host = t.device().is_host();
    cudaEvent_t ready = host ? nullptr : producer_point();
    return [this, t, peer, tag, ready, host](const std::shared_ptr<WorkState>& st) {
      use_device(Device::cuda(device_));  // the pinned buffer in this GPU's context (stage_in)
      Tensor h = host ? t : Tensor::empty_pinned(t.shape(), t.dtype());
      Work w;
      try {
        w = host_.recv(h, peer, tag);
      } catch (...) {
        if (ready) cudaEventDestroy(ready);
        throw;
      }
      Posted p{st, std::move(w), h, host ? Tensor() : t, ready};
      posted_.push_back(std::move(p));
      return false;
    };
  }

 private:
  struct Posted {
    std::shared_ptr<WorkState> st;
    Work host_work;
    Tensor host;    // the host buffer the CPU op reads or fills
    Tensor device;  // a receive's destination (undefined for a send)
    cudaEvent_t ready = nullptr;  // a receive's producer point (the copy into `device` follows it)
  };

  static std::string role_of(const ProcessGroup& g) { return g.name().substr(0, g.name().find('[')); }
  void check_rate(double r) const {
    DHX_CHECK(r >= 0, ConfigError, "staged group {}: link rate {} B/s must be >= 0", name(), r);
  }
  static int64_t row_elems(const Tensor& t) {
    int64_t r = 1;
    for (int i = 1; i < t.ndim(); ++i) r *= t.dim(i);
    return r;
  }

  // A tensor of this group's GPU, or of the host (passed to the CPU group as it is).
  void check_tensor(const Tensor& t, const char* op) const {
    DHX_CHECK(t.defined() && (t.device().is_host() || t.device().index == device_), CommError,
              "{} on {}: a staged group moves tensors of cuda:{} (or of the host); got {} on {}", op, name(), device_,
              t.describe(), t.defined() ? t.device().str() : "nothing");
  }
  void check_like(const Tensor& in, const Tensor& out, const char* op) const {
    check_tensor(in, op);
    check_tensor(out, op);
    DHX_CHECK(in.device() == out.device(), CommError, "{} on {}: input on {} but output on {}", op, name(),
              in.device().str(), out.device().str());
  }

  // On the issuing thread: the producer stream's point the op must follow (null without one).
  cudaEvent_t producer_point() { return producer_.point(); }

  // On the comm thread: after the producer's point, the device tensor's bytes in a host tensor (a
  // host tensor as it is).
  Tensor stage_in(const Tensor& t, cudaEvent_t ready) {
    // The group's GPU first, for a host tensor's op too: its pinned result buffer (cudaHostAlloc)
    // would otherwise make GPU 0's context current on this thread (a process on another GPU).
    use_device(Device::cuda(device_));
    if (t.device().is_host()) {
      if (ready) cudaEventDestroy(ready);
      return t;
    }
    if (ready) {
      const cudaError_t e = cudaStreamWaitEvent(copy_stream(), ready, 0);
      cudaEventDestroy(ready);
      cuda_check(e, "cudaStreamWaitEvent (producer)");
    }
    Tensor h = Tensor::empty_pinned(t.shape(), t.dtype());
    device_copy(h.raw(), Device::host(), t.raw(), t.device(), t.nbytes(), copy_stream());  // returns when copied
    return h;
  }
  void stage_out(const Tensor& h, const Tensor& d, cudaEvent_t ready = nullptr) {
    DHX_CHECK(h.nbytes() == d.nbytes(), InternalError, "{}: staged result {} for {}", name(), h.describe(),
              d.describe());
    if (d.device().is_host()) {  // a host op's result: in place already, or copied
      if (h.raw() != d.raw()) Tensor(d).copy_from(h);  // a handle on the same storage
      return;
    }
    use_device(Device::cuda(device_));  // (poll may copy before any op staged in)
    if (ready) cuda_check(cudaStreamWaitEvent(copy_stream(), ready, 0), "cudaStreamWaitEvent (producer)");
    device_copy(d.raw(), d.device(), h.raw(), Device::host(), h.nbytes(), copy_stream());  // returns when copied
  }

  // On the comm thread: the copy stream, made there at its first use, in the comm thread's context
  // (the device's primary one): the issuing rank's thread may be inside an SM partition
  // (cuda::SmPartition), whose streams only one thread may drive; the copies run on the copy engines
  // either way, and waiting on the issuing stream's events across contexts is allowed.
  cudaStream_t copy_stream() {
    if (!copy_) cuda_check(cudaStreamCreateWithFlags(&copy_, cudaStreamNonBlocking), "cudaStreamCreate (staged group)");
    return copy_;
  }

  // When the emulated link starts carrying an op: once its input exists (the producer's point,
  // `ready`, has passed; at once for a host tensor). Timed from the op's issue instead, a transfer
  // would run under the kernels still writing its input, and an op issued right behind its
  // producer's launch would pay little or none of its link time. The staging copy then runs inside
  // the link's time (it moves the bytes far faster than an emulated link does).
  double link_start(cudaEvent_t ready) const {
    if (ready && link_bytes_per_s_ > 0 && size() > 1) {
      use_device(Device::cuda(device_));
      cuda_check(cudaEventSynchronize(ready), "cudaEventSynchronize (producer, link start)");
    }
    return now_seconds();
  }

  // Holds the op until `bytes` at the emulated link's rate have passed since t0.
  void pace(double t0, double bytes) const {
    const double rate = link_bytes_per_s_;
    if (rate <= 0 || size() == 1) return;
    const double until = t0 + bytes / rate;
    const double left = until - now_seconds();
    if (left > 0) std::this_thread::sleep_for(std::chrono::duration<double>(left));
  }

  // A collective's task: stage the input, run `op` on the host copy (it returns the host result and
  // the device tensor that receives it), stage the result back, pace.
  template <typename Op>
  Task collective(const Tensor& in, Op op, double bytes) {
    check_tensor(in, "collective");
    cudaEvent_t ready = in.device().is_host() ? nullptr : producer_point();
    return [this, in, op, ready, bytes](const std::shared_ptr<WorkState>&) {
      const double t0 = link_start(ready);
      Tensor h = stage_in(in, ready);
      auto [result, dst] = op(h);
      stage_out(result, dst);
      pace(t0, bytes);
      return true;
    };
  }

  // On the comm thread: completes posted sends and receives as their CPU ops finish, in any order (a
  // send over Gloo or MPI completes only once its peer has received it, so a finished receive must
  // not wait behind it: its issuer may be what lets the peer post that receive); true while any is
  // left.
  bool poll() {
    for (size_t i = 0; i < posted_.size();) {
      Posted& p = posted_[i];
      if (!p.host_work.is_completed()) {
        ++i;
        continue;
      }
      std::string error;
      try {
        p.host_work.wait();  // finished: throws its failure, if any
        if (p.device.defined()) stage_out(p.host, p.device, p.ready);
      } catch (const std::exception& e) {
        error = fmt::format("{}: {}", p.st->describe(), e.what());
      }
      if (p.ready) cudaEventDestroy(p.ready);
      // The op's tensors go before its issuer can see it finish (CommStream::loop's rule): once it
      // does, it may free what they are charged to (the step's activation tracker) and the stream
      // their device memory is ordered on.
      const std::shared_ptr<WorkState> st = std::move(p.st);
      posted_.erase(posted_.begin() + static_cast<std::ptrdiff_t>(i));
      if (error.empty()) st->complete();
      else st->fail(error);
    }
    return !posted_.empty();
  }

  ProcessGroup& host_;
  int device_;
  std::atomic<double> link_bytes_per_s_;  // StagedOptions::link_bytes_per_s; read by the comm thread
  cudaStream_t copy_ = nullptr;  // copy_stream(); the comm thread's alone
  ProducerStream producer_;
  std::deque<Posted> posted_;  // the comm thread's alone
};

}  // namespace

std::unique_ptr<ProcessGroup> make_staged_group(ProcessGroup& host, int device, const StagedOptions& options) {
  DHX_CHECK(cuda_built() && device_unavailable(Device::cuda(device)).empty(), DeviceError,
            "a staged process group on cuda:{}: {}", device, device_unavailable(Device::cuda(device)));
  return std::make_unique<StagedGroup>(host, device, options);
}

void staged_set_producer_stream(ProcessGroup& group, StreamHandle stream) {
  auto* g = dynamic_cast<StagedGroup*>(&group);
  DHX_CHECK(g, InternalError, "{} is not a staged group (transport {})", group.name(), group.transport());
  g->set_producer_stream(stream);
}

void staged_set_link_rate(ProcessGroup& group, double bytes_per_s) {
  auto* g = dynamic_cast<StagedGroup*>(&group);
  DHX_CHECK(g, InternalError, "{} is not a staged group (transport {})", group.name(), group.transport());
  g->set_link_rate(bytes_per_s);
}

#else  // a build without CUDA

std::unique_ptr<ProcessGroup> make_staged_group(ProcessGroup& host, int device, const StagedOptions&) {
  throw DeviceError(fmt::format("a staged process group ({} on cuda:{}) needs a CUDA build (cmake "
                                "-DDHELIX_ENABLE_CUDA=ON) and a GPU",
                                host.name(), device));
}
void staged_set_producer_stream(ProcessGroup& group, StreamHandle) {
  throw InternalError(fmt::format("{} is not a staged group (transport {})", group.name(), group.transport()));
}

void staged_set_link_rate(ProcessGroup& group, double) {
  throw InternalError(fmt::format("{} is not a staged group (transport {})", group.name(), group.transport()));
}

#endif

}  // namespace dhelix
