// SM partitions as CUDA green contexts (SmPartition.h), through the driver's entry points looked up
// by the runtime.
#include "kernels/cuda/SmPartition.h"

#include <cuda.h>
#include <cudaTypedefs.h>
#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <mutex>
#include <string>

#include "base/Error.h"
#include "kernels/cuda/Cuda.h"
#include "tensor/DeviceMemory.h"

namespace dhelix::cuda {
namespace {

// The driver functions used here, as the driver of this machine provides them for the CUDA version
// this project was compiled against (so that CUdevResource's layout is the header's).
#define DHX_GREEN_FNS(X)                                                                              \
  X(cuDeviceGet) X(cuDeviceGetDevResource) X(cuDevSmResourceSplitByCount) X(cuDevResourceGenerateDesc) \
  X(cuGreenCtxCreate) X(cuGreenCtxDestroy) X(cuCtxFromGreenCtx) X(cuCtxPushCurrent) X(cuCtxPopCurrent) \
  X(cuCtxGetCurrent) X(cuGetErrorString)

// cuCtxSynchronize as the lookup at the compiled version returns it: from CUDA 13.0 the entry point
// takes the context (cuCtxSynchronize_v2; cudaTypedefs.h's _v13000), where cuda.h's declaration,
// which decltype would copy, still takes none -- called through that type it would read a garbage
// context (a review, 2026-11-29).
#if CUDA_VERSION >= 13000
using CtxSync = PFN_cuCtxSynchronize_v13000;
#else
using CtxSync = PFN_cuCtxSynchronize_v2000;
#endif

struct Driver {
#define DHX_GREEN_FIELD(f) decltype(&::f) f = nullptr;
  DHX_GREEN_FNS(DHX_GREEN_FIELD)
#undef DHX_GREEN_FIELD
  CtxSync ctx_sync = nullptr;
  std::string why;  // empty when every function was found
};

// Driver function `name` at the compiled CUDA version, or nullptr with *why saying why not.
void* entry_point(const char* name, std::string* why) {
  void* p = nullptr;
  cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
  const cudaError_t e = cudaGetDriverEntryPointByVersion(name, &p, CUDA_VERSION, cudaEnableDefault, &q);
  if (e == cudaSuccess && q == cudaDriverEntryPointSuccess && p) return p;
  (void)cudaGetLastError();
  *why = fmt::format("the CUDA driver has no {} for CUDA {}.{} ({}; green contexts came with CUDA 12.4)", name,
                     CUDA_VERSION / 1000, CUDA_VERSION % 1000 / 10,
                     e != cudaSuccess                                ? cudaGetErrorString(e)
                     : q == cudaDriverEntryPointVersionNotSufficent ? "driver too old"
                                                                     : "symbol not found");
  return nullptr;
}

// The functions as far as found (why says what is missing); never throws.
const Driver& loaded() {
  static std::once_flag once;
  static Driver d;
  std::call_once(once, [] {
#define DHX_GREEN_LOAD(f) \
  if (d.why.empty()) d.f = reinterpret_cast<decltype(d.f)>(entry_point(#f, &d.why));
    DHX_GREEN_FNS(DHX_GREEN_LOAD)
#undef DHX_GREEN_LOAD
    if (d.why.empty()) d.ctx_sync = reinterpret_cast<CtxSync>(entry_point("cuCtxSynchronize", &d.why));
  });
  return d;
}

const Driver& driver() {
  const Driver& d = loaded();
  DHX_CHECK(d.why.empty(), DeviceError, "SM partitions: {}", d.why);
  return d;
}

void check(CUresult r, const char* what) {
  if (r == CUDA_SUCCESS) return;
  const char* s = nullptr;
  if (driver().cuGetErrorString) driver().cuGetErrorString(r, &s);
  throw DeviceError(fmt::format("SM partitions: {} failed: error {} ({})", what, static_cast<int>(r), s ? s : "?"));
}

// The live partitions' contexts and SM counts, so that a thread's current context says which
// partition it is in (the driver does not document what cuCtxGetDevResource reports for a context
// made by cuCtxFromGreenCtx; the split's own count is the one the partition was made with).
struct Live {
  std::mutex mu;
  std::map<CUcontext, int> sms;
};
Live& live() {
  static Live l;
  return l;
}

}  // namespace

int current_sm_count(int device) {
  const int whole = device_info(device).sms;
  const Driver& d = loaded();
  if (!d.why.empty()) return whole;
  CUcontext ctx = nullptr;
  if (d.cuCtxGetCurrent(&ctx) != CUDA_SUCCESS || !ctx) return whole;
  std::lock_guard<std::mutex> g(live().mu);
  const auto it = live().sms.find(ctx);
  return it == live().sms.end() ? whole : std::min(whole, it->second);
}

std::vector<std::unique_ptr<SmPartition>> SmPartition::split(int device, int parts) {
  require_device(device);
  DHX_CHECK(parts >= 1, ConfigError, "SM partitions: {} parts asked for; need at least 1", parts);
  const Driver& drv = driver();
  use_device(Device::cuda(device));
  DHX_CUDA(cudaFree(nullptr));  // the primary context exists before green contexts retain it
  CUdevice dev = 0;
  check(drv.cuDeviceGet(&dev, device), "cuDeviceGet");
  CUdevResource all{};
  check(drv.cuDeviceGetDevResource(dev, &all, CU_DEV_RESOURCE_TYPE_SM), "cuDeviceGetDevResource");
  const int total = static_cast<int>(all.sm.smCount);
  const int align = std::max(1, static_cast<int>(all.sm.smCoscheduledAlignment));
  const int least = std::max(1, static_cast<int>(all.sm.minSmPartitionSize));
  const int first = total / parts / align * align;
  DHX_CHECK(first >= least, DeviceError,
            "SM partitions: cuda:{} has {} SMs; {} parts of a multiple of {} SMs each leave {} per part, under the "
            "driver's minimum of {} (hint: fewer parts)", device, total, parts, align, first, least);
  std::vector<CUdevResource> groups(static_cast<size_t>(parts));
  unsigned n = 0;
  CUdevResource rest{};
  // The driver may round a group's count up past the reported alignment (cuda.h: on compute 9.0 a
  // multiple of 8, where a 132-SM H100's alignment may read smaller), so that `parts` groups no
  // longer fit: then a smaller count, one alignment step at a time, down to the minimum.
  int each = first;
  for (; each >= least; each -= align) {
    n = static_cast<unsigned>(parts);
    const CUresult r = drv.cuDevSmResourceSplitByCount(groups.data(), &n, &all, &rest, 0, static_cast<unsigned>(each));
    if (r == CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION) {  // (this count refused: the next smaller one)
      n = 0;
      continue;
    }
    check(r, "cuDevSmResourceSplitByCount");
    if (n == static_cast<unsigned>(parts)) break;
  }
  DHX_CHECK(n == static_cast<unsigned>(parts), DeviceError,
            "SM partitions: cuda:{} ({} SMs) split into {} groups, not the {} asked for, at every count from {} down "
            "to the driver's minimum of {} SMs a group (alignment {})", device, total, n, parts, first, least, align);
  std::vector<std::unique_ptr<SmPartition>> out;
  for (CUdevResource& g : groups) {
    CUdevResourceDesc desc = nullptr;
    check(drv.cuDevResourceGenerateDesc(&desc, &g, 1), "cuDevResourceGenerateDesc");
    CUgreenCtx green = nullptr;
    check(drv.cuGreenCtxCreate(&green, desc, dev, CU_GREEN_CTX_DEFAULT_STREAM), "cuGreenCtxCreate");
    CUcontext ctx = nullptr;
    const CUresult r = drv.cuCtxFromGreenCtx(&ctx, green);
    if (r != CUDA_SUCCESS) drv.cuGreenCtxDestroy(green);
    check(r, "cuCtxFromGreenCtx");
    out.push_back(std::unique_ptr<SmPartition>(new SmPartition(device, static_cast<int>(g.sm.smCount), green, ctx)));
    std::lock_guard<std::mutex> lock(live().mu);
    live().sms[ctx] = static_cast<int>(g.sm.smCount);
  }
  return out;
}

SmPartition::~SmPartition() {
  if (!green_) return;
  {
    std::lock_guard<std::mutex> g(live().mu);
    live().sms.erase(static_cast<CUcontext>(ctx_));
  }
  // The destroy does not wait: the work, stream destructions and stream-ordered frees issued in the
  // partition finish first.
  const Driver& drv = driver();
  if (drv.cuCtxPushCurrent(static_cast<CUcontext>(ctx_)) == CUDA_SUCCESS) {
#if CUDA_VERSION >= 13000
    (void)drv.ctx_sync(static_cast<CUcontext>(ctx_));  // (a converted green context: only its own work)
#else
    (void)drv.ctx_sync();
#endif
    CUcontext popped = nullptr;
    (void)drv.cuCtxPopCurrent(&popped);
  }
  drv.cuGreenCtxDestroy(static_cast<CUgreenCtx>(green_));
}

void SmPartition::enter() const { check(driver().cuCtxPushCurrent(static_cast<CUcontext>(ctx_)), "cuCtxPushCurrent"); }

std::string SmPartition::try_leave() const noexcept {
  CUcontext popped = nullptr;
  const CUresult r = driver().cuCtxPopCurrent(&popped);
  if (r != CUDA_SUCCESS) return fmt::format("cuCtxPopCurrent failed: error {}", static_cast<int>(r));
  if (popped != static_cast<CUcontext>(ctx_))
    return fmt::format("SM partition of cuda:{} ({} SMs) left on a thread where it was not the current context "
                       "(something replaced it: a bare cudaSetDevice, or another partition entered and not left)",
                       device_, sms_);
  return "";
}

void SmPartition::leave() const {
  const std::string why = try_leave();
  DHX_CHECK(why.empty(), InternalError, "{}", why);
}

SmPartitionScope::~SmPartitionScope() {
  if (!p_) return;
  const std::string why = p_->try_leave();
  if (!why.empty()) std::fprintf(stderr, "dhelix: leaving an SM partition: %s\n", why.c_str());
}

}  // namespace dhelix::cuda
