// Op bindings for 3D tensor parallelism. Shapes: N = B*T rows (no sequence split under 3D); a
// weight block is [w_rows, w_cols] (attrs), read from the all-gathered buffer (inputs[1]) or, with
// tp_z = 1, from the parameter's flat shard itself.
//
// Norm statistics are per-token sums in double over this rank's feature slice, all-reduced over
// x, then turned into mean / rstd over the full width C (attr "features"):
//   LayerNorm: mean = S / C, var = SS / C - mean^2 (double: no cancellation at fp32 data),
//   backward   a = sum dxh, b = sum dxh xh with dxh = dy g:  dx = rstd (dxh - a/C - xh b/C)
//   RMSNorm:   rstd = (SS / C + eps)^(-1/2); backward a = sum dy g x: dx = rstd dy g - x rstd^3 a / C
// (the same formulas as kernels/cpu/Norm.cc, there over the whole row).
#include "runtime/Ops3D.h"

#include <algorithm>
#include <cmath>

#include "base/Error.h"
#include "kernels/cpu/Kernels.h"

namespace dhelix {
namespace {

using namespace cpu;

int64_t rows(const Tensor& t) { return t.dim(0); }
int64_t cols(const Tensor& t) { return t.numel() / std::max<int64_t>(1, t.dim(0)); }

int64_t attr(const OpCall& c, const char* k) {
  auto it = c.op.attrs.find(k);
  DHX_ASSERT(it != c.op.attrs.end(), "{} lacks attribute {}", c.op.name, k);
  return it->second;
}

// The weight block [w_rows, w_cols]: the gathered buffer when the op has one, else the shard.
const float* weight_block(OpCall& c, size_t input) {
  const int64_t n = attr(c, "w_rows") * attr(c, "w_cols");
  const Tensor& w = c.op.inputs.size() > input ? c.in(input) : c.param(0).value;
  DHX_ASSERT(w.numel() == n, "{}: weight block has {} elements, expected {} x {}", c.op.name, w.numel(),
             attr(c, "w_rows"), attr(c, "w_cols"));
  return w.f32();
}

void op_linear3d(OpCall& c) {
  Tensor& x = c.in(0);
  const int64_t N = rows(x), I = attr(c, "w_cols"), O = attr(c, "w_rows");
  DHX_ASSERT(cols(x) == I, "{}: input {} vs block columns {}", c.op.name, x.describe(), I);
  const float* w = weight_block(c, 1);
  Tensor& y = c.out_new(0, {N, O});
  linear_fwd<float>(x.f32(), w, nullptr, y.f32(), N, I, O, c.precision);
}

void op_linear3d_dgrad(OpCall& c) {
  Tensor& dy = c.in(0);
  const int64_t N = rows(dy), I = attr(c, "w_cols"), O = attr(c, "w_rows");
  DHX_ASSERT(cols(dy) == O, "{}: dy {} vs block rows {}", c.op.name, dy.describe(), O);
  const float* w = weight_block(c, 1);
  Tensor& dx = c.out_new(0, {N, I});
  linear_bwd_data<float>(dy.f32(), w, dx.f32(), N, I, O, Accumulate::kNo, c.precision);
}

// The block's weight gradient dy^T x: into a fresh flat buffer for the reduce-scatter over z
// (outputs[0]), or accumulated straight into the parameter's gradient (tp_z = 1).
void op_linear3d_wgrad(OpCall& c) {
  Tensor& dy = c.in(0);
  Tensor& x = c.in(1);
  const int64_t N = rows(dy), I = attr(c, "w_cols"), O = attr(c, "w_rows");
  if (!c.op.outputs.empty()) {
    Tensor& dw = c.out_new(0, {O * I});
    dw.zero_();
    linear_bwd_weight_rows<float>(dy.f32(), x.f32(), dw.f32(), nullptr, N, I, O, 0, O, c.precision);
  } else {
    ParamEntry& w = c.grad(0);
    DHX_ASSERT(w.grad.numel() == O * I, "{}: gradient shard {} vs block {} x {}", c.op.name, w.grad.describe(), O, I);
    linear_bwd_weight_rows<float>(dy.f32(), x.f32(), w.grad.f32(), nullptr, N, I, O, 0, O, c.precision);
  }
}

// The reduce-scattered weight-gradient shard, added into the parameter's gradient.
void op_grad_accum(OpCall& c) {
  Tensor& g = c.in(0);
  ParamEntry& w = c.grad(0);
  DHX_ASSERT(g.numel() == w.grad.numel(), "{}: {} vs gradient {}", c.op.name, g.describe(), w.grad.describe());
  add_inplace<float>(w.grad.f32(), g.f32(), g.numel());
}

void op_bias_add(OpCall& c) {
  Tensor& x = c.in(0);
  const int64_t N = rows(x), O = cols(x);
  const float* b = c.param(0).value.f32();
  Tensor& y = c.out_new(0, {N, O});
  const float* px = x.f32();
  float* py = y.f32();
  for (int64_t n = 0; n < N; ++n)
    for (int64_t o = 0; o < O; ++o) py[n * O + o] = px[n * O + o] + b[o];
}

// ---- the MoE MLP's token slices on the grid (Lowering3D.cc) ---------------------------------------

}  // namespace

GridRows grid_rows_of(const OpCall& c, const Tensor& g) {
  const int gx = c.shard.gx, plane = c.shard.gx * c.shard.gy;
  const int64_t Cx = cols(g), N = rows(g) / gx, Ns = N / plane;
  DHX_ASSERT(rows(g) == N * gx && N == Ns * plane, "{}: {} is not {} pieces of tokens split over a plane of {}",
             c.op.name, g.describe(), gx, plane);
  return {gx, Cx, N, Ns, Cx * gx, int64_t(c.shard.xy) * Ns};
}

GridCols grid_cols_of(const OpCall& c, const Tensor& g) {
  const int64_t N = rows(g), C = cols(g), Cx = C / c.shard.gx;
  DHX_ASSERT(Cx * c.shard.gx == C, "{}: {} features over tp_x={}", c.op.name, C, c.shard.gx);
  return {N, C, Cx, int64_t(c.shard.x) * Cx};
}

namespace {

// From the stream gathered over x ([Gx N, C/Gx], piece x' at rows x' N) to this rank's slice of the
// plane's tokens with all features: rows [xy Ns, (xy+1) Ns) of each piece, the pieces side by side.
void op_grid_rows(OpCall& c) {
  Tensor& g = c.in(0);
  const GridRows r = grid_rows_of(c, g);
  Tensor& y = c.out_new(0, {r.Ns, r.C});
  const float* pg = g.f32();
  float* py = y.f32();
  for (int x = 0; x < r.gx; ++x)
    for (int64_t i = 0; i < r.Ns; ++i)
      std::copy_n(pg + (x * r.N + r.r0 + i) * r.Cx, r.Cx, py + i * r.C + x * r.Cx);
}

// From the slices gathered over the plane ([N, C]: the tokens in order) to the stream's layout: the
// features of x, [N, C/Gx].
void op_grid_cols(OpCall& c) {
  Tensor& g = c.in(0);
  const GridCols k = grid_cols_of(c, g);
  Tensor& y = c.out_new(0, {k.N, k.Cx});
  const float* pg = g.f32();
  float* py = y.f32();
  for (int64_t n = 0; n < k.N; ++n) std::copy_n(pg + n * k.C + k.c0, k.Cx, py + n * k.Cx);
}

// ---- norms split around an all-reduce over x ----------------------------------------------------

// LayerNorm statistics: per token (sum x, sum x^2) over the local features, in double.
void op_ln_stats(OpCall& c) {
  Tensor& x = c.in(0);
  const int64_t N = rows(x), C = cols(x);
  Tensor& st = c.out_new(0, {N, 2}, DType::kF64);
  double* s = st.data<double>();
  for (int64_t n = 0; n < N; ++n) {
    const float* r = x.f32() + n * C;
    double a = 0, b = 0;
    for (int64_t k = 0; k < C; ++k) a += r[k], b += double(r[k]) * r[k];
    s[2 * n] = a, s[2 * n + 1] = b;
  }
}

void op_ln_apply(OpCall& c) {
  Tensor& x = c.in(0);
  Tensor& st = c.in(1);
  const int64_t N = rows(x), C = cols(x);
  const double Cf = static_cast<double>(attr(c, "features"));
  const float* g = c.param(0).value.f32();
  const float* b = c.param(1).value.f32();
  Tensor& y = c.out_new(0, {N, C});
  Tensor& mean = c.out_new(1, {N});
  Tensor& rstd = c.out_new(2, {N});
  const double* s = st.data<double>();
  for (int64_t n = 0; n < N; ++n) {
    const double mu = s[2 * n] / Cf, var = std::max(0.0, s[2 * n + 1] / Cf - mu * mu);
    const float m = static_cast<float>(mu), rs = static_cast<float>(1.0 / std::sqrt(var + c.model.norm_eps));
    const float* r = x.f32() + n * C;
    float* o = y.f32() + n * C;
    for (int64_t k = 0; k < C; ++k) o[k] = (r[k] - m) * rs * g[k] + b[k];
    mean.f32()[n] = m, rstd.f32()[n] = rs;
  }
}

// Backward statistics: per token (sum dxh, sum dxh xh), dxh = dy g, xh = (x - mean) rstd.
void op_ln_bwd_stats(OpCall& c) {
  Tensor& dy = c.in(0);
  Tensor& x = c.in(1);
  const float* mean = c.in(2).f32();
  const float* rstd = c.in(3).f32();
  const int64_t N = rows(x), C = cols(x);
  const float* g = c.param(0).value.f32();
  Tensor& st = c.out_new(0, {N, 2}, DType::kF64);
  double* s = st.data<double>();
  for (int64_t n = 0; n < N; ++n) {
    const float* xr = x.f32() + n * C;
    const float* dr = dy.f32() + n * C;
    double a = 0, b = 0;
    for (int64_t k = 0; k < C; ++k) {
      const double dxh = double(dr[k]) * g[k];
      a += dxh, b += dxh * (double(xr[k]) - mean[n]) * rstd[n];
    }
    s[2 * n] = a, s[2 * n + 1] = b;
  }
}

// dx = rstd (dxh - a/C - xh b/C) (+ the residual gradient); dg += sum dy xh, db += sum dy over
// this rank's tokens (a partial gradient, reduced over z by GradSync).
void op_ln_bwd_apply(OpCall& c) {
  Tensor& dy = c.in(0);
  Tensor& x = c.in(1);
  const float* mean = c.in(2).f32();
  const float* rstd = c.in(3).f32();
  const double* s = c.in(4).data<double>();
  const int64_t N = rows(x), C = cols(x);
  const double Cf = static_cast<double>(attr(c, "features"));
  const float* g = c.param(0).value.f32();
  float* dg = c.grad(0).grad.f32();
  float* db = c.grad(1).grad.f32();
  Tensor& dx = c.out_new(0, {N, C});
  for (int64_t n = 0; n < N; ++n) {
    const float* xr = x.f32() + n * C;
    const float* dr = dy.f32() + n * C;
    float* o = dx.f32() + n * C;
    const float a = static_cast<float>(s[2 * n] / Cf), b = static_cast<float>(s[2 * n + 1] / Cf);
    for (int64_t k = 0; k < C; ++k) {
      const float xh = (xr[k] - mean[n]) * rstd[n];
      o[k] = rstd[n] * (dr[k] * g[k] - a - xh * b);
      dg[k] += dr[k] * xh;
      db[k] += dr[k];
    }
  }
  if (attr(c, "residual")) add_inplace<float>(dx.f32(), c.in(5).f32(), N * C);
}

void op_rms_stats(OpCall& c) {
  Tensor& x = c.in(0);
  const int64_t N = rows(x), C = cols(x);
  Tensor& st = c.out_new(0, {N}, DType::kF64);
  for (int64_t n = 0; n < N; ++n) {
    const float* r = x.f32() + n * C;
    double b = 0;
    for (int64_t k = 0; k < C; ++k) b += double(r[k]) * r[k];
    st.data<double>()[n] = b;
  }
}

void op_rms_apply(OpCall& c) {
  Tensor& x = c.in(0);
  Tensor& st = c.in(1);
  const int64_t N = rows(x), C = cols(x);
  const double Cf = static_cast<double>(attr(c, "features"));
  const float* g = c.param(0).value.f32();
  Tensor& y = c.out_new(0, {N, C});
  Tensor& rstd = c.out_new(1, {N});
  for (int64_t n = 0; n < N; ++n) {
    const float rs = static_cast<float>(1.0 / std::sqrt(st.data<double>()[n] / Cf + c.model.norm_eps));
    const float* r = x.f32() + n * C;
    float* o = y.f32() + n * C;
    for (int64_t k = 0; k < C; ++k) o[k] = r[k] * rs * g[k];
    rstd.f32()[n] = rs;
  }
}

void op_rms_bwd_stats(OpCall& c) {
  Tensor& dy = c.in(0);
  Tensor& x = c.in(1);
  const int64_t N = rows(x), C = cols(x);
  const float* g = c.param(0).value.f32();
  Tensor& st = c.out_new(0, {N}, DType::kF64);
  for (int64_t n = 0; n < N; ++n) {
    const float* xr = x.f32() + n * C;
    const float* dr = dy.f32() + n * C;
    double a = 0;
    for (int64_t k = 0; k < C; ++k) a += double(dr[k]) * g[k] * xr[k];
    st.data<double>()[n] = a;
  }
}

void op_rms_bwd_apply(OpCall& c) {
  Tensor& dy = c.in(0);
  Tensor& x = c.in(1);
  const float* rstd = c.in(2).f32();
  const double* s = c.in(3).data<double>();
  const int64_t N = rows(x), C = cols(x);
  const double Cf = static_cast<double>(attr(c, "features"));
  const float* g = c.param(0).value.f32();
  float* dg = c.grad(0).grad.f32();
  Tensor& dx = c.out_new(0, {N, C});
  for (int64_t n = 0; n < N; ++n) {
    const float* xr = x.f32() + n * C;
    const float* dr = dy.f32() + n * C;
    float* o = dx.f32() + n * C;
    const float rs = rstd[n], k3 = static_cast<float>(double(rs) * rs * rs * s[n] / Cf);
    for (int64_t k = 0; k < C; ++k) {
      o[k] = rs * dr[k] * g[k] - xr[k] * k3;
      dg[k] += dr[k] * xr[k] * rs;
    }
  }
  if (attr(c, "residual")) add_inplace<float>(dx.f32(), c.in(4).f32(), N * C);
}

}  // namespace

void add_3d_ops(std::map<std::string, OpFn>& t) {
  t["linear3d"] = op_linear3d;
  t["linear3d_dgrad"] = op_linear3d_dgrad;
  t["linear3d_wgrad"] = op_linear3d_wgrad;
  t["grad_accum"] = op_grad_accum;
  t["bias_add"] = op_bias_add;
  t["grid_rows"] = op_grid_rows;
  t["grid_cols"] = op_grid_cols;
  t["ln_stats"] = op_ln_stats;
  t["ln_apply"] = op_ln_apply;
  t["ln_bwd_stats"] = op_ln_bwd_stats;
  t["ln_bwd_apply"] = op_ln_bwd_apply;
  t["rms_stats"] = op_rms_stats;
  t["rms_apply"] = op_rms_apply;
  t["rms_bwd_stats"] = op_rms_bwd_stats;
  t["rms_bwd_apply"] = op_rms_bwd_apply;
}

}  // namespace dhelix
