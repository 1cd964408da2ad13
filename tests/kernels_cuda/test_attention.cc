// Causal GQA flash attention on the GPU against its CPU twin, cpu::attention_fwd / attention_bwd in
// fp32 (GemmPrecision::kFp32), run on the same bf16-rounded inputs (q, k, v, dout; the backward's o
// too), so the differences are the GPU's own roundings. Outputs poisoned before each call; ragged T
// (not a multiple of the 64- and 128-row tiles), GQA, MQA, D = 32, 64 and 128, and q, k, v as views into one
// packed qkv buffer (with o wider than H D).
//
// Tolerances, from u = 2^-8 (bf16's unit roundoff, CudaTest.h):
//   o:  o_t = sum_s P_ts v_s / l_t. The GPU rounds each weight P_ts to bf16 for the P V product
//       (relative error <= u per weight, independent between keys; l_t stays fp32), and rounds o
//       once (<= u). For random v the first error sum_s P_ts d_s v_s has the size of u |o_t| (the
//       same random-sign sum as o_t itself), so ||err|| / ||o|| <= about 2u; fp32 scores and exp2
//       (~1e-6) are far below. Bound 4u: twice the estimate.
//   lse: fp32 only: the scores are exact bf16 products summed in fp32, max + log(sum) in fp32, so
//       |lse - ref| is a few fp32 ulps of |lse| <= ~10 plus exp2f's 2 ulp: 1e-4 absolute.
//   dq, dk, dv: dV = P^T dO with P rounded to bf16 (as o: 2u); dK = scale dS^T Q and dQ = scale dS K
//       with dS = P (dP - D_i) rounded to bf16 (u per element, random signs: ~u in the norm) and the
//       output rounded (u); fp32 sums over 64-key tiles and G heads in another order than the CPU's
//       (~1e-6). Estimate 2u each; bound 8u (4x), the low end of 8u-16u since no rounding is squared.
//       T = 1 is the exception: one key of weight 1, so dS = dP - D_i = 0 exactly and dq = dk = 0;
//       both sides hold fp32 noise of dP - D_i (|dP| ~ sqrt(D), 2^-24 relative: ~1e-6 times scale
//       |k|), so there dq, dk are compared absolutely, within 1e-4.
#include <cstring>

#include "AttnForm.h"
#include "CudaTest.h"
#include "kernels/cpu/Kernels.h"
#include "kernels/cuda/Attention.h"

