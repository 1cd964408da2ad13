// Causal self-attention with grouped-query heads, flash-attention style on the CPU: queries and
// keys are cut into kTile x kTile tiles; the forward keeps a running max / sum per query row
// (online softmax) and saves only lse[B, H, T]; the backward recomputes each score tile from q, k
// and lse. Tile products go through gemm() (OpenBLAS), or, for float while the GEMM precision is bf16
// (issue 22), through oneDNN's bf16 matmul with fp32 accumulation (Bf16Tiles below). No T x T
// matrix is ever held.
#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>
#include <vector>

#include "base/Error.h"
#include "kernels/cpu/Bf16.h"
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

void check_block(const AttnBlock& d) {
  DHX_CHECK(d.B >= 0 && d.Tq >= 0 && d.Tk >= 0 && d.D > 0 && d.H > 0 && d.Hkv > 0 && d.H % d.Hkv == 0 &&
                (!d.causal || d.Tq == d.Tk),
            ConfigError, "attention block: bad dims B={} Tq={} Tk={} H={} Hkv={} D={} causal={} (need H % Hkv == 0, Tq == Tk "
            "when causal)", d.B, d.Tq, d.Tk, d.H, d.Hkv, d.D, d.causal);
  DHX_CHECK(d.q_stride >= d.H * d.D && d.o_stride >= d.H * d.D && d.kv_stride >= d.Hkv * d.D && d.lse_stride >= d.Tq,
            ConfigError, "attention block: strides q={} o={} kv={} lse={} too small for H={} Hkv={} D={} Tq={}",
            d.q_stride, d.o_stride, d.kv_stride, d.lse_stride, d.H, d.Hkv, d.D, d.Tq);
}

// The causal attention of whole sequences as one block.
AttnBlock causal_block(const AttnDims& d) {
  check_dims(d);
  return AttnBlock{d.B,          d.T,          d.T,          d.H,          d.Hkv,        d.D, d.q_stride, d.kv_stride,
                   d.o_stride,   d.T * d.q_stride, d.T * d.kv_stride, d.T * d.o_stride, d.T, true};
}

// Number of valid keys of the key tile starting at s0 (bk keys) for query position t: in a causal
// block, whose queries and keys share origins, keys s <= t; a full block sees every key.
inline int64_t valid_keys(bool causal, int64_t t, int64_t s0, int64_t bk) {
  return causal ? std::clamp<int64_t>(t + 1 - s0, 0, bk) : bk;
}

// Where the tile products read their operands, and how they multiply. Tiles<T> is the fp32 (or
// double) path: the block's own buffers, gemm() (OpenBLAS), kTile x kTile score tiles. Bf16Tiles
// is the bf16 path (float blocks while the GEMM precision is bf16): q, k, v and dout rounded once
// per call into compact bf16 copies, the score tiles P and dS rounded per tile, products through
// oneDNN's matmul with fp32 accumulation, and tiles of 128 queries x 512 keys (a primitive call
// costs about as much as a 64^3 product, so fewer, larger calls; a causal tile's keys stop at its
// last query, so little of a larger tile is masked). Softmax, lse, D_i and every accumulator stay
// fp32 in both.
template <typename E> struct Src {
  const E* p;
  int64_t stride, bstride;  // between rows, between sequences
  const E* at(int64_t b, int64_t t, int64_t col) const { return p + b * bstride + t * stride + col; }
};

template <typename T> struct Tiles {
  using E = T;
  static constexpr int64_t kQueries = kTile, kKeys = kTile;
  static void mm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, T alpha, const E* A, int64_t lda, const E* B,
                 int64_t ldb, T beta, T* C, int64_t ldc) {
    gemm<T>(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
  }
  // A score tile [rows, cols] (ld kKeys) as an operand: itself.
  static const E* tile(const T* S, int64_t, int64_t, std::vector<E>&) { return S; }
};

