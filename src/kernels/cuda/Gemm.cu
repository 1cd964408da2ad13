// cuBLASLt linear layers (Gemm.h). Row-major C = op(A) op(B) is cuBLAS's column-major
// C^T = op(B)^T op(A)^T: the operands swap places and keep their transposes. So cuBLAS's m' is our
// N (a row's width) and its n' our M (the rows): an epilogue's bias, one value per cuBLAS row m', is
// one per column of our row-major output, and the GELU aux matrix, laid out as D (leading dimension
// m' = our row stride), is our row-major [M, N] buffer.
#include "kernels/cuda/Gemm.h"

#include <cublasLt.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "kernels/cuda/Ops.h"
#include "kernels/cuda/SmPartition.h"
#include "tensor/DeviceMemory.h"

namespace dhelix::cuda {

namespace {
constexpr size_t kWorkspaceBytes = 32u << 20;  // cuBLAS's advice for Hopper
cublasLtHandle_t lt(void* h) { return static_cast<cublasLtHandle_t>(h); }
// The largest power of two up to 256 that divides p's address.
int alignment(const void* p) {
  const auto a = reinterpret_cast<uintptr_t>(p);
  int al = 256;
  while (al > 1 && a % static_cast<uintptr_t>(al) != 0) al /= 2;
  return al;
}
// A strided batch's operand: every problem's pointer p + b stride (elements of `size` bytes) has
// at least this alignment, the least of p's and the stride's.
int batch_alignment(const void* p, int64_t stride, size_t size) {
  const int of_p = alignment(p);
  if (stride == 0) return of_p;
  const auto bytes = static_cast<uintptr_t>(stride) * size;
  int al = 256;
  while (al > 1 && bytes % static_cast<uintptr_t>(al) != 0) al /= 2;
  return std::min(of_p, al);
}
}  // namespace

struct Blas::Plan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;  // c: C's and D's (the same layout)
  cublasLtMatmulPreference_t pref = nullptr;  // the workspace and the operands' alignments
  cublasLtMatmulAlgo_t algo{};
  cublasLtMatmulAlgo_t first{};  // the heuristic's first answer (a request for one): kHeuristic's, answer 0
  bool found = true;   // false: cuBLASLt has no algorithm for this key (a fused form falls back)
  bool timed = false;  // algo is the fastest of the timed answers (Choice::kTimed) or the preset's: not retimed
  bool preset = false;  // algo is the preset's choice (Blas::preset)
  bool transient = false;  // planned under Blas::HeuristicOnly: never timed, not in choices() (until used without it)
  int answer = 0;       // algo is the heuristic's answer at this index (of its first kTimedCandidates) ...
  int split = 1;        // ... split K this many ways (1: not split)
  double ms = 0;        // its median time when timed (a preset's: the file's, kept when it is rewritten)
  ~Plan() {
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    if (desc) cublasLtMatmulDescDestroy(desc);
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (c) cublasLtMatrixLayoutDestroy(c);
  }
};

Blas::Blas(int device) : device_(device) {
  require_device(device);
  const int sms = current_sm_count(device);
  if (sms < device_info(device).sms) sm_target_ = sms;
  sms_ = sms;
  cublasLtHandle_t h;
  DHX_CUBLAS(cublasLtCreate(&h));
  handle_ = h;
}

Blas::~Blas() {
  for (auto& [s, w] : workspaces_) cudaFree(w);
  plans_.clear();
  if (handle_) cublasLtDestroy(lt(handle_));
}

size_t Blas::cached_algorithms() const {
  std::lock_guard<std::mutex> g(mu_);
  return static_cast<size_t>(std::count_if(plans_.begin(), plans_.end(), [](const auto& kv) { return kv.second->found; }));
}

size_t Blas::partial_wgrads() const {
  std::lock_guard<std::mutex> g(mu_);
  return partial_wgrads_;
}

size_t Blas::split_plans() const {
  std::lock_guard<std::mutex> g(mu_);
  return static_cast<size_t>(std::count_if(plans_.begin(), plans_.end(), [](const auto& kv) { return kv.second->split > 1; }));
}

namespace {
// Bytes of a row-major C[M, N] with row stride ldc: (M - 1) ldc + N elements; of a strided batch's
// `batch` of them stride_c apart, (batch - 1) stride_c more.
size_t c_extent(int64_t M, int64_t N, int64_t ldc, bool c_f32, int batch = 1, int64_t stride_c = 0) {
  return static_cast<size_t>((batch - 1) * stride_c + (M - 1) * ldc + N) * (c_f32 ? sizeof(float) : sizeof(bf16));
}

// cuBLASLt's epilogue for ours (Gemm.h's Blas::Epilogue), and which pointers it reads.
cublasLtEpilogue_t lt_epilogue(int e) {
  constexpr cublasLtEpilogue_t map[] = {CUBLASLT_EPILOGUE_DEFAULT, CUBLASLT_EPILOGUE_BIAS, CUBLASLT_EPILOGUE_GELU_AUX,
                                        CUBLASLT_EPILOGUE_GELU_AUX_BIAS, CUBLASLT_EPILOGUE_DGELU};
  return map[e];
}
const char* epilogue_name(int e) {
  constexpr const char* names[] = {"none", "bias", "gelu_aux", "gelu_aux_bias", "dgelu"};
  return names[e];
}

// A bias under 16-byte alignment copied to a stream-ordered buffer at a 256-byte boundary (always
// 256: the plan key's bias alignment is then the same for every staged bias, whatever alignment the
// pool's blocks have), freed (stream-ordered) when this goes. cuBLASLt's bias epilogue wants a
// 16-byte aligned bias (a less aligned one fails or faults on some GPUs), but a parameter in the flat
// bf16 store starts at any element; the copy runs the same epilogue, so it gives the same bits.
struct StagedBias {
  void* p = nullptr;
  cudaStream_t s;
  StagedBias(const bf16*& bias, int64_t n, cudaStream_t stream) : s(stream) {
    if (!bias || alignment(bias) >= 16) return;
    const size_t bytes = static_cast<size_t>(n) * sizeof(bf16);
    scratch_malloc(&p, bytes + 256, s);
    const uintptr_t at = (reinterpret_cast<uintptr_t>(p) + 255) & ~static_cast<uintptr_t>(255);
    DHX_CUDA(cudaMemcpyAsync(reinterpret_cast<void*>(at), bias, bytes, cudaMemcpyDeviceToDevice, s));
    bias = reinterpret_cast<const bf16*>(at);
  }
  ~StagedBias() {
    if (p) cudaFreeAsync(p, s);
  }
  StagedBias(const StagedBias&) = delete;
  StagedBias& operator=(const StagedBias&) = delete;
};
}  // namespace

