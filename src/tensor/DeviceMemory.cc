// The caching device allocator (DeviceMemory.h): one CUDA memory pool per GPU, release threshold
// unlimited (freed blocks stay cached), allocations and frees ordered on the caller's stream.
#include "tensor/DeviceMemory.h"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <mutex>
#include <vector>

#include "base/Error.h"
#include "tensor/BlockCache.h"

#if DHELIX_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

namespace dhelix {

#if DHELIX_HAVE_CUDA

namespace {

void check(cudaError_t e, const char* what, Device d) {
  if (e != cudaSuccess)
    throw DeviceError(fmt::format("{} on {} failed: {} ({})", what, d.str(), cudaGetErrorName(e), cudaGetErrorString(e)));
}

struct Pool {
  cudaMemPool_t pool = nullptr;
  std::atomic<int64_t> in_use{0}, peak{0};
};

class Pools {
 public:
  static Pools& get() {
    static Pools* p = new Pools;  // never destroyed: tensors may outlive statics
    return *p;
  }
  Pool& of(Device d) {
    std::lock_guard<std::mutex> g(mu_);
    if (pools_.empty()) {
      int n = 0;
      const cudaError_t e = cudaGetDeviceCount(&n);
      if (e != cudaSuccess || n == 0) {
        (void)cudaGetLastError();
        throw DeviceError(fmt::format("{} was asked for, but this machine has no GPU ({}; hint: run on a machine "
                                      "with an NVIDIA GPU, or use the cpu device)",
                                      d.str(), e != cudaSuccess ? cudaGetErrorString(e) : "no CUDA device"));
      }
      pools_.resize(static_cast<size_t>(n));
    }
    DHX_CHECK(d.index >= 0 && d.index < static_cast<int>(pools_.size()), DeviceError,
              "{} was asked for, but this machine has {} GPU(s)", d.str(), pools_.size());
    std::unique_ptr<Pool>& p = pools_[static_cast<size_t>(d.index)];
    if (!p) {
      p = std::make_unique<Pool>();
      cudaMemPoolProps props{};
      props.allocType = cudaMemAllocationTypePinned;
      props.location.type = cudaMemLocationTypeDevice;
      props.location.id = d.index;
      check(cudaMemPoolCreate(&p->pool, &props), "cudaMemPoolCreate", d);
      uint64_t keep = UINT64_MAX;  // never give cached blocks back to the driver on a sync
      check(cudaMemPoolSetAttribute(p->pool, cudaMemPoolAttrReleaseThreshold, &keep), "cudaMemPoolSetAttribute", d);
      // The kernels' own scratch (a norm's or bias gradient's partial sums, attention's D_i, a
      // partial weight gradient: kernels/cuda, cudaMallocAsync) comes from the device's default pool,
      // whose release threshold is 0: every synchronisation (each step's loss read-back) handed its
      // blocks back to the driver, and the next step's allocations mapped them again. Kept there too
      // (the CUDA programming guide's stream-ordered allocator chapter: a threshold keeps reserved
      // memory across synchronisations). That scratch is outside this pool's counts (stats()): at
      // most a few tens of MB on GPT-2's shapes.
      cudaMemPool_t scratch = nullptr;
      check(cudaDeviceGetDefaultMemPool(&scratch, d.index), "cudaDeviceGetDefaultMemPool", d);
      check(cudaMemPoolSetAttribute(scratch, cudaMemPoolAttrReleaseThreshold, &keep), "cudaMemPoolSetAttribute", d);
      // Scratch is freed on each op's own stream in the middle of a pair (no hold): a block one
      // strand freed but has not reached must not be handed to the other strand with a dependency the
      // driver inserts (cudaMemPoolReuseAllowInternalDependencies, on by default), which would make
      // that strand wait for this one -- Strand Interleaving serialised by a few MB of scratch (a
      // review, 2026-11-29). Off: such a block is reused only once its free has run (or where the
      // streams are already ordered by an event); else the pool maps more (each strand its own).
      int no = 0;
      check(cudaMemPoolSetAttribute(scratch, cudaMemPoolReuseAllowInternalDependencies, &no), "cudaMemPoolSetAttribute",
            d);
    }
    return *p;
  }

  // GPU `device`'s pool where one was made, else nullptr (never makes one, never throws).
  cudaMemPool_t existing(int device) {
    std::lock_guard<std::mutex> g(mu_);
    if (device < 0 || device >= static_cast<int>(pools_.size()) || !pools_[static_cast<size_t>(device)]) return nullptr;
    return pools_[static_cast<size_t>(device)]->pool;
  }

