// Causal GQA attention on bf16 tensor cores (Attention.h), FlashAttention-2's algorithm with
// mma.sync.m16n8k16 (bf16 in, fp32 accumulate), operands by ldmatrix from shared tiles that cp.async
// fills one tile ahead. Not here: wgmma / TMA pipelines (a later speed-up).
// The same kernels run context parallelism's ring blocks (Attention.h's AttnBlock): templated on
// the mask (kCausal: Tq == Tk, the diagonal skipped as below; else every key tile, the last one's
// keys past Tk masked) and the outputs (bf16 written, or fp32 written by a block's forward and added
// to by its backward: each element by one thread, so the ring's sums need no atomics either).
//
// Tiling (shared rows padded by 8 bf16: ldmatrix and cp.async conflict-free; ragged rows past T
// zero-filled, then masked or never stored; tiles past the causal diagonal skipped per warp, the
// mask applied only on tiles that cross it):
//   forward  grid (T/128, H, B): 128 query rows per block (D=64: 4 warps x 32 rows, so each K/V
//            fragment feeds two mma; D=128: 8 warps x 16), Q fragments held in registers; 64-key
//            K, V tiles double-buffered; online softmax in fp32 on log2(e)-prescaled scores (exp2),
//            O = sum P V with P rounded to bf16, lse = max + log(sum) saved.
//   backward D_i = rowsum(dO * O) (fp32, one warp per row); then
//            grid (T/128, Hkv, B), 8 warps x 16 keys: per 128-key tile, over the group's H/Hkv
//            query heads and the 64-row query tiles at or after it, in that fixed order (Q, dO,
//            lse, D_i double-buffered): dV += P^T dO, dK += dS^T Q (fp32 registers);
//            grid (T/128, H, B), 8 warps x 16 queries, Q and dO fragments in registers, 64-key K, V
//            tiles double-buffered: dQ += dS K.
//            P = exp(scale S - lse) recomputed, dS = P (dP - D_i), P and dS rounded to bf16 for the
//            products. No atomics: every output element is summed by one thread in one order.
//            Since 2026-11-29 (untimed) both walk each 64-wide tile in halves of 32 (AttnBwdForm::
//            kHalves): half the score registers, 128 a thread at D = 64 (ptxas, sm_90a; 16 bytes
//            spilled in dK/dV) where whole tiles take 174-230, so two blocks (16 warps) share an SM
//            instead of one; 8 more ldmatrix.x4 per dK/dV step (the K, V fragments reloaded per half,
//            80 where whole tiles issue 72 for 128 mma). The same bits: each sum keeps its order.
//            The ordered-dQ form (AttnBwdForm::kOrderedDq, unrun on a GPU): no dQ kernel, 5 products
//            where the others take 7 (below, "kOrderedDq").
// FLOPs (causal, the masked half skipped up to the diagonal tiles): forward 2 products of
// B H T^2 D each = 2 B H T^2 D; backward 7 (S, dP twice, dV, dK, dQ) = 7 B H T^2 D. GPT-2 (B=16,
// T=1024, H=12, D=64): 25.8 GFLOP forward, 90 GFLOP backward.
// Bytes (one tensor [B, T, H, D] bf16 = 25.2 MB there): forward Q, O once, K, V once per 128-row
// query tile at or after theirs ((T/128 + 1) / 2 = 4.5 times on average): 2 + 2 * 4.5 = 11 tensors,
// most K/V re-reads from L2 (fewer with GQA: a kv head's tiles serve H/Hkv query heads); backward
// ~28 tensors (dK/dV pass: K, V, dK, dV once, Q, dO ~4.75 times each; dQ pass: Q, dO, dQ once, K, V
// 4.5 times each; D_i 2).
// Measured (H200, 2026-11-26, bench/gpu_kernels.cc) on the previous version (64 x 64 tiles, 4 warps,
// 32-bit fragment loads, no cp.async): GPT-2 B=16 forward 0.219 ms = 118 TFLOP/s, backward 0.723 ms
// = 89 TFLOP/s (the bench's count: causal halved, backward 2.5x forward); Llama-1B B=4 forward 111,
// backward 66 TFLOP/s. This version: not measured yet.
#include "kernels/cuda/Attention.h"

#include <atomic>
#include <climits>
#include <type_traits>
#include <utility>

namespace dhelix::cuda {

namespace {

constexpr int kBig = 128;   // query rows of a forward / dQ block; keys of a dK/dV block
constexpr int kSmall = 64;  // keys of a streamed K/V tile; query rows of a streamed Q/dO tile (dK/dV)
constexpr int kBwdThreads = 256;  // dK/dV and dQ: 8 warps of 16 rows each
constexpr int kPad = 8;     // bf16 per shared row past D: rows 16 B apart in banks (ldmatrix, cp.async conflict-free)
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

template <int D> constexpr int kLd = D + kPad;  // shared row stride (elements)
template <int D> constexpr size_t kRowBytes = sizeof(bf16) * kLd<D>;

// Forward: 16-row m-tiles per warp. D = 32, 64: 4 warps x 32 rows (each K/V fragment feeds 2 mma);
// D = 128: 8 warps x 16 rows (registers: acc alone is 64 fp32 per m-tile there).
template <int D> struct FwdCfg {
  static constexpr int kMT = D <= 64 ? 2 : 1;
  static constexpr int kThreads = 32 * kBig / (16 * kMT);
};

// ---- warp-level pieces of mma.sync.m16n8k16 (PTX ISA, "Matrix fragments for mma.m16n8k16") ----
// lane = 4 g + c (g = groupID 0..7, c = threadID_in_group 0..3). For a 16 x 16 A tile (row-major),
// registers a0..a3 hold the bf16 pairs (row g, cols 2c, 2c+1), (g+8, 2c..), (g, 2c+8..), (g+8, 2c+8..);
// for a 16 x 8 B tile, b0 = (k rows 2c, 2c+1; col g), b1 = (k rows 2c+8, 2c+9; col g); the fp32
// 16 x 8 C tile: c0, c1 = (row g, cols 2c, 2c+1), c2, c3 = (row g+8, cols 2c, 2c+1). In each pair the
// lower column (or k) is the lower 16 bits.
// ldmatrix.x4: lanes 8i..8i+7 give the row addresses of 8 x 8 matrix i, register i receives it in the
// same (row g, cols 2c, 2c+1) layout; .trans delivers (rows 2c, 2c+1; col g). So for a row-major
// shared tile X: A of rows r..r+15, cols k..k+15 = matrices (r, k), (r+8, k), (r, k+8), (r+8, k+8):
// lane row r + (lane & 15), col k + 8 (lane >> 4) [kLaneA]; B = X^T (rows of X are n), n-tiles n, n+8
// = matrices (n, k), (n, k+8), (n+8, k), (n+8, k+8): lane row n + (lane & 7) + 8 (lane >> 4), col
// k + 8 ((lane >> 3) & 1) [kLaneBt]; B = X (rows of X are k), .trans, n-tiles n, n+8 = matrices
// (k, n), (k+8, n), (k, n+8), (k+8, n+8): kLaneA's addresses.

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void mma(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], const bf16* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_u32(p)));
}
__device__ __forceinline__ void ldsm_x4_trans(uint32_t (&r)[4], const bf16* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_u32(p)));
}
// 16 bytes global -> shared, asynchronous; zero-filled where !valid (nothing read then).
__device__ __forceinline__ void cp_async16(bf16* dst, const bf16* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_u32(dst)), "l"(src),
               "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void cp_async4(float* dst, const float* src, bool valid) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(smem_u32(dst)), "l"(src), "r"(valid ? 4 : 0));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
// Waits for every cp.async group this thread committed (a __syncthreads then publishes them).
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_group 0;\n" ::: "memory"); }

__device__ __forceinline__ uint32_t pack(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);  // .x (lo) in the lower 16 bits
  return *reinterpret_cast<const uint32_t*>(&v);
}

// Per-lane element offsets into a shared tile for the two ldmatrix address patterns (above).
template <int D> __device__ __forceinline__ int lane_a(int lane) { return (lane & 15) * kLd<D> + (lane >> 4) * 8; }
template <int D> __device__ __forceinline__ int lane_bt(int lane) {
  return ((lane & 7) + ((lane >> 4) << 3)) * kLd<D> + ((lane >> 3) & 1) * 8;
}

