// Linear layers through cuBLASLt: bf16 operands, fp32 accumulation, row-major buffers as on the CPU
// (weights [out, in], like torch.nn.Linear). One Blas per GPU holds the cuBLASLt handle, one
// workspace per stream (two strands' GEMMs never share one) and the algorithm chosen once per
// shape (cuBLASLt's heuristic, first answer, cached by shape, layout, types and epilogue), so a
// step's GEMMs run the same algorithm every step: deterministic run to run. (Choice::kTimed times
// the heuristic's first answers instead: deterministic within a run only.) The fused forms (GELU
// and its gradient, the residual add, in cuBLASLt's epilogues) say when cuBLASLt cannot run them;
// linear_gelu / linear_dgrad_gelu / linear_residual below then run the unfused kernels.
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <tuple>
#include <vector>

#include "kernels/cuda/Cuda.h"
#include "kernels/cuda/GemmChoices.h"

namespace dhelix::cuda {

class Blas {
 public:
  enum class Op { kN, kT };        // a GEMM operand as stored or transposed (gemm below)
  enum class Out { kBf16, kF32 };  // a GEMM's output type
  explicit Blas(int device);
  ~Blas();
  Blas(const Blas&) = delete;
  Blas& operator=(const Blas&) = delete;
  int device() const { return device_; }

  // y[N,O] = x[N,I] @ w[O,I]^T (+ bias[O], bf16, fused in cuBLASLt's epilogue when non-null).
  void linear_fwd(const bf16* x, const bf16* w, const bf16* bias, bf16* y, int64_t N, int64_t I, int64_t O,
                  cudaStream_t s);
  // dx[N,I] = dy[N,O] @ w[O,I] (Accumulate::kYes: dx += ..., the sum rounded once to bf16).
  void linear_bwd_data(const bf16* dy, const bf16* w, bf16* dx, int64_t N, int64_t I, int64_t O, Accumulate acc,
                       cudaStream_t s);
  // dw[O,I] += dy[N,O]^T @ x[N,I] into fp32 gradients; db[O] += sum_n dy[n,:] (fp32, rows summed in
  // order n = 0..N-1 by one thread per column: deterministic) when db is non-null. How the GEMM runs:
  // set_wgrad below.
  void linear_bwd_weight(const bf16* dy, const bf16* x, float* dw, float* db, int64_t N, int64_t I, int64_t O,
                         cudaStream_t s);

  // How linear_bwd_weight runs a weight gradient (training.wgrad_gemm). kDirect: one GEMM adding
  // into dw (beta 1). kPartials, where wgrad_parts says the output has too few tiles for the GPU's SMs
  // (GPT-2's 768 x 768 attention projection is 36 tiles of 128 x 128 for 132 SMs; measured 150-440
  // TFLOP/s direct on an H200, 2026-11-27, where cuBLAS ran the same shapes at 520-720 with a bf16
  // output): the N token rows cut into P parts of `rows` (a multiple of kPartRowAlign), one
  // strided-batched GEMM writing P fp32 partial gradients (beta 0: P times the output tiles, each over
  // N / P of the sum) into a stream-ordered scratch buffer, then one pass adding them to dw in part
  // order, dw + (((p0 + p1) + p2) + ...), then the rows past P parts (N not a multiple of P rows) by
  // a direct GEMM. Deterministic run to run like the direct form (a fixed algorithm per shape, a fixed
  // order); its fp32 sum order differs from the direct form's. Where cuBLASLt has no algorithm for the
  // batched GEMM, the direct form runs (and is not counted as partials).
  enum class Wgrad { kDirect, kPartials };
  void set_wgrad(Wgrad w) { wgrad_ = w; }
  Wgrad wgrad() const { return wgrad_; }
  static constexpr int kMaxWgradParts = 8;
  static constexpr int64_t kPartRowAlign = 128;   // a part's rows: dy's and x's batch strides stay 256-byte aligned
  static constexpr int64_t kMinPartRows = 1024;   // the least rows (the GEMM's K) a part sums
  // The rule: how many parts a weight gradient dw[O,I] over N rows is cut into on a GPU of `sms` SMs
  // (1: the direct form). Its output's tiles t = ceil(O/128) ceil(I/128); 1 when t >= 2 sms (two
  // waves already); else the least power of two P <= kMaxWgradParts with P t >= 2 sms, halved while
  // a part would have under kMinPartRows rows. GPT-2 (N = 16384, 132 SMs): qkv 4, attention
  // projection 8, MLP 2 and 2, the head 1.
  static int wgrad_parts(int64_t N, int64_t I, int64_t O, int sms);
  // The partials form's layout for those parts: each part's rows (a multiple of kPartRowAlign, at
  // least kMinPartRows), the rows the direct GEMM adds after them (rest = N - parts rows) and the
  // scratch stride between partials (floats: O I rounded up to a multiple of 64, so each partial is
  // 256-byte aligned). parts 1: the direct form (rows N, rest 0, stride 0).
  struct WgradSplit {
    int parts = 1;
    int64_t rows = 0, rest = 0, stride = 0;
  };
  static WgradSplit wgrad_split(int64_t N, int64_t I, int64_t O, int sms);
  size_t partial_wgrads() const;  // linear_bwd_weight calls that ran as partials (tests, the bench)

