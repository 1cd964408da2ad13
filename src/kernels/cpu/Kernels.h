// CPU forward/backward kernels on raw row-major buffers. fp32 is the training type; every
// kernel is also instantiated for double so tests can check backward passes against central
// finite differences in double precision. No communication, no allocation policy (callers
// pass outputs), no autograd. Shapes are written next to every argument.
// Conventions: "acc" outputs are accumulated into (+=), all others are overwritten.
#pragma once
#include <cstdint>
#include <vector>

namespace dhelix::cpu {

enum class Accumulate { kNo, kYes };
// The precision of the linear layers' and attention's GEMMs of type float (double is never
// rounded): fp32, or bf16 operands with fp32 accumulation (Bf16.h). A kernel that has GEMMs takes
// it as an argument; the run's KernelConfig (below) says which.
enum class GemmPrecision { kFp32, kBf16 };

// ---- GEMM-based linear layer (weights stored [out, in], like torch.nn.Linear) ----
// y[N,O] = x[N,I] @ w[O,I]^T + b[O]   (b may be null)
template <typename T> void linear_fwd(const T* x, const T* w, const T* b, T* y, int64_t N, int64_t I, int64_t O,
                                      GemmPrecision p = GemmPrecision::kFp32);
// dx[N,I] (=|+=) dy[N,O] @ w[O,I]
template <typename T> void linear_bwd_data(const T* dy, const T* w, T* dx, int64_t N, int64_t I, int64_t O, Accumulate acc,
                                           GemmPrecision p = GemmPrecision::kFp32);
// acc dw[O,I] += dy[N,O]^T @ x[N,I];  acc db[O] += sum_n dy[n,:]  (db may be null)
template <typename T> void linear_bwd_weight(const T* dy, const T* x, T* dw, T* db, int64_t N, int64_t I, int64_t O,
                                             GemmPrecision p = GemmPrecision::kFp32);
// The same for the weight rows [o0, o1) only (and db[o0, o1)): a weight gradient cut in pieces
// that a schedule can place apart. Pieces cut at multiples of 96 rows equal the whole call bitwise
// (a whole row tile of every OpenBLAS sgemm kernel measured); other cuts within rounding, since a
// kernel may handle a tail of rows with a different summation order (tested).
template <typename T> void linear_bwd_weight_rows(const T* dy, const T* x, T* dw, T* db, int64_t N, int64_t I,
                                                  int64_t O, int64_t o0, int64_t o1,
                                                  GemmPrecision p = GemmPrecision::kFp32);
// linear_fwd and linear_bwd_data with the weight already in bf16 ([O, I], the step's copy; GEMM
// precision bf16): bitwise the float calls on its fp32 values, which round it the same way.
void linear_fwd_bf16w(const float* x, const uint16_t* w, const float* b, float* y, int64_t N, int64_t I, int64_t O);
void linear_bwd_data_bf16w(const float* dy, const uint16_t* w, float* dx, int64_t N, int64_t I, int64_t O,
                           Accumulate acc);
// The same with x kept in bf16 ([N, I], a saved activation; GEMM precision bf16): bitwise the
// float call on x's fp32 values, which rounds x to the same bf16 before multiplying.
void linear_bwd_weight_rows_bf16x(const float* dy, const uint16_t* x, float* dw, float* db, int64_t N, int64_t I,
                                  int64_t O, int64_t o0, int64_t o1);
// acc db[O] += sum_n dy[n,:], rows summed in order n = 0..N-1 for every thread count.
template <typename T> void bias_grad(const T* dy, T* db, int64_t N, int64_t O);
// General sgemm/dgemm: C[M,N] = alpha * op(A) @ op(B) + beta * C, row-major.
template <typename T> void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, T alpha, const T* A,
                                int64_t lda, const T* B, int64_t ldb, T beta, T* C, int64_t ldc);

// ---- normalisation ----
// y[N,C] = (x - mean) * rstd * g + b;  mean[N], rstd[N] saved for backward.
template <typename T> void layernorm_fwd(const T* x, const T* g, const T* b, T* y, T* mean, T* rstd, int64_t N, int64_t C, T eps);
// dx[N,C] written; acc dg[C], db[C].
template <typename T> void layernorm_bwd(const T* dy, const T* x, const T* g, const T* mean, const T* rstd, T* dx, T* dg, T* db,
                                         int64_t N, int64_t C);