// A fragments of rows a0..a0+15, all D columns, of the shared tile X: a[kk] is k-chunk kk.
template <int D>
__device__ __forceinline__ void load_a(uint32_t (&a)[D / 16][4], const bf16* X, int a0, int lane) {
  const bf16* p = X + a0 * kLd<D> + lane_a<D>(lane);
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) ldsm_x4(a[kk], p + kk * 16);
}

// s[mt][j] = A_mt X^T: MT m-tiles of 16 rows (A in registers, a[mt][kk]) against the first 8 NJ rows
// of the shared [., D] tile X, fp32 C fragments s[mt][j] (cols 8j..8j+7 = X's rows).
template <int D, int MT, int NJ = 8>
__device__ __forceinline__ void scores(float (&s)[MT][NJ][4], const uint32_t (&a)[MT][D / 16][4], const bf16* X,
                                       int lane) {
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int j = 0; j < NJ; ++j) s[mt][j][0] = s[mt][j][1] = s[mt][j][2] = s[mt][j][3] = 0.0f;
  const bf16* p = X + lane_bt<D>(lane);
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk)
#pragma unroll
    for (int jp = 0; jp < NJ / 2; ++jp) {
      uint32_t b[4];
      ldsm_x4(b, p + jp * 16 * kLd<D> + kk * 16);
      const uint32_t b0[2] = {b[0], b[1]}, b1[2] = {b[2], b[3]};
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        mma(s[mt][2 * jp], a[mt][kk], b0);
        mma(s[mt][2 * jp + 1], a[mt][kk], b1);
      }
    }
}

// The same with A = rows a0..a0+15 of the shared tile A (one m-tile, fragments loaded per k-chunk).
template <int D, int NJ = 8>
__device__ __forceinline__ void scores_smem_a(float (&s)[1][NJ][4], const bf16* A, int a0, const bf16* X, int lane) {
#pragma unroll
  for (int j = 0; j < NJ; ++j) s[0][j][0] = s[0][j][1] = s[0][j][2] = s[0][j][3] = 0.0f;
  const bf16* pa = A + a0 * kLd<D> + lane_a<D>(lane);
  const bf16* p = X + lane_bt<D>(lane);
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
    uint32_t a[4];
    ldsm_x4(a, pa + kk * 16);
#pragma unroll
    for (int jp = 0; jp < NJ / 2; ++jp) {
      uint32_t b[4];
      ldsm_x4(b, p + jp * 16 * kLd<D> + kk * 16);
      const uint32_t b0[2] = {b[0], b[1]}, b1[2] = {b[2], b[3]};
      mma(s[0][2 * jp], a, b0);
      mma(s[0][2 * jp + 1], a, b1);
    }
  }
}

// acc[mt][16, D] += bf16(p[mt][16, 16 NKK]) X[0..16 NKK, 0..D): p in C fragments (cols = X's rows)
// becomes the A operand in registers (C pair (row, 2c..) of tiles 2kk and 2kk+1 is A's pair (row, 2c..)
// and (row, 2c+8..) of k-chunk kk); X's fragments by ldmatrix.trans. Each acc element sums its
// products in k-chunk order, so two calls over X's rows [0, 32) and [32, 64) (NKK = 2) sum exactly
// as one over [0, 64) does.
template <int D, int MT, int NKK = 4>
__device__ __forceinline__ void accumulate(float (&acc)[MT][D / 8][4], const float (&p)[MT][2 * NKK][4], const bf16* X,
                                           int lane) {
  const bf16* base = X + lane_a<D>(lane);
#pragma unroll
  for (int kk = 0; kk < NKK; ++kk) {
    uint32_t a[MT][4];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
      a[mt][0] = pack(p[mt][2 * kk][0], p[mt][2 * kk][1]);
      a[mt][1] = pack(p[mt][2 * kk][2], p[mt][2 * kk][3]);
      a[mt][2] = pack(p[mt][2 * kk + 1][0], p[mt][2 * kk + 1][1]);
      a[mt][3] = pack(p[mt][2 * kk + 1][2], p[mt][2 * kk + 1][3]);
    }
#pragma unroll
    for (int dp = 0; dp < D / 16; ++dp) {
      uint32_t b[4];
      ldsm_x4_trans(b, base + kk * 16 * kLd<D> + dp * 16);
      const uint32_t b0[2] = {b[0], b[1]}, b1[2] = {b[2], b[3]};
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        mma(acc[mt][2 * dp], a[mt], b0);
        mma(acc[mt][2 * dp + 1], a[mt], b1);
      }
    }
  }
}

// Rows [0, rows) of an [R, D] tile from global (row stride `stride` elements, g at row 0, column 0 of
// the head) into shared X by cp.async, 16-byte pieces; rows past `rows` zero-filled. Not committed.
template <int D, int R, int kThreads>
__device__ __forceinline__ void load_tile(bf16* X, const bf16* __restrict__ g, int64_t stride, int rows) {
  constexpr int kPieces = D / 8;
  static_assert(R * kPieces % kThreads == 0);
#pragma unroll
  for (int it = 0; it < R * kPieces / kThreads; ++it) {
    const int i = it * kThreads + static_cast<int>(threadIdx.x), r = i / kPieces, c = (i % kPieces) * 8;
    const bool valid = r < rows;
    cp_async16(X + r * kLd<D> + c, g + (valid ? r : 0) * stride + c, valid);
  }
}

template <int MT, int N> __device__ __forceinline__ void zero(float (&x)[MT][N][4]) {
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int j = 0; j < N; ++j) x[mt][j][0] = x[mt][j][1] = x[mt][j][2] = x[mt][j][3] = 0.0f;
}

// One pair of output columns: bf16 written; fp32 written, or added to (kAdd: a ring step's share of a
// gradient accumulated onto the earlier steps').
template <bool kAdd> __device__ __forceinline__ void put2(bf16* p, float a, float b) {
  static_assert(!kAdd, "bf16 outputs are written, not accumulated");
  *reinterpret_cast<__nv_bfloat162*>(p) = __floats2bfloat162_rn(a, b);
}
template <bool kAdd> __device__ __forceinline__ void put2(float* p, float a, float b) {
  float2* q = reinterpret_cast<float2*>(p);
  if constexpr (kAdd) {
    const float2 o = *q;
    *q = make_float2(o.x + a, o.y + b);
  } else {
    *q = make_float2(a, b);
  }
}

// acc rows (g, g+8 of each 16-row m-tile from r0) scaled and stored (bf16: rounded) at row r of
// `out` (row stride `stride`, column 0 of the head) for rows before `rows`.
template <int D, int MT, bool kAdd = false, typename Out>
__device__ __forceinline__ void store_rows(Out* out, int64_t stride, const float (&acc)[MT][D / 8][4], int r0,
                                           int rows, float mul, int lane) {
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int r = r0 + 16 * mt + (lane >> 2) + 8 * i;
      if (r >= rows) continue;
      Out* row = out + r * stride + (lane & 3) * 2;
#pragma unroll
      for (int jd = 0; jd < D / 8; ++jd) put2<kAdd>(row + jd * 8, acc[mt][jd][2 * i] * mul, acc[mt][jd][2 * i + 1] * mul);
    }
}

// Masks a score tile in C fragments: element (mt, j, e) is row q0 + 16 mt + g + 8 (e / 2), column
// k0 + 8 j + 2 c + e % 2, set to -inf where drop(row, column).
template <int MT, int NJ, typename Drop>
__device__ __forceinline__ void mask_where(float (&s)[MT][NJ][4], int q0, int k0, int lane, Drop drop) {
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int j = 0; j < NJ; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e)
        if (drop(q0 + 16 * mt + (lane >> 2) + 8 * (e >> 1), k0 + 8 * j + 2 * (lane & 3) + (e & 1)))
          s[mt][j][e] = -INFINITY;
}
// The causal mask: keys after the query.
template <int MT, int NJ>
__device__ __forceinline__ void mask_after(float (&s)[MT][NJ][4], int q0, int k0, int lane) {
  mask_where(s, q0, k0, lane, [](int row, int col) { return col > row; });
}
// Keys past the block (a block without the causal mask, its last key tile ragged): columns >= Tk.
template <int MT, int NJ>
__device__ __forceinline__ void mask_keys_from(float (&s)[MT][NJ][4], int k0, int Tk, int lane) {
  mask_where(s, 0, k0, lane, [Tk](int, int col) { return col >= Tk; });
}

