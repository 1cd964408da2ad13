// bf16 GEMMs through oneDNN's matmul primitive (Bf16.h). The fp32 operands are rounded into
// compact bf16 buffers (per thread, reused) in their stored orientation; the primitive reads them
// through strides (a transposed operand is a column-major matrix) and writes fp32 C with its
// leading dimension, alpha as an output scale and beta as a sum post-op.
#include "kernels/cpu/Bf16.h"

#include <algorithm>
#include <dnnl.hpp>
#include <map>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "base/Error.h"
#include "kernels/cpu/Parallel.h"

namespace dhelix::cpu {

void require_bf16() {
  DHX_CHECK(bf16_support().usable(), ConfigError,
            "bf16 needs a CPU with AMX-BF16 or AVX512-BF16; this one has neither (cpuid: amx_bf16 and avx512_bf16 "
            "absent)\nhint: set training.precision = \"fp32\"");
  const std::string why = bf16_matmul_unavailable();
  DHX_CHECK(why.empty(), ConfigError, "bf16 needs oneDNN's bf16 matmul, which cannot run here: {}\nhint: set "
            "training.precision = \"fp32\"", why);
}

void round_to_bf16(const float* src, uint16_t* dst, int64_t n) {
#pragma omp parallel for num_threads(detail::threads_for(n)) schedule(static)
  for (int64_t i = 0; i < n; ++i) dst[i] = to_bf16(src[i]);
}

void widen_bf16(const uint16_t* src, float* dst, int64_t n) {
#pragma omp parallel for num_threads(detail::threads_for(n)) schedule(static)
  for (int64_t i = 0; i < n; ++i) dst[i] = from_bf16(src[i]);
}

namespace {

using dnnl::memory;
using Dims = memory::dims;

struct Key {
  int64_t M, N, K, lda, ldb, ldc;
  bool ta, tb;
  float alpha, beta;
  bool bias;  // an fp32 row vector [N] added to every row of C in the primitive's epilogue
  bool operator<(const Key& o) const {
    return std::tie(M, N, K, lda, ldb, ldc, ta, tb, alpha, beta, bias) <
           std::tie(o.M, o.N, o.K, o.lda, o.ldb, o.ldc, o.ta, o.tb, o.alpha, o.beta, o.bias);
  }
};

struct Prim {
  dnnl::matmul mm;
  memory::desc a, b, c, bias;
};

dnnl::engine& engine() {
  static dnnl::engine e(dnnl::engine::kind::cpu, 0);
  return e;
}

// Per thread (the attention kernel calls from inside its OpenMP region, where oneDNN runs the
// product on the calling thread): no lock, and no primitive executed by two threads at once.
const Prim& primitive(const Key& k) {
  thread_local std::map<Key, Prim> cache;
  if (auto it = cache.find(k); it != cache.end()) return it->second;
  // Operands in their stored orientation: op(A)[M,K] is A[M,K] row-major (strides {lda, 1}), or
  // A[K,M] row-major read transposed (strides {1, lda}); op(B)[K,N] likewise.
  const memory::desc a({k.M, k.K}, memory::data_type::bf16, k.ta ? Dims{1, k.lda} : Dims{k.lda, 1});
  const memory::desc b({k.K, k.N}, memory::data_type::bf16, k.tb ? Dims{1, k.ldb} : Dims{k.ldb, 1});
  const memory::desc c({k.M, k.N}, memory::data_type::f32, Dims{k.ldc, 1});
  dnnl::primitive_attr attr;
  if (k.alpha != 1.0f) attr.set_output_scales(0, {k.alpha});
  if (k.beta != 0.0f) {
    dnnl::post_ops po;
    po.append_sum(k.beta);
    attr.set_post_ops(po);
  }
  const memory::desc bias({1, k.N}, memory::data_type::f32, Dims{k.N, 1});
  const dnnl::matmul::primitive_desc pd(k.bias ? dnnl::matmul::desc(a, b, bias, c) : dnnl::matmul::desc(a, b, c), attr,
                                        engine());
  return cache.emplace(k, Prim{dnnl::matmul(pd), a, b, c, bias}).first->second;
}

}  // namespace

// The CPU may report AMX or AVX512-BF16 while oneDNN is kept from using them (ONEDNN_MAX_CPU_ISA, a
// hypervisor hiding state, an older oneDNN): the primitives are the judge. Every variant the GEMMs
// create (both orientations of each operand, beta 0 and 1, with and without the bias epilogue),
// on a tiny shape, once per process.
std::string bf16_matmul_unavailable() {
  static const std::string why = []() -> std::string {
    if (!bf16_support().usable()) return "the CPU has neither AMX-BF16 nor AVX512-BF16 (cpuid)";
    try {
      for (bool ta : {false, true})
        for (bool tb : {false, true})
          for (float beta : {0.0f, 1.0f})
            for (bool bias : {false, true}) primitive({8, 8, 8, 8, 8, 8, ta, tb, 1.0f, beta, bias});
      return "";
    } catch (const dnnl::error& e) {
      return std::string("oneDNN: ") + e.what();
    }
  }();
  return why;
}

namespace {

// GEMMs with an extent above kChunkAbove run as blocks of kChunk along their largest extent (C's
// rows, C's columns, or the reduction). oneDNN's matmul on plain-layout operands streams the whole
// of A, B and C through the cache per call; on the LM head's shapes (50257-wide, 1024 tokens, 768
// channels) whole calls ran at 250-360 GFLOP/s on this machine's 2 cores and 2048-wide blocks at
// 350-400 (weight gradient 0.32 -> 0.23 s, input gradient 0.28 -> 0.24 s, forward 0.21 -> 0.20 s).
// The layers' own shapes (at most 4 x 768 wide at GPT-2 124M) stay whole calls.
constexpr int64_t kChunk = 2048, kChunkAbove = 4096;

// The rows x cols block of src (leading dimension ld) rounded into dst, compact; rows split over
// the threads (the lm_head's weight alone is 38.6M elements, rounded twice a micro-batch).
void round_block(const float* src, int64_t rows, int64_t cols, int64_t ld, std::vector<uint16_t>& dst) {
  dst.resize(static_cast<size_t>(rows * cols));
#pragma omp parallel for num_threads(detail::threads_for(rows * cols)) schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    const float* s = src + r * ld;
    uint16_t* d = dst.data() + r * cols;
#pragma omp simd
    for (int64_t j = 0; j < cols; ++j) d[j] = to_bf16(s[j]);
  }
}

// The primitive on bf16 operands (bias: an fp32 [N] row added in the epilogue, or null).
void run_matmul(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const uint16_t* A,
                int64_t lda, const uint16_t* B, int64_t ldb, float beta, const float* bias, float* C, int64_t ldc) {
  require_bf16();
  if (M == 0 || N == 0) return;
  const Prim& p = primitive({M, N, K, lda, ldb, ldc, trans_a, trans_b, alpha, beta, bias != nullptr});
  memory am(p.a, engine(), const_cast<uint16_t*>(A)), bm(p.b, engine(), const_cast<uint16_t*>(B)),
      cm(p.c, engine(), C);
  thread_local dnnl::stream s(engine());
  std::unordered_map<int, memory> args = {{DNNL_ARG_SRC, am}, {DNNL_ARG_WEIGHTS, bm}, {DNNL_ARG_DST, cm}};
  if (bias) args.insert({DNNL_ARG_BIAS, memory(p.bias, engine(), const_cast<float*>(bias))});
  p.mm.execute(s, args);
  s.wait();
}

}  // namespace