  // gemm (below) over `batch` problems: problem b's A, B and C start stride_a, stride_b, stride_c
  // elements after problem b - 1's (cuBLASLt's strided batch). No epilogue. false (nothing
  // enqueued) where cuBLASLt has no algorithm for it (Missing::kNull), so a caller can run another form.
  [[nodiscard]] bool gemm_strided_batched(Op op_a, Op op_b, int64_t M, int64_t N, int64_t K, float alpha,
                                          const bf16* A, int64_t lda, int64_t stride_a, const bf16* B, int64_t ldb,
                                          int64_t stride_b, float beta, void* C, int64_t ldc, int64_t stride_c,
                                          int batch, Out out, cudaStream_t s);
  // The fused forms (the layer programs' linear_gelu, linear_dgrad_gelu, linear_residual ops), each
  // one cuBLASLt call with an epilogue. Each returns false, having written no output (at most a
  // misaligned bias's staging copy is enqueued), where it cannot run (set_fusion(kUnfused); cuBLASLt
  // has no algorithm for the epilogue, shape and alignments; an aux row width not a multiple of 8
  // or an aux pointer under 16-byte alignment): the caller then
  // runs the unfused kernels (the free functions below do). Numerics: one rounding to bf16 per
  // output, where the unfused pair rounds the GEMM's output first and then the pointwise result.
  //
  // pre[N,O] = x[N,I] @ w[O,I]^T (+ bias[O], bf16), act[N,O] = gelu(pre) (cuBLASLt's GELU, the tanh
  // form): CUBLASLT_EPILOGUE_GELU_AUX(_BIAS), pre the epilogue's aux output (bf16, row stride O).
  [[nodiscard]] bool linear_fwd_gelu(const bf16* x, const bf16* w, const bf16* bias, bf16* act, bf16* pre, int64_t N,
                                     int64_t I, int64_t O, cudaStream_t s);
  // dpre[N,I] = gelu'(pre[N,I]) * (dy[N,O] @ w[O,I]): CUBLASLT_EPILOGUE_DGELU, pre its aux input
  // (bf16, row stride I). Written, never accumulated.
  [[nodiscard]] bool linear_bwd_data_dgelu(const bf16* dy, const bf16* w, const bf16* pre, bf16* dpre, int64_t N,
                                           int64_t I, int64_t O, cudaStream_t s);
  // y[N,O] = skip[N,O] + x[N,I] @ w[O,I]^T (+ bias[O], bf16): beta = 1 with C = skip and D = y
  // (cuBLASLt's out-of-place result; skip may be y itself).
  [[nodiscard]] bool linear_fwd_residual(const bf16* x, const bf16* w, const bf16* bias, const bf16* skip, bf16* y,
                                         int64_t N, int64_t I, int64_t O, cudaStream_t s);
  // Whether the fused forms above run (kEpilogues, the default) or always answer false (kUnfused: the
  // tests' and the kernel bench's unfused reference; a switch should an epilogue lose on a GPU).
  enum class Fusion { kEpilogues, kUnfused };
  void set_fusion(Fusion f) { fusion_ = f; }
  Fusion fusion() const { return fusion_; }