// y[N,C] = x * rstd * g, rstd[N] = 1/sqrt(mean(x^2) + eps).
template <typename T> void rmsnorm_fwd(const T* x, const T* g, T* y, T* rstd, int64_t N, int64_t C, T eps);
// dx[N,C] written; acc dg[C].
template <typename T> void rmsnorm_bwd(const T* dy, const T* x, const T* g, const T* rstd, T* dx, T* dg, int64_t N, int64_t C);

// ---- activations ----
// GELU, tanh approximation (GPT-2): y[n] = 0.5 x (1 + tanh(sqrt(2/pi)(x + 0.044715 x^3)))
template <typename T> void gelu_fwd(const T* x, T* y, int64_t n);
template <typename T> void gelu_bwd(const T* dy, const T* x, T* dx, int64_t n);  // dx written
// SwiGLU: gu[N, 2F] holds gate in columns [0,F) and up in [F,2F); y[N,F] = silu(gate) * up.
template <typename T> void swiglu_fwd(const T* gu, T* y, int64_t N, int64_t F);
template <typename T> void swiglu_bwd(const T* dy, const T* gu, T* dgu, int64_t N, int64_t F);  // dgu[N,2F] written

// ---- rotary embeddings (Hugging Face "rotate_half" convention: pairs (i, i + D/2)) ----
// In place on x viewed as [B, T, row_stride]; heads h in [0,H) start at column h*D.
// Position of token t is pos_offset + t. Backward is the same rotation with -theta: rope_bwd.
template <typename T> void rope_fwd(T* x, int64_t B, int64_t T_, int64_t H, int64_t D, int64_t row_stride, int64_t pos_offset,
                                    double theta);
template <typename T> void rope_bwd(T* dx, int64_t B, int64_t T_, int64_t H, int64_t D, int64_t row_stride, int64_t pos_offset,
                                    double theta);

// ---- causal self-attention with grouped-query heads (tiled, memory-efficient) ----
// q: [B, T, *] with head h at column h*D (row stride q_stride); k, v likewise with Hkv heads
// (kv_stride); o: [B, T, *] (o_stride). Query head h uses kv head h / (H / Hkv).
// lse[B, H, T] (log-sum-exp of the scaled scores) is saved for backward; no T x T matrix is kept.
struct AttnDims {
  int64_t B, T, H, Hkv, D;
  int64_t q_stride, kv_stride, o_stride;
};
// p: the tiles' GEMMs (bf16 tiles for float, Attention.cc).
template <typename T> void attention_fwd(const T* q, const T* k, const T* v, T* o, T* lse, const AttnDims& d, T scale,
                                         GemmPrecision p = GemmPrecision::kFp32);
// dq (q_stride), dk, dv (kv_stride) are written (not accumulated); scores are recomputed tile by tile.
// dout has o's layout (o_stride).
template <typename T> void attention_bwd(const T* q, const T* k, const T* v, const T* o, const T* lse, const T* dout, T* dq, T* dk,
                                         T* dv, const AttnDims& d, T scale, GemmPrecision p = GemmPrecision::kFp32);

// ---- one block of attention (context parallelism's ring steps) ----
// Queries [B, Tq] against keys/values [B, Tk]: row t of sequence b of q is at
// q + b * q_bstride + t * q_stride (likewise k and v with kv_*, o with o_*); lse[(b * H + h) *
// lse_stride + t]. Causal (Tq == Tk, the two ranges start at the same position: query t sees keys
// <= t) or full (every query sees every key). Forward writes o (normalised over the block's keys)
// and the block's lse; backward, given the FINAL o and lse of the rows (merged over every block)
// and dout, ACCUMULATES into dq, dk and dv this block's share of the gradients.
struct AttnBlock {
  int64_t B, Tq, Tk, H, Hkv, D;
  int64_t q_stride, kv_stride, o_stride;
  int64_t q_bstride, kv_bstride, o_bstride;
  int64_t lse_stride;
  bool causal;
};
template <typename T> void attention_block_fwd(const T* q, const T* k, const T* v, T* o, T* lse, const AttnBlock& d, T scale,
                                               GemmPrecision p = GemmPrecision::kFp32);