struct Bf16Tiles {
  using E = uint16_t;
  static constexpr int64_t kQueries = 128, kKeys = 512;
  static void mm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const E* A, int64_t lda,
                 const E* B, int64_t ldb, float beta, float* C, int64_t ldc) {
    matmul_bf16(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
  }
  static const E* tile(const float* S, int64_t rows, int64_t cols, std::vector<E>& buf) {
    buf.resize(kQueries * kKeys);
    for (int64_t r = 0; r < rows; ++r) {
      const float* s = S + r * kKeys;
      E* b = buf.data() + r * kKeys;
#pragma omp simd
      for (int64_t c = 0; c < cols; ++c) b[c] = to_bf16(s[c]);
    }
    return buf.data();
  }
  // The [B, rows, width] part of a strided buffer rounded into a compact copy.
  static Src<E> round(const float* x, int64_t B, int64_t rows, int64_t width, int64_t stride, int64_t bstride,
                      std::vector<E>& buf) {
    buf.resize(static_cast<size_t>(B * rows * width));
#pragma omp parallel for num_threads(detail::threads_for(B * rows * width)) schedule(static)
    for (int64_t i = 0; i < B * rows; ++i) {
      const float* s = x + (i / rows) * bstride + (i % rows) * stride;
      E* d = buf.data() + i * width;
#pragma omp simd
      for (int64_t c = 0; c < width; ++c) d[c] = to_bf16(s[c]);
    }
    return {buf.data(), width, rows * width};
  }
};

template <typename T> bool bf16_tiles(GemmPrecision p) {
  if constexpr (std::is_same_v<T, float>) return p == GemmPrecision::kBf16;
  return false;
}

