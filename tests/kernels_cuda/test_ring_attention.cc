// Context parallelism's ring attention on the GPU -- the ring_attention ops' steps
// (runtime/CudaOps.h: cuda_ring_fwd_step / cuda_ring_bwd_step over kernels/cuda's
// attention_block_fwd / attention_block_bwd / attention_merge) -- against the CPU twins
// cpu::ring_attention_fwd_step / ring_attention_bwd_step in fp32 (GemmPrecision::kFp32) on the same
// bf16-rounded inputs, for every rank of rings of 2, 3 and 4 ranks and every step in the ring's
// order: step 0 a causal block, the later ones full blocks of half the queries or half the keys
// (cpu::cp_ring_step), ragged tiles, GQA, MQA and D = 32, 64 and 128. And the last backward op's
// sum and rounding (cp_ring_finish), and the column copy that packs the travelling keys.
//
// Tolerances, from u = 2^-8 (bf16's unit roundoff, CudaTest.h), as test_attention.cc's:
//   o (fp32, before its one bf16 rounding by the last step's op): each block's P V product rounds
//       its weights to bf16 (relative <= u per weight, random between keys); the blocks' parts are
//       merged in fp32 (~1e-7). The estimate 2u of the one-pass attention holds; bound 4u.
//   lse: fp32 only (scores exact bf16 products summed in fp32, the merge's log/exp in fp32):
//       1e-4 absolute, as the one-pass test's.
//   dq, dk/dv (fp32, accumulated over the steps): per step as the one-pass backward (P and dS
//       rounded to bf16 for the products: estimate 2u), summed over cp steps in fp32 (exact to
//       1e-7 relative); bound 8u.
//   cp_ring_finish: the fp32 sums and roundings are the oracle's own expressions: bitwise.
#include <cstring>

#include "AttnForm.h"
#include "CudaTest.h"
#include "kernels/cpu/Kernels.h"
#include "kernels/cuda/Ops.h"
#include "runtime/CudaOps.h"

