// The fused linear epilogues (kernels/cuda/Gemm.h: Blas::linear_fwd_gelu, linear_bwd_data_dgelu,
// linear_fwd_residual, and the linear_gelu / linear_dgrad_gelu / linear_residual ops' forms with
// their fallback) against two oracles: (a) the CPU's fp32 layers (cpu::linear_fwd, linear_bwd_data,
// gelu_fwd, gelu_bwd) on the same bf16-rounded operands; (b) the unfused GPU pair -- the same form on
// a Blas with Fusion::kUnfused, which runs the plain GEMM then gelu_fwd / gelu_bwd / add_bias, and
// which is itself checked bit for bit against those two kernels called by hand. Inputs fresh and
// random (never zeros), outputs poisoned (NaN) before each call.
//
// Bounds, from CudaTest.h's two facts (u = 2^-8 per rounding to bf16; fp32 sums in another order
// ~1e-5 relative), each relative in the norm against the CPU's fp32 result r:
//   pre, the GEMM's output (the fused aux, or the unfused GEMM's): rounded once: u + 1e-5.
//   act fused: GELU of the fp32 pre, rounded once: u + kGeluImpl + 1e-5, where kGeluImpl allows for
//     cuBLASLt evaluating GELU its own way (a hardware tanh, relative error ~2^-11 in tanh, moves
//     gelu(x) by <= 2^-12 |x| and gelu'(x) by <= ~3 2^-11 for |x| <= 3: under 1e-3 of the norm for
//     these inputs; 2e-3 is the allowance).
//   act unfused: gelu of the bf16-rounded pre, rounded: u (1 + rho) + 1e-5, rho = ||pre gelu'(pre)|| /
//     ||gelu(pre)|| (pre's rounding u carried through GELU; rho computed from the CPU's values).
//   dpre fused: gelu'(pre) times the fp32 dy w, rounded once: u + kGeluImpl + 1e-5; unfused: dy w
//     rounded, then the product rounded: 2u + 1e-5.
//   y = skip + x w^T (+ b), fused or unfused: at most two roundings (cuBLASLt may round the product
//     before adding C: test_gemm.cc's accumulating dgrad, seen on an H200), u (P + ||y||) / ||y||
//     + 1e-5 with P = ||x w^T|| + ||b broadcast over the rows|| (a bound on the rounded partial sum).
// (b) fused against unfused: the triangle through r, (b_f + b_u) / (1 - b_u).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>

#include "CudaTest.h"
#include "kernels/cpu/Kernels.h"
#include "kernels/cuda/Gemm.h"
#include "kernels/cuda/Ops.h"