template <typename T, typename Ops>
void block_fwd(Src<typename Ops::E> q, Src<typename Ops::E> k, Src<typename Ops::E> v, T* o, T* lse,
               const AttnBlock& d, T scale) {
  using E = typename Ops::E;
  constexpr int64_t kQ = Ops::kQueries, kK = Ops::kKeys;
  const int64_t Tq = d.Tq, D = d.D, H = d.H, G = d.H / d.Hkv;
  const int64_t nq = (Tq + kQ - 1) / kQ, nk = (d.Tk + kK - 1) / kK;
  const int64_t BH = d.B * H, items = BH * nq;
  const int nt = detail::threads_for(BH * Tq * D);
#pragma omp parallel num_threads(nt)
  {
    std::vector<T> S(kQ * kK), acc(kQ * D), mrow(kQ), lrow(kQ);  // per thread
    std::vector<E> Pbuf;
    // Largest query tiles (most key tiles) first, for load balance under dynamic scheduling.
#pragma omp for schedule(dynamic, 1)
    for (int64_t it = 0; it < items; ++it) {
      const int64_t qi = nq - 1 - it / BH, bh = it % BH;
      const int64_t b = bh / H, h = bh % H, g = h / G;
      const int64_t t0 = qi * kQ, bq = std::min(kQ, Tq - t0);
      const E* Q = q.at(b, t0, h * D);  // [bq, D], ld q.stride
      std::fill(acc.begin(), acc.end(), T(0));
      std::fill(mrow.begin(), mrow.end(), -std::numeric_limits<T>::infinity());
      std::fill(lrow.begin(), lrow.end(), T(0));
      // key tiles up to the one holding the tile's last query (causal), else all
      const int64_t kend = d.causal ? (t0 + bq - 1) / kK + 1 : nk;
      for (int64_t kj = 0; kj < kend; ++kj) {
        const int64_t s0 = kj * kK;
        // the tile's keys; causal: none past the tile's last query
        const int64_t bk = std::min(std::min(kK, d.Tk - s0), d.causal ? t0 + bq - s0 : kK);
        const E* K = k.at(b, s0, g * D);  // [bk, D], ld k.stride
        const E* V = v.at(b, s0, g * D);
        // S[bq, bk] = scale Q K^T
        Ops::mm(false, true, bq, bk, D, scale, Q, q.stride, K, k.stride, T(0), S.data(), kK);
        for (int64_t r = 0; r < bq; ++r) {
          T* srow = S.data() + r * kK;
          const int64_t nv = valid_keys(d.causal, t0 + r, s0, bk);
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
        Ops::mm(false, false, bq, D, bk, T(1), Ops::tile(S.data(), bq, bk, Pbuf), kK, V, v.stride, T(1),
                acc.data(), D);
      }
      T* L = lse + bh * d.lse_stride + t0;
      for (int64_t r = 0; r < bq; ++r) {
        T* orow = o + b * d.o_bstride + (t0 + r) * d.o_stride + h * D;
        const T inv = T(1) / lrow[r];
        const T* arow = acc.data() + r * D;
#pragma omp simd
        for (int64_t c = 0; c < D; ++c) orow[c] = arow[c] * inv;
        L[r] = mrow[r] + std::log(lrow[r]);
      }
    }
  }
}

// Per (b, kv head g), serially over key tiles j, the query heads of the group and the query tiles i
// the block pairs with j (i >= j when causal, all otherwise):
//   S = scale Q_i K_j^T,  P = exp(S - lse_i),  dV_j += P^T dO_i,  dP = dO_i V_j^T,
//   dS = scale P (dP - D_i) with D_i = rowsum(dO_i * O_i),  dK_j += dS^T Q_i,  dQ_i += dS K_j.
// One thread owns all of dK, dV (and the group's dQ) for its (b, g): no races, no atomics.
// Parallelism is B * Hkv items. D_i reads o and dout in T; the products read q, k, v and dO as Ops'
// operands.
template <typename T, typename Ops>
void block_bwd(Src<typename Ops::E> q, Src<typename Ops::E> k, Src<typename Ops::E> v, Src<typename Ops::E> dO_src,
               const T* o, const T* lse, const T* dout, T* dq, T* dk, T* dv, const AttnBlock& d, T scale) {
  using E = typename Ops::E;
  constexpr int64_t kQ = Ops::kQueries, kK = Ops::kKeys;
  const int64_t Tq = d.Tq, D = d.D, H = d.H, Hkv = d.Hkv, G = d.H / d.Hkv;
  const int64_t nq = (Tq + kQ - 1) / kQ, nk = (d.Tk + kK - 1) / kK;
  const int64_t items = d.B * Hkv;
  const int nt = std::min<int64_t>(detail::threads_for(d.B * H * std::max(Tq, d.Tk) * D), std::max<int64_t>(items, 1));
#pragma omp parallel num_threads(nt)
  {
    // per thread: P and dP/dS tiles [kQ, kK], dK/dV accumulators [kK, D], D_i for the group [G, Tq]
    std::vector<T> P(kQ * kK), dS(kQ * kK), dKacc(kK * D), dVacc(kK * D), Di(G * Tq);
    std::vector<E> Pbuf, dSbuf;
#pragma omp for schedule(dynamic, 1)
    for (int64_t it = 0; it < items; ++it) {
      const int64_t b = it / Hkv, g = it % Hkv;
      for (int64_t hh = 0; hh < G; ++hh) {
        const int64_t h = g * G + hh;
        for (int64_t t = 0; t < Tq; ++t) {
          const T* orow = o + b * d.o_bstride + t * d.o_stride + h * D;
          const T* grow = dout + b * d.o_bstride + t * d.o_stride + h * D;
          T s = 0;
#pragma omp simd reduction(+ : s)
          for (int64_t c = 0; c < D; ++c) s += orow[c] * grow[c];
          Di[hh * Tq + t] = s;
        }
      }
      for (int64_t kj = 0; kj < nk; ++kj) {
        const int64_t s0 = kj * kK, bk = std::min(kK, d.Tk - s0);
        const E* K = k.at(b, s0, g * D);  // [bk, D], ld k.stride
        const E* V = v.at(b, s0, g * D);
        std::fill(dKacc.begin(), dKacc.end(), T(0));
        std::fill(dVacc.begin(), dVacc.end(), T(0));
        for (int64_t hh = 0; hh < G; ++hh) {
          const int64_t h = g * G + hh;
          // query tiles from the one holding the key tile's first key (causal), else all
          for (int64_t qi = d.causal ? s0 / kQ : 0; qi < nq; ++qi) {
            const int64_t t0 = qi * kQ, bq = std::min(kQ, Tq - t0);
            // the keys this query tile sees; causal: none past its last query
            const int64_t bw = d.causal ? std::min(bk, t0 + bq - s0) : bk;
            const E* Q = q.at(b, t0, h * D);  // [bq, D]
            const E* dO = dO_src.at(b, t0, h * D);
            T* dQ = dq + b * d.q_bstride + t0 * d.q_stride + h * D;
            const T* L = lse + (b * H + h) * d.lse_stride + t0;
            const T* Dr = Di.data() + hh * Tq + t0;
            Ops::mm(false, true, bq, bw, D, scale, Q, q.stride, K, k.stride, T(0), P.data(), kK);
            Ops::mm(false, true, bq, bw, D, T(1), dO, dO_src.stride, V, v.stride, T(0), dS.data(), kK);
            for (int64_t r = 0; r < bq; ++r) {
              T* prow = P.data() + r * kK;
              T* srow = dS.data() + r * kK;
              const int64_t nv = valid_keys(d.causal, t0 + r, s0, bw);
              const T lr = L[r], dr = Dr[r];
#pragma omp simd
              for (int64_t c = 0; c < nv; ++c) {
                prow[c] = detail::exp_k<T>(prow[c] - lr);
                srow[c] = scale * prow[c] * (srow[c] - dr);
              }
              for (int64_t c = nv; c < bw; ++c) prow[c] = srow[c] = T(0);
            }
            // dV_j[bw, D] += P^T dO;  dK_j[bw, D] += dS^T Q;  dQ_i[bq, D] += dS K_j
            const E* Pt = Ops::tile(P.data(), bq, bw, Pbuf);
            const E* dSt = Ops::tile(dS.data(), bq, bw, dSbuf);
            Ops::mm(true, false, bw, D, bq, T(1), Pt, kK, dO, dO_src.stride, T(1), dVacc.data(), D);
            Ops::mm(true, false, bw, D, bq, T(1), dSt, kK, Q, q.stride, T(1), dKacc.data(), D);
            Ops::mm(false, false, bq, D, bw, T(1), dSt, kK, K, k.stride, T(1), dQ, d.q_stride);
          }
        }
        for (int64_t r = 0; r < bk; ++r) {
          T* dkr = dk + b * d.kv_bstride + (s0 + r) * d.kv_stride + g * D;
          T* dvr = dv + b * d.kv_bstride + (s0 + r) * d.kv_stride + g * D;
          const T* ka = dKacc.data() + r * D;
          const T* va = dVacc.data() + r * D;
#pragma omp simd
          for (int64_t c = 0; c < D; ++c) dkr[c] += ka[c], dvr[c] += va[c];
        }
      }
    }
  }
}

}  // namespace

