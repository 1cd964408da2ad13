// GPU kernel times of one training step, op by op (issue 35): every kernel a GPT-2 124M or a
// Llama-1B step runs, on the step's own shapes, timed alone with CUDA events (median of reps, after
// warm-up; inputs random, never zeros). The sum over the step's ops is the step time an executor
// with no launch gaps and no overlap would reach with these kernels: `kernel_sum_tokens_per_s` is
// that bound, not a training run's figure. Per op class (GEMM, attention, the rest) it says where
// the time goes, beside cuBLAS's rate on the same GEMMs (bench/gpu_torch.py) and PyTorch's step.
//   dhelix_bench_gpu_kernels [--models gpt2-124m,llama-1b] [--batch gpt2-124m=16,llama-1b=4] [--seq 1024]
//                            [--ordered-dq on|off]
// Then two studies: grouped expert GEMMs against dense ones, and SM partitions (one GEMM on the
// whole GPU, on half of its SMs, on both halves at once). Prints a table, a line {"model_result":{...}}
// as each model is done (a model or study that failed: its error, the rest still run, exit 1) and,
// last, one JSON object (non-finite numbers written null).
// GPT-2's rows include the cuBLASLt epilogue study (class "study", outside the sums): each fused
// op (GEMM + GELU, dgrad + GELU', GEMM + residual add) beside the unfused pair it replaces. The
// attention backward's other forms are study rows too (whole tiles; the ordered dQ, unless
// --ordered-dq off).
#include <cuda_runtime_api.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <cstdio>
#include <exception>
#include <functional>
#include <latch>
#include <map>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "BenchMain.h"
#include "base/Clock.h"
#include "base/Error.h"
#include "kernels/cuda/Attention.h"
#include "kernels/cuda/Cuda.h"
#include "kernels/cuda/Gemm.h"
#include "kernels/cuda/Moe.h"
#include "kernels/cuda/Ops.h"
#include "kernels/cuda/SmPartition.h"

namespace dhelix::cuda {
namespace {

struct Model {
  std::string name;
  bool llama;
  int64_t L, C, H, Hkv, F, V;
  int64_t params() const {  // as bench/gpu_torch.py's models (GPT-2: tied head, 1024 positions)
    const int64_t D = C / H;
    if (llama) return L * (C * (H + 2 * Hkv) * D + C * C + C * 2 * F + F * C + 2 * C) + 2 * V * C + C;
    return L * (C * 3 * C + 3 * C + C * C + C + C * F + F + F * C + C + 4 * C) + V * C + 1024 * C + 2 * C;
  }
};
const Model kModels[] = {{"gpt2-124m", false, 12, 768, 12, 12, 3072, 50257},
                         {"llama-1b", true, 16, 2048, 32, 8, 8192, 32000}};

// A device buffer of n bf16 (or fp32) filled with small random values.
class Buf {
 public:
  // Random bf16 values (fp32 words made of two of them are finite, about N(0, 0.5^2) too): up to
  // 16 MB drawn on the host, then repeated by device copies (doubling) to fill the buffer.
  Buf(size_t bytes, uint64_t seed) : bytes_(bytes) {
    DHX_CUDA(cudaMalloc(&p_, std::max<size_t>(bytes, 2)));
    const size_t first = std::min<size_t>(bytes, size_t{16} << 20) / 2 * 2;
    std::vector<uint16_t> h(first / 2);
    std::mt19937 g(static_cast<uint32_t>(seed));
    std::normal_distribution<float> d(0.0f, 0.5f);
    for (auto& x : h) x = f32_to_bf16_bits(d(g));
    char* dst = static_cast<char*>(p_);
    DHX_CUDA(cudaMemcpy(dst, h.data(), first, cudaMemcpyHostToDevice));
    for (size_t done = first; done < bytes && done > 0;) {
      const size_t n = std::min(done, bytes - done);
      DHX_CUDA(cudaMemcpy(dst + done, dst, n, cudaMemcpyDeviceToDevice));
      done += n;
    }
  }
  ~Buf() { cudaFree(p_); }
  Buf(const Buf&) = delete;
  Buf& operator=(const Buf&) = delete;
  template <typename T> T* as() const { return static_cast<T*>(p_); }

 private:
  static uint16_t f32_to_bf16_bits(float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    u += 0x7fffu + ((u >> 16) & 1u);
    return static_cast<uint16_t>(u >> 16);
  }
  void* p_ = nullptr;
  size_t bytes_ = 0;
};

struct OpTime {
  std::string name, cls;
  double s = 0;      // median seconds per call
  double count = 0;  // calls per step
  double flops = 0;  // per call
};

class Bench {
 public:
  explicit Bench(cudaStream_t s) : s_(s) {
    DHX_CUDA(cudaEventCreate(&a_));
    DHX_CUDA(cudaEventCreate(&b_));
  }
  ~Bench() {
    cudaEventDestroy(a_);
    cudaEventDestroy(b_);
  }
  void time(const std::string& name, const std::string& cls, double count, double flops,
            const std::function<void()>& fn, int reps = 10) {
    for (int i = 0; i < 2; ++i) fn();
    std::vector<double> t;
    for (int i = 0; i < reps; ++i) {
      DHX_CUDA(cudaEventRecord(a_, s_));
      fn();
      DHX_CUDA(cudaEventRecord(b_, s_));
      DHX_CUDA(cudaEventSynchronize(b_));
      float ms = 0;
      DHX_CUDA(cudaEventElapsedTime(&ms, a_, b_));
      t.push_back(ms / 1e3);
    }
    std::sort(t.begin(), t.end());
    ops_.push_back({name, cls, t[t.size() / 2], count, flops});
  }
  const std::vector<OpTime>& ops() const { return ops_; }