// One call's operands. C is read (beta != 0) and D written; they are the same buffer except for the
// residual form. aux: the GELU epilogues' pre-activation matrix (written by kGeluAux*, read by
// kDGelu), laid out as D.
struct Blas::Operands {
  const bf16* A;
  const bf16* B;
  const void* C;
  void* D;
  const bf16* bias;
  const bf16* aux;
  float alpha, beta;
  size_t c_bytes;  // C's (and D's) extent: (M - 1) ldc + N elements
  cudaStream_t s;
};

void* Blas::workspace_locked(cudaStream_t s) {
  void*& w = workspaces_[s];
  if (!w) {
    cudaError_t e = cudaMalloc(&w, kWorkspaceBytes);
    if (e == cudaErrorMemoryAllocation) {  // the pools' cached blocks back to the driver, then once more
      (void)cudaGetLastError();
      trim_device_pools(device_);
      e = cudaMalloc(&w, kWorkspaceBytes);
    }
    if (e != cudaSuccess) (void)cudaGetLastError();
    DHX_CUDA(e);
  }
  return w;
}

void Blas::set_pointers(const Key& k, Plan& p, const Operands& o) {
  if (k.epi == Epilogue::kBias || k.epi == Epilogue::kGeluAuxBias)
    DHX_CUBLAS(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &o.bias, sizeof(o.bias)));
  if (k.align_aux > 0)
    DHX_CUBLAS(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &o.aux, sizeof(o.aux)));
}

namespace {
template <typename Key> std::string describe(const Key& k) {
  return cat("M=", k.m, " N=", k.n, " K=", k.k, " (trans_a=", k.ta, ", trans_b=", k.tb, ", lda=", k.lda, ", ldb=", k.ldb,
             ", ldc=", k.ldc, ", C ", k.c_f32 ? "fp32" : "bf16", ", epilogue ", epilogue_name(static_cast<int>(k.epi)),
             ", alignments A ", k.align_a, " B ", k.align_b, " C ", k.align_c, " D ", k.align_d, " aux ", k.align_aux,
             " bias ", k.align_bias,
             k.batch > 1 ? cat(", batch ", k.batch, " strides A ", k.stride_a, " B ", k.stride_b, " C ", k.stride_c)
                         : std::string(),
             ")");
}
}  // namespace

// Column-major problem: m' = N, n' = M; A' = B (op = trans_b), B' = A (op = trans_a).
namespace {
thread_local int t_heuristic_only = 0;  // Blas::HeuristicOnly scopes open on this thread
}  // namespace

Blas::HeuristicOnly::HeuristicOnly() { ++t_heuristic_only; }
Blas::HeuristicOnly::~HeuristicOnly() { --t_heuristic_only; }

