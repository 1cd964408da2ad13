// Op bindings: layer-program op codes -> CPU kernels. Shapes: N = B*T rows of gathered tensors,
// Ns = N/tp rows of a sequence shard; every binding derives its extents from its input views.
#include "runtime/OpRegistry.h"

#include <cmath>
#include <limits>
#include <map>

#include "base/Error.h"
#include "kernels/cpu/Bf16.h"
#include "kernels/cpu/Kernels.h"
#include "runtime/Ops3D.h"
#include "runtime/Stream.h"

namespace dhelix {

const uint16_t* Bf16Weights::get(const Tensor& w) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = copies_.find(w.raw());
  if (it == copies_.end()) {
    Tensor h = Tensor::empty(w.shape(), DType::kBF16, tracker_);
    cpu::round_to_bf16(w.f32(), h.data<uint16_t>(), w.numel());
    it = copies_.emplace(w.raw(), h).first;
  }
  return it->second.data<uint16_t>();
}

void RouterStats::record(const ModelConfig& m, int layer, int cp_rank, const float* stats, int64_t E) {
  double Ng = 0;  // the tokens routed: each sent to top_k experts
  for (int64_t e = 0; e < E; ++e) Ng += double(stats[e]);
  Ng /= double(m.top_k);
  // Under cp the statistics are the whole micro-batch's on every cp rank (ExpertDispatch.cc): one records them.
  if (layer < 0 || Ng <= 0 || cp_rank != 0) return;
  if (n_experts != E) n_experts = E, tokens.assign(m.n_layers * E, 0);
  DHX_ASSERT(int64_t(tokens.size()) >= (layer + 1) * E, "router stats for layer {}", layer);
  for (int64_t e = 0; e < E; ++e) tokens[layer * E + e] += static_cast<int64_t>(stats[e]);
  aux_weighted += Ng * cpu::moe_aux_loss<float>(stats, E, m.top_k, m.aux_loss_coef);
}

void RouterStats::settle() {
  std::vector<Pending> todo;
  todo.swap(pending);
  for (Pending& p : todo) {
    if (p.stats.ready) p.stats.ready->host_wait();
    record(*p.model, p.layer, p.cp_rank, p.stats.host.f32(), p.stats.host.numel() / 2);
  }
}

Tensor& UnitEnv::at(const std::string& name) {
  auto it = bufs.find(name);
  DHX_CHECK(it != bufs.end(), InternalError, "buffer '{}' is not in the environment", name);
  return it->second;
}

const Tensor& UnitEnv::host_view(const std::string& name, StreamHandle stream) {
  const Tensor& t = at(name);
  if (t.device().is_host()) return t;
  auto it = mirrors.find(name);
  if (it == mirrors.end()) {
    HostMirror m;
    m.host = Tensor::empty(t.shape(), t.dtype());
    device_copy(m.host.raw(), Device::host(), t.raw(), t.device(), t.nbytes(), stream);  // returns once copied
    it = mirrors.emplace(name, std::move(m)).first;
  } else if (it->second.ready) {
    it->second.ready->host_wait();
    it->second.ready.reset();
  }
  DHX_ASSERT(it->second.host.numel() == t.numel() && it->second.host.dtype() == t.dtype(),
             "the host copy of '{}' ({}) does not match it ({})", name, it->second.host.describe(), t.describe());
  return it->second.host;
}

void UnitEnv::drop_mirror(const std::string& name) { mirrors.erase(name); }

Tensor& OpCall::out_new(size_t i, const Shape& shape, DType dt) const {
  env.drop_mirror(op.outputs.at(i));  // a copy of what the buffer held before
  Tensor& t = env.bufs[op.outputs.at(i)];
  t = Tensor::empty(shape, dt, act_mem, device, stream);
  return t;
}

int64_t OpCall::seq_pos(int64_t t) const { return cp == 1 ? t : cpu::cp_position(cp, cp_rank, mb.T, t); }