  // Row-major C[M,N] = alpha op(A)[M,K] op(B)[K,N] + beta C, bf16 A and B, C of type `out`;
  // lda/ldb/ldc are row strides in elements. linear_fwd / linear_bwd_data / linear_bwd_weight are
  // this; the fused forms are this with another epilogue (and, for the residual, D apart from C).
  void gemm(Op op_a, Op op_b, int64_t M, int64_t N, int64_t K, float alpha, const bf16* A, int64_t lda, const bf16* B,
            int64_t ldb, float beta, void* C, int64_t ldc, Out out, const bf16* bias, cudaStream_t s);

  size_t cached_algorithms() const;
  // The SM count cuBLASLt's heuristic is told to plan for (CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET):
  // the SMs of the SM partition the constructing thread was in (cuda::SmPartition), so that a rank
  // on half the GPU gets the algorithms for half the GPU; 0 (outside a partition): the device's own.
  int sm_count_target() const { return sm_target_; }

  // How a new shape's algorithm is chosen. kHeuristic (the default): cuBLASLt's heuristic's first
  // answer -- the same on every run, so results are reproducible run to run. kTimed: the fastest of
  // the heuristic's first kTimedCandidates answers and kSplitKVariants split-K forms of its first
  // answer (kSplitKParts), each timed on the first call's own operands (writing a scratch copy of C)
  // -- faster where the heuristic misjudges a shape, but the choice can differ between runs (timings
  // are noisy), so results repeat only within a run. The first call of each shape then waits for its
  // timings (a host sync). Why split-K: a weight gradient's few output tiles (GPT-2's 768 x 2304 is
  // ~54 tiles of 128 x 256 for 132 SMs) leave most SMs idle, and the heuristic's first answer for an
  // fp32 C accumulated into (beta 1) is not split (150-440 TFLOP/s on an H200, 2026-11-27); split-K
  // spreads the token dimension over more CTAs, the parts reduced in fp32 in the workspace by a
  // separate step (CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE: a fixed order, no atomics).
  // kSplitK (tests of the split forms, not a config value): the first answer split set_split_k's
  // parts ways where cuBLASLt accepts that for the shape, else the first answer (split_plans counts
  // the shapes that run split).
  enum class Choice { kHeuristic, kTimed, kSplitK };
  static constexpr int kTimedCandidates = 8;
  static constexpr int kSplitKVariants = 3;
  static constexpr int kSplitKParts[kSplitKVariants] = {2, 3, 4};
  void set_choice(Choice c) { choice_ = c; }
  void set_split_k(int parts) {
    choice_ = Choice::kSplitK;
    split_parts_ = parts;
  }
  size_t split_plans() const;
  Choice choice() const { return choice_; }

  // The choices file (training.gemm_choices, GemmChoices.h). choices(): this machine's header and,
  // per key planned, the answer and split it runs (with its time when timed), and the preset's keys
  // not planned (yet), so a file rewritten from it keeps what another run of other shapes chose; one
  // list in key order (the same choices give the same file, whatever order they were planned in).
  // preset(c): from now on a key of c runs c's answer and split when it is planned, timed or not --
  // the choice of the run that wrote c, so results repeat across runs; a key whose answer cuBLASLt
  // no longer offers, or whose split it refuses, is chosen as without a preset (counted by
  // preset_unusable). The caller checks c's header (gemm_choices_mismatch against choices()).
  GemmChoices choices() const;
  void preset(const GemmChoices& c);
  size_t preset_used() const;      // plans made from the preset
  size_t preset_unusable() const;  // preset keys planned without it
  // Plans chosen by this Blas (not from the preset), ever: news for the file. A count that only grows
  // (a fused form's plan cuBLASLt refuses later leaves the file's content, not this count).
  size_t chosen_here() const;

  // While one is alive on a thread, that thread's new keys are planned with the heuristic's first
  // answer (or the preset's), whatever the choice, never timed, and left out of choices() and
  // chosen_here(): for the grouped expert GEMMs (ExpertLinear.cc), whose per-expert row counts
  // change with the routing, so that kTimed would stop a step to time each new count and a choices
  // file would grow by a key for each. A key planned so and later run outside a scope becomes an
  // ordinary choice from then on (timed at that call under kTimed).
  class HeuristicOnly {
   public:
    HeuristicOnly();
    ~HeuristicOnly();
    HeuristicOnly(const HeuristicOnly&) = delete;
    HeuristicOnly& operator=(const HeuristicOnly&) = delete;
  };