// ---- forward: grid (ceil(Tq/128), H, B), the query tiles with the most key tiles first ----
// Q [128, D] -> registers; K, V [64, D] tiles double-buffered in shared memory (cp.async tile j+1
// in flight while tile j is computed); one barrier per key tile. kCausal: the keys up to each query
// (Tq == Tk); else all Tk keys (a ring step's block).
template <int D, bool kCausal, typename Out>
__global__ void __launch_bounds__(FwdCfg<D>::kThreads)
    fwd_kernel(const bf16* __restrict__ q, const bf16* __restrict__ k, const bf16* __restrict__ v, Out* __restrict__ o,
               float* __restrict__ lse, AttnBlock s, float scale_log2) {
  constexpr int MT = FwdCfg<D>::kMT, kThreads = FwdCfg<D>::kThreads, kKV = kSmall * kLd<D>;
  extern __shared__ __align__(16) unsigned char smem[];
  bf16* Qs = reinterpret_cast<bf16*>(smem);  // [128, D]
  bf16* Ks = Qs + kBig * kLd<D>;             // [2][64, D]
  bf16* Vs = Ks + 2 * kKV;                   // [2][64, D]
  const int lane = threadIdx.x & 31, r0 = (threadIdx.x >> 5) * 16 * MT;
  const int Tq = static_cast<int>(s.Tq), Tk = static_cast<int>(s.Tk);
  const int qi = static_cast<int>(gridDim.x) - 1 - static_cast<int>(blockIdx.x);
  const int64_t h = blockIdx.y, b = blockIdx.z, hk = h / (s.H / s.Hkv);
  const int t0 = qi * kBig, rows = min(kBig, Tq - t0);
  // causal: the key tiles up to the one holding the last query; else every key tile
  const int kend = kCausal ? (t0 + rows - 1) / kSmall + 1 : (Tk + kSmall - 1) / kSmall;
  const bf16* kg = k + b * s.kv_bstride + hk * D;
  const bf16* vg = v + b * s.kv_bstride + hk * D;
  load_tile<D, kBig, kThreads>(Qs, q + b * s.q_bstride + t0 * s.q_stride + h * D, s.q_stride, rows);
  load_tile<D, kSmall, kThreads>(Ks, kg, s.kv_stride, min(kSmall, Tk));
  load_tile<D, kSmall, kThreads>(Vs, vg, s.kv_stride, min(kSmall, Tk));
  cp_async_commit();
  cp_async_wait_all();
  __syncthreads();
  uint32_t qf[MT][D / 16][4];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) load_a<D>(qf[mt], Qs, r0 + 16 * mt, lane);

  float m[MT][2], l[MT][2];  // rows g, g+8 of each m-tile: running max (scaled, log2 units), this lane's sum
  float acc[MT][D / 8][4];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) m[mt][0] = m[mt][1] = -INFINITY, l[mt][0] = l[mt][1] = 0.0f;
  zero(acc);
  const int wq0 = t0 + r0, wq1 = wq0 + 16 * MT - 1;  // the warp's first and last query
  for (int kj = 0; kj < kend; ++kj) {
    const int s0 = kj * kSmall, buf = kj & 1;
    cp_async_wait_all();
    __syncthreads();  // tile kj landed for every thread's pieces; every warp is done with tile kj - 1
    if (kj + 1 < kend) {  // into the buffer tile kj - 1 used
      const int s1 = s0 + kSmall;
      load_tile<D, kSmall, kThreads>(Ks + (buf ^ 1) * kKV, kg + s1 * s.kv_stride, s.kv_stride, min(kSmall, Tk - s1));
      load_tile<D, kSmall, kThreads>(Vs + (buf ^ 1) * kKV, vg + s1 * s.kv_stride, s.kv_stride, min(kSmall, Tk - s1));
      cp_async_commit();
    }
    if (kCausal && s0 > wq1) continue;  // every key after every query of this warp (the diagonal's far side)
    float sc[MT][8][4];
    scores<D, MT>(sc, qf, Ks + buf * kKV, lane);
    // Causal: keys past T sit only in a tile that also crosses the diagonal, where the mask drops
    // them for every query < T. Else the last tile's keys past Tk are masked. Rows past Tq are never
    // stored.
    if constexpr (kCausal) {
      if (s0 + kSmall - 1 > wq0) mask_after(sc, wq0, s0, lane);
    } else {
      if (s0 + kSmall > Tk) mask_keys_from(sc, s0, Tk, lane);
    }
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        float mx = -INFINITY;
#pragma unroll
        for (int j = 0; j < 8; ++j) mx = fmaxf(mx, fmaxf(sc[mt][j][2 * i], sc[mt][j][2 * i + 1]));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));  // the row's 4 lanes
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        const float m_new = fmaxf(m[mt][i], mx * scale_log2);
        const float base = m_new == -INFINITY ? 0.0f : m_new;  // a row with no key yet: all zeros, no NaN
        const float corr = exp2f(m[mt][i] - base);             // 0 on the row's first keys
        float sum = 0.0f;
#pragma unroll
        for (int j = 0; j < 8; ++j)
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            float& x = sc[mt][j][2 * i + e];
            x = exp2f(fmaf(x, scale_log2, -base));
            sum += x;
          }
        m[mt][i] = m_new;
        l[mt][i] = l[mt][i] * corr + sum;
#pragma unroll
        for (int jd = 0; jd < D / 8; ++jd) acc[mt][jd][2 * i] *= corr, acc[mt][jd][2 * i + 1] *= corr;
      }
    accumulate<D, MT>(acc, sc, Vs + buf * kKV, lane);
  }

#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      float li = l[mt][i];
      li += __shfl_xor_sync(0xffffffffu, li, 1);
      li += __shfl_xor_sync(0xffffffffu, li, 2);
      const float inv = 1.0f / li;
      const int r = r0 + 16 * mt + (lane >> 2) + 8 * i;
      if ((lane & 3) == 0 && r < rows) lse[(b * s.H + h) * s.lse_stride + t0 + r] = m[mt][i] * kLn2 + logf(li);
#pragma unroll
      for (int jd = 0; jd < D / 8; ++jd) acc[mt][jd][2 * i] *= inv, acc[mt][jd][2 * i + 1] *= inv;
    }
  store_rows<D, MT>(o + b * s.o_bstride + t0 * s.o_stride + h * D, s.o_stride, acc, r0, rows, 1.0f, lane);
}

// ---- backward ----
// Di[B, H, Tq] = sum_d dout * o (fp32), one warp per (b, h, t) in Di's order; lanes sum pairs, then a
// fixed butterfly.
template <int D>
__global__ void dot_kernel(const bf16* __restrict__ o, const bf16* __restrict__ dout, float* __restrict__ Di,
                           AttnBlock s) {
  const int64_t n = static_cast<int64_t>(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  if (n >= s.B * s.H * s.Tq) return;  // whole warps leave
  const int lane = threadIdx.x & 31;
  const int64_t t = n % s.Tq, h = (n / s.Tq) % s.H, b = n / (s.Tq * s.H);
  const int64_t off = b * s.o_bstride + t * s.o_stride + h * D;
  float sum = 0.0f;
  for (int c = lane * 2; c < D; c += 64) {
    const float2 x = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(o + off + c));
    const float2 y = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(dout + off + c));
    sum += x.x * y.x + x.y * y.y;
  }
#pragma unroll
  for (int w = 16; w > 0; w /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, w);
  if (lane == 0) Di[n] = sum;
}

// The backward kernels' forms (Attention.h's AttnBwdForm): each 64-wide tile in kSplit parts (1: whole;
// 2: halves), and the blocks an SM must fit (__launch_bounds__' minimum: two for halves at D <= 64,
// where 128 registers a thread hold a half's scores without spilling more than a few words).
template <int D, int kSplit> constexpr int kBwdMinBlocks = kSplit == 2 && D <= 64 ? 2 : 1;