 private:
  std::mutex mu_;
  std::vector<std::unique_ptr<Pool>> pools_;
};

cudaStream_t st(StreamHandle s) { return static_cast<cudaStream_t>(s); }

// This thread's held frees (hold_device_frees): per thread, so one rank's executor never holds
// another's (ranks as threads sharing a GPU).
struct HeldFree {
  Device d;
  void* ptr;
  StreamHandle s;
  size_t bytes;
};
struct Holds {
  int depth = 0;
  std::vector<HeldFree> held;
};
thread_local Holds t_holds;

void free_now(Device d, void* ptr, StreamHandle s, size_t bytes) {
  Pool& p = Pools::get().of(d);
  check(cudaFreeAsync(ptr, st(s)), "cudaFreeAsync", d);
  p.in_use.fetch_sub(static_cast<int64_t>(bytes));
}

}  // namespace

void hold_device_frees() { ++t_holds.depth; }

void release_device_frees() {
  DHX_CHECK(t_holds.depth > 0, InternalError, "release_device_frees without a hold");
  if (--t_holds.depth > 0) return;
  std::vector<HeldFree> held;
  held.swap(t_holds.held);
  std::string failed;
  for (const HeldFree& h : held) {
    try {
      free_now(h.d, h.ptr, h.s, h.bytes);
    } catch (const Error& e) {  // every held block is still offered back; the first failure is reported
      if (failed.empty()) failed = e.what();
    }
  }
  DHX_CHECK(failed.empty(), DeviceError, "{}", failed);
}

size_t held_device_frees() { return t_holds.held.size(); }

bool cuda_built() { return true; }

std::string device_unavailable(Device d) {
  if (d.is_host()) return "";
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    return fmt::format("this machine has no GPU: {} ({})", cudaGetErrorName(e), cudaGetErrorString(e));
  }
  if (n == 0) return "this machine has no GPU: the CUDA driver reports no device";
  if (d.index >= n) return fmt::format("this machine has {} GPU(s), cuda:0..cuda:{}", n, n - 1);
  return "";
}

void trim_device_pools(int device) {
  cudaMemPool_t scratch = nullptr;
  if (cudaDeviceGetDefaultMemPool(&scratch, device) == cudaSuccess) (void)cudaMemPoolTrimTo(scratch, 0);
  if (cudaMemPool_t own = Pools::get().existing(device)) (void)cudaMemPoolTrimTo(own, 0);
  (void)cudaGetLastError();
}

void* device_alloc(Device d, size_t bytes, StreamHandle s) {
  DHX_CHECK(!d.is_host(), InternalError, "device_alloc on the host");
  Pool& p = Pools::get().of(d);
  void* ptr = nullptr;
  cudaError_t e = cudaMallocFromPoolAsync(&ptr, bytes == 0 ? 1 : bytes, p.pool, st(s));
  if (e == cudaErrorMemoryAllocation) {
    // Memory this pool needs may sit unused in the default pool (the kernels' scratch) or in blocks
    // of this one too small for the request (a review, 2026-11-29): trimmed, then once more.
    (void)cudaGetLastError();
    trim_device_pools(d.index);
    e = cudaMallocFromPoolAsync(&ptr, bytes == 0 ? 1 : bytes, p.pool, st(s));
  }
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    throw DeviceError(fmt::format("allocating {} bytes on {} failed: {} ({} bytes in use; hint: a smaller "
                                  "micro-batch or activation recompute)",
                                  bytes, d.str(), cudaGetErrorString(e), p.in_use.load()));
  }
  const int64_t now = p.in_use.fetch_add(static_cast<int64_t>(bytes)) + static_cast<int64_t>(bytes);
  int64_t peak = p.peak.load();
  while (now > peak && !p.peak.compare_exchange_weak(peak, now)) {}
  return ptr;
}

void device_free(Device d, void* ptr, StreamHandle s, size_t bytes) {
  if (t_holds.depth > 0) {
    t_holds.held.push_back({d, ptr, s, bytes});
    return;
  }
  free_now(d, ptr, s, bytes);
}