template <typename T>
void attention_block_bwd(const T* q, const T* k, const T* v, const T* o, const T* lse, const T* dout, T* dq, T* dk, T* dv,
                         const AttnBlock& d, T scale, GemmPrecision p = GemmPrecision::kFp32);
// Online-softmax merge of a block's partial result into a running one, rows [B, Tq] x H heads:
// lse = log(e^lse + e^lse_blk), o = o e^(lse_old - lse) + o_blk e^(lse_blk - lse). o and o_blk
// share one layout (o_stride, o_bstride); lse and lse_blk have their own (b, h) row strides.
// Context parallelism with the load-balanced chunking: the sequence is cut into 2*cp chunks of
// c = Tl / 2 rows and rank r holds chunks r and 2cp-1-r as its Tl local rows. Global position of
// local row t: (t < c ? r : 2cp-1-r) * c + t mod c.
int64_t cp_position(int cp, int r, int64_t Tl, int64_t t);
// Ring step i (0 <= i < cp) on rank r holds the keys/values of rank src = (r - i) mod cp. Which
// local query rows meet which of src's key rows, and how:
//   i = 0:      all Tl queries vs all Tl keys, causal (the local rows are in position order);
//   src < r:    all Tl queries vs src's first chunk (c keys), full: chunk src precedes both query
//               chunks and src's second chunk follows both;
//   src > r:    the second query chunk (c rows from c) vs all Tl keys, full: the first query
//               chunk precedes both of src's chunks, the second follows both.
// Every step but the first costs Tl * c score entries on every rank: the chunking balances the ring.
struct RingStep {
  int64_t q_row0, Tq, k_row0, Tk;
  bool causal;
};
RingStep cp_ring_step(int cp, int r, int i, int64_t Tl);
// One ring step of causal ring attention on this rank: q rows at q_stride ([B * Tl] local rows),
// the travelling keys/values packed [B * Tl, 2 * Hkv * D] (k columns, then v), o [B * Tl, H * D],
// lse [B, H, Tl]. `kv` holds rank src = (rank - step) mod cp's rows.
struct RingDims {
  int cp = 1, rank = 0;
  int64_t B = 1, Tl = 2, H = 1, Hkv = 1, D = 1, q_stride = 1;
};
// Step 0 writes o and lse; a later step computes its block into o_tmp / lse_tmp (scratch of o's and
// lse's shapes) and merges it into o and lse.
template <typename T>
void ring_attention_fwd_step(const RingDims& r, int step, const T* q, const T* kv, T* o, T* lse, T* o_tmp, T* lse_tmp,
                             T scale, GemmPrecision p = GemmPrecision::kFp32);
// Given the final o and lse and dout: accumulates the step's share into dq (q_stride layout) and
// into dkv (kv's layout: the gradient of the keys/values this step saw).
template <typename T>
void ring_attention_bwd_step(const RingDims& r, int step, const T* q, const T* kv, const T* o, const T* lse,
                             const T* dout, T* dq, T* dkv, T scale, GemmPrecision p = GemmPrecision::kFp32);
template <typename T>
void attention_merge(T* o, T* lse, const T* o_blk, const T* lse_blk, int64_t B, int64_t Tq, int64_t H, int64_t D,
                     int64_t o_stride, int64_t o_bstride, int64_t lse_stride, int64_t blk_lse_stride);

// ---- embedding ----
// y[B*T, C] = wte[tok] (+ wpe[pos_offset + t] when wpe != null). tokens[B*T].
template <typename T> void embedding_fwd(const int32_t* tokens, const T* wte, const T* wpe, T* y, int64_t B, int64_t T_, int64_t C,
                                         int64_t pos_offset);
// acc dwte[V, C], acc dwpe (when non-null).
template <typename T> void embedding_bwd(const int32_t* tokens, const T* dy, T* dwte, T* dwpe, int64_t B, int64_t T_, int64_t C,
                                         int64_t pos_offset);

// ---- fused softmax cross-entropy over the vocabulary ----
// losses[N] = logsumexp(logits[n,:]) - logits[n, targets[n]].
// When dlogits != null also writes dlogits[N,V] = (softmax - onehot) * dloss[n]; dlogits may
// alias logits (in-place, saves one [N,V] buffer). Targets < 0 are ignored (loss 0, grad 0).
template <typename T> void cross_entropy_fwd_bwd(const T* logits, const int32_t* targets, T* losses, T* dlogits, const T* dloss,
                                                 int64_t N, int64_t V);
