// cuBLASLt linear layers (Gemm.h). Row-major C = op(A) op(B) is cuBLAS's column-major
// C^T = op(B)^T op(A)^T: the operands swap places and keep their transposes.
#include "kernels/cuda/Gemm.h"

#include <cublasLt.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "kernels/cuda/SmPartition.h"

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
}  // namespace

struct Blas::Plan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulPreference_t pref = nullptr;  // the workspace and the operands' alignments
  cublasLtMatmulAlgo_t algo{};
  bool timed = false;  // algo is the fastest of the timed answers (Choice::kTimed), not the first
  int split = 1;       // Choice::kSplitK: the parts algo splits K into (1: cuBLASLt refused the split)
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
  return plans_.size();
}

size_t Blas::split_plans() const {
  std::lock_guard<std::mutex> g(mu_);
  return static_cast<size_t>(std::count_if(plans_.begin(), plans_.end(), [](const auto& kv) { return kv.second->split > 1; }));
}

namespace {
// Bytes of a row-major C[M, N] with row stride ldc: (M - 1) ldc + N elements.
size_t c_extent(int64_t M, int64_t N, int64_t ldc, bool c_f32) {
  return static_cast<size_t>((M - 1) * ldc + N) * (c_f32 ? sizeof(float) : sizeof(bf16));
}
}  // namespace

struct Blas::Operands {
  const bf16* A;
  const bf16* B;
  const void* C;
  const bf16* bias;
  float alpha, beta;
  size_t c_bytes;  // C's extent: (M - 1) ldc + N elements
  cudaStream_t s;
};

void* Blas::workspace(cudaStream_t s) {
  std::lock_guard<std::mutex> g(mu_);
  return workspace_locked(s);
}

void* Blas::workspace_locked(cudaStream_t s) {
  void*& w = workspaces_[s];
  if (!w) DHX_CUDA(cudaMalloc(&w, kWorkspaceBytes));
  return w;
}