void device_copy(void* dst, Device dd, const void* src, Device sd, size_t bytes, StreamHandle s) {
  if (bytes == 0) return;
  const cudaMemcpyKind kind = dd.is_host() ? (sd.is_host() ? cudaMemcpyHostToHost : cudaMemcpyDeviceToHost)
                                           : (sd.is_host() ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToDevice);
  const Device d = dd.is_host() ? sd : dd;
  check(cudaMemcpyAsync(dst, src, bytes, kind, st(s)), "cudaMemcpyAsync", d);
  if (dd.is_host() || sd.is_host()) check(cudaStreamSynchronize(st(s)), "cudaStreamSynchronize", d);
}

void device_zero(Device d, void* p, size_t bytes, StreamHandle s) {
  if (bytes) check(cudaMemsetAsync(p, 0, bytes, st(s)), "cudaMemsetAsync", d);
}

namespace {
// `waiter` waits (on the GPU) for what `recorded` has issued so far.
void order(Device d, cudaStream_t recorded, cudaStream_t waiter) {
  cudaEvent_t e = nullptr;
  check(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreate", d);
  cudaError_t r = cudaEventRecord(e, recorded);
  if (r == cudaSuccess) r = cudaStreamWaitEvent(waiter, e, 0);
  cudaEventDestroy(e);  // (released once the wait is done)
  check(r, "cudaEventRecord / cudaStreamWaitEvent", d);
}
}  // namespace

void default_stream_after(Device d, StreamHandle s) {
  if (s) order(d, st(s), nullptr);
}
void stream_after_default(Device d, StreamHandle s) {
  if (s) order(d, nullptr, st(s));
}

DeviceMemoryStats device_memory_stats(Device d) {
  Pool& p = Pools::get().of(d);
  DeviceMemoryStats out;
  out.in_use = p.in_use.load();
  out.peak_in_use = p.peak.load();
  uint64_t reserved = 0;
  check(cudaMemPoolGetAttribute(p.pool, cudaMemPoolAttrReservedMemCurrent, &reserved), "cudaMemPoolGetAttribute", d);
  out.reserved = static_cast<int64_t>(reserved);
  cudaMemPool_t scratch = nullptr;
  check(cudaDeviceGetDefaultMemPool(&scratch, d.index), "cudaDeviceGetDefaultMemPool", d);
  uint64_t used = 0, high = 0;
  check(cudaMemPoolGetAttribute(scratch, cudaMemPoolAttrUsedMemCurrent, &used), "cudaMemPoolGetAttribute", d);
  check(cudaMemPoolGetAttribute(scratch, cudaMemPoolAttrUsedMemHigh, &high), "cudaMemPoolGetAttribute", d);
  out.scratch_in_use = static_cast<int64_t>(used);
  out.scratch_peak = static_cast<int64_t>(high);
  return out;
}

namespace {

// Freed page-locked blocks by capacity (BlockCache.h), 1 GiB of them at most.
FreeBlocks<void (*)(void*)>& pinned_blocks() {
  // Never destroyed: tensors may outlive statics.
  static auto* c = new FreeBlocks<void (*)(void*)>(size_t{1} << 30, [](void* p) { cudaFreeHost(p); });
  return *c;
}

}  // namespace

void* pinned_alloc(size_t bytes, size_t* capacity) {
  static const bool gpu = [] {  // asked once: every staged op allocates here
    int n = 0;
    if (cudaGetDeviceCount(&n) == cudaSuccess && n > 0) return true;
    (void)cudaGetLastError();
    return false;
  }();
  if (!gpu) return nullptr;
  if (void* p = pinned_blocks().take(bytes, capacity)) return p;
  const size_t cap = std::max<size_t>(4096, (bytes + 4095) / 4096 * 4096);
  void* p = nullptr;
  if (cudaHostAlloc(&p, cap, cudaHostAllocPortable) != cudaSuccess) {
    (void)cudaGetLastError();
    return nullptr;
  }
  *capacity = cap;
  return p;
}
void pinned_free(void* p, size_t capacity) { pinned_blocks().give(p, capacity); }
PinnedStats pinned_stats() { return pinned_blocks().stats(); }

namespace {
// device_upload's page-locked blocks whose copies may not have run yet, each with the event recorded
// behind its copy: given back once that event has passed, looked at on every upload.
struct Staged {
  cudaEvent_t ev;
  void* block;
  size_t capacity;
};
std::mutex g_staged_mu;
std::vector<Staged>& staged_uploads() {
  static auto* v = new std::vector<Staged>;  // never destroyed: blocks may be in flight at exit
  return *v;
}
}  // namespace

void device_upload(void* dst, Device d, const void* src, size_t bytes, StreamHandle s) {
  if (bytes == 0) return;
  size_t cap = 0;
  void* block = pinned_alloc(bytes, &cap);
  if (!block) {  // pageable: the driver copies the bytes out before the call returns
    check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, st(s)), "cudaMemcpyAsync", d);
    return;
  }
  std::memcpy(block, src, bytes);
  cudaEvent_t ev = nullptr;
  cudaError_t e = cudaMemcpyAsync(dst, block, bytes, cudaMemcpyHostToDevice, st(s));
  if (e == cudaSuccess) e = cudaEventCreateWithFlags(&ev, cudaEventDisableTiming);
  if (e == cudaSuccess) e = cudaEventRecord(ev, st(s));
  if (e != cudaSuccess) {  // (nothing may be in flight from the block: wait, then give it back)
    (void)cudaStreamSynchronize(st(s));
    if (ev) cudaEventDestroy(ev);
    pinned_free(block, cap);
    check(e, "device_upload", d);
  }
  std::lock_guard<std::mutex> g(g_staged_mu);
  std::erase_if(staged_uploads(), [](const Staged& u) {
    const cudaError_t q = cudaEventQuery(u.ev);
    if (q == cudaErrorNotReady) {
      (void)cudaGetLastError();
      return false;
    }
    cudaEventDestroy(u.ev);
    pinned_free(u.block, u.capacity);
    return true;
  });
  staged_uploads().push_back({ev, block, cap});
}