  // Study (bench/gpu_kernels.cc): each algorithm cuBLASLt's heuristic offers for this GEMM (at most
  // `max`, in its order: index 0 is what kHeuristic runs), then always kSplitKVariants entries, the
  // first answer split kSplitKParts ways (infinite where cuBLASLt refuses that split), timed on these
  // operands into a scratch copy of C (C itself unchanged): median milliseconds of `reps` calls
  // after a warm-up (infinite for an answer that fails).
  std::vector<double> time_candidates(Op op_a, Op op_b, int64_t M, int64_t N, int64_t K, const bf16* A, int64_t lda,
                                      const bf16* B, int64_t ldb, float beta, const void* C, int64_t ldc, Out out,
                                      int max, int reps, cudaStream_t s);

 private:
  // The epilogue (cuBLASLt's, on D = alpha op(A) op(B) + beta C): none, + bias, GELU writing its
  // input to the aux buffer (with or without bias), GELU's gradient reading the aux buffer.
  enum class Epilogue { kNone, kBias, kGeluAux, kGeluAuxBias, kDGelu };
  // The pointers' alignments (bytes, powers of two up to 256) are part of the key: cuBLASLt's
  // heuristic assumes 256-byte aligned operands unless told, and an algorithm chosen so refuses a
  // less aligned pointer (an expert's rows start anywhere in a grouped buffer). D is C (align_d ==
  // align_c) except for the residual form; the aux buffer (align_aux, 0 without one) is laid out as
  // D (leading dimension ldc). align_bias (0 without a bias) is set by run() from the bias it passes
  // (a staged one at least 16): the heuristic judges the bias's alignment from the pointer it is
  // shown, so a plan chosen on a 256-byte aligned bias is never run on a 16-byte aligned one (the
  // flat bf16 store's biases start anywhere).
  struct Key {
    int64_t m, n, k, lda, ldb, ldc;
    bool ta, tb, c_f32;
    Epilogue epi;
    bool beta0;
    int align_a, align_b, align_c, align_d, align_aux;
    int align_bias = 0;
    // A strided batch (gemm_strided_batched): the problems and their operands' strides (elements);
    // 1 and 0 for one problem.
    int batch = 1;
    int64_t stride_a = 0, stride_b = 0, stride_c = 0;
    auto tie() const {
      return std::tie(m, n, k, lda, ldb, ldc, ta, tb, c_f32, epi, beta0, align_a, align_b, align_c, align_d, align_aux,
                      align_bias, batch, stride_a, stride_b, stride_c);
    }
    bool operator<(const Key& o) const { return tie() < o.tie(); }
  };
  struct Plan;
  struct Operands;  // one call's pointers, scalars and stream: what candidates are timed on
  // What plan() does when cuBLASLt has no algorithm: throw a DeviceError naming the GEMM (the plain
  // and bias forms, which must run), or return null (the fused forms, which fall back).
  enum class Missing { kThrow, kNull };
  // k's plan, made on first use with the heuristic's first answer; with Choice::kTimed and the
  // call's operands, the fastest of its first kTimedCandidates answers instead; with a preset for k,
  // its answer and split. A key without an algorithm is remembered as such (Missing::kNull answers
  // null at once from then on).
  Plan* plan(const Key& k, const Operands* call, Missing missing);
  // The preset's answer and split for k into p (the heuristic's first kTimedCandidates answers, as
  // time_answers lists them); false (p unchanged) where cuBLASLt no longer gives them. Caller holds mu_.
  bool apply_preset(const Key& k, Plan& p, int answer, int split);
  static Key key_of(const GemmChoice& g);
  static GemmChoice choice_of(const Key& k);
  // One GEMM with k's epilogue on o's operands, a bias under 16-byte alignment staged first; false
  // (nothing enqueued) where the fused forms fall back (Missing::kNull).
  bool run(const Key& k, const Operands& o, Missing missing);
  // The call's bias and aux pointers into p's descriptor (cuBLASLt reads them at each matmul, and
  // its heuristic judges their alignment from them).
  static void set_pointers(const Key& k, Plan& p, const Operands& o);
  // The heuristic's first `max` answers for k, then the first answer's split-K variants
  // (time_candidates' order), timed on o (median ms of `reps`); with keep_fastest, p runs the fastest
  // from then on. Caller holds mu_.
  std::vector<double> time_answers(const Key& k, Plan& p, int max, const Operands& o, int reps, bool keep_fastest);
  // *algo (a cublasLtMatmulAlgo_t for p's problem) split K `parts` ways, the parts reduced in fp32
  // in the workspace, where cuBLASLt accepts that within our workspace; false (unchanged) otherwise.
  bool split_k(const Plan& p, void* algo, int parts) const;
  void* workspace_locked(cudaStream_t s);  // the stream's workspace, made on first use; the caller holds mu_
  // linear_bwd_weight's partials form (set_wgrad) in `parts` parts; false (nothing added to dw) where
  // cuBLASLt has no algorithm for its batched GEMM.
  bool wgrad_partials(const bf16* dy, const bf16* x, float* dw, int64_t I, int64_t O, const WgradSplit& sp,
                      cudaStream_t s);

