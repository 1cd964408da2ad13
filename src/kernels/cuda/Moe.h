// Mixture-of-Experts kernels on the GPU, the twins of kernels/cpu's "Mixture of Experts" section
// (same semantics, same tie rule, same summation orders): softmax top-k routing and its backward,
// the router's statistics, the grouping of the N*k assignments by expert, dispatch/combine (gather
// and gate-weighted sum of bf16 rows) and the grouped expert GEMMs through Blas. Not here: expert
// parallelism's regrouping (moe_ep_regroup) and an own device-side grouped GEMM (later steps).
//
// Precision: router logits, probs, gates and their gradients fp32 ([N,E] and [N,k]: small);
// activations and their gradients bf16; expert weights bf16 (the step's copy) with fp32 gradients
// accumulated; every sum in fp32 (stats in double), rounded once to bf16 where the output is bf16.
// Every kernel is deterministic: fixed summation orders, no floating-point atomics.
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/cuda/Cuda.h"
#include "kernels/cuda/Gemm.h"

namespace dhelix::cuda {

// Whether the k selected probabilities are divided by their sum (Mixtral) or kept as they are.
enum class NormTopk { kNo, kYes };

// The largest expert count moe_group handles (one block, counts in shared memory).
constexpr int64_t kMoeMaxExperts = 256;

// probs[N,E] = softmax(logits[N,E]) per row; expert[N,k] the k largest probabilities, descending
// (ties: the lower expert index first); gate[N,k] those probabilities (/ their sum: NormTopk::kYes).
void moe_route_fwd(const float* logits, float* probs, int32_t* expert, float* gate, int64_t N, int64_t E, int64_t k,
                   NormTopk norm, cudaStream_t s);
// dlogits[N,E] written from dgate[N,k] and aux_dprob[E] (may be null: d loss / d probs[n,e] of the
// load-balancing loss, the same for every token).
void moe_route_bwd(const float* probs, const int32_t* expert, const float* gate, const float* dgate,
                   const float* aux_dprob, float* dlogits, int64_t N, int64_t E, int64_t k, NormTopk norm,
                   cudaStream_t s);
// stats[2E] = [counts[e] | sum_n probs[n,e]] (the sum in double, n ascending, then rounded to fp32).
void moe_route_stats(const float* probs, const int32_t* counts, int64_t N, int64_t E, float* stats, cudaStream_t s);
// Groups the P = N*k assignments a = n*k + j by expert, stable: counts[E]; order[P] the assignments
// sorted by (expert, a); slot[P] its inverse (slot[order[p]] = p). E <= kMoeMaxExperts, every
// expert[a] in [0, E) (moe_route_fwd's output is).
void moe_group(const int32_t* expert, int64_t N, int64_t k, int64_t E, int32_t* counts, int32_t* order, int32_t* slot,
               cudaStream_t s);

// xs[P,C] = x[order[p] / k] (a gather; bitwise copies).
void moe_dispatch(const bf16* x, const int32_t* order, bf16* xs, int64_t P, int64_t k, int64_t C, cudaStream_t s);
// dx[N,C] (+)= sum_j dxs[slot[n*k + j]], j ascending (Accumulate::kYes starts from dx: the CPU
// twin's semantics; kNo from zero); the sum in fp32, rounded once.
void moe_dispatch_bwd(const bf16* dxs, const int32_t* slot, bf16* dx, int64_t N, int64_t k, int64_t C, Accumulate acc,
                      cudaStream_t s);
// y[N,C] = sum_j gate[n,j] * eo[slot[n*k + j]], j ascending, in fp32, rounded once.
void moe_combine(const bf16* eo, const int32_t* slot, const float* gate, bf16* y, int64_t N, int64_t k, int64_t C,
                 cudaStream_t s);
// deo[slot[a]] = gate[a] * dy[a / k] (bf16); dgate[a] = dy[a / k] . eo[slot[a]] (fp32, a fixed-order
// block reduction). Both written, every row of deo (slot is a permutation of [0, N*k)).
void moe_combine_bwd(const bf16* dy, const bf16* eo, const int32_t* slot, const float* gate, bf16* deo, float* dgate,
                     int64_t N, int64_t k, int64_t C, cudaStream_t s);

// ---- grouped expert GEMMs ----
// cuBLASLt needs each expert's row count on the host, so the counts make one trip back:
// counts_host[E] = counts[E] (device), copied on stream s and waited for on s only (never the
// device). This is the MoE layer's one host sync: call it once after moe_group and hand the same
// counts_host to every grouped GEMM of the layer, forward and backward. counts_host should be pinned
// (cudaMallocHost) for a true asynchronous copy; pageable memory works, staged by the driver.
// (A device-side grouped GEMM reading the counts on the GPU, with no sync, is a later step.)
void fetch_expert_counts(const int32_t* counts, int32_t* counts_host, int64_t E, cudaStream_t s);
// Rows of x[P,I] grouped by expert: counts_host[0] rows of expert 0, then counts_host[1] of expert
// 1, ...; w[E*O, I] stacks the experts' [O, I] weights. y[rows of e] = x[rows of e] @ w_e^T.
void expert_linear_fwd(Blas& blas, const bf16* x, const bf16* w, const int32_t* counts_host, bf16* y, int64_t E,
                       int64_t I, int64_t O, cudaStream_t s);
// dx[P,I] written: dx[rows of e] = dy[rows of e] @ w_e.
void expert_linear_bwd_data(Blas& blas, const bf16* dy, const bf16* w, const int32_t* counts_host, bf16* dx, int64_t E,
                            int64_t I, int64_t O, cudaStream_t s);
// acc dw_e[O,I] += dy[rows of e]^T @ x[rows of e] into fp32 gradients dw[E*O, I]; an expert with no
// rows gets nothing (its dw is left bitwise as it was).
void expert_linear_bwd_weight(Blas& blas, const bf16* dy, const bf16* x, const int32_t* counts_host, float* dw,
                              int64_t E, int64_t I, int64_t O, cudaStream_t s);

}  // namespace dhelix::cuda
