// MoE routing on the GPU (Moe.h): softmax top-k and its backward, the router's statistics, and the
// stable grouping of the assignments by expert. Routing is one thread per token, the CPU twin's loop
// verbatim (same summation order, same strict-> selection), since [N,E] fp32 is small: bytes moved
// 8NE + 8Nk forward, 8NE + 16Nk + 4E backward, ~O(NEk) compares. Grouping is one block of 1024
// threads (a counting sort: shared-memory counts, then chunks of 1024 assignments ranked with
// __match_any_sync), reading expert[P] twice and writing order and slot: 16P bytes on one SM.
// Not yet timed on the H100.
#include "kernels/cuda/Moe.h"

namespace dhelix::cuda {

namespace {

constexpr int kRouteThreads = 128;  // tokens per block (one thread each)

__global__ void route_fwd_kernel(const float* __restrict__ logits, float* __restrict__ probs,
                                 int32_t* __restrict__ expert, float* __restrict__ gate, int64_t N, int64_t E,
                                 int64_t k, bool norm_topk) {
  const int64_t n = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (n >= N) return;
  const float* l = logits + n * E;
  float* p = probs + n * E;
  float mx = l[0];
  for (int64_t e = 1; e < E; ++e) mx = fmaxf(mx, l[e]);
  float sum = 0.0f;
  for (int64_t e = 0; e < E; ++e) {
    const float v = expf(l[e] - mx);
    p[e] = v;
    sum += v;
  }
  const float inv = 1.0f / sum;
  for (int64_t e = 0; e < E; ++e) p[e] *= inv;
  // The k largest, descending; a tie keeps the lower index first (strict >), as on the CPU.
  int32_t* ex = expert + n * k;
  float* g = gate + n * k;
  float gsum = 0.0f;
  for (int64_t j = 0; j < k; ++j) {
    int32_t best = -1;
    float best_p = 0.0f;
    for (int64_t e = 0; e < E; ++e) {
      bool taken = false;
      for (int64_t i = 0; i < j; ++i) taken |= ex[i] == e;
      if (!taken && (best < 0 || p[e] > best_p)) best = static_cast<int32_t>(e), best_p = p[e];
    }
    ex[j] = best;
    g[j] = best_p;
    gsum += best_p;
  }
  if (norm_topk)
    for (int64_t j = 0; j < k; ++j) g[j] /= gsum;
}

// With S = sum_j p[e_j], g_j = p[e_j] / S (norm_topk): dp[e_j] = (dg_j - sum_i dg_i g_i) / S, else
// dp[e_j] = dg_j; plus aux_dprob[e] for every e. Softmax: dl[e] = p[e] (dp[e] - p . dp). dl holds
// dp until the last loop, as on the CPU.
__global__ void route_bwd_kernel(const float* __restrict__ probs, const int32_t* __restrict__ expert,
                                 const float* __restrict__ gate, const float* __restrict__ dgate,
                                 const float* __restrict__ aux_dprob, float* __restrict__ dlogits, int64_t N,
                                 int64_t E, int64_t k, bool norm_topk) {
  const int64_t n = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (n >= N) return;
  const float* p = probs + n * E;
  const int32_t* ex = expert + n * k;
  const float* g = gate + n * k;
  const float* dg = dgate + n * k;
  float* dl = dlogits + n * E;
  for (int64_t e = 0; e < E; ++e) dl[e] = aux_dprob ? aux_dprob[e] : 0.0f;
  if (norm_topk) {
    float S = 0.0f, dot = 0.0f;
    for (int64_t j = 0; j < k; ++j) S += p[ex[j]], dot += dg[j] * g[j];
    for (int64_t j = 0; j < k; ++j) dl[ex[j]] += (dg[j] - dot) / S;
  } else {
    for (int64_t j = 0; j < k; ++j) dl[ex[j]] += dg[j];
  }
  float pd = 0.0f;
  for (int64_t e = 0; e < E; ++e) pd += p[e] * dl[e];
  for (int64_t e = 0; e < E; ++e) dl[e] = p[e] * (dl[e] - pd);
}

// A block per expert e: thread t sums the rows n = t, t + 256, ... in double (in that order), then
// the 256 partial sums are added in a fixed tree order -- the same bits on every run, and within
// double's rounding of the CPU twin's row-order sum (far below the float it is stored as). (One
// thread per expert summing all N rows was a chain of N dependent steps: ~1 ms a layer at N = 16K,
// a review found, 2026-11-29.)
constexpr int kStatsThreads = 256;
__global__ void __launch_bounds__(kStatsThreads)
    route_stats_kernel(const float* __restrict__ probs, const int32_t* __restrict__ counts, int64_t N, int64_t E,
                       float* __restrict__ stats) {
  __shared__ double part[kStatsThreads];
  const int64_t e = blockIdx.x;
  double sum = 0.0;
  for (int64_t n = threadIdx.x; n < N; n += kStatsThreads) sum += static_cast<double>(probs[n * E + e]);
  part[threadIdx.x] = sum;
  __syncthreads();
  for (int w = kStatsThreads / 2; w > 0; w /= 2) {
    if (static_cast<int>(threadIdx.x) < w) part[threadIdx.x] += part[threadIdx.x + w];
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    stats[e] = static_cast<float>(counts[e]);
    stats[E + e] = static_cast<float>(part[0]);
  }
}

// ---- grouping: a stable counting sort in one block ----
constexpr int kGroupThreads = 1024;
constexpr int kGroupWarps = kGroupThreads / 32;

// Positions p of the sorted order: expert e's assignments occupy [start_e, start_e + counts[e]),
// start_e = counts[0] + ... + counts[e-1]. The assignments are taken in chunks of 1024 in a order;
// within a chunk, assignment a = a0 + t (warp w, lane l) of expert e goes to
//   p = next[e] + (its chunk's earlier warps' assignments of e) + (its warp's earlier lanes' of e),
// so ties keep the order of a (stable), and next[e] then moves past the chunk's assignments of e.
__global__ void __launch_bounds__(kGroupThreads)
    group_kernel(const int32_t* __restrict__ expert, int64_t P, int E, int32_t* __restrict__ counts,
                 int32_t* __restrict__ order, int32_t* __restrict__ slot) {
  __shared__ int32_t next[kMoeMaxExperts];                 // the next free position of expert e
  __shared__ int32_t in_warp[kGroupWarps][kMoeMaxExperts];  // this chunk: assignments of e in warp w
  const int t = threadIdx.x, lane = t & 31, w = t >> 5;

  // 1. counts (integer atomics: the result does not depend on their order).
  for (int e = t; e < E; e += kGroupThreads) next[e] = 0;
  __syncthreads();
  for (int64_t a = t; a < P; a += kGroupThreads) atomicAdd(&next[expert[a]], 1);
  __syncthreads();
  for (int e = t; e < E; e += kGroupThreads) counts[e] = next[e];
  __syncthreads();  // every count read before thread 0 turns them into starts
  // 2. exclusive scan: next[e] = start_e (E <= 256 steps on one thread).
  if (t == 0) {
    int32_t run = 0;
    for (int e = 0; e < E; ++e) {
      const int32_t c = next[e];
      next[e] = run;
      run += c;
    }
  }
  __syncthreads();
  // 3. chunks in a order. The loop bound is the same for every thread, so every lane of every warp
  // reaches __match_any_sync and each __syncthreads.
  const unsigned lanes_below = (1u << lane) - 1u;  // lane 0: none
  for (int64_t a0 = 0; a0 < P; a0 += kGroupThreads) {
    for (int i = t; i < kGroupWarps * E; i += kGroupThreads) in_warp[i / E][i % E] = 0;
    __syncthreads();
    const int64_t a = a0 + t;
    const bool valid = a < P;
    const int e = valid ? expert[a] : -1;  // -1: past the end, a group of its own
    const unsigned peers = __match_any_sync(0xffffffffu, e);
    const int rank_in_warp = __popc(peers & lanes_below);
    if (valid && rank_in_warp == 0) in_warp[w][e] = __popc(peers);
    __syncthreads();
    if (valid) {
      int32_t p = next[e] + rank_in_warp;
      for (int v = 0; v < w; ++v) p += in_warp[v][e];
      order[p] = static_cast<int32_t>(a);
      slot[a] = p;
    }
    __syncthreads();  // every next[e] read before it moves
    for (int e2 = t; e2 < E; e2 += kGroupThreads) {
      int32_t chunk = 0;
      for (int v = 0; v < kGroupWarps; ++v) chunk += in_warp[v][e2];
      next[e2] += chunk;
    }
    __syncthreads();  // next[] moved and in_warp read before the next chunk clears it
  }
}

unsigned grid_for(int64_t n, int threads) { return static_cast<unsigned>(cdiv(n, threads)); }

}  // namespace

void moe_route_fwd(const float* logits, float* probs, int32_t* expert, float* gate, int64_t N, int64_t E, int64_t k,
                   NormTopk norm, cudaStream_t s) {
  DHX_CUDA_ASSERT(E >= 1 && k >= 1 && k <= E && N >= 0, "moe_route_fwd N=", N, " E=", E, " k=", k,
                  ": needs 1 <= k <= E");
  if (N == 0) return;
  route_fwd_kernel<<<grid_for(N, kRouteThreads), kRouteThreads, 0, s>>>(logits, probs, expert, gate, N, E, k,
                                                                        norm == NormTopk::kYes);
  DHX_CUDA_LAUNCHED(route_fwd_kernel);
}

void moe_route_bwd(const float* probs, const int32_t* expert, const float* gate, const float* dgate,
                   const float* aux_dprob, float* dlogits, int64_t N, int64_t E, int64_t k, NormTopk norm,
                   cudaStream_t s) {
  DHX_CUDA_ASSERT(E >= 1 && k >= 1 && k <= E && N >= 0, "moe_route_bwd N=", N, " E=", E, " k=", k,
                  ": needs 1 <= k <= E");
  if (N == 0) return;
  route_bwd_kernel<<<grid_for(N, kRouteThreads), kRouteThreads, 0, s>>>(probs, expert, gate, dgate, aux_dprob,
                                                                        dlogits, N, E, k, norm == NormTopk::kYes);
  DHX_CUDA_LAUNCHED(route_bwd_kernel);
}

void moe_route_stats(const float* probs, const int32_t* counts, int64_t N, int64_t E, float* stats, cudaStream_t s) {
  DHX_CUDA_ASSERT(E >= 1 && N >= 0, "moe_route_stats N=", N, " E=", E);
  DHX_CUDA_ASSERT(E < (int64_t{1} << 31), "moe_route_stats E=", E, ": a block per expert");
  route_stats_kernel<<<static_cast<unsigned>(E), kStatsThreads, 0, s>>>(probs, counts, N, E, stats);
  DHX_CUDA_LAUNCHED(route_stats_kernel);
}

void moe_group(const int32_t* expert, int64_t N, int64_t k, int64_t E, int32_t* counts, int32_t* order, int32_t* slot,
               cudaStream_t s) {
  const int64_t P = N * k;
  DHX_CUDA_ASSERT(E >= 1 && E <= kMoeMaxExperts, "moe_group E=", E, ": one block groups 1..", kMoeMaxExperts,
                  " experts");
  DHX_CUDA_ASSERT(N >= 0 && k >= 1 && P < (int64_t{1} << 31), "moe_group N=", N, " k=", k,
                  ": N*k must fit int32 positions");
  group_kernel<<<1, kGroupThreads, 0, s>>>(expert, P, static_cast<int>(E), counts, order, slot);
  DHX_CUDA_LAUNCHED(group_kernel);
}

}  // namespace dhelix::cuda
