// NCCL process groups (NcclGroup.h). Each op: on the issuing thread an event on the producer
// stream; on the comm thread the group's stream waits for it, the NCCL call is enqueued, an event
// records its end (also published to the op's WorkState: Work::wait_on orders a compute stream after
// it on the GPU), and the op is posted; the comm thread's poll completes posted ops in order as
// their events pass, and is the watchdog (NCCL's asynchronous error, or the group's timeout).
#include "comm/NcclGroup.h"

#include <cstring>

#include "base/Error.h"
#include "tensor/Tensor.h"

#if DHELIX_HAVE_CUDA
#include <cuda_runtime.h>
#include <dlfcn.h>
#include <nccl.h>

#include <chrono>
#include <cstring>
#include <deque>
#include <mutex>
#include <thread>

#include "base/Clock.h"
#include "comm/ProducerStream.h"
#endif

namespace dhelix {

#if DHELIX_HAVE_CUDA

namespace {

// NCCL is loaded when first asked for (libnccl.so.2 on the library path: the CUDA install's, or the
// nvidia-nccl wheel's), not linked: a binary without it still runs its other GPU work, and
// nccl_available() says no.
struct NcclApi {
#define DHX_NCCL_FNS(X)                                                                                        \
  X(ncclGetUniqueId) X(ncclCommInitRankConfig) X(ncclCommGetAsyncError) X(ncclCommAbort) X(ncclCommDestroy) \
  X(ncclCommFinalize) \
  X(ncclGetErrorString) X(ncclAllReduce) X(ncclAllGather) X(ncclReduceScatter) X(ncclBroadcast) X(ncclSend)  \
  X(ncclRecv) X(ncclGroupStart) X(ncclGroupEnd)
#define DHX_NCCL_PTR(f) decltype(&::f) f = nullptr;
  DHX_NCCL_FNS(DHX_NCCL_PTR)
#undef DHX_NCCL_PTR
  std::string why;  // empty when loaded
};

const NcclApi& nccl() {
  static const NcclApi api = [] {
    NcclApi a;
    void* h = dlopen("libnccl.so.2", RTLD_NOW | RTLD_GLOBAL);
    if (!h) h = dlopen("libnccl.so", RTLD_NOW | RTLD_GLOBAL);
    if (!h) {
      const char* e = dlerror();
      a.why = fmt::format("libnccl.so.2 not found ({}); put NCCL's lib directory on LD_LIBRARY_PATH", e ? e : "?");
      return a;
    }
#define DHX_NCCL_LOAD(f)                                                           \
  a.f = reinterpret_cast<decltype(a.f)>(dlsym(h, #f));                             \
  if (!a.f && a.why.empty()) a.why = fmt::format("libnccl.so.2 lacks {}", #f);
    DHX_NCCL_FNS(DHX_NCCL_LOAD)
#undef DHX_NCCL_LOAD
    return a;
  }();
  DHX_CHECK(api.why.empty(), DeviceError, "NCCL: {}", api.why);
  return api;
}

void cuda_check(cudaError_t e, const char* what) {
  DHX_CHECK(e == cudaSuccess, DeviceError, "{}: {}", what, cudaGetErrorString(e));
}

ncclDataType_t nccl_type(const Tensor& t, const std::string& op) {
  switch (t.dtype()) {
    case DType::kF32: return ncclFloat32;
    case DType::kBF16: return ncclBfloat16;
    case DType::kF64: return ncclFloat64;
    case DType::kI32: return ncclInt32;
    case DType::kI64: return ncclInt64;
    case DType::kU16: break;
  }
  throw CommError(fmt::format("{}: NCCL moves f32, bf16, f64, i32 and i64 tensors, not {}", op, t.describe()));
}

ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return ncclSum;
    case ReduceOp::kMax: return ncclMax;
    case ReduceOp::kMin: return ncclMin;
  }
  return ncclSum;
}

class NcclGroup final : public ProcessGroup {
 public:
  NcclGroup(const std::string& role, int rank, int size, int world_rank, double timeout_s, const NcclId& id,
            int device, int max_ctas)
      : ProcessGroup(role, rank, size, world_rank, timeout_s), device_(device) {
    DHX_CHECK(max_ctas >= 0, ConfigError, "{}: an NCCL group's CTA cap must be >= 0 (0: NCCL's choice), got {}", name(),
              max_ctas);
    use_device(Device::cuda(device));
    // The group's stream at the device's highest priority (PyTorch's is_high_priority_stream, the
    // streams of Megatron's tp overlap): while the strands' kernels fill the SMs, the block scheduler
    // starts a collective's blocks before their next ones, so one strand's collective does not wait
    // behind the other strand's queue -- the overlap SI is for (issue 39 item 3; not yet measured).
    int least = 0, greatest = 0;
    cuda_check(cudaDeviceGetStreamPriorityRange(&least, &greatest), "cudaDeviceGetStreamPriorityRange");
    cuda_check(cudaStreamCreateWithPriority(&stream_, cudaStreamNonBlocking, greatest),
               "cudaStreamCreateWithPriority (NCCL group)");
    cuda_check(cudaMalloc(&scratch_, sizeof(int32_t)), "cudaMalloc (NCCL barrier word)");
    try {
      form(size, rank, id, max_ctas);
      start_stream(kDefaultCommNice, [this] { return poll(); });
    } catch (...) {  // no destructor runs: release what was made
      if (comm_) nccl().ncclCommAbort(comm_);
      cudaFree(scratch_);
      cudaStreamDestroy(stream_);
      throw;
    }
  }

  ~NcclGroup() override {
    stop_stream();
    // Ops still posted (issued, ordered by Work::wait_on and never waited for, or left by a step
    // that threw) complete or fail here, within the group's timeout (poll's watchdog), so no Work
    // waits past the group and no kernel of ours still runs when the communicator goes.
    if (!posted_.empty()) {
      try {
        use_device(Device::cuda(device_));
        while (poll()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
      } catch (const std::exception& e) {
        abort_all(fmt::format("the group was destroyed with ops in flight ({})", e.what()));
      }
    }
    if (comm_) {
      // A non-blocking communicator is finalized (its queued work flushed) before it is destroyed.
      // Anything still posted (a failed or abandoned op), or a finalize that does not settle within
      // the timeout, would hang a destroy: abort instead.
      if (posted_.empty() && !aborted_ && settle(nccl().ncclCommFinalize(comm_)) == ncclSuccess)
        nccl().ncclCommDestroy(comm_);
      else
        nccl().ncclCommAbort(comm_);
    }
    for (Posted& p : posted_) release(p);
    cudaFree(scratch_);
    cudaStreamDestroy(stream_);
  }

  std::string transport() const override { return "nccl"; }

  void set_producer_stream(void* s) override { producer_.set(s); }
  StreamHandle stream() const { return stream_; }
  void set_host_group(ProcessGroup* host) { host_ = host; }

 protected:
  Task all_reduce_task(Tensor t, ReduceOp op) override {
    if (t.defined() && t.device().is_host()) return on_host(t, "all_reduce", [this, t, op] { host_->all_reduce(t, op).wait(); });
    return post(t, [this, t, op] {
      return nccl().ncclAllReduce(t.raw(), t.raw(), size_t(t.numel()), nccl_type(t, "all_reduce"), nccl_op(op), comm_, stream_);
    }, {t});
  }
  Task all_gather_task(Tensor in, Tensor out) override {
    if (in.defined() && in.device().is_host()) {
      DHX_CHECK(!out.defined() || out.device().is_host(), CommError,
                "all_gather on {}: the input {} is in host memory and the output {} is not; give both on the host "
                "(the host group's) or both on GPU {} (NCCL's)", name(), in.describe(), out.describe(), device_);
      return on_host(in, "all_gather", [this, in, out] { host_->all_gather(in, out).wait(); });
    }
    return post(in, [this, in, out] {
      return nccl().ncclAllGather(in.raw(), out.raw(), size_t(in.numel()), nccl_type(in, "all_gather"), comm_, stream_);
    }, {in, out});
  }
  Task reduce_scatter_task(Tensor in, Tensor out, ReduceOp op) override {
    return post(in, [this, in, out, op] {
      return nccl().ncclReduceScatter(in.raw(), out.raw(), size_t(out.numel()), nccl_type(in, "reduce_scatter"), nccl_op(op),
                               comm_, stream_);
    }, {in, out});
  }
  Task all_to_all_task(Tensor in, Tensor out) override {
    const int64_t chunk = in.numel() / size();
    std::vector<int64_t> counts(size_t(size()), chunk);
    return all_to_all_v_task(std::move(in), counts, std::move(out), counts);
  }
  // One grouped launch of a send and a receive per peer (counts in elements).
  Task all_to_all_v_task(Tensor in, std::vector<int64_t> send, Tensor out, std::vector<int64_t> recv) override {
    return post(in, [this, in, out, send, recv] {
      const ncclDataType_t dt = nccl_type(in, "all_to_all");
      const size_t es = dtype_size(in.dtype());
      char* src = static_cast<char*>(in.raw());
      char* dst = static_cast<char*>(out.raw());
      ncclResult_t r = nccl().ncclGroupStart();
      for (int j = 0; j < size() && r == ncclSuccess; ++j) {
        if (send[size_t(j)] > 0) r = nccl().ncclSend(src, size_t(send[size_t(j)]), dt, j, comm_, stream_);
        if (r == ncclSuccess && recv[size_t(j)] > 0) r = nccl().ncclRecv(dst, size_t(recv[size_t(j)]), dt, j, comm_, stream_);
        src += size_t(send[size_t(j)]) * es, dst += size_t(recv[size_t(j)]) * es;
      }
      const ncclResult_t e = nccl().ncclGroupEnd();
      return r != ncclSuccess ? r : e;
    }, {in, out});
  }
  Task broadcast_task(Tensor t, int root) override {
    if (t.defined() && t.device().is_host()) return on_host(t, "broadcast", [this, t, root] { host_->broadcast(t, root).wait(); });
    return post(t, [this, t, root] {
      return nccl().ncclBroadcast(t.raw(), t.raw(), size_t(t.numel()), nccl_type(t, "broadcast"), root, comm_, stream_);
    }, {t});
  }
  Task send_task(Tensor t, int peer, int) override {
    return post(t, [this, t, peer] { return nccl().ncclSend(t.raw(), size_t(t.numel()), nccl_type(t, "send"), peer, comm_, stream_); },
                {t});
  }
  Task recv_task(Tensor t, int peer, int) override {
    return post(t, [this, t, peer] { return nccl().ncclRecv(t.raw(), size_t(t.numel()), nccl_type(t, "recv"), peer, comm_, stream_); },
                {t});
  }
  Task barrier_task() override {
    return post(Tensor(), [this] { return nccl().ncclAllReduce(scratch_, scratch_, 1, ncclInt32, ncclSum, comm_, stream_); });
  }

 private:
  // The communicator (non-blocking: a communicator whose peer never arrives can be aborted by the
  // watchdog), formed within the group's timeout.
  void form(int size, int rank, const NcclId& id, int max_ctas) {
    ncclUniqueId uid;
    static_assert(sizeof uid == sizeof id.bytes, "ncclUniqueId is 128 bytes");
    std::memcpy(&uid, id.bytes.data(), sizeof uid);
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0;
    if (max_ctas > 0) {
      cfg.maxCTAs = max_ctas;
      cfg.minCTAs = 1;  // a minimum above the cap would override it (NCCL sets both to one value)
    }
    const ncclResult_t r = settle(nccl().ncclCommInitRankConfig(&comm_, size, uid, rank, &cfg));
    if (r == ncclInProgress)
      throw CommError(fmt::format("{}: NCCL communicator of {} ranks not formed within {} s (a member never "
                                  "joined)", name(), size, timeout_s()));
    DHX_CHECK(r == ncclSuccess, CommError, "{}: ncclCommInitRank: {}", name(), nccl().ncclGetErrorString(r));
  }

  struct Posted {
    std::shared_ptr<WorkState> st;
    cudaEvent_t ready = nullptr, done = nullptr;
    double posted_at = 0;
    // The op's tensors, held until its end event passed: the issuer may drop them as soon as the
    // op is issued (or, with Work::wait_on, while it runs), and their memory would go back to its
    // stream's pool while the group's stream still reads or writes it.
    std::vector<Tensor> keep;
  };

  ncclResult_t async_error() const {
    ncclResult_t e = ncclSuccess;
    if (comm_) nccl().ncclCommGetAsyncError(comm_, &e);
    return e;
  }

  // A call's result on the non-blocking communicator once NCCL has finished it: ncclInProgress
  // means NCCL's own thread is still at it (forming the communicator, connecting peers, launching a
  // grouped op's kernels: nothing is on the stream yet, and the communicator takes no other call
  // until then), so its state is polled until it is something else; ncclInProgress still after the
  // group's timeout.
  ncclResult_t settle(ncclResult_t r) const {
    const double t0 = now_seconds();
    for (int polls = 0; r == ncclInProgress || (r == ncclSuccess && async_error() == ncclInProgress); ++polls) {
      if (now_seconds() - t0 > timeout_s()) return ncclInProgress;
      if (polls < 1000) std::this_thread::yield();
      else std::this_thread::sleep_for(std::chrono::microseconds(100));
      r = async_error();
    }
    return r;
  }

  // On the issuing thread: the producer stream's point the op must follow (null without one).
  cudaEvent_t producer_point() { return producer_.point(); }

  // A host tensor's op (the trainer's small reductions: the gradient norm's parts) runs on the CPU
  // group the communicator was bootstrapped over, in this group's op order (on its comm thread); a
  // group without one refuses it, naming the tensor.
  template <typename Op>
  Task on_host(const Tensor& t, const char* what, Op op) {
    DHX_CHECK(host_ != nullptr, CommError, "{} on {}: an NCCL group moves GPU tensors; {} is in host memory", what,
              name(), t.describe());
    return [op](const std::shared_ptr<WorkState>&) {
      op();
      return true;
    };
  }

  // The op's task: on the comm thread, after the producer's point, `call` enqueues the NCCL op on
  // the group's stream; the op is posted (false) and poll() completes it.
  template <typename Call>
  Task post(const Tensor& t, Call call, std::vector<Tensor> keep = {}) {
    // Every tensor of the op on this group's GPU: NCCL given host memory or another GPU's would
    // fault the context instead of failing the op.
    for (const Tensor& x : keep)
      DHX_CHECK(!x.defined() || (!x.device().is_host() && x.device().index == device_), CommError,
                "{}: an NCCL group moves tensors on its GPU ({}); {} is {}", name(), device_, x.describe(),
                x.device().is_host() ? "in host memory" : fmt::format("on GPU {}", x.device().index));
    DHX_CHECK(!t.defined() || !t.device().is_host(), CommError,
              "{}: an NCCL group moves GPU tensors; {} is in host memory", name(), t.describe());
    // A type NCCL has none for is the caller's error, refused here: found on the comm thread it
    // would abort the communicator.
    for (const Tensor& x : keep)
      if (x.defined()) (void)nccl_type(x, name());
    cudaEvent_t ready = producer_point();
    return [this, ready, call, keep](const std::shared_ptr<WorkState>& st) {
      Posted p{st, ready, nullptr, now_seconds(), keep};
      if (aborted_) {
        release(p);
        st->fail(fmt::format("{}: the NCCL communicator was aborted by an earlier op's failure", st->describe()));
        return true;
      }
      // Any failure here (a CUDA call, a dtype NCCL has no type for, NCCL itself) aborts the
      // communicator: this rank would otherwise skip a collective its peers entered, and every later
      // op would pair with the wrong one. The op's tensors go before it fails (poll's rule).
      // The abort first: NCCL may still be launching the op onto the group's stream, and its tensors,
      // freed on their allocation streams, must not be reused under its kernel (a review, 2026-11-29).
      auto give_up = [&](const std::string& why) {
        abort_all(fmt::format("{}: {}", st->describe(), why));
        release(p);
        p.keep.clear();
        st->fail(fmt::format("{}: {}", st->describe(), why));
        return true;
      };
      try {
        use_device(Device::cuda(device_));
        if (ready) cuda_check(cudaStreamWaitEvent(stream_, ready, 0), "cudaStreamWaitEvent");
        // The end event is recorded only once the op's kernels are on the stream (settle): before,
        // it would pass at once and the op's buffers be released while NCCL still moves them.
        const ncclResult_t r = settle(call());
        if (r != ncclSuccess)
          return give_up(r == ncclInProgress
                             ? fmt::format("NCCL still enqueuing the op after {} s (a peer stalled or died)", timeout_s())
                             : fmt::format("NCCL: {}", nccl().ncclGetErrorString(r)));
        cuda_check(cudaEventCreateWithFlags(&p.done, cudaEventDisableTiming), "cudaEventCreate");
        cuda_check(cudaEventRecord(p.done, stream_), "cudaEventRecord (NCCL stream)");
        publish_end(*st);
      } catch (const std::exception& e) {
        return give_up(e.what());
      }
      posted_.push_back(std::move(p));
      return false;
    };
  }

  // On the comm thread, the op just enqueued: an event at its end on the group's stream, which
  // Work::wait_on makes a compute stream wait for (the GPU orders the reader after the op; the
  // issuing thread goes on). The event is the WorkState's: destroyed with it (CUDA keeps it until
  // the waits enqueued on it have passed).
  void publish_end(WorkState& st) {
    cudaEvent_t ev = nullptr;
    cuda_check(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming), "cudaEventCreate");
    cuda_check(cudaEventRecord(ev, stream_), "cudaEventRecord (NCCL stream)");
    std::shared_ptr<CUevent_st> end(ev, [](cudaEvent_t e) { cudaEventDestroy(e); });
    st.set_device_wait([end](void* s) {
      cuda_check(cudaStreamWaitEvent(static_cast<cudaStream_t>(s), end.get(), 0), "cudaStreamWaitEvent (an NCCL op's end)");
    });
  }

  // On the comm thread: completes posted ops in order as their events pass; the watchdog.
  bool poll() {
    while (!posted_.empty()) {
      Posted& p = posted_.front();
      const cudaError_t q = cudaEventQuery(p.done);
      if (q == cudaSuccess) {
        // The op's tensors and events go before its issuer can see it finish (StagedGroup::poll's
        // rule): once it does, it may free what they are charged to and the stream they are on.
        Posted done = std::move(p);
        posted_.pop_front();
        release(done);
        done.keep.clear();
        done.st->complete();
        continue;
      }
      const ncclResult_t e = async_error();
      if (q != cudaErrorNotReady || (e != ncclSuccess && e != ncclInProgress)) {
        abort_all(q != cudaErrorNotReady ? fmt::format("CUDA: {}", cudaGetErrorString(q))
                                         : fmt::format("NCCL: {} (a peer failed or left)", nccl().ncclGetErrorString(e)));
        return false;
      }
      if (now_seconds() - p.posted_at > timeout_s()) {
        abort_all(fmt::format("not finished after {} s (a peer stalled or died; {})", timeout_s(),
                              arrivals(p.st->seq()).empty() ? "no arrival board" : arrivals(p.st->seq())));
        return false;
      }
      return true;
    }
    return false;
  }

  // Aborts the communicator and fails every posted op, the first with `why`.
  void abort_all(const std::string& why) {
    if (comm_ && !aborted_) nccl().ncclCommAbort(comm_);
    comm_ = nullptr;
    aborted_ = true;
    // The ops' tensors and events go first, then each op fails (poll's rule).
    std::deque<Posted> failed;
    failed.swap(posted_);
    for (Posted& p : failed) release(p), p.keep.clear();
    bool first = true;
    for (Posted& p : failed) {
      p.st->fail(first ? fmt::format("{}: {}; the NCCL communicator of {} was aborted", p.st->describe(), why, name())
                       : fmt::format("{}: aborted with the NCCL communicator of {} ({})", p.st->describe(), name(),
                                     failed.front().st->describe()));
      first = false;
    }
  }

  static void release(Posted& p) {
    if (p.ready) cudaEventDestroy(p.ready);
    if (p.done) cudaEventDestroy(p.done);
    p.ready = p.done = nullptr;
  }

  int device_;
  ProcessGroup* host_ = nullptr;  // set_host_group: host tensors pass through to it
  cudaStream_t stream_ = nullptr;
  void* scratch_ = nullptr;
  ncclComm_t comm_ = nullptr;
  bool aborted_ = false;
  std::deque<Posted> posted_;  // the comm thread's alone
  ProducerStream producer_;
};

}  // namespace

bool nccl_available() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) return false;
  try {
    nccl();
    return true;
  } catch (const DeviceError&) {
    return false;
  }
}