void use_device(Device d) {
  int current = -1;
  if (cudaGetDevice(&current) == cudaSuccess && current == d.index) return;
  (void)cudaGetLastError();
  check(cudaSetDevice(d.index), "cudaSetDevice", d);
}

void reset_device_peak(Device d) {
  Pool& p = Pools::get().of(d);
  p.peak.store(p.in_use.load());
  cudaMemPool_t scratch = nullptr;
  check(cudaDeviceGetDefaultMemPool(&scratch, d.index), "cudaDeviceGetDefaultMemPool", d);
  uint64_t zero = 0;  // (the driver resets a high-water mark to the current use whatever is set)
  check(cudaMemPoolSetAttribute(scratch, cudaMemPoolAttrUsedMemHigh, &zero), "cudaMemPoolSetAttribute", d);
}

#else  // a build without CUDA

namespace {
[[noreturn]] void no_cuda(Device d) {
  throw DeviceError(fmt::format("{} was asked for, but this build has no CUDA backend (hint: build with "
                                "-DDHELIX_ENABLE_CUDA=ON, which scripts/setup does where nvcc is installed, or use "
                                "the cpu device)",
                                d.str()));
}
}  // namespace

bool cuda_built() { return false; }
std::string device_unavailable(Device d) {
  return d.is_host() ? "" : "this build has no CUDA backend (rebuild with -DDHELIX_ENABLE_CUDA=ON, which scripts/setup does "
                            "where nvcc is installed)";
}
void* device_alloc(Device d, size_t, StreamHandle) { no_cuda(d); }
void device_free(Device d, void*, StreamHandle, size_t) { no_cuda(d); }
// No device memory to hold: the calls only keep the nesting checked, as in a CUDA build.
namespace {
thread_local int t_hold_depth = 0;
}
void trim_device_pools(int) {}
void hold_device_frees() { ++t_hold_depth; }
void release_device_frees() {
  DHX_CHECK(t_hold_depth > 0, InternalError, "release_device_frees without a hold");
  --t_hold_depth;
}
size_t held_device_frees() { return 0; }
void device_copy(void*, Device dd, const void*, Device sd, size_t, StreamHandle) { no_cuda(dd.is_host() ? sd : dd); }
void device_zero(Device d, void*, size_t, StreamHandle) { no_cuda(d); }
void default_stream_after(Device d, StreamHandle) { no_cuda(d); }
void stream_after_default(Device d, StreamHandle) { no_cuda(d); }
DeviceMemoryStats device_memory_stats(Device d) { no_cuda(d); }
void reset_device_peak(Device d) { no_cuda(d); }
void use_device(Device d) { no_cuda(d); }
void* pinned_alloc(size_t, size_t*) { return nullptr; }
void pinned_free(void*, size_t) {}
PinnedStats pinned_stats() { return {}; }
void device_upload(void*, Device d, const void*, size_t, StreamHandle) { no_cuda(d); }

#endif

}  // namespace dhelix