void gemm_bf16(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
               int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  require_bf16();
  if (M == 0 || N == 0) return;
  if (K == 0) {
    for (int64_t i = 0; i < M; ++i)
      for (int64_t j = 0; j < N; ++j) C[i * ldc + j] = beta == 0.0f ? 0.0f : beta * C[i * ldc + j];
    return;
  }
  thread_local std::vector<uint16_t> b16;
  // Stored shapes: A is [M,K] (or [K,M] transposed), B is [K,N] (or [N,K]).
  round_block(B, trans_b ? N : K, trans_b ? K : N, ldb, b16);
  gemm_bf16(trans_a, trans_b, M, N, K, alpha, A, lda, b16.data(), beta, C, ldc);
}

void gemm_bf16(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
               int64_t lda, const uint16_t* B, float beta, float* C, int64_t ldc) {
  require_bf16();
  if (M == 0 || N == 0) return;
  DHX_CHECK(K > 0, InternalError, "gemm_bf16 with a bf16 operand: K = 0");
  thread_local std::vector<uint16_t> a16;
  round_block(A, trans_a ? K : M, trans_a ? M : K, lda, a16);  // compact: [M,K], or [K,M] when trans_a
  const int64_t lda16 = trans_a ? M : K, ldb = trans_b ? K : N;
  auto a_at = [&](int64_t i, int64_t k) { return a16.data() + (trans_a ? k * M + i : i * K + k); };  // op(A)[i,k]
  auto b_at = [&](int64_t k, int64_t j) { return B + (trans_b ? j * K + k : k * N + j); };          // op(B)[k,j]
  // Blocks along the largest extent only (C's rows before its columns before the reduction on a
  // tie); a block of the reduction after the first adds onto C.
  const int64_t big = std::max({M, N, K});
  const bool split = big > kChunkAbove;
  const int64_t bm = split && big == M ? kChunk : M, bn = split && big == N && big != M ? kChunk : N,
                bk = split && big == K && big != M && big != N ? kChunk : K;
  for (int64_t m0 = 0; m0 < M; m0 += bm)
    for (int64_t n0 = 0; n0 < N; n0 += bn)
      for (int64_t k0 = 0; k0 < K; k0 += bk)
        run_matmul(trans_a, trans_b, std::min(bm, M - m0), std::min(bn, N - n0), std::min(bk, K - k0), alpha,
                   a_at(m0, k0), lda16, b_at(k0, n0), ldb, k0 == 0 ? beta : 1.0f, nullptr, C + m0 * ldc + n0, ldc);
}