namespace dhelix::cuda::test {
namespace {

constexpr double kOutBound = 4 * kBf16U;
constexpr double kLseBound = 1e-4;
constexpr double kGradBound = 8 * kBf16U;

struct RingCase {
  int cp;
  int64_t B, Tl, H, Hkv, D;
};
const RingCase kRing[] = {
    {2, 2, 128, 4, 2, 64},   // whole 64-row tiles (chunks of 64)
    {3, 1, 100, 4, 1, 32},   // MQA, ragged chunks of 50
    {4, 1, 200, 2, 2, 128},  // D = 128, chunks of 100 (a 128-row tile ragged)
    {2, 2, 2, 2, 1, 64},     // chunks of one row
};

std::string name(const RingCase& c) {
  return cat("cp=", c.cp, " B=", c.B, " Tl=", c.Tl, " H=", c.H, " Hkv=", c.Hkv, " D=", c.D);
}

// Each rank's packed qkv rows [B Tl, (H + 2 Hkv) D] and dout [B Tl, H D], bf16-rounded.
struct Ring {
  RingCase c;
  int64_t N, W, kvw, ow;
  float scale;
  std::vector<std::vector<float>> qkv, dout;
  cpu::RingDims dims(int rank) const { return {c.cp, rank, c.B, c.Tl, c.H, c.Hkv, c.D, W}; }
  // Rank src's keys and values as they travel: the k and v columns of its qkv rows.
  std::vector<float> kv(int src) const {
    std::vector<float> out(N * kvw);
    for (int64_t i = 0; i < N; ++i)
      std::memcpy(out.data() + i * kvw, qkv[src].data() + i * W + ow, kvw * sizeof(float));
    return out;
  }
};

Ring make_ring(const RingCase& c, uint64_t seed) {
  Ring r{c, c.B * c.Tl, (c.H + 2 * c.Hkv) * c.D, 2 * c.Hkv * c.D, c.H * c.D,
         1.0f / std::sqrt(static_cast<float>(c.D)), {}, {}};
  for (int k = 0; k < c.cp; ++k) {
    r.qkv.push_back(round_bf16(randn(r.N * r.W, seed + 2 * k)));
    r.dout.push_back(round_bf16(randn(r.N * r.ow, seed + 2 * k + 1)));
  }
  return r;
}

int src_of(int cp, int rank, int step) { return ((rank - step) % cp + cp) % cp; }

// The q columns of dq rows [N, W].
std::vector<float> q_cols(const std::vector<float>& dq, int64_t N, int64_t W, int64_t ow) {
  std::vector<float> out(N * ow);
  for (int64_t i = 0; i < N; ++i) std::memcpy(out.data() + i * ow, dq.data() + i * W, ow * sizeof(float));
  return out;
}

// Oracle: the CPU ring's steps in fp32 on the same bf16 inputs, rank by rank, the keys of rank
// (rank - step) mod cp at step `step`. The backward of both reads the CPU forward's o rounded to
// bf16 (as the op stores it) and its lse, so it is tested apart from the GPU forward. Bounds: the
// file's comment. The backward in its default form and in the ordered-dQ form (kernels/cuda/
// Attention.h's AttnBwdForm::kOrderedDq: each key tile adds its share of dq in key-tile order).
TEST(CudaRingAttention, EveryRankAndStepMatchesTheCpuRing) {
  DHX_REQUIRE_GPU();
  for (const AttnBwdForm form : {attention_bwd_form(), AttnBwdForm::kOrderedDq})
  for (uint64_t seed = 500; const RingCase& c : kRing) {
    const FormGuard guard(form);
    SCOPED_TRACE(form == AttnBwdForm::kOrderedDq ? "ordered-dQ backward" : "default backward");
    const Ring ring = make_ring(c, seed += 16);
    const int64_t N = ring.N, W = ring.W, kvw = ring.kvw, ow = ring.ow, L = c.B * c.H * c.Tl;
    for (int rank = 0; rank < c.cp; ++rank) {
      SCOPED_TRACE(cat(name(c), " rank ", rank));
      const cpu::RingDims rd = ring.dims(rank);
      // forward
      std::vector<float> o(N * ow), lse(L), o_tmp(N * ow), lse_tmp(L);
      DevBuf<bf16> qkv(to_bf16(ring.qkv[rank]));
      DevBuf<float> go(N * ow), glse(L), go_tmp(N * ow), glse_tmp(L);
      go.poison(), glse.poison(), go_tmp.poison(), glse_tmp.poison();
      for (int step = 0; step < c.cp; ++step) {
        const std::vector<float> kv = ring.kv(src_of(c.cp, rank, step));
        cpu::ring_attention_fwd_step<float>(rd, step, ring.qkv[rank].data(), kv.data(), o.data(), lse.data(),
                                            o_tmp.data(), lse_tmp.data(), ring.scale, cpu::GemmPrecision::kFp32);
        DevBuf<bf16> gkv(to_bf16(kv));
        cuda_ring_fwd_step(rd, step, qkv.get(), gkv.get(), go.get(), glse.get(), go_tmp.get(), glse_tmp.get(),
                           ring.scale, nullptr);
        DHX_CUDA(cudaDeviceSynchronize());  // gkv is freed at the end of this iteration
      }
      EXPECT_LE(rel_err(go.download(), o), kOutBound) << "o";
      EXPECT_LE(max_abs_diff(glse.download(), lse), kLseBound) << "lse";
      // backward
      const std::vector<float> o16 = round_bf16(o);
      DevBuf<bf16> go16(to_bf16(o16)), gdout(to_bf16(ring.dout[rank]));
      DevBuf<float> glse_ref(lse), gdq(std::vector<float>(N * W, 0.0f));
      std::vector<float> dq(N * W, 0.0f);
      for (int step = 0; step < c.cp; ++step) {
        const std::vector<float> kv = ring.kv(src_of(c.cp, rank, step));
        std::vector<float> dkv(N * kvw, 0.0f);
        cpu::ring_attention_bwd_step<float>(rd, step, ring.qkv[rank].data(), kv.data(), o16.data(), lse.data(),
                                            ring.dout[rank].data(), dq.data(), dkv.data(), ring.scale,
                                            cpu::GemmPrecision::kFp32);
        DevBuf<bf16> gkv(to_bf16(kv));
        DevBuf<float> gdkv(std::vector<float>(N * kvw, 0.0f));
        cuda_ring_bwd_step(rd, step, qkv.get(), gkv.get(), go16.get(), glse_ref.get(), gdout.get(), gdq.get(),
                           gdkv.get(), ring.scale, nullptr);
        EXPECT_LE(rel_err(gdkv.download(), dkv), kGradBound) << "dk/dv of step " << step;
      }
      EXPECT_LE(rel_err(q_cols(gdq.download(), N, W, ow), q_cols(dq, N, W, ow)), kGradBound) << "dq";
    }
  }
}

// Oracle: the CPU op's sums (cp_ring_bwd_finish: the q columns as they are, own + came in fp32),
// each rounded to nearest even: bitwise. And copy_cols against a host column copy: exact.
TEST(CudaRingAttention, FinishAndPackMatchTheCpuOps) {
  DHX_REQUIRE_GPU();
  const int64_t N = 37, qc = 96, kvw = 64, W = qc + kvw;
  const std::vector<float> dq = randn(N * W, 71), own = randn(N * kvw, 72), came = randn(N * kvw, 73);
  std::vector<float> ref(N * W);
  for (int64_t i = 0; i < N; ++i)
    for (int64_t c = 0; c < W; ++c)
      ref[i * W + c] = c < qc ? dq[i * W + c] : own[i * kvw + c - qc] + came[i * kvw + c - qc];
  DevBuf<float> gdq(dq), gown(own), gcame(came);
  DevBuf<bf16> out(N * W);
  out.poison();
  cp_ring_finish(gdq.get(), gown.get(), gcame.get(), out.get(), N, W, qc, nullptr);
  const std::vector<bf16> got = out.download(), want = to_bf16(ref);
  EXPECT_EQ(0, std::memcmp(got.data(), want.data(), got.size() * sizeof(bf16)));

  const std::vector<float> x = round_bf16(randn(N * W, 74));
  DevBuf<bf16> gx(to_bf16(x)), y(N * kvw);
  y.poison();
  copy_cols(gx.get() + qc, W, y.get(), kvw, N, kvw, nullptr);
  std::vector<float> cols(N * kvw);
  for (int64_t i = 0; i < N; ++i) std::memcpy(cols.data() + i * kvw, x.data() + i * W + qc, kvw * sizeof(float));
  EXPECT_EQ(to_f32(y.download()), cols);
}

}  // namespace
}  // namespace dhelix::cuda::test
