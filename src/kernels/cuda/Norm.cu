// LayerNorm and RMSNorm over the last dimension C of bf16 [N, C] rows (Ops.h), forward and backward.
// One warp per row (8 rows a block of 256 threads), lanes striding over 8-bf16 (16-byte) units when
// C % 8 == 0 and the pointers are 16-byte aligned, else single elements; row sums by a fixed warp
// butterfly; two-pass variance as on the CPU (the row's re-reads hit L1). RMSNorm is the same code
// with the mean fixed at 0. The fp32 parameter gradients are sums in an order fixed by (N, C):
//   - rows that fit a lane's registers (norm_bwd_fused_kernel): one pass writes dx and each block's
//     column sums of a run of rows (warps in row order, then the block's warps in warp order);
//   - other rows: the dx kernel, then chunks of kColRows rows summed per column (the partial kernel);
// then the partials summed per column in a fixed grouping (column_final_kernel) and added to dg/db.
// The backward adds the residual stream's gradient to dx in its own pass when given one (the step's
// norm_bwd ops with residual): +2NC read, where the separate add_inplace after it moved 6NC.
// Bytes moved: forward 4NC (+ 8N stats); backward 6NC fused (+ the partials), else 6NC for dx and 4NC
// again for the partials. Measured on the H100 (2026-11-27, bench/gpu_kernels) at 111 us for GPT-2's
// LayerNorm backward in the two-kernel form (N = 16384, C = 768: ~75 MB, 25 us at 3 TB/s). The fused
// pass (2026-11-28) is not yet timed; the kernel bench times both (norm_bwd_two_kernel).
#include "kernels/cuda/Ops.h"