template <typename T>
void attention_block_fwd(const T* q, const T* k, const T* v, T* o, T* lse, const AttnBlock& d, T scale,
                         GemmPrecision p) {
  check_block(d);
  if constexpr (std::is_same_v<T, float>) {
    if (bf16_tiles<T>(p)) {
      std::vector<uint16_t> q16, k16, v16;
      const auto Q = Bf16Tiles::round(q, d.B, d.Tq, d.H * d.D, d.q_stride, d.q_bstride, q16);
      const auto K = Bf16Tiles::round(k, d.B, d.Tk, d.Hkv * d.D, d.kv_stride, d.kv_bstride, k16);
      const auto V = Bf16Tiles::round(v, d.B, d.Tk, d.Hkv * d.D, d.kv_stride, d.kv_bstride, v16);
      block_fwd<float, Bf16Tiles>(Q, K, V, o, lse, d, scale);
      return;
    }
  }
  block_fwd<T, Tiles<T>>({q, d.q_stride, d.q_bstride}, {k, d.kv_stride, d.kv_bstride}, {v, d.kv_stride, d.kv_bstride},
                         o, lse, d, scale);
}

template <typename T>
void attention_block_bwd(const T* q, const T* k, const T* v, const T* o, const T* lse, const T* dout, T* dq, T* dk,
                         T* dv, const AttnBlock& d, T scale, GemmPrecision p) {
  check_block(d);
  if constexpr (std::is_same_v<T, float>) {
    if (bf16_tiles<T>(p)) {
      std::vector<uint16_t> q16, k16, v16, g16;
      const auto Q = Bf16Tiles::round(q, d.B, d.Tq, d.H * d.D, d.q_stride, d.q_bstride, q16);
      const auto K = Bf16Tiles::round(k, d.B, d.Tk, d.Hkv * d.D, d.kv_stride, d.kv_bstride, k16);
      const auto V = Bf16Tiles::round(v, d.B, d.Tk, d.Hkv * d.D, d.kv_stride, d.kv_bstride, v16);
      const auto dO = Bf16Tiles::round(dout, d.B, d.Tq, d.H * d.D, d.o_stride, d.o_bstride, g16);
      block_bwd<float, Bf16Tiles>(Q, K, V, dO, o, lse, dout, dq, dk, dv, d, scale);
      return;
    }
  }
  block_bwd<T, Tiles<T>>({q, d.q_stride, d.q_bstride}, {k, d.kv_stride, d.kv_bstride}, {v, d.kv_stride, d.kv_bstride},
                         {dout, d.o_stride, d.o_bstride}, o, lse, dout, dq, dk, dv, d, scale);
}