// ---- kOrderedDq: dQ in the dK/dV kernel, each key tile's share added in key-tile order ----
// dQ of a 64-row query tile is the sum over key tiles of dS K. FlashAttention-2 adds each share
// with float atomics (bits vary run to run); here a key tile adds its share when the tiles before it
// have (a counter per (b, h, query tile)), as FlashAttention-3's deterministic backward orders its
// dQ: the same bits every run, S and dP computed once. A key tile waits only for lower blockIdx.x of
// its sequence, dispatched no later than it, so the waits end; one past ~4 s traps naming the tiles.
// Query tiles run from the last down (step_of): a sequence's key tiles reach each at the same step.
// The price: the fp32 dQ rows are read and written once per key tile (causal T = 1024: 4.5 T rows
// per (b, h), mostly L2 hits), then one rounding pass.
struct DqShares {
  float* dq = nullptr;           // fp32 [B, Tq, H D] scratch or, kAdd, the caller's dq
  int64_t stride = 0, bstride = 0;  // its row and sequence strides (elements)
  int* turn = nullptr;           // [B, H, ceil(Tq / 64)]: key tiles whose share of the query tile is in
  float mul = 1.0f;              // each share's factor: 1 into the scratch (scaled when rounded), else scale
  bool first_writes = false;     // key tile 0 writes its share (the scratch) instead of adding to it
};

constexpr int kLdS = kSmall + kPad;  // dSs row stride: 144 B, ldmatrix and the pair stores conflict-free

// Rows r0..r0+15 of the [128, 64] dS^T tile set to 0 (a warp whose keys all follow the query tile).
template <int kCols>
__device__ __forceinline__ void zero_rows(bf16* dSs, int r0, int lane) {
  constexpr int kPieces = kCols / 8;  // 16-byte pieces a row
#pragma unroll
  for (int i = lane; i < 16 * kPieces; i += 32)
    *reinterpret_cast<uint4*>(dSs + (r0 + i / kPieces) * kLdS + (i % kPieces) * 8) = make_uint4(0, 0, 0, 0);
}

// ds (C fragments of the warp's 16 keys from r0 against NJ 8-query n-tiles from column c0) rounded to
// bf16 into dS^T [keys, queries]: element (j, e) is key r0 + g + 8 (e / 2), query c0 + 8 j + 2 c + e % 2.
template <int NJ>
__device__ __forceinline__ void put_rows_t(bf16* dSs, const float (&ds)[1][NJ][4], int r0, int c0, int lane) {
  bf16* row = dSs + (r0 + (lane >> 2)) * kLdS + c0 + 2 * (lane & 3);
#pragma unroll
  for (int j = 0; j < NJ; ++j) {
    *reinterpret_cast<uint32_t*>(row + 8 * j) = pack(ds[0][j][0], ds[0][j][1]);
    *reinterpret_cast<uint32_t*>(row + 8 * kLdS + 8 * j) = pack(ds[0][j][2], ds[0][j][3]);
  }
}

__device__ __forceinline__ int load_acquire(const int* p) {
  int v;
  asm volatile("ld.acquire.gpu.global.b32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ uint64_t global_ns() {  // the GPU's global timer (ns)
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;\n" : "=l"(t));
  return t;
}
__device__ __forceinline__ void store_release(int* p, int v) {
  asm volatile("st.release.gpu.global.b32 [%0], %1;\n" ::"l"(p), "r"(v) : "memory");
}

// The block's dQ share of query tile `tile` (head h): dQ[64, D] += mul * dS[64, 128] K[128, D], dS
// from dSs (transposed as stored: ldmatrix.trans gives A's fragments), K from Ks. Warp w takes rows
// 16 (w % 4).. and columns (w / 4) D / 2..; the share is added once the tile's earlier key tiles
// have added theirs (turn == blockIdx.x), then the turn passes on. Every thread of the block calls it.
template <int D>
__device__ __forceinline__ void dq_share(const DqShares& dqs, const bf16* dSs, const bf16* Ks, const AttnBlock& s,
                                         int64_t b, int64_t h, int tile, int lane) {
  __syncthreads();  // every warp's rows of dS^T are in dSs
  const int w = static_cast<int>(threadIdx.x >> 5), mt = w & 3, c0 = (w >> 2) * (D / 2);
  float acc[D / 16][4];
#pragma unroll
  for (int j = 0; j < D / 16; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.0f;
  // A = dS rows 16 mt.. (queries), k-chunk kk = keys 16 kk..: stored at dSs row key, column query.
  const bf16* pa = dSs + ((lane & 7) + ((lane >> 4) << 3)) * kLdS + ((lane >> 3) & 1) * 8 + 16 * mt;
  const bf16* pb = Ks + lane_a<D>(lane) + c0;  // B = K (rows are k), .trans
#pragma unroll
  for (int kk = 0; kk < kBig / 16; ++kk) {
    uint32_t a[4];
    ldsm_x4_trans(a, pa + kk * 16 * kLdS);
#pragma unroll
    for (int dp = 0; dp < D / 32; ++dp) {
      uint32_t bb[4];
      ldsm_x4_trans(bb, pb + kk * 16 * kLd<D> + dp * 16);
      const uint32_t b0[2] = {bb[0], bb[1]}, b1[2] = {bb[2], bb[3]};
      mma(acc[2 * dp], a, b0);
      mma(acc[2 * dp + 1], a, b1);
    }
  }
  const int nqt_all = static_cast<int>((s.Tq + kSmall - 1) / kSmall);
  int* turn = dqs.turn + (b * s.H + h) * nqt_all + tile;
  const int mine = static_cast<int>(blockIdx.x);
  if (threadIdx.x == 0 && load_acquire(turn) != mine) {
    const uint64_t since = global_ns();
    while (load_acquire(turn) != mine) {
      if (global_ns() - since > 4000000000ull) {  // 4 s: the tile before never added its share
        printf("attention_bwd (ordered dQ): key tile %d of sequence %lld, head %lld waited 4 s for query tile %d's "
               "turn (at %d)\n",
               mine, static_cast<long long>(b), static_cast<long long>(h), tile, load_acquire(turn));
        __trap();
      }
      __nanosleep(64);
    }
  }
  __syncthreads();  // the earlier key tiles' shares are visible to every thread (acquire, then the barrier)
  const int Tq = static_cast<int>(s.Tq);
  const bool write = dqs.first_writes && mine == 0;
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int r = tile * kSmall + 16 * mt + (lane >> 2) + 8 * i;
    if (r >= Tq) continue;
    float* row = dqs.dq + b * dqs.bstride + r * dqs.stride + h * D + c0 + 2 * (lane & 3);
#pragma unroll
    for (int j = 0; j < D / 16; ++j) {
      float2* p = reinterpret_cast<float2*>(row + 8 * j);
      const float2 o = write ? make_float2(0.0f, 0.0f) : __ldcg(p);  // L2: another SM wrote it
      __stcg(p, make_float2(o.x + dqs.mul * acc[j][2 * i], o.y + dqs.mul * acc[j][2 * i + 1]));
    }
  }
  __syncthreads();  // every thread's adds are issued before the turn passes on (release: cumulative)
  if (threadIdx.x == 0) store_release(turn, mine + 1);
}

// dq [B, Tq, q_stride] bf16 = scale * the fp32 scratch [B, Tq, H D], 8 columns a thread.
__global__ void dq_round_kernel(const float* __restrict__ dq32, bf16* __restrict__ dq, int64_t n8, int64_t Tq,
                                int64_t HD, int64_t q_stride, int64_t q_bstride, float scale) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n8) return;
  const int64_t row = i / (HD / 8), c = (i % (HD / 8)) * 8, b = row / Tq, t = row % Tq;
  const float4 x = *reinterpret_cast<const float4*>(dq32 + row * HD + c);
  const float4 y = *reinterpret_cast<const float4*>(dq32 + row * HD + c + 4);
  uint4 out;
  out.x = pack(scale * x.x, scale * x.y);
  out.y = pack(scale * x.z, scale * x.w);
  out.z = pack(scale * y.x, scale * y.y);
  out.w = pack(scale * y.z, scale * y.w);
  *reinterpret_cast<uint4*>(dq + b * q_bstride + t * q_stride + c) = out;
}

