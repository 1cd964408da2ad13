// The GPU step's non-GEMM, non-attention kernels of GPT-2 and Llama, the twins of kernels/cpu's
// (same formulas, same summation orders where they decide bits): embedding, LayerNorm, RMSNorm,
// GELU, SwiGLU, RoPE, residual adds and casts, fused softmax cross-entropy, AdamW and the sum of
// squares behind the global gradient norm. Not here: GEMMs (Gemm.h), attention, MoE (Moe.h).
//
// Precision (llm.c's mixed precision): activations and their gradients bf16; norm weights and
// biases fp32 (master parameters); statistics (mean, rstd, losses) fp32; parameter gradients fp32
// and ACCUMULATED (+=); math in fp32, every bf16 output rounded once. Every kernel is deterministic
// (fixed summation orders, no floating-point atomics) and runs on the stream it is given, never
// synchronising. A bad size or argument is a caller's bug: InternalError naming the op and values.
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>
#include <vector>

#include "kernels/cuda/Cuda.h"

namespace dhelix::cuda {

// ---- embedding ----
// y[B*T, C] = wte[tokens[bt]] (+ wpe[pos_offset + bt % T] when wpe is non-null; the sum in fp32,
// rounded once; without wpe a bitwise copy). tokens[B*T], wte[V, C], wpe[>= pos_offset + T, C].
// A token outside [0, V) cannot throw on the device: its row of y is NaN (loud, no stray read).
void embedding_fwd(const int32_t* tokens, const bf16* wte, const bf16* wpe, bf16* y, int64_t B, int64_t T, int64_t C,
                   int64_t V, int64_t pos_offset, cudaStream_t s);
// acc dwte[V, C] += the rows of dy[B*T, C] by token; acc dwpe[pos_offset + t] += sum_b dy[b*T + t]
// (when non-null). Every fp32 sum runs in the CPU twin's order, bt ascending, starting from the old
// value (a stable sort of the positions by token, then one block per distinct token): bitwise the
// CPU's sums. A token outside [0, V) adds nothing to dwte (its dy row still goes to dwpe).
// Scratch from the stream's memory pool.
void embedding_bwd(const int32_t* tokens, const bf16* dy, float* dwte, float* dwpe, int64_t B, int64_t T, int64_t C,
                   int64_t V, int64_t pos_offset, cudaStream_t s);
// Megatron's vocabulary-parallel embedding (tp > 1): wte[V, C] holds rows [v0, v0 + V) of the
// table; y[n] = wte[tokens[n] - v0], zeros for a token outside them (another rank's shard holds it;
// the tp group's reduce sums the shards' rows), as cpu's op_embed. The backward adds dy[n] to row
// tokens[n] - v0 for the tokens inside, in embedding_bwd's order (bitwise the CPU's sums).
void embedding_shard_fwd(const int32_t* tokens, const bf16* wte, bf16* y, int64_t N, int64_t C, int64_t V, int64_t v0,
                         cudaStream_t s);
void embedding_shard_bwd(const int32_t* tokens, const bf16* dy, float* dwte, int64_t N, int64_t C, int64_t V,
                         int64_t v0, cudaStream_t s);
// Learned positions on a sequence shard (sequence parallelism: rows [row0, row0 + rows) of the
// micro-batch's B*T): y[i] = e[i] + wpe[(row0 + i) mod T] (fp32 sum, rounded once; y may alias e);
// position_grad: dwpe[t] += dy[i] over the rows at position t, i ascending, onto the old value (the
// CPU twin's order).
void position_add(const bf16* e, const bf16* wpe, bf16* y, int64_t rows, int64_t C, int64_t T, int64_t row0,
                  cudaStream_t s);
void position_grad(const bf16* dy, float* dwpe, int64_t rows, int64_t C, int64_t T, int64_t row0, cudaStream_t s);

// ---- normalisation (one warp per row; parameter gradients in two fixed-order stages) ----
// The backward of a row that fits a lane's registers (C % 8 == 0, C <= 1024; RMSNorm C <= 2048) is
// one pass over x and dy (dx and the parameter gradients' partial sums by blocks of rows); other
// rows take a dx kernel, then the parameter gradients by column chunks (norm_param_grads).
// y[N,C] = (x - mean) rstd g + b (b may be null); mean[N], rstd[N] = 1/sqrt(var + eps) saved.
void layernorm_fwd(const bf16* x, const float* g, const float* b, bf16* y, float* mean, float* rstd, int64_t N,
                   int64_t C, float eps, cudaStream_t s);
// dx[N,C] written; acc dg[C] += sum_n dy xh, acc db[C] += sum_n dy (db may be null). add (null, or
// [N,C] bf16: the residual stream's gradient): dx = bf16(bf16(dx) + add), the bits of dx written and
// then add_inplace(dx, add), in the same pass (not aliasing dx).
void layernorm_bwd(const bf16* dy, const bf16* x, const float* g, const float* mean, const float* rstd, bf16* dx,
                   float* dg, float* db, int64_t N, int64_t C, cudaStream_t s, const bf16* add = nullptr);
// y[N,C] = x rstd g, rstd[N] = 1/sqrt(mean(x^2) + eps) saved.
void rmsnorm_fwd(const bf16* x, const float* g, bf16* y, float* rstd, int64_t N, int64_t C, float eps,
                 cudaStream_t s);
// dx[N,C] written; acc dg[C] += sum_n dy x rstd. add: as layernorm_bwd's.
void rmsnorm_bwd(const bf16* dy, const bf16* x, const float* g, const float* rstd, bf16* dx, float* dg, int64_t N,
                 int64_t C, cudaStream_t s, const bf16* add = nullptr);
// The parameter gradients of either backward alone, the same two stages and sums: dg += sum_n dy xh
// (LayerNorm, xh = (x - mean) rstd, and db += sum_n dy) or dg += sum_n dy x rstd (RMSNorm: layer
// false; mean and db unused). The 3D grid's split norms (below) take their dx from the all-reduced
// statistics and these gradients from here.
void norm_param_grads(const bf16* dy, const bf16* x, const float* mean, const float* rstd, float* dg, float* db,
                      int64_t N, int64_t C, bool layer, cudaStream_t s);
// Either backward in the two-kernel form for every row width (layer: LayerNorm, else RMSNorm with
// mean and db unused): the kernel bench's comparison with the fused pass, tested as the others.
void norm_bwd_two_kernel(const bf16* dy, const bf16* x, const float* g, const float* mean, const float* rstd,
                         bf16* dx, float* dg, float* db, int64_t N, int64_t C, bool layer, cudaStream_t s,
                         const bf16* add = nullptr);

// ---- AxoNN's 3D grid: norms split around an all-reduce over x (runtime/Ops3D.cc's twins, one warp
// per row, the row's sums in double by the warp's fixed butterfly) ----
// Per row over this rank's C features: LayerNorm st[N, 2] = (sum x, sum x^2), RMSNorm (rms) st[N] =
// sum x^2.
void grid_norm_stats(const bf16* x, double* st, int64_t N, int64_t C, bool rms, cudaStream_t s);
// From the statistics all-reduced over x, for Cf features in all: mean = S / Cf, var = max(0, SS /
// Cf - mean^2), rstd = 1 / sqrt(var + eps) in double, rounded to fp32 (saved); y = (x - mean) rstd g
// + b in fp32, rounded once. RMSNorm: rstd = (SS / Cf + eps)^(-1/2), y = x rstd g.
void grid_ln_apply(const bf16* x, const double* st, const float* g, const float* b, bf16* y, float* mean, float* rstd,
                   int64_t N, int64_t C, double Cf, double eps, cudaStream_t s);
void grid_rms_apply(const bf16* x, const double* st, const float* g, bf16* y, float* rstd, int64_t N, int64_t C,
                    double Cf, double eps, cudaStream_t s);
// Backward statistics per row in double: LayerNorm st[N, 2] = (sum dy g, sum dy g xh), xh = (x -
// mean) rstd; RMSNorm st[N] = sum dy g x.
void grid_ln_bwd_stats(const bf16* dy, const bf16* x, const float* mean, const float* rstd, const float* g, double* st,
                       int64_t N, int64_t C, cudaStream_t s);
void grid_rms_bwd_stats(const bf16* dy, const bf16* x, const float* g, double* st, int64_t N, int64_t C,
                        cudaStream_t s);
// dx from the all-reduced statistics (a, b = st / Cf in fp32): LayerNorm dx = rstd (dy g - a - xh b),
// RMSNorm dx = rstd dy g - x rstd^3 a, plus `residual` when non-null (fp32 sum, rounded once); and
// the parameter gradients of this rank's rows (norm_param_grads).
void grid_ln_bwd_apply(const bf16* dy, const bf16* x, const float* mean, const float* rstd, const double* st,
                       const float* g, const bf16* residual, bf16* dx, float* dg, float* db, int64_t N, int64_t C,
                       double Cf, cudaStream_t s);
void grid_rms_bwd_apply(const bf16* dy, const bf16* x, const float* rstd, const double* st, const float* g,
                        const bf16* residual, bf16* dx, float* dg, int64_t N, int64_t C, double Cf, cudaStream_t s);
// y[N, C] = x + bias[C] (bias fp32; the sum in fp32, rounded once). y may alias x.
void bias_add(const bf16* x, const float* bias, bf16* y, int64_t N, int64_t C, cudaStream_t s);

// ---- activations (pointwise, bf16 in and out) ----
// GELU, tanh form (GPT-2): y = 0.5 x (1 + tanh(sqrt(2/pi)(x + 0.044715 x^3))).
void gelu_fwd(const bf16* x, bf16* y, int64_t n, cudaStream_t s);
void gelu_bwd(const bf16* dy, const bf16* x, bf16* dx, int64_t n, cudaStream_t s);  // dx written
// SwiGLU: gu[N, 2F] holds gate in columns [0, F) and up in [F, 2F); y[N, F] = silu(gate) up.
void swiglu_fwd(const bf16* gu, bf16* y, int64_t N, int64_t F, cudaStream_t s);
void swiglu_bwd(const bf16* dy, const bf16* gu, bf16* dgu, int64_t N, int64_t F, cudaStream_t s);  // dgu written
// Rotary embeddings, Hugging Face rotate_half pairs (i, i + D/2) rotated by (pos_offset + t) *
// theta^(-2i/D), in place on x viewed as [B, T, row_stride] with head h at column h*D (cos and sin
// in double, rounded to fp32, as cpu::rope_fwd). rope_bwd is the inverse rotation.
void rope_fwd(bf16* x, int64_t B, int64_t T, int64_t H, int64_t D, int64_t row_stride, int64_t pos_offset,
              double theta, cudaStream_t s);
void rope_bwd(bf16* dx, int64_t B, int64_t T, int64_t H, int64_t D, int64_t row_stride, int64_t pos_offset,
              double theta, cudaStream_t s);

// ---- elementwise ----
void add(const bf16* a, const bf16* b, bf16* y, int64_t n, cudaStream_t s);  // y = a + b (may alias a or b)
void add_inplace(bf16* y, const bf16* x, int64_t n, cudaStream_t s);         // y += x
void add_inplace(float* y, const float* x, int64_t n, cudaStream_t s);       // y += x in fp32 (a tied table's two gradients)
// y[N,C] = a + b + bias[C] (bias fp32, broadcast over rows; the sum in fp32, rounded once). y may
// alias a or b. The row-parallel linear's bias, added with the residual (cpu::add_bias).
void add_bias(const bf16* a, const bf16* b, const float* bias, bf16* y, int64_t N, int64_t C, cudaStream_t s);
void cast_f32_to_bf16(const float* x, bf16* y, int64_t n, cudaStream_t s);   // round to nearest even
// y[N, cols] (row stride ldy) = the first `cols` columns of x's rows (row stride ldx): a strided
// device copy (context parallelism's keys and values out of the packed qkv rows).
void copy_cols(const bf16* x, int64_t ldx, bf16* y, int64_t ldy, int64_t N, int64_t cols, cudaStream_t s);
// Context parallelism's last backward step (cpu op_cp_ring_bwd_finish), rounded to bf16: dqkv[N, W]
// = dq's first q_cols columns (fp32 [N, W]), then own + came (fp32 [N, W - q_cols]: this rank's share
// of its keys' dK/dV and the other ranks', which came round the ring).
void cp_ring_finish(const float* dq, const float* own, const float* came, bf16* dqkv, int64_t N, int64_t W,
                    int64_t q_cols, cudaStream_t s);
void cast_bf16_to_f32(const bf16* x, float* y, int64_t n, cudaStream_t s);   // exact
// out[0] (=|+=) sum_i x[i]^2 in double: a fixed grid of partial sums, then one block's fixed tree,
// so the same bits for the same n on every run and GPU. Accumulate::kYes adds to out[0]: the global
// gradient norm of several buffers is a sequence of calls on one stream (a fixed order). out is a
// device pointer; scratch from the stream's memory pool.
void sum_squares(const float* x, int64_t n, double* out, Accumulate acc, cudaStream_t s);
// Many sums of squares in two launches (the gradient norm's per-parameter parts: one sum_squares per
// parameter was two launches of 1024 + 1 blocks each, ~150 times a GPT-2 step, however small the
// parameter). For each item in order: out[slot] += sum_i x[i]^2 in double; items with one slot add
// in item order. Each item's sum has an order fixed by its n alone (chunks of kSumSquaresChunk
// elements from its start, each a block's fixed tree; the chunks' sums by a fixed warp tree), so
// the same bits for the same n on every run and GPU (not sum_squares' bits: another order). Items
// with n = 0 add nothing. out: device; x: device pointers.
struct SumSquaresItem {
  const float* x;
  int64_t n;
  int64_t slot;
};
constexpr int64_t kSumSquaresChunk = 65536;
void sum_squares_many(const std::vector<SumSquaresItem>& items, double* out, cudaStream_t s);

// ---- fused softmax cross-entropy (one block per row; probabilities never stored) ----
// losses[N] = logsumexp(logits[n,:]) - logits[n, targets[n]]; when dlogits is non-null also
// dlogits[N,V] = (softmax - onehot) * dloss (dloss the same for every row, e.g. 1/N), written;
// dlogits may alias logits. Targets < 0 are ignored (loss 0, gradient row 0). A target >= V cannot
// throw on the device: its loss and gradient row are NaN (loud, no stray read).
void cross_entropy_fwd_bwd(const bf16* logits, const int32_t* targets, float* losses, bf16* dlogits, float dloss,
                           int64_t N, int64_t V, cudaStream_t s);
// The same over rows of stride ld >= V (a padded LM head's logits [N, ld]; columns [V, ld) are not
// vocabulary: left out of the softmax, their dlogits written 0).
void cross_entropy_fwd_bwd_strided(const bf16* logits, const int32_t* targets, float* losses, bf16* dlogits,
                                   float dloss, int64_t N, int64_t V, int64_t ld, cudaStream_t s);
// The same with rows of 16-byte vectors (ld % 8 == 0, 2048 <= ld <= 57344, aligned) held in registers
// (one block of 1024 threads a row) instead of shared memory: the form before 2026-11-28, for the
// kernel bench's comparison; other rows as above.
void cross_entropy_rows_in_registers(const bf16* logits, const int32_t* targets, float* losses, bf16* dlogits,
                                     float dloss, int64_t N, int64_t V, int64_t ld, cudaStream_t s);

// ---- vocabulary-parallel cross-entropy (Megatron's, tp > 1: sharding/'s xent_max, xent_stats, xent_finish) ----
// This rank's logits are rows of stride ld whose first `valid` columns are vocabulary ids
// [v0, v0 + valid) (the rest: the padded head's rows, or a shard past the vocabulary: valid 0).
// One block per row, fixed reduction orders (the same bits on every run). Between the steps the
// caller reduces m over the tensor-parallel group (max) and stats (sum), as the CPU ops do.
// m[n] = max of the row's valid logits (-inf when none).
void xent_row_max(const bf16* logits, float* m, int64_t N, int64_t valid, int64_t ld, cudaStream_t s);
// stats[2n] = sum_v e^(x_v - m[n]) over the valid columns (m: the group's max), stats[2n+1] = the
// target's logit when targets[n] is in [v0, v0 + valid), else 0.
void xent_row_stats(const bf16* logits, const int32_t* targets, const float* m, float* stats, int64_t N,
                    int64_t valid, int64_t ld, int64_t v0, cudaStream_t s);
// losses[n] = log(S) + m[n] - t (S, t: the group's summed stats), and dlogits (may alias logits)
// = e^(x - m) / S * dloss, minus dloss at the target's column; columns [valid, ld) written 0. As
// cross_entropy_fwd_bwd: a target < 0 is ignored (loss 0, gradient row 0), one not below `vocab`
// (the whole vocabulary) gives a NaN loss and gradient row (loud: a kernel cannot throw).
void xent_row_finish(const bf16* logits, const int32_t* targets, const float* m, const float* stats, float* losses,
                     bf16* dlogits, float dloss, int64_t N, int64_t valid, int64_t ld, int64_t v0, int64_t vocab,
                     cudaStream_t s);

// ---- optimizer ----
// cpu::AdamWParams' fields (kernels/cuda does not see kernels/cpu's headers).
struct AdamWParams {
  double lr, beta1, beta2, eps, weight_decay;
  int64_t step;  // 1-based, for bias correction
};
// One launch over n fp32 parameters, cpu::adamw_step's formula with g := g * grad_scale first
// (clipping): p *= 1 - lr wd; m += (1 - b1)(g - m); v = b2 v + (1 - b2) g^2;
// p -= (lr / (1 - b1^t)) m / (sqrt(v) / sqrt(1 - b2^t) + eps); scalars formed in double, rounded to
// fp32 once. p_bf16[n] (the step's bf16 copy of the weights), when non-null, = bf16(new p).
void adamw_step(float* p, const float* g, float* m, float* v, bf16* p_bf16, int64_t n, const AdamWParams& a,
                float grad_scale, cudaStream_t s);
// Many runs of parameters updated alike, in few launches (the optimizer's runs alternate between
// weights, decayed, and biases and norms, not: ~100 launches a GPT-2 step, most over a few thousand
// elements). Each run: adamw_step(p, g, m, v, p_bf16, n, a with weight_decay 0 unless decay,
// grad_scale) -- the same bits element for element (both use one adamw_one). Runs of at least
// kAdamWManyAlone elements are launched alone (adamw_step's 16-byte accesses); the rest share one
// launch per batch of up to 256 runs, passed by value.
struct AdamWRun {
  float* p;
  const float* g;
  float* m;
  float* v;
  bf16* p_bf16;  // may be null
  int64_t n;
  bool decay;
};
constexpr int64_t kAdamWManyAlone = 65536;
void adamw_step_many(const std::vector<AdamWRun>& runs, const AdamWParams& a, float grad_scale, cudaStream_t s);

}  // namespace dhelix::cuda