template <typename T>
void attention_fwd(const T* q, const T* k, const T* v, T* o, T* lse, const AttnDims& d, T scale, GemmPrecision p) {
  attention_block_fwd(q, k, v, o, lse, causal_block(d), scale, p);
}

template <typename T>
void attention_bwd(const T* q, const T* k, const T* v, const T* o, const T* lse, const T* dout, T* dq, T* dk, T* dv,
                   const AttnDims& d, T scale, GemmPrecision p) {
  check_dims(d);
  // The block kernel accumulates: start every gradient row of the sequences at zero.
  for (int64_t r = 0; r < d.B * d.T; ++r) {
    std::fill_n(dq + r * d.q_stride, d.H * d.D, T(0));
    std::fill_n(dk + r * d.kv_stride, d.Hkv * d.D, T(0));
    std::fill_n(dv + r * d.kv_stride, d.Hkv * d.D, T(0));
  }
  attention_block_bwd(q, k, v, o, lse, dout, dq, dk, dv, causal_block(d), scale, p);
}

template <typename T>
void attention_merge(T* o, T* lse, const T* o_blk, const T* lse_blk, int64_t B, int64_t Tq, int64_t H, int64_t D,
                     int64_t o_stride, int64_t o_bstride, int64_t lse_stride, int64_t blk_lse_stride) {
  const int nt = detail::threads_for(B * Tq * H * D);
#pragma omp parallel for collapse(2) num_threads(nt)
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t t = 0; t < Tq; ++t) {
        T& la = lse[(b * H + h) * lse_stride + t];
        const T lb = lse_blk[(b * H + h) * blk_lse_stride + t];
        const T m = std::max(la, lb);
        if (m == -std::numeric_limits<T>::infinity()) continue;  // neither part saw a key
        const T l = m + std::log(std::exp(la - m) + std::exp(lb - m));
        const T wa = std::exp(la - l), wb = std::exp(lb - l);
        T* oa = o + b * o_bstride + t * o_stride + h * D;
        const T* ob = o_blk + b * o_bstride + t * o_stride + h * D;
#pragma omp simd
        for (int64_t c = 0; c < D; ++c) oa[c] = oa[c] * wa + ob[c] * wb;
        la = l;
      }
}

int64_t cp_position(int cp, int r, int64_t Tl, int64_t t) {
  DHX_CHECK(cp >= 1 && r >= 0 && r < cp && Tl % 2 == 0 && t >= 0 && t < Tl, ConfigError,
            "cp_position: cp={} rank={} local rows={} row={} (need 0 <= rank < cp, even local rows)", cp, r, Tl, t);
  const int64_t c = Tl / 2;
  return (t < c ? r : 2 * cp - 1 - r) * c + t % c;
}

RingStep cp_ring_step(int cp, int r, int i, int64_t Tl) {
  DHX_CHECK(cp >= 1 && r >= 0 && r < cp && i >= 0 && i < cp && Tl % 2 == 0, ConfigError,
            "cp_ring_step: cp={} rank={} step={} local rows={} (need 0 <= rank, step < cp, even local rows)", cp, r, i, Tl);
  const int64_t c = Tl / 2;
  if (i == 0) return {0, Tl, 0, Tl, true};
  const int src = ((r - i) % cp + cp) % cp;
  if (src < r) return {0, Tl, 0, c, false};
  return {c, c, 0, Tl, false};
}