namespace dhelix::cuda::test {
namespace {

struct Dims { int64_t N, I, O; };
// GPT-2's (at N = 2048 tokens): mlp.fc (768 -> 3072), mlp.proj (3072 -> 768), attn.out (768 -> 768).
constexpr Dims kFc{2048, 768, 3072}, kProj{2048, 3072, 768}, kAttnOut{2048, 768, 768};
constexpr Dims kSmall[] = {{64, 96, 80}, {37, 56, 128}};

constexpr double kOrder = 1e-5;     // fp32 summation in another order
constexpr double kGeluImpl = 2e-3;  // cuBLASLt's own GELU / GELU' evaluation (above)

std::string at(const Dims& d) {
  return "N=" + std::to_string(d.N) + " I=" + std::to_string(d.I) + " O=" + std::to_string(d.O);
}
double norm(const std::vector<float>& v) {
  double s = 0;
  for (float x : v) s += static_cast<double>(x) * x;
  return std::sqrt(s);
}
bool same_bits(const std::vector<bf16>& a, const std::vector<bf16>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(bf16)) == 0;
}
// Elements [off, off + n) of a bf16 device buffer, as floats.
std::vector<float> slice(const DevBuf<bf16>& b, size_t off, size_t n) {
  const std::vector<float> all = to_f32(b.download());
  return std::vector<float>(all.begin() + static_cast<std::ptrdiff_t>(off),
                            all.begin() + static_cast<std::ptrdiff_t>(off + n));
}
// (b)'s bound from the two bounds against the CPU.
double between(double fused, double unfused) { return (fused + unfused) / (1 - unfused); }

// ---- the CPU oracles, on bf16-rounded operands ----
struct GeluRef {
  std::vector<float> pre, act;
  double rho;  // ||pre gelu'(pre)|| / ||gelu(pre)||
};
GeluRef gelu_ref(const std::vector<float>& x, const std::vector<float>& w, const float* b, const Dims& d) {
  GeluRef r{std::vector<float>(d.N * d.O), std::vector<float>(d.N * d.O), 0};
  cpu::linear_fwd<float>(x.data(), w.data(), b, r.pre.data(), d.N, d.I, d.O);
  cpu::gelu_fwd<float>(r.pre.data(), r.act.data(), d.N * d.O);
  std::vector<float> ones(r.pre.size(), 1.0f), slope(r.pre.size());
  cpu::gelu_bwd<float>(ones.data(), r.pre.data(), slope.data(), d.N * d.O);
  for (size_t i = 0; i < slope.size(); ++i) slope[i] *= r.pre[i];
  r.rho = norm(slope) / norm(r.act);
  return r;
}
// dpre = gelu'(pre) (dy w): dy [N,O], w [O,I], pre [N,I].
std::vector<float> dgelu_ref(const std::vector<float>& dy, const std::vector<float>& w, const std::vector<float>& pre,
                             const Dims& d) {
  std::vector<float> da(d.N * d.I), dpre(d.N * d.I);
  cpu::linear_bwd_data<float>(dy.data(), w.data(), da.data(), d.N, d.I, d.O, cpu::Accumulate::kNo);
  cpu::gelu_bwd<float>(da.data(), pre.data(), dpre.data(), d.N * d.I);
  return dpre;
}
struct ResidualRef {
  std::vector<float> y;
  double bound;  // u (P + ||y||) / ||y|| + 1e-5 (above)
};
ResidualRef residual_ref(const std::vector<float>& x, const std::vector<float>& w, const float* b,
                         const std::vector<float>& skip, const Dims& d) {
  std::vector<float> mo(d.N * d.O);
  cpu::linear_fwd<float>(x.data(), w.data(), nullptr, mo.data(), d.N, d.I, d.O);
  ResidualRef r{std::vector<float>(d.N * d.O), 0};
  double bb = 0;
  for (int64_t n = 0; n < d.N; ++n)
    for (int64_t o = 0; o < d.O; ++o) {
      const int64_t i = n * d.O + o;
      r.y[i] = skip[i] + mo[i] + (b ? b[o] : 0.0f);
      bb += b ? static_cast<double>(b[o]) * b[o] : 0.0;
    }
  const double ny = norm(r.y);
  r.bound = kBf16U * (norm(mo) + std::sqrt(bb) + ny) / ny + kOrder;
  return r;
}

const Dims* kFcShapes[] = {&kFc, &kSmall[0], &kSmall[1]};

// (a) for linear_fwd_gelu: act and its aux pre against the CPU, with and without bias, on GPT-2's fc
// and two small shapes (every row width a multiple of 8, buffers 256-byte aligned: the fused form
// must run, else the test says cuBLASLt refused it).
TEST(CudaEpilogue, LinearGeluMatchesCpuWithAndWithoutBias) {
  DHX_REQUIRE_GPU();
  Blas blas(0);
  uint64_t seed = 1;
  for (const Dims* dp : kFcShapes) {
    const Dims& d = *dp;
    for (bool with_bias : {false, true}) {
      const auto x = round_bf16(randn(d.N * d.I, seed++)), w = round_bf16(randn(d.O * d.I, seed++, 0.05f)),
                 b = round_bf16(randn(d.O, seed++, 0.5f));
      const GeluRef r = gelu_ref(x, w, with_bias ? b.data() : nullptr, d);
      DevBuf<bf16> gx(to_bf16(x)), gw(to_bf16(w)), gb(to_bf16(b)), act(d.N * d.O), pre(d.N * d.O);
      act.poison(), pre.poison();
      const bool fused = blas.linear_fwd_gelu(gx.get(), gw.get(), with_bias ? gb.get() : nullptr, act.get(), pre.get(),
                                              d.N, d.I, d.O, nullptr);
      ASSERT_TRUE(fused) << "cuBLASLt ran no GELU_AUX" << (with_bias ? "_BIAS" : "") << " epilogue at " << at(d);
      EXPECT_LE(rel_err(to_f32(pre.download()), r.pre), kBf16U + kOrder) << "pre " << at(d) << " bias=" << with_bias;
      EXPECT_LE(rel_err(to_f32(act.download()), r.act), kBf16U + kGeluImpl + kOrder)
          << "act " << at(d) << " bias=" << with_bias;
    }
  }
}

// (a) for linear_bwd_data_dgelu on GPT-2's mlp.proj dgrad (dy [N,768], w [768,3072], pre [N,3072])
// and two small shapes; pre, the aux input, must keep its bits.
TEST(CudaEpilogue, LinearDgradGeluMatchesCpuAndLeavesPre) {
  DHX_REQUIRE_GPU();
  Blas blas(0);
  uint64_t seed = 100;
  for (const Dims* dp : {&kProj, &kSmall[0], &kSmall[1]}) {
    const Dims& d = *dp;
    const auto dy = round_bf16(randn(d.N * d.O, seed++)), w = round_bf16(randn(d.O * d.I, seed++, 0.05f)),
               pre = round_bf16(randn(d.N * d.I, seed++, 1.5f));
    const auto ref = dgelu_ref(dy, w, pre, d);
    const auto pre16 = to_bf16(pre);
    DevBuf<bf16> gdy(to_bf16(dy)), gw(to_bf16(w)), gpre(pre16), dpre(d.N * d.I);
    dpre.poison();
    ASSERT_TRUE(blas.linear_bwd_data_dgelu(gdy.get(), gw.get(), gpre.get(), dpre.get(), d.N, d.I, d.O, nullptr))
        << "cuBLASLt ran no DGELU epilogue at " << at(d);
    EXPECT_LE(rel_err(to_f32(dpre.download()), ref), kBf16U + kGeluImpl + kOrder) << "dpre " << at(d);
    EXPECT_TRUE(same_bits(gpre.download(), pre16)) << "pre written, " << at(d);
  }
}

// (a) for linear_fwd_residual (C = skip, D = y, beta 1) on GPT-2's attn.out and mlp.proj and two
// small shapes, with and without bias; skip must keep its bits.
TEST(CudaEpilogue, LinearResidualMatchesCpuWithAndWithoutBias) {
  DHX_REQUIRE_GPU();
  Blas blas(0);
  uint64_t seed = 200;
  for (const Dims* dp : {&kAttnOut, &kProj, &kSmall[0], &kSmall[1]}) {
    const Dims& d = *dp;
    for (bool with_bias : {false, true}) {
      const auto x = round_bf16(randn(d.N * d.I, seed++)), w = round_bf16(randn(d.O * d.I, seed++, 0.05f)),
                 b = round_bf16(randn(d.O, seed++, 0.5f)), skip = round_bf16(randn(d.N * d.O, seed++));
      const ResidualRef r = residual_ref(x, w, with_bias ? b.data() : nullptr, skip, d);
      const auto skip16 = to_bf16(skip);
      DevBuf<bf16> gx(to_bf16(x)), gw(to_bf16(w)), gb(to_bf16(b)), gskip(skip16), y(d.N * d.O);
      y.poison();
      ASSERT_TRUE(blas.linear_fwd_residual(gx.get(), gw.get(), with_bias ? gb.get() : nullptr, gskip.get(), y.get(),
                                           d.N, d.I, d.O, nullptr))
          << "cuBLASLt ran no out-of-place " << (with_bias ? "bias " : "") << "GEMM with beta 1 at " << at(d);
      EXPECT_LE(rel_err(to_f32(y.download()), r.y), r.bound) << "y " << at(d) << " bias=" << with_bias;
      EXPECT_TRUE(same_bits(gskip.download(), skip16)) << "skip written, " << at(d);
    }
  }
}

// (b) and the fallback: each op's form on a fused Blas (Path::kFused) and on a Blas with
// Fusion::kUnfused (Path::kUnfused), at GPT-2's shapes with and without bias. The fallback gives the
// bits of the unfused kernels called by hand (linear_fwd + gelu_fwd; linear_bwd_data + gelu_bwd;
// linear_fwd + add_bias / add), each path is within its bound of the CPU, and the two within (b)'s.
TEST(CudaEpilogue, FusedAndFallbackPathsAgree) {
  DHX_REQUIRE_GPU();
  Blas fused(0), unfused(0);
  unfused.set_fusion(Blas::Fusion::kUnfused);
  uint64_t seed = 300;
  for (bool with_bias : {false, true}) {
    const std::string tag = with_bias ? " bias" : " no bias";
    {  // linear_gelu at mlp.fc
      const Dims d = kFc;
      const auto x = round_bf16(randn(d.N * d.I, seed++)), w = round_bf16(randn(d.O * d.I, seed++, 0.05f)),
                 b = round_bf16(randn(d.O, seed++, 0.5f));
      const GeluRef r = gelu_ref(x, w, with_bias ? b.data() : nullptr, d);
      DevBuf<bf16> gx(to_bf16(x)), gw(to_bf16(w)), gb(to_bf16(b)), act_f(d.N * d.O), pre_f(d.N * d.O),
          act_u(d.N * d.O), pre_u(d.N * d.O), act_h(d.N * d.O), pre_h(d.N * d.O);
      for (auto* p : {&act_f, &pre_f, &act_u, &pre_u, &act_h, &pre_h}) p->poison();
      const bf16* bias = with_bias ? gb.get() : nullptr;
      EXPECT_EQ(Path::kFused, linear_gelu(fused, gx.get(), gw.get(), bias, act_f.get(), pre_f.get(), d.N, d.I, d.O, nullptr));
      EXPECT_EQ(Path::kUnfused,
                linear_gelu(unfused, gx.get(), gw.get(), bias, act_u.get(), pre_u.get(), d.N, d.I, d.O, nullptr));
      unfused.linear_fwd(gx.get(), gw.get(), bias, pre_h.get(), d.N, d.I, d.O, nullptr);
      gelu_fwd(pre_h.get(), act_h.get(), d.N * d.O, nullptr);
      EXPECT_TRUE(same_bits(act_u.download(), act_h.download())) << "linear_gelu fallback act" << tag;
      EXPECT_TRUE(same_bits(pre_u.download(), pre_h.download())) << "linear_gelu fallback pre" << tag;
      const double bf = kBf16U + kGeluImpl + kOrder, bu = kBf16U * (1 + r.rho) + kOrder, bpre = kBf16U + kOrder;
      const auto af = to_f32(act_f.download()), au = to_f32(act_u.download());
      const auto pf = to_f32(pre_f.download()), pu = to_f32(pre_u.download());
      EXPECT_LE(rel_err(af, r.act), bf) << "fused act vs cpu" << tag;
      EXPECT_LE(rel_err(au, r.act), bu) << "unfused act vs cpu (rho " << r.rho << ")" << tag;
      EXPECT_LE(rel_err(af, au), between(bf, bu)) << "fused vs unfused act" << tag;
      EXPECT_LE(rel_err(pf, pu), between(bpre, bpre)) << "fused vs unfused pre" << tag;
    }
    if (!with_bias) {  // linear_dgrad_gelu at mlp.proj (the op has no bias)
      const Dims d = kProj;
      const auto dy = round_bf16(randn(d.N * d.O, seed++)), w = round_bf16(randn(d.O * d.I, seed++, 0.05f)),
                 pre = round_bf16(randn(d.N * d.I, seed++, 1.5f));
      const auto ref = dgelu_ref(dy, w, pre, d);
      DevBuf<bf16> gdy(to_bf16(dy)), gw(to_bf16(w)), gpre(to_bf16(pre)), df(d.N * d.I), du(d.N * d.I),
          da(d.N * d.I), dh(d.N * d.I);
      for (auto* p : {&df, &du, &da, &dh}) p->poison();
      EXPECT_EQ(Path::kFused, linear_dgrad_gelu(fused, gdy.get(), gw.get(), gpre.get(), df.get(), d.N, d.I, d.O, nullptr));
      EXPECT_EQ(Path::kUnfused,
                linear_dgrad_gelu(unfused, gdy.get(), gw.get(), gpre.get(), du.get(), d.N, d.I, d.O, nullptr));
      unfused.linear_bwd_data(gdy.get(), gw.get(), da.get(), d.N, d.I, d.O, Accumulate::kNo, nullptr);
      gelu_bwd(da.get(), gpre.get(), dh.get(), d.N * d.I, nullptr);
      EXPECT_TRUE(same_bits(du.download(), dh.download())) << "linear_dgrad_gelu fallback";
      const double bf = kBf16U + kGeluImpl + kOrder, bu = 2 * kBf16U + kOrder;
      const auto vf = to_f32(df.download()), vu = to_f32(du.download());
      EXPECT_LE(rel_err(vf, ref), bf) << "fused dpre vs cpu";
      EXPECT_LE(rel_err(vu, ref), bu) << "unfused dpre vs cpu";
      EXPECT_LE(rel_err(vf, vu), between(bf, bu)) << "fused vs unfused dpre";
    }
    for (const Dims* dp : {&kAttnOut, &kProj}) {  // linear_residual at attn.out and mlp.proj
      const Dims& d = *dp;
      const auto x = round_bf16(randn(d.N * d.I, seed++)), w = round_bf16(randn(d.O * d.I, seed++, 0.05f)),
                 b = round_bf16(randn(d.O, seed++, 0.5f)), skip = round_bf16(randn(d.N * d.O, seed++));
      const ResidualRef r = residual_ref(x, w, with_bias ? b.data() : nullptr, skip, d);
      DevBuf<bf16> gx(to_bf16(x)), gw(to_bf16(w)), gb(to_bf16(b)), gskip(to_bf16(skip)), yf(d.N * d.O),
          yu(d.N * d.O), mo(d.N * d.O), yh(d.N * d.O);
      DevBuf<float> gb32(b);
      for (auto* p : {&yf, &yu, &mo, &yh}) p->poison();
      const bf16* b16 = with_bias ? gb.get() : nullptr;
      const float* b32 = with_bias ? gb32.get() : nullptr;
      EXPECT_EQ(Path::kFused,
                linear_residual(fused, gx.get(), gw.get(), b16, b32, gskip.get(), yf.get(), d.N, d.I, d.O, nullptr))
          << at(d);
      EXPECT_EQ(Path::kUnfused,
                linear_residual(unfused, gx.get(), gw.get(), b16, b32, gskip.get(), yu.get(), d.N, d.I, d.O, nullptr))
          << at(d);
      unfused.linear_fwd(gx.get(), gw.get(), nullptr, mo.get(), d.N, d.I, d.O, nullptr);
      if (with_bias)
        add_bias(gskip.get(), mo.get(), gb32.get(), yh.get(), d.N, d.O, nullptr);
      else
        add(gskip.get(), mo.get(), yh.get(), d.N * d.O, nullptr);
      EXPECT_TRUE(same_bits(yu.download(), yh.download())) << "linear_residual fallback " << at(d) << tag;
      const auto vf = to_f32(yf.download()), vu = to_f32(yu.download());
      EXPECT_LE(rel_err(vf, r.y), r.bound) << "fused y vs cpu " << at(d) << tag;
      EXPECT_LE(rel_err(vu, r.y), r.bound) << "unfused y vs cpu " << at(d) << tag;
      EXPECT_LE(rel_err(vf, vu), between(r.bound, r.bound)) << "fused vs unfused y " << at(d) << tag;
    }
  }
}

// Where the fused forms cannot run they fall back, and the answer is still right: an aux row width
// not a multiple of 8 (O = 100 for the GELU forward, I = 100 for its gradient: EPILOGUE_AUX_LD's
// rule) and an aux pointer 2 bytes off 16-byte alignment both give Path::kUnfused and the unfused
// bounds against the CPU. The residual at O = 100 and with a bias 2 bytes off alignment (staged)
// may run either path: checked against the CPU with its bound, the path printed, not asserted.
TEST(CudaEpilogue, RaggedOrMisalignedAuxFallsBackAndMatchesCpu) {
  DHX_REQUIRE_GPU();
  Blas blas(0);
  uint64_t seed = 400;
  const Dims ragged{37, 56, 100}, even{64, 96, 80};
  for (const Dims& d : {ragged, even}) {
    const size_t off = d.O % 8 == 0 ? 1 : 0;  // the aligned width: misalign pre's pointer instead
    const std::string why = off ? "pre 2 bytes off alignment" : "O % 8 != 0";
    const auto x = round_bf16(randn(d.N * d.I, seed++)), w = round_bf16(randn(d.O * d.I, seed++, 0.05f)),
               b = round_bf16(randn(d.O, seed++, 0.5f));
    const GeluRef r = gelu_ref(x, w, b.data(), d);
    DevBuf<bf16> gx(to_bf16(x)), gw(to_bf16(w)), gb(to_bf16(b)), act(d.N * d.O), pre(d.N * d.O + 8);
    act.poison(), pre.poison();
    EXPECT_EQ(Path::kUnfused,
              linear_gelu(blas, gx.get(), gw.get(), gb.get(), act.get(), pre.get() + off, d.N, d.I, d.O, nullptr))
        << "linear_gelu " << at(d) << ", " << why;
    EXPECT_LE(rel_err(slice(pre, off, d.N * d.O), r.pre), kBf16U + kOrder) << "pre " << at(d) << ", " << why;
    EXPECT_LE(rel_err(to_f32(act.download()), r.act), kBf16U * (1 + r.rho) + kOrder) << "act " << at(d) << ", " << why;
  }
  for (const Dims& d : {Dims{37, 100, 56}, Dims{64, 80, 96}}) {  // the gradient: pre's width is I
    const size_t off = d.I % 8 == 0 ? 1 : 0;
    const std::string why = off ? "pre 2 bytes off alignment" : "I % 8 != 0";
    const auto dy = round_bf16(randn(d.N * d.O, seed++)), w = round_bf16(randn(d.O * d.I, seed++, 0.05f)),
               pre = round_bf16(randn(d.N * d.I, seed++, 1.5f));
    const auto ref = dgelu_ref(dy, w, pre, d);
    std::vector<float> shifted(d.N * d.I + 8, 0.5f);
    std::copy(pre.begin(), pre.end(), shifted.begin() + static_cast<std::ptrdiff_t>(off));
    DevBuf<bf16> gdy(to_bf16(dy)), gw(to_bf16(w)), gpre(to_bf16(shifted)), dpre(d.N * d.I);
    dpre.poison();
    EXPECT_EQ(Path::kUnfused,
              linear_dgrad_gelu(blas, gdy.get(), gw.get(), gpre.get() + off, dpre.get(), d.N, d.I, d.O, nullptr))
        << "linear_dgrad_gelu " << at(d) << ", " << why;
    EXPECT_LE(rel_err(to_f32(dpre.download()), ref), 2 * kBf16U + kOrder) << "dpre " << at(d) << ", " << why;
  }
  for (const Dims& d : {ragged, even}) {
    const auto x = round_bf16(randn(d.N * d.I, seed++)), w = round_bf16(randn(d.O * d.I, seed++, 0.05f)),
               b = round_bf16(randn(d.O, seed++, 0.5f)), skip = round_bf16(randn(d.N * d.O, seed++));
    const ResidualRef r = residual_ref(x, w, b.data(), skip, d);
    std::vector<float> b1(d.O + 1, 0.0f);
    std::copy(b.begin(), b.end(), b1.begin() + 1);
    DevBuf<bf16> gx(to_bf16(x)), gw(to_bf16(w)), gb1(to_bf16(b1)), gskip(to_bf16(skip)), y(d.N * d.O);
    DevBuf<float> gb32(b);
    y.poison();
    const Path p = linear_residual(blas, gx.get(), gw.get(), gb1.get() + 1, gb32.get(), gskip.get(), y.get(), d.N,
                                   d.I, d.O, nullptr);
    std::printf("  linear_residual %s, bias 2 bytes off alignment: %s\n", at(d).c_str(),
                p == Path::kFused ? "fused" : "unfused (fallback)");
    EXPECT_LE(rel_err(to_f32(y.download()), r.y), r.bound) << "y " << at(d);
  }
}

// A bias at an odd element of the flat bf16 store (2-byte aligned) is staged to a 256-byte aligned
// buffer for the fused forms too. Oracle: the same call with the bias in its own cudaMalloc (256-byte
// aligned), bit for bit (one plan: the key's bias alignment is 256 for both).
TEST(CudaEpilogue, AMisalignedBiasGivesTheAlignedBiasBits) {
  DHX_REQUIRE_GPU();
  Blas blas(0);
  uint64_t seed = 500;
  for (const Dims& d : kSmall) {
    const auto x = round_bf16(randn(d.N * d.I, seed++)), w = round_bf16(randn(d.O * d.I, seed++, 0.05f)),
               b = round_bf16(randn(d.O, seed++, 0.5f)), skip = round_bf16(randn(d.N * d.O, seed++));
    std::vector<float> b1(d.O + 1, 0.0f);
    std::copy(b.begin(), b.end(), b1.begin() + 1);
    DevBuf<bf16> gx(to_bf16(x)), gw(to_bf16(w)), gb(to_bf16(b)), gb1(to_bf16(b1)), gskip(to_bf16(skip));
    DevBuf<bf16> act0(d.N * d.O), pre0(d.N * d.O), act1(d.N * d.O), pre1(d.N * d.O), y0(d.N * d.O), y1(d.N * d.O);
    for (auto* p : {&act0, &pre0, &act1, &pre1, &y0, &y1}) p->poison();
    ASSERT_TRUE(blas.linear_fwd_gelu(gx.get(), gw.get(), gb.get(), act0.get(), pre0.get(), d.N, d.I, d.O, nullptr));
    ASSERT_TRUE(blas.linear_fwd_gelu(gx.get(), gw.get(), gb1.get() + 1, act1.get(), pre1.get(), d.N, d.I, d.O, nullptr));
    ASSERT_TRUE(blas.linear_fwd_residual(gx.get(), gw.get(), gb.get(), gskip.get(), y0.get(), d.N, d.I, d.O, nullptr));
    ASSERT_TRUE(
        blas.linear_fwd_residual(gx.get(), gw.get(), gb1.get() + 1, gskip.get(), y1.get(), d.N, d.I, d.O, nullptr));
    EXPECT_TRUE(same_bits(act0.download(), act1.download())) << "act " << at(d);
    EXPECT_TRUE(same_bits(pre0.download(), pre1.download())) << "pre " << at(d);
    EXPECT_TRUE(same_bits(y0.download(), y1.download())) << "y " << at(d);
  }
}

// The fused forms under Choice::kTimed (training.gemm_algo = timed: the candidates timed on the first
// call's operands, the bias and aux pointers set first) and under each forced split-K form
// (Choice::kSplitK: where cuBLASLt accepts a split with the epilogue, else the first answer).
// Oracles: the CPU with (a)'s bounds; a second call gives the first call's bits (the choice sticks);
// the inputs the timing must not write keep their bits -- skip (C apart from D: a timing that wrote
// C would have added the product to it several times) and the gradient's pre (DGELU's aux input).
TEST(CudaEpilogue, TimedAndSplitChoicesRunTheEpiloguesAndLeaveInputsAlone) {
  DHX_REQUIRE_GPU();
  const Dims d{1024, 768, 768};
  uint64_t seed = 600;
  const auto x = round_bf16(randn(d.N * d.I, seed++)), w = round_bf16(randn(d.O * d.I, seed++, 0.05f)),
             b = round_bf16(randn(d.O, seed++, 0.5f)), skip = round_bf16(randn(d.N * d.O, seed++)),
             dy = round_bf16(randn(d.N * d.O, seed++)), pre_in = round_bf16(randn(d.N * d.I, seed++, 1.5f));
  const GeluRef g = gelu_ref(x, w, b.data(), d);
  const ResidualRef r = residual_ref(x, w, b.data(), skip, d);
  const auto dref = dgelu_ref(dy, w, pre_in, d);
  const auto skip16 = to_bf16(skip), pre16 = to_bf16(pre_in);
  DevBuf<bf16> gx(to_bf16(x)), gw(to_bf16(w)), gb(to_bf16(b)), gskip(skip16), gdy(to_bf16(dy)), gpre_in(pre16);
  DevBuf<bf16> act(d.N * d.O), pre(d.N * d.O), y(d.N * d.O), dpre(d.N * d.I);
  for (int variant = 0; variant <= Blas::kSplitKVariants; ++variant) {
    Blas blas(0);
    std::string tag = "timed";
    if (variant == 0) {
      blas.set_choice(Blas::Choice::kTimed);
    } else {
      blas.set_split_k(Blas::kSplitKParts[variant - 1]);
      tag = "split " + std::to_string(Blas::kSplitKParts[variant - 1]);
    }
    std::vector<bf16> first_act, first_y, first_dpre;
    for (int call = 0; call < 2; ++call) {
      for (auto* p : {&act, &pre, &y, &dpre}) p->poison();
      ASSERT_TRUE(blas.linear_fwd_gelu(gx.get(), gw.get(), gb.get(), act.get(), pre.get(), d.N, d.I, d.O, nullptr)) << tag;
      ASSERT_TRUE(blas.linear_fwd_residual(gx.get(), gw.get(), gb.get(), gskip.get(), y.get(), d.N, d.I, d.O, nullptr))
          << tag;
      ASSERT_TRUE(blas.linear_bwd_data_dgelu(gdy.get(), gw.get(), gpre_in.get(), dpre.get(), d.N, d.I, d.O, nullptr))
          << tag;
      const auto a16 = act.download(), y16 = y.download(), d16 = dpre.download();
      EXPECT_LE(rel_err(to_f32(pre.download()), g.pre), kBf16U + kOrder) << "pre, " << tag;
      EXPECT_LE(rel_err(to_f32(a16), g.act), kBf16U + kGeluImpl + kOrder) << "act, " << tag;
      EXPECT_LE(rel_err(to_f32(y16), r.y), r.bound) << "y, " << tag;
      EXPECT_LE(rel_err(to_f32(d16), dref), kBf16U + kGeluImpl + kOrder) << "dpre, " << tag;
      EXPECT_TRUE(same_bits(gskip.download(), skip16)) << "skip written, " << tag;
      EXPECT_TRUE(same_bits(gpre_in.download(), pre16)) << "the gradient's pre written, " << tag;
      if (call == 0) {
        first_act = a16, first_y = y16, first_dpre = d16;
      } else {
        EXPECT_TRUE(same_bits(a16, first_act)) << "act changed between calls, " << tag;
        EXPECT_TRUE(same_bits(y16, first_y)) << "y changed between calls, " << tag;
        EXPECT_TRUE(same_bits(d16, first_dpre)) << "dpre changed between calls, " << tag;
      }
    }
  }
}

}  // namespace
}  // namespace dhelix::cuda::test
