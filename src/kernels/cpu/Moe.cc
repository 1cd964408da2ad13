// Mixture-of-Experts kernels: softmax top-k routing and its backward, the grouping of token
// assignments by expert, dispatch/combine (gather and weighted scatter of rows) and the grouped
// GEMMs over the experts' stacked weights. Every loop sums in a fixed order (j ascending, rows in
// group order), so results do not depend on the thread count.
#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/cpu/Kernels.h"
#include "kernels/cpu/Parallel.h"

namespace dhelix::cpu {

template <typename T> void moe_route_fwd(const T* logits, T* probs, int32_t* expert, T* gate, int64_t N, int64_t E,
                                         int64_t k, bool norm_topk) {
#pragma omp parallel for num_threads(detail::threads_for(N * E)) schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    const T* l = logits + n * E;
    T* p = probs + n * E;
    T mx = l[0];
    for (int64_t e = 1; e < E; ++e) mx = std::max(mx, l[e]);
    T sum = 0;
    for (int64_t e = 0; e < E; ++e) sum += (p[e] = std::exp(l[e] - mx));
    const T inv = T(1) / sum;
    for (int64_t e = 0; e < E; ++e) p[e] *= inv;
    // Selection of the k largest, descending; a tie keeps the lower index first (strict >).
    int32_t* ex = expert + n * k;
    T* g = gate + n * k;
    T gsum = 0;
    for (int64_t j = 0; j < k; ++j) {
      int32_t best = -1;
      for (int64_t e = 0; e < E; ++e) {
        bool taken = false;
        for (int64_t i = 0; i < j; ++i) taken |= ex[i] == e;
        if (!taken && (best < 0 || p[e] > p[best])) best = static_cast<int32_t>(e);
      }
      ex[j] = best;
      g[j] = p[best];
      gsum += p[best];
    }
    if (norm_topk)
      for (int64_t j = 0; j < k; ++j) g[j] /= gsum;
  }
}

// With S = sum_j p[e_j] and g_j = p[e_j] / S (norm_topk): dL/dp[e_j] = (dg_j - sum_i dg_i g_i) / S;
// without it dL/dp[e_j] = dg_j. Plus aux_dprob[e] for every e. Softmax: dl[e] = p[e] (dp[e] - p . dp).
template <typename T> void moe_route_bwd(const T* probs, const int32_t* expert, const T* gate, const T* dgate,
                                         const T* aux_dprob, T* dlogits, int64_t N, int64_t E, int64_t k, bool norm_topk) {
#pragma omp parallel for num_threads(detail::threads_for(N * E)) schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    const T* p = probs + n * E;
    const int32_t* ex = expert + n * k;
    const T* g = gate + n * k;
    const T* dg = dgate + n * k;
    T* dl = dlogits + n * E;
    for (int64_t e = 0; e < E; ++e) dl[e] = aux_dprob ? aux_dprob[e] : T(0);  // dl holds dp for now
    if (norm_topk) {
      T S = 0, dot = 0;
      for (int64_t j = 0; j < k; ++j) S += p[ex[j]], dot += dg[j] * g[j];
      for (int64_t j = 0; j < k; ++j) dl[ex[j]] += (dg[j] - dot) / S;
    } else {
      for (int64_t j = 0; j < k; ++j) dl[ex[j]] += dg[j];
    }
    T pd = 0;
    for (int64_t e = 0; e < E; ++e) pd += p[e] * dl[e];
    for (int64_t e = 0; e < E; ++e) dl[e] = p[e] * (dl[e] - pd);
  }
}

void moe_group(const int32_t* expert, int64_t N, int64_t k, int64_t E, int32_t* counts, int32_t* order,
               int32_t* slot) {
  std::fill(counts, counts + E, 0);
  const int64_t P = N * k;
  for (int64_t a = 0; a < P; ++a) ++counts[expert[a]];
  std::vector<int64_t> next(E, 0);
  for (int64_t e = 1; e < E; ++e) next[e] = next[e - 1] + counts[e - 1];
  for (int64_t a = 0; a < P; ++a) {
    const int64_t p = next[expert[a]]++;
    order[p] = static_cast<int32_t>(a);
    slot[a] = static_cast<int32_t>(p);
  }
}

