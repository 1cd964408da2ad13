// AxoNN's 3D grid on the GPU (Ops.h): the norms split around an all-reduce over x -- per-row sums in
// double over this rank's feature slice, then the row's mean / rstd (forward) or the two backward
// sums over the full width -- and the row-parallel linear's bias add. The twins of runtime/Ops3D.cc's
// CPU ops, the same formulas in the same precisions; one warp per row (8 rows a block of 256
// threads), lanes striding over the row's columns, each lane's double sum then the warp's fixed
// butterfly (the same bits on every run). Bytes moved: stats 2NC (forward) or 4NC (backward), apply
// 4NC (+ 2NC with a residual), the parameter gradients as norm_param_grads. Not yet timed.
#include "kernels/cuda/Ops.h"

namespace dhelix::cuda {

namespace {

using ops_detail::stride_grid;
using ops_detail::warp_sum;

constexpr int kWarps = 8;  // rows per block, one warp each
constexpr int kThreads = 256;

__device__ __forceinline__ float f(bf16 v) { return __bfloat162float(v); }

// Row n of the block's warp, or -1 past N.
__device__ __forceinline__ int64_t warp_row(int64_t N) {
  const int64_t n = static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32;
  return n < N ? n : -1;
}

template <bool kRms>
__global__ void stats_kernel(const bf16* __restrict__ x, double* __restrict__ st, int64_t N, int64_t C) {
  const int64_t n = warp_row(N);
  if (n < 0) return;  // whole warps leave
  const int lane = threadIdx.x & 31;
  const bf16* r = x + n * C;
  double a = 0, b = 0;
  for (int64_t k = lane; k < C; k += 32) {
    const double v = f(r[k]);
    a += v, b += v * v;
  }
  b = warp_sum(b);
  if constexpr (kRms) {
    if (lane == 0) st[n] = b;
  } else {
    a = warp_sum(a);
    if (lane == 0) st[2 * n] = a, st[2 * n + 1] = b;
  }
}

// Thread per row: the row's mean (LayerNorm) and rstd from its summed statistics, in double,
// rounded to fp32 -- once per row, not per element.
template <bool kRms>
__global__ void row_norm_kernel(const double* __restrict__ st, float* __restrict__ mean, float* __restrict__ rstd,
                                int64_t N, double Cf, double eps) {
  const int64_t n = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (n >= N) return;
  if constexpr (kRms) {
    rstd[n] = static_cast<float>(1.0 / sqrt(st[n] / Cf + eps));
  } else {
    const double mu = st[2 * n] / Cf, var = fmax(0.0, st[2 * n + 1] / Cf - mu * mu);
    mean[n] = static_cast<float>(mu), rstd[n] = static_cast<float>(1.0 / sqrt(var + eps));
  }
}

// Thread per (n, k) element, grid-stride: y = (x - mean) rstd g + b, or x rstd g (RMSNorm), in fp32.
template <bool kRms>
__global__ void apply_kernel(const bf16* __restrict__ x, const float* __restrict__ g, const float* __restrict__ b,
                             bf16* __restrict__ y, const float* __restrict__ mean, const float* __restrict__ rstd,
                             int64_t N, int64_t C) {
  const int64_t total = N * C, step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += step) {
    const int64_t n = i / C, k = i % C;
    if constexpr (kRms) y[i] = __float2bfloat16(f(x[i]) * rstd[n] * g[k]);
    else y[i] = __float2bfloat16((f(x[i]) - mean[n]) * rstd[n] * g[k] + b[k]);
  }
}

template <bool kRms>
__global__ void bwd_stats_kernel(const bf16* __restrict__ dy, const bf16* __restrict__ x,
                                 const float* __restrict__ mean, const float* __restrict__ rstd,
                                 const float* __restrict__ g, double* __restrict__ st, int64_t N, int64_t C) {
  const int64_t n = warp_row(N);
  if (n < 0) return;
  const int lane = threadIdx.x & 31;
  const bf16* dr = dy + n * C;
  const bf16* xr = x + n * C;
  double a = 0, b = 0;
  for (int64_t k = lane; k < C; k += 32) {
    if constexpr (kRms) {
      a += double(f(dr[k])) * g[k] * f(xr[k]);
    } else {
      const double dxh = double(f(dr[k])) * g[k];
      a += dxh, b += dxh * (double(f(xr[k])) - mean[n]) * rstd[n];
    }
  }
  a = warp_sum(a);
  if constexpr (kRms) {
    if (lane == 0) st[n] = a;
  } else {
    b = warp_sum(b);
    if (lane == 0) st[2 * n] = a, st[2 * n + 1] = b;
  }
}

template <bool kRms>
__global__ void bwd_apply_kernel(const bf16* __restrict__ dy, const bf16* __restrict__ x,
                                 const float* __restrict__ mean, const float* __restrict__ rstd,
                                 const double* __restrict__ st, const float* __restrict__ g,
                                 const bf16* __restrict__ residual, bf16* __restrict__ dx, int64_t N, int64_t C,
                                 double Cf) {
  const int64_t total = N * C, step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += step) {
    const int64_t n = i / C, k = i % C;
    const float rs = rstd[n], d = f(dy[i]), xv = f(x[i]);
    float o;
    if constexpr (kRms) {
      const float k3 = static_cast<float>(double(rs) * rs * rs * st[n] / Cf);
      o = rs * d * g[k] - xv * k3;
    } else {
      const float a = static_cast<float>(st[2 * n] / Cf), b = static_cast<float>(st[2 * n + 1] / Cf);
      const float xh = (xv - mean[n]) * rs;
      o = rs * (d * g[k] - a - xh * b);
    }
    if (residual != nullptr) o += f(residual[i]);
    dx[i] = __float2bfloat16(o);
  }
}