 private:
  cudaStream_t s_;
  cudaEvent_t a_, b_;
  std::vector<OpTime> ops_;
};

// The algorithm study (training.gemm_algo): for each of a layer's three GEMMs as the step runs them,
// every answer cuBLASLt's heuristic offers (at most Blas::kTimedCandidates), timed on the same
// operands: the first answer (what the default runs) against the fastest (what `timed` would pick).
std::vector<std::string> g_algo_rows;
void algo_study(Blas& blas, const std::string& op, Blas::Op ta, Blas::Op tb, int64_t M, int64_t N, int64_t K,
                const bf16* A, int64_t lda, const bf16* B, int64_t ldb, float beta, const void* C, int64_t ldc,
                Blas::Out out, cudaStream_t s) {
  const std::vector<double> ms = blas.time_candidates(ta, tb, M, N, K, A, lda, B, ldb, beta, C, ldc, out,
                                                      Blas::kTimedCandidates, 10, s);
  const size_t best = static_cast<size_t>(std::min_element(ms.begin(), ms.end()) - ms.begin());
  const double f = 2.0 * M * N * K;
  // ms: the heuristic's answers, then Blas::kSplitKVariants split-K forms of its first (Gemm.h).
  const size_t answers = ms.size() - Blas::kSplitKVariants;
  auto list = [](auto first, auto last) {
    std::string all;
    for (auto it = first; it != last; ++it) all += fmt::format("{}{:.5g}", all.empty() ? "" : ",", std::isfinite(*it) ? *it : -1.0);
    return all;
  };
  std::printf("  algorithms %-22s M=%ld N=%ld K=%ld: heuristic's first %.4f ms (%.0f TFLOP/s), fastest %.4f ms "
              "(%s %zu, %.0f TFLOP/s)\n",
              op.c_str(), static_cast<long>(M), static_cast<long>(N), static_cast<long>(K), ms[0], f / ms[0] / 1e9,
              ms[best], best < answers ? "answer" : "split-K variant", best < answers ? best : best - answers,
              f / ms[best] / 1e9);
  g_algo_rows.push_back(fmt::format("{{\"op\":\"{}\",\"m\":{},\"n\":{},\"k\":{},\"first_ms\":{:.5g},"
                                    "\"fastest_ms\":{:.5g},\"fastest_answer\":{},\"answers_ms\":[{}],"
                                    "\"split_k_parts\":[{}],\"split_k_ms\":[{}]}}",
                                    op, M, N, K, ms[0], ms[best], best, list(ms.begin(), ms.begin() + answers),
                                    fmt::join(Blas::kSplitKParts, ","), list(ms.begin() + answers, ms.end())));
}

// The SMs a Blas plans for (an SM partition's, else the device's): Blas::wgrad_parts's argument.
int info_sms(const Blas& blas) {
  return blas.sm_count_target() > 0 ? blas.sm_count_target() : device_info(blas.device()).sms;
}

// One linear layer of the step: forward, data gradient, weight gradient (+ bias) at N rows.
void linear_ops(Bench& b, Blas& blas, const std::string& name, int64_t N, int64_t I, int64_t O, bool bias,
                double per_step, cudaStream_t s) {
  Buf x(N * I * 2, 1), w(O * I * 2, 2), y(N * O * 2, 3), bb(O * 2, 4), dw(O * I * 4, 5), db(O * 4, 6);
  const double f = 2.0 * N * I * O;
  b.time(name + " fwd", "gemm", per_step, f,
         [&] { blas.linear_fwd(x.as<bf16>(), w.as<bf16>(), bias ? bb.as<bf16>() : nullptr, y.as<bf16>(), N, I, O, s); });
  b.time(name + " dgrad", "gemm", per_step, f,
         [&] { blas.linear_bwd_data(y.as<bf16>(), w.as<bf16>(), x.as<bf16>(), N, I, O, Accumulate::kNo, s); });
  // The weight gradient as the step runs it (the partials form where Blas::wgrad_parts cuts it:
  // training.wgrad_gemm = auto), then the direct form (one GEMM adding into dw: what ran before
  // 2026-11-29) as a study row, so one call says what the partials gain.
  const int parts = blas.wgrad() == Blas::Wgrad::kPartials ? Blas::wgrad_parts(N, I, O, info_sms(blas)) : 1;
  if (parts > 1) std::printf("  %s wgrad: %d partials\n", name.c_str(), parts);
  b.time(name + " wgrad", "gemm", per_step, f, [&] {
    blas.linear_bwd_weight(y.as<bf16>(), x.as<bf16>(), dw.as<float>(), bias ? db.as<float>() : nullptr, N, I, O, s);
  });
  if (parts > 1) {
    const Blas::Wgrad was = blas.wgrad();
    blas.set_wgrad(Blas::Wgrad::kDirect);
    b.time(name + " wgrad direct", "study", per_step, f, [&] {
      blas.linear_bwd_weight(y.as<bf16>(), x.as<bf16>(), dw.as<float>(), bias ? db.as<float>() : nullptr, N, I, O, s);
    });
    blas.set_wgrad(was);
  }
  // The weight gradient's GEMM in two other forms (class "study", outside the sums): what cuBLASLt
  // picks for an fp32 output written (beta 0, to be added to the gradient after) and for a bf16
  // output (PyTorch autocast's form, its gradient rounded to bf16 before the fp32 sum). The
  // step's form above accumulates into fp32 (beta 1); at GPT-2's few output tiles it runs at
  // 150-440 TFLOP/s where PyTorch's cuBLAS runs the same shapes at 520-720 (2026-11-27).
  // The same three GEMMs as Blas's linear_* issue them (Gemm.cu), for the algorithm study.
  algo_study(blas, name + " fwd", Blas::Op::kN, Blas::Op::kT, N, O, I, x.as<bf16>(), I, w.as<bf16>(), I, 0.0f,
             y.as<bf16>(), O, Blas::Out::kBf16, s);
  algo_study(blas, name + " dgrad", Blas::Op::kN, Blas::Op::kN, N, I, O, y.as<bf16>(), O, w.as<bf16>(), I, 0.0f,
             x.as<bf16>(), I, Blas::Out::kBf16, s);
  algo_study(blas, name + " wgrad", Blas::Op::kT, Blas::Op::kN, O, I, N, y.as<bf16>(), O, x.as<bf16>(), I, 1.0f,
             dw.as<float>(), I, Blas::Out::kF32, s);
  Buf w16(O * I * 2, 12);
  b.time(name + " wgrad f32 beta0", "study", per_step, f, [&] {
    blas.gemm(Blas::Op::kT, Blas::Op::kN, O, I, N, 1.0f, y.as<bf16>(), O, x.as<bf16>(), I, 0.0f, dw.as<float>(), I,
              Blas::Out::kF32, nullptr, s);
  });
  b.time(name + " wgrad bf16 beta0", "study", per_step, f, [&] {
    blas.gemm(Blas::Op::kT, Blas::Op::kN, O, I, N, 1.0f, y.as<bf16>(), O, x.as<bf16>(), I, 0.0f, w16.as<bf16>(), I,
              Blas::Out::kBf16, nullptr, s);
  });
}

// The epilogue study (GPT-2's MLP and residual adds fused into cuBLASLt's epilogues: Gemm.h's
// linear_gelu, linear_dgrad_gelu, linear_residual), on the step's shapes: each unfused pair as the
// step runs it (the GEMM, then the pointwise kernel reading its output back) as a row "X", and the
// fused form as "X fused" (both class "study"). A fused form that cuBLASLt cannot run falls back to
// the pair (said on a line; its row then times the pair again).
void epilogue_study(Bench& b, Blas& blas, const Model& m, int64_t N, cudaStream_t s) {
  const int64_t C = m.C, F = m.F;
  const double L = static_cast<double>(m.L);
  Buf x(N * C * 2, 71), wfc(F * C * 2, 72), bfc(F * 2, 73), act(N * F * 2, 74), pre(N * F * 2, 75),
      wproj(C * F * 2, 76), dy(N * C * 2, 77), dpre(N * F * 2, 78), da(N * F * 2, 79), h(N * F * 2, 80),
      wout(C * C * 2, 81), b16(C * 2, 82), b32(C * 4, 83), skip(N * C * 2, 84), mo(N * C * 2, 85), y(N * C * 2, 86);
  auto note = [](const char* what, Path p) {
    if (p == Path::kUnfused) std::printf("  epilogue study: %s fell back to the unfused pair (no cuBLASLt algorithm)\n", what);
  };
  // mlp.fc: pre = x wfc^T + b, act = gelu(pre).
  const double ffc = 2.0 * N * C * F;
  b.time("fc fwd+gelu", "study", L, ffc, [&] {
    blas.linear_fwd(x.as<bf16>(), wfc.as<bf16>(), bfc.as<bf16>(), pre.as<bf16>(), N, C, F, s);
    gelu_fwd(pre.as<bf16>(), act.as<bf16>(), N * F, s);
  });
  note("fc fwd+gelu", linear_gelu(blas, x.as<bf16>(), wfc.as<bf16>(), bfc.as<bf16>(), act.as<bf16>(), pre.as<bf16>(),
                                  N, C, F, s));
  b.time("fc fwd+gelu fused", "study", L, ffc, [&] {
    (void)linear_gelu(blas, x.as<bf16>(), wfc.as<bf16>(), bfc.as<bf16>(), act.as<bf16>(), pre.as<bf16>(), N, C, F, s);
  });
  // mlp.proj's data gradient through GELU: dpre = gelu'(pre) (dy wproj), wproj [C, F]. (pre from a
  // real forward above: finite.)
  b.time("proj dgrad+gelu bwd", "study", L, ffc, [&] {
    blas.linear_bwd_data(dy.as<bf16>(), wproj.as<bf16>(), da.as<bf16>(), N, F, C, Accumulate::kNo, s);
    gelu_bwd(da.as<bf16>(), pre.as<bf16>(), dpre.as<bf16>(), N * F, s);
  });
  note("proj dgrad+gelu bwd", linear_dgrad_gelu(blas, dy.as<bf16>(), wproj.as<bf16>(), pre.as<bf16>(), dpre.as<bf16>(),
                                                N, F, C, s));
  b.time("proj dgrad+gelu bwd fused", "study", L, ffc, [&] {
    (void)linear_dgrad_gelu(blas, dy.as<bf16>(), wproj.as<bf16>(), pre.as<bf16>(), dpre.as<bf16>(), N, F, C, s);
  });
  // The residual adds after attn.out (I = C) and mlp.proj (I = F): y = skip + x w^T + bias, the
  // unfused bias fp32 (add_bias), the fused one bf16.
  auto residual = [&](const std::string& name, const bf16* in, const bf16* w, int64_t I) {
    const double f = 2.0 * N * I * C;
    b.time(name + " fwd+residual", "study", L, f, [&] {
      blas.linear_fwd(in, w, nullptr, mo.as<bf16>(), N, I, C, s);
      add_bias(skip.as<bf16>(), mo.as<bf16>(), b32.as<float>(), y.as<bf16>(), N, C, s);
    });
    note((name + " fwd+residual").c_str(), linear_residual(blas, in, w, b16.as<bf16>(), b32.as<float>(),
                                                           skip.as<bf16>(), y.as<bf16>(), N, I, C, s));
    b.time(name + " fwd+residual fused", "study", L, f, [&] {
      (void)linear_residual(blas, in, w, b16.as<bf16>(), b32.as<float>(), skip.as<bf16>(), y.as<bf16>(), N, I, C, s);
    });
  };
  residual("attn out", x.as<bf16>(), wout.as<bf16>(), C);
  residual("proj", h.as<bf16>(), wproj.as<bf16>(), F);
}

bool g_ordered_dq_study = true;  // --ordered-dq on|off

void attention_ops(Bench& b, const Model& m, int64_t B, int64_t T, cudaStream_t s) {
  const int64_t D = m.C / m.H, W = (m.H + 2 * m.Hkv) * D, N = B * T;
  Buf qkv(N * W * 2, 7), o(N * m.C * 2, 8), lse(B * m.H * T * 4, 9), dout(N * m.C * 2, 10), dqkv(N * W * 2, 11);
  const AttnShape sh{B, T, m.H, m.Hkv, D, W, W, m.C};
  const bf16* q = qkv.as<bf16>();
  const bf16* k = q + m.H * D;
  const bf16* v = k + m.Hkv * D;
  bf16* dq = dqkv.as<bf16>();
  bf16* dk = dq + m.H * D;
  bf16* dv = dk + m.Hkv * D;
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  // Causal: half of the T x T scores; forward QK^T and PV (2 GEMMs), backward 5 (as FlashAttention-2 counts).
  const double fwd = 2.0 * 2.0 * B * m.H * T * T * D / 2;
  attention_fwd(q, k, v, o.as<bf16>(), lse.as<float>(), sh, scale, s);  // a real lse for the backward
  b.time("attention fwd", "attention", static_cast<double>(m.L), fwd,
         [&] { attention_fwd(q, k, v, o.as<bf16>(), lse.as<float>(), sh, scale, s); });
  b.time("attention bwd", "attention", static_cast<double>(m.L), 2.5 * fwd, [&] {
    attention_bwd(q, k, v, o.as<bf16>(), lse.as<float>(), dout.as<bf16>(), dq, dk, dv, sh, scale, s);
  });
  // The backward in its other form (Attention.h's AttnBwdForm: whole 64-wide tiles, one block an SM at
  // D = 64; what ran before 2026-11-29), the same bits, as a study row beside the step's (halves).
  const AttnBwdForm was = attention_bwd_form();
  set_attention_bwd_form(was == AttnBwdForm::kHalves ? AttnBwdForm::kWholeTiles : AttnBwdForm::kHalves);
  b.time(was == AttnBwdForm::kHalves ? "attention bwd whole tiles" : "attention bwd halves", "study",
         static_cast<double>(m.L), 2.5 * fwd, [&] {
           attention_bwd(q, k, v, o.as<bf16>(), lse.as<float>(), dout.as<bf16>(), dq, dk, dv, sh, scale, s);
         });
  // The ordered-dQ form (no dQ kernel: 5 products where the others take 7; its first GPU run), unless
  // --ordered-dq off (the device script's choice when its tests did not all pass: a key tile whose
  // turn never comes traps, and a trap ends this process).
  if (g_ordered_dq_study) {
    set_attention_bwd_form(AttnBwdForm::kOrderedDq);
    b.time("attention bwd ordered dq", "study", static_cast<double>(m.L), 2.5 * fwd, [&] {
      attention_bwd(q, k, v, o.as<bf16>(), lse.as<float>(), dout.as<bf16>(), dq, dk, dv, sh, scale, s);
    });
  }
  set_attention_bwd_form(was);
}

// The step's other kernels (norms, activations, residual adds, RoPE, embedding, the fused
// cross-entropy, AdamW and the gradient norm), on the step's shapes.
void rest_ops(Bench& b, const Model& m, int64_t B, int64_t T, cudaStream_t s) {
  const int64_t N = B * T, C = m.C, D = C / m.H, W = (m.H + 2 * m.Hkv) * D, L = m.L;
  const int64_t F = m.F, Vp = (m.V + 63) / 64 * 64;
  const double Ld = static_cast<double>(L);
  Buf x(N * C * 2, 21), y(N * C * 2, 22), dy(N * C * 2, 23), g(C * 4, 24), bb(C * 4, 25), stat(N * 4, 26),
      stat2(N * 4, 27), dg(C * 4, 28), db(C * 4, 29), res(N * C * 2, 40);
  // The norms' backward as the step runs it (CudaOps.cc): the residual stream's gradient added in the
  // same pass (2L of the 2L + 1 calls have one; timed with it), the old form -- the backward, then
  // the add -- as a study row.
  // Norm statistics from a real forward, so the backward reads finite values.
  if (m.llama) {
    rmsnorm_fwd(x.as<bf16>(), g.as<float>(), y.as<bf16>(), stat.as<float>(), N, C, 1e-5f, s);
    b.time("rmsnorm fwd", "rest", 2 * Ld + 1, 0,
           [&] { rmsnorm_fwd(x.as<bf16>(), g.as<float>(), y.as<bf16>(), stat.as<float>(), N, C, 1e-5f, s); });
    b.time("rmsnorm bwd", "rest", 2 * Ld + 1, 0, [&] {
      rmsnorm_bwd(dy.as<bf16>(), x.as<bf16>(), g.as<float>(), stat.as<float>(), y.as<bf16>(), dg.as<float>(), N, C, s,
                  res.as<bf16>());
    });
    b.time("rmsnorm bwd, residual added after", "study", 2 * Ld + 1, 0, [&] {
      rmsnorm_bwd(dy.as<bf16>(), x.as<bf16>(), g.as<float>(), stat.as<float>(), y.as<bf16>(), dg.as<float>(), N, C, s);
      add_inplace(y.as<bf16>(), res.as<bf16>(), N * C, s);
    });
    // The backward's two-kernel form (what rmsnorm_bwd ran before the fused pass, 2026-11-28).
    b.time("rmsnorm bwd two-kernel", "study", 2 * Ld + 1, 0, [&] {
      norm_bwd_two_kernel(dy.as<bf16>(), x.as<bf16>(), g.as<float>(), nullptr, stat.as<float>(), y.as<bf16>(),
                          dg.as<float>(), nullptr, N, C, false, s);
    });
  } else {
    layernorm_fwd(x.as<bf16>(), g.as<float>(), bb.as<float>(), y.as<bf16>(), stat.as<float>(), stat2.as<float>(), N, C,
                  1e-5f, s);
    b.time("layernorm fwd", "rest", 2 * Ld + 1, 0, [&] {
      layernorm_fwd(x.as<bf16>(), g.as<float>(), bb.as<float>(), y.as<bf16>(), stat.as<float>(), stat2.as<float>(), N,
                    C, 1e-5f, s);
    });
    b.time("layernorm bwd", "rest", 2 * Ld + 1, 0, [&] {
      layernorm_bwd(dy.as<bf16>(), x.as<bf16>(), g.as<float>(), stat.as<float>(), stat2.as<float>(), y.as<bf16>(),
                    dg.as<float>(), db.as<float>(), N, C, s, res.as<bf16>());
    });
    b.time("layernorm bwd, residual added after", "study", 2 * Ld + 1, 0, [&] {
      layernorm_bwd(dy.as<bf16>(), x.as<bf16>(), g.as<float>(), stat.as<float>(), stat2.as<float>(), y.as<bf16>(),
                    dg.as<float>(), db.as<float>(), N, C, s);
      add_inplace(y.as<bf16>(), res.as<bf16>(), N * C, s);
    });
    b.time("layernorm bwd two-kernel", "study", 2 * Ld + 1, 0, [&] {
      norm_bwd_two_kernel(dy.as<bf16>(), x.as<bf16>(), g.as<float>(), stat.as<float>(), stat2.as<float>(),
                          y.as<bf16>(), dg.as<float>(), db.as<float>(), N, C, true, s);
    });
  }
  // Residual adds: two per layer forward (the backward's two are in the norms' backward since
  // 2026-11-28; the forward's in the GEMM epilogue where fused: the epilogue study).
  b.time("residual add", "rest", 2 * Ld, 0, [&] { add(x.as<bf16>(), dy.as<bf16>(), y.as<bf16>(), N * C, s); });
  if (m.llama) {
    Buf gu(N * 2 * F * 2, 30), h(N * F * 2, 31), dgu(N * 2 * F * 2, 32), qkv(N * W * 2, 33);
    b.time("swiglu fwd", "rest", Ld, 0, [&] { swiglu_fwd(gu.as<bf16>(), h.as<bf16>(), N, F, s); });
    b.time("swiglu bwd", "rest", Ld, 0, [&] { swiglu_bwd(h.as<bf16>(), gu.as<bf16>(), dgu.as<bf16>(), N, F, s); });
    // RoPE on the q and k heads of the packed qkv rows (H + Hkv heads of D at row stride W).
    b.time("rope fwd", "rest", Ld, 0, [&] { rope_fwd(qkv.as<bf16>(), B, T, m.H + m.Hkv, D, W, 0, 500000.0, s); });
    b.time("rope bwd", "rest", Ld, 0, [&] { rope_bwd(qkv.as<bf16>(), B, T, m.H + m.Hkv, D, W, 0, 500000.0, s); });
  } else {
    Buf hx(N * F * 2, 34), hy(N * F * 2, 35);
    b.time("gelu fwd", "rest", Ld, 0, [&] { gelu_fwd(hx.as<bf16>(), hy.as<bf16>(), N * F, s); });
    b.time("gelu bwd", "rest", Ld, 0, [&] { gelu_bwd(hy.as<bf16>(), hx.as<bf16>(), hy.as<bf16>(), N * F, s); });
  }
  {
    Buf tok(N * 4, 0), wte(m.V * C * 2, 36), wpe(T * C * 2, 37), dwte(m.V * C * 4, 38), dwpe(T * C * 4, 39);
    std::vector<int32_t> t(static_cast<size_t>(N));
    std::mt19937 r(5);
    for (auto& v : t) v = static_cast<int32_t>(r() % static_cast<uint32_t>(m.V));
    DHX_CUDA(cudaMemcpy(tok.as<int32_t>(), t.data(), t.size() * 4, cudaMemcpyHostToDevice));
    const bf16* pe = m.llama ? nullptr : wpe.as<bf16>();
    float* dpe = m.llama ? nullptr : dwpe.as<float>();
    b.time("embedding fwd", "rest", 1, 0,
           [&] { embedding_fwd(tok.as<int32_t>(), wte.as<bf16>(), pe, y.as<bf16>(), B, T, C, m.V, 0, s); });
    b.time("embedding bwd", "rest", 1, 0,
           [&] { embedding_bwd(tok.as<int32_t>(), dy.as<bf16>(), dwte.as<float>(), dpe, B, T, C, m.V, 0, s); });
    // As the step runs it (runtime/CudaOps.cc): over the padded LM head's logits [N, Vp], in place.
    Buf logits(N * Vp * 2, 40), losses(N * 4, 41);
    b.time("cross-entropy", "rest", 1, 0, [&] {
      cross_entropy_fwd_bwd_strided(logits.as<bf16>(), tok.as<int32_t>(), losses.as<float>(), logits.as<bf16>(),
                                    1.0f / static_cast<float>(N), N, m.V, Vp, s);
    });
    // The rows held in registers instead of shared memory (the step's kernel before 2026-11-28).
    b.time("cross-entropy rows in registers", "study", 1, 0, [&] {
      cross_entropy_rows_in_registers(logits.as<bf16>(), tok.as<int32_t>(), losses.as<float>(), logits.as<bf16>(),
                                      1.0f / static_cast<float>(N), N, m.V, Vp, s);
    });
  }
  {
    // AdamW over every parameter (one launch) and the gradient norm before it.
    const int64_t P = m.params();
    Buf p(P * 4, 42), gr(P * 4, 43), mm(P * 8, 44), pb(P * 2, 45), nrm(8, 46);
    DHX_CUDA(cudaMemset(mm.as<float>(), 0, P * 8));
    AdamWParams a{3e-4, 0.9, 0.95, 1e-8, 0.1, 1};
    b.time("grad norm", "rest", 1, 0, [&] { sum_squares(gr.as<float>(), P, nrm.as<double>(), Accumulate::kNo, s); });
    b.time("adamw", "rest", 1, 0, [&] {
      adamw_step(p.as<float>(), gr.as<float>(), mm.as<float>(), mm.as<float>() + P, pb.as<bf16>(), P, a, 1.0f, s);
    });
  }
}

std::string run_model(const Model& m, int64_t B, int64_t T, Blas& blas, cudaStream_t s) {
  const int64_t N = B * T, D = m.C / m.H;
  Bench b(s);
  const double L = static_cast<double>(m.L);
  const bool bias = !m.llama;
  linear_ops(b, blas, "qkv", N, m.C, (m.H + 2 * m.Hkv) * D, bias, L, s);
  linear_ops(b, blas, "attn out", N, m.C, m.C, bias, L, s);
  linear_ops(b, blas, m.llama ? "gate+up" : "fc", N, m.C, m.llama ? 2 * m.F : m.F, bias, L, s);
  linear_ops(b, blas, m.llama ? "down" : "proj", N, m.F, m.C, bias, L, s);
  const int64_t Vp = (m.V + 63) / 64 * 64;  // the head's rows padded: an odd row stride halves cuBLAS's rate
  linear_ops(b, blas, "lm head", N, m.C, Vp, false, 1.0, s);
  // The epilogue study runs the fused forms on a GPU for the first time: a failure there (a cuBLASLt
  // status the fallback does not take) must not lose the step's rows, as the partitions' below.
  if (!m.llama) {
    try {
      epilogue_study(b, blas, m, N, s);
    } catch (const std::exception& e) {
      std::printf("  epilogue study: failed: %s\n", e.what());
    }
  }
  attention_ops(b, m, B, T, s);
  rest_ops(b, m, B, T, s);

  std::string algos;
  for (const std::string& r : g_algo_rows) algos += (algos.empty() ? "" : ",") + r;
  g_algo_rows.clear();
  std::map<std::string, double> cls;
  double total = 0, gemm_flops = 0;
  std::string rows;
  for (const OpTime& o : b.ops()) {
    if (o.cls != "study") {
      cls[o.cls] += o.s * o.count;
      total += o.s * o.count;
      if (o.cls == "gemm") gemm_flops += o.flops * o.count;
    }
    std::printf("  %-18s x%-4.0f %9.3f ms  %7.1f TFLOP/s\n", o.name.c_str(), o.count, o.s * 1e3, o.flops / o.s / 1e12);
    rows += fmt::format("{}{{\"op\":\"{}\",\"class\":\"{}\",\"s\":{:.6g},\"count\":{},\"tflops\":{:.4g}}}",
                        rows.empty() ? "" : ",", o.name, o.cls, o.s, o.count, o.flops / o.s / 1e12);
  }
  std::printf("%-10s B=%ld T=%ld: kernel sum %.2f ms (gemm %.2f, attention %.2f, rest %.2f) -> %.0f tok/s bound; "
              "GEMMs at %.0f TFLOP/s\n",
              m.name.c_str(), static_cast<long>(B), static_cast<long>(T), total * 1e3, cls["gemm"] * 1e3,
              cls["attention"] * 1e3, cls["rest"] * 1e3, static_cast<double>(N) / total, gemm_flops / cls["gemm"] / 1e12);
  return fmt::format("{{\"model\":\"{}\",\"batch\":{},\"seq\":{},\"kernel_sum_s\":{:.6g},\"gemm_s\":{:.6g},"
                     "\"attention_s\":{:.6g},\"rest_s\":{:.6g},\"kernel_sum_tokens_per_s\":{:.6g},"
                     "\"gemm_flops_per_s\":{:.6g},\"ops\":[{}],\"gemm_algorithms\":[{}]}}",
                     m.name, B, T, total, cls["gemm"], cls["attention"], cls["rest"], static_cast<double>(N) / total,
                     gemm_flops / cls["gemm"], rows, algos);
}

// Grouped expert GEMMs (issue 38, item 6: is a published MoE run slower than the simulator's GPU
// presets because grouped GEMMs at small per-expert batches run below the dense rate?). E experts of
// a Mixtral-8x7B-sized first FFN GEMM (I = 4096, O = 14336), r rows each, forward and weight
// gradient (kernels/cuda/Moe.h: one cuBLASLt GEMM per expert), against one dense GEMM of the same
// E*r rows and the same FLOPs; and one skewed load (one expert with `skew` x the mean rows, the
// others sharing the rest) at about the same total. Efficiency = dense time / grouped time.
std::string grouped_gemm_study(Blas& blas, cudaStream_t s) {
  const int64_t E = 8, I = 4096, O = 14336, r_max = 4096;
  Buf x(E * r_max * I * 2, 51), w(E * O * I * 2, 52), y(E * r_max * O * 2, 53), dw(E * O * I * 4, 54);
  std::string rows;
  auto case_ = [&](const std::string& name, std::vector<int32_t> counts) {
    int64_t total = 0;
    for (int32_t c : counts) total += c;
    const double f = 2.0 * static_cast<double>(total) * I * O;
    Bench b(s);
    b.time("grouped fwd", "moe", 1, f,
           [&] { expert_linear_fwd(blas, x.as<bf16>(), w.as<bf16>(), counts.data(), y.as<bf16>(), E, I, O, s); });
    b.time("grouped wgrad", "moe", 1, f, [&] {
      expert_linear_bwd_weight(blas, y.as<bf16>(), x.as<bf16>(), counts.data(), dw.as<float>(), E, I, O, s);
    });
    b.time("dense fwd", "moe", 1, f,
           [&] { blas.linear_fwd(x.as<bf16>(), w.as<bf16>(), nullptr, y.as<bf16>(), total, I, O, s); });
    b.time("dense wgrad", "moe", 1, f, [&] {
      blas.linear_bwd_weight(y.as<bf16>(), x.as<bf16>(), dw.as<float>(), nullptr, total, I, O, s);
    });
    const auto& o = b.ops();
    std::printf("  grouped %-16s rows %6ld: fwd %7.1f TFLOP/s (dense %7.1f, eff %.2f), wgrad %7.1f (dense %7.1f, eff %.2f)\n",
                name.c_str(), static_cast<long>(total), f / o[0].s / 1e12, f / o[2].s / 1e12, o[2].s / o[0].s,
                f / o[1].s / 1e12, f / o[3].s / 1e12, o[3].s / o[1].s);
    rows += fmt::format("{}{{\"case\":\"{}\",\"experts\":{},\"rows\":{},\"fwd_tflops\":{:.4g},\"dense_fwd_tflops\":{:.4g},"
                        "\"fwd_efficiency\":{:.4g},\"wgrad_tflops\":{:.4g},\"dense_wgrad_tflops\":{:.4g},"
                        "\"wgrad_efficiency\":{:.4g}}}",
                        rows.empty() ? "" : ",", name, E, total, f / o[0].s / 1e12, f / o[2].s / 1e12, o[2].s / o[0].s,
                        f / o[1].s / 1e12, f / o[3].s / 1e12, o[3].s / o[1].s);
  };
  for (int64_t r : {64, 128, 256, 512, 1024, 2048, 4096})
    case_(fmt::format("balanced r={}", r), std::vector<int32_t>(static_cast<size_t>(E), static_cast<int32_t>(r)));
  // Skewed: the mean r = 1024, one expert at 2x (2048), the other seven sharing the rest equally.
  {
    const int32_t mean = 1024, big = 2 * mean;
    std::vector<int32_t> c(static_cast<size_t>(E), (static_cast<int32_t>(E) * mean - big) / static_cast<int32_t>(E - 1));
    c[0] = big;
    case_("skew 2x r=1024", c);
  }
  return fmt::format("{{\"shape\":\"E={} I={} O={}\",\"cases\":[{}]}}", E, I, O, rows);
}

// SM partitions (issue 39 item 3: the means Hopper has against SM contention; kernels/cuda/
// SmPartition.h): one large bf16 GEMM (8192^3) timed on the whole GPU; on one half partition
// alone (its rate over the whole GPU's should be about its share of the SMs); on both halves at
// once, each a thread with its own stream and cuBLASLt handle (against the half alone: what the
// halves still share -- memory, L2 -- costs each other); and on two streams of the whole GPU at
// once without partitions (the same pair, the SMs shared by the block scheduler). Per-GEMM times
// by the host clock over `reps` back-to-back GEMMs, the slower thread's, median of 3 runs.
std::string sm_partition_study(const DeviceInfo& info) {
  const int64_t n = 8192;
  const double f = 2.0 * static_cast<double>(n) * n * n;
  const int reps = 20;
  Buf x(n * n * 2, 61), w(n * n * 2, 62), y0(n * n * 2, 63), y1(n * n * 2, 64);
  bf16* ys[2] = {y0.as<bf16>(), y1.as<bf16>()};
  // Seconds per GEMM of `threads` threads at once, thread k in parts[k] (none: the whole GPU).
  auto per_gemm = [&](int threads, const std::vector<std::unique_ptr<SmPartition>>* parts) {
    std::vector<double> runs;
    for (int run = 0; run < 3; ++run) {
      std::latch ready(threads + 1), go(1);
      std::vector<double> secs(static_cast<size_t>(threads));
      std::vector<std::exception_ptr> errs(static_cast<size_t>(threads));
      std::vector<std::thread> ts;
      for (int k = 0; k < threads; ++k)
        ts.emplace_back([&, k] {
          bool arrived = false;
          try {
            SmPartitionScope in(parts ? (*parts)[static_cast<size_t>(k)].get() : nullptr);
            cudaStream_t s = nullptr;
            DHX_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
            {
              Blas blas(0);
              auto gemm = [&] { blas.linear_fwd(x.as<bf16>(), w.as<bf16>(), nullptr, ys[k], n, n, n, s); };
              gemm();
              gemm();
              DHX_CUDA(cudaStreamSynchronize(s));
              arrived = true;
              ready.arrive_and_wait();
              go.wait();
              const double t0 = now_seconds();
              for (int i = 0; i < reps; ++i) gemm();
              DHX_CUDA(cudaStreamSynchronize(s));
              secs[static_cast<size_t>(k)] = (now_seconds() - t0) / reps;
            }
            DHX_CUDA(cudaStreamDestroy(s));
          } catch (...) {  // the others must not wait for this thread at the start line
            errs[static_cast<size_t>(k)] = std::current_exception();
            if (!arrived) ready.count_down();
          }
        });
      ready.arrive_and_wait();
      go.count_down();
      for (auto& t : ts) t.join();
      for (const std::exception_ptr& e : errs)
        if (e) std::rethrow_exception(e);
      runs.push_back(*std::max_element(secs.begin(), secs.end()));
    }
    std::sort(runs.begin(), runs.end());
    return runs[1];
  };
  auto parts = SmPartition::split(0, 2);
  const double full = per_gemm(1, nullptr), half = per_gemm(1, &parts), pair = per_gemm(2, &parts),
               shared = per_gemm(2, nullptr);
  const double share = static_cast<double>(parts[0]->sms()) / info.sms;
  std::printf("  SM partitions: %dx%d SMs of %d; GEMM %ld^3: whole GPU %.1f TFLOP/s, one half alone %.1f (%.2f of "
              "the whole, SM share %.2f), both halves at once %.1f each (%.2f of alone), two streams sharing the "
              "whole GPU %.1f each\n",
              2, parts[0]->sms(), info.sms, static_cast<long>(n), f / full / 1e12, f / half / 1e12, full / half, share,
              f / pair / 1e12, half / pair, f / shared / 1e12);
  return fmt::format("{{\"gemm\":\"{}^3 bf16\",\"device_sms\":{},\"partition_sms\":{},\"whole_tflops\":{:.4g},"
                     "\"half_alone_tflops\":{:.4g},\"half_over_whole\":{:.4g},\"sm_share\":{:.4g},"
                     "\"halves_together_tflops_each\":{:.4g},\"together_over_alone\":{:.4g},"
                     "\"two_streams_whole_tflops_each\":{:.4g}}}",
                     n, info.sms, parts[0]->sms(), f / full / 1e12, f / half / 1e12, full / half, share,
                     f / pair / 1e12, half / pair, f / shared / 1e12);
}

int run(int argc, char** argv) {
  std::string models = "gpt2-124m,llama-1b", batch = "gpt2-124m=16,llama-1b=4";
  int64_t T = 1024;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--models") models = v;
    else if (k == "--batch") batch = v;
    else if (k == "--seq") T = std::stoll(v);
    else if (k == "--ordered-dq" && (v == "on" || v == "off")) g_ordered_dq_study = v == "on";
    else if (k == "--ordered-dq")
      throw ConfigError(fmt::format("--ordered-dq {}: expected on or off (the ordered-dQ attention study)", v));
    else throw ConfigError(fmt::format("unknown flag '{}' (expected --models, --batch, --seq, --ordered-dq)", k));
  }
  require_device(0);
  const DeviceInfo info = device_info(0);
  cudaStream_t s;
  DHX_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  Blas blas(0);
  blas.set_wgrad(Blas::Wgrad::kPartials);  // as the trainer's GPU steps run by default (training.wgrad_gemm = auto)
  // Each model's object also as a line {"model_result":{...}} when it is done, and a model or study
  // that fails is named with its error while the rest still run (exit 1): a later kill or failure
  // keeps what was measured.
  std::string out;
  bool any_failed = false;
  auto error_json = [&](const std::exception& e) {
    any_failed = true;
    return nlohmann::json(std::string(e.what())).dump();
  };
  for (const Model& m : kModels) {
    if (models.find(m.name) == std::string::npos) continue;
    const size_t at = batch.find(m.name + "=");
    const int64_t B = at == std::string::npos ? 4 : std::stoll(batch.substr(at + m.name.size() + 1));
    std::string one;
    try {
      one = json_finite(run_model(m, B, T, blas, s));
    } catch (const std::exception& e) {
      std::printf("%s: failed: %s\n", m.name.c_str(), e.what());
      one = fmt::format("{{\"model\":\"{}\",\"batch\":{},\"error\":{}}}", m.name, B, error_json(e));
    }
    std::printf("{\"model_result\":%s}\n", one.c_str());
    out += (out.empty() ? "" : ",") + one;
  }
  std::string grouped;
  try {
    grouped = json_finite(grouped_gemm_study(blas, s));
  } catch (const std::exception& e) {
    std::printf("  grouped GEMM study: failed: %s\n", e.what());
    grouped = fmt::format("{{\"error\":{}}}", error_json(e));
  }
  DHX_CUDA(cudaStreamDestroy(s));
  // A failure of the partitions (the driver's green contexts) must not lose the results above.
  std::string partitions;
  try {
    partitions = sm_partition_study(info);
  } catch (const std::exception& e) {
    std::printf("  SM partitions: failed: %s\n", e.what());
    partitions = fmt::format("{{\"error\":{}}}", nlohmann::json(std::string(e.what())).dump());
  }
  std::printf("{\"device\":\"%s\",\"models\":[%s],\"grouped_gemm\":%s,\"sm_partitions\":%s}\n", info.name.c_str(),
              out.c_str(), grouped.c_str(), json_finite(partitions).c_str());
  return any_failed ? 1 : 0;
}

}  // namespace
}  // namespace dhelix::cuda

int main(int argc, char** argv) {
  return dhelix::bench_main("dhelix_bench_gpu_kernels", [&] { return dhelix::cuda::run(argc, argv); },
                            dhelix::OnFailure::kReturn);
}
