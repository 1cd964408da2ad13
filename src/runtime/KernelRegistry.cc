// The host's kernel registry over OpRegistry.cc's CPU bindings (see KernelRegistry.h).
#include "runtime/KernelRegistry.h"

#include "base/Error.h"

namespace dhelix {
namespace {

class CpuKernels final : public KernelRegistry {
 public:
  Device device() const override { return Device::host(); }
  const OpFn& find(const std::string& code) const override { return lookup_op(code); }
  std::vector<std::string> codes() const override { return op_codes(); }
};

}  // namespace

const KernelRegistry& kernel_registry(Device d) {
#if DHELIX_HAVE_CUDA
  // This build has the CUDA kernels (kernels/cuda) but the ops of a layer program are not bound to
  // them yet (issue 35's next step): say so rather than run anything on the host.
  DHX_CHECK(d.is_host(), DeviceError,
            "no op registry for device {} yet: this build has the CUDA kernels, but the executor's ops are bound "
            "to them in a later step; run on cpu",
            d.str());
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