__global__ void bias_add_kernel(const bf16* x, const float* __restrict__ bias, bf16* y, int64_t N, int64_t C) {
  const int64_t total = N * C, step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += step)
    y[i] = __float2bfloat16(f(x[i]) + bias[i % C]);
}

void check_rows(const char* what, int64_t N, int64_t C, double Cf) {
  DHX_CUDA_ASSERT(N >= 0 && C >= 1 && Cf >= static_cast<double>(C), what, ": N=", N, " C=", C, " features=", Cf,
                  " (need N >= 0, C >= 1 and the full width >= this rank's C)");
  DHX_CUDA_ASSERT(cdiv(N, kWarps) < (int64_t{1} << 31), what, ": N=", N, " rows exceed the grid");
}
unsigned row_grid(int64_t N) { return static_cast<unsigned>(cdiv(N, kWarps)); }

}  // namespace

void grid_norm_stats(const bf16* x, double* st, int64_t N, int64_t C, bool rms, cudaStream_t s) {
  check_rows("grid_norm_stats", N, C, static_cast<double>(C));
  if (N == 0) return;
  if (rms) stats_kernel<true><<<row_grid(N), kThreads, 0, s>>>(x, st, N, C);
  else stats_kernel<false><<<row_grid(N), kThreads, 0, s>>>(x, st, N, C);
  DHX_CUDA_LAUNCHED(stats_kernel);
}

void grid_ln_apply(const bf16* x, const double* st, const float* g, const float* b, bf16* y, float* mean, float* rstd,
                   int64_t N, int64_t C, double Cf, double eps, cudaStream_t s) {
  check_rows("grid_ln_apply", N, C, Cf);
  if (N == 0) return;
  row_norm_kernel<false><<<static_cast<unsigned>(cdiv(N, kThreads)), kThreads, 0, s>>>(st, mean, rstd, N, Cf, eps);
  DHX_CUDA_LAUNCHED(row_norm_kernel);
  apply_kernel<false><<<stride_grid(N * C, kThreads), kThreads, 0, s>>>(x, g, b, y, mean, rstd, N, C);
  DHX_CUDA_LAUNCHED(apply_kernel);
}

