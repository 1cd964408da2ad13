// KernelRegistry: the op kernels of one device, by op code (a layer program's Op::code). The
// executor binds its ops through the registry of its run's device; the CPU registry (the bindings
// of OpRegistry.cc) is one implementation, a CUDA build's is another. Not here: collectives (the
// executor issues those on process groups) and ordering (Stream.h).
#pragma once
#include <string>
#include <vector>

#include "runtime/OpRegistry.h"
#include "tensor/Device.h"

namespace dhelix {

class KernelRegistry {
 public:
  virtual ~KernelRegistry() = default;
  virtual Device device() const = 0;
  // InternalError naming the code when the device has no kernel for it.
  virtual const OpFn& find(const std::string& code) const = 0;
  virtual std::vector<std::string> codes() const = 0;  // sorted
};

// The registry of `d`: the host's, or DeviceError for a device this build has no kernels for.
const KernelRegistry& kernel_registry(Device d);

}  // namespace dhelix
