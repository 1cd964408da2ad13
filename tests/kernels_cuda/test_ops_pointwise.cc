// Pointwise kernels on the GPU (kernels/cuda/Ops.h): GELU, SwiGLU, RoPE, residual adds and casts,
// against their CPU twins (cpu::gelu_*, swiglu_*, rope_*, add, add_inplace <float>) on the same
// bf16-rounded inputs; outputs poisoned before each call. Sizes cover the 16-byte path (multiples
// of 8, aligned), ragged ones and misaligned pointers (the 2-byte path).
//
// Bounds: every output is rounded once to bf16 (u = 2^-8 relative) from an fp32 value that differs
// from the CPU's by fp32 noise only (the GPU's GELU as x sigmoid(2u) and SwiGLU's sigmoid, each with
// __expf and a reciprocal, against the CPU's tanh form and polynomial exp: ~1e-6 relative, __expf's
// error growing with its argument's size ~ 10; RoPE's cos and sin are the same double values
// rounded to fp32): u + 1e-5. An add is
// the CPU's fp32 add then a round to nearest even (to_bf16's rule), and a cast that rounding alone,
// so those must match bit for bit.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "CudaTest.h"
#include "kernels/cpu/Kernels.h"
#include "kernels/cuda/Ops.h"

namespace dhelix::cuda::test {
namespace {

constexpr double kBf16OutBound = kBf16U + 1e-5;  // one rounding + fp32 noise
const int64_t kSizes[] = {1, 13, 4096, 100003};

bool same_bits(const std::vector<bf16>& a, const std::vector<bf16>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(bf16)) == 0;
}

TEST(CudaOpsPointwise, GeluForwardAndBackwardMatchCpu) {
  DHX_REQUIRE_GPU();
  uint64_t seed = 1;
  for (int64_t n : kSizes) {
    const auto x = round_bf16(randn(n, seed++, 2.0f)), dy = round_bf16(randn(n, seed++));
    std::vector<float> y(n), dx(n);
    cpu::gelu_fwd<float>(x.data(), y.data(), n);
    cpu::gelu_bwd<float>(dy.data(), x.data(), dx.data(), n);
    DevBuf<bf16> gx(to_bf16(x)), gdy(to_bf16(dy)), gy(n), gdx(n);
    gy.poison(), gdx.poison();
    gelu_fwd(gx.get(), gy.get(), n, nullptr);
    gelu_bwd(gdy.get(), gx.get(), gdx.get(), n, nullptr);
    EXPECT_LE(rel_err(to_f32(gy.download()), y), kBf16OutBound) << "gelu_fwd n=" << n;
    EXPECT_LE(rel_err(to_f32(gdx.download()), dx), kBf16OutBound) << "gelu_bwd n=" << n;
  }
}

TEST(CudaOpsPointwise, SwigluForwardAndBackwardMatchCpu) {
  DHX_REQUIRE_GPU();
  struct Shape { int64_t N, F; };
  uint64_t seed = 100;
  for (const Shape d : {Shape{1, 8}, Shape{7, 13}, Shape{64, 256}, Shape{33, 1000}, Shape{3, 1}}) {
    const auto gu = round_bf16(randn(d.N * 2 * d.F, seed++, 2.0f)), dy = round_bf16(randn(d.N * d.F, seed++));
    // Oracle: the CPU twin in double (std::exp; its float instance uses a fast polynomial exp), so
    // the bound measures the GPU's own rounding only.
    const std::vector<double> gud(gu.begin(), gu.end()), dyd(dy.begin(), dy.end());
    std::vector<double> yd(d.N * d.F), dgud(d.N * 2 * d.F);
    cpu::swiglu_fwd<double>(gud.data(), yd.data(), d.N, d.F);
    cpu::swiglu_bwd<double>(dyd.data(), gud.data(), dgud.data(), d.N, d.F);
    const std::vector<float> y(yd.begin(), yd.end()), dgu(dgud.begin(), dgud.end());
    DevBuf<bf16> ggu(to_bf16(gu)), gdy(to_bf16(dy)), gy(d.N * d.F), gdgu(d.N * 2 * d.F);
    gy.poison(), gdgu.poison();
    swiglu_fwd(ggu.get(), gy.get(), d.N, d.F, nullptr);
    swiglu_bwd(gdy.get(), ggu.get(), gdgu.get(), d.N, d.F, nullptr);
    EXPECT_LE(rel_err(to_f32(gy.download()), y), kBf16OutBound) << "swiglu_fwd N=" << d.N << " F=" << d.F;
    EXPECT_LE(rel_err(to_f32(gdgu.download()), dgu), kBf16OutBound) << "swiglu_bwd N=" << d.N << " F=" << d.F;
  }
}

// Arguments where the GPU's sigmoid forms overflow (__expf(-2u) or __expf(-a) past ~88: inf, so the
// sigmoid is 0 and GELU's y is -0) or saturate, which the random inputs above (|x| < ~10) never
// reach: every output finite, and within the file's bound of the CPU twins in double (std::tanh,
// std::exp: the exact values, whose bf16 roundings the bound allows). 16 values, so the 16-byte
// path runs; each also as SwiGLU's gate, with an up input of 1.5.
TEST(CudaOpsPointwise, GeluAndSwigluAtLargeArgumentsAreFiniteAndMatchCpu) {
  DHX_REQUIRE_GPU();
  const std::vector<float> x = {-88.0f, -60.0f, -30.0f, -12.0f, -9.5f, -3.0f, -0.5f, 0.0f,
                                0.5f,   3.0f,   9.5f,   12.0f,  30.0f, 60.0f, 88.0f, -1e4f};
  const int64_t n = static_cast<int64_t>(x.size());
  const std::vector<float> xr = round_bf16(x), dy(x.size(), 1.0f);
  auto finite = [](const std::vector<float>& v) {
    return std::all_of(v.begin(), v.end(), [](float f) { return std::isfinite(f); });
  };
  {  // GELU
    const std::vector<double> xd(xr.begin(), xr.end()), dyd(dy.begin(), dy.end());
    std::vector<double> yd(x.size()), dxd(x.size());
    cpu::gelu_fwd<double>(xd.data(), yd.data(), n);
    cpu::gelu_bwd<double>(dyd.data(), xd.data(), dxd.data(), n);
    DevBuf<bf16> gx(to_bf16(xr)), gdy(to_bf16(dy)), gy(n), gdx(n);
    gy.poison(), gdx.poison();
    gelu_fwd(gx.get(), gy.get(), n, nullptr);
    gelu_bwd(gdy.get(), gx.get(), gdx.get(), n, nullptr);
    const std::vector<float> y = to_f32(gy.download()), dx = to_f32(gdx.download());
    EXPECT_TRUE(finite(y)) << "gelu_fwd";
    EXPECT_TRUE(finite(dx)) << "gelu_bwd";
    EXPECT_LE(rel_err(y, std::vector<float>(yd.begin(), yd.end())), kBf16OutBound) << "gelu_fwd";
    EXPECT_LE(rel_err(dx, std::vector<float>(dxd.begin(), dxd.end())), kBf16OutBound) << "gelu_bwd";
  }
  {  // SwiGLU: one row of F = 16, gate x, up 1.5
    std::vector<float> gu(2 * x.size());
    for (size_t i = 0; i < x.size(); ++i) gu[i] = xr[i], gu[x.size() + i] = 1.5f;
    const std::vector<double> gud(gu.begin(), gu.end()), dyd(dy.begin(), dy.end());
    std::vector<double> yd(x.size()), dgud(gu.size());
    cpu::swiglu_fwd<double>(gud.data(), yd.data(), 1, n);
    cpu::swiglu_bwd<double>(dyd.data(), gud.data(), dgud.data(), 1, n);
    DevBuf<bf16> ggu(to_bf16(gu)), gdy(to_bf16(dy)), gy(n), gdgu(2 * n);
    gy.poison(), gdgu.poison();
    swiglu_fwd(ggu.get(), gy.get(), 1, n, nullptr);
    swiglu_bwd(gdy.get(), ggu.get(), gdgu.get(), 1, n, nullptr);
    const std::vector<float> y = to_f32(gy.download()), dgu = to_f32(gdgu.download());
    EXPECT_TRUE(finite(y)) << "swiglu_fwd";
    EXPECT_TRUE(finite(dgu)) << "swiglu_bwd";
    EXPECT_LE(rel_err(y, std::vector<float>(yd.begin(), yd.end())), kBf16OutBound) << "swiglu_fwd";
    EXPECT_LE(rel_err(dgu, std::vector<float>(dgud.begin(), dgud.end())), kBf16OutBound) << "swiglu_bwd";
  }
}

// In place on [B, T, row_stride] rows; columns outside the H heads must keep their bits.
TEST(CudaOpsPointwise, RopeForwardAndBackwardMatchCpuAndLeaveOtherColumns) {
  DHX_REQUIRE_GPU();
  struct Shape { int64_t B, T, H, D, stride, pos; double theta; };
  const Shape shapes[] = {{1, 1, 1, 2, 2, 0, 10000.0},
                          {2, 5, 3, 8, 29, 7, 10000.0},
                          {1, 17, 2, 6, 12, 0, 500000.0},
                          {2, 64, 4, 64, 3 * 256, 100, 500000.0}};  // q of a packed qkv row
  uint64_t seed = 200;
  for (const Shape& d : shapes) {
    for (int dir = 0; dir < 2; ++dir) {
      const auto x = round_bf16(randn(d.B * d.T * d.stride, seed++));
      std::vector<float> ref = x;
      if (dir == 0) cpu::rope_fwd<float>(ref.data(), d.B, d.T, d.H, d.D, d.stride, d.pos, d.theta);
      else cpu::rope_bwd<float>(ref.data(), d.B, d.T, d.H, d.D, d.stride, d.pos, d.theta);
      DevBuf<bf16> gx(to_bf16(x));
      if (dir == 0) rope_fwd(gx.get(), d.B, d.T, d.H, d.D, d.stride, d.pos, d.theta, nullptr);
      else rope_bwd(gx.get(), d.B, d.T, d.H, d.D, d.stride, d.pos, d.theta, nullptr);
      const auto got = to_f32(gx.download());
      const char* what = dir == 0 ? "rope_fwd" : "rope_bwd";
      EXPECT_LE(rel_err(got, ref), kBf16OutBound) << what << " B=" << d.B << " T=" << d.T << " H=" << d.H
                                                   << " D=" << d.D << " stride=" << d.stride;
      int64_t moved = 0;
      for (int64_t r = 0; r < d.B * d.T; ++r)
        for (int64_t c = d.H * d.D; c < d.stride; ++c) moved += got[r * d.stride + c] != x[r * d.stride + c];
      EXPECT_EQ(moved, 0) << what << ": columns past H*D=" << d.H * d.D << " changed";
    }
  }
  DevBuf<bf16> x(16);
  EXPECT_THROW(rope_fwd(x.get(), 1, 2, 1, 3, 8, 0, 10000.0, nullptr), InternalError);   // odd D
  EXPECT_THROW(rope_fwd(x.get(), 1, 2, 2, 4, 6, 0, 10000.0, nullptr), InternalError);   // H*D > stride
}

TEST(CudaOpsPointwise, AddsEqualTheCpuSumRoundedOnce) {
  DHX_REQUIRE_GPU();
  uint64_t seed = 300;
  for (int64_t n : kSizes) {
    for (int64_t offset : {0, 1}) {  // offset 1: pointers 2 bytes past a 16-byte boundary
      const auto a = round_bf16(randn(n + 1, seed++)), b = round_bf16(randn(n + 1, seed++));
      std::vector<float> sum(n + 1);
      cpu::add<float>(a.data(), b.data(), sum.data(), n + 1);
      std::vector<float> sum_n(sum.begin() + offset, sum.begin() + offset + n);
      DevBuf<bf16> ga(to_bf16(a)), gb(to_bf16(b)), gy(n + 1);
      gy.poison();
      add(ga.get() + offset, gb.get() + offset, gy.get() + offset, n, nullptr);
      auto got = gy.download();
      EXPECT_TRUE(same_bits(std::vector<bf16>(got.begin() + offset, got.begin() + offset + n), to_bf16(sum_n)))
          << "add n=" << n << " offset=" << offset;
      add_inplace(ga.get() + offset, gb.get() + offset, n, nullptr);  // a += b
      got = ga.download();
      EXPECT_TRUE(same_bits(std::vector<bf16>(got.begin() + offset, got.begin() + offset + n), to_bf16(sum_n)))
          << "add_inplace n=" << n << " offset=" << offset;
    }
  }
  EXPECT_THROW(add(nullptr, nullptr, nullptr, -1, nullptr), InternalError);
}

// The fp32 add_inplace (a tied table's two gradients, 3D's z-gradient block sums, the ring's dK/dV):
// y += x elementwise in fp32, one correctly rounded add each, so bitwise the CPU twin's
// cpu::add_inplace<float>. Oracle: that twin on the same values.
TEST(CudaOpsPointwise, Fp32AddInplaceIsTheCpuSumBitwise) {
  DHX_REQUIRE_GPU();
  uint64_t seed = 350;
  for (int64_t n : kSizes) {
    const auto y = randn(n, seed++), x = randn(n, seed++);
    std::vector<float> want = y;
    cpu::add_inplace<float>(want.data(), x.data(), n);
    DevBuf<float> gy(y), gx(x);
    add_inplace(gy.get(), gx.get(), n, nullptr);
    const std::vector<float> got = gy.download();
    EXPECT_EQ(0, std::memcmp(got.data(), want.data(), n * sizeof(float))) << "n=" << n;
  }
  EXPECT_THROW(add_inplace(static_cast<float*>(nullptr), nullptr, -1, nullptr), InternalError);
}

TEST(CudaOpsPointwise, CastsRoundToNearestEvenAndBack) {
  DHX_REQUIRE_GPU();
  uint64_t seed = 400;
  for (int64_t n : kSizes) {
    const auto x = randn(n, seed++, 3.0f);
    DevBuf<float> gx(x), gback(n);
    DevBuf<bf16> gy(n);
    gy.poison(), gback.poison();
    cast_f32_to_bf16(gx.get(), gy.get(), n, nullptr);
    cast_bf16_to_f32(gy.get(), gback.get(), n, nullptr);
    EXPECT_TRUE(same_bits(gy.download(), to_bf16(x))) << "cast_f32_to_bf16 n=" << n;
    const auto back = gback.download(), want = round_bf16(x);
    EXPECT_EQ(0, std::memcmp(back.data(), want.data(), n * sizeof(float))) << "cast_bf16_to_f32 n=" << n;
  }
}

}  // namespace
}  // namespace dhelix::cuda::test