namespace {
// The block of ring step `step`: query rows, key rows and mask (cp_ring_step) on the packed layouts
// of RingDims; the caller offsets the base pointers by q_row0 / k_row0 rows.
AttnBlock ring_block(const RingDims& r, const RingStep& st) {
  const int64_t kvw = 2 * r.Hkv * r.D, ow = r.H * r.D;
  return AttnBlock{r.B,          st.Tq,         st.Tk,         r.H,     r.Hkv, r.D, r.q_stride, kvw, ow,
                   r.Tl * r.q_stride, r.Tl * kvw, r.Tl * ow, r.Tl, st.causal};
}
}  // namespace

template <typename T>
void ring_attention_fwd_step(const RingDims& r, int step, const T* q, const T* kv, T* o, T* lse, T* o_tmp, T* lse_tmp,
                             T scale, GemmPrecision p) {
  const RingStep st = cp_ring_step(r.cp, r.rank, step, r.Tl);
  const AttnBlock blk = ring_block(r, st);
  const int64_t ow = r.H * r.D;
  const T* qs = q + st.q_row0 * r.q_stride;
  const T* ks = kv + st.k_row0 * blk.kv_stride;
  if (step == 0) {
    attention_block_fwd(qs, ks, ks + r.Hkv * r.D, o + st.q_row0 * ow, lse + st.q_row0, blk, scale, p);
    return;
  }
  T* ot = o_tmp + st.q_row0 * ow;
  T* lt = lse_tmp + st.q_row0;
  attention_block_fwd(qs, ks, ks + r.Hkv * r.D, ot, lt, blk, scale, p);
  attention_merge(o + st.q_row0 * ow, lse + st.q_row0, ot, lt, r.B, st.Tq, r.H, r.D, ow, blk.o_bstride, r.Tl, r.Tl);
}

template <typename T>
void ring_attention_bwd_step(const RingDims& r, int step, const T* q, const T* kv, const T* o, const T* lse,
                             const T* dout, T* dq, T* dkv, T scale, GemmPrecision p) {
  const RingStep st = cp_ring_step(r.cp, r.rank, step, r.Tl);
  const AttnBlock blk = ring_block(r, st);
  const int64_t ow = r.H * r.D, kvo = r.Hkv * r.D;
  const T* ks = kv + st.k_row0 * blk.kv_stride;
  T* dks = dkv + st.k_row0 * blk.kv_stride;
  attention_block_bwd(q + st.q_row0 * r.q_stride, ks, ks + kvo, o + st.q_row0 * ow, lse + st.q_row0,
                      dout + st.q_row0 * ow, dq + st.q_row0 * r.q_stride, dks, dks + kvo, blk, scale, p);
}

#define DHX_INSTANTIATE(T)                                                                                  \
  template void attention_fwd<T>(const T*, const T*, const T*, T*, T*, const AttnDims&, T, GemmPrecision);  \
  template void attention_bwd<T>(const T*, const T*, const T*, const T*, const T*, const T*, T*, T*, T*,     \
                                 const AttnDims&, T, GemmPrecision);                                        \
  template void attention_block_fwd<T>(const T*, const T*, const T*, T*, T*, const AttnBlock&, T,           \
                                       GemmPrecision);                                                      \
  template void attention_block_bwd<T>(const T*, const T*, const T*, const T*, const T*, const T*, T*, T*, T*, \
                                       const AttnBlock&, T, GemmPrecision);                                 \
  template void attention_merge<T>(T*, T*, const T*, const T*, int64_t, int64_t, int64_t, int64_t, int64_t,  \
                                   int64_t, int64_t, int64_t);                                             \
  template void ring_attention_fwd_step<T>(const RingDims&, int, const T*, const T*, T*, T*, T*, T*, T,      \
                                           GemmPrecision);                                                  \
  template void ring_attention_bwd_step<T>(const RingDims&, int, const T*, const T*, const T*, const T*,     \
                                           const T*, T*, T*, T, GemmPrecision);
DHX_INSTANTIATE(float)
DHX_INSTANTIATE(double)
#undef DHX_INSTANTIATE

}  // namespace dhelix::cpu
