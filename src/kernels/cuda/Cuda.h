// The CUDA backend's base: error checks that turn a failed CUDA, cuBLAS call or kernel launch into
// a DeviceError naming the call, and the probe that says whether this process can run on a GPU
// (and, when it cannot, why: no driver, no device, an index out of range). Every kernel of
// kernels/cuda takes its cudaStream_t and never synchronises the device; the bf16 type of the
// activations is __nv_bfloat16 (cuda_bf16.h, usable from host C++ too). This header is included by
// .cu files, which nvcc compiles: it does not include fmt (whose consteval format checks nvcc cannot
// evaluate); errors are built with cat() and thrown as DeviceError / InternalError by Cuda.cc.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <sstream>
#include <string>

namespace dhelix::cuda {

using bf16 = __nv_bfloat16;

// The pieces streamed into one string (nvcc-safe message building).
template <typename... A> std::string cat(const A&... a) {
  std::ostringstream os;
  (os << ... << a);
  return os.str();
}
[[noreturn]] void throw_device_error(const std::string& msg);    // base/Error.h's DeviceError
[[noreturn]] void throw_internal_error(const std::string& msg);  // InternalError: a caller's bug
#define DHX_CUDA_REQUIRE(cond, ...) \
  do {                              \
    if (!(cond)) [[unlikely]] ::dhelix::cuda::throw_device_error(::dhelix::cuda::cat(__VA_ARGS__)); \
  } while (0)
#define DHX_CUDA_ASSERT(cond, ...) \
  do {                             \
    if (!(cond)) [[unlikely]] ::dhelix::cuda::throw_internal_error(::dhelix::cuda::cat(__VA_ARGS__)); \
  } while (0)

[[noreturn]] void throw_cuda_error(cudaError_t e, const char* what, const char* file, int line);
[[noreturn]] void throw_cublas_error(int status, const char* what, const char* file, int line);

#define DHX_CUDA(call)                                                                  \
  do {                                                                                  \
    const cudaError_t dhx_e_ = (call);                                                  \
    if (dhx_e_ != cudaSuccess) ::dhelix::cuda::throw_cuda_error(dhx_e_, #call, __FILE__, __LINE__); \
  } while (0)
// After a kernel launch: the launch's own error (bad configuration, no kernel image).
#define DHX_CUDA_LAUNCHED(name) DHX_CUDA(cudaGetLastError())
#define DHX_CUBLAS(call)                                                                \
  do {                                                                                  \
    const int dhx_s_ = static_cast<int>(call);                                          \
    if (dhx_s_ != 0) ::dhelix::cuda::throw_cublas_error(dhx_s_, #call, __FILE__, __LINE__); \
  } while (0)

// A kernel's scratch: cudaMallocAsync's (the current device's default pool, ordered on s; give it
// back with cudaFreeAsync on s), but where that pool cannot have `bytes`, the device's pools first
// give their unused cached blocks back (tensor/DeviceMemory.h's trim_device_pools: the tensors'
// pool keeps every block freed into it) and it is tried once more; then DeviceError as DHX_CUDA's.
void scratch_malloc(void** p, size_t bytes, cudaStream_t s);
template <typename T> void scratch_malloc(T** p, size_t bytes, cudaStream_t s) {
  scratch_malloc(reinterpret_cast<void**>(p), bytes, s);
}

// What the probe found: how many GPUs this process sees, or why it sees none.
struct Probe {
  int devices = 0;
  std::string why_none;  // empty when devices > 0: "no CUDA driver (...)", "no CUDA device"
};
Probe probe();  // cached after the first call; never throws
// DeviceError unless GPU `index` exists: names the index, the count and the probe's reason.
void require_device(int index);

struct DeviceInfo {
  std::string name;
  int sms = 0, cc_major = 0, cc_minor = 0;
  int64_t global_bytes = 0, l2_bytes = 0, smem_per_block_optin = 0;
};
DeviceInfo device_info(int index);

// Whether a kernel writes its output or adds to it (no bare bools in signatures).
enum class Accumulate { kNo, kYes };

// ceil(a / b) for launch grids.
constexpr int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

}  // namespace dhelix::cuda