// Column-major problem: m' = N, n' = M; A' = B (op = trans_b), B' = A (op = trans_a).
Blas::Plan& Blas::plan(const Key& k, const Operands* call) {
  std::lock_guard<std::mutex> g(mu_);
  auto it = plans_.find(k);
  if (it != plans_.end()) {
    // A plan made without operands (time_candidates' study) is timed at its first real call.
    if (choice_ == Choice::kTimed && call && !it->second->timed) time_answers(k, *it->second, kTimedCandidates, *call, 5, true);
    return *it->second;
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
  if (k.bias) {
    const cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_BIAS;
    DHX_CUBLAS(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof(epi)));
  }
  // Stored shapes (column-major rows x cols) of A' = B, B' = A, C.
  const int64_t m = k.n, n = k.m;
  DHX_CUBLAS(cublasLtMatrixLayoutCreate(&p->a, CUDA_R_16BF, k.tb ? k.k : m, k.tb ? m : k.k, k.ldb));
  DHX_CUBLAS(cublasLtMatrixLayoutCreate(&p->b, CUDA_R_16BF, k.ta ? n : k.k, k.ta ? k.k : n, k.lda));
  DHX_CUBLAS(cublasLtMatrixLayoutCreate(&p->c, ct, m, n, k.ldc));
  DHX_CUBLAS(cublasLtMatmulPreferenceCreate(&p->pref));
  cublasLtMatmulPreference_t pref = p->pref;
  const size_t ws = kWorkspaceBytes;
  DHX_CUBLAS(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)));
  // cuBLAS's A is our B and its B our A (the swap above); C and D are the same buffer.
  const uint32_t al_a = static_cast<uint32_t>(k.align_b), al_b = static_cast<uint32_t>(k.align_a),
                 al_c = static_cast<uint32_t>(k.align_c);
  DHX_CUBLAS(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al_a, sizeof(al_a)));
  DHX_CUBLAS(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al_b, sizeof(al_b)));
  DHX_CUBLAS(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al_c, sizeof(al_c)));
  DHX_CUBLAS(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al_c, sizeof(al_c)));
  cublasLtMatmulHeuristicResult_t res{};
  int found = 0;
  const cublasStatus_t st =
      cublasLtMatmulAlgoGetHeuristic(lt(handle_), p->desc, p->a, p->b, p->c, p->c, pref, 1, &res, &found);
  DHX_CUDA_REQUIRE(st == CUBLAS_STATUS_SUCCESS && found > 0, "cuBLASLt has no algorithm for the GEMM M=", k.m,
                   " N=", k.n, " K=", k.k, " (trans_a=", k.ta, ", trans_b=", k.tb, ", lda=", k.lda, ", ldb=", k.ldb,
                   ", ldc=", k.ldc, ", C ", k.c_f32 ? "fp32" : "bf16", ", bias ", k.bias, "): status ",
                   static_cast<int>(st));
  p->algo = res.algo;
  if (choice_ == Choice::kSplitK) p->split = split_k(*p, &p->algo, split_parts_) ? split_parts_ : 1;
  Plan& made = *plans_.emplace(k, std::move(p)).first->second;
  if (choice_ == Choice::kTimed && call) time_answers(k, made, kTimedCandidates, *call, 5, true);
  return made;
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
  DHX_CUBLAS(cublasLtMatmulAlgoGetHeuristic(lt(handle_), p.desc, p.a, p.b, p.c, p.c, p.pref,
                                            std::min(std::max(max, 1), kMaxAnswers), res, &found));
  if (k.bias) DHX_CUBLAS(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &o.bias, sizeof(o.bias)));
  void* ws = workspace_locked(o.s);
  // C's stand-in (each candidate writes, and with beta 1 reads, it) and the two events, released
  // however this returns.
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
  DHX_CUDA(cudaMallocAsync(&tmp.p, o.c_bytes, o.s));
  void* scratch = tmp.p;
  DHX_CUDA(cudaMemcpyAsync(scratch, o.C, o.c_bytes, cudaMemcpyDeviceToDevice, o.s));
  DHX_CUDA(cudaEventCreate(&tmp.e0));
  DHX_CUDA(cudaEventCreate(&tmp.e1));
  const cudaEvent_t e0 = tmp.e0, e1 = tmp.e1;
  // The candidates: the heuristic's answers, then the first one split K ways (Gemm.h). A split that
  // cuBLASLt refuses for this problem, or whose workspace is more than ours, stays a candidate that
  // cannot run (ok false: infinite time), so the list's layout is the same for every shape.
  struct Candidate {
    cublasLtMatmulAlgo_t algo;
    bool ok;
  };
  std::vector<Candidate> cand;
  for (int i = 0; i < found; ++i) cand.push_back({res[i].algo, res[i].state == CUBLAS_STATUS_SUCCESS});
  for (int parts : kSplitKParts) {
    Candidate c{found > 0 ? res[0].algo : cublasLtMatmulAlgo_t{}, false};
    c.ok = found > 0 && res[0].state == CUBLAS_STATUS_SUCCESS && split_k(p, &c.algo, parts);
    cand.push_back(c);
  }
  std::vector<double> ms;
  for (const Candidate& c : cand) {
    const cublasLtMatmulAlgo_t* algo = &c.algo;
    // An answer that refuses these operands is skipped (infinite time), as is any that fails.
    if (!c.ok ||
        cublasLtMatmul(lt(handle_), p.desc, &o.alpha, o.B, p.a, o.A, p.b, &o.beta, scratch, p.c, scratch, p.c, algo, ws,
                       kWorkspaceBytes, o.s) != CUBLAS_STATUS_SUCCESS) {
      ms.push_back(std::numeric_limits<double>::infinity());
      continue;
    }
    std::vector<double> t;
    for (int r = 0; r < reps; ++r) {
      DHX_CUDA(cudaEventRecord(e0, o.s));
      DHX_CUBLAS(cublasLtMatmul(lt(handle_), p.desc, &o.alpha, o.B, p.a, o.A, p.b, &o.beta, scratch, p.c, scratch, p.c,
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
    if (std::isfinite(ms[best])) p.algo = cand[best].algo;  // (ms and cand in the same order)
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
  const Key key{M, N, K, lda, ldb, ldc, op_a == Op::kT, op_b == Op::kT, c_f32, false, beta == 0.0f,
                alignment(A), alignment(B), alignment(C)};
  Plan& p = plan(key);
  const Operands o{A, B, C, nullptr, 1.0f, beta, c_extent(M, N, ldc, c_f32), s};
  std::lock_guard<std::mutex> g(mu_);
  return time_answers(key, p, max, o, reps, false);
}

void Blas::gemm(Op op_a, Op op_b, int64_t M, int64_t N, int64_t K, float alpha, const bf16* A, int64_t lda,
                const bf16* B, int64_t ldb, float beta, void* C, int64_t ldc, Out out, const bf16* bias,
                cudaStream_t s) {
  const bool trans_a = op_a == Op::kT, trans_b = op_b == Op::kT, c_f32 = out == Out::kF32;
  DHX_CUDA_ASSERT(M > 0 && N > 0 && K > 0, "gemm M=", M, " N=", N, " K=", K, ": every size must be positive");
  DHX_CUDA_ASSERT(!(bias && c_f32), "gemm: a bias epilogue needs a bf16 output");
  const Key key{M, N, K, lda, ldb, ldc, trans_a, trans_b, c_f32, bias != nullptr, beta == 0.0f,
                alignment(A), alignment(B), alignment(C)};
  // cuBLASLt's bias epilogue wants a 16-byte aligned bias (a less aligned one fails or faults on
  // some GPUs), but a parameter in the flat bf16 store starts at any element: such a bias is copied
  // to a stream-ordered aligned buffer first (the same epilogue, so the same bits).
  struct StagedBias {
    void* p = nullptr;
    cudaStream_t s;
    ~StagedBias() {
      if (p) cudaFreeAsync(p, s);
    }
  } staged{nullptr, s};
  if (bias && alignment(bias) < 16) {
    const size_t bytes = static_cast<size_t>(N) * sizeof(bf16);
    DHX_CUDA(cudaMallocAsync(&staged.p, bytes, s));
    DHX_CUDA(cudaMemcpyAsync(staged.p, bias, bytes, cudaMemcpyDeviceToDevice, s));
    bias = static_cast<const bf16*>(staged.p);
  }
  const Operands call{A, B, C, bias, alpha, beta, c_extent(M, N, ldc, c_f32), s};
  Plan& p = plan(key, &call);
  if (bias)
    DHX_CUBLAS(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)));
  void* ws = workspace(s);
  DHX_CUBLAS(cublasLtMatmul(lt(handle_), p.desc, &alpha, B, p.a, A, p.b, &beta, C, p.c, C, p.c, &p.algo, ws,
                            kWorkspaceBytes, s));
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

void Blas::linear_bwd_weight(const bf16* dy, const bf16* x, float* dw, float* db, int64_t N, int64_t I, int64_t O,
                             cudaStream_t s) {
  gemm(Op::kT, Op::kN, O, I, N, 1.0f, dy, O, x, I, 1.0f, dw, I, Out::kF32, nullptr, s);
  if (db) bias_grad(dy, db, N, O, s);
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
  DHX_CUDA(cudaMallocAsync(reinterpret_cast<void**>(&part), chunks * O * sizeof(float), s));
  bias_grad_partial<<<dim3(static_cast<unsigned>(cdiv(O, 2 * kBgCols)), static_cast<unsigned>(chunks)), kBgCols, 0, s>>>(
      dy, part, N, O, ld, vec);
  DHX_CUDA_LAUNCHED(bias_grad_partial);
  bias_grad_final<<<static_cast<unsigned>(cdiv(O, 256)), 256, 0, s>>>(part, db, chunks, O);
  DHX_CUDA_LAUNCHED(bias_grad_final);
  DHX_CUDA(cudaFreeAsync(part, s));
}

void bias_grad(const bf16* dy, float* db, int64_t N, int64_t O, cudaStream_t s) { bias_grad_strided(dy, O, db, N, O, s); }

}  // namespace dhelix::cuda
