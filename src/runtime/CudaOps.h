// The op bindings of a GPU (CudaOps.cc): layer-program op codes -> kernels/cuda, for a CUDA build.
// kernel_registry(cuda:N) serves them. Not here: the CPU bindings (OpRegistry.h).
#pragma once
#include <string>
#include <vector>

#include "runtime/OpRegistry.h"

namespace dhelix {

#if DHELIX_HAVE_CUDA
// DeviceError naming the code (and what the GPU runs so far) when it has no GPU binding.
const OpFn& cuda_op(const std::string& code);
std::vector<std::string> cuda_op_codes();  // sorted
#endif

}  // namespace dhelix
