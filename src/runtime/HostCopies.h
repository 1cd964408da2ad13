// The host's copies of small GPU buffers in the middle of a step (CudaOps.cc's MoE ops: the
// routing's counts and statistics), made without the issuing thread waiting for a stream: with both
// strands issued by one thread, a wait for one stops the other's issue too. A CUDA build only.
#pragma once
#include <string>

#include "runtime/OpRegistry.h"

namespace dhelix {

#if DHELIX_HAVE_CUDA
// Starts the host mirror (UnitEnv::mirrors) of buffer `name`, written on the op's stream or waited
// for there: a page-locked copy behind the stream's work, the mirror's `ready` its event (pageable
// memory, where none can be had, makes it synchronous). Replaces a mirror of that name. Returns it.
const HostMirror& start_host_mirror(OpCall& c, const std::string& name);
// Input `i` of the op on the host, as dtype `dt` (InternalError otherwise): its mirror, waited for,
// or one made by a copy on the op's stream (UnitEnv::host_view).
const Tensor& host_input(OpCall& c, size_t i, DType dt);
#endif

}  // namespace dhelix