template <typename T> void moe_route_stats(const T* probs, const int32_t* counts, int64_t N, int64_t E, T* stats) {
  std::vector<double> psum(E, 0.0);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t e = 0; e < E; ++e) psum[e] += static_cast<double>(probs[n * E + e]);
  for (int64_t e = 0; e < E; ++e) stats[e] = static_cast<T>(counts[e]), stats[E + e] = static_cast<T>(psum[e]);
}

template <typename T> double moe_aux_loss(const T* stats, int64_t E, int64_t k, double coef) {
  double Ng = 0;
  for (int64_t e = 0; e < E; ++e) Ng += static_cast<double>(stats[e]);
  Ng /= static_cast<double>(k);
  if (Ng <= 0) return 0;
  double s = 0;
  for (int64_t e = 0; e < E; ++e)
    s += static_cast<double>(stats[e]) / (Ng * static_cast<double>(k)) * (static_cast<double>(stats[E + e]) / Ng);
  return coef * static_cast<double>(E) * s;
}

template <typename T> void moe_dispatch(const T* x, const int32_t* order, T* xs, int64_t P, int64_t k, int64_t C) {
#pragma omp parallel for num_threads(detail::threads_for(P * C)) schedule(static)
  for (int64_t p = 0; p < P; ++p) {
    const T* src = x + (order[p] / k) * C;
    std::copy(src, src + C, xs + p * C);
  }
}

template <typename T> void moe_dispatch_bwd(const T* dxs, const int32_t* slot, T* dx, int64_t N, int64_t k, int64_t C) {
#pragma omp parallel for num_threads(detail::threads_for(N * k * C)) schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    T* d = dx + n * C;
    for (int64_t j = 0; j < k; ++j) {
      const T* s = dxs + static_cast<int64_t>(slot[n * k + j]) * C;
      for (int64_t c = 0; c < C; ++c) d[c] += s[c];
    }
  }
}

template <typename T> void moe_combine(const T* eo, const int32_t* slot, const T* gate, T* y, int64_t N, int64_t k,
                                       int64_t C) {
#pragma omp parallel for num_threads(detail::threads_for(N * k * C)) schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    T* out = y + n * C;
    std::fill(out, out + C, T(0));
    for (int64_t j = 0; j < k; ++j) {
      const T g = gate[n * k + j];
      const T* s = eo + static_cast<int64_t>(slot[n * k + j]) * C;
      for (int64_t c = 0; c < C; ++c) out[c] += g * s[c];
    }
  }
}

template <typename T> void moe_combine_bwd(const T* dy, const T* eo, const int32_t* slot, const T* gate, T* deo,
                                           T* dgate, int64_t N, int64_t k, int64_t C) {
#pragma omp parallel for num_threads(detail::threads_for(N * k * C)) schedule(static)
  for (int64_t n = 0; n < N; ++n) {
    const T* d = dy + n * C;
    for (int64_t j = 0; j < k; ++j) {
      const int64_t a = n * k + j, row = slot[a];
      const T g = gate[a];
      const T* e = eo + row * C;
      T* de = deo + row * C;
      T dot = 0;
      for (int64_t c = 0; c < C; ++c) {
        de[c] = g * d[c];
        dot += d[c] * e[c];
      }
      dgate[a] = dot;
    }
  }
}

std::vector<EpBlockMove> moe_ep_block_moves(const int32_t* counts, int64_t G, int64_t El, bool to_expert_major) {
  // Row offsets of block (j, e) in the rank-major and in the expert-major order.
  std::vector<int64_t> rank_major(G * El), expert_major(G * El);
  int64_t r = 0;
  for (int64_t j = 0; j < G; ++j)
    for (int64_t e = 0; e < El; ++e) rank_major[j * El + e] = r, r += counts[j * El + e];
  r = 0;
  for (int64_t e = 0; e < El; ++e)
    for (int64_t j = 0; j < G; ++j) expert_major[j * El + e] = r, r += counts[j * El + e];
  std::vector<EpBlockMove> moves(static_cast<size_t>(G * El));
  for (int64_t b = 0; b < G * El; ++b)
    moves[size_t(b)] = EpBlockMove{to_expert_major ? rank_major[b] : expert_major[b],
                                   to_expert_major ? expert_major[b] : rank_major[b], counts[b]};
  return moves;
}