Blas::Plan* Blas::plan(const Key& k, const Operands* call, Missing missing) {
  std::lock_guard<std::mutex> g(mu_);
  auto it = plans_.find(k);
  if (it != plans_.end()) {
    Plan& p = *it->second;
    if (!p.found) {
      DHX_CUDA_REQUIRE(missing == Missing::kNull, "cuBLASLt has no algorithm for the GEMM ", describe(k));
      return nullptr;
    }
    if (p.transient && !t_heuristic_only) {  // now used outside a HeuristicOnly scope: a choice like any other
      p.transient = false;
      if (!p.preset) ++chosen_;
    }
    // A plan made without operands (time_candidates' study) is timed at its first real call.
    if (choice_ == Choice::kTimed && call && !p.timed && !p.transient) time_answers(k, p, kTimedCandidates, *call, 5, true);
    return &p;
  }
  auto p = std::make_unique<Plan>();
  const cudaDataType_t ct = k.c_f32 ? CUDA_R_32F : CUDA_R_16BF;
  DHX_CUBLAS(cublasLtMatmulDescCreate(&p->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t opa = k.tb ? CUBLAS_OP_T : CUBLAS_OP_N, opb = k.ta ? CUBLAS_OP_T : CUBLAS_OP_N;
  DHX_CUBLAS(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof(opa)));
  DHX_CUBLAS(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof(opb)));
  if (sm_target_ > 0) {
    const int32_t target = sm_target_;
    DHX_CUBLAS(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET, &target, sizeof(target)));
  }
  if (k.epi != Epilogue::kNone) {
    const cublasLtEpilogue_t epi = lt_epilogue(static_cast<int>(k.epi));
    DHX_CUBLAS(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof(epi)));
  }
  // The bias's type is left at its default, D's (bf16): cublasLt.h's CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE
  // allows another type only for IMMA and fp8 kernels. The aux matrix's type likewise stays D's
  // (CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE's default: "the same as the type of elements of the
  // output matrix"), bf16; its leading dimension is D's (EPILOGUE_AUX_LD: a multiple of 8, at least
  // D's rows m' -- the callers check the 8).
  if (k.align_aux > 0) {
    const int64_t ld = k.ldc;
    DHX_CUBLAS(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &ld, sizeof(ld)));
  }
  // Stored shapes (column-major rows x cols) of A' = B, B' = A, C (and D).
  const int64_t m = k.n, n = k.m;
  DHX_CUBLAS(cublasLtMatrixLayoutCreate(&p->a, CUDA_R_16BF, k.tb ? k.k : m, k.tb ? m : k.k, k.ldb));
  DHX_CUBLAS(cublasLtMatrixLayoutCreate(&p->b, CUDA_R_16BF, k.ta ? n : k.k, k.ta ? k.k : n, k.lda));
  DHX_CUBLAS(cublasLtMatrixLayoutCreate(&p->c, ct, m, n, k.ldc));
  if (k.batch > 1) {  // cuBLAS's A is our B, its B our A (the swap above); C and D share p->c
    const int32_t count = k.batch;
    const std::pair<cublasLtMatrixLayout_t, int64_t> strided[] = {{p->a, k.stride_b}, {p->b, k.stride_a},
                                                                  {p->c, k.stride_c}};
    for (const auto& [layout, stride] : strided) {
      DHX_CUBLAS(cublasLtMatrixLayoutSetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof(count)));
      DHX_CUBLAS(cublasLtMatrixLayoutSetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride,
                                                  sizeof(stride)));
    }
  }
  DHX_CUBLAS(cublasLtMatmulPreferenceCreate(&p->pref));
  cublasLtMatmulPreference_t pref = p->pref;
  const size_t ws = kWorkspaceBytes;
  DHX_CUBLAS(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)));
  // cuBLAS's A is our B and its B our A (the swap above).
  const uint32_t al_a = static_cast<uint32_t>(k.align_b), al_b = static_cast<uint32_t>(k.align_a),
                 al_c = static_cast<uint32_t>(k.align_c), al_d = static_cast<uint32_t>(k.align_d);
  DHX_CUBLAS(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al_a, sizeof(al_a)));
  DHX_CUBLAS(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al_b, sizeof(al_b)));
  DHX_CUBLAS(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al_c, sizeof(al_c)));
  DHX_CUBLAS(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al_d, sizeof(al_d)));
  // The heuristic judges the bias's and aux's alignment from their pointers (cublasLt.h, BIAS_POINTER
  // and EPILOGUE_AUX_POINTER): set them from the first call (the aux's alignment is in the key; a
  // bias is staged to 16 bytes or more).
  if (call) set_pointers(k, *p, *call);
  cublasLtMatmulHeuristicResult_t res{};
  int found = 0;
  const cublasStatus_t st =
      cublasLtMatmulAlgoGetHeuristic(lt(handle_), p->desc, p->a, p->b, p->c, p->c, pref, 1, &res, &found);
  if (st != CUBLAS_STATUS_SUCCESS || found == 0) {
    DHX_CUDA_REQUIRE(missing == Missing::kNull, "cuBLASLt has no algorithm for the GEMM ", describe(k), ": status ",
                     static_cast<int>(st));
    p->found = false;  // remembered: the fused form falls back at once from now on
    plans_.emplace(k, std::move(p));
    return nullptr;
  }
  p->algo = p->first = res.algo;
  if (const auto pre = preset_.find(k); pre != preset_.end()) {
    if (apply_preset(k, *p, pre->second.answer, pre->second.split)) {
      p->preset = p->timed = true;
      p->ms = pre->second.ms;
      ++preset_used_;
    } else {
      ++preset_unusable_;
    }
  }
  if (!p->preset && choice_ == Choice::kSplitK) p->split = split_k(*p, &p->algo, split_parts_) ? split_parts_ : 1;
  p->transient = t_heuristic_only != 0 && !p->preset;  // a preset's key stays in the file it came from
  if (!p->preset && !p->transient) ++chosen_;
  Plan& made = *plans_.emplace(k, std::move(p)).first->second;
  if (!made.preset && !made.transient && choice_ == Choice::kTimed && call)
    time_answers(k, made, kTimedCandidates, *call, 5, true);
  return &made;
}

bool Blas::split_k(const Plan& p, void* algo_ptr, int parts) const {
  cublasLtMatmulAlgo_t& algo = *static_cast<cublasLtMatmulAlgo_t*>(algo_ptr);
  int32_t own = 1;
  size_t got = 0;
  if (cublasLtMatmulAlgoConfigGetAttribute(&algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &own, sizeof(own), &got) !=
          CUBLAS_STATUS_SUCCESS ||
      own != 1)
    return false;  // already split: not the form to vary
  cublasLtMatmulAlgo_t a = algo;
  const int32_t split = parts;
  const uint32_t scheme = CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE;
  cublasLtMatmulHeuristicResult_t check{};
  const bool ok =
      cublasLtMatmulAlgoConfigSetAttribute(&a, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &split, sizeof(split)) ==
          CUBLAS_STATUS_SUCCESS &&
      cublasLtMatmulAlgoConfigSetAttribute(&a, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, &scheme, sizeof(scheme)) ==
          CUBLAS_STATUS_SUCCESS &&
      cublasLtMatmulAlgoCheck(lt(handle_), p.desc, p.a, p.b, p.c, p.c, &a, &check) == CUBLAS_STATUS_SUCCESS &&
      check.state == CUBLAS_STATUS_SUCCESS && check.workspaceSize <= kWorkspaceBytes;
  if (ok) algo = a;
  return ok;
}

