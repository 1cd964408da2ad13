// bf16 GEMMs on the CPU (issue 22): operands rounded to bfloat16 (8-bit mantissa, round to nearest
// even), products accumulated in fp32 by oneDNN's matmul primitive (AMX tiles where the CPU has
// them, else AVX512-BF16 dot products), fp32 results. The linear layer's three GEMMs (forward,
// input gradient, weight gradient) and attention's tiles take this path when called with
// GemmPrecision::kBf16 (the run's KernelConfig, from training.precision); everything else stays fp32.
#pragma once
#include <bit>
#include <cstdint>
#include <string>

#include "base/CpuFeatures.h"  // bf16_support()
#include "kernels/cpu/Kernels.h"   // GemmPrecision

namespace dhelix::cpu {

// ConfigError naming the missing CPU feature when the CPU has neither AMX-BF16 nor AVX512-BF16, or
// oneDNN's reason when it cannot create the bf16 matmul (kernel_config asks it for
// GemmPrecision::kBf16; never a silent fallback).
void require_bf16();
// Why the bf16 GEMMs cannot run here ("" when they can): no AMX-BF16 / AVX512-BF16 by cpuid, or
// oneDNN refusing to create the matmul primitives (say ONEDNN_MAX_CPU_ISA=AVX2 holds it below the
// CPU's ISA). Probed once per process on a tiny shape.
std::string bf16_matmul_unavailable();

// fp32 -> bf16, round to nearest even (NaN stays NaN, made quiet); bf16 -> fp32 exactly. Inline
// and branch-free, so that loops over them vectorise: add 0x7fff plus the kept part's lowest bit.
inline uint16_t to_bf16(float x) {
  const uint32_t u = std::bit_cast<uint32_t>(x);
  const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  const uint32_t quiet = (u >> 16) | 0x40u;
  return static_cast<uint16_t>((u & 0x7fffffffu) > 0x7f800000u ? quiet : rounded);
}
inline float from_bf16(uint16_t b) { return std::bit_cast<float>(uint32_t{b} << 16); }
// The same over n elements (communication in bf16: a buffer rounded before it goes on the wire,
// widened when it arrives). Need no bf16 arithmetic from the CPU.
void round_to_bf16(const float* src, uint16_t* dst, int64_t n);
void widen_bf16(const uint16_t* src, float* dst, int64_t n);

// C[M,N] = alpha * op(A) @ op(B) + beta * C, row-major fp32 buffers, computed from the bf16
// roundings of A and B with fp32 accumulation. oneDNN primitives are cached per shape. Needs
// bf16_support().usable() (ConfigError otherwise).
void gemm_bf16(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
               int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc);

// The same with B already in bf16, compact in its stored orientation ([K,N], or [N,K] when
// trans_b): only A is rounded. gemm_bf16 above is this after rounding B, so a B kept in bf16 (a
// saved activation) gives bitwise the result of rounding it here.
void gemm_bf16(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
               int64_t lda, const uint16_t* B, float beta, float* C, int64_t ldc);

// C[M,N] = op(A) @ op(B) + bias (an fp32 [N] row added to every row in the primitive's epilogue:
// the linear layer's forward without a separate pass writing the bias into C).
void gemm_bf16_bias(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, const float* A, int64_t lda,
                    const float* B, int64_t ldb, const float* bias, float* C, int64_t ldc);
// The same with B already in bf16, compact in its stored orientation.
void gemm_bf16_bias(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, const float* A, int64_t lda,
                    const uint16_t* B, const float* bias, float* C, int64_t ldc);

// The oneDNN primitive alone on operands already in bf16, compact in their stored orientation
// (A [M,K] row-major, or [K,M] when trans_a; B [K,N], or [N,K] when trans_b): gemm_bf16 without
// the rounding pass, for measuring the matmul rate.
void matmul_bf16(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const uint16_t* A,
                 const uint16_t* B, float beta, float* C, int64_t ldc);
// The same with leading dimensions (stored rows of A lda apart, of B ldb apart): blocks of larger
// bf16 buffers, as the attention kernel's tiles read them. Safe from several threads at once
// (primitives cached per thread); inside an OpenMP parallel region the product runs on the
// calling thread.
void matmul_bf16(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const uint16_t* A,
                 int64_t lda, const uint16_t* B, int64_t ldb, float beta, float* C, int64_t ldc);

}  // namespace dhelix::cpu