  int device_;
  int sm_target_ = 0;
  int sms_ = 0;  // the SMs this Blas's GEMMs run on (sm_target_, else the device's): wgrad_parts's
  Wgrad wgrad_ = Wgrad::kDirect;
  size_t partial_wgrads_ = 0;
  int split_parts_ = 1;
  void* handle_ = nullptr;  // cublasLtHandle_t
  mutable std::mutex mu_;
  std::map<Key, std::unique_ptr<Plan>> plans_;
  struct Preset {
    int answer, split;
    double ms;  // the file's time, written back with the choice (a preset plan times nothing)
  };
  std::map<Key, Preset> preset_;  // from preset()
  size_t preset_used_ = 0, preset_unusable_ = 0, chosen_ = 0;
  std::map<cudaStream_t, void*> workspaces_;
  Choice choice_ = Choice::kHeuristic;
  Fusion fusion_ = Fusion::kEpilogues;
};

// The three fused ops with their unfused fallback, as runtime/CudaOps.cc's bindings run them: the
// Blas's fused form where it runs, else the unfused kernels in the unfused program's order (so the
// fallback gives the unfused ops' bits). Which ran is returned (the tests and the bench check it).
enum class Path { kFused, kUnfused };
// act, pre [N,O] from x [N,I], w [O,I], bias [O] (bf16, or null). Fallback: linear_fwd into pre,
// then gelu_fwd(pre) into act.
Path linear_gelu(Blas& blas, const bf16* x, const bf16* w, const bf16* bias, bf16* act, bf16* pre, int64_t N,
                 int64_t I, int64_t O, cudaStream_t s);
// dpre [N,I] from dy [N,O], w [O,I], pre [N,I]. Fallback: linear_bwd_data into dpre, then gelu_bwd
// in place (dpre = gelu'(pre) * dpre: each element read before it is written, by one thread).
Path linear_dgrad_gelu(Blas& blas, const bf16* dy, const bf16* w, const bf16* pre, bf16* dpre, int64_t N, int64_t I,
                       int64_t O, cudaStream_t s);
// y [N,O] = skip + x @ w^T (+ bias). The bias twice: its bf16 copy for the fused epilogue (cuBLASLt
// takes a bias of D's type), its fp32 value for the fallback's add_bias (the unfused residual_add's
// kernel); both null or neither. Fallback: linear_fwd into y, then add / add_bias(skip, y) in place.
Path linear_residual(Blas& blas, const bf16* x, const bf16* w, const bf16* bias_bf16, const float* bias_f32,
                     const bf16* skip, bf16* y, int64_t N, int64_t I, int64_t O, cudaStream_t s);

// acc db[O] += sum_n dy[n,:] (fp32), rows in order: deterministic.
void bias_grad(const bf16* dy, float* db, int64_t N, int64_t O, cudaStream_t s);
// The same over O columns of rows ld apart (a column slice of a wider dy: a split weight
// gradient's bias rows).
void bias_grad_strided(const bf16* dy, int64_t ld, float* db, int64_t N, int64_t O, cudaStream_t s);

}  // namespace dhelix::cuda
