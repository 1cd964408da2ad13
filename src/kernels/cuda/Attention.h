// Causal self-attention with grouped-query heads on the GPU, the twin of kernels/cpu's
// attention_fwd / attention_bwd (same layouts, same lse), FlashAttention-2 style on bf16 tensor
// cores (Attention.cu says the tiling and the costs). Head size D = 32, 64 or 128. Deterministic: no
// floating-point atomics, every sum in a fixed order. Not here: attention blocks without the causal
// mask and the ring steps of context parallelism (kernels/cpu's attention_block_*, later).
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/cuda/Cuda.h"

namespace dhelix::cuda {

// As cpu::AttnDims. q: [B, T, *] with head h at column h*D, row stride q_stride (elements); k, v
// likewise with Hkv heads (kv_stride); o and dout: [B, T, *] (o_stride). Query head h uses kv head
// h / (H / Hkv). Strides are multiples of 8 and the bf16 pointers 16-byte aligned (the kernels move
// rows in 16-byte pieces); q, k, v may be views into one packed qkv buffer [B, T, (H + 2 Hkv) D].
struct AttnShape {
  int64_t B, T, H, Hkv, D;
  int64_t q_stride, kv_stride, o_stride;
};

// o = softmax(scale q k^T, causal) v per head, bf16; lse[B, H, T] fp32, the log-sum-exp of each
// query's scaled scores, saved for the backward.
void attention_fwd(const bf16* q, const bf16* k, const bf16* v, bf16* o, float* lse, const AttnShape& s, float scale,
                   cudaStream_t st);

// dq (q_stride), dk, dv (kv_stride) are written (not accumulated), bf16; dout has o's layout, lse is
// the forward's. Scores are recomputed tile by tile from q, k and lse.
void attention_bwd(const bf16* q, const bf16* k, const bf16* v, const bf16* o, const float* lse, const bf16* dout,
                   bf16* dq, bf16* dk, bf16* dv, const AttnShape& s, float scale, cudaStream_t st);

}  // namespace dhelix::cuda
