// Pointwise activations of the GPU step (Ops.h): GELU (tanh form, computed as x sigmoid(2u)), SwiGLU
// and RoPE, forward and backward, bf16 in and out with fp32 math and one rounding per output. GELU and SwiGLU are
// grid-stride loops with 16-byte accesses (8 bf16) when the row length is a multiple of 8 and the
// pointers are 16-byte aligned, else 2-byte ones. RoPE: a thread per (row, pair i) computes the
// angle's cos/sin once in double and rotates that pair in all H heads (coalesced along i).
// Bytes moved: gelu 4n fwd / 6n bwd; swiglu 6NF fwd / 10NF bwd; rope 4 B T H D (in place).
// Not yet timed on the H100.
#include "kernels/cuda/Ops.h"

namespace dhelix::cuda {

namespace {

using ops_detail::BfVec;
using ops_detail::aligned16;
using ops_detail::stride_grid;

constexpr int kThreads = 256;
constexpr float kSqrt2OverPi = 0.7978845608028654f;
constexpr float kGeluCubic = 0.044715f;

// The tanh form of GELU, x/2 (1 + tanh u) with u = k0 (x + k1 x^3), written as x sigmoid(2u) = x / (1 +
// e^-2u) (the same function: (1 + tanh u)/2 = sigmoid(2u)): one exponential and one reciprocal
// (CUDA's tanhf is a longer sequence, and 1 + tanh u cancels for very negative x, where this form
// keeps full relative precision). e = inf (x very negative) gives s = 0 and y = -0; e = 0 gives s = 1.
__device__ __forceinline__ float gelu_sigmoid(float x) {
  const float u2 = 2.0f * kSqrt2OverPi * (x + kGeluCubic * x * x * x);
  return __frcp_rn(1.0f + __expf(-u2));
}
struct GeluFwdOp {
  __device__ float operator()(float x, float) const { return x * gelu_sigmoid(x); }
};
// d/dx [x s(2u)] = s + x 2 s (1 - s) du/dx,  s = sigmoid(2u) = (1 + t)/2, 2 s (1 - s) = (1 - t^2)/2,
// du/dx = k0 (1 + 3 k1 x^2): the tanh form's (1 + t)/2 + x/2 (1 - t^2) du/dx.
struct GeluBwdOp {
  __device__ float operator()(float dy, float x) const {
    const float sg = gelu_sigmoid(x);
    const float du = kSqrt2OverPi * (1.0f + 3.0f * kGeluCubic * x * x);
    return dy * (sg + x * (2.0f * sg * (1.0f - sg)) * du);
  }
};

// sigmoid(a) = 1 / (1 + e^-a) by __expf and a reciprocal (as GELU's; expf and an IEEE division were
// a longer sequence per element): e = inf gives 0, e = 0 gives 1.
__device__ __forceinline__ float silu_sigmoid(float a) { return __frcp_rn(1.0f + __expf(-a)); }

// Unit u covers elements [u W, u W + W) of y[N, F]; W divides F, so a unit stays in one row n.
// y = a s u with a = gate, s = 1 / (1 + e^-a).
template <int W>
__global__ void swiglu_fwd_kernel(const bf16* __restrict__ gu, bf16* __restrict__ y, int64_t F, int64_t units) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t u = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; u < units; u += stride) {
    const int64_t e = u * W, n = e / F, f = e % F;
    const BfVec<W> va = *reinterpret_cast<const BfVec<W>*>(gu + n * 2 * F + f);
    const BfVec<W> vu = *reinterpret_cast<const BfVec<W>*>(gu + n * 2 * F + F + f);
    BfVec<W> vy;
#pragma unroll
    for (int j = 0; j < W; ++j) {
      const float a = __bfloat162float(va.v[j]);
      vy.v[j] = __float2bfloat16(a * silu_sigmoid(a) * __bfloat162float(vu.v[j]));
    }
    *reinterpret_cast<BfVec<W>*>(y + e) = vy;
  }
}

// d silu(a)/da = s (1 + a (1 - s)):  dgate = dy u s (1 + a (1 - s)),  dup = dy a s.
template <int W>
__global__ void swiglu_bwd_kernel(const bf16* __restrict__ dy, const bf16* __restrict__ gu, bf16* __restrict__ dgu,
                                  int64_t F, int64_t units) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t u = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; u < units; u += stride) {
    const int64_t e = u * W, n = e / F, f = e % F;
    const BfVec<W> vd = *reinterpret_cast<const BfVec<W>*>(dy + e);
    const BfVec<W> va = *reinterpret_cast<const BfVec<W>*>(gu + n * 2 * F + f);
    const BfVec<W> vu = *reinterpret_cast<const BfVec<W>*>(gu + n * 2 * F + F + f);
    BfVec<W> da, du;
#pragma unroll
    for (int j = 0; j < W; ++j) {
      const float d = __bfloat162float(vd.v[j]), a = __bfloat162float(va.v[j]), up = __bfloat162float(vu.v[j]);
      const float sg = silu_sigmoid(a);
      da.v[j] = __float2bfloat16(d * up * sg * (1.0f + a * (1.0f - sg)));
      du.v[j] = __float2bfloat16(d * a * sg);
    }
    *reinterpret_cast<BfVec<W>*>(dgu + n * 2 * F + f) = da;
    *reinterpret_cast<BfVec<W>*>(dgu + n * 2 * F + F + f) = du;
  }
}