// The same over the vocabulary split across a tensor-parallel group (Megatron's vocabulary-parallel
// loss), in three steps on one rank's shard -- columns [v0, v0 + V) of the vocabulary, logits [N, V]
// -- with the caller's group reductions between them (m: max; stats: sum). The twins of
// kernels/cuda's xent_row_*; the tp ops (sharding/'s vocab_xent_fwd) run them.
// m[n] = the row's largest logit.
void xent_row_max(const float* logits, float* m, int64_t N, int64_t V);
// stats[2n] = sum_v e^(x_v - m[n]) (in double; m: the group's max), stats[2n+1] = the target's
// logit when targets[n] is in this shard, else 0.
void xent_row_stats(const float* logits, const int32_t* targets, const float* m, float* stats, int64_t N, int64_t V,
                    int64_t v0);
// losses[n] = log(S) + m[n] - t (S, t: the group's summed stats) and dlogits (may alias logits) =
// e^(x - m) / S * dloss, minus dloss at the target's column. As cross_entropy_fwd_bwd: a target < 0
// is ignored (loss 0, gradient row 0) and one not below `vocab` (the whole vocabulary) is a
// ConfigError naming it.
void xent_row_finish(const float* logits, const int32_t* targets, const float* m, const float* stats, float* losses,
                     float* dlogits, float dloss, int64_t N, int64_t V, int64_t v0, int64_t vocab);

// ---- Mixture of Experts: dropless top-k routing, grouping by expert, grouped GEMMs ----
// Routing: probs[N,E] = softmax(logits[N,E]) per row; expert[N,k] the k largest probabilities in
// descending order (ties: the lower expert index first); gate[N,k] those probabilities, divided by
// their sum when norm_topk (Mixtral) or as they are.
template <typename T> void moe_route_fwd(const T* logits, T* probs, int32_t* expert, T* gate, int64_t N, int64_t E,
                                         int64_t k, bool norm_topk);
// Backward of routing. dgate[N,k] = d loss / d gate; aux_dprob[E] (may be null): d loss / d probs[n,e],
// the same for every token (the load-balancing loss is linear in the mean probability). dlogits[N,E]
// written.
template <typename T> void moe_route_bwd(const T* probs, const int32_t* expert, const T* gate, const T* dgate,
                                         const T* aux_dprob, T* dlogits, int64_t N, int64_t E, int64_t k, bool norm_topk);
// Groups the N*k assignments a = n*k + j by expert: counts[E] tokens per expert; order[N*k] the
// assignments sorted by expert, then by a (stable); slot[N*k] its inverse (slot[order[p]] = p).
void moe_group(const int32_t* expert, int64_t N, int64_t k, int64_t E, int32_t* counts, int32_t* order,
               int32_t* slot);
// The router's statistics of N tokens, stats[2E] = [counts[e] | sum_n probs[n,e]] (summed in double,
// n ascending): what the load-balancing loss needs, and what tp ranks add up over their shards.
template <typename T> void moe_route_stats(const T* probs, const int32_t* counts, int64_t N, int64_t E, T* stats);
// The load-balancing loss of one layer and micro-batch from its statistics (Ng = sum_e c_e / k tokens):
// coef * E * sum_e (c_e / (Ng k)) * (S_e / Ng).
template <typename T> double moe_aux_loss(const T* stats, int64_t E, int64_t k, double coef);
// xs[P,C] = the rows x[order[p] / k] (P = N*k).
template <typename T> void moe_dispatch(const T* x, const int32_t* order, T* xs, int64_t P, int64_t k, int64_t C);
// acc dx[N,C] += sum_j dxs[slot[n*k + j]], j ascending.
template <typename T> void moe_dispatch_bwd(const T* dxs, const int32_t* slot, T* dx, int64_t N, int64_t k, int64_t C);
// y[N,C] = sum_j gate[n,j] * eo[slot[n*k + j]], j ascending.
template <typename T> void moe_combine(const T* eo, const int32_t* slot, const T* gate, T* y, int64_t N, int64_t k,
                                       int64_t C);
// deo[slot[a]] = gate[a] * dy[a / k]; dgate[a] = dy[a / k] . eo[slot[a]]. Both written.
template <typename T> void moe_combine_bwd(const T* dy, const T* eo, const int32_t* slot, const T* gate, T* deo,
                                           T* dgate, int64_t N, int64_t k, int64_t C);
