// A file of cuBLASLt algorithm choices (training.gemm_choices): for each GEMM shape a Blas has
// planned (Gemm.h's key: sizes, strides, transposes, output type, epilogue, beta, alignments), which
// of cuBLASLt's heuristic's first Blas::kTimedCandidates answers it runs and split K how many ways.
// Read back on the same GPU model and cuBLASLt version, the same answers come back, so a choice
// timed once (training.gemm_algo = timed) runs again on every later run: the results repeat run to
// run, as the heuristic's do, PyTorch TunableOp's tuning file's idea. Plain C++ (no CUDA): the file's
// reading and its checks run anywhere.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace dhelix::cuda {

struct GemmChoice {
  // Gemm.h's key, row-major as Blas::gemm takes it.
  int64_t m = 0, n = 0, k = 0, lda = 0, ldb = 0, ldc = 0;
  bool trans_a = false, trans_b = false, c_f32 = false, beta0 = false;
  std::string epilogue = "none";  // none, bias, gelu_aux, gelu_aux_bias, dgelu
  int align_a = 0, align_b = 0, align_c = 0, align_d = 0, align_aux = 0, align_bias = 0;  // bytes; 0: no such pointer
  // A strided batch (Blas::gemm_strided_batched: the partials form of a weight gradient): its
  // problems and their operands' strides in elements. In the file only when batch > 1 ("batch",
  // "strides": [a, b, c]); a choice without them is one problem.
  int batch = 1;
  int64_t stride_a = 0, stride_b = 0, stride_c = 0;
  // The choice: the heuristic's answer at this index (of its first kTimedCandidates), split K this
  // many ways (1: not split); ms: its median time when it was timed (0: chosen untimed).
  int answer = 0, split = 1;
  double ms = 0;
};

struct GemmChoices {
  // Where the choices hold: the GPU's name and SM count, the SMs cuBLASLt was told to plan for (an
  // SM partition's; 0: the whole GPU) and cuBLASLt's version (cublasLtGetVersion).
  std::string device;
  int sms = 0, sm_target = 0;
  int64_t cublaslt_version = 0;
  std::vector<GemmChoice> choices;
};

// The epilogue names a choice may carry.
bool known_epilogue(const std::string& name);

// Reads a choices file; ConfigError naming the file, the entry and the field when it is not one
// (not JSON, another format or version, a field missing or out of range), IoError when unreadable.
GemmChoices load_gemm_choices(const std::string& path);
// Writes one atomically (a crash never leaves half a file).
void save_gemm_choices(const std::string& path, const GemmChoices& c);
// "" when `file`'s choices hold here (`here`'s header), else what differs, e.g.
// "made on NVIDIA H100 80GB HBM3 (132 SMs), this is NVIDIA H200 (132 SMs)".
std::string gemm_choices_mismatch(const GemmChoices& file, const GemmChoices& here);

}  // namespace dhelix::cuda
