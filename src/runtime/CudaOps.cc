// Op bindings on a GPU: the layer programs' op codes -> kernels/cuda, the CUDA twin of
// OpRegistry.cc's CPU bindings for one GPU per rank, with Megatron's tensor and sequence parallelism
// (issue 39: the vocabulary-parallel embedding and cross-entropy, local heads, positions on a
// sequence shard), context parallelism (the ring attention's steps, positions and RoPE of a rank's
// two chunks) and AxoNN's 3D grid for dense models (weight blocks gathered in bf16, the norms split
// around the x all-reduce); MoE at tp = cp = 1 off the grid, with expert parallelism (the ep
// regrouping as block copies). Activations and
// their gradients are bf16 [N, cols] (N = B*T rows); norm statistics, losses and parameter
// gradients fp32; the GEMMs read each weight's bf16 copy (ParamEntry::value_bf16, kept by the GPU
// ParamStore), norms and biases their fp32 values. Every kernel is enqueued on the op's stream
// (OpCall::stream); nothing here synchronises the device (the MoE ops' host reads wait for copies of
// a few counts, each once per micro-batch: UnitEnv::host_view).
#include "runtime/CudaOps.h"

#if DHELIX_HAVE_CUDA

#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "base/Error.h"
#include "kernels/cpu/Kernels.h"
#include "kernels/cuda/Attention.h"
#include "kernels/cuda/Gemm.h"
#include "kernels/cuda/Moe.h"
#include "kernels/cuda/Ops.h"
#include "runtime/HostCopies.h"
#include "runtime/Ops3D.h"

