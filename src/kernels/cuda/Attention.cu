// Causal GQA attention on bf16 tensor cores (Attention.h), FlashAttention-2's algorithm with
// mma.sync.m16n8k16 (bf16 in, fp32 accumulate). Not here: wgmma / TMA pipelines (a later speed-up).
//
// Tiling: 64 query rows x 64 keys per block step, 4 warps of 16 query (or key) rows each; a tile of
// 64 rows x D is staged in shared memory (rows padded by 8 bf16: conflict-free fragment loads), ragged
// rows past T zero-filled and masked. Key tiles past a query tile's last query are skipped (causal).
//   forward  grid (T/64, H, B): Q tile, K/V tiles streamed, online softmax (running max and sum in
//            fp32, log2 units), O = sum P V with P rounded to bf16, lse = max + log(sum) saved.
//   backward D_i = rowsum(dO * O) (fp32, one warp per row); then
//            grid (T/64, Hkv, B): per key tile, over the group's H/Hkv query heads and the query tiles
//            at or after it, in that fixed order: dV += P^T dO, dK += dS^T Q (fp32 registers);
//            grid (T/64, H, B): per query tile, over key tiles: dQ += dS K.
//            P = exp(scale S - lse) recomputed, dS = P (dP - D_i), P and dS rounded to bf16 for the
//            products. No atomics: every output element is summed by one thread in one order.
// FLOPs (causal, the masked half skipped up to the diagonal tiles): forward 2 products of
// B H T^2 D each = 2 B H T^2 D; backward 7 (S, dP twice, dV, dK, dQ) = 7 B H T^2 D. GPT-2 (B=16,
// T=1024, H=12, D=64): 25.8 GFLOP forward, 90 GFLOP backward.
// Bytes (one tensor [B, T, H, D] bf16 = 25.2 MB there): forward Q, O once, K, V once per query tile
// at or after theirs ((T/64 + 1) / 2 = 8.5 times on average): 2 + 2 * 8.5 = 19 tensors, most K/V
// re-reads from L2 (fewer with GQA: a kv head's tiles serve H/Hkv query heads);
// backward ~43 tensors (dK/dV pass 21, dQ pass 20, D_i 2). Figure on the H100: not measured yet.
#include "kernels/cuda/Attention.h"

#include <climits>
#include <utility>

