// LayerNorm and RMSNorm on the GPU (kernels/cuda/Ops.h) against their CPU twins (cpu::layernorm_*,
// cpu::rmsnorm_* <float>) run on the same bf16-rounded inputs and the same fp32 weights, so the
// difference is the GPU's own error. Outputs poisoned before each call; accumulated gradients start
// from random values. Shapes: 16-byte vector path (C % 8 == 0) and the scalar one (ragged C), N = 1.
//
// Bounds: a bf16 output (y, dx) is rounded once, within u = 2^-8 relative, plus fp32 noise from the
// row sums in another order (C <= 4096 terms: ~sqrt(C) 2^-24 < 1e-5); fp32 statistics (mean, rstd)
// carry only that noise. The parameter gradients sum N <= 5000 rows in another order than the CPU's
// (the GPU's blocks of rows or chunks of 128 rows vs the CPU threads' row ranges): ~sqrt(N) 2^-24
// relative, 4.2e-6 at N = 5000, under 1e-5.
// Which backward a shape takes (Norm.cu): C % 8 == 0 and C <= 1024 (RMSNorm 2048) the fused pass --
// here C = 768, 8, 1000 and RMSNorm's 2048 -- else the two-kernel form (C = 100, 33, 4096,
// LayerNorm's 2048). Both forms are also run on every shape by TwoKernelFormMatchesCpu, and the
// fused pass's runs of several rows a warp (N >= 8192) by ManyRowsAWarpMatchDoubleCpu; its dx
// against the two-kernel form's, bit for bit, by FusedPassWritesTheTwoKernelDxBitForBit.
#include <cstring>

#include "CudaTest.h"
#include "kernels/cpu/Kernels.h"
#include "kernels/cuda/Ops.h"