// dK, dV of one 128-key tile: grid (ceil(Tk/128), Hkv, B), the tiles with the most work first. Each
// warp owns 16 keys (K, V fragments from shared memory); the block walks (query head of the group,
// 64-row query tile at or after the key tile -- every query tile without the causal mask), in that
// order, the Q, dO, lse, D_i tiles double-buffered: S^T = K Q^T, dP^T = V dO^T (keys x queries),
// P^T = exp(scale S^T - lse), dS^T = P^T (dP^T - D_i); dV += P^T dO, dK += dS^T Q (fp32 registers).
// dk, dv written (bf16) or, kAdd, added to (fp32). Each 64-row query tile in kSplit parts.
template <int D, bool kCausal, typename Out, bool kAdd, int kSplit, bool kOrderedDq>
__global__ void __launch_bounds__(kBwdThreads, kBwdMinBlocks<D, kSplit>)
    dkdv_kernel(const bf16* __restrict__ q, const bf16* __restrict__ k, const bf16* __restrict__ v,
                const bf16* __restrict__ dout, const float* __restrict__ lse, const float* __restrict__ Di,
                Out* __restrict__ dk, Out* __restrict__ dv, DqShares dqs, AttnBlock s, float scale_log2, float scale) {
  constexpr int kQ = kSmall * kLd<D>;
  extern __shared__ __align__(16) unsigned char smem[];
  bf16* Ks = reinterpret_cast<bf16*>(smem);  // [128, D]
  bf16* Vs = Ks + kBig * kLd<D>;             // [128, D]
  bf16* Qs = Vs + kBig * kLd<D>;             // [2][64, D]
  bf16* dOs = Qs + 2 * kQ;                   // [2][64, D]
  float* lse_s = reinterpret_cast<float*>(dOs + 2 * kQ);  // [2][64], natural log
  float* di_s = lse_s + 2 * kSmall;                       // [2][64]
  bf16* dSs = reinterpret_cast<bf16*>(di_s + 2 * kSmall);  // kOrderedDq: [128 keys, 64 queries] dS^T
  const int lane = threadIdx.x & 31, r0 = (threadIdx.x >> 5) * 16;
  const int Tq = static_cast<int>(s.Tq), Tk = static_cast<int>(s.Tk);
  const int64_t hk = blockIdx.y, b = blockIdx.z, G = s.H / s.Hkv;
  const int s0 = static_cast<int>(blockIdx.x) * kBig, keys = min(kBig, Tk - s0);
  // causal: the query tiles at or after the keys; else all
  const int qbeg = kCausal ? s0 / kSmall : 0, nqt = (Tq + kSmall - 1) / kSmall - qbeg;
  const int n_it = static_cast<int>(G) * nqt;
  // Step `it`'s query head and 64-row query tile: head hk G + it / nqt, tile qbeg + it % nqt; under
  // kOrderedDq the tiles from the last down, the group's heads within each (so every key tile of
  // the sequence reaches a given (head, tile) at the same step: no key tile runs ahead of another's
  // turn), which sums dK and dV in another order.
  auto step_of = [&](int it, int64_t& h, int& tile) {
    if constexpr (kOrderedDq) {
      h = hk * G + it % static_cast<int>(G);
      tile = qbeg + nqt - 1 - it / static_cast<int>(G);
    } else {
      h = hk * G + it / nqt;
      tile = qbeg + it % nqt;
    }
  };
  // Issues the loads of step `it` into buffer buf.
  auto issue = [&](int it, int buf) {
    int64_t h;
    int tile;
    step_of(it, h, tile);
    const int t0 = tile * kSmall, rows = min(kSmall, Tq - t0);
    load_tile<D, kSmall, kBwdThreads>(Qs + buf * kQ, q + b * s.q_bstride + t0 * s.q_stride + h * D, s.q_stride, rows);
    load_tile<D, kSmall, kBwdThreads>(dOs + buf * kQ, dout + b * s.o_bstride + t0 * s.o_stride + h * D, s.o_stride,
                                      rows);
    if (threadIdx.x < 2 * kSmall) {  // rows past Tq: lse = D_i = 0 (masked below)
      const int r = threadIdx.x & (kSmall - 1);
      const bool valid = r < rows;
      const int64_t row = t0 + (valid ? r : 0);
      if (threadIdx.x < kSmall) cp_async4(lse_s + buf * kSmall + r, lse + (b * s.H + h) * s.lse_stride + row, valid);
      else cp_async4(di_s + buf * kSmall + r, Di + (b * s.H + h) * s.Tq + row, valid);
    }
  };
  load_tile<D, kBig, kBwdThreads>(Ks, k + b * s.kv_bstride + s0 * s.kv_stride + hk * D, s.kv_stride, keys);
  load_tile<D, kBig, kBwdThreads>(Vs, v + b * s.kv_bstride + s0 * s.kv_stride + hk * D, s.kv_stride, keys);
  issue(0, 0);
  cp_async_commit();

  float dka[1][D / 8][4], dva[1][D / 8][4];
  zero(dka);
  zero(dva);
  const int wk0 = s0 + r0;  // the warp's first key
  for (int it = 0; it < n_it; ++it) {
    const int buf = it & 1;
    int64_t h;
    int tile;
    step_of(it, h, tile);
    const int t0 = tile * kSmall;
    cp_async_wait_all();
    __syncthreads();  // step it landed; every warp is done with step it - 1's buffer (and dSs)
    if (it + 1 < n_it) {
      issue(it + 1, buf ^ 1);
      cp_async_commit();
    }
    const bool skip = kCausal && t0 + kSmall - 1 < wk0;  // every query before every key of this warp
    if constexpr (!kOrderedDq) {
      if (skip) continue;
    }
    if (skip) {
      if constexpr (kOrderedDq) zero_rows<kSmall>(dSs, r0, lane);  // its rows of dS^T are 0 (the share needs every warp)
    } else {
      const bf16* Qb = Qs + buf * kQ;
      const bf16* dOb = dOs + buf * kQ;
      constexpr int QP = kSmall / kSplit, NJ = 8 / kSplit;  // a part's queries and their 8-column n-tiles
#pragma unroll
      for (int part = 0; part < kSplit; ++part) {
        const int tq = t0 + part * QP;
        const bf16* Qp = Qb + part * QP * kLd<D>;
        const bf16* dOp = dOb + part * QP * kLd<D>;
        float p[1][NJ][4], ds[1][NJ][4];
        scores_smem_a<D, NJ>(p, Ks, r0, Qp, lane);
        scores_smem_a<D, NJ>(ds, Vs, r0, dOp, lane);
        // Element (j, e): key wk0 + g + 8 (e / 2), query tq + 8 j + 2 c + e % 2. Masked (P = 0): queries
        // before the key (causal), and query rows past Tq (zero Q, dO, lse, D_i there: finite, so dS = 0
        // too). Keys past Tk (zero K, V rows) give rows of dK, dV that are never stored; the ordered
        // form masks them too (without the causal mask, where they are not masked already): their dS
        // rows enter dQ, and exp(-lse) of a zero score may overflow (inf x 0 = NaN).
        constexpr bool kMaskKeys = kOrderedDq && !kCausal;
        if ((kCausal && tq < wk0 + 15) || tq + QP > Tq || (kMaskKeys && wk0 + 16 > Tk)) {
#pragma unroll
          for (int j = 0; j < NJ; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
              const int key = wk0 + (lane >> 2) + 8 * (e >> 1), t = tq + 8 * j + 2 * (lane & 3) + (e & 1);
              if ((kCausal && t < key) || t >= Tq || (kMaskKeys && key >= Tk)) p[0][j][e] = -INFINITY;
            }
        }
        const float* lb = lse_s + buf * kSmall + part * QP + 2 * (lane & 3);
        const float* db = di_s + buf * kSmall + part * QP + 2 * (lane & 3);
#pragma unroll
        for (int j = 0; j < NJ; ++j) {
          const float2 ls = *reinterpret_cast<const float2*>(lb + 8 * j);
          const float2 dd = *reinterpret_cast<const float2*>(db + 8 * j);
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const float pe = exp2f(fmaf(p[0][j][e], scale_log2, -(e & 1 ? ls.y : ls.x) * kLog2e));
            p[0][j][e] = pe;
            ds[0][j][e] = pe * (ds[0][j][e] - (e & 1 ? dd.y : dd.x));
          }
        }
        accumulate<D, 1, NJ / 2>(dva, p, dOp, lane);
        accumulate<D, 1, NJ / 2>(dka, ds, Qp, lane);
        if constexpr (kOrderedDq) put_rows_t(dSs, ds, r0, part * QP, lane);  // the same bf16 dS as dK's
      }
    }
    if constexpr (kOrderedDq) dq_share<D>(dqs, dSs, Ks, s, b, h, tile, lane);
  }
  store_rows<D, 1, kAdd>(dk + b * s.kv_bstride + s0 * s.kv_stride + hk * D, s.kv_stride, dka, r0, keys, scale, lane);
  store_rows<D, 1, kAdd>(dv + b * s.kv_bstride + s0 * s.kv_stride + hk * D, s.kv_stride, dva, r0, keys, 1.0f, lane);
}