// ---- helpers shared by the .cu files of these kernels (device code: nvcc only) ----
#ifdef __CUDACC__
namespace dhelix::cuda::ops_detail {

// W consecutive bf16 in one load or store: 16 bytes for W = 8 (callers use W = 8 only when every
// pointer is 16-byte aligned and every row length a multiple of 8), 2 bytes for W = 1.
template <int W> struct alignas(2 * W) BfVec {
  bf16 v[W];
};
inline bool aligned16(const void* p) { return p == nullptr || reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// Blocks for a grid-stride loop over `units`: enough to fill the GPU, never more than the units.
inline unsigned stride_grid(int64_t units, int threads) {
  const int64_t b = cdiv(units, threads);
  return static_cast<unsigned>(b < 1 ? 1 : b > (int64_t{1} << 20) ? (int64_t{1} << 20) : b);
}

// The owner of chunk b in a batch whose item k has chunks [chunk0[k], chunk0[k + 1]) (chunk0
// strictly increasing, items >= 1, chunk0[0] <= b < chunk0[items]): a binary search. The
// multi-tensor kernels (sum_squares_many, adamw_step_many) find a block's item with it.
__device__ __forceinline__ int chunk_owner(const int64_t* chunk0, int items, int64_t b) {
  int lo = 0, hi = items;
  while (hi - lo > 1) {
    const int mid = (lo + hi) / 2;
    if (chunk0[mid] <= b) lo = mid;
    else hi = mid;
  }
  return lo;
}

// Sum over a warp's 32 lanes, a fixed butterfly: every lane gets the same bits.
template <typename F> __device__ __forceinline__ F warp_sum(F v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Sum over a block (blockDim.x a multiple of 32): warp sums, then every warp folds the warps' sums
// with the same butterfly, so every thread returns the same bits. Safe to call again in a kernel.
template <typename F> __device__ F block_sum(F v) {
  __shared__ F warps[32];
  const int lane = threadIdx.x % 32, w = threadIdx.x / 32, nw = blockDim.x / 32;
  v = warp_sum(v);
  __syncthreads();  // an earlier call's readers are done with warps[]
  if (lane == 0) warps[w] = v;
  __syncthreads();
  return warp_sum(lane < nw ? warps[lane] : F(0));
}

// y[i] = f(a[i], b[i]) for i < n, bf16 in and out, f in fp32 (one rounding). W elements a thread
// per step; no __restrict__: y may alias a or b (each element is read before it is written, by the
// same thread).
template <int W, class Fn>
__global__ void map2_kernel(const bf16* a, const bf16* b, bf16* y, int64_t units, Fn f) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t u = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; u < units; u += stride) {
    const BfVec<W> va = reinterpret_cast<const BfVec<W>*>(a)[u], vb = reinterpret_cast<const BfVec<W>*>(b)[u];
    BfVec<W> vy;
#pragma unroll
    for (int j = 0; j < W; ++j) vy.v[j] = __float2bfloat16(f(__bfloat162float(va.v[j]), __bfloat162float(vb.v[j])));
    reinterpret_cast<BfVec<W>*>(y)[u] = vy;
  }
}
template <class Fn> void map2(const char* what, const bf16* a, const bf16* b, bf16* y, int64_t n, Fn f, cudaStream_t s) {
  DHX_CUDA_ASSERT(n >= 0, what, ": n=", n, " is negative");
  if (n == 0) return;
  constexpr int kThreads = 256;
  if (n % 8 == 0 && aligned16(a) && aligned16(b) && aligned16(y)) {
    map2_kernel<8><<<stride_grid(n / 8, kThreads), kThreads, 0, s>>>(a, b, y, n / 8, f);
  } else {
    map2_kernel<1><<<stride_grid(n, kThreads), kThreads, 0, s>>>(a, b, y, n, f);
  }
  DHX_CUDA_LAUNCHED(map2_kernel);
}

}  // namespace dhelix::cuda::ops_detail
#endif
