// The host's kernel registry over OpRegistry.cc's CPU bindings (see KernelRegistry.h).
#include "runtime/KernelRegistry.h"

#include "runtime/CudaOps.h"

#include "base/Error.h"

namespace dhelix {
namespace {

class CpuKernels final : public KernelRegistry {
 public:
  Device device() const override { return Device::host(); }
  const OpFn& find(const std::string& code) const override { return lookup_op(code); }
  std::vector<std::string> codes() const override { return op_codes(); }
};

#if DHELIX_HAVE_CUDA
class CudaKernels final : public KernelRegistry {
 public:
  Device device() const override { return Device::cuda(0); }
  const OpFn& find(const std::string& code) const override { return cuda_op(code); }
  std::vector<std::string> codes() const override { return cuda_op_codes(); }
};
#endif

}  // namespace

const KernelRegistry& kernel_registry(Device d) {
#if DHELIX_HAVE_CUDA
  if (!d.is_host()) {
    static const CudaKernels gpu;  // every cuda:N binds the same kernels (the GPU is checked by make_stream)
    return gpu;
  }
#else
  DHX_CHECK(d.is_host(), DeviceError,
            "no kernels for device {} in this build (configure with -DDHELIX_ENABLE_CUDA=ON on a machine with the "
            "CUDA toolkit); run on cpu",
            d.str());
#endif
  static const CpuKernels cpu;
  return cpu;
}

}  // namespace dhelix