void grid_rms_apply(const bf16* x, const double* st, const float* g, bf16* y, float* rstd, int64_t N, int64_t C,
                    double Cf, double eps, cudaStream_t s) {
  check_rows("grid_rms_apply", N, C, Cf);
  if (N == 0) return;
  row_norm_kernel<true><<<static_cast<unsigned>(cdiv(N, kThreads)), kThreads, 0, s>>>(st, nullptr, rstd, N, Cf, eps);
  DHX_CUDA_LAUNCHED(row_norm_kernel);
  apply_kernel<true><<<stride_grid(N * C, kThreads), kThreads, 0, s>>>(x, g, nullptr, y, nullptr, rstd, N, C);
  DHX_CUDA_LAUNCHED(apply_kernel);
}

void grid_ln_bwd_stats(const bf16* dy, const bf16* x, const float* mean, const float* rstd, const float* g, double* st,
                       int64_t N, int64_t C, cudaStream_t s) {
  check_rows("grid_ln_bwd_stats", N, C, static_cast<double>(C));
  if (N == 0) return;
  bwd_stats_kernel<false><<<row_grid(N), kThreads, 0, s>>>(dy, x, mean, rstd, g, st, N, C);
  DHX_CUDA_LAUNCHED(bwd_stats_kernel);
}

void grid_rms_bwd_stats(const bf16* dy, const bf16* x, const float* g, double* st, int64_t N, int64_t C,
                        cudaStream_t s) {
  check_rows("grid_rms_bwd_stats", N, C, static_cast<double>(C));
  if (N == 0) return;
  bwd_stats_kernel<true><<<row_grid(N), kThreads, 0, s>>>(dy, x, nullptr, nullptr, g, st, N, C);
  DHX_CUDA_LAUNCHED(bwd_stats_kernel);
}

void grid_ln_bwd_apply(const bf16* dy, const bf16* x, const float* mean, const float* rstd, const double* st,
                       const float* g, const bf16* residual, bf16* dx, float* dg, float* db, int64_t N, int64_t C,
                       double Cf, cudaStream_t s) {
  check_rows("grid_ln_bwd_apply", N, C, Cf);
  if (N == 0) return;
  bwd_apply_kernel<false><<<stride_grid(N * C, kThreads), kThreads, 0, s>>>(dy, x, mean, rstd, st, g, residual, dx, N,
                                                                            C, Cf);
  DHX_CUDA_LAUNCHED(bwd_apply_kernel);
  norm_param_grads(dy, x, mean, rstd, dg, db, N, C, true, s);
}

void grid_rms_bwd_apply(const bf16* dy, const bf16* x, const float* rstd, const double* st, const float* g,
                        const bf16* residual, bf16* dx, float* dg, int64_t N, int64_t C, double Cf, cudaStream_t s) {
  check_rows("grid_rms_bwd_apply", N, C, Cf);
  if (N == 0) return;
  bwd_apply_kernel<true><<<stride_grid(N * C, kThreads), kThreads, 0, s>>>(dy, x, nullptr, rstd, st, g, residual, dx,
                                                                           N, C, Cf);
  DHX_CUDA_LAUNCHED(bwd_apply_kernel);
  norm_param_grads(dy, x, nullptr, rstd, dg, nullptr, N, C, false, s);
}

void bias_add(const bf16* x, const float* bias, bf16* y, int64_t N, int64_t C, cudaStream_t s) {
  DHX_CUDA_ASSERT(N >= 0 && C >= 1, "bias_add: N=", N, " C=", C, " (need N >= 0, C >= 1)");
  if (N == 0) return;
  bias_add_kernel<<<stride_grid(N * C, kThreads), kThreads, 0, s>>>(x, bias, y, N, C);
  DHX_CUDA_LAUNCHED(bias_add_kernel);
}

}  // namespace dhelix::cuda