namespace dhelix::cuda::test {
namespace {

constexpr double kOutBound = 4 * kBf16U;
constexpr double kLseBound = 1e-4;
constexpr double kGradBound = 8 * kBf16U;
constexpr double kZeroGradBound = 1e-4;  // T = 1's dq, dk (exactly 0): absolute

enum class Packing { kSeparate, kPackedQkv };

struct Case {
  int64_t B, T, H, Hkv, D;
  Packing packing;
};
const Case kCases[] = {{2, 64, 4, 4, 64, Packing::kSeparate},   {1, 100, 4, 2, 64, Packing::kSeparate},
                       {2, 77, 2, 1, 128, Packing::kSeparate},  {1, 257, 8, 2, 64, Packing::kSeparate},
                       {2, 130, 6, 2, 64, Packing::kPackedQkv}, {3, 1, 2, 1, 64, Packing::kSeparate},
                       {1, 200, 4, 2, 128, Packing::kPackedQkv},
                       // Several 128-row tiles whole (MQA: one kv tile serves 4 heads) and ragged at D = 128.
                       {1, 384, 4, 1, 64, Packing::kSeparate},  {1, 300, 4, 2, 128, Packing::kPackedQkv},
                       // D = 32 (the demo config's head size), ragged, GQA, packed.
                       {2, 150, 8, 4, 32, Packing::kPackedQkv}, {1, 64, 2, 1, 32, Packing::kSeparate}};

std::string name(const Case& c) {
  return cat("B=", c.B, " T=", c.T, " H=", c.H, " Hkv=", c.Hkv, " D=", c.D,
             c.packing == Packing::kPackedQkv ? " packed qkv" : " separate q, k, v");
}

// Where q, k, v live in one buffer x (and dq, dk, dv in dx, the same layout): separate is
// [q (B T H D) | k (B T Hkv D) | v (B T Hkv D)]; packed is rows of [q heads | k heads | v heads].
// o and dout: [B, T, o_stride], o_stride = H D, or H D + 16 when packed (an o wider than its heads).
struct Problem {
  AttnShape s;
  int64_t q_off, k_off, v_off, x_size, o_size;
  std::vector<float> x, dout;  // bf16-rounded
  float scale;
  cpu::AttnDims dims() const { return {s.B, s.T, s.H, s.Hkv, s.D, s.q_stride, s.kv_stride, s.o_stride}; }
};

Problem make_problem(const Case& c, uint64_t seed) {
  Problem p;
  const int64_t N = c.B * c.T, qw = c.H * c.D, kvw = c.Hkv * c.D;
  if (c.packing == Packing::kPackedQkv) {
    const int64_t w = qw + 2 * kvw;
    p.s = {c.B, c.T, c.H, c.Hkv, c.D, w, w, qw + 16};
    p.q_off = 0, p.k_off = qw, p.v_off = qw + kvw, p.x_size = N * w;
  } else {
    p.s = {c.B, c.T, c.H, c.Hkv, c.D, qw, kvw, qw};
    p.q_off = 0, p.k_off = N * qw, p.v_off = N * (qw + kvw), p.x_size = N * (qw + 2 * kvw);
  }
  p.o_size = N * p.s.o_stride;
  p.x = round_bf16(randn(p.x_size, seed));  // std 1
  p.dout = round_bf16(randn(p.o_size, seed + 1));
  p.scale = 1.0f / std::sqrt(static_cast<float>(c.D));
  return p;
}

// The [B T, width] rows of a strided buffer at offset `off`, compact (the columns a view covers).
std::vector<float> rows_of(const std::vector<float>& buf, int64_t off, int64_t stride, int64_t width, int64_t rows) {
  std::vector<float> out(rows * width);
  for (int64_t r = 0; r < rows; ++r)
    std::memcpy(out.data() + r * width, buf.data() + off + r * stride, width * sizeof(float));
  return out;
}

struct Fwd {
  std::vector<float> o, lse;  // o: [B T, o_stride] (only the heads' columns meaningful); lse [B, H, T]
};
Fwd cpu_fwd(const Problem& p) {
  Fwd f{std::vector<float>(p.o_size, 0.0f), std::vector<float>(p.s.B * p.s.H * p.s.T)};
  cpu::attention_fwd<float>(p.x.data() + p.q_off, p.x.data() + p.k_off, p.x.data() + p.v_off, f.o.data(),
                            f.lse.data(), p.dims(), p.scale, cpu::GemmPrecision::kFp32);
  return f;
}

Fwd gpu_fwd(const Problem& p) {
  DevBuf<bf16> x(to_bf16(p.x)), o(p.o_size);
  DevBuf<float> lse(p.s.B * p.s.H * p.s.T);
  o.poison();
  lse.poison();
  attention_fwd(x.get() + p.q_off, x.get() + p.k_off, x.get() + p.v_off, o.get(), lse.get(), p.s, p.scale, nullptr);
  return {to_f32(o.download()), lse.download()};
}

// dx in x's layout; the backward reads o (bf16-rounded, as stored) and lse of `f`.
std::vector<float> cpu_bwd(const Problem& p, const std::vector<float>& o, const std::vector<float>& lse) {
  std::vector<float> dx(p.x_size, 0.0f);
  cpu::attention_bwd<float>(p.x.data() + p.q_off, p.x.data() + p.k_off, p.x.data() + p.v_off, o.data(), lse.data(),
                            p.dout.data(), dx.data() + p.q_off, dx.data() + p.k_off, dx.data() + p.v_off, p.dims(),
                            p.scale, cpu::GemmPrecision::kFp32);
  return dx;
}

std::vector<bf16> gpu_bwd(const Problem& p, const std::vector<float>& o, const std::vector<float>& lse) {
  DevBuf<bf16> x(to_bf16(p.x)), go(to_bf16(o)), gdout(to_bf16(p.dout)), dx(p.x_size);
  DevBuf<float> glse(lse);
  dx.poison();
  attention_bwd(x.get() + p.q_off, x.get() + p.k_off, x.get() + p.v_off, go.get(), glse.get(), gdout.get(),
                dx.get() + p.q_off, dx.get() + p.k_off, dx.get() + p.v_off, p.s, p.scale, nullptr);
  return dx.download();
}

// Oracle: cpu::attention_fwd<float> on the same bf16 inputs. Bounds: the file's comment.
TEST(CudaAttention, ForwardMatchesCpu) {
  DHX_REQUIRE_GPU();
  uint64_t seed = 1;
  for (const Case& c : kCases) {
    const Problem p = make_problem(c, seed += 2);
    const Fwd ref = cpu_fwd(p), got = gpu_fwd(p);
    const int64_t N = c.B * c.T, qw = c.H * c.D;
    EXPECT_LE(rel_err(rows_of(got.o, 0, p.s.o_stride, qw, N), rows_of(ref.o, 0, p.s.o_stride, qw, N)), kOutBound)
        << "o, " << name(c);
    EXPECT_LE(max_abs_diff(got.lse, ref.lse), kLseBound) << "lse, " << name(c);
  }
}

// Oracle: cpu::attention_bwd<float> on the same bf16 inputs, both reading the CPU forward's lse and
// its o rounded to bf16 (so the backward is tested apart from the GPU forward). Bounds: the file's
// comment.
void backward_matches_cpu(uint64_t seed) {
  for (const Case& c : kCases) {
    const Problem p = make_problem(c, seed += 2);
    const Fwd f = cpu_fwd(p);
    const std::vector<float> o = round_bf16(f.o);
    const std::vector<float> ref = cpu_bwd(p, o, f.lse), got = to_f32(gpu_bwd(p, o, f.lse));
    const int64_t N = c.B * c.T, qw = c.H * c.D, kvw = c.Hkv * c.D;
    const struct { const char* what; int64_t off, stride, width; } views[] = {
        {"dq", p.q_off, p.s.q_stride, qw}, {"dk", p.k_off, p.s.kv_stride, kvw}, {"dv", p.v_off, p.s.kv_stride, kvw}};
    for (const auto& w : views) {
      const auto g = rows_of(got, w.off, w.stride, w.width, N), r = rows_of(ref, w.off, w.stride, w.width, N);
      if (c.T == 1 && w.what[1] != 'v') EXPECT_LE(max_abs_diff(g, r), kZeroGradBound) << w.what << ", " << name(c);
      else EXPECT_LE(rel_err(g, r), kGradBound) << w.what << ", " << name(c);
    }
  }
}
TEST(CudaAttention, BackwardMatchesCpu) {
  DHX_REQUIRE_GPU();
  backward_matches_cpu(100);
}

// The ordered-dQ form (Attention.h's AttnBwdForm::kOrderedDq: dQ added by the dK/dV kernel, key
// tile by key tile in order) on the same cases, D = 32, 64 and 128, ragged, GQA, MQA, packed.
// Oracle and bounds as BackwardMatchesCpu's: dQ's fp32 sums run per 128-key tile and then over the
// tiles, another order than the CPU's (~1e-6, far below the bf16 roundings the bounds are made of).
TEST(CudaAttention, OrderedDqBackwardMatchesCpu) {
  DHX_REQUIRE_GPU();
  const FormGuard guard(AttnBwdForm::kOrderedDq);
  backward_matches_cpu(150);
}

// The ordered form where a sequence has 16 key tiles and the grid (key tiles x kv heads x sequences
// = 768 blocks) fills an H100's SMs about three times over, so key tiles wait for turns held by
// blocks of earlier waves as well as by blocks beside them: T = 2000 (ragged), GQA 16 / 8, D = 64.
// Oracles: the halves form (checked against the CPU above) within kGradBound, and the same call
// again, bitwise (the turns fix every sum's order).
TEST(CudaAttention, OrderedDqAcrossManyBlocksIsRepeatableAndMatchesHalves) {
  DHX_REQUIRE_GPU();
  const Problem p = make_problem({6, 2000, 16, 8, 64, Packing::kPackedQkv}, 31);
  // An o and lse from the GPU forward (the CPU one is slow at this size): both forms read the same.
  const Fwd f = gpu_fwd(p);
  const std::vector<float> o = round_bf16(f.o);
  const std::vector<bf16> halves = gpu_bwd(p, o, f.lse);
  std::vector<bf16> a, b;
  {
    const FormGuard guard(AttnBwdForm::kOrderedDq);
    a = gpu_bwd(p, o, f.lse);
    b = gpu_bwd(p, o, f.lse);
  }
  ASSERT_EQ(a.size(), b.size());
  EXPECT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * sizeof(bf16))) << "two calls of the ordered form";
  const int64_t N = p.s.B * p.s.T;
  const std::vector<float> fa = to_f32(a), fh = to_f32(halves);
  const struct { const char* what; int64_t off, stride, width; } views[] = {
      {"dq", p.q_off, p.s.q_stride, p.s.H * p.s.D},
      {"dk", p.k_off, p.s.kv_stride, p.s.Hkv * p.s.D},
      {"dv", p.v_off, p.s.kv_stride, p.s.Hkv * p.s.D}};
  for (const auto& w : views)
    EXPECT_LE(rel_err(rows_of(fa, w.off, w.stride, w.width, N), rows_of(fh, w.off, w.stride, w.width, N)), kGradBound)
        << w.what;
}