NcclId nccl_unique_id() {
  ncclUniqueId uid;
  const ncclResult_t r = nccl().ncclGetUniqueId(&uid);
  DHX_CHECK(r == ncclSuccess, DeviceError, "ncclGetUniqueId: {}", nccl().ncclGetErrorString(r));
  NcclId id;
  std::memcpy(id.bytes.data(), &uid, sizeof uid);
  return id;
}

std::unique_ptr<ProcessGroup> make_nccl_group(const std::string& role, int rank, int size, int world_rank,
                                              double timeout_s, const NcclId& id, int device, int max_ctas) {
  return std::make_unique<NcclGroup>(role, rank, size, world_rank, timeout_s, id, device, max_ctas);
}

void nccl_set_producer_stream(ProcessGroup& group, StreamHandle stream) {
  auto* g = dynamic_cast<NcclGroup*>(&group);
  DHX_CHECK(g, InternalError, "{} is not an NCCL group (transport {})", group.name(), group.transport());
  g->set_producer_stream(stream);
}

void nccl_set_host_group(ProcessGroup& group, ProcessGroup* host) {
  auto* g = dynamic_cast<NcclGroup*>(&group);
  DHX_CHECK(g, InternalError, "{} is not an NCCL group (transport {})", group.name(), group.transport());
  g->set_host_group(host);
}