std::vector<double> Blas::time_answers(const Key& k, Plan& p, int max, const Operands& o, int reps,
                                       bool keep_fastest) {
  constexpr int kMaxAnswers = 32;
  cublasLtMatmulHeuristicResult_t res[kMaxAnswers];
  int found = 0;
  set_pointers(k, p, o);
  DHX_CUBLAS(cublasLtMatmulAlgoGetHeuristic(lt(handle_), p.desc, p.a, p.b, p.c, p.c, p.pref,
                                            std::min(std::max(max, 1), kMaxAnswers), res, &found));
  void* ws = workspace_locked(o.s);
  // D's stand-in (each candidate writes it; with beta 1 and C the same buffer as D, reads it: a copy
  // of C) and the two events, released however this returns. A C apart from D (the residual form)
  // is read where it is and never written. A GELU forward's aux output is written where it is: the
  // call's pre, which the call itself writes after the timing. DGELU's aux is only read.
  struct Scratch {
    void* p = nullptr;
    cudaEvent_t e0 = nullptr, e1 = nullptr;
    cudaStream_t s;
    ~Scratch() {
      if (e0) cudaEventDestroy(e0);
      if (e1) cudaEventDestroy(e1);
      if (p) cudaFreeAsync(p, s);
    }
  } tmp{nullptr, nullptr, nullptr, o.s};
  scratch_malloc(&tmp.p, o.c_bytes, o.s);
  void* scratch = tmp.p;
  // (beta 0 never reads C: nothing to copy; an uninitialised read would also trip compute-sanitizer's
  // initcheck.)
  if (!k.beta0) DHX_CUDA(cudaMemcpyAsync(scratch, o.C, o.c_bytes, cudaMemcpyDeviceToDevice, o.s));
  const void* c_in = o.C == o.D ? scratch : o.C;
  DHX_CUDA(cudaEventCreate(&tmp.e0));
  DHX_CUDA(cudaEventCreate(&tmp.e1));
  const cudaEvent_t e0 = tmp.e0, e1 = tmp.e1;
  // The candidates: the heuristic's answers, then the first one split K ways (Gemm.h). A split that
  // cuBLASLt refuses for this problem, or whose workspace is more than ours, stays a candidate that
  // cannot run (ok false: infinite time), so the list's layout is the same for every shape. Answer 0
  // is the plan's own first answer (p.first: what kHeuristic runs), so that "answer 0" names one
  // algorithm in a choices file whichever list it came from; answers 1.. are this request's.
  struct Candidate {
    cublasLtMatmulAlgo_t algo;
    bool ok;
  };
  std::vector<Candidate> cand;
  for (int i = 0; i < found; ++i)
    cand.push_back({i == 0 ? p.first : res[i].algo, i == 0 || res[i].state == CUBLAS_STATUS_SUCCESS});
  for (int parts : kSplitKParts) {
    Candidate c{p.first, false};
    c.ok = found > 0 && split_k(p, &c.algo, parts);
    cand.push_back(c);
  }
  std::vector<double> ms;
  for (const Candidate& c : cand) {
    const cublasLtMatmulAlgo_t* algo = &c.algo;
    // An answer that refuses these operands is skipped (infinite time), as is any that fails.
    if (!c.ok ||
        cublasLtMatmul(lt(handle_), p.desc, &o.alpha, o.B, p.a, o.A, p.b, &o.beta, c_in, p.c, scratch, p.c, algo, ws,
                       kWorkspaceBytes, o.s) != CUBLAS_STATUS_SUCCESS) {
      ms.push_back(std::numeric_limits<double>::infinity());
      continue;
    }
    std::vector<double> t;
    for (int r = 0; r < reps; ++r) {
      DHX_CUDA(cudaEventRecord(e0, o.s));
      DHX_CUBLAS(cublasLtMatmul(lt(handle_), p.desc, &o.alpha, o.B, p.a, o.A, p.b, &o.beta, c_in, p.c, scratch, p.c,
                                algo, ws, kWorkspaceBytes, o.s));
      DHX_CUDA(cudaEventRecord(e1, o.s));
      DHX_CUDA(cudaEventSynchronize(e1));
      float f = 0;
      DHX_CUDA(cudaEventElapsedTime(&f, e0, e1));
      t.push_back(f);
    }
    std::sort(t.begin(), t.end());
    ms.push_back(t[t.size() / 2]);
  }
  if (keep_fastest && !ms.empty()) {
    const size_t best = static_cast<size_t>(std::min_element(ms.begin(), ms.end()) - ms.begin());
    if (std::isfinite(ms[best])) {  // (ms and cand in the same order: the answers, then the splits of the first)
      p.algo = cand[best].algo;
      const bool split = best >= static_cast<size_t>(found);
      p.answer = split ? 0 : static_cast<int>(best);
      p.split = split ? kSplitKParts[best - static_cast<size_t>(found)] : 1;
      p.ms = ms[best];
    }
    p.timed = true;
  }
  return ms;
}

std::vector<double> Blas::time_candidates(Op op_a, Op op_b, int64_t M, int64_t N, int64_t K, const bf16* A,
                                          int64_t lda, const bf16* B, int64_t ldb, float beta, const void* C,
                                          int64_t ldc, Out out, int max, int reps, cudaStream_t s) {
  const bool c_f32 = out == Out::kF32;
  DHX_CUDA_ASSERT(M > 0 && N > 0 && K > 0 && max > 0 && reps > 0, "time_candidates M=", M, " N=", N, " K=", K,
                  " max=", max, " reps=", reps, ": every size must be positive");
  const Key key{M,     N,         K, lda, ldb, ldc, op_a == Op::kT, op_b == Op::kT, c_f32, Epilogue::kNone,
                beta == 0.0f, alignment(A), alignment(B), alignment(C), alignment(C), 0};
  Plan& p = *plan(key, nullptr, Missing::kThrow);
  // D is C (never written: the study writes a scratch copy of C).
  const Operands o{A, B, C, const_cast<void*>(C), nullptr, nullptr, 1.0f, beta, c_extent(M, N, ldc, c_f32), s};
  std::lock_guard<std::mutex> g(mu_);
  return time_answers(key, p, max, o, reps, false);
}