namespace dhelix::cuda {

namespace {

constexpr int kTile = 64;                // query rows and keys per tile
constexpr int kWarps = 4;                // each owns 16 rows of the tile
constexpr int kThreads = kWarps * 32;
constexpr int kPad = 8;                  // bf16 per shared row past D: rows 16 B apart in banks
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

template <int D> constexpr int kLd = D + kPad;                               // shared row stride
template <int D> constexpr size_t kTileBytes = sizeof(bf16) * kTile * kLd<D>;  // one [64, D] tile

// ---- warp-level pieces of mma.sync.m16n8k16 (PTX ISA, "Matrix fragments for mma.m16n8k16") ----
// lane = 4 g + c (g = groupID 0..7, c = threadID_in_group 0..3). For a 16 x 16 A tile (row-major),
// registers a0..a3 hold the bf16 pairs (row g, cols 2c, 2c+1), (g+8, 2c..), (g, 2c+8..), (g+8, 2c+8..);
// for a 16 x 8 B tile, b0 = (k rows 2c, 2c+1; col g), b1 = (k rows 2c+8, 2c+9; col g); the fp32
// 16 x 8 C tile: c0, c1 = (row g, cols 2c, 2c+1), c2, c3 = (row g+8, cols 2c, 2c+1). In each pair the
// lower column (or k) is the lower 16 bits.

__device__ __forceinline__ void mma(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

__device__ __forceinline__ uint32_t ld32(const bf16* p) { return *reinterpret_cast<const uint32_t*>(p); }
__device__ __forceinline__ uint32_t pack(bf16 lo, bf16 hi) {
  return static_cast<uint32_t>(__bfloat16_as_ushort(lo)) | (static_cast<uint32_t>(__bfloat16_as_ushort(hi)) << 16);
}
__device__ __forceinline__ uint32_t pack(float lo, float hi) {
  return pack(__float2bfloat16_rn(lo), __float2bfloat16_rn(hi));
}

// A fragment: rows r0..r0+15, cols k0..k0+15 of the row-major tile X (row stride ld).
__device__ __forceinline__ void load_a(uint32_t (&a)[4], const bf16* X, int ld, int r0, int k0, int lane) {
  const int r = r0 + (lane >> 2), k = k0 + (lane & 3) * 2;
  a[0] = ld32(X + r * ld + k);
  a[1] = ld32(X + (r + 8) * ld + k);
  a[2] = ld32(X + r * ld + k + 8);
  a[3] = ld32(X + (r + 8) * ld + k + 8);
}
// B fragment of B = X^T (B[k][n] = X[n][k], X row-major): n0..n0+7 x k0..k0+15; pairs adjacent in X.
__device__ __forceinline__ void load_b(uint32_t (&b)[2], const bf16* X, int ld, int n0, int k0, int lane) {
  const int n = n0 + (lane >> 2), k = k0 + (lane & 3) * 2;
  b[0] = ld32(X + n * ld + k);
  b[1] = ld32(X + n * ld + k + 8);
}
// B fragment of B = X (B[k][n] = X[k][n], X row-major): a pair spans two rows of X.
__device__ __forceinline__ void load_b_trans(uint32_t (&b)[2], const bf16* X, int ld, int k0, int n0, int lane) {
  const int n = n0 + (lane >> 2), k = k0 + (lane & 3) * 2;
  b[0] = pack(X[k * ld + n], X[(k + 1) * ld + n]);
  b[1] = pack(X[(k + 8) * ld + n], X[(k + 9) * ld + n]);
}

// s[16, 64] = A[a0 .. a0+15, 0..D) X[0..64, 0..D)^T, fp32: a warp's rows of a score tile, as C
// fragments s[j] (cols 8j..8j+7). A and X are shared [64, D] tiles.
template <int D>
__device__ __forceinline__ void scores(float (&s)[8][4], const bf16* A, int a0, const bf16* X, int lane) {
#pragma unroll
  for (int j = 0; j < 8; ++j) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.0f;
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
    uint32_t a[4];
    load_a(a, A, kLd<D>, a0, kk * 16, lane);
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      uint32_t b[2];
      load_b(b, X, kLd<D>, j * 8, kk * 16, lane);
      mma(s[j], a, b);
    }
  }
}

// acc[16, D] += bf16(p[16, 64]) X[0..64, 0..D): p in C fragments (cols = X's rows) becomes the A
// operand in registers (C pair (row, 2c..) of tiles 2kk and 2kk+1 is A's pair (row, 2c..) and
// (row, 2c+8..) of k-chunk kk).
template <int D>
__device__ __forceinline__ void accumulate(float (&acc)[D / 8][4], const float (&p)[8][4], const bf16* X, int lane) {
#pragma unroll
  for (int kk = 0; kk < 4; ++kk) {
    const uint32_t a[4] = {pack(p[2 * kk][0], p[2 * kk][1]), pack(p[2 * kk][2], p[2 * kk][3]),
                           pack(p[2 * kk + 1][0], p[2 * kk + 1][1]), pack(p[2 * kk + 1][2], p[2 * kk + 1][3])};
#pragma unroll
    for (int jd = 0; jd < D / 8; ++jd) {
      uint32_t b[2];
      load_b_trans(b, X, kLd<D>, kk * 16, jd * 8, lane);
      mma(acc[jd], a, b);
    }
  }
}

// Rows [0, rows) of a [64, D] tile from global (row stride `stride` elements, g at row 0, column 0 of
// the head) into shared X; rows past `rows` zero-filled. 16-byte pieces.
template <int D>
__device__ __forceinline__ void load_tile(bf16* X, const bf16* __restrict__ g, int64_t stride, int rows) {
  constexpr int kPieces = D / 8;
  for (int i = threadIdx.x; i < kTile * kPieces; i += kThreads) {
    const int r = i / kPieces, c = (i % kPieces) * 8;
    uint4 v = make_uint4(0u, 0u, 0u, 0u);
    if (r < rows) v = *reinterpret_cast<const uint4*>(g + r * stride + c);
    *reinterpret_cast<uint4*>(X + r * kLd<D> + c) = v;
  }
}

// acc rows (g, g+8 of the warp's 16) scaled, rounded to bf16 and stored at row t0 + r of `out`
// (row stride `stride`, column 0 of the head) for rows before `rows`.
template <int D>
__device__ __forceinline__ void store_rows(bf16* out, int64_t stride, const float (&acc)[D / 8][4], int r0, int rows,
                                           float mul, int lane) {
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int r = r0 + (lane >> 2) + 8 * i;
    if (r >= rows) continue;
    bf16* row = out + r * stride + (lane & 3) * 2;
#pragma unroll
    for (int jd = 0; jd < D / 8; ++jd)
      *reinterpret_cast<__nv_bfloat162*>(row + jd * 8) =
          __floats2bfloat162_rn(acc[jd][2 * i] * mul, acc[jd][2 * i + 1] * mul);
  }
}