// dQ of one 128-row query tile: grid (ceil(Tq/128), H, B), the tiles with the most key tiles first.
// Each warp owns 16 query rows (Q, dO fragments in registers); K, V [64, D] tiles double-buffered.
// Per key tile up to the diagonal (every key tile without the causal mask): S = Q K^T, dP = dO V^T,
// dS = P (dP - D_i); dQ += dS K. dq written (bf16) or, kAdd, added to (fp32). Each 64-key tile in
// kSplit parts.
template <int D, bool kCausal, typename Out, bool kAdd, int kSplit>
__global__ void __launch_bounds__(kBwdThreads, kBwdMinBlocks<D, kSplit>)
    dq_kernel(const bf16* __restrict__ q, const bf16* __restrict__ k, const bf16* __restrict__ v,
              const bf16* __restrict__ dout, const float* __restrict__ lse, const float* __restrict__ Di,
              Out* __restrict__ dq, AttnBlock s, float scale_log2, float scale) {
  constexpr int kKV = kSmall * kLd<D>;
  extern __shared__ __align__(16) unsigned char smem[];
  bf16* Qs = reinterpret_cast<bf16*>(smem);  // [128, D]
  bf16* dOs = Qs + kBig * kLd<D>;            // [128, D]
  bf16* Ks = dOs + kBig * kLd<D>;            // [2][64, D]
  bf16* Vs = Ks + 2 * kKV;                   // [2][64, D]
  const int lane = threadIdx.x & 31, r0 = (threadIdx.x >> 5) * 16;
  const int Tq = static_cast<int>(s.Tq), Tk = static_cast<int>(s.Tk);
  const int qi = static_cast<int>(gridDim.x) - 1 - static_cast<int>(blockIdx.x);
  const int64_t h = blockIdx.y, b = blockIdx.z, hk = h / (s.H / s.Hkv);
  const int t0 = qi * kBig, rows = min(kBig, Tq - t0);
  const int kend = kCausal ? (t0 + rows - 1) / kSmall + 1 : (Tk + kSmall - 1) / kSmall;
  const bf16* kg = k + b * s.kv_bstride + hk * D;
  const bf16* vg = v + b * s.kv_bstride + hk * D;
  load_tile<D, kBig, kBwdThreads>(Qs, q + b * s.q_bstride + t0 * s.q_stride + h * D, s.q_stride, rows);
  load_tile<D, kBig, kBwdThreads>(dOs, dout + b * s.o_bstride + t0 * s.o_stride + h * D, s.o_stride, rows);
  load_tile<D, kSmall, kBwdThreads>(Ks, kg, s.kv_stride, min(kSmall, Tk));
  load_tile<D, kSmall, kBwdThreads>(Vs, vg, s.kv_stride, min(kSmall, Tk));
  cp_async_commit();
  float lse2[2], di[2];  // rows g, g+8; rows past Tq: 0 (their dS is 0: dO = 0 there)
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int r = r0 + (lane >> 2) + 8 * i;
    lse2[i] = r < rows ? lse[(b * s.H + h) * s.lse_stride + t0 + r] * kLog2e : 0.0f;
    di[i] = r < rows ? Di[(b * s.H + h) * s.Tq + t0 + r] : 0.0f;
  }
  cp_async_wait_all();
  __syncthreads();
  uint32_t qf[1][D / 16][4], df[1][D / 16][4];
  load_a<D>(qf[0], Qs, r0, lane);
  load_a<D>(df[0], dOs, r0, lane);

  float dqa[1][D / 8][4];
  zero(dqa);
  const int wq0 = t0 + r0, wq1 = wq0 + 15;
  for (int kj = 0; kj < kend; ++kj) {
    const int s0 = kj * kSmall, buf = kj & 1;
    cp_async_wait_all();
    __syncthreads();  // tile kj landed; every warp is done with tile kj - 1
    if (kj + 1 < kend) {
      const int s1 = s0 + kSmall;
      load_tile<D, kSmall, kBwdThreads>(Ks + (buf ^ 1) * kKV, kg + s1 * s.kv_stride, s.kv_stride, min(kSmall, Tk - s1));
      load_tile<D, kSmall, kBwdThreads>(Vs + (buf ^ 1) * kKV, vg + s1 * s.kv_stride, s.kv_stride, min(kSmall, Tk - s1));
      cp_async_commit();
    }
    if (kCausal && s0 > wq1) continue;
    constexpr int KP = kSmall / kSplit, NJ = 8 / kSplit;  // a part's keys and their 8-column n-tiles
#pragma unroll
    for (int part = 0; part < kSplit; ++part) {
      const int k0 = s0 + part * KP;
      const bf16* Kp = Ks + buf * kKV + part * KP * kLd<D>;
      const bf16* Vp = Vs + buf * kKV + part * KP * kLd<D>;
      float p[1][NJ][4], ds[1][NJ][4];
      scores<D, 1, NJ>(p, qf, Kp, lane);
      scores<D, 1, NJ>(ds, df, Vp, lane);
      if constexpr (kCausal) {
        if (k0 + KP - 1 > wq0) mask_after(p, wq0, k0, lane);
      } else {
        if (k0 + KP > Tk) mask_keys_from(p, k0, Tk, lane);  // P = 0 there, so dS = 0
      }
#pragma unroll
      for (int j = 0; j < NJ; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const float pe = exp2f(fmaf(p[0][j][e], scale_log2, -lse2[e >> 1]));
          ds[0][j][e] = pe * (ds[0][j][e] - di[e >> 1]);
        }
      accumulate<D, 1, NJ / 2>(dqa, ds, Kp, lane);
    }
  }
  store_rows<D, 1, kAdd>(dq + b * s.q_bstride + t0 * s.q_stride + h * D, s.q_stride, dqa, r0, rows, scale, lane);
}