bool Blas::apply_preset(const Key& k, Plan& p, int answer, int split) {
  // The answers as time_answers lists them: answer 0 the plan's first (a request for one), answers
  // 1.. of a request for the first kTimedCandidates.
  (void)k;
  if (answer < 0 || answer >= kTimedCandidates) return false;
  cublasLtMatmulAlgo_t algo = p.first;
  if (answer > 0) {
    cublasLtMatmulHeuristicResult_t res[kTimedCandidates];
    int found = 0;
    if (cublasLtMatmulAlgoGetHeuristic(lt(handle_), p.desc, p.a, p.b, p.c, p.c, p.pref, kTimedCandidates, res,
                                       &found) != CUBLAS_STATUS_SUCCESS ||
        found <= answer || res[answer].state != CUBLAS_STATUS_SUCCESS)
      return false;
    algo = res[answer].algo;
  }
  if (split > 1 && !split_k(p, &algo, split)) return false;
  p.algo = algo;
  p.answer = answer;
  p.split = split;
  return true;
}

Blas::Key Blas::key_of(const GemmChoice& g) {
  int e = 0;
  while (e < 5 && g.epilogue != epilogue_name(e)) ++e;
  DHX_CUDA_ASSERT(e < 5, "GEMM choice with an unknown epilogue '", g.epilogue, "'");
  Key k{g.m,       g.n,       g.k,     g.lda,   g.ldb,   g.ldc,   g.trans_a, g.trans_b, g.c_f32, static_cast<Epilogue>(e),
        g.beta0,   g.align_a, g.align_b, g.align_c, g.align_d, g.align_aux};
  k.align_bias = g.align_bias;
  k.batch = g.batch, k.stride_a = g.stride_a, k.stride_b = g.stride_b, k.stride_c = g.stride_c;
  return k;
}

GemmChoice Blas::choice_of(const Key& k) {
  GemmChoice g;
  g.m = k.m, g.n = k.n, g.k = k.k, g.lda = k.lda, g.ldb = k.ldb, g.ldc = k.ldc;
  g.trans_a = k.ta, g.trans_b = k.tb, g.c_f32 = k.c_f32, g.beta0 = k.beta0;
  g.epilogue = epilogue_name(static_cast<int>(k.epi));
  g.align_a = k.align_a, g.align_b = k.align_b, g.align_c = k.align_c, g.align_d = k.align_d;
  g.align_aux = k.align_aux, g.align_bias = k.align_bias;
  g.batch = k.batch, g.stride_a = k.stride_a, g.stride_b = k.stride_b, g.stride_c = k.stride_c;
  return g;
}

GemmChoices Blas::choices() const {
  GemmChoices c;
  const DeviceInfo info = device_info(device_);
  c.device = info.name;
  c.sms = info.sms;
  c.sm_target = sm_target_;
  c.cublaslt_version = static_cast<int64_t>(cublasLtGetVersion());
  std::lock_guard<std::mutex> g(mu_);
  // One list in key order, the planned keys and the preset's not planned (yet) alike: a file
  // rewritten holding the same choices has the same bytes, whichever keys this run planned first.
  std::map<Key, GemmChoice> all;
  for (const auto& [k, p] : plans_) {
    if (!p->found || p->transient) continue;
    GemmChoice ch = choice_of(k);
    ch.answer = p->answer, ch.split = p->split, ch.ms = p->ms;
    all.emplace(k, std::move(ch));
  }
  for (const auto& [k, as] : preset_) {
    // (A preset key planned in this run but not kept above -- its plan transient, or not found --
    // stays as the file had it.)
    if (auto it = plans_.find(k); it != plans_.end() && it->second->found && !it->second->transient) continue;
    GemmChoice ch = choice_of(k);
    ch.answer = as.answer, ch.split = as.split, ch.ms = as.ms;
    all.emplace(k, std::move(ch));
  }
  for (auto& [k, ch] : all) c.choices.push_back(std::move(ch));
  return c;
}

void Blas::preset(const GemmChoices& c) {
  std::lock_guard<std::mutex> g(mu_);
  for (const GemmChoice& ch : c.choices) preset_[key_of(ch)] = {ch.answer, ch.split, ch.ms};
}

size_t Blas::preset_used() const {
  std::lock_guard<std::mutex> g(mu_);
  return preset_used_;
}
size_t Blas::preset_unusable() const {
  std::lock_guard<std::mutex> g(mu_);
  return preset_unusable_;
}
size_t Blas::chosen_here() const {
  std::lock_guard<std::mutex> g(mu_);
  return chosen_;
}

bool Blas::run(const Key& key, const Operands& call, Missing missing) {
  Operands o = call;
  const StagedBias staged(o.bias, key.n, o.s);  // the bias has N (cuBLAS's m') elements
  Key k = key;
  k.align_bias = o.bias ? alignment(o.bias) : 0;  // the pointer the heuristic and the matmul see
  Plan* p = plan(k, &o, missing);
  if (!p) return false;
  // The pointers live in the plan's descriptor, shared by every call of the key: set and used under
  // the lock, so that two host threads sharing this Blas cannot swap each other's bias or aux (the
  // matmul only enqueues).
  std::lock_guard<std::mutex> g(mu_);
  set_pointers(k, *p, o);
  void* ws = workspace_locked(o.s);
  const cublasStatus_t st = cublasLtMatmul(lt(handle_), p->desc, &o.alpha, o.B, p->a, o.A, p->b, &o.beta, o.C, p->c,
                                           o.D, p->c, &p->algo, ws, kWorkspaceBytes, o.s);
  if (st == CUBLAS_STATUS_SUCCESS) return true;
  // A fused form that cuBLASLt refuses at the call (its checks of the operands, before anything is
  // enqueued) falls back, now and from now on (the same path every step).
  if (missing == Missing::kNull && (st == CUBLAS_STATUS_NOT_SUPPORTED || st == CUBLAS_STATUS_INVALID_VALUE)) {
    p->found = false;
    return false;
  }
  throw_cublas_error(static_cast<int>(st), cat("cublasLtMatmul ", describe(k)).c_str(), __FILE__, __LINE__);
}