// Expert parallelism: rows received from G ranks for this rank's El experts arrive as blocks
// (rank j, expert e) in rank-major order, block sizes counts[j * El + e]. to_expert_major: y gets
// them expert-major, (e, j), so each expert's rows are contiguous for the grouped GEMMs; else the
// inverse (y rank-major from x expert-major), before the rows go back.
template <typename T> void moe_ep_regroup(const T* x, const int32_t* counts, T* y, int64_t G, int64_t El, int64_t C,
                                          bool to_expert_major);
// The same regrouping as block moves (rows [from, from + rows) of x to rows [to, ...) of y), one per
// (rank, expert) block in rank-major block order: the GPU's moe_ep_sort copies each on its stream.
struct EpBlockMove {
  int64_t from, to, rows;
};
std::vector<EpBlockMove> moe_ep_block_moves(const int32_t* counts, int64_t G, int64_t El, bool to_expert_major);
// The local experts' row totals: out[e] = sum over ranks j of counts[j * El + e].
std::vector<int32_t> moe_ep_local_counts(const int32_t* counts, int64_t G, int64_t El);
// Grouped linear over E experts: x[P,I] holds counts[0] rows of expert 0, then counts[1] of expert 1,
// ...; w[E*O, I] stacks the experts' [O, I] weights. y[rows of e] = x[rows of e] @ w_e^T.
template <typename T> void expert_linear_fwd(const T* x, const T* w, const int32_t* counts, T* y, int64_t E, int64_t I,
                                             int64_t O);
// dx[P,I] written: dy[rows of e] @ w_e.
template <typename T> void expert_linear_bwd_data(const T* dy, const T* w, const int32_t* counts, T* dx, int64_t E,
                                                  int64_t I, int64_t O);
// acc dw_e[O,I] += dy[rows of e]^T @ x[rows of e] (an expert with no rows gets nothing).
template <typename T> void expert_linear_bwd_weight(const T* dy, const T* x, const int32_t* counts, T* dw, int64_t E,
                                                    int64_t I, int64_t O);

// ---- elementwise ----
template <typename T> void add(const T* a, const T* b, T* y, int64_t n);      // y = a + b
// y[N,C] = (a + b) + bias[C], bias broadcast over rows (bitwise add() then a row add).
template <typename T> void add_bias(const T* a, const T* b, const T* bias, T* y, int64_t N, int64_t C);
template <typename T> void add_inplace(T* y, const T* x, int64_t n);          // y += x
template <typename T> void scale_inplace(T* y, T s, int64_t n);               // y *= s
template <typename T> double sum_squares(const T* x, int64_t n);              // sum x^2 in double

// ---- optimizer ----
struct AdamWParams {
  double lr, beta1, beta2, eps, weight_decay;
  int64_t step;  // 1-based, for bias correction
};
// Decoupled weight decay (Loshchilov & Hutter, as torch.optim.AdamW):
// p -= lr*wd*p; m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2; p -= lr * mhat / (sqrt(vhat) + eps)
template <typename T> void adamw_step(T* p, const T* g, T* m, T* v, int64_t n, const AdamWParams& a);

// ---- the run's kernel settings (Threads.cc) ----
// What a run hands its kernels; it travels in the run's context (RunContext::kernels), never in a
// process-wide variable: ranks run as threads of one process may differ. `threads` is the OpenMP
// thread count of the thread that runs the kernels, `precision` the GEMMs' (passed to each kernel).
struct KernelConfig {
  int threads = 1;
  GemmPrecision precision = GemmPrecision::kFp32;
};
// A checked config: ConfigError when threads < 1, or bf16 on a CPU without AMX-BF16 / AVX512-BF16
// (named, with a hint; never a silent fallback to fp32).
KernelConfig kernel_config(int threads, GemmPrecision precision);
// The calling thread's OpenMP thread count (its nthreads ICV: other threads, other ranks among
// them, keep theirs), which every kernel run on this thread uses; n >= 1 (ConfigError otherwise).
// Whoever runs kernels on a thread sets it from its KernelConfig first (Trainer, StepRunner).
void set_num_threads(int n);
int num_threads();

}  // namespace dhelix::cpu
