// GEMM and the linear layer built on it: wrappers over OpenBLAS cblas_{s,d}gemm, row-major.
// Weights are [out, in] as in torch.nn.Linear, so the forward multiplies by w^T.
// Threading: OpenBLAS always runs single-threaded (Threads.cc); a large gemm() is cut into
// num_threads() slabs of C (rows or columns, whichever extent is larger, in multiples of
// kSlabAlign) and each OpenMP thread runs one serial BLAS call on its slab. So one thread pool
// serves GEMMs and the elementwise kernels (two pools spinning against each other on a loaded
// machine cost more than the GEMMs gain), and every C element is one serial BLAS dot-product
// order fixed by the thread count: bitwise reproducible. Inside a parallel region (attention
// tiles) gemm() is one serial call. Not here: any GEMM kernel of our own. The linear layer's GEMMs
// go to gemm_bf16 (Bf16.h) when called with GemmPrecision::kBf16.
#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <type_traits>

#include "base/Error.h"
#include "kernels/cpu/Bf16.h"
#include "kernels/cpu/Kernels.h"
#include "kernels/cpu/Parallel.h"

namespace dhelix::cpu {
namespace {

void blas_gemm(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int64_t M, int64_t N, int64_t K, float alpha,
               const float* A, int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  cblas_sgemm(CblasRowMajor, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}
void blas_gemm(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int64_t M, int64_t N, int64_t K, double alpha,
               const double* A, int64_t lda, const double* B, int64_t ldb, double beta, double* C, int64_t ldc) {
  cblas_dgemm(CblasRowMajor, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

// Below this many multiply-adds a GEMM stays on one thread (a fork costs more than it saves).
constexpr int64_t kMinParallelMacs = int64_t{1} << 21;
// Slab extents are multiples of this: whole micro-kernel row tiles of every OpenBLAS sgemm kernel
// measured (Haswell and Zen tile 24 rows, SkylakeX 16, Prescott 8), so slabbing over threads keeps
// each element's summation, and whole 64-byte lines per thread.
constexpr int64_t kSlabAlign = 96;

}  // namespace

template <typename T>
void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, T alpha, const T* A, int64_t lda,
          const T* B, int64_t ldb, T beta, T* C, int64_t ldc) {
  if (M == 0 || N == 0) return;
  if (K == 0) {  // C = beta * C; BLAS would reject lda < 1 here
    for (int64_t i = 0; i < M; ++i)
      for (int64_t j = 0; j < N; ++j) C[i * ldc + j] = beta == T(0) ? T(0) : beta * C[i * ldc + j];
    return;
  }
  const CBLAS_TRANSPOSE ta = trans_a ? CblasTrans : CblasNoTrans, tb = trans_b ? CblasTrans : CblasNoTrans;
  const int nt = num_threads();  // the first use also makes OpenBLAS serial
  const int64_t split = std::max(M, N);
  const int64_t slabs = std::min<int64_t>(nt, (split + kSlabAlign - 1) / kSlabAlign);
  if (slabs < 2 || omp_in_parallel() || M * N * K < kMinParallelMacs) {
    blas_gemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    return;
  }
  // Slab s covers [s*len, min(split, (s+1)*len)) of the split extent, len a multiple of kSlabAlign.
  const int64_t len = ((split + slabs - 1) / slabs + kSlabAlign - 1) / kSlabAlign * kSlabAlign;
  const bool by_rows = M >= N;
#pragma omp parallel for num_threads(static_cast<int>(slabs)) schedule(static, 1)
  for (int64_t s = 0; s < slabs; ++s) {
    const int64_t lo = s * len, n = std::min(split, lo + len) - lo;
    if (n <= 0) continue;
    if (by_rows)  // rows [lo, lo+n) of C and op(A): A[lo,:] or, transposed, column lo of A[K,M]
      blas_gemm(ta, tb, n, N, K, alpha, trans_a ? A + lo : A + lo * lda, lda, B, ldb, beta, C + lo * ldc, ldc);
    else  // columns [lo, lo+n) of C and op(B): column lo of B[K,N] or, transposed, row lo of B[N,K]
      blas_gemm(ta, tb, M, n, K, alpha, A, lda, trans_b ? B + lo * ldb : B + lo, ldb, beta, C + lo, ldc);
  }
}

namespace {
// The linear layer's GEMMs: bf16 for float when the precision says so (Bf16.h).
template <typename T>
void linear_gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, const T* A, int64_t lda, const T* B,
                 int64_t ldb, T beta, T* C, int64_t ldc, GemmPrecision p) {
  if constexpr (std::is_same_v<T, float>) {
    if (p == GemmPrecision::kBf16) {
      gemm_bf16(trans_a, trans_b, M, N, K, 1.0f, A, lda, B, ldb, beta, C, ldc);
      return;
    }
  }
  gemm<T>(trans_a, trans_b, M, N, K, T(1), A, lda, B, ldb, beta, C, ldc);
}
}  // namespace

template <typename T>
void linear_fwd(const T* x, const T* w, const T* b, T* y, int64_t N, int64_t I, int64_t O, GemmPrecision p) {
  if constexpr (std::is_same_v<T, float>) {
    if (b != nullptr && p == GemmPrecision::kBf16 && N > 0 && I > 0) {
      gemm_bf16_bias(false, true, N, O, I, x, I, w, I, b, y, O);  // the bias in the GEMM's epilogue
      return;
    }
  }
  T beta = T(0);
  if (b != nullptr) {  // y rows = b, then the GEMM accumulates onto them (one write pass, no re-read)
#pragma omp parallel for num_threads(detail::threads_for(N * O)) schedule(static)
    for (int64_t n = 0; n < N; ++n) std::copy(b, b + O, y + n * O);
    beta = T(1);
  }
  // y[N,O] = x[N,I] @ w[O,I]^T (+ y)
  linear_gemm<T>(false, true, N, O, I, x, I, w, I, beta, y, O, p);
}

template <typename T>
void linear_bwd_data(const T* dy, const T* w, T* dx, int64_t N, int64_t I, int64_t O, Accumulate acc,
                     GemmPrecision p) {
  // dx[N,I] = dy[N,O] @ w[O,I]
  linear_gemm<T>(false, false, N, I, O, dy, O, w, I, acc == Accumulate::kYes ? T(1) : T(0), dx, I, p);
}

namespace {
// db[o0, o1) += sum_n dy[n, o0:o1] (dy rows of stride O). Threads own column blocks (no races),
// rows stream through in order.
template <typename T> void bias_grad_cols(const T* dy, T* db, int64_t N, int64_t O, int64_t o0, int64_t o1) {
  const int64_t W = o1 - o0;
  const int nt = detail::threads_for(N * W);
  const int64_t block = std::max<int64_t>(16, (W + nt - 1) / nt);
#pragma omp parallel for num_threads(nt) schedule(static)
  for (int64_t b0 = o0; b0 < o1; b0 += block) {
    const int64_t b1 = std::min(o1, b0 + block);
    for (int64_t n = 0; n < N; ++n) {
      const T* row = dy + n * O;
#pragma omp simd
      for (int64_t o = b0; o < b1; ++o) db[o] += row[o];
    }
  }
}
}  // namespace

template <typename T>
void linear_bwd_weight_rows(const T* dy, const T* x, T* dw, T* db, int64_t N, int64_t I, int64_t O, int64_t o0,
                            int64_t o1, GemmPrecision p) {
  DHX_ASSERT(0 <= o0 && o0 <= o1 && o1 <= O, "weight rows [{}, {}) outside [0, {})", o0, o1, O);
  // dw[o0:o1, I] += dy[N, o0:o1]^T @ x[N, I]: op(A) rows are columns o0.. of dy (leading dim O)
  linear_gemm<T>(true, false, o1 - o0, I, N, dy + o0, O, x, I, T(1), dw + o0 * I, I, p);
  if (db != nullptr) bias_grad_cols<T>(dy, db, N, O, o0, o1);
}

void linear_fwd_bf16w(const float* x, const uint16_t* w, const float* b, float* y, int64_t N, int64_t I, int64_t O) {
  if (N == 0 || O == 0) return;
  DHX_CHECK(I > 0, InternalError, "linear_fwd_bf16w: I = 0");
  if (b != nullptr)
    gemm_bf16_bias(false, true, N, O, I, x, I, w, b, y, O);
  else
    gemm_bf16(false, true, N, O, I, 1.0f, x, I, w, 0.0f, y, O);
}

void linear_bwd_data_bf16w(const float* dy, const uint16_t* w, float* dx, int64_t N, int64_t I, int64_t O,
                           Accumulate acc) {
  if (N == 0 || I == 0) return;
  gemm_bf16(false, false, N, I, O, 1.0f, dy, O, w, acc == Accumulate::kYes ? 1.0f : 0.0f, dx, I);
}

void linear_bwd_weight_rows_bf16x(const float* dy, const uint16_t* x, float* dw, float* db, int64_t N, int64_t I,
                                  int64_t O, int64_t o0, int64_t o1) {
  DHX_ASSERT(0 <= o0 && o0 <= o1 && o1 <= O, "weight rows [{}, {}) outside [0, {})", o0, o1, O);
  gemm_bf16(true, false, o1 - o0, I, N, 1.0f, dy + o0, O, x, 1.0f, dw + o0 * I, I);
  if (db != nullptr) bias_grad_cols<float>(dy, db, N, O, o0, o1);
}

template <typename T>
void linear_bwd_weight(const T* dy, const T* x, T* dw, T* db, int64_t N, int64_t I, int64_t O, GemmPrecision p) {
  linear_bwd_weight_rows<T>(dy, x, dw, db, N, I, O, 0, O, p);
}

template <typename T> void bias_grad(const T* dy, T* db, int64_t N, int64_t O) { bias_grad_cols<T>(dy, db, N, O, 0, O); }

#define DHX_INSTANTIATE(T)                                                                                   \
  template void gemm<T>(bool, bool, int64_t, int64_t, int64_t, T, const T*, int64_t, const T*, int64_t, T, T*, \
                        int64_t);                                                                            \
  template void linear_fwd<T>(const T*, const T*, const T*, T*, int64_t, int64_t, int64_t, GemmPrecision);   \
  template void linear_bwd_data<T>(const T*, const T*, T*, int64_t, int64_t, int64_t, Accumulate, GemmPrecision); \
  template void linear_bwd_weight<T>(const T*, const T*, T*, T*, int64_t, int64_t, int64_t, GemmPrecision); \
  template void linear_bwd_weight_rows<T>(const T*, const T*, T*, T*, int64_t, int64_t, int64_t, int64_t, int64_t, \
                                          GemmPrecision);                                                    \
  template void bias_grad<T>(const T*, T*, int64_t, int64_t);
DHX_INSTANTIATE(float)
DHX_INSTANTIATE(double)
#undef DHX_INSTANTIATE

}  // namespace dhelix::cpu