void Blas::gemm(Op op_a, Op op_b, int64_t M, int64_t N, int64_t K, float alpha, const bf16* A, int64_t lda,
                const bf16* B, int64_t ldb, float beta, void* C, int64_t ldc, Out out, const bf16* bias,
                cudaStream_t s) {
  const bool trans_a = op_a == Op::kT, trans_b = op_b == Op::kT, c_f32 = out == Out::kF32;
  DHX_CUDA_ASSERT(M > 0 && N > 0 && K > 0, "gemm M=", M, " N=", N, " K=", K, ": every size must be positive");
  DHX_CUDA_ASSERT(!(bias && c_f32), "gemm: a bias epilogue needs a bf16 output");
  const Key key{M,           N,           K,           lda,         ldb, ldc, trans_a, trans_b, c_f32,
                bias ? Epilogue::kBias : Epilogue::kNone, beta == 0.0f, alignment(A), alignment(B),
                alignment(C), alignment(C), 0};
  run(key, Operands{A, B, C, C, bias, nullptr, alpha, beta, c_extent(M, N, ldc, c_f32), s}, Missing::kThrow);
}

void Blas::linear_fwd(const bf16* x, const bf16* w, const bf16* bias, bf16* y, int64_t N, int64_t I, int64_t O,
                      cudaStream_t s) {
  gemm(Op::kN, Op::kT, N, O, I, 1.0f, x, I, w, I, 0.0f, y, O, Out::kBf16, bias, s);
}

void Blas::linear_bwd_data(const bf16* dy, const bf16* w, bf16* dx, int64_t N, int64_t I, int64_t O, Accumulate acc,
                           cudaStream_t s) {
  gemm(Op::kN, Op::kN, N, I, O, 1.0f, dy, O, w, I, acc == Accumulate::kYes ? 1.0f : 0.0f, dx, I, Out::kBf16, nullptr,
       s);
}

bool Blas::gemm_strided_batched(Op op_a, Op op_b, int64_t M, int64_t N, int64_t K, float alpha, const bf16* A,
                                int64_t lda, int64_t stride_a, const bf16* B, int64_t ldb, int64_t stride_b,
                                float beta, void* C, int64_t ldc, int64_t stride_c, int batch, Out out,
                                cudaStream_t s) {
  const bool c_f32 = out == Out::kF32;
  DHX_CUDA_ASSERT(M > 0 && N > 0 && K > 0 && batch >= 1 && stride_a >= 0 && stride_b >= 0 && stride_c >= 0,
                  "gemm_strided_batched M=", M, " N=", N, " K=", K, " batch=", batch, " strides ", stride_a, " ",
                  stride_b, " ", stride_c, ": sizes and the batch must be positive, strides not negative");
  const size_t c_size = c_f32 ? sizeof(float) : sizeof(bf16);
  const int align_c = batch_alignment(C, stride_c, c_size);
  Key key{M,    N,    K,    lda, ldb, ldc, op_a == Op::kT, op_b == Op::kT, c_f32, Epilogue::kNone, beta == 0.0f,
          batch_alignment(A, stride_a, sizeof(bf16)), batch_alignment(B, stride_b, sizeof(bf16)), align_c, align_c, 0};
  key.batch = batch, key.stride_a = stride_a, key.stride_b = stride_b, key.stride_c = stride_c;
  return run(key, Operands{A, B, C, C, nullptr, nullptr, alpha, beta, c_extent(M, N, ldc, c_f32, batch, stride_c), s},
             Missing::kNull);
}

int Blas::wgrad_parts(int64_t N, int64_t I, int64_t O, int sms) {
  if (N <= 0 || I <= 0 || O <= 0 || sms <= 0) return 1;
  const int64_t tiles = cdiv(O, 128) * cdiv(I, 128), want = 2 * static_cast<int64_t>(sms);
  int p = 1;
  while (p < kMaxWgradParts && p * tiles < want) p *= 2;
  while (p > 1 && N / p / kPartRowAlign * kPartRowAlign < kMinPartRows) p /= 2;
  return p;
}

namespace {
// dw[i] += ((part_0[i] + part_1[i]) + ...) + part_{parts-1}[i], part_p = part + p stride: each element
// by one thread in part order (bitwise repeatable). vec: four elements a thread (n, stride a
// multiple of 4, dw and part 16-byte aligned), the same sums.
__global__ void wgrad_sum_kernel(const float* __restrict__ part, int64_t stride, int parts, float* __restrict__ dw,
                                 int64_t n, bool vec) {
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  if (vec) {
    for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; 4 * i < n; i += step) {
      float4 acc = reinterpret_cast<const float4*>(part)[i];
      for (int p = 1; p < parts; ++p) {
        const float4 v = reinterpret_cast<const float4*>(part + p * stride)[i];
        acc.x += v.x, acc.y += v.y, acc.z += v.z, acc.w += v.w;
      }
      float4 d = reinterpret_cast<float4*>(dw)[i];
      d.x += acc.x, d.y += acc.y, d.z += acc.z, d.w += acc.w;
      reinterpret_cast<float4*>(dw)[i] = d;
    }
    return;
  }
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += step) {
    float acc = part[i];
    for (int p = 1; p < parts; ++p) acc += part[p * stride + i];
    dw[i] += acc;
  }
}
}  // namespace

Blas::WgradSplit Blas::wgrad_split(int64_t N, int64_t I, int64_t O, int sms) {
  WgradSplit sp;
  sp.parts = wgrad_parts(N, I, O, sms);
  if (sp.parts == 1) {
    sp.rows = N;
    return sp;
  }
  sp.rows = N / sp.parts / kPartRowAlign * kPartRowAlign;  // >= kMinPartRows: wgrad_parts halves until it is
  sp.rest = N - sp.parts * sp.rows;
  sp.stride = cdiv(O * I, 64) * 64;
  return sp;
}