// ---- the online-softmax merge of a ring step's block (cpu::attention_merge) ----
// One warp per (b, h, t) row: lse = log(e^lse + e^lse_blk), o = o e^(lse_old - lse) + o_blk
// e^(lse_blk - lse) (fp32, the CPU twin's expressions); a row neither part saw is left as it is.
__global__ void merge_kernel(float* __restrict__ o, float* __restrict__ lse, const float* __restrict__ ob,
                             const float* __restrict__ lb, int64_t B, int64_t Tq, int64_t H, int64_t D,
                             int64_t o_stride, int64_t o_bstride, int64_t lse_stride, int64_t blk_lse_stride) {
  const int64_t n = static_cast<int64_t>(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  if (n >= B * H * Tq) return;  // whole warps leave
  const int lane = threadIdx.x & 31;
  const int64_t t = n % Tq, h = (n / Tq) % H, b = n / (Tq * H);
  float* la = lse + (b * H + h) * lse_stride + t;
  const float a = *la, bl = lb[(b * H + h) * blk_lse_stride + t];
  const float m = fmaxf(a, bl);
  if (m == -INFINITY) return;  // neither part saw a key
  const float l = m + logf(expf(a - m) + expf(bl - m));
  const float wa = expf(a - l), wb = expf(bl - l);
  const int64_t off = b * o_bstride + t * o_stride + h * D;
  for (int64_t c = lane; c < D; c += 32) o[off + c] = o[off + c] * wa + ob[off + c] * wb;
  __syncwarp();  // every lane read the old lse above
  if (lane == 0) *la = l;
}

// ---- host side ----
AttnBlock causal_block(const AttnShape& s) {
  return AttnBlock{s.B, s.T, s.T, s.H, s.Hkv, s.D, s.q_stride, s.kv_stride, s.o_stride,
                   s.T * s.q_stride, s.T * s.kv_stride, s.T * s.o_stride, s.T, true};
}

void check_block(const AttnBlock& s, const char* op) {
  DHX_CUDA_REQUIRE(s.D == 32 || s.D == 64 || s.D == 128, op, ": head size D=", s.D,
                   " is not supported (D = 32, 64 or 128)");
  DHX_CUDA_ASSERT(s.B >= 0 && s.Tq >= 0 && s.Tk >= 0 && s.H > 0 && s.Hkv > 0 && s.H % s.Hkv == 0, op, ": bad dims B=",
                  s.B, " Tq=", s.Tq, " Tk=", s.Tk, " H=", s.H, " Hkv=", s.Hkv, " (need H % Hkv == 0)");
  DHX_CUDA_ASSERT(!s.causal || s.Tq == s.Tk, op, ": a causal block needs Tq == Tk (Tq=", s.Tq, " Tk=", s.Tk, ")");
  DHX_CUDA_ASSERT(s.Tq == 0 || s.Tk > 0, op, ": ", s.Tq, " queries and no keys (Tk=0): their softmax is undefined");
  DHX_CUDA_ASSERT(s.q_stride >= s.H * s.D && s.o_stride >= s.H * s.D && s.kv_stride >= s.Hkv * s.D, op,
                  ": strides q=", s.q_stride, " kv=", s.kv_stride, " o=", s.o_stride, " too small for H=", s.H,
                  " Hkv=", s.Hkv, " D=", s.D);
  DHX_CUDA_ASSERT(s.q_stride % 8 == 0 && s.kv_stride % 8 == 0 && s.o_stride % 8 == 0 && s.q_bstride % 8 == 0 &&
                      s.kv_bstride % 8 == 0 && s.o_bstride % 8 == 0,
                  op, ": strides q=", s.q_stride, " kv=", s.kv_stride, " o=", s.o_stride, " (per sequence ",
                  s.q_bstride, ", ", s.kv_bstride, ", ", s.o_bstride, ") are not multiples of 8 elements (16 B)");
  DHX_CUDA_ASSERT(s.lse_stride >= s.Tq, op, ": lse row stride ", s.lse_stride, " < Tq=", s.Tq);
  DHX_CUDA_ASSERT(s.Tq <= INT_MAX - kBig && s.Tk <= INT_MAX - kBig && s.H <= 65535 && s.Hkv <= 65535 &&
                      s.B <= 65535,
                  op, ": B=", s.B, " Tq=", s.Tq, " Tk=", s.Tk, " H=", s.H, " past the grid's limits (B, H <= 65535)");
}

void check_aligned(const void* p, const char* name, const char* op, size_t to = 16) {
  DHX_CUDA_ASSERT(reinterpret_cast<uintptr_t>(p) % to == 0, op, ": ", name, "=", p, " is not ", to, "-byte aligned");
}

template <int D, bool C, typename Out>
void fwd(const bf16* q, const bf16* k, const bf16* v, Out* o, float* lse, const AttnBlock& s, float scale,
         cudaStream_t st) {
  const size_t smem = (kBig + 4 * kSmall) * kRowBytes<D>;  // Q, 2 x (K, V)
  DHX_CUDA(cudaFuncSetAttribute(fwd_kernel<D, C, Out>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                static_cast<int>(smem)));
  const dim3 grid(static_cast<unsigned>(cdiv(s.Tq, kBig)), static_cast<unsigned>(s.H), static_cast<unsigned>(s.B));
  fwd_kernel<D, C, Out><<<grid, FwdCfg<D>::kThreads, smem, st>>>(q, k, v, o, lse, s, scale * kLog2e);
  DHX_CUDA_LAUNCHED(fwd_kernel);
}

template <int D, bool C, typename Out, bool kAdd, int kSplit, bool kOrderedDq>
void bwd(const bf16* q, const bf16* k, const bf16* v, const bf16* o, const float* lse, const bf16* dout, Out* dq,
         Out* dk, Out* dv, const AttnBlock& s, float scale, cudaStream_t st) {
  static_assert(kAdd == std::is_same_v<Out, float>, "bf16 gradients are written, fp32 ones added to");
  const int64_t rows = s.B * s.H * s.Tq;
  float* Di = nullptr;  // [B, H, Tq]
  scratch_malloc(&Di, rows * sizeof(float), st);
  constexpr int kDotWarps = 8;
  dot_kernel<D><<<static_cast<unsigned>(cdiv(rows, kDotWarps)), kDotWarps * 32, 0, st>>>(o, dout, Di, s);
  DHX_CUDA_LAUNCHED(dot_kernel);

  // kOrderedDq: the turns (zeroed) and, for bf16 gradients, the fp32 sums rounded after the kernel.
  DqShares shares;
  if constexpr (kOrderedDq) {
    const size_t turns = static_cast<size_t>(s.B * s.H * cdiv(s.Tq, kSmall)) * sizeof(int);
    scratch_malloc(&shares.turn, turns, st);
    DHX_CUDA(cudaMemsetAsync(shares.turn, 0, turns, st));
    if constexpr (kAdd) {
      shares.dq = dq, shares.stride = s.q_stride, shares.bstride = s.q_bstride, shares.mul = scale;
    } else {
      scratch_malloc(&shares.dq, rows * s.D * sizeof(float), st);
      shares.stride = s.H * s.D, shares.bstride = s.Tq * s.H * s.D, shares.first_writes = true;
    }
  }
  auto* dkdv = dkdv_kernel<D, C, Out, kAdd, kSplit, kOrderedDq>;
  const size_t smem_kv = (2 * kBig + 4 * kSmall) * kRowBytes<D> + 4 * kSmall * sizeof(float) +  // K, V, 2 x (Q, dO, lse, D_i)
                         (kOrderedDq ? kBig * kLdS * sizeof(bf16) : 0);                        // dS^T
  DHX_CUDA(cudaFuncSetAttribute(dkdv, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem_kv)));
  // Two blocks an SM (kBwdMinBlocks) need ~150 KB of shared memory at D = 64 (~190 KB with the
  // ordered form's dS^T): ask for the largest shared-memory carveout (a hint the driver otherwise
  // sizes for one block's needs).
  if constexpr (kBwdMinBlocks<D, kSplit> > 1) {
    DHX_CUDA(cudaFuncSetAttribute(dkdv, cudaFuncAttributePreferredSharedMemoryCarveout,
                                  static_cast<int>(cudaSharedmemCarveoutMaxShared)));
    if constexpr (!kOrderedDq)
      DHX_CUDA(cudaFuncSetAttribute(dq_kernel<D, C, Out, kAdd, kSplit>, cudaFuncAttributePreferredSharedMemoryCarveout,
                                    static_cast<int>(cudaSharedmemCarveoutMaxShared)));
  }
  // Blocks in blockIdx order, the key tiles of a sequence first to last (kOrderedDq's turns rely on it).
  dkdv<<<dim3(static_cast<unsigned>(cdiv(s.Tk, kBig)), static_cast<unsigned>(s.Hkv), static_cast<unsigned>(s.B)),
         kBwdThreads, smem_kv, st>>>(q, k, v, dout, lse, Di, dk, dv, shares, s, scale * kLog2e, scale);
  DHX_CUDA_LAUNCHED(dkdv_kernel);

  if constexpr (kOrderedDq) {
    if constexpr (!kAdd) {
      const int64_t n8 = rows * s.D / 8;
      dq_round_kernel<<<static_cast<unsigned>(cdiv(n8, 256)), 256, 0, st>>>(shares.dq, dq, n8, s.Tq, s.H * s.D,
                                                                            s.q_stride, s.q_bstride, scale);
      DHX_CUDA_LAUNCHED(dq_round_kernel);
      DHX_CUDA(cudaFreeAsync(shares.dq, st));
    }
    DHX_CUDA(cudaFreeAsync(shares.turn, st));
  } else {
    const size_t smem_q = (2 * kBig + 4 * kSmall) * kRowBytes<D>;  // Q, dO, 2 x (K, V)
    DHX_CUDA(cudaFuncSetAttribute(dq_kernel<D, C, Out, kAdd, kSplit>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  static_cast<int>(smem_q)));
    dq_kernel<D, C, Out, kAdd, kSplit>
        <<<dim3(static_cast<unsigned>(cdiv(s.Tq, kBig)), static_cast<unsigned>(s.H), static_cast<unsigned>(s.B)),
           kBwdThreads, smem_q, st>>>(q, k, v, dout, lse, Di, dq, s, scale * kLog2e, scale);
    DHX_CUDA_LAUNCHED(dq_kernel);
  }
  DHX_CUDA(cudaFreeAsync(Di, st));
}

