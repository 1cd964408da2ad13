// The op bindings of a GPU (CudaOps.cc): layer-program op codes -> kernels/cuda, for a CUDA build.
// kernel_registry(cuda:N) serves them. Not here: the CPU bindings (OpRegistry.h).
#pragma once
#include <string>
#include <vector>

#include "kernels/cpu/Kernels.h"
#include "runtime/OpRegistry.h"

namespace dhelix {

#if DHELIX_HAVE_CUDA
// DeviceError naming the code (and what the GPU runs so far) when it has no GPU binding.
const OpFn& cuda_op(const std::string& code);
std::vector<std::string> cuda_op_codes();  // sorted

// Context parallelism's ring steps on a GPU, the twins of cpu::ring_attention_fwd_step /
// ring_attention_bwd_step (the same RingDims, blocks and merge) that the ring_attention ops run:
// q rows of the packed qkv (bf16, r.q_stride), the travelling keys/values kv (bf16 [B Tl, 2 Hkv D]);
// o [B Tl, H D], lse [B, H, Tl], o_tmp / lse_tmp (o's and lse's shapes), dq (r.q_stride) and dkv
// (kv's layout) fp32. The backward reads the final o (bf16) and lse and adds to dq and dkv.
// Enqueued on `stream` (a cudaStream_t).
void cuda_ring_fwd_step(const cpu::RingDims& r, int step, const void* q, const void* kv, float* o, float* lse,
                        float* o_tmp, float* lse_tmp, float scale, void* stream);
void cuda_ring_bwd_step(const cpu::RingDims& r, int step, const void* q, const void* kv, const void* o,
                        const float* lse, const void* dout, float* dq, float* dkv, float scale, void* stream);
#endif

}  // namespace dhelix