void matmul_bf16(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const uint16_t* A,
                 const uint16_t* B, float beta, float* C, int64_t ldc) {
  matmul_bf16(trans_a, trans_b, M, N, K, alpha, A, trans_a ? M : K, B, trans_b ? K : N, beta, C, ldc);
}

void matmul_bf16(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const uint16_t* A,
                 int64_t lda, const uint16_t* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  run_matmul(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, nullptr, C, ldc);
}

void gemm_bf16_bias(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, const float* A, int64_t lda,
                    const float* B, int64_t ldb, const float* bias, float* C, int64_t ldc) {
  require_bf16();
  if (M == 0 || N == 0) return;
  thread_local std::vector<uint16_t> b16;
  round_block(B, trans_b ? N : K, trans_b ? K : N, ldb, b16);
  gemm_bf16_bias(trans_a, trans_b, M, N, K, A, lda, b16.data(), bias, C, ldc);
}

void gemm_bf16_bias(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, const float* A, int64_t lda,
                    const uint16_t* B, const float* bias, float* C, int64_t ldc) {
  require_bf16();
  if (M == 0 || N == 0) return;
  DHX_CHECK(K > 0 && bias != nullptr, InternalError, "gemm_bf16_bias: K = {} or no bias", K);
  thread_local std::vector<uint16_t> a16;
  round_block(A, trans_a ? K : M, trans_a ? M : K, lda, a16);
  run_matmul(trans_a, trans_b, M, N, K, 1.0f, a16.data(), trans_a ? M : K, B, trans_b ? K : N, 0.0f, bias, C, ldc);
}

}  // namespace dhelix::cpu
