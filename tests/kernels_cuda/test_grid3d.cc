// AxoNN's split norms on the GPU (kernels/cuda/Grid3D.cu: grid_norm_stats, grid_ln_apply, ... as the
// 3D grid's ln_* / rms_* ops run them): each row's features cut into gx slices, each slice's sums
// taken apart, added (the all-reduce over x), then each slice normalised and differentiated from the
// summed statistics. Oracle: the whole row's norm, cpu::layernorm_fwd / layernorm_bwd /
// rmsnorm_fwd / rmsnorm_bwd in fp32 on the same bf16-rounded inputs -- a split norm is the same
// function of the row. And bias_add against x + b rounded once, bitwise.
//
// Tolerances (u = 2^-8, CudaTest.h): y and dx are rounded once to bf16 (u each); the statistics are
// double sums on the GPU (exact to ~1e-16) against the CPU's fp32 two-pass row sums (~C * 2^-24,
// ~1e-5 at C = 256) and the GPU's one-pass variance (sum x^2 / C - mean^2 in double: no cancellation
// at unit-variance data): bound 2u on y and dx (twice the rounding). mean and rstd: fp32 both, the
// CPU's fp32 sums against the GPU's double ones: 1e-5 relative. dg, db: fp32 sums over N rows of
// products of bf16 inputs, in another order than the CPU's (the kernels' chunks): ~N * 2^-24
// relative; bound 1e-4.
#include <cstring>

#include "CudaTest.h"
#include "kernels/cpu/Kernels.h"
#include "kernels/cuda/Ops.h"