// ---- forward: grid (ceil(T/64), H, B), the query tiles with the most key tiles first ----
template <int D>
__global__ void __launch_bounds__(kThreads)
    fwd_kernel(const bf16* __restrict__ q, const bf16* __restrict__ k, const bf16* __restrict__ v, bf16* __restrict__ o,
               float* __restrict__ lse, AttnShape s, float scale_log2) {
  extern __shared__ __align__(16) unsigned char smem[];
  bf16* Qs = reinterpret_cast<bf16*>(smem);  // [64, D] each
  bf16* Ks = Qs + kTile * kLd<D>;
  bf16* Vs = Ks + kTile * kLd<D>;
  const int lane = threadIdx.x & 31, r0 = (threadIdx.x >> 5) * 16, T = static_cast<int>(s.T);
  const int qi = static_cast<int>(gridDim.x) - 1 - static_cast<int>(blockIdx.x);
  const int64_t h = blockIdx.y, b = blockIdx.z, hk = h / (s.H / s.Hkv);
  const int t0 = qi * kTile, rows = min(kTile, T - t0);
  load_tile<D>(Qs, q + (b * s.T + t0) * s.q_stride + h * D, s.q_stride, rows);

  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};  // rows g, g+8: running max (log2 units), sum
  float acc[D / 8][4];
#pragma unroll
  for (int jd = 0; jd < D / 8; ++jd) acc[jd][0] = acc[jd][1] = acc[jd][2] = acc[jd][3] = 0.0f;
  const int kend = (t0 + rows - 1) / kTile + 1;  // key tiles up to the one holding the last query
  for (int kj = 0; kj < kend; ++kj) {
    const int s0 = kj * kTile;
    __syncthreads();  // every warp is done with the previous K, V
    load_tile<D>(Ks, k + (b * s.T + s0) * s.kv_stride + hk * D, s.kv_stride, min(kTile, T - s0));
    load_tile<D>(Vs, v + (b * s.T + s0) * s.kv_stride + hk * D, s.kv_stride, min(kTile, T - s0));
    __syncthreads();
    float sc[8][4];
    scores<D>(sc, Qs, r0, Ks, lane);
    // Element (j, e): query t0 + r0 + g + 8 (e / 2), key s0 + 8 j + 2 c + e % 2; keys after the query masked.
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int t = t0 + r0 + (lane >> 2) + 8 * i;
      float mx = -INFINITY;
#pragma unroll
      for (int j = 0; j < 8; ++j)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int key = s0 + j * 8 + (lane & 3) * 2 + e;
          float& x = sc[j][2 * i + e];
          x = key <= t && key < T ? x * scale_log2 : -INFINITY;
          mx = fmaxf(mx, x);
        }
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));  // the row's 4 lanes
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      const float m_new = fmaxf(m[i], mx);
      const float base = m_new == -INFINITY ? 0.0f : m_new;  // a row with no key yet: all zeros, no NaN
      const float corr = exp2f(m[i] - base);                 // 0 on the row's first keys
      float sum = 0.0f;