namespace dhelix::cuda::test {
namespace {

struct Shape { int64_t N, C; };
// The last two: many rows, the last 128-row chunk of the parameter gradients ragged (5000, 3000).
// 512: the forward's two 8-column units a lane (C in (256, 512]); 1288: the one-pass backward's
// eight units a lane with its last slots partly filled (C in (1024, 1792], ragged).
const Shape kShapes[] = {{1, 768},   {37, 100},   {64, 8},      {300, 1000}, {5, 33},
                         {200, 512}, {150, 1288}, {1024, 4096}, {5000, 768}, {3000, 2048}};

constexpr float kEps = 1e-5f;
constexpr double kBf16OutBound = kBf16U + 1e-5;  // one rounding + fp32 order
constexpr double kF32Bound = 1e-5;               // fp32 order only

// Rows with different nonzero means (a residual stream's are), so the mean is no cancellation test.
std::vector<float> rows_with_means(int64_t N, int64_t C, uint64_t seed) {
  std::vector<float> x = randn(N * C, seed);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t c = 0; c < C; ++c) x[n * C + c] += 0.25f * static_cast<float>(n % 7 - 3) + 0.1f;
  return round_bf16(x);
}
std::vector<float> around_one(int64_t C, uint64_t seed) {
  std::vector<float> g = randn(C, seed, 0.1f);
  for (float& v : g) v += 1.0f;
  return g;
}
template <typename T> bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

TEST(CudaOpsNorm, LayerNormForwardMatchesCpu) {
  DHX_REQUIRE_GPU();
  uint64_t seed = 1;
  for (const Shape& d : kShapes) {
    for (bool with_bias : {true, false}) {
      const auto x = rows_with_means(d.N, d.C, seed++), g = around_one(d.C, seed++), b = randn(d.C, seed++, 0.1f);
      std::vector<float> y(d.N * d.C), mean(d.N), rstd(d.N);
      cpu::layernorm_fwd<float>(x.data(), g.data(), with_bias ? b.data() : nullptr, y.data(), mean.data(),
                                rstd.data(), d.N, d.C, kEps);
      DevBuf<bf16> gx(to_bf16(x)), gy(d.N * d.C);
      DevBuf<float> gg(g), gb(b), gmean(d.N), grstd(d.N);
      gy.poison(), gmean.poison(), grstd.poison();
      layernorm_fwd(gx.get(), gg.get(), with_bias ? gb.get() : nullptr, gy.get(), gmean.get(), grstd.get(), d.N, d.C,
                    kEps, nullptr);
      const std::string at = "N=" + std::to_string(d.N) + " C=" + std::to_string(d.C) + " bias=" +
                             std::to_string(with_bias);
      EXPECT_LE(rel_err(to_f32(gy.download()), y), kBf16OutBound) << "y, " << at;
      EXPECT_LE(rel_err(gmean.download(), mean), kF32Bound) << "mean, " << at;
      EXPECT_LE(rel_err(grstd.download(), rstd), kF32Bound) << "rstd, " << at;
    }
  }
}

TEST(CudaOpsNorm, LayerNormBackwardMatchesCpuAndIsDeterministic) {
  DHX_REQUIRE_GPU();
  uint64_t seed = 100;
  for (const Shape& d : kShapes) {
    const auto x = rows_with_means(d.N, d.C, seed++), g = around_one(d.C, seed++), b = randn(d.C, seed++, 0.1f);
    const auto dy = round_bf16(randn(d.N * d.C, seed++));
    std::vector<float> y(d.N * d.C), mean(d.N), rstd(d.N);
    cpu::layernorm_fwd<float>(x.data(), g.data(), b.data(), y.data(), mean.data(), rstd.data(), d.N, d.C, kEps);
    const auto dg0 = randn(d.C, seed++), db0 = randn(d.C, seed++);  // accumulated into
    std::vector<float> dx(d.N * d.C), dg = dg0, db = db0;
    cpu::layernorm_bwd<float>(dy.data(), x.data(), g.data(), mean.data(), rstd.data(), dx.data(), dg.data(), db.data(),
                              d.N, d.C);
    DevBuf<bf16> gdy(to_bf16(dy)), gx(to_bf16(x)), gdx(d.N * d.C);
    DevBuf<float> gg(g), gmean(mean), grstd(rstd), gdg(dg0.size()), gdb(db0.size());
    std::vector<float> first_dx, first_dg, first_db;
    for (int rep = 0; rep < 2; ++rep) {  // the same call twice: the same bits (fixed-order reductions)
      gdx.poison();
      gdg.upload(dg0), gdb.upload(db0);
      layernorm_bwd(gdy.get(), gx.get(), gg.get(), gmean.get(), grstd.get(), gdx.get(), gdg.get(), gdb.get(), d.N,
                    d.C, nullptr);
      const auto got_dx = to_f32(gdx.download()), got_dg = gdg.download(), got_db = gdb.download();
      const std::string at = "N=" + std::to_string(d.N) + " C=" + std::to_string(d.C);
      if (rep == 0) {
        EXPECT_LE(rel_err(got_dx, dx), kBf16OutBound) << "dx, " << at;
        EXPECT_LE(rel_err(got_dg, dg), kF32Bound) << "dg, " << at;
        EXPECT_LE(rel_err(got_db, db), kF32Bound) << "db, " << at;
        first_dx = got_dx, first_dg = got_dg, first_db = got_db;
      } else {
        EXPECT_TRUE(same_bits(got_dx, first_dx) && same_bits(got_dg, first_dg) && same_bits(got_db, first_db))
            << "layernorm_bwd run twice differs, " << at;
      }
    }
  }
}

TEST(CudaOpsNorm, RmsNormForwardMatchesCpu) {
  DHX_REQUIRE_GPU();
  uint64_t seed = 200;
  for (const Shape& d : kShapes) {
    const auto x = rows_with_means(d.N, d.C, seed++), g = around_one(d.C, seed++);
    std::vector<float> y(d.N * d.C), rstd(d.N);
    cpu::rmsnorm_fwd<float>(x.data(), g.data(), y.data(), rstd.data(), d.N, d.C, kEps);
    DevBuf<bf16> gx(to_bf16(x)), gy(d.N * d.C);
    DevBuf<float> gg(g), grstd(d.N);
    gy.poison(), grstd.poison();
    rmsnorm_fwd(gx.get(), gg.get(), gy.get(), grstd.get(), d.N, d.C, kEps, nullptr);
    EXPECT_LE(rel_err(to_f32(gy.download()), y), kBf16OutBound) << "y, N=" << d.N << " C=" << d.C;
    EXPECT_LE(rel_err(grstd.download(), rstd), kF32Bound) << "rstd, N=" << d.N << " C=" << d.C;
  }
}

TEST(CudaOpsNorm, RmsNormBackwardMatchesCpuAndIsDeterministic) {
  DHX_REQUIRE_GPU();
  uint64_t seed = 300;
  for (const Shape& d : kShapes) {
    const auto x = rows_with_means(d.N, d.C, seed++), g = around_one(d.C, seed++);
    const auto dy = round_bf16(randn(d.N * d.C, seed++));
    std::vector<float> y(d.N * d.C), rstd(d.N);
    cpu::rmsnorm_fwd<float>(x.data(), g.data(), y.data(), rstd.data(), d.N, d.C, kEps);
    const auto dg0 = randn(d.C, seed++);
    std::vector<float> dx(d.N * d.C), dg = dg0;
    cpu::rmsnorm_bwd<float>(dy.data(), x.data(), g.data(), rstd.data(), dx.data(), dg.data(), d.N, d.C);
    DevBuf<bf16> gdy(to_bf16(dy)), gx(to_bf16(x)), gdx(d.N * d.C);
    DevBuf<float> gg(g), grstd(rstd), gdg(dg0.size());
    std::vector<float> first_dx, first_dg;
    for (int rep = 0; rep < 2; ++rep) {
      gdx.poison();
      gdg.upload(dg0);
      rmsnorm_bwd(gdy.get(), gx.get(), gg.get(), grstd.get(), gdx.get(), gdg.get(), d.N, d.C, nullptr);
      const auto got_dx = to_f32(gdx.download()), got_dg = gdg.download();
      if (rep == 0) {
        EXPECT_LE(rel_err(got_dx, dx), kBf16OutBound) << "dx, N=" << d.N << " C=" << d.C;
        EXPECT_LE(rel_err(got_dg, dg), kF32Bound) << "dg, N=" << d.N << " C=" << d.C;
        first_dx = got_dx, first_dg = got_dg;
      } else {
        EXPECT_TRUE(same_bits(got_dx, first_dx) && same_bits(got_dg, first_dg))
            << "rmsnorm_bwd run twice differs, N=" << d.N << " C=" << d.C;
      }
    }
  }
}

// The two-kernel backward (norm_bwd_two_kernel, the kernel bench's comparison) on every shape, both
// norms: the CPU twin's result within the same bounds as above.
TEST(CudaOpsNorm, TwoKernelFormMatchesCpu) {
  DHX_REQUIRE_GPU();
  uint64_t seed = 400;
  for (const Shape& d : kShapes) {
    for (bool layer : {true, false}) {
      const auto x = rows_with_means(d.N, d.C, seed++), g = around_one(d.C, seed++);
      const auto dy = round_bf16(randn(d.N * d.C, seed++));
      std::vector<float> y(d.N * d.C), mean(d.N), rstd(d.N);
      if (layer) cpu::layernorm_fwd<float>(x.data(), g.data(), nullptr, y.data(), mean.data(), rstd.data(), d.N, d.C, kEps);
      else cpu::rmsnorm_fwd<float>(x.data(), g.data(), y.data(), rstd.data(), d.N, d.C, kEps);
      const auto dg0 = randn(d.C, seed++), db0 = randn(d.C, seed++);
      std::vector<float> dx(d.N * d.C), dg = dg0, db = db0;
      if (layer)
        cpu::layernorm_bwd<float>(dy.data(), x.data(), g.data(), mean.data(), rstd.data(), dx.data(), dg.data(),
                                  db.data(), d.N, d.C);
      else cpu::rmsnorm_bwd<float>(dy.data(), x.data(), g.data(), rstd.data(), dx.data(), dg.data(), d.N, d.C);
      DevBuf<bf16> gdy(to_bf16(dy)), gx(to_bf16(x)), gdx(d.N * d.C);
      DevBuf<float> gg(g), gmean(mean), grstd(rstd), gdg(dg0), gdb(db0);
      gdx.poison();
      norm_bwd_two_kernel(gdy.get(), gx.get(), gg.get(), layer ? gmean.get() : nullptr, grstd.get(), gdx.get(),
                          gdg.get(), layer ? gdb.get() : nullptr, d.N, d.C, layer, nullptr);
      const std::string at = std::string(layer ? "LayerNorm" : "RMSNorm") + " N=" + std::to_string(d.N) + " C=" +
                             std::to_string(d.C);
      EXPECT_LE(rel_err(to_f32(gdx.download()), dx), kBf16OutBound) << "dx, " << at;
      EXPECT_LE(rel_err(gdg.download(), dg), kF32Bound) << "dg, " << at;
      if (layer) {
        EXPECT_LE(rel_err(gdb.download(), db), kF32Bound) << "db, " << at;
      } else {
        EXPECT_TRUE(same_bits(gdb.download(), db0)) << "RMSNorm wrote db, " << at;
      }
    }
  }
}

// The fused backward where each warp takes several rows (Norm.cu's fused_rows: N / 4096, at most
// 16) and the last block is ragged: N = 20001 (4 rows a warp, C = 256, one unit a lane), 40000 (9,
// GPT-2's C = 768), 70001 (16, C = 64), and RMSNorm's N = 9000, C = 2048 (2, eight units a lane).
// Oracle: the CPU twin in double on the same bf16-rounded x, dy and the same fp32 g, mean, rstd.
// Bounds: dx one bf16 rounding (kBf16OutBound); dg, db the GPU's own fp32 error: each sum is at
// most ~100 adds deep (16 rows, 8 warps, <= 70 partials a group, 8 groups), ~sqrt(100) 2^-24 =
// 6e-7 relative for terms of random sign, under kF32Bound = 1e-5 (the double oracle adds none).
TEST(CudaOpsNorm, ManyRowsAWarpMatchDoubleCpu) {
  DHX_REQUIRE_GPU();
  struct Case { int64_t N, C; bool layer; };
  const Case cases[] = {{20001, 256, true}, {40000, 768, true}, {70001, 64, true},
                        {20001, 256, false}, {9000, 2048, false}};
  uint64_t seed = 500;
  for (const Case& d : cases) {
    const auto x = rows_with_means(d.N, d.C, seed++), g = around_one(d.C, seed++);
    const auto dy = round_bf16(randn(d.N * d.C, seed++));
    std::vector<float> y(d.N * d.C), mean(d.N), rstd(d.N);
    if (d.layer) cpu::layernorm_fwd<float>(x.data(), g.data(), nullptr, y.data(), mean.data(), rstd.data(), d.N, d.C, kEps);
    else cpu::rmsnorm_fwd<float>(x.data(), g.data(), y.data(), rstd.data(), d.N, d.C, kEps);
    auto wide = [](const std::vector<float>& v) { return std::vector<double>(v.begin(), v.end()); };
    const auto dg0 = randn(d.C, seed++), db0 = randn(d.C, seed++);
    std::vector<double> dx(d.N * d.C), dg = wide(dg0), db = wide(db0);
    const auto xd = wide(x), dyd = wide(dy), gd = wide(g), meand = wide(mean), rstdd = wide(rstd);
    if (d.layer)
      cpu::layernorm_bwd<double>(dyd.data(), xd.data(), gd.data(), meand.data(), rstdd.data(), dx.data(), dg.data(),
                                 db.data(), d.N, d.C);
    else cpu::rmsnorm_bwd<double>(dyd.data(), xd.data(), gd.data(), rstdd.data(), dx.data(), dg.data(), d.N, d.C);
    auto narrow = [](const std::vector<double>& v) { return std::vector<float>(v.begin(), v.end()); };
    DevBuf<bf16> gdy(to_bf16(dy)), gx(to_bf16(x)), gdx(d.N * d.C);
    DevBuf<float> gg(g), gmean(mean), grstd(rstd), gdg(dg0), gdb(db0);
    gdx.poison();
    if (d.layer)
      layernorm_bwd(gdy.get(), gx.get(), gg.get(), gmean.get(), grstd.get(), gdx.get(), gdg.get(), gdb.get(), d.N, d.C,
                    nullptr);
    else rmsnorm_bwd(gdy.get(), gx.get(), gg.get(), grstd.get(), gdx.get(), gdg.get(), d.N, d.C, nullptr);
    const std::string at = std::string(d.layer ? "LayerNorm" : "RMSNorm") + " N=" + std::to_string(d.N) + " C=" +
                           std::to_string(d.C);
    EXPECT_LE(rel_err(to_f32(gdx.download()), narrow(dx)), kBf16OutBound) << "dx, " << at;
    EXPECT_LE(rel_err(gdg.download(), narrow(dg)), kF32Bound) << "dg, " << at;
    if (d.layer) {
      EXPECT_LE(rel_err(gdb.download(), narrow(db)), kF32Bound) << "db, " << at;
    }
  }
}

// The fused pass writes dx with the dx kernel's own code (Norm.cu's row_dx), so its dx must be the
// two-kernel form's bit for bit; its parameter gradients only within the fp32 order bound (their sums
// are grouped differently). Oracle: norm_bwd_two_kernel on the same inputs. Widths cover every lane
// unit count the fused pass is built for: C = 256 (1 unit a lane), 512 (2), 768 (3), 1000 (4), and
// RMSNorm's 2048 (8); N = 9000 (2 rows a warp, a ragged last block).
TEST(CudaOpsNorm, FusedPassWritesTheTwoKernelDxBitForBit) {
  DHX_REQUIRE_GPU();
  uint64_t seed = 600;
  const int64_t N = 9000;
  for (int64_t C : {int64_t{256}, int64_t{512}, int64_t{768}, int64_t{1000}, int64_t{2048}}) {
    for (bool layer : {true, false}) {
      if (layer && C == 2048) continue;  // LayerNorm's 2048 takes the two-kernel form itself
      const auto x = rows_with_means(N, C, seed++), g = around_one(C, seed++);
      const auto dy = round_bf16(randn(N * C, seed++));
      std::vector<float> y(N * C), mean(N), rstd(N);
      if (layer) cpu::layernorm_fwd<float>(x.data(), g.data(), nullptr, y.data(), mean.data(), rstd.data(), N, C, kEps);
      else cpu::rmsnorm_fwd<float>(x.data(), g.data(), y.data(), rstd.data(), N, C, kEps);
      const std::vector<float> zeros(C, 0.0f);
      DevBuf<bf16> gdy(to_bf16(dy)), gx(to_bf16(x)), dx_fused(N * C), dx_two(N * C);
      DevBuf<float> gg(g), gmean(mean), grstd(rstd), dg_fused(zeros), db_fused(zeros), dg_two(zeros), db_two(zeros);
      dx_fused.poison(), dx_two.poison();
      if (layer)
        layernorm_bwd(gdy.get(), gx.get(), gg.get(), gmean.get(), grstd.get(), dx_fused.get(), dg_fused.get(),
                      db_fused.get(), N, C, nullptr);
      else rmsnorm_bwd(gdy.get(), gx.get(), gg.get(), grstd.get(), dx_fused.get(), dg_fused.get(), N, C, nullptr);
      norm_bwd_two_kernel(gdy.get(), gx.get(), gg.get(), layer ? gmean.get() : nullptr, grstd.get(), dx_two.get(),
                          dg_two.get(), layer ? db_two.get() : nullptr, N, C, layer, nullptr);
      const std::string at = std::string(layer ? "LayerNorm" : "RMSNorm") + " C=" + std::to_string(C);
      EXPECT_TRUE(same_bits(dx_fused.download(), dx_two.download())) << "dx, " << at;
      EXPECT_LE(rel_err(dg_fused.download(), dg_two.download()), kF32Bound) << "dg, " << at;
      if (layer) {
        EXPECT_LE(rel_err(db_fused.download(), db_two.download()), kF32Bound) << "db, " << at;
      }
    }
  }
}

// The residual stream's gradient added in the backward's own pass (layernorm_bwd / rmsnorm_bwd's
// add, the step's norm_bwd ops with residual): dx and the parameter gradients bit for bit those of
// the backward without it followed by add_inplace(dx, add) (the step before 2026-11-28). Oracle:
// that two-step run on the same inputs. Shapes: the fused pass (C = 768; RMSNorm's 2048), the
// two-kernel form's vector path (4096) and its scalar one (ragged C = 100), and an add 2 bytes off
// 16-byte alignment beside an aligned dx (the add alone sends an otherwise vector shape to the
// scalar path -- were its alignment not checked, the vector path's loads would fault; the
// reference's dx is put 2 bytes off instead, so that it takes that path too and sums in one order);
// N = 9000 (several rows a warp).
TEST(CudaOpsNorm, ResidualAddedInThePassIsTheBackwardThenAddInplace) {
  DHX_REQUIRE_GPU();
  uint64_t seed = 700;
  struct Case { int64_t N, C; bool misaligned; };
  for (const Case& k : {Case{9000, 768, false}, Case{300, 2048, false}, Case{64, 4096, false}, Case{37, 100, false},
                        Case{300, 768, true}}) {
    for (bool layer : {true, false}) {
      const int64_t N = k.N, C = k.C;
      const auto x = rows_with_means(N, C, seed++), g = around_one(C, seed++);
      const auto dy = round_bf16(randn(N * C, seed++)), res = round_bf16(randn(N * C, seed++));
      std::vector<float> y(N * C), mean(N), rstd(N);
      if (layer) cpu::layernorm_fwd<float>(x.data(), g.data(), nullptr, y.data(), mean.data(), rstd.data(), N, C, kEps);
      else cpu::rmsnorm_fwd<float>(x.data(), g.data(), y.data(), rstd.data(), N, C, kEps);
      const std::vector<float> zeros(C, 0.0f);
      std::vector<float> res_off(N * C + 1, 0.0f);  // the add at element 1 when misaligned
      std::copy(res.begin(), res.end(), res_off.begin() + (k.misaligned ? 1 : 0));
      const int64_t off = k.misaligned ? 1 : 0;
      DevBuf<bf16> gdy(to_bf16(dy)), gx(to_bf16(x)), gres(to_bf16(res_off)), dx_one(N * C + 1), dx_two(N * C + 1);
      DevBuf<float> gg(g), gmean(mean), grstd(rstd), dg_one(zeros), db_one(zeros), dg_two(zeros), db_two(zeros);
      dx_one.poison(), dx_two.poison();
      const bf16* add = gres.get() + off;
      bf16 *one = dx_one.get(), *two = dx_two.get() + off;  // dx_one aligned: only the add is off
      if (layer) {
        layernorm_bwd(gdy.get(), gx.get(), gg.get(), gmean.get(), grstd.get(), one, dg_one.get(), db_one.get(), N, C,
                      nullptr, add);
        layernorm_bwd(gdy.get(), gx.get(), gg.get(), gmean.get(), grstd.get(), two, dg_two.get(), db_two.get(), N, C,
                      nullptr);
      } else {
        rmsnorm_bwd(gdy.get(), gx.get(), gg.get(), grstd.get(), one, dg_one.get(), N, C, nullptr, add);
        rmsnorm_bwd(gdy.get(), gx.get(), gg.get(), grstd.get(), two, dg_two.get(), N, C, nullptr);
      }
      add_inplace(two, add, N * C, nullptr);
      const std::string at = std::string(layer ? "LayerNorm" : "RMSNorm") + " N=" + std::to_string(N) + " C=" +
                             std::to_string(C) + (k.misaligned ? " (add misaligned)" : "");
      const std::vector<bf16> got_one = dx_one.download(), got_two = dx_two.download();
      EXPECT_TRUE(same_bits(std::vector<bf16>(got_one.begin(), got_one.begin() + N * C),
                            std::vector<bf16>(got_two.begin() + off, got_two.begin() + off + N * C)))
          << "dx, " << at;
      EXPECT_TRUE(same_bits(dg_one.download(), dg_two.download())) << "dg, " << at;
      if (layer) {
        EXPECT_TRUE(same_bits(db_one.download(), db_two.download())) << "db, " << at;
      }
    }
  }
}

TEST(CudaOpsNorm, BadSizesAreInternalErrors) {
  DHX_REQUIRE_GPU();
  DevBuf<bf16> x(64), y(64);
  DevBuf<float> g(64), stat(8);
  EXPECT_THROW(layernorm_fwd(x.get(), g.get(), nullptr, y.get(), stat.get(), stat.get(), 8, 0, kEps, nullptr),
               InternalError);
  EXPECT_THROW(rmsnorm_fwd(x.get(), g.get(), y.get(), stat.get(), -1, 8, kEps, nullptr), InternalError);
  EXPECT_THROW(layernorm_bwd(x.get(), x.get(), g.get(), stat.get(), stat.get(), y.get(), g.get(), g.get(), 8, -8,
                             nullptr),
               InternalError);
}

}  // namespace
}  // namespace dhelix::cuda::test