namespace op {

int64_t rows(const Tensor& t) { return t.dim(0); }
int64_t cols(const Tensor& t) {
  int64_t n = 1;
  for (int i = 1; i < t.ndim(); ++i) n *= t.dim(i);
  return n;
}
int64_t attr(const OpCall& c, const char* k) {
  auto it = c.op.attrs.find(k);
  DHX_ASSERT(it != c.op.attrs.end(), "{} lacks attribute {}", c.op.name, k);
  return it->second;
}
int64_t attr_or(const OpCall& c, const char* k, int64_t fallback) {
  auto it = c.op.attrs.find(k);
  return it == c.op.attrs.end() ? fallback : it->second;
}

namespace {
// The micro-batch's tokens Ng (each routed to top_k experts): the counts' sum / top_k.
double routed_tokens(const OpCall& c, const float* stats, int64_t E) {
  double n = 0;
  for (int64_t e = 0; e < E; ++e) n += double(stats[e]);
  return n / double(c.model.top_k);
}
}  // namespace

void moe_record_aux(OpCall& c, const float* stats, int64_t E) {
  if (c.router) c.router->record(c.model, c.unit.layer, c.cp_rank, stats, E);
}

// (Ng tokens * dloss) * coef * E * c_e / (Ng k Ng), per expert e.
int64_t vocab_first(const OpCall& c, int64_t shard_rows) { return c.vocab_rank() * shard_rows; }

int64_t vocab_valid(const OpCall& c, int64_t shard_rows) {
  return std::clamp<int64_t>(c.model.vocab_size - vocab_first(c, shard_rows), 0, shard_rows);
}

std::vector<float> moe_aux_dprob(const OpCall& c, const float* stats, int64_t E) {
  if (c.model.aux_loss_coef <= 0) return {};
  const double Ng = routed_tokens(c, stats, E);
  std::vector<float> dp(E);
  for (int64_t e = 0; e < E; ++e)
    dp[e] = static_cast<float>(double(c.dloss) * c.model.aux_loss_coef * double(E) * double(stats[e]) /
                               (Ng * double(c.model.top_k)));
  return dp;
}
}  // namespace op