std::vector<int32_t> moe_ep_local_counts(const int32_t* counts, int64_t G, int64_t El) {
  std::vector<int32_t> out(static_cast<size_t>(El), 0);
  for (int64_t e = 0; e < El; ++e)
    for (int64_t j = 0; j < G; ++j) out[size_t(e)] += counts[j * El + e];
  return out;
}

template <typename T> void moe_ep_regroup(const T* x, const int32_t* counts, T* y, int64_t G, int64_t El, int64_t C,
                                          bool to_expert_major) {
  for (const EpBlockMove& m : moe_ep_block_moves(counts, G, El, to_expert_major))
    std::copy(x + m.from * C, x + (m.from + m.rows) * C, y + m.to * C);
}

template <typename T> void expert_linear_fwd(const T* x, const T* w, const int32_t* counts, T* y, int64_t E, int64_t I,
                                             int64_t O) {
  int64_t r = 0;
  for (int64_t e = 0; e < E; ++e) {
    if (counts[e] > 0) linear_fwd<T>(x + r * I, w + e * O * I, nullptr, y + r * O, counts[e], I, O);
    r += counts[e];
  }
}

template <typename T> void expert_linear_bwd_data(const T* dy, const T* w, const int32_t* counts, T* dx, int64_t E,
                                                  int64_t I, int64_t O) {
  int64_t r = 0;
  for (int64_t e = 0; e < E; ++e) {
    if (counts[e] > 0) linear_bwd_data<T>(dy + r * O, w + e * O * I, dx + r * I, counts[e], I, O, Accumulate::kNo);
    r += counts[e];
  }
}

template <typename T> void expert_linear_bwd_weight(const T* dy, const T* x, const int32_t* counts, T* dw, int64_t E,
                                                    int64_t I, int64_t O) {
  int64_t r = 0;
  for (int64_t e = 0; e < E; ++e) {
    if (counts[e] > 0) linear_bwd_weight<T>(dy + r * O, x + r * I, dw + e * O * I, nullptr, counts[e], I, O);
    r += counts[e];
  }
}

#define DHX_MOE(T)                                                                                                    \
  template void moe_route_fwd<T>(const T*, T*, int32_t*, T*, int64_t, int64_t, int64_t, bool);                        \
  template void moe_route_bwd<T>(const T*, const int32_t*, const T*, const T*, const T*, T*, int64_t, int64_t,        \
                                 int64_t, bool);                                                                      \
  template void moe_route_stats<T>(const T*, const int32_t*, int64_t, int64_t, T*);                                   \
  template double moe_aux_loss<T>(const T*, int64_t, int64_t, double);                                                \
  template void moe_dispatch<T>(const T*, const int32_t*, T*, int64_t, int64_t, int64_t);                             \
  template void moe_dispatch_bwd<T>(const T*, const int32_t*, T*, int64_t, int64_t, int64_t);                         \
  template void moe_combine<T>(const T*, const int32_t*, const T*, T*, int64_t, int64_t, int64_t);                    \
  template void moe_combine_bwd<T>(const T*, const T*, const int32_t*, const T*, T*, T*, int64_t, int64_t, int64_t);  \
  template void moe_ep_regroup<T>(const T*, const int32_t*, T*, int64_t, int64_t, int64_t, bool);                     \
  template void expert_linear_fwd<T>(const T*, const T*, const int32_t*, T*, int64_t, int64_t, int64_t);              \
  template void expert_linear_bwd_data<T>(const T*, const T*, const int32_t*, T*, int64_t, int64_t, int64_t);         \
  template void expert_linear_bwd_weight<T>(const T*, const T*, const int32_t*, T*, int64_t, int64_t, int64_t);
DHX_MOE(float)
DHX_MOE(double)
#undef DHX_MOE

}  // namespace dhelix::cpu
