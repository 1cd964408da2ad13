// Causal self-attention with grouped-query heads on the GPU, the twin of kernels/cpu's
// attention_fwd / attention_bwd (same layouts, same lse), FlashAttention-2 style on bf16 tensor
// cores (Attention.cu says the tiling and the costs). Head size D = 32, 64 or 128. Deterministic: no
// floating-point atomics, every sum in a fixed order. Also the blocks of context parallelism's ring
// (kernels/cpu's attention_block_* and attention_merge): Tq queries against Tk keys, with or without
// the causal mask, fp32 outputs merged or accumulated over the ring's steps.
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

// How the backward kernels (attention_bwd, attention_block_bwd) run. kHalves and kWholeTiles give
// the same bits (every element's sums in the same order): kHalves (the default since 2026-11-29,
// untimed) walks each 64-wide tile 32 queries (dK/dV) or keys (dQ) at a time, half the score
// registers, so that at D <= 64 two blocks of 8 warps fit an SM (128 registers a thread, where the
// whole-tile form takes 174 and fits one block: ptxas, sm_90a); kWholeTiles: the 64 at once (what
// ran before; the kernel bench's study row). kOrderedDq (2026-11-29, unrun on a GPU): no dQ kernel --
// the dK/dV kernel (in halves) adds each key tile's dS K to dQ in key-tile order, so S and dP are
// computed once (5 products where the others take 7); deterministic too, with other bits (dQ summed
// per key tile, dK and dV over the query tiles in another order). Process-wide (the tests and the
// kernel bench switch it).
enum class AttnBwdForm { kHalves, kWholeTiles, kOrderedDq };
void set_attention_bwd_form(AttnBwdForm f);
AttnBwdForm attention_bwd_form();

// A block of attention, as cpu::AttnBlock: per sequence b, Tq query rows (q at b q_bstride + t
// q_stride, o and dout likewise with o's strides) against Tk key rows (k, v at b kv_bstride + t
// kv_stride); lse[(b H + h) lse_stride + t]. causal: key j is seen by query i iff j <= i (Tq == Tk);
// else every key by every query. Strides in elements (multiples of 8), bf16 pointers 16-byte aligned.
struct AttnBlock {
  int64_t B, Tq, Tk, H, Hkv, D;
  int64_t q_stride, kv_stride, o_stride;
  int64_t q_bstride, kv_bstride, o_bstride;
  int64_t lse_stride;
  bool causal;
};

// The block's softmax-normalised output o (fp32, o's strides; 8-byte aligned) and its lse, written
// (a ring step's part, merged by attention_merge).
void attention_block_fwd(const bf16* q, const bf16* k, const bf16* v, float* o, float* lse, const AttnBlock& s,
                         float scale, cudaStream_t st);

// The block's share of the gradients, added (fp32) to dq (q's strides) and dk, dv (k's and v's):
// o, lse and dout are the whole softmax's (after every block was merged), so the shares of a row's
// blocks sum to its gradient. Each element is added to by one thread: the same bits on every run.
void attention_block_bwd(const bf16* q, const bf16* k, const bf16* v, const bf16* o, const float* lse,
                         const bf16* dout, float* dq, float* dk, float* dv, const AttnBlock& s, float scale,
                         cudaStream_t st);

// Online-softmax merge of a block's part into the running one (cpu::attention_merge), rows [B, Tq] x
// H heads: lse = log(e^lse + e^lse_blk), o = o e^(lse_old - lse) + o_blk e^(lse_blk - lse). o and
// o_blk share one layout (o_stride, o_bstride); lse and lse_blk have their own (b, h) row strides.
void attention_merge(float* o, float* lse, const float* o_blk, const float* lse_blk, int64_t B, int64_t Tq, int64_t H,
                     int64_t D, int64_t o_stride, int64_t o_bstride, int64_t lse_stride, int64_t blk_lse_stride,
                     cudaStream_t st);

}  // namespace dhelix::cuda