bool Blas::wgrad_partials(const bf16* dy, const bf16* x, float* dw, int64_t I, int64_t O, const WgradSplit& sp,
                          cudaStream_t s) {
  const int parts = sp.parts;
  const int64_t rows = sp.rows, n = O * I, stride = sp.stride;
  // The partials' scratch, freed (stream-ordered) however this returns.
  struct Scratch {
    float* p = nullptr;
    cudaStream_t s;
    ~Scratch() {
      if (p) cudaFreeAsync(p, s);
    }
  } scratch{nullptr, s};
  scratch_malloc(&scratch.p, static_cast<size_t>(parts * stride) * sizeof(float), s);
  float* part = scratch.p;
  const bool ran = gemm_strided_batched(Op::kT, Op::kN, O, I, rows, 1.0f, dy, O, rows * O, x, I, rows * I, 0.0f, part,
                                        I, stride, parts, Out::kF32, s);
  if (ran) {
    const bool vec = n % 4 == 0 && stride % 4 == 0 && reinterpret_cast<uintptr_t>(dw) % 16 == 0 &&
                     reinterpret_cast<uintptr_t>(part) % 16 == 0;
    const int64_t items = vec ? n / 4 : n;
    const auto blocks = static_cast<unsigned>(std::min<int64_t>(cdiv(items, 256), 8 * static_cast<int64_t>(sms_)));
    wgrad_sum_kernel<<<blocks, 256, 0, s>>>(part, stride, parts, dw, n, vec);
    DHX_CUDA_LAUNCHED(wgrad_sum_kernel);
    const int64_t done = parts * rows;
    if (sp.rest > 0)  // the rows past the parts, added last
      gemm(Op::kT, Op::kN, O, I, sp.rest, 1.0f, dy + done * O, O, x + done * I, I, 1.0f, dw, I, Out::kF32, nullptr,
           s);
  }
  if (ran) {
    std::lock_guard<std::mutex> g(mu_);
    ++partial_wgrads_;
  }
  return ran;
}

void Blas::linear_bwd_weight(const bf16* dy, const bf16* x, float* dw, float* db, int64_t N, int64_t I, int64_t O,
                             cudaStream_t s) {
  const WgradSplit sp = wgrad_ == Wgrad::kPartials ? wgrad_split(N, I, O, sms_) : WgradSplit{1, N, 0, 0};
  if (sp.parts == 1 || !wgrad_partials(dy, x, dw, I, O, sp, s))
    gemm(Op::kT, Op::kN, O, I, N, 1.0f, dy, O, x, I, 1.0f, dw, I, Out::kF32, nullptr, s);
  if (db) bias_grad(dy, db, N, O, s);
}

// ---- the fused forms ----
// The aux matrix's rules that we check before asking cuBLASLt: its leading dimension (our row width)
// a multiple of 8 (cublasLt.h, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD), and its pointer 16-byte
// aligned (the bias's rule above; a GELU aux row is read and written in 16-byte vectors).
namespace {
bool aux_fits(const bf16* aux, int64_t ld) { return ld % 8 == 0 && alignment(aux) >= 16; }
void check_sizes(const char* what, int64_t N, int64_t I, int64_t O) {
  DHX_CUDA_ASSERT(N > 0 && I > 0 && O > 0, what, " N=", N, " I=", I, " O=", O, ": every size must be positive");
}
}  // namespace

bool Blas::linear_fwd_gelu(const bf16* x, const bf16* w, const bf16* bias, bf16* act, bf16* pre, int64_t N, int64_t I,
                           int64_t O, cudaStream_t s) {
  check_sizes("linear_fwd_gelu", N, I, O);
  if (fusion_ == Fusion::kUnfused || !aux_fits(pre, O)) return false;
  // As linear_fwd: row-major act[N,O] = x[N,I] w[O,I]^T, the aux (pre) laid out as act.
  const Key key{N, O, I, I, I, O, false, true, false, bias ? Epilogue::kGeluAuxBias : Epilogue::kGeluAux, true,
                alignment(x), alignment(w), alignment(act), alignment(act), alignment(pre)};
  return run(key, Operands{x, w, act, act, bias, pre, 1.0f, 0.0f, c_extent(N, O, O, false), s}, Missing::kNull);
}

bool Blas::linear_bwd_data_dgelu(const bf16* dy, const bf16* w, const bf16* pre, bf16* dpre, int64_t N, int64_t I,
                                 int64_t O, cudaStream_t s) {
  check_sizes("linear_bwd_data_dgelu", N, I, O);
  if (fusion_ == Fusion::kUnfused || !aux_fits(pre, I)) return false;
  // As linear_bwd_data: row-major dpre[N,I] = dy[N,O] w[O,I], the aux (pre) laid out as dpre.
  const Key key{N, I, O, O, I, I, false, false, false, Epilogue::kDGelu, true,
                alignment(dy), alignment(w), alignment(dpre), alignment(dpre), alignment(pre)};
  return run(key, Operands{dy, w, dpre, dpre, nullptr, pre, 1.0f, 0.0f, c_extent(N, I, I, false), s}, Missing::kNull);
}

bool Blas::linear_fwd_residual(const bf16* x, const bf16* w, const bf16* bias, const bf16* skip, bf16* y, int64_t N,
                               int64_t I, int64_t O, cudaStream_t s) {
  check_sizes("linear_fwd_residual", N, I, O);
  if (fusion_ == Fusion::kUnfused) return false;
  // D = x w^T + 1 * C (+ bias) with C = skip, D = y: the sum in fp32, rounded once.
  const Key key{N, O, I, I, I, O, false, true, false, bias ? Epilogue::kBias : Epilogue::kNone, false,
                alignment(x), alignment(w), alignment(skip), alignment(y), 0};
  return run(key, Operands{x, w, skip, y, bias, nullptr, 1.0f, 1.0f, c_extent(N, O, O, false), s}, Missing::kNull);
}