// Thread (bt, i), i < D/2: angle = (pos_offset + bt % T) theta^(-2i/D) in double (cpu::rope_fwd's
// expression), cos and sin rounded to fp32, sin times sign (-1: the inverse rotation); then in every
// head h: x1' = x1 c - x2 s, x2' = x2 c + x1 s on the pair (h D + i, h D + i + D/2) of row bt.
__global__ void rope_kernel(bf16* __restrict__ x, int64_t BT, int64_t T, int64_t H, int64_t D, int64_t row_stride,
                            int64_t pos_offset, double theta, float sign) {
  const int64_t half = D / 2, units = BT * half;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t u = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; u < units; u += stride) {
    const int64_t bt = u / half, i = u % half;
    const double inv_freq = pow(theta, -2.0 * static_cast<double>(i) / static_cast<double>(D));
    const double angle = static_cast<double>(pos_offset + bt % T) * inv_freq;
    const float c = static_cast<float>(cos(angle)), sn = sign * static_cast<float>(sin(angle));
    bf16* row = x + bt * row_stride + i;
    for (int64_t h = 0; h < H; ++h) {
      bf16* x1 = row + h * D;
      bf16* x2 = x1 + half;
      const float a = __bfloat162float(*x1), b = __bfloat162float(*x2);
      *x1 = __float2bfloat16(a * c - b * sn);
      *x2 = __float2bfloat16(b * c + a * sn);
    }
  }
}

void rope_apply(const char* what, bf16* x, int64_t B, int64_t T, int64_t H, int64_t D, int64_t row_stride,
                int64_t pos_offset, double theta, float sign, cudaStream_t s) {
  DHX_CUDA_ASSERT(B >= 0 && T >= 0 && H >= 1 && D >= 2 && D % 2 == 0 && H * D <= row_stride && pos_offset >= 0 &&
                      theta > 0,
                  what, ": B=", B, " T=", T, " H=", H, " D=", D, " row_stride=", row_stride, " pos_offset=",
                  pos_offset, " theta=", theta,
                  " (need D even and positive, H >= 1, H*D <= row_stride, sizes >= 0, theta > 0)");
  const int64_t units = B * T * (D / 2);
  if (units == 0) return;
  rope_kernel<<<stride_grid(units, kThreads), kThreads, 0, s>>>(x, B * T, T, H, D, row_stride, pos_offset, theta,
                                                                  sign);
  DHX_CUDA_LAUNCHED(rope_kernel);
}

void check_rows(const char* what, int64_t N, int64_t F) {
  DHX_CUDA_ASSERT(N >= 0 && F >= 1, what, ": N=", N, " F=", F, " (need N >= 0, F >= 1)");
}

}  // namespace

void gelu_fwd(const bf16* x, bf16* y, int64_t n, cudaStream_t s) { ops_detail::map2("gelu_fwd", x, x, y, n, GeluFwdOp{}, s); }

void gelu_bwd(const bf16* dy, const bf16* x, bf16* dx, int64_t n, cudaStream_t s) {
  ops_detail::map2("gelu_bwd", dy, x, dx, n, GeluBwdOp{}, s);
}

void swiglu_fwd(const bf16* gu, bf16* y, int64_t N, int64_t F, cudaStream_t s) {
  check_rows("swiglu_fwd", N, F);
  if (N == 0) return;
  if (F % 8 == 0 && aligned16(gu) && aligned16(y)) {
    swiglu_fwd_kernel<8><<<stride_grid(N * F / 8, kThreads), kThreads, 0, s>>>(gu, y, F, N * F / 8);
  } else {
    swiglu_fwd_kernel<1><<<stride_grid(N * F, kThreads), kThreads, 0, s>>>(gu, y, F, N * F);
  }
  DHX_CUDA_LAUNCHED(swiglu_fwd_kernel);
}

void swiglu_bwd(const bf16* dy, const bf16* gu, bf16* dgu, int64_t N, int64_t F, cudaStream_t s) {
  check_rows("swiglu_bwd", N, F);
  if (N == 0) return;
  if (F % 8 == 0 && aligned16(dy) && aligned16(gu) && aligned16(dgu)) {
    swiglu_bwd_kernel<8><<<stride_grid(N * F / 8, kThreads), kThreads, 0, s>>>(dy, gu, dgu, F, N * F / 8);
  } else {
    swiglu_bwd_kernel<1><<<stride_grid(N * F, kThreads), kThreads, 0, s>>>(dy, gu, dgu, F, N * F);
  }
  DHX_CUDA_LAUNCHED(swiglu_bwd_kernel);
}

void rope_fwd(bf16* x, int64_t B, int64_t T, int64_t H, int64_t D, int64_t row_stride, int64_t pos_offset,
              double theta, cudaStream_t s) {
  rope_apply("rope_fwd", x, B, T, H, D, row_stride, pos_offset, theta, 1.0f, s);
}

void rope_bwd(bf16* dx, int64_t B, int64_t T, int64_t H, int64_t D, int64_t row_stride, int64_t pos_offset,
              double theta, cudaStream_t s) {
  rope_apply("rope_bwd", dx, B, T, H, D, row_stride, pos_offset, theta, -1.0f, s);
}

}  // namespace dhelix::cuda