#pragma unroll
      for (int j = 0; j < 8; ++j)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          float& x = sc[j][2 * i + e];
          x = exp2f(x - base);
          sum += x;
        }
      m[i] = m_new;
      l[i] = l[i] * corr + sum;  // this lane's part of the row sum
#pragma unroll
      for (int jd = 0; jd < D / 8; ++jd) acc[jd][2 * i] *= corr, acc[jd][2 * i + 1] *= corr;
    }
    accumulate<D>(acc, sc, Vs, lane);
  }

  float inv[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    l[i] += __shfl_xor_sync(0xffffffffu, l[i], 1);
    l[i] += __shfl_xor_sync(0xffffffffu, l[i], 2);
    inv[i] = 1.0f / l[i];
    const int r = r0 + (lane >> 2) + 8 * i;
    if ((lane & 3) == 0 && r < rows) lse[(b * s.H + h) * s.T + t0 + r] = m[i] * kLn2 + logf(l[i]);
  }
  // rows g and g+8 have their own 1/l: scale acc per row, then store with multiplier 1.
#pragma unroll
  for (int jd = 0; jd < D / 8; ++jd) {
    acc[jd][0] *= inv[0], acc[jd][1] *= inv[0];
    acc[jd][2] *= inv[1], acc[jd][3] *= inv[1];
  }
  store_rows<D>(o + (b * s.T + t0) * s.o_stride + h * D, s.o_stride, acc, r0, rows, 1.0f, lane);
}

