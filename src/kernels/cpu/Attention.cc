// Causal self-attention with grouped-query heads, flash-attention style on the CPU: queries and
// keys are cut into kTile x kTile tiles; the forward keeps a running max / sum per query row
// (online softmax) and saves only lse[B, H, T]; the backward recomputes each score tile from q, k
// and lse. Tile products go through gemm() (OpenBLAS). No T x T matrix is ever held.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "base/Error.h"
#include "kernels/cpu/FastMath.h"
#include "kernels/cpu/Kernels.h"
#include "kernels/cpu/Parallel.h"

namespace dhelix::cpu {
namespace {

// 64 x 64 x 64 tile products stay under OpenBLAS's threshold for threading a single call.
constexpr int64_t kTile = 64;

void check_dims(const AttnDims& d) {
  DHX_CHECK(d.B >= 0 && d.T >= 0 && d.D > 0 && d.H > 0 && d.Hkv > 0 && d.H % d.Hkv == 0, ConfigError,
            "attention: bad dims B={} T={} H={} Hkv={} D={} (need H % Hkv == 0)", d.B, d.T, d.H, d.Hkv, d.D);
  DHX_CHECK(d.q_stride >= d.H * d.D && d.o_stride >= d.H * d.D && d.kv_stride >= d.Hkv * d.D, ConfigError,
            "attention: strides q={} o={} kv={} too small for H={} Hkv={} D={}", d.q_stride, d.o_stride,
            d.kv_stride, d.H, d.Hkv, d.D);
}

// Number of valid keys in row r of tile (qi, kj): with equal tile origins only the diagonal tile
// is cut, keys c <= r.
inline int64_t valid_keys(int64_t qi, int64_t kj, int64_t r, int64_t bk) {
  return qi == kj ? std::min(bk, r + 1) : bk;
}

}  // namespace

template <typename T> void attention_fwd(const T* q, const T* k, const T* v, T* o, T* lse, const AttnDims& d, T scale) {
  check_dims(d);
  const int64_t Tn = d.T, D = d.D, H = d.H, G = d.H / d.Hkv;
  const int64_t nq = (Tn + kTile - 1) / kTile;
  const int64_t BH = d.B * H, items = BH * nq;
  const int nt = detail::threads_for(BH * Tn * D);
#pragma omp parallel num_threads(nt)
  {
    std::vector<T> S(kTile * kTile), acc(kTile * D), mrow(kTile), lrow(kTile);  // per thread
    // Largest query tiles (most key tiles) first, for load balance under dynamic scheduling.
#pragma omp for schedule(dynamic, 1)
    for (int64_t it = 0; it < items; ++it) {
      const int64_t qi = nq - 1 - it / BH, bh = it % BH;
      const int64_t b = bh / H, h = bh % H, g = h / G;
      const int64_t t0 = qi * kTile, bq = std::min(kTile, Tn - t0);
      const T* Q = q + (b * Tn + t0) * d.q_stride + h * D;  // [bq, D], ld q_stride
      std::fill(acc.begin(), acc.end(), T(0));
      std::fill(mrow.begin(), mrow.end(), -std::numeric_limits<T>::infinity());
      std::fill(lrow.begin(), lrow.end(), T(0));
      for (int64_t kj = 0; kj <= qi; ++kj) {
        const int64_t s0 = kj * kTile, bk = std::min(kTile, Tn - s0);
        const T* K = k + (b * Tn + s0) * d.kv_stride + g * D;  // [bk, D], ld kv_stride
        const T* V = v + (b * Tn + s0) * d.kv_stride + g * D;
        // S[bq, bk] = scale Q K^T
        gemm<T>(false, true, bq, bk, D, scale, Q, d.q_stride, K, d.kv_stride, T(0), S.data(), kTile);
        for (int64_t r = 0; r < bq; ++r) {
          T* srow = S.data() + r * kTile;
          const int64_t nv = valid_keys(qi, kj, r, bk);
          T mx = mrow[r];
#pragma omp simd reduction(max : mx)
          for (int64_t c = 0; c < nv; ++c) mx = srow[c] > mx ? srow[c] : mx;
          T sum = 0;
#pragma omp simd reduction(+ : sum)
          for (int64_t c = 0; c < nv; ++c) {
            srow[c] = detail::exp_k<T>(srow[c] - mx);
            sum += srow[c];
          }
          for (int64_t c = nv; c < bk; ++c) srow[c] = T(0);
          // rescale what was accumulated under the old max: exp(m_old - m_new) (0 on the first tile)
          const T corr = kj == 0 ? T(0) : detail::exp_k<T>(mrow[r] - mx);
          lrow[r] = lrow[r] * corr + sum;
          mrow[r] = mx;
          if (kj > 0 && corr != T(1)) {
            T* arow = acc.data() + r * D;
#pragma omp simd
            for (int64_t c = 0; c < D; ++c) arow[c] *= corr;
          }
        }
        // acc[bq, D] += P[bq, bk] V[bk, D]
        gemm<T>(false, false, bq, D, bk, T(1), S.data(), kTile, V, d.kv_stride, T(1), acc.data(), D);
      }
      T* L = lse + bh * Tn + t0;
      for (int64_t r = 0; r < bq; ++r) {
        T* orow = o + (b * Tn + t0 + r) * d.o_stride + h * D;
        const T inv = T(1) / lrow[r];
        const T* arow = acc.data() + r * D;
#pragma omp simd
        for (int64_t c = 0; c < D; ++c) orow[c] = arow[c] * inv;
        L[r] = mrow[r] + std::log(lrow[r]);
      }
    }
  }
}

// Per (b, kv head g), serially over key tiles j, the query heads of the group and query tiles i >= j:
//   S = scale Q_i K_j^T,  P = exp(S - lse_i),  dV_j += P^T dO_i,  dP = dO_i V_j^T,
//   dS = scale P (dP - D_i) with D_i = rowsum(dO_i * O_i),  dK_j += dS^T Q_i,  dQ_i += dS K_j.
// One thread owns all of dK, dV (and the group's dQ) for its (b, g): no races, no atomics.
// Parallelism is B * Hkv items.
template <typename T>
void attention_bwd(const T* q, const T* k, const T* v, const T* o, const T* lse, const T* dout, T* dq, T* dk, T* dv,
                   const AttnDims& d, T scale) {
  check_dims(d);
  const int64_t Tn = d.T, D = d.D, H = d.H, Hkv = d.Hkv, G = d.H / d.Hkv;
  const int64_t nq = (Tn + kTile - 1) / kTile;
  const int64_t items = d.B * Hkv;
  const int nt = std::min<int64_t>(detail::threads_for(d.B * H * Tn * D), std::max<int64_t>(items, 1));
#pragma omp parallel num_threads(nt)
  {
    // per thread: P and dP/dS tiles [kTile, kTile], dK/dV accumulators [kTile, D], D_i for the group [G, T]
    std::vector<T> P(kTile * kTile), dS(kTile * kTile), dKacc(kTile * D), dVacc(kTile * D), Di(G * Tn);
#pragma omp for schedule(dynamic, 1)
    for (int64_t it = 0; it < items; ++it) {
      const int64_t b = it / Hkv, g = it % Hkv;
      for (int64_t hh = 0; hh < G; ++hh) {
        const int64_t h = g * G + hh;
        for (int64_t t = 0; t < Tn; ++t) {
          const T* orow = o + (b * Tn + t) * d.o_stride + h * D;
          const T* grow = dout + (b * Tn + t) * d.o_stride + h * D;
          T s = 0;
#pragma omp simd reduction(+ : s)
          for (int64_t c = 0; c < D; ++c) s += orow[c] * grow[c];
          Di[hh * Tn + t] = s;
          std::fill_n(dq + (b * Tn + t) * d.q_stride + h * D, D, T(0));
        }
      }
      for (int64_t kj = 0; kj < nq; ++kj) {
        const int64_t s0 = kj * kTile, bk = std::min(kTile, Tn - s0);
        const T* K = k + (b * Tn + s0) * d.kv_stride + g * D;  // [bk, D], ld kv_stride
        const T* V = v + (b * Tn + s0) * d.kv_stride + g * D;
        std::fill(dKacc.begin(), dKacc.end(), T(0));
        std::fill(dVacc.begin(), dVacc.end(), T(0));
        for (int64_t hh = 0; hh < G; ++hh) {
          const int64_t h = g * G + hh;
          for (int64_t qi = kj; qi < nq; ++qi) {
            const int64_t t0 = qi * kTile, bq = std::min(kTile, Tn - t0);
            const T* Q = q + (b * Tn + t0) * d.q_stride + h * D;  // [bq, D]
            const T* dO = dout + (b * Tn + t0) * d.o_stride + h * D;
            T* dQ = dq + (b * Tn + t0) * d.q_stride + h * D;
            const T* L = lse + (b * H + h) * Tn + t0;
            const T* Dr = Di.data() + hh * Tn + t0;
            gemm<T>(false, true, bq, bk, D, scale, Q, d.q_stride, K, d.kv_stride, T(0), P.data(), kTile);
            gemm<T>(false, true, bq, bk, D, T(1), dO, d.o_stride, V, d.kv_stride, T(0), dS.data(), kTile);
            for (int64_t r = 0; r < bq; ++r) {
              T* prow = P.data() + r * kTile;
              T* srow = dS.data() + r * kTile;
              const int64_t nv = valid_keys(qi, kj, r, bk);
              const T lr = L[r], dr = Dr[r];
#pragma omp simd
              for (int64_t c = 0; c < nv; ++c) {
                prow[c] = detail::exp_k<T>(prow[c] - lr);
                srow[c] = scale * prow[c] * (srow[c] - dr);
              }
              for (int64_t c = nv; c < bk; ++c) prow[c] = srow[c] = T(0);
            }
            // dV_j[bk, D] += P^T dO;  dK_j[bk, D] += dS^T Q;  dQ_i[bq, D] += dS K_j
            gemm<T>(true, false, bk, D, bq, T(1), P.data(), kTile, dO, d.o_stride, T(1), dVacc.data(), D);
            gemm<T>(true, false, bk, D, bq, T(1), dS.data(), kTile, Q, d.q_stride, T(1), dKacc.data(), D);
            gemm<T>(false, false, bq, D, bk, T(1), dS.data(), kTile, K, d.kv_stride, T(1), dQ, d.q_stride);
          }
        }
        for (int64_t r = 0; r < bk; ++r) {
          std::copy_n(dKacc.data() + r * D, D, dk + (b * Tn + s0 + r) * d.kv_stride + g * D);
          std::copy_n(dVacc.data() + r * D, D, dv + (b * Tn + s0 + r) * d.kv_stride + g * D);
        }
      }
    }
  }
}

#define DHX_INSTANTIATE(T)                                                                                  \
  template void attention_fwd<T>(const T*, const T*, const T*, T*, T*, const AttnDims&, T);                 \
  template void attention_bwd<T>(const T*, const T*, const T*, const T*, const T*, const T*, T*, T*, T*,     \
                                 const AttnDims&, T);
DHX_INSTANTIATE(float)
DHX_INSTANTIATE(double)
#undef DHX_INSTANTIATE

}  // namespace dhelix::cpu