// The same call twice gives the same bits: no atomics, fixed summation orders (Attention.cu).
// Oracle: the first call. GPT-2's head size at a GQA shape with several tiles per sequence.
TEST(CudaAttention, RepeatedCallsAreBitwiseEqual) {
  DHX_REQUIRE_GPU();
  const Problem p = make_problem({2, 515, 8, 2, 64, Packing::kPackedQkv}, 7);
  const Fwd f = cpu_fwd(p);
  const std::vector<float> o = round_bf16(f.o);
  const Fwd f1 = gpu_fwd(p), f2 = gpu_fwd(p);
  EXPECT_EQ(0, std::memcmp(f1.o.data(), f2.o.data(), f1.o.size() * sizeof(float))) << "o";
  EXPECT_EQ(0, std::memcmp(f1.lse.data(), f2.lse.data(), f1.lse.size() * sizeof(float))) << "lse";
  const std::vector<bf16> g1 = gpu_bwd(p, o, f.lse), g2 = gpu_bwd(p, o, f.lse);
  EXPECT_EQ(0, std::memcmp(g1.data(), g2.data(), g1.size() * sizeof(bf16))) << "dq, dk, dv";
}

// The backward's two forms (Attention.h's AttnBwdForm: each 64-wide tile in halves, the default, or
// whole) on every case above, D = 32, 64 and 128, ragged, GQA, packed. Oracle: the whole-tile form,
// bitwise (each element's sums run in the same order in both: Attention.cu's accumulate). The
// forms' closeness to the CPU is BackwardMatchesCpu's (run in the default form); this adds that the
// two are one function.
TEST(CudaAttention, BackwardFormsGiveTheSameBits) {
  DHX_REQUIRE_GPU();
  ASSERT_EQ(attention_bwd_form(), AttnBwdForm::kHalves) << "the default form";
  uint64_t seed = 300;
  for (const Case& c : kCases) {
    const Problem p = make_problem(c, seed++);
    const Fwd f = cpu_fwd(p);
    const std::vector<float> o = round_bf16(f.o);
    const std::vector<bf16> halves = gpu_bwd(p, o, f.lse);
    std::vector<bf16> whole;
    {
      const FormGuard guard(AttnBwdForm::kWholeTiles);
      whole = gpu_bwd(p, o, f.lse);
    }
    ASSERT_EQ(halves.size(), whole.size());
    EXPECT_EQ(0, std::memcmp(halves.data(), whole.data(), halves.size() * sizeof(bf16))) << name(c);
  }
}