// ---- backward ----
// Di[B, H, T] = sum_d dout * o (fp32), one warp per (b, h, t) in Di's order; lanes sum pairs, then a
// fixed butterfly.
template <int D>
__global__ void dot_kernel(const bf16* __restrict__ o, const bf16* __restrict__ dout, float* __restrict__ Di,
                           AttnShape s) {
  const int64_t n = static_cast<int64_t>(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  if (n >= s.B * s.H * s.T) return;  // whole warps leave
  const int lane = threadIdx.x & 31;
  const int64_t t = n % s.T, h = (n / s.T) % s.H, b = n / (s.T * s.H);
  const int64_t off = (b * s.T + t) * s.o_stride + h * D;
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

// dK, dV of one key tile: grid (ceil(T/64), Hkv, B). Each warp owns 16 keys; per (query head of the
// group, query tile at or after the key tile), in that order: S^T = K Q^T, dP^T = V dO^T (keys x
// queries), P^T = exp(scale S^T - lse), dS^T = P^T (dP^T - D_i); dV += P^T dO, dK += dS^T Q.
template <int D>
__global__ void __launch_bounds__(kThreads)
    dkdv_kernel(const bf16* __restrict__ q, const bf16* __restrict__ k, const bf16* __restrict__ v,
                const bf16* __restrict__ dout, const float* __restrict__ lse, const float* __restrict__ Di,
                bf16* __restrict__ dk, bf16* __restrict__ dv, AttnShape s, float scale_log2, float scale) {
  extern __shared__ __align__(16) unsigned char smem[];
  bf16* Ks = reinterpret_cast<bf16*>(smem);  // [64, D] each
  bf16* Vs = Ks + kTile * kLd<D>;
  bf16* Qs = Vs + kTile * kLd<D>;
  bf16* dOs = Qs + kTile * kLd<D>;
  float* lse_s = reinterpret_cast<float*>(dOs + kTile * kLd<D>);  // [64], log2 units
  float* di_s = lse_s + kTile;                                    // [64]
  const int lane = threadIdx.x & 31, r0 = (threadIdx.x >> 5) * 16, T = static_cast<int>(s.T);
  const int kj = blockIdx.x;
  const int64_t hk = blockIdx.y, b = blockIdx.z, G = s.H / s.Hkv;
  const int s0 = kj * kTile, keys = min(kTile, T - s0), nq = (T + kTile - 1) / kTile;
  load_tile<D>(Ks, k + (b * s.T + s0) * s.kv_stride + hk * D, s.kv_stride, keys);
  load_tile<D>(Vs, v + (b * s.T + s0) * s.kv_stride + hk * D, s.kv_stride, keys);

  float dka[D / 8][4], dva[D / 8][4];
#pragma unroll
  for (int jd = 0; jd < D / 8; ++jd)
#pragma unroll
    for (int e = 0; e < 4; ++e) dka[jd][e] = dva[jd][e] = 0.0f;
  for (int64_t h = hk * G; h < (hk + 1) * G; ++h) {
    for (int qi = kj; qi < nq; ++qi) {  // query tile qi holds queries >= s0 from qi = kj on
      const int t0 = qi * kTile, rows = min(kTile, T - t0);
      __syncthreads();  // every warp is done with the previous Q, dO, lse, D_i (and K, V are loaded)
      load_tile<D>(Qs, q + (b * s.T + t0) * s.q_stride + h * D, s.q_stride, rows);
      load_tile<D>(dOs, dout + (b * s.T + t0) * s.o_stride + h * D, s.o_stride, rows);
      for (int r = threadIdx.x; r < kTile; r += kThreads) {
        lse_s[r] = r < rows ? lse[(b * s.H + h) * s.T + t0 + r] * kLog2e : 0.0f;
        di_s[r] = r < rows ? Di[(b * s.H + h) * s.T + t0 + r] : 0.0f;
      }
      __syncthreads();
      float p[8][4], ds[8][4];
      scores<D>(p, Ks, r0, Qs, lane);
      scores<D>(ds, Vs, r0, dOs, lane);
      // Element (j, e): key s0 + r0 + g + 8 (e / 2), query t0 + 8 j + 2 c + e % 2; queries before the key masked.
#pragma unroll
      for (int j = 0; j < 8; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int key = s0 + r0 + (lane >> 2) + 8 * (e >> 1), col = j * 8 + (lane & 3) * 2 + (e & 1);
          const int t = t0 + col;
          const float pe = key <= t && t < T ? exp2f(p[j][e] * scale_log2 - lse_s[col]) : 0.0f;
          p[j][e] = pe;
          ds[j][e] = pe * (ds[j][e] - di_s[col]);
        }
      accumulate<D>(dva, p, dOs, lane);
      accumulate<D>(dka, ds, Qs, lane);
    }
  }
  store_rows<D>(dk + (b * s.T + s0) * s.kv_stride + hk * D, s.kv_stride, dka, r0, keys, scale, lane);
  store_rows<D>(dv + (b * s.T + s0) * s.kv_stride + hk * D, s.kv_stride, dva, r0, keys, 1.0f, lane);
}

// dQ of one query tile: grid (ceil(T/64), H, B), the tiles with the most key tiles first. Per key
// tile up to the diagonal: S = Q K^T, dP = dO V^T, dS = P (dP - D_i); dQ += dS K.
template <int D>
__global__ void __launch_bounds__(kThreads)
    dq_kernel(const bf16* __restrict__ q, const bf16* __restrict__ k, const bf16* __restrict__ v,
              const bf16* __restrict__ dout, const float* __restrict__ lse, const float* __restrict__ Di,
              bf16* __restrict__ dq, AttnShape s, float scale_log2, float scale) {
  extern __shared__ __align__(16) unsigned char smem[];
  bf16* Qs = reinterpret_cast<bf16*>(smem);  // [64, D] each
  bf16* dOs = Qs + kTile * kLd<D>;
  bf16* Ks = dOs + kTile * kLd<D>;
  bf16* Vs = Ks + kTile * kLd<D>;
  const int lane = threadIdx.x & 31, r0 = (threadIdx.x >> 5) * 16, T = static_cast<int>(s.T);
  const int qi = static_cast<int>(gridDim.x) - 1 - static_cast<int>(blockIdx.x);
  const int64_t h = blockIdx.y, b = blockIdx.z, hk = h / (s.H / s.Hkv);
  const int t0 = qi * kTile, rows = min(kTile, T - t0);
  load_tile<D>(Qs, q + (b * s.T + t0) * s.q_stride + h * D, s.q_stride, rows);
  load_tile<D>(dOs, dout + (b * s.T + t0) * s.o_stride + h * D, s.o_stride, rows);
  float lse2[2], di[2];  // rows g, g+8
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int r = r0 + (lane >> 2) + 8 * i;
    lse2[i] = r < rows ? lse[(b * s.H + h) * s.T + t0 + r] * kLog2e : 0.0f;
    di[i] = r < rows ? Di[(b * s.H + h) * s.T + t0 + r] : 0.0f;
  }

  float dqa[D / 8][4];
#pragma unroll
  for (int jd = 0; jd < D / 8; ++jd) dqa[jd][0] = dqa[jd][1] = dqa[jd][2] = dqa[jd][3] = 0.0f;
  const int kend = (t0 + rows - 1) / kTile + 1;
  for (int kj = 0; kj < kend; ++kj) {
    const int s0 = kj * kTile;
    __syncthreads();  // every warp is done with the previous K, V
    load_tile<D>(Ks, k + (b * s.T + s0) * s.kv_stride + hk * D, s.kv_stride, min(kTile, T - s0));
    load_tile<D>(Vs, v + (b * s.T + s0) * s.kv_stride + hk * D, s.kv_stride, min(kTile, T - s0));
    __syncthreads();
    float p[8][4], ds[8][4];
    scores<D>(p, Qs, r0, Ks, lane);
    scores<D>(ds, dOs, r0, Vs, lane);
    // Element (j, e): query t0 + r0 + g + 8 (e / 2), key s0 + 8 j + 2 c + e % 2.
#pragma unroll
    for (int j = 0; j < 8; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int t = t0 + r0 + (lane >> 2) + 8 * (e >> 1), key = s0 + j * 8 + (lane & 3) * 2 + (e & 1);
        const float pe = key <= t && t < T ? exp2f(p[j][e] * scale_log2 - lse2[e >> 1]) : 0.0f;
        ds[j][e] = pe * (ds[j][e] - di[e >> 1]);
      }
    accumulate<D>(dqa, ds, Ks, lane);
  }
  store_rows<D>(dq + (b * s.T + t0) * s.q_stride + h * D, s.q_stride, dqa, r0, rows, scale, lane);
}

// ---- host side ----
void check_shape(const AttnShape& s, const char* op) {
  DHX_CUDA_REQUIRE(s.D == 64 || s.D == 128, op, ": head size D=", s.D, " is not supported (D = 64 or 128)");
  DHX_CUDA_ASSERT(s.B >= 0 && s.T >= 0 && s.H > 0 && s.Hkv > 0 && s.H % s.Hkv == 0, op, ": bad dims B=", s.B,
                  " T=", s.T, " H=", s.H, " Hkv=", s.Hkv, " (need H % Hkv == 0)");
  DHX_CUDA_ASSERT(s.q_stride >= s.H * s.D && s.o_stride >= s.H * s.D && s.kv_stride >= s.Hkv * s.D, op,
                  ": strides q=", s.q_stride, " kv=", s.kv_stride, " o=", s.o_stride, " too small for H=", s.H,
                  " Hkv=", s.Hkv, " D=", s.D);
  DHX_CUDA_ASSERT(s.q_stride % 8 == 0 && s.kv_stride % 8 == 0 && s.o_stride % 8 == 0, op, ": strides q=",
                  s.q_stride, " kv=", s.kv_stride, " o=", s.o_stride, " are not multiples of 8 elements (16 B)");
  DHX_CUDA_ASSERT(s.T <= INT_MAX - kTile && s.H <= 65535 && s.Hkv <= 65535 && s.B <= 65535, op, ": B=", s.B, " T=",
                  s.T, " H=", s.H, " past the grid's limits (B, H <= 65535)");
}

void check_aligned(const void* p, const char* name, const char* op) {
  DHX_CUDA_ASSERT(reinterpret_cast<uintptr_t>(p) % 16 == 0, op, ": ", name, "=", p, " is not 16-byte aligned");
}

template <int D> void fwd(const bf16* q, const bf16* k, const bf16* v, bf16* o, float* lse, const AttnShape& s,
                          float scale, cudaStream_t st) {
  const size_t smem = 3 * kTileBytes<D>;
  DHX_CUDA(cudaFuncSetAttribute(fwd_kernel<D>, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
  const dim3 grid(static_cast<unsigned>(cdiv(s.T, kTile)), static_cast<unsigned>(s.H), static_cast<unsigned>(s.B));
  fwd_kernel<D><<<grid, kThreads, smem, st>>>(q, k, v, o, lse, s, scale * kLog2e);
  DHX_CUDA_LAUNCHED(fwd_kernel);
}

template <int D> void bwd(const bf16* q, const bf16* k, const bf16* v, const bf16* o, const float* lse,
                          const bf16* dout, bf16* dq, bf16* dk, bf16* dv, const AttnShape& s, float scale,
                          cudaStream_t st) {
  const int64_t rows = s.B * s.H * s.T;
  float* Di = nullptr;  // [B, H, T]
  DHX_CUDA(cudaMallocAsync(reinterpret_cast<void**>(&Di), rows * sizeof(float), st));
  constexpr int kDotWarps = 8;
  dot_kernel<D><<<static_cast<unsigned>(cdiv(rows, kDotWarps)), kDotWarps * 32, 0, st>>>(o, dout, Di, s);
  DHX_CUDA_LAUNCHED(dot_kernel);

  const size_t smem_kv = 4 * kTileBytes<D> + 2 * kTile * sizeof(float);
  DHX_CUDA(cudaFuncSetAttribute(dkdv_kernel<D>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                static_cast<int>(smem_kv)));
  const unsigned tiles = static_cast<unsigned>(cdiv(s.T, kTile));
  dkdv_kernel<D><<<dim3(tiles, static_cast<unsigned>(s.Hkv), static_cast<unsigned>(s.B)), kThreads, smem_kv, st>>>(
      q, k, v, dout, lse, Di, dk, dv, s, scale * kLog2e, scale);
  DHX_CUDA_LAUNCHED(dkdv_kernel);

  const size_t smem_q = 4 * kTileBytes<D>;
  DHX_CUDA(cudaFuncSetAttribute(dq_kernel<D>, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem_q)));
  dq_kernel<D><<<dim3(tiles, static_cast<unsigned>(s.H), static_cast<unsigned>(s.B)), kThreads, smem_q, st>>>(
      q, k, v, dout, lse, Di, dq, s, scale * kLog2e, scale);
  DHX_CUDA_LAUNCHED(dq_kernel);
  DHX_CUDA(cudaFreeAsync(Di, st));
}

}  // namespace

void attention_fwd(const bf16* q, const bf16* k, const bf16* v, bf16* o, float* lse, const AttnShape& s, float scale,
                   cudaStream_t st) {
  check_shape(s, "attention_fwd");
  for (const auto& [p, name] : {std::pair<const void*, const char*>{q, "q"}, {k, "k"}, {v, "v"}, {o, "o"}})
    check_aligned(p, name, "attention_fwd");
  if (s.B == 0 || s.T == 0) return;
  if (s.D == 64) fwd<64>(q, k, v, o, lse, s, scale, st);
  else fwd<128>(q, k, v, o, lse, s, scale, st);
}

void attention_bwd(const bf16* q, const bf16* k, const bf16* v, const bf16* o, const float* lse, const bf16* dout,
                   bf16* dq, bf16* dk, bf16* dv, const AttnShape& s, float scale, cudaStream_t st) {
  check_shape(s, "attention_bwd");
  for (const auto& [p, name] : {std::pair<const void*, const char*>{q, "q"}, {k, "k"}, {v, "v"}, {o, "o"},
                                {dout, "dout"}, {dq, "dq"}, {dk, "dk"}, {dv, "dv"}})
    check_aligned(p, name, "attention_bwd");
  if (s.B == 0 || s.T == 0) return;
  if (s.D == 64) bwd<64>(q, k, v, o, lse, dout, dq, dk, dv, s, scale, st);
  else bwd<128>(q, k, v, o, lse, dout, dq, dk, dv, s, scale, st);
}

}  // namespace dhelix::cuda