StreamHandle nccl_stream(ProcessGroup& group) {
  auto* g = dynamic_cast<NcclGroup*>(&group);
  DHX_CHECK(g, InternalError, "{} is not an NCCL group (transport {})", group.name(), group.transport());
  return g->stream();
}

#endif

// The id travels as 128 bytes in an int32 tensor of 32 elements (the CPU transports move int32 as is).
NcclId nccl_id_over(ProcessGroup& host) {
  static_assert(sizeof(NcclId::bytes) == 32 * sizeof(int32_t));
  Tensor t = Tensor::empty({32}, DType::kI32);
  NcclId id;
  if (host.rank() == 0) {
    id = nccl_unique_id();
    std::memcpy(t.raw(), id.bytes.data(), id.bytes.size());
  } else {
    std::memset(t.raw(), 0, t.nbytes());
  }
  host.broadcast(t, 0).wait();
  std::memcpy(id.bytes.data(), t.raw(), id.bytes.size());
  return id;
}

std::unique_ptr<ProcessGroup> make_nccl_group_over(ProcessGroup& host, int device, int max_ctas) {
  const std::string& n = host.name();
  const std::string role = n.substr(0, n.find('['));  // "tp[1/2]" -> "tp"
  const NcclId id = nccl_id_over(host);
  auto g = make_nccl_group(role, host.rank(), host.size(), host.world_rank(), host.timeout_s(), id, device, max_ctas);
  nccl_set_host_group(*g, &host);
  return g;
}

#if !DHELIX_HAVE_CUDA  // a build without CUDA

namespace {
[[noreturn]] void no_cuda() {
  throw DeviceError("NCCL process groups need a CUDA build (cmake -DDHELIX_ENABLE_CUDA=ON) and a GPU");
}
}  // namespace

bool nccl_available() { return false; }
NcclId nccl_unique_id() { no_cuda(); }
std::unique_ptr<ProcessGroup> make_nccl_group(const std::string&, int, int, int, double, const NcclId&, int, int) {
  no_cuda();
}
void nccl_set_producer_stream(ProcessGroup&, StreamHandle) { no_cuda(); }
void nccl_set_host_group(ProcessGroup&, ProcessGroup*) { no_cuda(); }
StreamHandle nccl_stream(ProcessGroup&) { no_cuda(); }

#endif

}  // namespace dhelix