// A block of context parallelism's ring (attention_block_bwd: fp32 gradients added to) on random
// inputs: q, k, v, dout, the GPU forward's o (rounded to bf16) and lse, and random starting
// gradients; bwd(form) runs the backward in that form from the starts and returns dq, dk, dv.
struct BlockProblem {
  AttnBlock blk;
  float scale;
  DevBuf<bf16> q, k, v, dout, o;
  DevBuf<float> lse;
  std::vector<float> start[3];
  BlockProblem(int64_t B, int64_t Tq, int64_t Tk, int64_t H, int64_t Hkv, int64_t D, bool causal, uint64_t& seed)
      : blk{B, Tq, Tk, H, Hkv, D, H * D, Hkv * D, H * D, Tq * H * D, Tk * Hkv * D, Tq * H * D, Tq, causal},
        scale(1.0f / std::sqrt(static_cast<float>(D))),
        q(to_bf16(randn(B * Tq * H * D, seed++))),
        k(to_bf16(randn(B * Tk * Hkv * D, seed++))),
        v(to_bf16(randn(B * Tk * Hkv * D, seed++))),
        dout(to_bf16(randn(B * Tq * H * D, seed++))),
        o(B * Tq * H * D),
        lse(B * H * Tq) {
    DevBuf<float> o32(B * Tq * H * D);
    attention_block_fwd(q.get(), k.get(), v.get(), o32.get(), lse.get(), blk, scale, nullptr);
    o.upload(to_bf16(o32.download()));
    start[0] = randn(B * Tq * H * D, seed++);
    start[1] = randn(B * Tk * Hkv * D, seed++);
    start[2] = randn(B * Tk * Hkv * D, seed++);
  }
  std::vector<std::vector<float>> bwd(AttnBwdForm form) const {
    const FormGuard guard(form);
    DevBuf<float> dq(start[0]), dk(start[1]), dv(start[2]);
    attention_block_bwd(q.get(), k.get(), v.get(), o.get(), lse.get(), dout.get(), dq.get(), dk.get(), dv.get(), blk,
                        scale, nullptr);
    return {dq.download(), dk.download(), dv.download()};
  }
  std::string name() const {
    return cat("D=", blk.D, blk.causal ? " causal" : " full", " block of ", blk.Tq, " x ", blk.Tk);
  }
};

