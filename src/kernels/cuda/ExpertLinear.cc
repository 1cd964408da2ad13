// The grouped expert GEMMs (Moe.h): one Blas linear per expert with rows, at the row offset of its
// group; the counts come from the host (fetch_expert_counts, the MoE layer's one host sync). FLOPs
// 2 P I O per call (P = sum of the counts), bytes as E separate cuBLASLt GEMMs. Blas caches an
// algorithm per row count, so the cache grows with the distinct counts seen (at most P per shape);
// each is the heuristic's first answer (Blas::HeuristicOnly: under training.gemm_algo = timed a new
// count would otherwise stop the step to be timed, and a choices file would gain a key per count).
// A device-side grouped GEMM (counts read on the GPU, one launch, no sync) is a later step.
#include "kernels/cuda/Moe.h"

namespace dhelix::cuda {

namespace {
// Expert e's row count, checked (a negative count is a caller's bug, e.g. counts not fetched).
int64_t rows_of(const int32_t* counts_host, int64_t e, const char* what) {
  const int64_t m = counts_host[e];
  DHX_CUDA_ASSERT(m >= 0, what, ": expert ", e, " has a negative row count ", m);
  return m;
}
}  // namespace

void fetch_expert_counts(const int32_t* counts, int32_t* counts_host, int64_t E, cudaStream_t s) {
  DHX_CUDA_ASSERT(E >= 1, "fetch_expert_counts E=", E);
  DHX_CUDA(cudaMemcpyAsync(counts_host, counts, static_cast<size_t>(E) * sizeof(int32_t), cudaMemcpyDeviceToHost, s));
  DHX_CUDA(cudaStreamSynchronize(s));  // this stream only: the grouped GEMMs' shapes need the counts
}

void expert_linear_fwd(Blas& blas, const bf16* x, const bf16* w, const int32_t* counts_host, bf16* y, int64_t E,
                       int64_t I, int64_t O, cudaStream_t s) {
  const Blas::HeuristicOnly heuristic;
  int64_t r = 0;  // first row of expert e
  for (int64_t e = 0; e < E; ++e) {
    const int64_t m = rows_of(counts_host, e, "expert_linear_fwd");
    if (m > 0) blas.linear_fwd(x + r * I, w + e * O * I, nullptr, y + r * O, m, I, O, s);
    r += m;
  }
}

void expert_linear_bwd_data(Blas& blas, const bf16* dy, const bf16* w, const int32_t* counts_host, bf16* dx, int64_t E,
                            int64_t I, int64_t O, cudaStream_t s) {
  const Blas::HeuristicOnly heuristic;
  int64_t r = 0;
  for (int64_t e = 0; e < E; ++e) {
    const int64_t m = rows_of(counts_host, e, "expert_linear_bwd_data");
    if (m > 0) blas.linear_bwd_data(dy + r * O, w + e * O * I, dx + r * I, m, I, O, Accumulate::kNo, s);
    r += m;
  }
}

void expert_linear_bwd_weight(Blas& blas, const bf16* dy, const bf16* x, const int32_t* counts_host, float* dw,
                              int64_t E, int64_t I, int64_t O, cudaStream_t s) {
  const Blas::HeuristicOnly heuristic;
  int64_t r = 0;
  for (int64_t e = 0; e < E; ++e) {
    const int64_t m = rows_of(counts_host, e, "expert_linear_bwd_weight");
    if (m > 0) blas.linear_bwd_weight(dy + r * O, x + r * I, dw + e * O * I, nullptr, m, I, O, s);
    r += m;
  }
}

}  // namespace dhelix::cuda