// The kernels for head size s.D and the block's mask.
template <bool C, typename Out>
void fwd_any(const bf16* q, const bf16* k, const bf16* v, Out* o, float* lse, const AttnBlock& s, float scale,
             cudaStream_t st) {
  if (s.D == 32) fwd<32, C, Out>(q, k, v, o, lse, s, scale, st);
  else if (s.D == 64) fwd<64, C, Out>(q, k, v, o, lse, s, scale, st);
  else fwd<128, C, Out>(q, k, v, o, lse, s, scale, st);
}
template <bool C, typename Out, bool kAdd, int kSplit, bool kOrderedDq = false>
void bwd_d(const bf16* q, const bf16* k, const bf16* v, const bf16* o, const float* lse, const bf16* dout, Out* dq,
           Out* dk, Out* dv, const AttnBlock& s, float scale, cudaStream_t st) {
  if (s.D == 32) bwd<32, C, Out, kAdd, kSplit, kOrderedDq>(q, k, v, o, lse, dout, dq, dk, dv, s, scale, st);
  else if (s.D == 64) bwd<64, C, Out, kAdd, kSplit, kOrderedDq>(q, k, v, o, lse, dout, dq, dk, dv, s, scale, st);
  else bwd<128, C, Out, kAdd, kSplit, kOrderedDq>(q, k, v, o, lse, dout, dq, dk, dv, s, scale, st);
}
std::atomic<int> g_bwd_form{static_cast<int>(AttnBwdForm::kHalves)};
template <bool C, typename Out, bool kAdd>
void bwd_any(const bf16* q, const bf16* k, const bf16* v, const bf16* o, const float* lse, const bf16* dout, Out* dq,
             Out* dk, Out* dv, const AttnBlock& s, float scale, cudaStream_t st) {
  switch (attention_bwd_form()) {
    case AttnBwdForm::kHalves: bwd_d<C, Out, kAdd, 2>(q, k, v, o, lse, dout, dq, dk, dv, s, scale, st); break;
    case AttnBwdForm::kWholeTiles: bwd_d<C, Out, kAdd, 1>(q, k, v, o, lse, dout, dq, dk, dv, s, scale, st); break;
    case AttnBwdForm::kOrderedDq: bwd_d<C, Out, kAdd, 2, true>(q, k, v, o, lse, dout, dq, dk, dv, s, scale, st); break;
  }
}

}  // namespace

void set_attention_bwd_form(AttnBwdForm f) { g_bwd_form.store(static_cast<int>(f)); }
AttnBwdForm attention_bwd_form() { return static_cast<AttnBwdForm>(g_bwd_form.load()); }

void attention_fwd(const bf16* q, const bf16* k, const bf16* v, bf16* o, float* lse, const AttnShape& s, float scale,
                   cudaStream_t st) {
  const AttnBlock blk = causal_block(s);
  check_block(blk, "attention_fwd");
  for (const auto& [p, name] : {std::pair<const void*, const char*>{q, "q"}, {k, "k"}, {v, "v"}, {o, "o"}})
    check_aligned(p, name, "attention_fwd");
  if (s.B == 0 || s.T == 0) return;
  fwd_any<true, bf16>(q, k, v, o, lse, blk, scale, st);
}

void attention_bwd(const bf16* q, const bf16* k, const bf16* v, const bf16* o, const float* lse, const bf16* dout,
                   bf16* dq, bf16* dk, bf16* dv, const AttnShape& s, float scale, cudaStream_t st) {
  const AttnBlock blk = causal_block(s);
  check_block(blk, "attention_bwd");
  for (const auto& [p, name] : {std::pair<const void*, const char*>{q, "q"}, {k, "k"}, {v, "v"}, {o, "o"},
                                {dout, "dout"}, {dq, "dq"}, {dk, "dk"}, {dv, "dv"}})
    check_aligned(p, name, "attention_bwd");
  if (s.B == 0 || s.T == 0) return;
  bwd_any<true, bf16, false>(q, k, v, o, lse, dout, dq, dk, dv, blk, scale, st);
}

void attention_block_fwd(const bf16* q, const bf16* k, const bf16* v, float* o, float* lse, const AttnBlock& s,
                         float scale, cudaStream_t st) {
  check_block(s, "attention_block_fwd");
  for (const auto& [p, name] : {std::pair<const void*, const char*>{q, "q"}, {k, "k"}, {v, "v"}})
    check_aligned(p, name, "attention_block_fwd");
  check_aligned(o, "o", "attention_block_fwd", 8);
  if (s.B == 0 || s.Tq == 0) return;
  if (s.causal) fwd_any<true, float>(q, k, v, o, lse, s, scale, st);
  else fwd_any<false, float>(q, k, v, o, lse, s, scale, st);
}

void attention_block_bwd(const bf16* q, const bf16* k, const bf16* v, const bf16* o, const float* lse,
                         const bf16* dout, float* dq, float* dk, float* dv, const AttnBlock& s, float scale,
                         cudaStream_t st) {
  check_block(s, "attention_block_bwd");
  for (const auto& [p, name] : {std::pair<const void*, const char*>{q, "q"}, {k, "k"}, {v, "v"}, {o, "o"},
                                {dout, "dout"}})
    check_aligned(p, name, "attention_block_bwd");
  for (const auto& [p, name] : {std::pair<const void*, const char*>{dq, "dq"}, {dk, "dk"}, {dv, "dv"}})
    check_aligned(p, name, "attention_block_bwd", 8);
  DHX_CUDA_ASSERT(s.q_stride % 2 == 0 && s.kv_stride % 2 == 0, "attention_block_bwd: fp32 gradient strides q=",
                  s.q_stride, " kv=", s.kv_stride, " are odd (pairs of columns are stored together)");
  if (s.B == 0 || s.Tq == 0) return;
  if (s.causal) bwd_any<true, float, true>(q, k, v, o, lse, dout, dq, dk, dv, s, scale, st);
  else bwd_any<false, float, true>(q, k, v, o, lse, dout, dq, dk, dv, s, scale, st);
}

void attention_merge(float* o, float* lse, const float* o_blk, const float* lse_blk, int64_t B, int64_t Tq, int64_t H,
                     int64_t D, int64_t o_stride, int64_t o_bstride, int64_t lse_stride, int64_t blk_lse_stride,
                     cudaStream_t st) {
  DHX_CUDA_ASSERT(B >= 0 && Tq >= 0 && H >= 1 && D >= 1 && o_stride >= H * D && o_bstride >= 0 && lse_stride >= Tq &&
                      blk_lse_stride >= Tq,
                  "attention_merge: B=", B, " Tq=", Tq, " H=", H, " D=", D, " o_stride=", o_stride, " lse strides ",
                  lse_stride, ", ", blk_lse_stride, " (need o_stride >= H*D, lse strides >= Tq)");
  const int64_t rows = B * H * Tq;
  if (rows == 0) return;
  constexpr int kWarps = 8;
  merge_kernel<<<static_cast<unsigned>(cdiv(rows, kWarps)), kWarps * 32, 0, st>>>(
      o, lse, o_blk, lse_blk, B, Tq, H, D, o_stride, o_bstride, lse_stride, blk_lse_stride);
  DHX_CUDA_LAUNCHED(merge_kernel);
}

}  // namespace dhelix::cuda