namespace dhelix::cuda::test {
namespace {

constexpr double kOutBound = 2 * kBf16U;
constexpr double kStatBound = 1e-5;
constexpr double kParamGradBound = 1e-4;
constexpr float kEps = 1e-5f;

struct SplitCase {
  int64_t N, C, gx;
};
const SplitCase kSplit[] = {{37, 96, 2}, {64, 256, 4}, {5, 64, 1}};

// Columns [x * Cx, (x + 1) * Cx) of the [N, C] rows, compact.
std::vector<float> slice(const std::vector<float>& v, int64_t N, int64_t C, int64_t Cx, int64_t x) {
  std::vector<float> out(N * Cx);
  for (int64_t n = 0; n < N; ++n) std::memcpy(out.data() + n * Cx, v.data() + n * C + x * Cx, Cx * sizeof(float));
  return out;
}
std::vector<float> tail(const std::vector<float>& v, int64_t from, int64_t n) {
  return std::vector<float>(v.begin() + from, v.begin() + from + n);
}

// The GPU's split norm of every slice, its pieces side by side again: y, mean, rstd forward; dx (with
// the residual added), dg, db backward (dg, db per slice, concatenated).
struct Split {
  std::vector<float> y, mean, rstd, dx, dg, db;
};
Split gpu_split(const SplitCase& c, bool rms, const std::vector<float>& x, const std::vector<float>& dy,
                const std::vector<float>& res, const std::vector<float>& g, const std::vector<float>& b) {
  const int64_t N = c.N, C = c.C, Cx = C / c.gx, w = rms ? 1 : 2;
  std::vector<DevBuf<bf16>> xs, dys, ress;
  std::vector<DevBuf<float>> gs, bs;
  for (int64_t k = 0; k < c.gx; ++k) {
    xs.emplace_back(to_bf16(slice(x, N, C, Cx, k)));
    dys.emplace_back(to_bf16(slice(dy, N, C, Cx, k)));
    ress.emplace_back(to_bf16(slice(res, N, C, Cx, k)));
    gs.emplace_back(tail(g, k * Cx, Cx));
    bs.emplace_back(tail(b, k * Cx, Cx));
  }
  // The all-reduce over x: the slices' sums added on the host in x order.
  auto summed = [&](auto&& per_slice) {
    std::vector<double> total(N * w, 0.0);
    for (int64_t k = 0; k < c.gx; ++k) {
      DevBuf<double> st(N * w);
      st.poison();
      per_slice(k, st.get());
      const std::vector<double> h = st.download();
      for (size_t i = 0; i < total.size(); ++i) total[i] += h[i];
    }
    return total;
  };
  const std::vector<double> fst =
      summed([&](int64_t k, double* st) { grid_norm_stats(xs[k].get(), st, N, Cx, rms, nullptr); });
  DevBuf<double> gfst(fst);
  Split out{std::vector<float>(N * C), {}, {}, std::vector<float>(N * C), {}, {}};
  std::vector<DevBuf<float>> means, rstds;
  for (int64_t k = 0; k < c.gx; ++k) {
    DevBuf<bf16> y(N * Cx);
    DevBuf<float> mean(N), rstd(N);
    y.poison(), mean.poison(), rstd.poison();
    if (rms)
      grid_rms_apply(xs[k].get(), gfst.get(), gs[k].get(), y.get(), rstd.get(), N, Cx, double(C), kEps, nullptr);
    else
      grid_ln_apply(xs[k].get(), gfst.get(), gs[k].get(), bs[k].get(), y.get(), mean.get(), rstd.get(), N, Cx,
                    double(C), kEps, nullptr);
    const std::vector<float> yh = to_f32(y.download());
    for (int64_t n = 0; n < N; ++n) std::memcpy(out.y.data() + n * C + k * Cx, yh.data() + n * Cx, Cx * sizeof(float));
    if (k == 0) out.mean = rms ? std::vector<float>() : mean.download(), out.rstd = rstd.download();
    means.push_back(std::move(mean));
    rstds.push_back(std::move(rstd));
  }
  const std::vector<double> bst = summed([&](int64_t k, double* st) {
    if (rms) grid_rms_bwd_stats(dys[k].get(), xs[k].get(), gs[k].get(), st, N, Cx, nullptr);
    else grid_ln_bwd_stats(dys[k].get(), xs[k].get(), means[k].get(), rstds[k].get(), gs[k].get(), st, N, Cx, nullptr);
  });
  DevBuf<double> gbst(bst);
  for (int64_t k = 0; k < c.gx; ++k) {
    DevBuf<bf16> dx(N * Cx);
    DevBuf<float> dg(std::vector<float>(Cx, 0.0f)), db(std::vector<float>(Cx, 0.0f));
    dx.poison();
    if (rms)
      grid_rms_bwd_apply(dys[k].get(), xs[k].get(), rstds[k].get(), gbst.get(), gs[k].get(), ress[k].get(), dx.get(),
                         dg.get(), N, Cx, double(C), nullptr);
    else
      grid_ln_bwd_apply(dys[k].get(), xs[k].get(), means[k].get(), rstds[k].get(), gbst.get(), gs[k].get(),
                        ress[k].get(), dx.get(), dg.get(), db.get(), N, Cx, double(C), nullptr);
    const std::vector<float> dxh = to_f32(dx.download()), dgh = dg.download(), dbh = db.download();
    for (int64_t n = 0; n < N; ++n)
      std::memcpy(out.dx.data() + n * C + k * Cx, dxh.data() + n * Cx, Cx * sizeof(float));
    out.dg.insert(out.dg.end(), dgh.begin(), dgh.end());
    out.db.insert(out.db.end(), dbh.begin(), dbh.end());
  }
  return out;
}

// Oracle: the whole row's norm on the CPU (file comment), its dx plus the residual.
TEST(CudaGrid3D, SplitNormsEqualTheWholeRowsNorm) {
  DHX_REQUIRE_GPU();
  uint64_t seed = 900;
  for (const SplitCase& c : kSplit)
    for (bool rms : {false, true}) {
      SCOPED_TRACE(cat(rms ? "rmsnorm" : "layernorm", " N=", c.N, " C=", c.C, " gx=", c.gx));
      const int64_t N = c.N, C = c.C;
      const std::vector<float> x = round_bf16(randn(N * C, seed += 8)), dy = round_bf16(randn(N * C, seed + 1)),
                               res = round_bf16(randn(N * C, seed + 2)), g = randn(C, seed + 3),
                               b = randn(C, seed + 4);
      std::vector<float> y(N * C), mean(N), rstd(N), dx(N * C), dg(C, 0.0f), db(C, 0.0f);
      if (rms) {
        cpu::rmsnorm_fwd<float>(x.data(), g.data(), y.data(), rstd.data(), N, C, kEps);
        cpu::rmsnorm_bwd<float>(dy.data(), x.data(), g.data(), rstd.data(), dx.data(), dg.data(), N, C);
      } else {
        cpu::layernorm_fwd<float>(x.data(), g.data(), b.data(), y.data(), mean.data(), rstd.data(), N, C, kEps);
        cpu::layernorm_bwd<float>(dy.data(), x.data(), g.data(), mean.data(), rstd.data(), dx.data(), dg.data(),
                                  db.data(), N, C);
      }
      for (int64_t i = 0; i < N * C; ++i) dx[i] += res[i];
      const Split got = gpu_split(c, rms, x, dy, res, g, b);
      EXPECT_LE(rel_err(got.y, y), kOutBound) << "y";
      EXPECT_LE(rel_err(got.rstd, rstd), kStatBound) << "rstd";
      if (!rms) {
        EXPECT_LE(rel_err(got.mean, mean), kStatBound) << "mean";
      }
      EXPECT_LE(rel_err(got.dx, dx), kOutBound) << "dx";
      EXPECT_LE(rel_err(got.dg, dg), kParamGradBound) << "dg";
      if (!rms) {
        EXPECT_LE(rel_err(got.db, db), kParamGradBound) << "db";
      }
    }
}

// Oracle: x + b in fp32 rounded to nearest even, bitwise (the kernel's one rounding).
TEST(CudaGrid3D, BiasAddRoundsTheSumOnce) {
  DHX_REQUIRE_GPU();
  const int64_t N = 19, C = 40;
  const std::vector<float> x = round_bf16(randn(N * C, 31)), b = randn(C, 32);
  std::vector<float> ref(N * C);
  for (int64_t i = 0; i < N * C; ++i) ref[i] = x[i] + b[i % C];
  DevBuf<bf16> gx(to_bf16(x)), y(N * C);
  DevBuf<float> gb(b);
  y.poison();
  bias_add(gx.get(), gb.get(), y.get(), N, C, nullptr);
  const std::vector<bf16> got = y.download(), want = to_bf16(ref);
  EXPECT_EQ(0, std::memcmp(got.data(), want.data(), got.size() * sizeof(bf16)));
}

}  // namespace
}  // namespace dhelix::cuda::test