namespace dhelix::cuda {

namespace {

using ops_detail::BfVec;
using ops_detail::aligned16;
using ops_detail::warp_sum;

constexpr int kNormWarps = 8;    // rows per block of the row kernels, one warp each
constexpr int kColThreads = 128;  // columns per block of the partial kernel, one thread each
constexpr int kColRows = 128;     // rows per partial sum
constexpr int kBatch = 8;         // rows a partial-sum thread loads before adding them

// A warp per row; lane l visits the row's W-bf16 units l, l + 32, l + 64, ... in that order, each
// pass's sum over them in that order and then by the warp butterfly. K = 0: each pass re-reads the
// units from memory (any C % W == 0). K > 0 (W = 8, C <= 8 * 32 * K): the lane's K units are read
// once into registers and every pass visits those -- the same values in the same order, so the
// same bits, from one read of the row instead of three passes forward or two backward. Measured on
// the H100 (2026-11-27) before registers: GPT-2's LayerNorm forward (N = 16384, C = 768) at 40 us,
// against ~17 us for its 50 MB at 3 TB/s. Not yet re-timed.
template <int W, int K> struct LaneUnits {
  BfVec<W> v[K > 0 ? K : 1];
  // Loads the lane's units (K > 0) of the row `r` of `units` units.
  __device__ __forceinline__ void load(const BfVec<W>* r, int lane, int64_t units) {
    if constexpr (K > 0) {
#pragma unroll
      for (int k = 0; k < K; ++k)
        if (lane + 32 * k < units) v[k] = r[lane + 32 * k];
    }
  }
  // f(unit index u, its slot k among the lane's (0 when K = 0), its values) over the lane's units
  // in order; k is a constant after unrolling, so a sibling LaneUnits' v[k] stays in registers.
  template <typename F> __device__ __forceinline__ void each(const BfVec<W>* r, int lane, int64_t units, F f) const {
    if constexpr (K > 0) {
#pragma unroll
      for (int k = 0; k < K; ++k)
        if (lane + 32 * k < units) f(static_cast<int64_t>(lane + 32 * k), k, v[k]);
    } else {
      for (int64_t u = lane; u < units; u += 32) f(u, 0, r[u]);
    }
  }
};

// Row n = blockIdx.x * kNormWarps + warp. kLayer: mean = sum x / C, var = sum (x - mean)^2 / C;
// else (RMSNorm) mean := 0, so var is mean(x^2). y = (x - mean) rstd g (+ b).
template <int W, int K, bool kLayer>
__global__ void norm_fwd_kernel(const bf16* __restrict__ x, const float* __restrict__ g, const float* __restrict__ b,
                                bf16* __restrict__ y, float* __restrict__ mean, float* __restrict__ rstd, int64_t N,
                                int64_t C, float eps) {
  const int64_t n = static_cast<int64_t>(blockIdx.x) * kNormWarps + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (n >= N) return;  // the whole warp: no block-wide barrier follows
  const BfVec<W>* xr = reinterpret_cast<const BfVec<W>*>(x + n * C);
  BfVec<W>* yr = reinterpret_cast<BfVec<W>*>(y + n * C);
  const int64_t units = C / W;
  LaneUnits<W, K> row;
  row.load(xr, lane, units);
  float mu = 0.0f;
  if constexpr (kLayer) {
    float sum = 0.0f;
    row.each(xr, lane, units, [&](int64_t, int, const BfVec<W>& v) {
#pragma unroll
      for (int j = 0; j < W; ++j) sum += __bfloat162float(v.v[j]);
    });
    mu = warp_sum(sum) / static_cast<float>(C);
  }
  float sq = 0.0f;
  row.each(xr, lane, units, [&](int64_t, int, const BfVec<W>& v) {
#pragma unroll
    for (int j = 0; j < W; ++j) {
      const float d = __bfloat162float(v.v[j]) - mu;
      sq += d * d;
    }
  });
  const float rs = 1.0f / sqrtf(warp_sum(sq) / static_cast<float>(C) + eps);
  row.each(xr, lane, units, [&](int64_t u, int, const BfVec<W>& v) {
    BfVec<W> o;
#pragma unroll
    for (int j = 0; j < W; ++j) {
      const int64_t c = u * W + j;
      const float yv = (__bfloat162float(v.v[j]) - mu) * rs * g[c];
      o.v[j] = __float2bfloat16(b != nullptr ? yv + b[c] : yv);
    }
    yr[u] = o;
  });
  if (lane == 0) {
    if constexpr (kLayer) mean[n] = mu;
    rstd[n] = rs;
  }
}

// dx of row n (one warp, lane `lane`), the CPU twin's algebra. LayerNorm, xh = (x - mean) rstd,
// dxh = dy g: dx = rstd (dxh - mean(dxh) - xh mean(dxh xh)). RMSNorm: dx = rstd dy g - x rstd^3
// mean(dy g x). xs, ds: the row's x and dy units (K > 0: in registers; K = 0: read from xr, dyr).
// addr (null, or the row of a gradient to add: the residual stream's): dx rounded to bf16, then
// the sum rounded again -- the bits of writing dx and then add_inplace(dx, add), one pass fewer.
template <int W, int K, bool kLayer>
__device__ __forceinline__ void row_dx(const LaneUnits<W, K>& xs, const LaneUnits<W, K>& ds,
                                       const BfVec<W>* xr, const BfVec<W>* dyr, BfVec<W>* dxr,
                                       const BfVec<W>* addr, const float* __restrict__ g, float mu, float rs,
                                       int lane, int64_t units, int64_t C) {
  // Unit u's dy (slot k of the lane's), from registers or memory.
  auto dy_unit = [&](int64_t u, int k) -> BfVec<W> {
    if constexpr (K > 0) return ds.v[k];
    else return dyr[u];
  };
  float a = 0.0f, bb = 0.0f;  // LayerNorm: sum dxh, sum dxh xh; RMSNorm: a = sum dy g x
  xs.each(xr, lane, units, [&](int64_t u, int k, const BfVec<W>& xv) {
    const BfVec<W> dv = dy_unit(u, k);
#pragma unroll
    for (int j = 0; j < W; ++j) {
      const int64_t c = u * W + j;
      const float dxh = __bfloat162float(dv.v[j]) * g[c], xc = __bfloat162float(xv.v[j]);
      if constexpr (kLayer) {
        a += dxh;
        bb += dxh * (xc - mu) * rs;
      } else {
        a += dxh * xc;
      }
    }
  });
  a = warp_sum(a) / static_cast<float>(C);
  if constexpr (kLayer) bb = warp_sum(bb) / static_cast<float>(C);
  const float kx = rs * rs * rs * a;  // RMSNorm's x coefficient (a already divided by C)
  xs.each(xr, lane, units, [&](int64_t u, int k, const BfVec<W>& xv) {
    const BfVec<W> dv = dy_unit(u, k);
    BfVec<W> o, av;
    if (addr != nullptr) av = addr[u];
#pragma unroll
    for (int j = 0; j < W; ++j) {
      const int64_t c = u * W + j;
      const float dyc = __bfloat162float(dv.v[j]), xc = __bfloat162float(xv.v[j]);
      if constexpr (kLayer) {
        const float xh = (xc - mu) * rs;
        o.v[j] = __float2bfloat16(rs * (dyc * g[c] - a - xh * bb));
      } else {
        o.v[j] = __float2bfloat16(rs * dyc * g[c] - xc * kx);
      }
      if (addr != nullptr) o.v[j] = __float2bfloat16(__bfloat162float(o.v[j]) + __bfloat162float(av.v[j]));
    }
    dxr[u] = o;
  });
}

// dx of row n = blockIdx.x * kNormWarps + warp (row_dx). Units as the forward's (K > 0: x's and
// dy's in registers).
template <int W, int K, bool kLayer>
__global__ void norm_bwd_dx_kernel(const bf16* __restrict__ dy, const bf16* __restrict__ x, const float* __restrict__ g,
                                   const float* __restrict__ mean, const float* __restrict__ rstd,
                                   bf16* __restrict__ dx, const bf16* __restrict__ add, int64_t N, int64_t C) {
  const int64_t n = static_cast<int64_t>(blockIdx.x) * kNormWarps + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (n >= N) return;
  const BfVec<W>* xr = reinterpret_cast<const BfVec<W>*>(x + n * C);
  const BfVec<W>* dyr = reinterpret_cast<const BfVec<W>*>(dy + n * C);
  const int64_t units = C / W;
  LaneUnits<W, K> xs, ds;
  xs.load(xr, lane, units);
  ds.load(dyr, lane, units);
  const BfVec<W>* addr = add != nullptr ? reinterpret_cast<const BfVec<W>*>(add + n * C) : nullptr;
  row_dx<W, K, kLayer>(xs, ds, xr, dyr, reinterpret_cast<BfVec<W>*>(dx + n * C), addr, g, kLayer ? mean[n] : 0.0f,
                       rstd[n], lane, units, C);
}

// The whole backward in one pass over x and dy (K > 0: the row in registers, C <= 256 K): each warp
// takes `rows` consecutive rows, from (blockIdx.x * kNormWarps + warp) * rows, writing each row's dx
// as norm_bwd_dx_kernel does (the same bits) and adding the row's share of the parameter gradients
// to its lanes' fp32 column sums (a lane's columns are the same in every row: units lane, lane + 32,
// ...), in row order. LayerNorm: sums of dy xh (xh = (x - mean) rstd) and of dy; RMSNorm: of
// dy x rstd (the CPU's product order). At the end the block's 8 warps' sums are added per column in
// warp order through shared memory (one parameter at a time: kNormWarps x C floats) into
// part[blockIdx.x][p][col]; column_final_kernel adds the blocks' partials in block order. Every sum
// has an order fixed by (N, C) alone. Bytes: x, dy read once, dx written (6NC) + the partials.
// Replaces 10 NC of the two-kernel form (dx, then chunk partials re-reading x and dy by columns:
// 111 us on the H100 for GPT-2's N = 16384, C = 768, 2026-11-27). Not yet timed on a GPU.
template <int K, bool kLayer>
__global__ void __launch_bounds__(kNormWarps * 32, K <= 4 ? 2 : 1)
    norm_bwd_fused_kernel(const bf16* __restrict__ dy, const bf16* __restrict__ x, const float* __restrict__ g,
                          const float* __restrict__ mean, const float* __restrict__ rstd, bf16* __restrict__ dx,
                          const bf16* __restrict__ add, float* __restrict__ part, int64_t N, int64_t C, int rows) {
  constexpr int W = 8, kParts = kLayer ? 2 : 1;
  extern __shared__ __align__(16) float red[];  // [kNormWarps][C]
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const int64_t units = C / W;
  float acc[kParts][K][W];
#pragma unroll
  for (int p = 0; p < kParts; ++p)
#pragma unroll
    for (int k = 0; k < K; ++k)
#pragma unroll
      for (int j = 0; j < W; ++j) acc[p][k][j] = 0.0f;
  const int64_t first = (static_cast<int64_t>(blockIdx.x) * kNormWarps + warp) * rows;
  for (int i = 0; i < rows; ++i) {
    const int64_t n = first + i;
    if (n >= N) break;  // this warp's share only: the barriers below are outside the loop
    const BfVec<W>* xr = reinterpret_cast<const BfVec<W>*>(x + n * C);
    const BfVec<W>* dyr = reinterpret_cast<const BfVec<W>*>(dy + n * C);
    LaneUnits<W, K> xs, ds;
    xs.load(xr, lane, units);
    ds.load(dyr, lane, units);
    const float mu = kLayer ? mean[n] : 0.0f, rs = rstd[n];
    const BfVec<W>* addr = add != nullptr ? reinterpret_cast<const BfVec<W>*>(add + n * C) : nullptr;
    row_dx<W, K, kLayer>(xs, ds, xr, dyr, reinterpret_cast<BfVec<W>*>(dx + n * C), addr, g, mu, rs, lane, units, C);
#pragma unroll
    for (int k = 0; k < K; ++k) {
      if (lane + 32 * k >= units) continue;
#pragma unroll
      for (int j = 0; j < W; ++j) {
        const float d = __bfloat162float(ds.v[k].v[j]), xc = __bfloat162float(xs.v[k].v[j]);
        if constexpr (kLayer) {
          acc[0][k][j] += d * ((xc - mu) * rs);
          acc[1][k][j] += d;
        } else {
          acc[0][k][j] += d * xc * rs;
        }
      }
    }
  }
#pragma unroll
  for (int p = 0; p < kParts; ++p) {
#pragma unroll
    for (int k = 0; k < K; ++k) {
      const int64_t u = lane + 32 * k;
      if (u >= units) continue;
      float4* dst = reinterpret_cast<float4*>(red + warp * C + u * W);
      dst[0] = make_float4(acc[p][k][0], acc[p][k][1], acc[p][k][2], acc[p][k][3]);
      dst[1] = make_float4(acc[p][k][4], acc[p][k][5], acc[p][k][6], acc[p][k][7]);
    }
    __syncthreads();  // every warp's sums of parameter p are in red
    for (int64_t col = threadIdx.x; col < C; col += blockDim.x) {
      float s = 0.0f;
#pragma unroll
      for (int w = 0; w < kNormWarps; ++w) s += red[w * C + col];
      part[(static_cast<int64_t>(blockIdx.x) * kParts + p) * C + col] = s;
    }
    __syncthreads();  // red is read before the next parameter's sums overwrite it
  }
}

// Rows per warp of norm_bwd_fused_kernel: about 512 blocks of kNormWarps warps once N allows (enough
// to fill a GPU of 132 SMs a few times over, few partials to add), at most kFusedRowsMax, at least 1.
// A function of N alone, so the sums' order -- and the bits -- are the same on every GPU.
constexpr int kFusedRowsMax = 16;
int fused_rows(int64_t N) {
  const int64_t r = N / (int64_t{512} * kNormWarps);
  return static_cast<int>(r < 1 ? 1 : r > kFusedRowsMax ? kFusedRowsMax : r);
}

// Lanes' units in registers for a row of C (C % 8 == 0): the least K in {1, 2, 4, 8} with
// C <= 256 K, else 0 (each pass re-reads the row).
int reg_units(int64_t C) {
  for (int k : {1, 2, 4, 8})
    if (C <= int64_t{256} * k) return k;
  return 0;
}

// Block (column tile, chunk): thread col sums rows [chunk kColRows, +kColRows) in order:
// part[chunk][0][col] = sum dy xh (LayerNorm: xh = (x - mean) rstd; RMSNorm: dy x rstd, the CPU's
// product order), and for LayerNorm part[chunk][1][col] = sum dy. `parts` arrays per chunk.
template <bool kLayer>
__global__ void norm_bwd_partial_kernel(const bf16* __restrict__ dy, const bf16* __restrict__ x,
                                        const float* __restrict__ mean, const float* __restrict__ rstd,
                                        float* __restrict__ part, int64_t N, int64_t C) {
  constexpr int kParts = kLayer ? 2 : 1;
  const int64_t col = static_cast<int64_t>(blockIdx.x) * kColThreads + threadIdx.x;
  const int64_t chunk = blockIdx.y;
  if (col >= C) return;
  const int64_t r0 = chunk * kColRows, r1 = r0 + kColRows < N ? r0 + kColRows : N;
  float sg = 0.0f, sb = 0.0f;
  auto add = [&](float d, float xc, float mu, float rs) {
    if constexpr (kLayer) {
      sg += d * ((xc - mu) * rs);
      sb += d;
    } else {
      sg += d * xc * rs;
    }
  };
  // kBatch rows' loads issued before any of their adds (a thread's loads are otherwise one
  // latency each, in a row), then added in row order: the same sums as one row at a time.
  int64_t r = r0;
  for (; r + kBatch <= r1; r += kBatch) {
    float d[kBatch], xc[kBatch], mu[kBatch], rs[kBatch];
#pragma unroll
    for (int j = 0; j < kBatch; ++j) {
      d[j] = __bfloat162float(dy[(r + j) * C + col]);
      xc[j] = __bfloat162float(x[(r + j) * C + col]);
      mu[j] = kLayer ? mean[r + j] : 0.0f;
      rs[j] = rstd[r + j];
    }
#pragma unroll
    for (int j = 0; j < kBatch; ++j) add(d[j], xc[j], mu[j], rs[j]);
  }
  for (; r < r1; ++r)
    add(__bfloat162float(dy[r * C + col]), __bfloat162float(x[r * C + col]), kLayer ? mean[r] : 0.0f, rstd[r]);
  part[(chunk * kParts) * C + col] = sg;
  if constexpr (kLayer) part[(chunk * kParts + 1) * C + col] = sb;
}

// out[col] += the sum over chunks c of part[c * stride + col], in a fixed order: a block of 256
// threads takes kFinalCols columns, its kFinalGroups groups of threads sum chunks grp, grp +
// kFinalGroups, ... of a column in that order, then the groups' sums are added in group order.
// (One thread per column walking every chunk left a few SMs walking 512 partials a thread.)
constexpr int kFinalCols = 32, kFinalGroups = 8;
__global__ void __launch_bounds__(kFinalCols * kFinalGroups)
    column_final_kernel(const float* __restrict__ part, float* __restrict__ out, int64_t chunks, int64_t stride,
                        int64_t C) {
  __shared__ float sums[kFinalGroups][kFinalCols];
  const int tc = static_cast<int>(threadIdx.x) % kFinalCols, grp = static_cast<int>(threadIdx.x) / kFinalCols;
  const int64_t col = static_cast<int64_t>(blockIdx.x) * kFinalCols + tc;
  float acc = 0.0f;
  if (col < C)
    for (int64_t c = grp; c < chunks; c += kFinalGroups) acc += part[c * stride + col];
  sums[grp][tc] = acc;
  __syncthreads();
  if (grp != 0 || col >= C) return;
  float total = 0.0f;
#pragma unroll
  for (int k = 0; k < kFinalGroups; ++k) total += sums[k][tc];
  out[col] += total;
}

// dg (+)= and, LayerNorm with db, db (+)= the column sums of part[chunks][parts][C].
void add_partials(const float* part, float* dg, float* db, int64_t chunks, int64_t parts, int64_t C, cudaStream_t s) {
  const auto grid = static_cast<unsigned>(cdiv(C, kFinalCols));
  column_final_kernel<<<grid, kFinalCols * kFinalGroups, 0, s>>>(part, dg, chunks, parts * C, C);
  DHX_CUDA_LAUNCHED(column_final_kernel);
  if (parts > 1 && db != nullptr) {
    column_final_kernel<<<grid, kFinalCols * kFinalGroups, 0, s>>>(part + C, db, chunks, parts * C, C);
    DHX_CUDA_LAUNCHED(column_final_kernel);
  }
}

void check_norm(const char* what, int64_t N, int64_t C) {
  DHX_CUDA_ASSERT(N >= 0 && C >= 1, what, ": N=", N, " C=", C, " (need N >= 0, C >= 1)");
  DHX_CUDA_ASSERT(cdiv(N, kNormWarps) < (int64_t{1} << 31), what, ": N=", N, " rows exceed the grid");
}

template <bool kLayer>
void norm_fwd(const char* what, const bf16* x, const float* g, const float* b, bf16* y, float* mean, float* rstd,
              int64_t N, int64_t C, float eps, cudaStream_t s) {
  check_norm(what, N, C);
  if (N == 0) return;
  const auto grid = static_cast<unsigned>(cdiv(N, kNormWarps));
  const bool vec = C % 8 == 0 && aligned16(x) && aligned16(y);
  const dim3 block(kNormWarps * 32);
  switch (vec ? reg_units(C) : -1) {
    case 1: norm_fwd_kernel<8, 1, kLayer><<<grid, block, 0, s>>>(x, g, b, y, mean, rstd, N, C, eps); break;
    case 2: norm_fwd_kernel<8, 2, kLayer><<<grid, block, 0, s>>>(x, g, b, y, mean, rstd, N, C, eps); break;
    case 4: norm_fwd_kernel<8, 4, kLayer><<<grid, block, 0, s>>>(x, g, b, y, mean, rstd, N, C, eps); break;
    case 8: norm_fwd_kernel<8, 8, kLayer><<<grid, block, 0, s>>>(x, g, b, y, mean, rstd, N, C, eps); break;
    case 0: norm_fwd_kernel<8, 0, kLayer><<<grid, block, 0, s>>>(x, g, b, y, mean, rstd, N, C, eps); break;
    default: norm_fwd_kernel<1, 0, kLayer><<<grid, block, 0, s>>>(x, g, b, y, mean, rstd, N, C, eps); break;
  }
  DHX_CUDA_LAUNCHED(norm_fwd_kernel);
}

// The fused backward (norm_bwd_fused_kernel) for K units a lane.
template <int K, bool kLayer>
void fused_bwd(const bf16* dy, const bf16* x, const float* g, const float* mean, const float* rstd, bf16* dx,
               const bf16* add, float* dg, float* db, int64_t N, int64_t C, cudaStream_t s) {
  constexpr int64_t kParts = kLayer ? 2 : 1;
  const int rows = fused_rows(N);
  const int64_t blocks = cdiv(N, int64_t{kNormWarps} * rows);
  const size_t smem = sizeof(float) * kNormWarps * static_cast<size_t>(C);  // 64 KiB at C = 2048
  // The kernel's most (C = 256 K), the same on every call: two threads launching it with different C
  // cannot leave the limit below either's need.
  constexpr size_t kMostSmem = sizeof(float) * kNormWarps * 256 * K;
  if constexpr (kMostSmem > 48 * 1024)
    DHX_CUDA(cudaFuncSetAttribute(norm_bwd_fused_kernel<K, kLayer>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  static_cast<int>(kMostSmem)));
  float* part = nullptr;  // [blocks, parts, C]
  scratch_malloc(&part, blocks * kParts * C * sizeof(float), s);
  norm_bwd_fused_kernel<K, kLayer><<<static_cast<unsigned>(blocks), kNormWarps * 32, smem, s>>>(
      dy, x, g, mean, rstd, dx, add, part, N, C, rows);
  DHX_CUDA_LAUNCHED(norm_bwd_fused_kernel);
  add_partials(part, dg, db, blocks, kParts, C, s);
  DHX_CUDA(cudaFreeAsync(part, s));
}

template <bool kLayer>
void param_grads(const char* what, const bf16* dy, const bf16* x, const float* mean, const float* rstd, float* dg,
                 float* db, int64_t N, int64_t C, cudaStream_t s);

// The fused kernel where a lane's units fit its registers: K = the units a lane has (C / 8 / 32
// rounded up, so no register is spent on a unit no lane has: GPT-2's C = 768 is 3), up to 4 -- two
// blocks an SM at <= 128 registers -- and for RMSNorm (half the column sums) 8. Else the dx kernel,
// then the parameter gradients by column chunks (param_grads).
template <bool kLayer>
void norm_bwd(const char* what, const bf16* dy, const bf16* x, const float* g, const float* mean, const float* rstd,
              bf16* dx, const bf16* add, float* dg, float* db, int64_t N, int64_t C, cudaStream_t s,
              bool fuse = true) {
  check_norm(what, N, C);
  if (N == 0) return;
  const bool vec = C % 8 == 0 && aligned16(dy) && aligned16(x) && aligned16(dx) && (add == nullptr || aligned16(add));
  const int64_t lane_units = vec && fuse ? cdiv(C / 8, int64_t{32}) : 0;
  switch (lane_units) {
    case 1: return fused_bwd<1, kLayer>(dy, x, g, mean, rstd, dx, add, dg, db, N, C, s);
    case 2: return fused_bwd<2, kLayer>(dy, x, g, mean, rstd, dx, add, dg, db, N, C, s);
    case 3: return fused_bwd<3, kLayer>(dy, x, g, mean, rstd, dx, add, dg, db, N, C, s);
    case 4: return fused_bwd<4, kLayer>(dy, x, g, mean, rstd, dx, add, dg, db, N, C, s);
    case 5: case 6: case 7: case 8:
      if constexpr (!kLayer) return fused_bwd<8, kLayer>(dy, x, g, mean, rstd, dx, add, dg, db, N, C, s);
      break;
    default: break;
  }
  const int K = vec ? reg_units(C) : -1;
  const auto grid = static_cast<unsigned>(cdiv(N, kNormWarps));
  const dim3 block(kNormWarps * 32);
  switch (K) {
    case 1: norm_bwd_dx_kernel<8, 1, kLayer><<<grid, block, 0, s>>>(dy, x, g, mean, rstd, dx, add, N, C); break;
    case 2: norm_bwd_dx_kernel<8, 2, kLayer><<<grid, block, 0, s>>>(dy, x, g, mean, rstd, dx, add, N, C); break;
    case 4: norm_bwd_dx_kernel<8, 4, kLayer><<<grid, block, 0, s>>>(dy, x, g, mean, rstd, dx, add, N, C); break;
    case 8: norm_bwd_dx_kernel<8, 8, kLayer><<<grid, block, 0, s>>>(dy, x, g, mean, rstd, dx, add, N, C); break;
    case 0: norm_bwd_dx_kernel<8, 0, kLayer><<<grid, block, 0, s>>>(dy, x, g, mean, rstd, dx, add, N, C); break;
    default: norm_bwd_dx_kernel<1, 0, kLayer><<<grid, block, 0, s>>>(dy, x, g, mean, rstd, dx, add, N, C); break;
  }
  DHX_CUDA_LAUNCHED(norm_bwd_dx_kernel);
  param_grads<kLayer>(what, dy, x, mean, rstd, dg, db, N, C, s);
}

template <bool kLayer>
void param_grads(const char* what, const bf16* dy, const bf16* x, const float* mean, const float* rstd, float* dg,
                 float* db, int64_t N, int64_t C, cudaStream_t s) {
  const int64_t chunks = cdiv(N, kColRows), parts = kLayer ? 2 : 1;
  DHX_CUDA_ASSERT(chunks <= 65535, what, ": N=", N, " rows is more than 65535 chunks of ", kColRows);
  float* part = nullptr;  // [chunks, parts, C]
  scratch_malloc(&part, chunks * parts * C * sizeof(float), s);
  norm_bwd_partial_kernel<kLayer>
      <<<dim3(static_cast<unsigned>(cdiv(C, kColThreads)), static_cast<unsigned>(chunks)), kColThreads, 0, s>>>(
          dy, x, mean, rstd, part, N, C);
  DHX_CUDA_LAUNCHED(norm_bwd_partial_kernel);
  add_partials(part, dg, db, chunks, parts, C, s);
  DHX_CUDA(cudaFreeAsync(part, s));
}

}  // namespace

void norm_param_grads(const bf16* dy, const bf16* x, const float* mean, const float* rstd, float* dg, float* db,
                      int64_t N, int64_t C, bool layer, cudaStream_t s) {
  check_norm("norm_param_grads", N, C);
  if (N == 0) return;
  if (layer) param_grads<true>("norm_param_grads", dy, x, mean, rstd, dg, db, N, C, s);
  else param_grads<false>("norm_param_grads", dy, x, nullptr, rstd, dg, nullptr, N, C, s);
}

void norm_bwd_two_kernel(const bf16* dy, const bf16* x, const float* g, const float* mean, const float* rstd,
                         bf16* dx, float* dg, float* db, int64_t N, int64_t C, bool layer, cudaStream_t s,
                         const bf16* add) {
  if (layer) norm_bwd<true>("norm_bwd_two_kernel", dy, x, g, mean, rstd, dx, add, dg, db, N, C, s, false);
  else norm_bwd<false>("norm_bwd_two_kernel", dy, x, g, nullptr, rstd, dx, add, dg, nullptr, N, C, s, false);
}

void layernorm_fwd(const bf16* x, const float* g, const float* b, bf16* y, float* mean, float* rstd, int64_t N,
                   int64_t C, float eps, cudaStream_t s) {
  norm_fwd<true>("layernorm_fwd", x, g, b, y, mean, rstd, N, C, eps, s);
}

void layernorm_bwd(const bf16* dy, const bf16* x, const float* g, const float* mean, const float* rstd, bf16* dx,
                   float* dg, float* db, int64_t N, int64_t C, cudaStream_t s, const bf16* add) {
  norm_bwd<true>("layernorm_bwd", dy, x, g, mean, rstd, dx, add, dg, db, N, C, s);
}

void rmsnorm_fwd(const bf16* x, const float* g, bf16* y, float* rstd, int64_t N, int64_t C, float eps,
                 cudaStream_t s) {
  norm_fwd<false>("rmsnorm_fwd", x, g, nullptr, y, nullptr, rstd, N, C, eps, s);
}

void rmsnorm_bwd(const bf16* dy, const bf16* x, const float* g, const float* rstd, bf16* dx, float* dg, int64_t N,
                 int64_t C, cudaStream_t s, const bf16* add) {
  norm_bwd<false>("rmsnorm_bwd", dy, x, g, nullptr, rstd, dx, add, dg, nullptr, N, C, s);
}

}  // namespace dhelix::cuda