namespace dhelix {
namespace {

using cuda::bf16;

bf16* b16(const Tensor& t) {
  DHX_CHECK(t.dtype() == DType::kBF16 && !t.device().is_host(), InternalError, "{} on {} is not a bf16 GPU tensor",
            t.describe(), t.device().str());
  return static_cast<bf16*>(t.raw());
}
float* f32(const Tensor& t) {
  DHX_CHECK(t.dtype() == DType::kF32 && !t.device().is_host(), InternalError, "{} on {} is not an fp32 GPU tensor",
            t.describe(), t.device().str());
  return static_cast<float*>(t.raw());
}
int32_t* i32(const Tensor& t) {
  DHX_CHECK(t.dtype() == DType::kI32 && !t.device().is_host(), InternalError, "{} on {} is not an int32 GPU tensor",
            t.describe(), t.device().str());
  return static_cast<int32_t*>(t.raw());
}
using op::attr;
using op::attr_or;
using op::cols;
using op::rows;
cudaStream_t st(const OpCall& c) { return static_cast<cudaStream_t>(c.stream); }
// One GPU per rank: what every binding needs (Megatron's tensor and sequence parallelism, context
// parallelism and AxoNN's 3D grid all run).
void require_layout(const OpCall& c) {
  DHX_CHECK(c.blas != nullptr, InternalError, "op {} on {}: the run context has no cuBLASLt handle", c.op.name,
            c.device.str());
}
const Tensor& weight_bf16(const ParamEntry& e) {
  DHX_CHECK(e.value_bf16.defined(), InternalError, "parameter {} has no bf16 copy (ParamStore::move_to a GPU first)",
            e.spec.name);
  return e.value_bf16;
}
// The LM head computes every row of its padded weight ([padded_vocab, C], zero rows past the
// vocabulary): a row stride that is a multiple of 128 keeps cuBLAS's fast kernels (V = 50257 would
// make it odd: ~130 TFLOP/s instead of ~750 on an H200). cross_entropy leaves the padding columns
// out of the softmax and writes their gradient 0.
int64_t linear_out(const OpCall& c, const Tensor& w) { return w.dim(0); }

// The MoE router's linear (parameter "router"): its logits are written in fp32, so the routing
// decisions (softmax, top-k) see the GEMM's fp32 sums as on the CPU, not a bf16 rounding of them.
bool fp32_logits(const OpCall& c) { return !c.op.params.empty() && c.op.params[0] == "router"; }

// An fp32 gradient (the router's dlogits) rounded to bf16 for the GEMMs, in a temporary; a bf16 one
// as it is.
Tensor bf16_operand(const OpCall& c, const Tensor& t) {
  if (t.dtype() == DType::kBF16) return t;
  Tensor r = Tensor::empty(t.shape(), DType::kBF16, c.act_mem, c.device, c.stream);
  cuda::cast_f32_to_bf16(f32(t), b16(r), t.numel(), st(c));
  return r;
}

// A forward linear's extents from its input (inputs[0]) and weight (params[0]): N rows, I = the
// weight's input width (checked against x's), O its output rows.
struct LinearDims {
  int64_t N, I, O;
};
LinearDims linear_dims(const OpCall& c) {
  const Tensor& x = c.in(0);
  const ParamEntry& w = c.param(0);
  const LinearDims d{rows(x), cols(x), linear_out(c, w.value)};
  DHX_ASSERT(d.I == w.value.dim(1), "{}: input {} vs weight {}", c.op.name, x.describe(), w.value.describe());
  return d;
}

void op_linear(OpCall& c) {
  require_layout(c);
  Tensor& x = c.in(0);
  const ParamEntry& w = c.param(0);
  const auto [N, I, O] = linear_dims(c);
  const bf16* bias = c.op.params.size() > 1 ? b16(weight_bf16(c.param(1))) : nullptr;
  if (fp32_logits(c)) {
    DHX_CHECK(bias == nullptr, InternalError, "{}: the router has no bias", c.op.name);
    Tensor& y = c.out_new(0, {N, O});
    c.blas->gemm(cuda::Blas::Op::kN, cuda::Blas::Op::kT, N, O, I, 1.0f, b16(x), I, b16(weight_bf16(w)), I, 0.0f,
                 f32(y), O, cuda::Blas::Out::kF32, nullptr, st(c));
    return;
  }
  Tensor& y = c.out_new(0, {N, O}, DType::kBF16);
  c.blas->linear_fwd(b16(x), b16(weight_bf16(w)), bias, b16(y), N, I, O, st(c));
}

void op_linear_dgrad(OpCall& c) {
  require_layout(c);
  const Tensor dy = bf16_operand(c, c.in(0));
  const ParamEntry& w = c.param(0);
  const int64_t N = rows(dy), O = cols(dy), I = w.value.dim(1);
  Tensor& dx = c.out_new(0, {N, I}, DType::kBF16);
  c.blas->linear_bwd_data(b16(dy), b16(weight_bf16(w)), b16(dx), N, I, O, cuda::Accumulate::kNo, st(c));
}

// ---- the fused ops (the GPU's epilogue rewrite of the layer programs): each one cuBLASLt GEMM with
// an epilogue where cuBLASLt runs it, else the unfused pair's kernels in the unfused order (the same
// bits as the two ops; kernels/cuda/Gemm.h's linear_gelu / linear_dgrad_gelu / linear_residual) ----

// linear + gelu: {x [N,I]} -> {act [N,O], pre [N,O]}, params {w [O,I] (, b [O])}: pre = x w^T (+ b),
// act = gelu(pre) (the tanh form); both bf16. pre is what gelu_bwd (or linear_dgrad_gelu) reads.
void op_linear_gelu(OpCall& c) {
  require_layout(c);
  Tensor& x = c.in(0);
  const ParamEntry& w = c.param(0);
  const auto [N, I, O] = linear_dims(c);
  DHX_ASSERT(!fp32_logits(c), "{}: the router's fp32 logits have no GELU", c.op.name);
  const bf16* bias = c.op.params.size() > 1 ? b16(weight_bf16(c.param(1))) : nullptr;
  Tensor& act = c.out_new(0, {N, O}, DType::kBF16);
  Tensor& pre = c.out_new(1, {N, O}, DType::kBF16);
  cuda::linear_gelu(*c.blas, b16(x), b16(weight_bf16(w)), bias, b16(act), b16(pre), N, I, O, st(c));
}

// linear_dgrad + gelu_bwd: {dy [N,O], pre [N,I]} -> {dpre [N,I]}, params {w [O,I]}: dpre =
// gelu'(pre) * (dy w) (the linear's input was gelu(pre), so its width I is pre's).
void op_linear_dgrad_gelu(OpCall& c) {
  require_layout(c);
  const Tensor dy = bf16_operand(c, c.in(0));
  Tensor& pre = c.in(1);
  const ParamEntry& w = c.param(0);
  const int64_t N = rows(dy), O = cols(dy), I = w.value.dim(1);
  DHX_ASSERT(rows(pre) == N && cols(pre) == I, "{}: pre {} vs dy {} and weight {}", c.op.name, pre.describe(),
             dy.describe(), w.value.describe());
  Tensor& dpre = c.out_new(0, {N, I}, DType::kBF16);
  cuda::linear_dgrad_gelu(*c.blas, b16(dy), b16(weight_bf16(w)), b16(pre), b16(dpre), N, I, O, st(c));
}

// linear (no bias) + residual_add: {x [N,I], skip [N,O]} -> {y [N,O]}, params {w [O,I] (, bias [O])}:
// y = skip + x w^T (+ bias). The fused epilogue adds the bias's bf16 copy (cuBLASLt's bias has D's
// type, bf16: cublasLt.h, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE); the fallback, as residual_add,
// its fp32 value.
void op_linear_residual(OpCall& c) {
  require_layout(c);
  Tensor& x = c.in(0);
  Tensor& skip = c.in(1);
  const ParamEntry& w = c.param(0);
  const auto [N, I, O] = linear_dims(c);
  DHX_ASSERT(rows(skip) == N && cols(skip) == O, "{}: skip {} vs output [{}, {}]", c.op.name, skip.describe(), N, O);
  const bool has_bias = c.op.params.size() > 1;
  const bf16* bias16 = has_bias ? b16(weight_bf16(c.param(1))) : nullptr;
  const float* bias32 = has_bias ? f32(c.param(1).value) : nullptr;
  Tensor& y = c.out_new(0, {N, O}, DType::kBF16);
  cuda::linear_residual(*c.blas, b16(x), b16(weight_bf16(w)), bias16, bias32, b16(skip), b16(y), N, I, O, st(c));
}

// A whole weight gradient, or rows [lo, hi) of it (a split wgrad); its bias gradient only whole.
void op_linear_wgrad(OpCall& c) {
  require_layout(c);
  const Tensor dy = bf16_operand(c, c.in(0));
  Tensor& x = c.in(1);
  ParamEntry& w = c.grad(0);
  const int64_t N = rows(dy), O = cols(dy), I = cols(x), lo = attr_or(c, "rows_lo", 0), hi = attr_or(c, "rows_hi", O);
  float* db = c.op.grads.size() > 1 ? f32(c.grad(1).grad) : nullptr;
  if (lo == 0 && hi == O) {
    c.blas->linear_bwd_weight(b16(dy), b16(x), f32(w.grad), db, N, I, O, st(c));
    return;
  }
  // Rows [lo, hi) (Megatron's first column GEMM under tp: half inline, half trailing), with the
  // bias's rows [lo, hi) when it has one (cpu's linear_bwd_weight_rows).
  c.blas->gemm(cuda::Blas::Op::kT, cuda::Blas::Op::kN, hi - lo, I, N, 1.0f, b16(dy) + lo, O, b16(x), I, 1.0f,
               f32(w.grad) + lo * I, I, cuda::Blas::Out::kF32, nullptr, st(c));
  if (db != nullptr) cuda::bias_grad_strided(b16(dy) + lo, O, db + lo, N, hi - lo, st(c));
}

void op_bias_grad(OpCall& c) {
  Tensor& dy = c.in(0);
  cuda::bias_grad(b16(dy), f32(c.grad(0).grad), rows(dy), cols(dy), st(c));
}

void op_layernorm(OpCall& c) {
  Tensor& x = c.in(0);
  const int64_t N = rows(x), C = cols(x);
  Tensor& y = c.out_new(0, {N, C}, DType::kBF16);
  Tensor& mean = c.out_new(1, {N});
  Tensor& rstd = c.out_new(2, {N});
  cuda::layernorm_fwd(b16(x), f32(c.param(0).value), f32(c.param(1).value), b16(y), f32(mean), f32(rstd), N, C,
                      static_cast<float>(c.model.norm_eps), st(c));
}

void op_layernorm_bwd(OpCall& c) {
  Tensor& dy = c.in(0);
  Tensor& x = c.in(1);
  const int64_t N = rows(x), C = cols(x);
  Tensor& dx = c.out_new(0, {N, C}, DType::kBF16);
  // The residual stream's gradient added in the same pass (the bits of add_inplace after it).
  const bf16* add = c.op.attrs.at("residual") ? b16(c.in(4)) : nullptr;
  cuda::layernorm_bwd(b16(dy), b16(x), f32(c.param(0).value), f32(c.in(2)), f32(c.in(3)), b16(dx),
                      f32(c.grad(0).grad), f32(c.grad(1).grad), N, C, st(c), add);
}

void op_rmsnorm(OpCall& c) {
  Tensor& x = c.in(0);
  const int64_t N = rows(x), C = cols(x);
  Tensor& y = c.out_new(0, {N, C}, DType::kBF16);
  Tensor& rstd = c.out_new(1, {N});
  cuda::rmsnorm_fwd(b16(x), f32(c.param(0).value), b16(y), f32(rstd), N, C, static_cast<float>(c.model.norm_eps),
                    st(c));
}

void op_rmsnorm_bwd(OpCall& c) {
  Tensor& dy = c.in(0);
  Tensor& x = c.in(1);
  const int64_t N = rows(x), C = cols(x);
  Tensor& dx = c.out_new(0, {N, C}, DType::kBF16);
  const bf16* add = c.op.attrs.at("residual") ? b16(c.in(3)) : nullptr;  // as layernorm_bwd's
  cuda::rmsnorm_bwd(b16(dy), b16(x), f32(c.param(0).value), f32(c.in(2)), b16(dx), f32(c.grad(0).grad), N, C, st(c),
                    add);
}

// RoPE over the q and k heads of the packed [N, (H + 2 Hkv) D] rows (this rank's heads under tp):
// copy, then rotate in place.
void rope_common(OpCall& c, bool backward) {
  require_layout(c);
  Tensor& x = c.in(0);
  const int64_t N = rows(x), W = cols(x), D = c.model.head_dim();
  Tensor& y = c.out_new(0, {N, W}, DType::kBF16);
  y.copy_from(x);
  const int64_t heads = (c.model.n_heads + c.model.n_kv_heads) / c.head_shards();  // this rank's q and k heads
  auto rotate = [&](bf16* at, int64_t B, int64_t T, int64_t pos0) {
    if (backward)
      cuda::rope_bwd(at, B, T, heads, D, W, pos0, c.model.rope_theta, st(c));
    else
      cuda::rope_fwd(at, B, T, heads, D, W, pos0, c.model.rope_theta, st(c));
  };
  DHX_ASSERT(N == c.mb.B * c.mb.T, "{}: {} rows for B={} T={}", c.op.name, N, c.mb.B, c.mb.T);
  if (c.cp == 1) {
    rotate(b16(y), c.mb.B, c.mb.T, 0);
    return;
  }
  // Context parallelism: each sequence's local rows are two chunks, each contiguous in position
  // (the CPU's rope: the same angles, chunk by chunk).
  const int64_t half = c.mb.T / 2;
  for (int64_t b = 0; b < c.mb.B; ++b)
    for (int64_t h = 0; h < 2; ++h) rotate(b16(y) + (b * c.mb.T + h * half) * W, 1, half, c.seq_pos(h * half));
}
void op_rope(OpCall& c) { rope_common(c, false); }
void op_rope_bwd(OpCall& c) { rope_common(c, true); }

cuda::AttnShape attn_shape(const OpCall& c, int64_t width) {
  const int64_t H = attr(c, "heads"), Hkv = attr(c, "kv_heads"), D = attr(c, "head_dim");
  return cuda::AttnShape{c.mb.B, c.mb.T, H, Hkv, D, width, width, H * D};
}

void op_attention(OpCall& c) {
  require_layout(c);
  Tensor& qkv = c.in(0);
  const int64_t N = rows(qkv), W = cols(qkv);
  const cuda::AttnShape s = attn_shape(c, W);
  const bf16* q = b16(qkv);
  Tensor& o = c.out_new(0, {N, s.H * s.D}, DType::kBF16);
  Tensor& lse = c.out_new(1, {s.B, s.H, s.T});
  cuda::attention_fwd(q, q + s.H * s.D, q + (s.H + s.Hkv) * s.D, b16(o), f32(lse), s,
                      1.0f / std::sqrt(static_cast<float>(s.D)), st(c));
}

void op_attention_bwd(OpCall& c) {
  require_layout(c);
  Tensor& qkv = c.in(0);
  const int64_t N = rows(qkv), W = cols(qkv);
  const cuda::AttnShape s = attn_shape(c, W);
  const bf16* q = b16(qkv);
  Tensor& dqkv = c.out_new(0, {N, W}, DType::kBF16);
  bf16* dq = b16(dqkv);
  cuda::attention_bwd(q, q + s.H * s.D, q + (s.H + s.Hkv) * s.D, b16(c.in(1)), f32(c.in(2)), b16(c.in(3)), dq,
                      dq + s.H * s.D, dq + (s.H + s.Hkv) * s.D, s, 1.0f / std::sqrt(static_cast<float>(s.D)), st(c));
}

// ---- context parallelism: the ring attention's ops (sharding/CpRing.cc; the CPU's in OpRegistry.cc) ----
// The travelling keys/values are bf16 (kv [N, 2 Hkv D], the packed qkv's k and v columns); the
// running output, lse and the gradients that the ring's steps accumulate are fp32, as on the CPU,
// and the last steps round once: the forward's output for the output projection, the backward's
// dqkv for the qkv GEMMs.
cpu::RingDims ring_dims(const OpCall& c, int64_t W) {
  const cpu::RingDims r{c.cp, c.cp_rank, c.mb.B, c.mb.T, attr(c, "heads"), attr(c, "kv_heads"), attr(c, "head_dim"), W};
  DHX_ASSERT(W == (r.H + 2 * r.Hkv) * r.D, "{}: qkv rows of {} columns for H={} Hkv={} D={}", c.op.name, W, r.H,
             r.Hkv, r.D);
  DHX_ASSERT(c.cp >= 2, "{}: a ring step with cp={}", c.op.name, c.cp);
  return r;
}
float ring_scale(const cpu::RingDims& r) { return 1.0f / std::sqrt(static_cast<float>(r.D)); }

// kv [N, 2 Hkv D]: the k and v columns of the packed qkv rows, the buffer that travels the ring.
void op_cp_kv_pack(OpCall& c) {
  require_layout(c);
  Tensor& qkv = c.in(0);
  const int64_t N = rows(qkv), W = cols(qkv), H = attr(c, "heads"), Hkv = attr(c, "kv_heads"), D = attr(c, "head_dim");
  const int64_t kvw = 2 * Hkv * D;
  Tensor& kv = c.out_new(0, {N, kvw}, DType::kBF16);
  cuda::copy_cols(b16(qkv) + H * D, W, b16(kv), kvw, N, kvw, st(c));
}

// Step i: inputs qkv, the keys/values of step i and (i > 0) the running output and lse (fp32), into
// which the step's block is merged in place. The last step also writes the output in bf16.
void op_ring_attention(OpCall& c) {
  require_layout(c);
  Tensor& qkv = c.in(0);
  Tensor& kv = c.in(1);
  const int64_t N = rows(qkv);
  const cpu::RingDims r = ring_dims(c, cols(qkv));
  const int step = static_cast<int>(attr(c, "step"));
  if (step == 0) {  // all local queries against the rank's own keys: the running output's start
    Tensor& o = c.out_new(0, {N, r.H * r.D}, DType::kF32);
    Tensor& lse = c.out_new(1, {r.B, r.H, r.Tl}, DType::kF32);
    cuda_ring_fwd_step(r, 0, b16(qkv), b16(kv), f32(o), f32(lse), nullptr, nullptr, ring_scale(r), c.stream);
    return;
  }
  Tensor o = c.in(2), lse = c.in(3);
  Tensor o_tmp = Tensor::empty(o.shape(), DType::kF32, c.act_mem, c.device, c.stream);
  Tensor lse_tmp = Tensor::empty(lse.shape(), DType::kF32, c.act_mem, c.device, c.stream);
  cuda_ring_fwd_step(r, step, b16(qkv), b16(kv), f32(o), f32(lse), f32(o_tmp), f32(lse_tmp), ring_scale(r), c.stream);
  c.env.bufs[c.op.outputs.at(1)] = lse;
  if (step + 1 < c.cp) {
    c.env.bufs[c.op.outputs.at(0)] = o;
    return;
  }
  Tensor& att = c.out_new(0, {N, r.H * r.D}, DType::kBF16);  // for the output projection's GEMM
  cuda::cast_f32_to_bf16(f32(o), b16(att), o.numel(), st(c));
}

// Step i backward: inputs qkv, the step's keys/values, the final att (bf16) and lse, datt and
// (i > 0) the running dq (fp32 [N, W], q columns accumulated; aliased by this step's output);
// outputs dq and this step's share of dK/dV for the keys it saw (fp32, kv's layout).
void op_ring_attention_bwd(OpCall& c) {
  require_layout(c);
  Tensor& qkv = c.in(0);
  Tensor& kv = c.in(1);
  const int64_t N = rows(qkv), W = cols(qkv);
  const cpu::RingDims r = ring_dims(c, W);
  const int step = static_cast<int>(attr(c, "step"));
  Tensor dq;
  if (step == 0) {
    dq = Tensor::empty({N, W}, DType::kF32, c.act_mem, c.device, c.stream);
    dq.zero_();
  } else {
    dq = c.in(5);
  }
  c.env.bufs[c.op.outputs.at(0)] = dq;
  Tensor& dkv = c.out_new(1, kv.shape(), DType::kF32);
  dkv.zero_();
  cuda_ring_bwd_step(r, step, b16(qkv), b16(kv), b16(c.in(2)), f32(c.in(3)), b16(c.in(4)), f32(dq), f32(dkv),
                     ring_scale(r), c.stream);
}

// The dK/dV that arrived (travelling with the keys it belongs to) plus this rank's share, in place.
void op_cp_dkv_add(OpCall& c) {
  require_layout(c);
  Tensor acc = c.in(0);
  Tensor& mine = c.in(1);
  DHX_ASSERT(acc.numel() == mine.numel(), "{}: {} vs {}", c.op.name, acc.describe(), mine.describe());
  cuda::add_inplace(f32(acc), f32(mine), acc.numel(), st(c));
  c.env.bufs[c.op.outputs.at(0)] = acc;
}

// dqkv (bf16): dq's q columns, and in the k, v columns this rank's own share of the dK/dV of its keys
// (step 0) plus the other ranks' shares, which arrived round the ring.
void op_cp_ring_bwd_finish(OpCall& c) {
  require_layout(c);
  Tensor& dq = c.in(0);
  Tensor& own = c.in(1);
  Tensor& came = c.in(2);
  const int64_t N = rows(dq), W = cols(dq), qc = attr(c, "heads") * attr(c, "head_dim");
  DHX_ASSERT(cols(own) == W - qc && came.numel() == own.numel(), "{}: dq {} own {} came {} for {} q columns",
             c.op.name, dq.describe(), own.describe(), came.describe(), qc);
  Tensor& dqkv = c.out_new(0, {N, W}, DType::kBF16);
  cuda::cp_ring_finish(f32(dq), f32(own), f32(came), b16(dqkv), N, W, qc, st(c));
}

void op_gelu(OpCall& c) {
  Tensor& x = c.in(0);
  Tensor& y = c.out_new(0, x.shape(), DType::kBF16);
  cuda::gelu_fwd(b16(x), b16(y), x.numel(), st(c));
}
void op_gelu_bwd(OpCall& c) {
  Tensor& x = c.in(1);
  Tensor& dx = c.out_new(0, x.shape(), DType::kBF16);
  cuda::gelu_bwd(b16(c.in(0)), b16(x), b16(dx), x.numel(), st(c));
}
void op_swiglu(OpCall& c) {
  Tensor& gu = c.in(0);
  const int64_t N = rows(gu), F = cols(gu) / 2;
  Tensor& y = c.out_new(0, {N, F}, DType::kBF16);
  cuda::swiglu_fwd(b16(gu), b16(y), N, F, st(c));
}
void op_swiglu_bwd(OpCall& c) {
  Tensor& gu = c.in(1);
  const int64_t N = rows(gu), F = cols(gu) / 2;
  Tensor& dgu = c.out_new(0, {N, 2 * F}, DType::kBF16);
  cuda::swiglu_bwd(b16(c.in(0)), b16(gu), b16(dgu), N, F, st(c));
}

void op_residual_add(OpCall& c) {
  Tensor& x = c.in(0);
  Tensor& r = c.in(1);
  const int64_t N = rows(x), C = cols(x);
  Tensor& y = c.out_new(0, {N, C}, DType::kBF16);
  if (c.op.params.empty())
    cuda::add(b16(x), b16(r), b16(y), N * C, st(c));
  else
    cuda::add_bias(b16(x), b16(r), f32(c.param(0).value), b16(y), N, C, st(c));
}

// The token embedding: the whole table without vocabulary shards (a token outside it gives NaN:
// loud), else this rank's shard, rows [r Vl, (r + 1) Vl), with zeros for the other shards' tokens
// (the tp group's reduce-scatter, or the y all-reduce under 3D, sums the rows), as the CPU's
// op_embed. Shards: tp, or tp_y under the 3D grid (whose columns are split over x: C is the table's).
int vocab_shards(const OpCall& c) { return c.shard.is_3d() ? c.shard.gy : c.tp; }

void op_embed(OpCall& c) {
  require_layout(c);
  Tensor& tok = c.in(0);
  const ParamEntry& w = c.param(0);
  const int64_t N = tok.numel(), C = w.value.dim(1), V = w.value.dim(0);
  Tensor& y = c.out_new(0, {N, C}, DType::kBF16);
  if (vocab_shards(c) == 1)
    cuda::embedding_fwd(i32(tok), b16(weight_bf16(w)), nullptr, b16(y), 1, N, C, V, 0, st(c));
  else
    cuda::embedding_shard_fwd(i32(tok), b16(weight_bf16(w)), b16(y), N, C, V, op::vocab_first(c, w.value.dim(0)), st(c));
}

void op_embed_bwd(OpCall& c) {
  require_layout(c);
  Tensor& tok = c.in(0);
  ParamEntry& w = c.grad(0);
  const int64_t N = tok.numel(), C = w.grad.dim(1), V = w.grad.dim(0);
  if (vocab_shards(c) == 1)
    cuda::embedding_bwd(i32(tok), b16(c.in(1)), f32(w.grad), nullptr, 1, N, C, V, 0, st(c));
  else
    cuda::embedding_shard_bwd(i32(tok), b16(c.in(1)), f32(w.grad), N, C, V, op::vocab_first(c, w.grad.dim(0)), st(c));
}

// Learned positions: local row i is row row0 + i of the micro-batch's B*T local rows (row0 = 0
// without sequence parallelism, else this rank's sequence shard), at t = (row0 + i) mod T; its
// position is t, or under context parallelism its chunk's global position (OpCall::seq_pos).
// fn(first row, rows, their T, their row0, the position of row 0 of that T) once without context
// parallelism, else once per run of rows whose positions follow each other (a chunk's rows of one
// sequence), rows ascending.
template <typename Fn>
void position_runs(const OpCall& c, int64_t N, Fn&& fn) {
  const int64_t T = c.mb.T, row0 = c.seq_row0(N);
  if (c.cp == 1) {
    fn(int64_t{0}, N, T, row0, int64_t{0});
    return;
  }
  const int64_t half = T / 2;
  for (int64_t i = 0; i < N;) {
    const int64_t t = (row0 + i) % T, len = std::min(N - i, (t < half ? half : T) - t);
    fn(i, len, len, int64_t{0}, c.seq_pos(t));
    i += len;
  }
}

void op_pos_embed(OpCall& c) {
  require_layout(c);
  Tensor& e = c.in(0);
  const int64_t N = rows(e), C = cols(e);
  Tensor& y = c.out_new(0, {N, C}, DType::kBF16);
  const bf16* wpe = b16(weight_bf16(c.param(0)));
  position_runs(c, N, [&](int64_t i, int64_t n, int64_t T, int64_t row0, int64_t pos) {
    cuda::position_add(b16(e) + i * C, wpe + pos * C, b16(y) + i * C, n, C, T, row0, st(c));
  });
}

// dP[t] += the rows at position t, in row order (the CPU's; under context parallelism a run's rows
// have distinct positions and the runs follow row order, so each position's sum keeps it).
void op_pos_embed_bwd(OpCall& c) {
  require_layout(c);
  Tensor& dy = c.in(0);
  const int64_t N = rows(dy), C = cols(dy);
  float* dwpe = f32(c.grad(0).grad);
  position_runs(c, N, [&](int64_t i, int64_t n, int64_t T, int64_t row0, int64_t pos) {
    cuda::position_grad(b16(dy) + i * C, dwpe + pos * C, n, C, T, row0, st(c));
  });
}

// Fused softmax cross-entropy over the whole vocabulary: per-token loss, dlogits in place.
void op_cross_entropy(OpCall& c) {
  require_layout(c);
  Tensor logits = c.in(0);
  Tensor& tg = c.in(1);
  const int64_t N = rows(logits), ld = cols(logits), V = std::min<int64_t>(c.model.vocab_size, ld);
  Tensor& loss = c.out_new(0, {N});
  cuda::cross_entropy_fwd_bwd_strided(b16(logits), i32(tg), f32(loss), b16(logits), c.dloss, N, V, ld, st(c));
  c.env.bufs[c.op.outputs.at(1)] = logits;  // dlogits aliases the logits storage
}

// ---- Megatron's vocabulary-parallel cross-entropy (tp > 1), three steps with the tp group's
// all-reduces (max, then the [N, 2] sums) between them (sharding/'s vocab_xent_fwd). This rank's
// logits are the padded head shard's rows [N, Vl]: the first vocab_valid of them are ids
// [r Vl, r Vl + valid), the rest padding (the CPU head leaves them out; the kernels skip them).
struct VocabShard {
  int64_t N, valid, ld, v0;
};
VocabShard vocab_shard(const OpCall& c, const Tensor& logits) {
  const Tensor& head = c.params.resolve(c.unit, c.model.tie_embeddings ? "wte" : "lm_head").value;
  const int64_t Vl = head.dim(0);
  DHX_ASSERT(cols(logits) == Vl, "{}: logits {} vs the head shard's {} rows", c.op.name, logits.describe(), Vl);
  return VocabShard{rows(logits), op::vocab_valid(c, Vl), Vl, op::vocab_first(c, Vl)};
}

void op_xent_max(OpCall& c) {
  require_layout(c);
  Tensor& lg = c.in(0);
  const VocabShard v = vocab_shard(c, lg);
  Tensor& m = c.out_new(0, {v.N});
  cuda::xent_row_max(b16(lg), f32(m), v.N, v.valid, v.ld, st(c));
}

void op_xent_stats(OpCall& c) {
  require_layout(c);
  Tensor& lg = c.in(0);
  const VocabShard v = vocab_shard(c, lg);
  Tensor& s = c.out_new(0, {v.N, 2});
  cuda::xent_row_stats(b16(lg), i32(c.in(1)), f32(c.in(2)), f32(s), v.N, v.valid, v.ld, v.v0, st(c));
}

void op_xent_finish(OpCall& c) {
  require_layout(c);
  Tensor lg = c.in(0);
  const VocabShard v = vocab_shard(c, lg);
  Tensor& loss = c.out_new(0, {v.N});
  cuda::xent_row_finish(b16(lg), i32(c.in(1)), f32(c.in(2)), f32(c.in(3)), f32(loss), b16(lg), c.dloss, v.N, v.valid,
                        v.ld, v.v0, c.model.vocab_size, st(c));
  c.env.bufs[c.op.outputs.at(1)] = lg;  // dlogits aliases the logits storage
}

// ---- Mixture of Experts (any layout: each rank routes its own tokens) ----
// Routing in fp32 (logits from the router's fp32 GEMM, probabilities, gates and their gradients);
// expert rows bf16. The host reads the routing statistics ([2E] floats: the aux loss and the
// router's counts, as on the CPU: OpRegistry.h's moe_record_aux, moe_aux_dprob) and each expert's
// row count (cuBLASLt's grouped GEMMs need them) through the micro-batch's host mirrors
// (UnitEnv::host_view): moe_route starts both copies behind its kernels, so the ops that read them
// wait at most for the routing, and each buffer crosses once, not once per op.
cuda::NormTopk norm_topk(const OpCall& c) { return c.model.norm_topk ? cuda::NormTopk::kYes : cuda::NormTopk::kNo; }

int64_t expert_rows(const OpCall& c, const Tensor& w, const Tensor& counts) {
  DHX_ASSERT(counts.numel() > 0 && w.dim(0) % counts.numel() == 0, "{}: weight {} vs {} experts", c.op.name,
             w.describe(), counts.numel());
  return w.dim(0) / counts.numel();
}

void op_moe_route(OpCall& c) {
  require_layout(c);
  Tensor& lg = c.in(0);
  const int64_t N = rows(lg), E = cols(lg), k = c.model.top_k;
  DHX_CHECK(E <= cuda::kMoeMaxExperts, DeviceError, "{}: {} experts; the GPU's grouping handles up to {}", c.op.name,
            E, cuda::kMoeMaxExperts);
  Tensor& probs = c.out_new(0, {N, E});
  Tensor& expert = c.out_new(1, {N, k}, DType::kI32);
  Tensor& gate = c.out_new(2, {N, k});
  Tensor& counts = c.out_new(3, {E}, DType::kI32);
  Tensor& order = c.out_new(4, {N * k}, DType::kI32);
  Tensor& slot = c.out_new(5, {N * k}, DType::kI32);
  Tensor& stats = c.out_new(6, {2 * E});
  cuda::moe_route_fwd(f32(lg), f32(probs), i32(expert), f32(gate), N, E, k, norm_topk(c), st(c));
  cuda::moe_group(i32(expert), N, k, E, i32(counts), i32(order), i32(slot), st(c));
  cuda::moe_route_stats(f32(probs), i32(counts), N, E, f32(stats), st(c));
  start_host_mirror(c, c.op.outputs.at(3));
  start_host_mirror(c, c.op.outputs.at(6));  // (an all-reduce over tp or cp, where there is one, drops it: Executor)
}

// The statistics (summed over tp or cp where they are) recorded at the step's end
// (RouterStats::settle), not here: their copy, started here if the all-reduce dropped moe_route's,
// lands while the step goes on (moe.route.bwd reads the same mirror).
void op_moe_aux(OpCall& c) {
  const std::string& name = c.op.inputs.at(0);
  auto it = c.env.mirrors.find(name);
  const HostMirror& m = it != c.env.mirrors.end() ? it->second : start_host_mirror(c, name);
  DHX_CHECK(m.host.dtype() == DType::kF32, InternalError, "{}: input {} is {}, expected f32", c.op.name, name,
            m.host.describe());
  if (c.router) c.router->pending.push_back({m, &c.model, c.unit.layer, c.cp_rank});
}

void op_moe_route_bwd(OpCall& c) {
  require_layout(c);
  Tensor& probs = c.in(1);
  const int64_t N = rows(probs), E = cols(probs), k = c.model.top_k;
  const std::vector<float> dp = op::moe_aux_dprob(c, host_input(c, 4, DType::kF32).f32(), E);
  Tensor aux;
  if (!dp.empty()) {
    aux = Tensor::empty({E}, DType::kF32, nullptr, c.device, c.stream);
    device_upload(aux.raw(), c.device, dp.data(), aux.nbytes(), c.stream);
  }
  Tensor& dl = c.out_new(0, {N, E});
  cuda::moe_route_bwd(f32(probs), i32(c.in(2)), f32(c.in(3)), f32(c.in(0)), aux.defined() ? f32(aux) : nullptr,
                      f32(dl), N, E, k, norm_topk(c), st(c));
}

void op_moe_dispatch(OpCall& c) {
  require_layout(c);
  Tensor& x = c.in(0);
  Tensor& order = c.in(1);
  const int64_t N = rows(x), C = cols(x), P = order.numel();
  Tensor& xs = c.out_new(0, {P, C}, DType::kBF16);
  cuda::moe_dispatch(b16(x), i32(order), b16(xs), P, P / N, C, st(c));
}

// dx = the router branch's gradient + each token's k dispatched rows' gradients (j ascending).
void op_moe_dispatch_bwd(OpCall& c) {
  require_layout(c);
  Tensor& dxs = c.in(0);
  Tensor& slot = c.in(1);
  Tensor& d_router = c.in(2);
  const int64_t N = rows(d_router), C = cols(d_router);
  Tensor& dx = c.out_new(0, {N, C}, DType::kBF16);
  dx.copy_from(d_router);
  cuda::moe_dispatch_bwd(b16(dxs), i32(slot), b16(dx), N, slot.numel() / N, C, cuda::Accumulate::kYes, st(c));
}

void op_moe_combine(OpCall& c) {
  Tensor& eo = c.in(0);
  Tensor& gate = c.in(2);
  const int64_t N = rows(gate), k = cols(gate), C = cols(eo);
  Tensor& y = c.out_new(0, {N, C}, DType::kBF16);
  cuda::moe_combine(b16(eo), i32(c.in(1)), f32(gate), b16(y), N, k, C, st(c));
}

void op_moe_combine_bwd(OpCall& c) {
  Tensor& eo = c.in(1);
  Tensor& gate = c.in(3);
  const int64_t N = rows(gate), k = cols(gate), C = cols(eo);
  Tensor& deo = c.out_new(0, {rows(eo), C}, DType::kBF16);
  Tensor& dgate = c.out_new(1, {N, k});
  cuda::moe_combine_bwd(b16(c.in(0)), b16(eo), i32(c.in(2)), f32(gate), b16(deo), f32(dgate), N, k, C, st(c));
}

// Expert parallelism's regrouping (OpRegistry.cc's moe_ep_sort / moe_ep_unsort): the rows received
// from the ep ranks as (rank, local expert) blocks, made expert-major for the grouped GEMMs (and
// back). Each block is contiguous in both orders: one device-to-device copy each on the op's stream,
// at offsets from the counts read back to the host (cpu::moe_ep_block_moves, the CPU kernel's own).
// Forward also writes the local experts' row totals ("moe.lcounts", int32 [El]).
void moe_ep_regroup_op(OpCall& c, bool to_expert_major) {
  require_layout(c);
  Tensor& x = c.in(0);
  const Tensor& rc = host_input(c, 1, DType::kI32);
  const int64_t G = c.shard.ep, El = rc.numel() / std::max<int64_t>(1, G);
  DHX_ASSERT(G * El == rc.numel(), "{}: {} counts for ep={}", c.op.name, rc.numel(), G);
  Tensor& y = c.out_new(0, x.shape(), x.dtype());
  const size_t row = static_cast<size_t>(cols(x)) * dtype_size(x.dtype());
  for (const cpu::EpBlockMove& m : cpu::moe_ep_block_moves(rc.data<int32_t>(), G, El, to_expert_major))
    if (m.rows > 0)
      device_copy(static_cast<char*>(y.raw()) + m.to * row, c.device, static_cast<const char*>(x.raw()) + m.from * row,
                  c.device, static_cast<size_t>(m.rows) * row, c.stream);
  if (to_expert_major && c.op.outputs.size() > 1) {
    const std::vector<int32_t> lc = cpu::moe_ep_local_counts(rc.data<int32_t>(), G, El);
    HostMirror m;  // the host has them already: the expert GEMMs read this copy
    m.host = Tensor::empty({El}, DType::kI32);
    std::copy(lc.begin(), lc.end(), m.host.data<int32_t>());
    Tensor& d = c.out_new(1, {El}, DType::kI32);
    device_upload(d.raw(), c.device, lc.data(), d.nbytes(), c.stream);
    c.env.mirrors.emplace(c.op.outputs.at(1), std::move(m));  // (out_new dropped the old one)
  }
}
void op_moe_ep_sort(OpCall& c) { moe_ep_regroup_op(c, true); }
void op_moe_ep_unsort(OpCall& c) { moe_ep_regroup_op(c, false); }

void op_expert_linear(OpCall& c) {
  require_layout(c);
  Tensor& x = c.in(0);
  Tensor& counts = c.in(1);
  const ParamEntry& w = c.param(0);
  const int64_t E = counts.numel(), O = expert_rows(c, w.value, counts), I = w.value.dim(1);
  DHX_ASSERT(cols(x) == I, "{}: input {} vs weight {}", c.op.name, x.describe(), w.value.describe());
  Tensor& y = c.out_new(0, {rows(x), O}, DType::kBF16);
  const int32_t* n = host_input(c, 1, DType::kI32).data<int32_t>();
  cuda::expert_linear_fwd(*c.blas, b16(x), b16(weight_bf16(w)), n, b16(y), E, I, O, st(c));
}

void op_expert_linear_dgrad(OpCall& c) {
  require_layout(c);
  Tensor& dy = c.in(0);
  Tensor& counts = c.in(1);
  const ParamEntry& w = c.param(0);
  const int64_t E = counts.numel(), O = expert_rows(c, w.value, counts), I = w.value.dim(1);
  Tensor& dx = c.out_new(0, {rows(dy), I}, DType::kBF16);
  const int32_t* n = host_input(c, 1, DType::kI32).data<int32_t>();
  cuda::expert_linear_bwd_data(*c.blas, b16(dy), b16(weight_bf16(w)), n, b16(dx), E, I, O, st(c));
}

void op_expert_linear_wgrad(OpCall& c) {
  require_layout(c);
  Tensor& counts = c.in(2);
  ParamEntry& w = c.grad(0);
  const int64_t E = counts.numel(), O = expert_rows(c, w.grad, counts), I = w.grad.dim(1);
  const int32_t* n = host_input(c, 2, DType::kI32).data<int32_t>();
  cuda::expert_linear_bwd_weight(*c.blas, b16(c.in(0)), b16(c.in(1)), n, f32(w.grad), E, I, O, st(c));
}

// ---- AxoNN's 3D grid (runtime/Ops3D.cc's twins; sharding/Lowering3D.cc) ----
// A weight block [w_rows, w_cols]: the bf16 buffer gathered over z (inputs[1]) when the op has one,
// else (tp_z = 1) the parameter's own bf16 shard.
const bf16* weight_block(OpCall& c, size_t input) {
  const int64_t n = attr(c, "w_rows") * attr(c, "w_cols");
  const Tensor& w = c.op.inputs.size() > input ? c.in(input) : weight_bf16(c.param(0));
  DHX_ASSERT(w.numel() == n, "{}: weight block has {} elements, expected {} x {}", c.op.name, w.numel(),
             attr(c, "w_rows"), attr(c, "w_cols"));
  return b16(w);
}

void op_linear3d(OpCall& c) {
  require_layout(c);
  Tensor& x = c.in(0);
  const int64_t N = rows(x), I = attr(c, "w_cols"), O = attr(c, "w_rows");
  DHX_ASSERT(cols(x) == I, "{}: input {} vs block columns {}", c.op.name, x.describe(), I);
  Tensor& y = c.out_new(0, {N, O}, DType::kBF16);
  c.blas->linear_fwd(b16(x), weight_block(c, 1), nullptr, b16(y), N, I, O, st(c));
}

void op_linear3d_dgrad(OpCall& c) {
  require_layout(c);
  Tensor& dy = c.in(0);
  const int64_t N = rows(dy), I = attr(c, "w_cols"), O = attr(c, "w_rows");
  DHX_ASSERT(cols(dy) == O, "{}: dy {} vs block rows {}", c.op.name, dy.describe(), O);
  Tensor& dx = c.out_new(0, {N, I}, DType::kBF16);
  c.blas->linear_bwd_data(b16(dy), weight_block(c, 1), b16(dx), N, I, O, cuda::Accumulate::kNo, st(c));
}

// The block's weight gradient dy^T x (fp32): into a fresh flat buffer for the reduce-scatter over z
// (outputs[0]), or accumulated straight into the parameter's gradient (tp_z = 1).
void op_linear3d_wgrad(OpCall& c) {
  require_layout(c);
  Tensor& dy = c.in(0);
  Tensor& x = c.in(1);
  const int64_t N = rows(dy), I = attr(c, "w_cols"), O = attr(c, "w_rows");
  float* dw = nullptr;
  if (!c.op.outputs.empty()) {
    Tensor& buf = c.out_new(0, {O * I}, DType::kF32);
    buf.zero_();
    dw = f32(buf);
  } else {
    ParamEntry& w = c.grad(0);
    DHX_ASSERT(w.grad.numel() == O * I, "{}: gradient shard {} vs block {} x {}", c.op.name, w.grad.describe(), O, I);
    dw = f32(w.grad);
  }
  c.blas->linear_bwd_weight(b16(dy), b16(x), dw, nullptr, N, I, O, st(c));
}

// The reduce-scattered weight-gradient shard (fp32), added into the parameter's gradient.
void op_grad_accum(OpCall& c) {
  Tensor& g = c.in(0);
  ParamEntry& w = c.grad(0);
  DHX_ASSERT(g.numel() == w.grad.numel(), "{}: {} vs gradient {}", c.op.name, g.describe(), w.grad.describe());
  cuda::add_inplace(f32(w.grad), f32(g), g.numel(), st(c));
}

void op_bias_add(OpCall& c) {
  Tensor& x = c.in(0);
  const int64_t N = rows(x), O = cols(x);
  Tensor& y = c.out_new(0, {N, O}, DType::kBF16);
  cuda::bias_add(b16(x), f32(c.param(0).value), b16(y), N, O, st(c));
}

// The MoE MLP's token slices on the grid (Ops3D.h's geometry, shared with the CPU's bindings): one
// 2D copy per x piece on the op's stream, in the activations' dtype (bf16 here).
void op_grid_rows(OpCall& c) {
  require_layout(c);
  Tensor& g = c.in(0);
  const GridRows r = grid_rows_of(c, g);
  Tensor& y = c.out_new(0, {r.Ns, r.C}, g.dtype());
  const size_t es = dtype_size(g.dtype());
  for (int x = 0; x < r.gx; ++x)
    DHX_CUDA(cudaMemcpy2DAsync(static_cast<char*>(y.raw()) + static_cast<size_t>(x * r.Cx) * es, r.C * es,
                               static_cast<const char*>(g.raw()) + static_cast<size_t>((x * r.N + r.r0) * r.Cx) * es,
                               r.Cx * es, r.Cx * es, r.Ns, cudaMemcpyDeviceToDevice, st(c)));
}

void op_grid_cols(OpCall& c) {
  require_layout(c);
  Tensor& g = c.in(0);
  const GridCols k = grid_cols_of(c, g);
  Tensor& y = c.out_new(0, {k.N, k.Cx}, g.dtype());
  const size_t es = dtype_size(g.dtype());
  DHX_CUDA(cudaMemcpy2DAsync(y.raw(), k.Cx * es, static_cast<const char*>(g.raw()) + static_cast<size_t>(k.c0) * es,
                             k.C * es, k.Cx * es, k.N, cudaMemcpyDeviceToDevice, st(c)));
}

// Norms split around the all-reduce over x: per-token sums in double over the local features
// (ln_stats / rms_stats), then mean / rstd over the full width (attr "features").
double features(const OpCall& c) { return static_cast<double>(attr(c, "features")); }
double* f64(const Tensor& t) {
  DHX_CHECK(t.dtype() == DType::kF64 && !t.device().is_host(), InternalError, "{} on {} is not an fp64 GPU tensor",
            t.describe(), t.device().str());
  return static_cast<double*>(t.raw());
}
void op_ln_stats(OpCall& c) {
  Tensor& x = c.in(0);
  Tensor& s = c.out_new(0, {rows(x), 2}, DType::kF64);
  cuda::grid_norm_stats(b16(x), f64(s), rows(x), cols(x), false, st(c));
}
void op_rms_stats(OpCall& c) {
  Tensor& x = c.in(0);
  Tensor& s = c.out_new(0, {rows(x)}, DType::kF64);
  cuda::grid_norm_stats(b16(x), f64(s), rows(x), cols(x), true, st(c));
}
void op_ln_apply(OpCall& c) {
  Tensor& x = c.in(0);
  const int64_t N = rows(x), C = cols(x);
  Tensor& y = c.out_new(0, {N, C}, DType::kBF16);
  Tensor& mean = c.out_new(1, {N});
  Tensor& rstd = c.out_new(2, {N});
  cuda::grid_ln_apply(b16(x), f64(c.in(1)), f32(c.param(0).value), f32(c.param(1).value), b16(y), f32(mean),
                      f32(rstd), N, C, features(c), c.model.norm_eps, st(c));
}
void op_rms_apply(OpCall& c) {
  Tensor& x = c.in(0);
  const int64_t N = rows(x), C = cols(x);
  Tensor& y = c.out_new(0, {N, C}, DType::kBF16);
  Tensor& rstd = c.out_new(1, {N});
  cuda::grid_rms_apply(b16(x), f64(c.in(1)), f32(c.param(0).value), b16(y), f32(rstd), N, C, features(c),
                       c.model.norm_eps, st(c));
}
void op_ln_bwd_stats(OpCall& c) {
  Tensor& x = c.in(1);
  Tensor& s = c.out_new(0, {rows(x), 2}, DType::kF64);
  cuda::grid_ln_bwd_stats(b16(c.in(0)), b16(x), f32(c.in(2)), f32(c.in(3)), f32(c.param(0).value), f64(s), rows(x),
                          cols(x), st(c));
}
void op_rms_bwd_stats(OpCall& c) {
  Tensor& x = c.in(1);
  Tensor& s = c.out_new(0, {rows(x)}, DType::kF64);
  cuda::grid_rms_bwd_stats(b16(c.in(0)), b16(x), f32(c.param(0).value), f64(s), rows(x), cols(x), st(c));
}
// dx (+ the residual gradient, attr "residual"); dg, db partial gradients of this rank's tokens
// (reduced over z by GradSync).
void op_ln_bwd_apply(OpCall& c) {
  Tensor& x = c.in(1);
  const int64_t N = rows(x), C = cols(x);
  Tensor& dx = c.out_new(0, {N, C}, DType::kBF16);
  const bf16* res = attr(c, "residual") ? b16(c.in(5)) : nullptr;
  cuda::grid_ln_bwd_apply(b16(c.in(0)), b16(x), f32(c.in(2)), f32(c.in(3)), f64(c.in(4)), f32(c.param(0).value), res,
                          b16(dx), f32(c.grad(0).grad), f32(c.grad(1).grad), N, C, features(c), st(c));
}
void op_rms_bwd_apply(OpCall& c) {
  Tensor& x = c.in(1);
  const int64_t N = rows(x), C = cols(x);
  Tensor& dx = c.out_new(0, {N, C}, DType::kBF16);
  const bf16* res = attr(c, "residual") ? b16(c.in(4)) : nullptr;
  cuda::grid_rms_bwd_apply(b16(c.in(0)), b16(x), f32(c.in(2)), f64(c.in(3)), f32(c.param(0).value), res, b16(dx),
                           f32(c.grad(0).grad), N, C, features(c), st(c));
}

const std::map<std::string, OpFn>& table() {
  static const std::map<std::string, OpFn> t = {
      {"linear", op_linear},       {"linear_dgrad", op_linear_dgrad}, {"linear_wgrad", op_linear_wgrad},
      {"bias_grad", op_bias_grad}, {"layernorm", op_layernorm},       {"layernorm_bwd", op_layernorm_bwd},
      {"rmsnorm", op_rmsnorm},     {"rmsnorm_bwd", op_rmsnorm_bwd},   {"rope", op_rope},
      {"rope_bwd", op_rope_bwd},   {"attention", op_attention},       {"attention_bwd", op_attention_bwd},
      {"gelu", op_gelu},           {"gelu_bwd", op_gelu_bwd},         {"swiglu", op_swiglu},
      {"swiglu_bwd", op_swiglu_bwd}, {"residual_add", op_residual_add}, {"embed", op_embed},
      {"embed_bwd", op_embed_bwd}, {"pos_embed", op_pos_embed},       {"pos_embed_bwd", op_pos_embed_bwd},
      {"cross_entropy", op_cross_entropy}, {"xent_max", op_xent_max},   {"xent_stats", op_xent_stats},
      {"xent_finish", op_xent_finish},
      {"moe_route", op_moe_route}, {"moe_aux", op_moe_aux},             {"moe_route_bwd", op_moe_route_bwd},
      {"moe_dispatch", op_moe_dispatch}, {"moe_dispatch_bwd", op_moe_dispatch_bwd},
      {"moe_combine", op_moe_combine}, {"moe_combine_bwd", op_moe_combine_bwd},
      {"expert_linear", op_expert_linear}, {"expert_linear_dgrad", op_expert_linear_dgrad},
      {"expert_linear_wgrad", op_expert_linear_wgrad},
      {"moe_ep_sort", op_moe_ep_sort}, {"moe_ep_unsort", op_moe_ep_unsort},
      {"cp_kv_pack", op_cp_kv_pack}, {"ring_attention", op_ring_attention},
      {"ring_attention_bwd", op_ring_attention_bwd}, {"cp_dkv_add", op_cp_dkv_add},
      {"cp_ring_bwd_finish", op_cp_ring_bwd_finish},
      {"linear3d", op_linear3d}, {"linear3d_dgrad", op_linear3d_dgrad}, {"linear3d_wgrad", op_linear3d_wgrad},
      {"grad_accum", op_grad_accum}, {"bias_add", op_bias_add}, {"ln_stats", op_ln_stats}, {"ln_apply", op_ln_apply},
      {"ln_bwd_stats", op_ln_bwd_stats}, {"ln_bwd_apply", op_ln_bwd_apply}, {"rms_stats", op_rms_stats},
      {"rms_apply", op_rms_apply}, {"rms_bwd_stats", op_rms_bwd_stats}, {"rms_bwd_apply", op_rms_bwd_apply},
      {"grid_rows", op_grid_rows}, {"grid_cols", op_grid_cols},
      {"linear_gelu", op_linear_gelu}, {"linear_dgrad_gelu", op_linear_dgrad_gelu},
      {"linear_residual", op_linear_residual},
  };
  return t;
}

}  // namespace

namespace {
// The step's block on the packed layouts (cpu::ring_block's twin).
cuda::AttnBlock ring_block(const cpu::RingDims& r, const cpu::RingStep& st) {
  const int64_t kvw = 2 * r.Hkv * r.D, ow = r.H * r.D;
  return cuda::AttnBlock{r.B, st.Tq, st.Tk, r.H, r.Hkv, r.D, r.q_stride, kvw, ow,
                         r.Tl * r.q_stride, r.Tl * kvw, r.Tl * ow, r.Tl, st.causal};
}
}  // namespace

void cuda_ring_fwd_step(const cpu::RingDims& r, int step, const void* q, const void* kv, float* o, float* lse,
                        float* o_tmp, float* lse_tmp, float scale, void* stream) {
  const cpu::RingStep st = cpu::cp_ring_step(r.cp, r.rank, step, r.Tl);
  const cuda::AttnBlock blk = ring_block(r, st);
  const int64_t ow = r.H * r.D;
  const bf16* qs = static_cast<const bf16*>(q) + st.q_row0 * r.q_stride;
  const bf16* ks = static_cast<const bf16*>(kv) + st.k_row0 * blk.kv_stride;
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  if (step == 0) {
    cuda::attention_block_fwd(qs, ks, ks + r.Hkv * r.D, o + st.q_row0 * ow, lse + st.q_row0, blk, scale, s);
    return;
  }
  float* ot = o_tmp + st.q_row0 * ow;
  float* lt = lse_tmp + st.q_row0;
  cuda::attention_block_fwd(qs, ks, ks + r.Hkv * r.D, ot, lt, blk, scale, s);
  cuda::attention_merge(o + st.q_row0 * ow, lse + st.q_row0, ot, lt, r.B, st.Tq, r.H, r.D, ow, blk.o_bstride, r.Tl,
                        r.Tl, s);
}

void cuda_ring_bwd_step(const cpu::RingDims& r, int step, const void* q, const void* kv, const void* o,
                        const float* lse, const void* dout, float* dq, float* dkv, float scale, void* stream) {
  const cpu::RingStep st = cpu::cp_ring_step(r.cp, r.rank, step, r.Tl);
  const cuda::AttnBlock blk = ring_block(r, st);
  const int64_t ow = r.H * r.D, kvo = r.Hkv * r.D;
  const bf16* ks = static_cast<const bf16*>(kv) + st.k_row0 * blk.kv_stride;
  float* dks = dkv + st.k_row0 * blk.kv_stride;
  cuda::attention_block_bwd(static_cast<const bf16*>(q) + st.q_row0 * r.q_stride, ks, ks + kvo,
                            static_cast<const bf16*>(o) + st.q_row0 * ow, lse + st.q_row0,
                            static_cast<const bf16*>(dout) + st.q_row0 * ow, dq + st.q_row0 * r.q_stride, dks,
                            dks + kvo, blk, scale, static_cast<cudaStream_t>(stream));
}

const OpFn& cuda_op(const std::string& code) {
  auto it = table().find(code);
  DHX_CHECK(it != table().end(), DeviceError,
            "op '{}' has no CUDA kernel binding yet (the GPT-2, Llama and MoE programs' ops on every layout are "
            "bound in runtime/CudaOps.cc; this one is not); run it on cpu",
            code);
  return it->second;
}

std::vector<std::string> cuda_op_codes() {
  std::vector<std::string> out;
  for (const auto& [k, v] : table()) out.push_back(k);
  return out;
}

}  // namespace dhelix

#endif  // DHELIX_HAVE_CUDA