namespace {

using namespace cpu;

using op::attr;
using op::attr_or;
using op::cols;
using op::rows;

using op::vocab_valid;

int64_t linear_out(const OpCall& c, const Tensor& w) {
  return c.op.attrs.count("vocab_rows") ? vocab_valid(c, w.dim(0)) : w.dim(0);
}

void op_linear(OpCall& c) {
  Tensor& x = c.in(0);
  ParamEntry& w = c.param(0);
  const float* b = c.op.params.size() > 1 ? c.param(1).value.f32() : nullptr;
  int64_t N = rows(x), I = cols(x), O = linear_out(c, w.value);
  DHX_ASSERT(I == w.value.dim(1), "{}: input {} vs weight {}", c.op.name, x.describe(), w.value.describe());
  Tensor& y = c.out_new(0, {N, O});
  if (c.bf16_weights)  // this step's bf16 copy of w (StepRunner makes one only in bf16)
    linear_fwd_bf16w(x.f32(), c.bf16_weights->get(w.value), b, y.f32(), N, I, O);
  else
    linear_fwd<float>(x.f32(), w.value.f32(), b, y.f32(), N, I, O, c.precision);
}

void op_linear_dgrad(OpCall& c) {
  Tensor& dy = c.in(0);
  ParamEntry& w = c.param(0);
  int64_t N = rows(dy), O = cols(dy), I = w.value.dim(1);
  DHX_ASSERT(O == linear_out(c, w.value), "{}: dy {} vs weight {}", c.op.name, dy.describe(), w.value.describe());
  Tensor& dx = c.out_new(0, {N, I});
  if (c.bf16_weights)
    linear_bwd_data_bf16w(dy.f32(), c.bf16_weights->get(w.value), dx.f32(), N, I, O, Accumulate::kNo);
  else
    linear_bwd_data<float>(dy.f32(), w.value.f32(), dx.f32(), N, I, O, Accumulate::kNo, c.precision);
}

void op_linear_wgrad(OpCall& c) {
  Tensor& dy = c.in(0);
  Tensor& x = c.in(1);
  ParamEntry& w = c.grad(0);
  float* db = c.op.grads.size() > 1 ? c.grad(1).grad.f32() : nullptr;
  int64_t N = rows(dy), O = cols(dy), I = cols(x);
  // A piece of a split weight gradient (sharding/TpRegion.cc, WgradPolicy::kSplit) covers weight
  // rows [lo, hi); a whole one all of them. x may have been kept in bf16
  // (RunContext::bf16_saved_activations).
  if (x.dtype() == DType::kBF16)
    linear_bwd_weight_rows_bf16x(dy.f32(), x.data<uint16_t>(), w.grad.f32(), db, N, I, O, attr_or(c, "rows_lo", 0),
                                 attr_or(c, "rows_hi", O));
  else
    linear_bwd_weight_rows<float>(dy.f32(), x.f32(), w.grad.f32(), db, N, I, O, attr_or(c, "rows_lo", 0),
                                  attr_or(c, "rows_hi", O), c.precision);
}

void op_layernorm(OpCall& c) {
  Tensor& x = c.in(0);
  int64_t N = rows(x), C = cols(x);
  Tensor& y = c.out_new(0, {N, C});
  Tensor& mean = c.out_new(1, {N});
  Tensor& rstd = c.out_new(2, {N});
  layernorm_fwd<float>(x.f32(), c.param(0).value.f32(), c.param(1).value.f32(), y.f32(), mean.f32(), rstd.f32(), N, C,
                       static_cast<float>(c.model.norm_eps));
}

void op_layernorm_bwd(OpCall& c) {
  Tensor& dy = c.in(0);
  Tensor& x = c.in(1);
  int64_t N = rows(x), C = cols(x);
  Tensor& dx = c.out_new(0, {N, C});
  layernorm_bwd<float>(dy.f32(), x.f32(), c.param(0).value.f32(), c.in(2).f32(), c.in(3).f32(), dx.f32(),
                       c.grad(0).grad.f32(), c.grad(1).grad.f32(), N, C);
  if (c.op.attrs.at("residual")) add_inplace<float>(dx.f32(), c.in(4).f32(), N * C);
}

void op_rmsnorm(OpCall& c) {
  Tensor& x = c.in(0);
  int64_t N = rows(x), C = cols(x);
  Tensor& y = c.out_new(0, {N, C});
  Tensor& rstd = c.out_new(1, {N});
  rmsnorm_fwd<float>(x.f32(), c.param(0).value.f32(), y.f32(), rstd.f32(), N, C, static_cast<float>(c.model.norm_eps));
}

void op_rmsnorm_bwd(OpCall& c) {
  Tensor& dy = c.in(0);
  Tensor& x = c.in(1);
  int64_t N = rows(x), C = cols(x);
  Tensor& dx = c.out_new(0, {N, C});
  rmsnorm_bwd<float>(dy.f32(), x.f32(), c.param(0).value.f32(), c.in(2).f32(), dx.f32(), c.grad(0).grad.f32(), N, C);
  if (c.op.attrs.at("residual")) add_inplace<float>(dx.f32(), c.in(3).f32(), N * C);
}

// Rotary embeddings over the q and k heads of the fused [N, (H + 2 Hkv) D] buffer (copy, then
// rotate in place). Heads per rank: the local ones; positions are t within each sequence.
void rope_common(OpCall& c, bool backward) {
  Tensor& x = c.in(0);
  int64_t N = rows(x), W = cols(x);
  const int64_t D = c.model.head_dim();
  const int64_t Hl = c.model.n_heads / c.head_shards(), Hkvl = c.model.n_kv_heads / c.head_shards();
  Tensor& y = c.out_new(0, {N, W});
  y.copy_from(x);
  auto rotate = [&](float* at, int64_t B, int64_t T, int64_t pos0) {
    if (backward)
      rope_bwd<float>(at, B, T, Hl + Hkvl, D, W, pos0, c.model.rope_theta);
    else
      rope_fwd<float>(at, B, T, Hl + Hkvl, D, W, pos0, c.model.rope_theta);
  };
  if (c.cp == 1) {
    rotate(y.f32(), c.mb.B, c.mb.T, 0);
    return;
  }
  // Context parallelism: each sequence's local rows are two chunks, each contiguous in position.
  const int64_t half = c.mb.T / 2;
  for (int64_t b = 0; b < c.mb.B; ++b)
    for (int64_t h = 0; h < 2; ++h) {
      const int64_t t0 = h * half;
      rotate(y.f32() + (b * c.mb.T + t0) * W, 1, half, c.seq_pos(t0));
    }
}
void op_rope(OpCall& c) { rope_common(c, false); }
void op_rope_bwd(OpCall& c) { rope_common(c, true); }

AttnDims attn_dims(const OpCall& c, int64_t width) {
  const int64_t H = attr(c, "heads"), Hkv = attr(c, "kv_heads"), D = attr(c, "head_dim");
  return AttnDims{c.mb.B, c.mb.T, H, Hkv, D, width, width, H * D};
}

void op_attention(OpCall& c) {
  Tensor& qkv = c.in(0);
  int64_t N = rows(qkv), W = cols(qkv);
  AttnDims d = attn_dims(c, W);
  const float* q = qkv.f32();
  const float* k = q + d.H * d.D;
  const float* v = k + d.Hkv * d.D;
  Tensor& o = c.out_new(0, {N, d.H * d.D});
  Tensor& lse = c.out_new(1, {d.B, d.H, d.T});
  attention_fwd<float>(q, k, v, o.f32(), lse.f32(), d, 1.0f / std::sqrt(static_cast<float>(d.D)), c.precision);
}

void op_attention_bwd(OpCall& c) {
  Tensor& qkv = c.in(0);
  Tensor& o = c.in(1);
  Tensor& lse = c.in(2);
  Tensor& dout = c.in(3);
  int64_t N = rows(qkv), W = cols(qkv);
  AttnDims d = attn_dims(c, W);
  const float* q = qkv.f32();
  const float* k = q + d.H * d.D;
  const float* v = k + d.Hkv * d.D;
  Tensor& dqkv = c.out_new(0, {N, W});
  float* dq = dqkv.f32();
  attention_bwd<float>(q, k, v, o.f32(), lse.f32(), dout.f32(), dq, dq + d.H * d.D, dq + (d.H + d.Hkv) * d.D, d,
                       1.0f / std::sqrt(static_cast<float>(d.D)), c.precision);
}

// ---- context parallelism: the ring attention's ops (sharding/CpRing.cc) ----
RingDims ring_dims(const OpCall& c, int64_t width) {
  return RingDims{c.cp, c.cp_rank, c.mb.B, c.mb.T, attr(c, "heads"), attr(c, "kv_heads"), attr(c, "head_dim"), width};
}

// kv [N, 2 Hkv D]: the k and v columns of the packed qkv rows, the buffer that travels the ring.
void op_cp_kv_pack(OpCall& c) {
  Tensor& qkv = c.in(0);
  const int64_t N = rows(qkv), W = cols(qkv), H = attr(c, "heads"), Hkv = attr(c, "kv_heads"), D = attr(c, "head_dim");
  const int64_t kvw = 2 * Hkv * D;
  Tensor& kv = c.out_new(0, {N, kvw});
  for (int64_t i = 0; i < N; ++i) std::copy_n(qkv.f32() + i * W + H * D, kvw, kv.f32() + i * kvw);
}

// Step i: inputs qkv, the keys/values of step i, and (i > 0) the running output and lse, which the
// step merges into in place (its outputs alias them).
void op_ring_attention(OpCall& c) {
  Tensor& qkv = c.in(0);
  Tensor& kv = c.in(1);
  const int64_t N = rows(qkv);
  const RingDims r = ring_dims(c, cols(qkv));
  const int step = static_cast<int>(attr(c, "step"));
  const float scale = 1.0f / std::sqrt(static_cast<float>(r.D));
  if (step == 0) {
    Tensor& o = c.out_new(0, {N, r.H * r.D});
    Tensor& lse = c.out_new(1, {r.B, r.H, r.Tl});
    ring_attention_fwd_step<float>(r, 0, qkv.f32(), kv.f32(), o.f32(), lse.f32(), nullptr, nullptr, scale, c.precision);
    return;
  }
  Tensor o = c.in(2), lse = c.in(3);
  Tensor o_tmp = Tensor::empty(o.shape(), DType::kF32, c.act_mem), lse_tmp = Tensor::empty(lse.shape(), DType::kF32, c.act_mem);
  ring_attention_fwd_step<float>(r, step, qkv.f32(), kv.f32(), o.f32(), lse.f32(), o_tmp.f32(), lse_tmp.f32(), scale,
                                 c.precision);
  c.env.bufs[c.op.outputs.at(0)] = o;
  c.env.bufs[c.op.outputs.at(1)] = lse;
}

// Step i backward: inputs qkv, the step's keys/values, the final att and lse, datt and (i > 0) the
// running dq [N, W] (q columns accumulated; aliased by this step's output); outputs dq and this
// step's share of dK/dV for the keys it saw.
void op_ring_attention_bwd(OpCall& c) {
  Tensor& qkv = c.in(0);
  Tensor& kv = c.in(1);
  Tensor& o = c.in(2);
  Tensor& lse = c.in(3);
  Tensor& dout = c.in(4);
  const int64_t N = rows(qkv), W = cols(qkv);
  const RingDims r = ring_dims(c, W);
  const int step = static_cast<int>(attr(c, "step"));
  Tensor dq = step == 0 ? Tensor::zeros({N, W}, DType::kF32, c.act_mem) : c.in(5);
  c.env.bufs[c.op.outputs.at(0)] = dq;
  Tensor& dkv = c.out_new(1, kv.shape());
  dkv.zero_();
  ring_attention_bwd_step<float>(r, step, qkv.f32(), kv.f32(), o.f32(), lse.f32(), dout.f32(), dq.f32(), dkv.f32(),
                                 1.0f / std::sqrt(static_cast<float>(r.D)), c.precision);
}

// The dK/dV that arrived (travelling with the keys it belongs to) plus this rank's share, in place.
void op_cp_dkv_add(OpCall& c) {
  Tensor acc = c.in(0);
  Tensor& mine = c.in(1);
  add_inplace<float>(acc.f32(), mine.f32(), acc.numel());
  c.env.bufs[c.op.outputs.at(0)] = acc;
}

// dqkv: dq's q columns (in place) and the k, v columns: this rank's own share of the dK/dV of its
// keys (step 0) plus the other ranks' shares, which arrived round the ring.
void op_cp_ring_bwd_finish(OpCall& c) {
  Tensor dq = c.in(0);
  Tensor& own = c.in(1);
  Tensor& came = c.in(2);
  const int64_t N = rows(dq), W = cols(dq), kvw = cols(own), H = attr(c, "heads"), D = attr(c, "head_dim");
  for (int64_t i = 0; i < N; ++i) add<float>(own.f32() + i * kvw, came.f32() + i * kvw, dq.f32() + i * W + H * D, kvw);
  c.env.bufs[c.op.outputs.at(0)] = dq;
}

void op_gelu(OpCall& c) {
  Tensor& x = c.in(0);
  Tensor& y = c.out_new(0, x.shape());
  gelu_fwd<float>(x.f32(), y.f32(), x.numel());
}
void op_gelu_bwd(OpCall& c) {
  Tensor& dy = c.in(0);
  Tensor& x = c.in(1);
  Tensor& dx = c.out_new(0, x.shape());
  gelu_bwd<float>(dy.f32(), x.f32(), dx.f32(), x.numel());
}
void op_swiglu(OpCall& c) {
  Tensor& gu = c.in(0);
  int64_t N = rows(gu), F = cols(gu) / 2;
  Tensor& y = c.out_new(0, {N, F});
  swiglu_fwd<float>(gu.f32(), y.f32(), N, F);
}
void op_swiglu_bwd(OpCall& c) {
  Tensor& dy = c.in(0);
  Tensor& gu = c.in(1);
  int64_t N = rows(gu), F = cols(gu) / 2;
  Tensor& dgu = c.out_new(0, {N, 2 * F});
  swiglu_bwd<float>(dy.f32(), gu.f32(), dgu.f32(), N, F);
}

void op_residual_add(OpCall& c) {
  Tensor& x = c.in(0);
  Tensor& r = c.in(1);
  int64_t N = rows(x), C = cols(x);
  Tensor& y = c.out_new(0, {N, C});
  if (c.op.params.empty())
    add<float>(x.f32(), r.f32(), y.f32(), N * C);
  else
    add_bias<float>(x.f32(), r.f32(), c.param(0).value.f32(), y.f32(), N, C);
}

// The fused GEMM-epilogue codes (sharding/Epilogues.h) on the CPU: the two ops they replace, run
// by their own bindings in the pair's order on the same inputs, so the bits are the unfused
// program's. An intermediate the fused op does not write lives in the environment only between the
// two ("<op name>#link"). (The GPU's bindings run cuBLASLt's epilogues: runtime/CudaOps.cc.)
Op part_of(const OpCall& c, const char* code, std::vector<std::string> in, std::vector<std::string> out,
           std::vector<std::string> params) {
  Op o = c.op;
  o.code = code;
  o.inputs = std::move(in);
  o.outputs = std::move(out);
  o.params = std::move(params);
  o.frees.clear();
  return o;
}
void run_part(const OpCall& c, const Op& o, const OpFn& fn) {
  OpCall part = c.with(o);
  fn(part);
}

void unfused_linear_gelu(OpCall& c, const OpFn& linear, const OpFn& gelu) {
  const std::string &act = c.op.outputs.at(0), &pre = c.op.outputs.at(1);
  run_part(c, part_of(c, "linear", {c.op.inputs.at(0)}, {pre}, c.op.params), linear);
  run_part(c, part_of(c, "gelu", {pre}, {act}, {}), gelu);
}

void unfused_linear_dgrad_gelu(OpCall& c, const OpFn& linear_dgrad, const OpFn& gelu_bwd) {
  const std::string link = c.op.name + "#link";
  run_part(c, part_of(c, "linear_dgrad", {c.op.inputs.at(0)}, {link}, c.op.params), linear_dgrad);
  run_part(c, part_of(c, "gelu_bwd", {link, c.op.inputs.at(1)}, {c.op.outputs.at(0)}, {}), gelu_bwd);
  c.env.bufs.erase(link);
}

void unfused_linear_residual(OpCall& c, const OpFn& linear, const OpFn& residual_add) {
  const std::string link = c.op.name + "#link";
  DHX_ASSERT(!c.op.params.empty(), "{}: linear_residual without a weight", c.op.name);
  run_part(c, part_of(c, "linear", {c.op.inputs.at(0)}, {link}, {c.op.params[0]}), linear);
  run_part(c, part_of(c, "residual_add", {c.op.inputs.at(1), link}, {c.op.outputs.at(0)},
                      {c.op.params.begin() + 1, c.op.params.end()}),
           residual_add);
  c.env.bufs.erase(link);
}

void op_linear_gelu(OpCall& c) { unfused_linear_gelu(c, op_linear, op_gelu); }
void op_linear_dgrad_gelu(OpCall& c) { unfused_linear_dgrad_gelu(c, op_linear_dgrad, op_gelu_bwd); }
void op_linear_residual(OpCall& c) { unfused_linear_residual(c, op_linear, op_residual_add); }

void op_bias_grad(OpCall& c) {
  Tensor& dy = c.in(0);
  bias_grad<float>(dy.f32(), c.grad(0).grad.f32(), rows(dy), cols(dy));
}

// Vocab-parallel embedding: this rank owns rows [r*Vl, (r+1)*Vl) of the padded table; tokens
// outside contribute zeros (the tp reduce-scatter sums the partial rows).
void op_embed(OpCall& c) {
  Tensor& tok = c.in(0);
  ParamEntry& w = c.param(0);
  const int64_t N = tok.numel(), C = w.value.dim(1), Vl = w.value.dim(0), v0 = c.vocab_rank() * Vl;
  Tensor& y = c.out_new(0, {N, C});
  const int32_t* t = tok.data<int32_t>();
  const float* W = w.value.f32();
  float* Y = y.f32();
  for (int64_t n = 0; n < N; ++n) {
    int64_t v = t[n] - v0;
    if (v >= 0 && v < Vl)
      std::copy(W + v * C, W + (v + 1) * C, Y + n * C);
    else
      std::fill(Y + n * C, Y + (n + 1) * C, 0.0f);
  }
}

void op_embed_bwd(OpCall& c) {
  Tensor& tok = c.in(0);
  Tensor& dy = c.in(1);
  ParamEntry& w = c.grad(0);
  const int64_t N = tok.numel(), C = w.grad.dim(1), Vl = w.grad.dim(0), v0 = c.vocab_rank() * Vl;
  const int32_t* t = tok.data<int32_t>();
  float* G = w.grad.f32();
  const float* D = dy.f32();
  for (int64_t n = 0; n < N; ++n) {
    int64_t v = t[n] - v0;
    if (v >= 0 && v < Vl) add_inplace<float>(G + v * C, D + n * C, C);
  }
}

// Learned positions on the sequence shard: global row r*Ns + i has position (r*Ns + i) mod T.
void op_pos_embed(OpCall& c) {
  Tensor& e = c.in(0);
  const int64_t Ns = rows(e), C = cols(e), row0 = c.seq_row0(Ns);
  Tensor& y = c.out_new(0, {Ns, C});
  const float* P = c.param(0).value.f32();
  for (int64_t i = 0; i < Ns; ++i) add<float>(e.f32() + i * C, P + c.seq_pos((row0 + i) % c.mb.T) * C, y.f32() + i * C, C);
}

void op_pos_embed_bwd(OpCall& c) {
  Tensor& dy = c.in(0);
  const int64_t Ns = rows(dy), C = cols(dy), row0 = c.seq_row0(Ns);
  float* G = c.grad(0).grad.f32();
  for (int64_t i = 0; i < Ns; ++i) add_inplace<float>(G + c.seq_pos((row0 + i) % c.mb.T) * C, dy.f32() + i * C, C);
}

// Cross-entropy on a full (tp = 1) logits row: loss per token, dlogits written in place.
void op_cross_entropy(OpCall& c) {
  Tensor logits = c.in(0);
  Tensor& tg = c.in(1);
  int64_t N = rows(logits), V = cols(logits);
  Tensor& loss = c.out_new(0, {N});
  Tensor dl = Tensor::empty({N}, DType::kF32);
  std::fill(dl.f32(), dl.f32() + N, c.dloss);
  cross_entropy_fwd_bwd<float>(logits.f32(), tg.data<int32_t>(), loss.f32(), logits.f32(), dl.f32(), N, V);
  c.env.bufs[c.op.outputs.at(1)] = logits;  // dlogits aliases the logits storage
}

// Vocab-parallel cross-entropy (kernels/cpu's xent_row_*), step 1: local row max over this rank's
// real vocabulary columns.
void op_xent_max(OpCall& c) {
  Tensor& lg = c.in(0);
  const int64_t N = rows(lg), V = cols(lg);
  Tensor& m = c.out_new(0, {N});
  xent_row_max(lg.f32(), m.f32(), N, V);
}

// The first vocabulary row of this rank's shard of the head.
int64_t vocab_shard_start(const OpCall& c) {
  return op::vocab_first(c, c.params.resolve(c.unit, c.model.tie_embeddings ? "wte" : "lm_head").value.dim(0));
}

// Step 2: s[n] = (sum_j exp(l_j - m), target logit if the target is in this shard else 0).
void op_xent_stats(OpCall& c) {
  Tensor& lg = c.in(0);
  const int64_t N = rows(lg), V = cols(lg);
  Tensor& s = c.out_new(0, {N, 2});
  xent_row_stats(lg.f32(), c.in(1).data<int32_t>(), c.in(2).f32(), s.f32(), N, V, vocab_shard_start(c));
}

// Step 3: loss = log(S) + m - target_logit; dlogits = (softmax - onehot) * dloss, in place; an
// ignored target (< 0) gives loss 0 and a zero gradient row, as the whole-vocabulary op does.
void op_xent_finish(OpCall& c) {
  Tensor lg = c.in(0);
  const int64_t N = rows(lg), V = cols(lg);
  Tensor& loss = c.out_new(0, {N});
  xent_row_finish(lg.f32(), c.in(1).data<int32_t>(), c.in(2).f32(), c.in(3).f32(), loss.f32(), lg.f32(), c.dloss, N,
                  V, vocab_shard_start(c), c.model.vocab_size);
  c.env.bufs[c.op.outputs.at(1)] = lg;
}

// ---- Mixture of Experts ----------------------------------------------------------------------
// Experts this rank holds: the grouped ops' counts cover them (all E, or E / ep under expert
// parallelism after the exchange).
int64_t expert_rows(const OpCall& c, const Tensor& w, const Tensor& counts) {
  DHX_ASSERT(w.dim(0) % counts.numel() == 0, "{}: weight {} vs {} experts", c.op.name, w.describe(), counts.numel());
  return w.dim(0) / counts.numel();
}

void op_moe_route(OpCall& c) {
  Tensor& lg = c.in(0);
  const int64_t N = rows(lg), E = cols(lg), k = c.model.top_k;
  Tensor& probs = c.out_new(0, {N, E});
  Tensor& expert = c.out_new(1, {N, k}, DType::kI32);
  Tensor& gate = c.out_new(2, {N, k});
  Tensor& counts = c.out_new(3, {E}, DType::kI32);
  Tensor& order = c.out_new(4, {N * k}, DType::kI32);
  Tensor& slot = c.out_new(5, {N * k}, DType::kI32);
  Tensor& stats = c.out_new(6, {2 * E});  // [tokens per expert | sum of each expert's probability]
  moe_route_fwd<float>(lg.f32(), probs.f32(), expert.data<int32_t>(), gate.f32(), N, E, k, c.model.norm_topk);
  moe_group(expert.data<int32_t>(), N, k, E, counts.data<int32_t>(), order.data<int32_t>(), slot.data<int32_t>());
  moe_route_stats<float>(probs.f32(), counts.data<int32_t>(), N, E, stats.f32());
}

void op_moe_aux(OpCall& c) { op::moe_record_aux(c, c.in(0).f32(), c.in(0).numel() / 2); }

void op_moe_route_bwd(OpCall& c) {
  Tensor& dgate = c.in(0);
  Tensor& probs = c.in(1);
  Tensor& expert = c.in(2);
  Tensor& gate = c.in(3);
  const int64_t N = rows(probs), E = cols(probs), k = c.model.top_k;
  const std::vector<float> aux_dp = op::moe_aux_dprob(c, c.in(4).f32(), E);
  Tensor& dl = c.out_new(0, {N, E});
  moe_route_bwd<float>(probs.f32(), expert.data<int32_t>(), gate.f32(), dgate.f32(),
                       aux_dp.empty() ? nullptr : aux_dp.data(), dl.f32(), N, E, k, c.model.norm_topk);
}

void op_moe_dispatch(OpCall& c) {
  Tensor& x = c.in(0);
  Tensor& order = c.in(1);
  const int64_t N = rows(x), C = cols(x), P = order.numel();
  Tensor& xs = c.out_new(0, {P, C});
  moe_dispatch<float>(x.f32(), order.data<int32_t>(), xs.f32(), P, P / N, C);
}

void op_moe_dispatch_bwd(OpCall& c) {
  Tensor& dxs = c.in(0);
  Tensor& slot = c.in(1);
  Tensor& d_router = c.in(2);
  const int64_t N = rows(d_router), C = cols(d_router);
  Tensor& dx = c.out_new(0, {N, C});
  dx.copy_from(d_router);
  moe_dispatch_bwd<float>(dxs.f32(), slot.data<int32_t>(), dx.f32(), N, slot.numel() / N, C);
}

void op_moe_combine(OpCall& c) {
  Tensor& eo = c.in(0);
  Tensor& slot = c.in(1);
  Tensor& gate = c.in(2);
  const int64_t N = rows(gate), k = cols(gate), C = cols(eo);
  Tensor& y = c.out_new(0, {N, C});
  moe_combine<float>(eo.f32(), slot.data<int32_t>(), gate.f32(), y.f32(), N, k, C);
}

void op_moe_combine_bwd(OpCall& c) {
  Tensor& dy = c.in(0);
  Tensor& eo = c.in(1);
  Tensor& slot = c.in(2);
  Tensor& gate = c.in(3);
  const int64_t N = rows(gate), k = cols(gate), C = cols(eo);
  Tensor& deo = c.out_new(0, {rows(eo), C});
  Tensor& dgate = c.out_new(1, {N, k});
  moe_combine_bwd<float>(dy.f32(), eo.f32(), slot.data<int32_t>(), gate.f32(), deo.f32(), dgate.f32(), N, k, C);
}

// Rows received from the ep ranks, (rank, local expert) blocks, regrouped expert-major for the
// grouped GEMMs (and, in forward, the local experts' row counts "moe.lcounts"); moe_ep_unsort the
// inverse. The counts are [ep * El] (rank j's rows for each local expert).
void moe_ep_regroup_op(OpCall& c, bool to_expert_major) {
  Tensor& x = c.in(0);
  Tensor& rc = c.in(1);
  const int64_t G = c.shard.ep, El = rc.numel() / std::max<int64_t>(1, G), C = cols(x);
  DHX_ASSERT(G * El == rc.numel(), "{}: {} counts for ep={}", c.op.name, rc.numel(), G);
  Tensor& y = c.out_new(0, x.shape());
  moe_ep_regroup<float>(x.f32(), rc.data<int32_t>(), y.f32(), G, El, C, to_expert_major);
  if (to_expert_major && c.op.outputs.size() > 1) {
    const std::vector<int32_t> lc = moe_ep_local_counts(rc.data<int32_t>(), G, El);
    std::copy(lc.begin(), lc.end(), c.out_new(1, {El}, DType::kI32).data<int32_t>());
  }
}
void op_moe_ep_sort(OpCall& c) { moe_ep_regroup_op(c, true); }
void op_moe_ep_unsort(OpCall& c) { moe_ep_regroup_op(c, false); }

void op_expert_linear(OpCall& c) {
  Tensor& x = c.in(0);
  Tensor& counts = c.in(1);
  ParamEntry& w = c.param(0);
  const int64_t E = counts.numel(), O = expert_rows(c, w.value, counts), I = w.value.dim(1);
  DHX_ASSERT(cols(x) == I, "{}: input {} vs weight {}", c.op.name, x.describe(), w.value.describe());
  Tensor& y = c.out_new(0, {rows(x), O});
  expert_linear_fwd<float>(x.f32(), w.value.f32(), counts.data<int32_t>(), y.f32(), E, I, O);
}

void op_expert_linear_dgrad(OpCall& c) {
  Tensor& dy = c.in(0);
  Tensor& counts = c.in(1);
  ParamEntry& w = c.param(0);
  const int64_t E = counts.numel(), O = expert_rows(c, w.value, counts), I = w.value.dim(1);
  Tensor& dx = c.out_new(0, {rows(dy), I});
  expert_linear_bwd_data<float>(dy.f32(), w.value.f32(), counts.data<int32_t>(), dx.f32(), E, I, O);
}

void op_expert_linear_wgrad(OpCall& c) {
  Tensor& dy = c.in(0);
  Tensor& x = c.in(1);
  Tensor& counts = c.in(2);
  ParamEntry& w = c.grad(0);
  const int64_t E = counts.numel(), O = expert_rows(c, w.grad, counts), I = w.grad.dim(1);
  expert_linear_bwd_weight<float>(dy.f32(), x.f32(), counts.data<int32_t>(), w.grad.f32(), E, I, O);
}

std::map<std::string, OpFn> make_registry() {
  std::map<std::string, OpFn> table = {
      {"linear", op_linear},         {"linear_dgrad", op_linear_dgrad}, {"linear_wgrad", op_linear_wgrad},
      {"layernorm", op_layernorm},   {"layernorm_bwd", op_layernorm_bwd}, {"rmsnorm", op_rmsnorm},
      {"rmsnorm_bwd", op_rmsnorm_bwd}, {"rope", op_rope},               {"rope_bwd", op_rope_bwd},
      {"attention", op_attention},   {"attention_bwd", op_attention_bwd}, {"gelu", op_gelu},
      {"gelu_bwd", op_gelu_bwd},     {"swiglu", op_swiglu},             {"swiglu_bwd", op_swiglu_bwd},
      {"residual_add", op_residual_add}, {"bias_grad", op_bias_grad},
      {"linear_gelu", op_linear_gelu}, {"linear_dgrad_gelu", op_linear_dgrad_gelu},
      {"linear_residual", op_linear_residual},   {"embed", op_embed},
      {"embed_bwd", op_embed_bwd},   {"pos_embed", op_pos_embed},       {"pos_embed_bwd", op_pos_embed_bwd},
      {"cross_entropy", op_cross_entropy}, {"xent_max", op_xent_max},   {"xent_stats", op_xent_stats},
      {"xent_finish", op_xent_finish},
      {"moe_route", op_moe_route},   {"moe_route_bwd", op_moe_route_bwd}, {"moe_aux", op_moe_aux}, {"moe_dispatch", op_moe_dispatch},
      {"moe_dispatch_bwd", op_moe_dispatch_bwd}, {"moe_combine", op_moe_combine},
      {"moe_combine_bwd", op_moe_combine_bwd}, {"expert_linear", op_expert_linear},
      {"expert_linear_dgrad", op_expert_linear_dgrad}, {"expert_linear_wgrad", op_expert_linear_wgrad},
      {"moe_ep_sort", op_moe_ep_sort}, {"moe_ep_unsort", op_moe_ep_unsort},
      {"cp_kv_pack", op_cp_kv_pack}, {"ring_attention", op_ring_attention},
      {"ring_attention_bwd", op_ring_attention_bwd}, {"cp_dkv_add", op_cp_dkv_add},
      {"cp_ring_bwd_finish", op_cp_ring_bwd_finish},
  };
  add_3d_ops(table);
  return table;
}

const std::map<std::string, OpFn>& registry() {
  static const std::map<std::string, OpFn> table = make_registry();
  return table;
}

}  // namespace

const OpFn& lookup_op(const std::string& code) {
  auto it = registry().find(code);
  DHX_CHECK(it != registry().end(), InternalError, "no kernel binding for op code '{}'", code);
  return it->second;
}

std::vector<std::string> op_codes() {
  std::vector<std::string> codes;
  for (const auto& [code, fn] : registry()) codes.push_back(code);
  return codes;
}

}  // namespace dhelix