Path linear_gelu(Blas& blas, const bf16* x, const bf16* w, const bf16* bias, bf16* act, bf16* pre, int64_t N,
                 int64_t I, int64_t O, cudaStream_t s) {
  if (blas.linear_fwd_gelu(x, w, bias, act, pre, N, I, O, s)) return Path::kFused;
  blas.linear_fwd(x, w, bias, pre, N, I, O, s);
  gelu_fwd(pre, act, N * O, s);
  return Path::kUnfused;
}

Path linear_dgrad_gelu(Blas& blas, const bf16* dy, const bf16* w, const bf16* pre, bf16* dpre, int64_t N, int64_t I,
                       int64_t O, cudaStream_t s) {
  if (blas.linear_bwd_data_dgelu(dy, w, pre, dpre, N, I, O, s)) return Path::kFused;
  blas.linear_bwd_data(dy, w, dpre, N, I, O, Accumulate::kNo, s);
  gelu_bwd(dpre, pre, dpre, N * I, s);
  return Path::kUnfused;
}

Path linear_residual(Blas& blas, const bf16* x, const bf16* w, const bf16* bias_bf16, const float* bias_f32,
                     const bf16* skip, bf16* y, int64_t N, int64_t I, int64_t O, cudaStream_t s) {
  DHX_CUDA_ASSERT((bias_bf16 == nullptr) == (bias_f32 == nullptr),
                  "linear_residual: the bias's bf16 copy and fp32 value must both be given or both be null");
  DHX_CUDA_ASSERT(skip != y, "linear_residual: skip must not be y (the fallback's GEMM writes y before reading skip)");
  if (blas.linear_fwd_residual(x, w, bias_bf16, skip, y, N, I, O, s)) return Path::kFused;
  blas.linear_fwd(x, w, nullptr, y, N, I, O, s);
  if (bias_f32)
    add_bias(skip, y, bias_f32, y, N, O, s);
  else
    add(skip, y, y, N * O, s);
  return Path::kUnfused;
}

// ---- bias gradient: column sums in two deterministic stages ----
// Stage 1: block (column tile of 2 * kBgCols columns, chunk of kBgRows rows); each thread sums two
// adjacent columns (one 4-byte load per row, a warp reading 256 contiguous bytes) over the chunk's
// rows in order. Stage 2: one thread per column adds the chunks' partial sums in chunk order. The
// order never depends on scheduling: bitwise repeatable. Bytes: N*O*2 read once, (N/32)*O*4 twice.
// (An earlier version, 256-row chunks and 2-byte loads, took 50 us for 16384 x 768 on an H200.)
namespace {
constexpr int kBgRows = 32;   // rows per partial sum: many blocks in flight
constexpr int kBgCols = 128;  // threads per block, two columns each

// dy rows of stride ld (>= O); vec: ld and O even and dy 4-byte aligned (the two-column loads).
__global__ void bias_grad_partial(const bf16* __restrict__ dy, float* __restrict__ part, int64_t N, int64_t O,
                                  int64_t ld, bool vec) {
  const int64_t c0 = (static_cast<int64_t>(blockIdx.x) * kBgCols + threadIdx.x) * 2;
  const int64_t chunk = blockIdx.y;
  if (c0 >= O) return;
  const int64_t r0 = chunk * kBgRows, r1 = r0 + kBgRows < N ? r0 + kBgRows : N;
  float a0 = 0.0f, a1 = 0.0f;
  if (vec) {
    const __nv_bfloat162* p = reinterpret_cast<const __nv_bfloat162*>(dy + r0 * ld + c0);
    const int64_t step = ld / 2;
#pragma unroll 8
    for (int64_t r = r0; r < r1; ++r, p += step) {
      const float2 v = __bfloat1622float2(*p);
      a0 += v.x;
      a1 += v.y;
    }
  } else {
    for (int64_t r = r0; r < r1; ++r) {
      a0 += __bfloat162float(dy[r * ld + c0]);
      if (c0 + 1 < O) a1 += __bfloat162float(dy[r * ld + c0 + 1]);
    }
  }
  part[chunk * O + c0] = a0;
  if (c0 + 1 < O) part[chunk * O + c0 + 1] = a1;
}

__global__ void bias_grad_final(const float* __restrict__ part, float* __restrict__ db, int64_t chunks, int64_t O) {
  const int64_t col = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (col >= O) return;
  float acc = 0.0f;
  for (int64_t c = 0; c < chunks; ++c) acc += part[c * O + col];
  db[col] += acc;
}
}  // namespace

void bias_grad_strided(const bf16* dy, int64_t ld, float* db, int64_t N, int64_t O, cudaStream_t s) {
  DHX_CUDA_ASSERT(N >= 0 && O >= 1 && ld >= O, "bias_grad: N=", N, " O=", O, " ld=", ld, " (need N >= 0, 1 <= O <= ld)");
  if (N == 0) return;
  const int64_t chunks = cdiv(N, kBgRows);
  DHX_CUDA_ASSERT(chunks <= 65535, "bias_grad: N=", N, " rows is more than 65535 chunks of ", kBgRows);
  const bool vec = O % 2 == 0 && ld % 2 == 0 && reinterpret_cast<uintptr_t>(dy) % 4 == 0;
  float* part = nullptr;
  scratch_malloc(&part, chunks * O * sizeof(float), s);
  bias_grad_partial<<<dim3(static_cast<unsigned>(cdiv(O, 2 * kBgCols)), static_cast<unsigned>(chunks)), kBgCols, 0, s>>>(
      dy, part, N, O, ld, vec);
  DHX_CUDA_LAUNCHED(bias_grad_partial);
  bias_grad_final<<<static_cast<unsigned>(cdiv(O, 256)), 256, 0, s>>>(part, db, chunks, O);
  DHX_CUDA_LAUNCHED(bias_grad_final);
  DHX_CUDA(cudaFreeAsync(part, s));
}

void bias_grad(const bf16* dy, float* db, int64_t N, int64_t O, cudaStream_t s) { bias_grad_strided(dy, O, db, N, O, s); }

}  // namespace dhelix::cuda
