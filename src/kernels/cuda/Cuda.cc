// Error checks and the device probe (Cuda.h).
#include "kernels/cuda/Cuda.h"

#include <fmt/format.h>

#include <mutex>

#include "base/Error.h"
#include "tensor/DeviceMemory.h"

namespace dhelix::cuda {

void throw_device_error(const std::string& msg) { throw DeviceError(msg); }
void throw_internal_error(const std::string& msg) { throw InternalError(msg); }

void throw_cuda_error(cudaError_t e, const char* what, const char* file, int line) {
  throw DeviceError(fmt::format("CUDA error {} ({}) in {} at {}:{}", static_cast<int>(e), cudaGetErrorString(e), what,
                                file, line));
}

void throw_cublas_error(int status, const char* what, const char* file, int line) {
  throw DeviceError(fmt::format("cuBLAS error {} in {} at {}:{}", status, what, file, line));
}

void scratch_malloc(void** p, size_t bytes, cudaStream_t s) {
  cudaError_t e = cudaMallocAsync(p, bytes, s);
  if (e == cudaErrorMemoryAllocation) {
    (void)cudaGetLastError();
    int device = 0;
    DHX_CUDA(cudaGetDevice(&device));
    trim_device_pools(device);
    e = cudaMallocAsync(p, bytes, s);
  }
  if (e != cudaSuccess) {
    (void)cudaGetLastError();  // (an allocation's failure is not sticky: the next launch's check must not see it)
    throw_cuda_error(e,
                     cat("cudaMallocAsync (", bytes,
                         " bytes of kernel scratch; hint: a smaller micro-batch or activation recompute)")
                         .c_str(),
                     __FILE__, __LINE__);
  }
}

Probe probe() {
  static std::once_flag once;
  static Probe p;
  std::call_once(once, [] {
    int n = 0;
    const cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
      p.why_none = fmt::format("the CUDA runtime found no usable driver or device ({}: {})", cudaGetErrorName(e),
                               cudaGetErrorString(e));
      (void)cudaGetLastError();  // clear the sticky-free error so later calls start clean
      return;
    }
    p.devices = n;
    if (n == 0) p.why_none = "the CUDA driver reports no device";
  });
  return p;
}

void require_device(int index) {
  const Probe p = probe();
  DHX_CHECK(p.devices > 0, DeviceError, "cuda:{} was asked for, but this machine has no GPU: {} (hint: run on a "
            "machine with an NVIDIA GPU, or set the device to cpu)", index, p.why_none);
  DHX_CHECK(index >= 0 && index < p.devices, DeviceError, "cuda:{} was asked for, but this machine has {} GPU(s) "
            "(cuda:0..cuda:{})", index, p.devices, p.devices - 1);
}

DeviceInfo device_info(int index) {
  require_device(index);
  cudaDeviceProp prop{};
  DHX_CUDA(cudaGetDeviceProperties(&prop, index));
  DeviceInfo d;
  d.name = prop.name;
  d.sms = prop.multiProcessorCount;
  d.cc_major = prop.major;
  d.cc_minor = prop.minor;
  d.global_bytes = static_cast<int64_t>(prop.totalGlobalMem);
  d.l2_bytes = prop.l2CacheSize;
  d.smem_per_block_optin = static_cast<int64_t>(prop.sharedMemPerBlockOptin);
  return d;
}

}  // namespace dhelix::cuda