// The same for context parallelism's blocks, a full block of 100 queries against 77 keys (ragged
// tiles, no causal mask) and a causal one, D = 32 and 64, GQA. Oracle: the whole-tile form, bitwise,
// from the same random starting gradients.
TEST(CudaAttention, BlockBackwardFormsGiveTheSameBits) {
  DHX_REQUIRE_GPU();
  uint64_t seed = 400;
  for (const int64_t D : {32, 64})
    for (const bool causal : {false, true}) {
      const BlockProblem p(2, 100, causal ? 100 : 77, 4, 2, D, causal, seed);
      const auto halves = p.bwd(AttnBwdForm::kHalves), whole = p.bwd(AttnBwdForm::kWholeTiles);
      for (size_t t = 0; t < 3; ++t) {
        ASSERT_EQ(halves[t].size(), whole[t].size());
        EXPECT_EQ(0, std::memcmp(halves[t].data(), whole[t].data(), halves[t].size() * sizeof(float)))
            << p.name() << ", " << "dq\0dk\0dv" + 3 * t;
      }
    }
}

// The ordered form on context parallelism's blocks (fp32 gradients added to: each key tile adds
// scale times its dQ share, in key-tile order): 300 queries against 300 keys (causal) or 261 (a full
// block), three 128-key tiles each, the last ragged, so shares of several key tiles meet in every
// dq row; D = 32 and 64, GQA. Oracle: the halves form from the same random starting gradients;
// what each added (the gradient less its start) within kGradBound, as two roundings of the same
// block gradient (the file's comment).
TEST(CudaAttention, OrderedDqBlockBackwardMatchesHalves) {
  DHX_REQUIRE_GPU();
  uint64_t seed = 450;
  for (const int64_t D : {32, 64})
    for (const bool causal : {false, true}) {
      const BlockProblem p(2, 300, causal ? 300 : 261, 4, 2, D, causal, seed);
      auto halves = p.bwd(AttnBwdForm::kHalves), ordered = p.bwd(AttnBwdForm::kOrderedDq);
      for (size_t t = 0; t < 3; ++t) {
        for (size_t i = 0; i < halves[t].size(); ++i) halves[t][i] -= p.start[t][i], ordered[t][i] -= p.start[t][i];
        EXPECT_LE(rel_err(ordered[t], halves[t]), kGradBound) << p.name() << ", " << "dq\0dk\0dv" + 3 * t;
      }
    }
}

// Head sizes other than 32, 64 and 128 have no kernel: a DeviceError naming D, before any launch.
TEST(CudaAttention, UnsupportedHeadSizeIsADeviceError) {
  DHX_REQUIRE_GPU();
  const AttnShape s{1, 8, 2, 2, 96, 2 * 96, 2 * 96, 2 * 96};
  DevBuf<bf16> q(8 * 2 * 96), k(8 * 2 * 96), v(8 * 2 * 96), o(8 * 2 * 96), dq(8 * 2 * 96), dk(8 * 2 * 96),
      dv(8 * 2 * 96);
  DevBuf<float> lse(2 * 8);
  try {
    attention_fwd(q.get(), k.get(), v.get(), o.get(), lse.get(), s, 0.1f, nullptr);
    FAIL() << "attention_fwd accepted D=96";
  } catch (const DeviceError& e) {
    EXPECT_NE(std::string(e.what()).find("D=96"), std::string::npos) << e.what();
  }
  EXPECT_THROW(attention_bwd(q.get(), k.get(), v.get(), o.get(), lse.get(), o.get(), dq.get(), dk.get(), dv.get(), s,
                             0.1f, nullptr),
               DeviceError);
}

}  // namespace
}  // namespace dhelix::cuda::test
