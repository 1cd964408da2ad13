// The GEMM algorithm choices file (kernels/cuda/GemmChoices.h, training.gemm_choices): read back as
// written, refused by name when it is not one, refused when made on another machine; each rank's
// own name. These need no GPU. On a GPU: CudaGemm.ChoicesRepeatTheTimedAlgorithms (test_gemm.cc) and
// TrainerGpu/...GemmChoicesFileRepeatsATimedRunBitwise (test_trainer_gpu.cc).
// Oracles: the values written; the documented messages (the file, the entry, the field).
#include <gtest/gtest.h>

#include <string>

#include "TinyRun.h"
#include "base/Error.h"
#include "base/Files.h"
#include "kernels/cuda/GemmChoices.h"
#include "runtime/StepBuilder.h"

namespace dhelix::cuda::test {
namespace {

GemmChoices sample() {
  GemmChoices c;
  c.device = "NVIDIA H200", c.sms = 132, c.sm_target = 66, c.cublaslt_version = 130100;
  GemmChoice a;
  a.m = 16384, a.n = 2304, a.k = 768, a.lda = 768, a.ldb = 768, a.ldc = 2304, a.trans_b = true, a.beta0 = true;
  a.epilogue = "bias", a.align_a = 256, a.align_b = 256, a.align_c = a.align_d = 256, a.align_bias = 16;
  a.answer = 3, a.split = 1, a.ms = 0.125;
  GemmChoice b;
  b.m = 768, b.n = 768, b.k = 16384, b.lda = 768, b.ldb = 768, b.ldc = 768, b.trans_a = true, b.c_f32 = true;
  b.epilogue = "none", b.align_a = b.align_b = 256, b.align_c = b.align_d = 128, b.answer = 0, b.split = 3, b.ms = 0.05;
  // A weight gradient's partials form (Blas::Wgrad::kPartials): a strided batch of 4.
  GemmChoice p = b;
  p.k = 4096, p.beta0 = true, p.batch = 4, p.stride_a = 4096 * 768, p.stride_b = 4096 * 768, p.stride_c = 768 * 768;
  p.answer = 1, p.split = 1, p.ms = 0.02;
  c.choices = {a, b, p};
  return c;
}

std::string error_of(const std::string& text) {
  dhelix::testing::TempDir dir;
  const std::string path = dir.path() + "/c.json";
  write_file_atomic(path, text);
  try {
    load_gemm_choices(path);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

TEST(GemmChoicesFile, ReadsBackWhatItWrote) {
  dhelix::testing::TempDir dir;
  const std::string path = dir.path() + "/choices.json";
  const GemmChoices c = sample();
  save_gemm_choices(path, c);
  const GemmChoices r = load_gemm_choices(path);
  EXPECT_EQ(r.device, c.device);
  EXPECT_EQ(r.sms, 132);
  EXPECT_EQ(r.sm_target, 66);
  EXPECT_EQ(r.cublaslt_version, 130100);
  ASSERT_EQ(r.choices.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    const GemmChoice &x = c.choices[i], &y = r.choices[i];
    EXPECT_EQ(std::tie(x.m, x.n, x.k, x.lda, x.ldb, x.ldc, x.trans_a, x.trans_b, x.c_f32, x.beta0, x.epilogue),
              std::tie(y.m, y.n, y.k, y.lda, y.ldb, y.ldc, y.trans_a, y.trans_b, y.c_f32, y.beta0, y.epilogue));
    EXPECT_EQ(std::tie(x.align_a, x.align_b, x.align_c, x.align_d, x.align_aux, x.align_bias, x.answer, x.split),
              std::tie(y.align_a, y.align_b, y.align_c, y.align_d, y.align_aux, y.align_bias, y.answer, y.split));
    EXPECT_EQ(x.ms, y.ms);
    EXPECT_EQ(std::tie(x.batch, x.stride_a, x.stride_b, x.stride_c), std::tie(y.batch, y.stride_a, y.stride_b, y.stride_c))
        << "choice " << i;
  }
  // One problem's entry carries no batch fields (files of one-problem choices read as before).
  const std::string text = read_file(path);
  EXPECT_EQ(text.find("\"batch\""), text.rfind("\"batch\"")) << "only the batch entry names a batch:\n" << text;
  EXPECT_EQ(gemm_choices_mismatch(r, c), "");
}

TEST(GemmChoicesFile, RefusesWhatIsNotOneByName) {
  EXPECT_NE(error_of("[1, 2]").find("is not a JSON object"), std::string::npos);
  EXPECT_NE(error_of(R"({"format": "dhelix-si-plan", "version": 1})").find("format is 'dhelix-si-plan', expected "
                                                                            "'dhelix-gemm-choices'"),
            std::string::npos);
  EXPECT_NE(error_of(R"({"format": "dhelix-gemm-choices", "version": 9})").find("version 9"), std::string::npos);
  const std::string head =
      R"({"format": "dhelix-gemm-choices", "version": 1, "device": "X", "sms": 132, "sm_target": 0, "cublaslt_version": 1, )";
  EXPECT_NE(error_of(head + R"("choices": 3})").find("'choices' must be an array"), std::string::npos);
  const std::string entry =
      R"({"m": 8, "n": 8, "k": 8, "lda": 8, "ldb": 8, "ldc": 8, "trans_a": false, "trans_b": true, "c_f32": false, )"
      R"("beta0": true, "align": [256, 256, 256, 256, 0, 0], "answer": 1, "split": 1, "ms": 0, )";
  EXPECT_EQ(error_of(head + "\"choices\": [" + entry + R"("epilogue": "none"}]})"), "");
  const std::string bad_epi = error_of(head + "\"choices\": [" + entry + R"("epilogue": "relu"}]})");
  EXPECT_NE(bad_epi.find("choice 0: epilogue 'relu' is not one of"), std::string::npos) << bad_epi;
  const std::string no_m = error_of(head + R"("choices": [{"n": 8}]})");
  EXPECT_NE(no_m.find("choice 0: 'm' is missing"), std::string::npos) << no_m;
  std::string bad_align = entry;
  bad_align.replace(bad_align.find("[256, 256, 256, 256, 0, 0]"), 26, "[256, 24, 256, 256, 0, 0]");
  const std::string al = error_of(head + "\"choices\": [" + bad_align + R"("epilogue": "none"}]})");
  EXPECT_NE(al.find("align[1] = 24 is not 0 or a power of two"), std::string::npos) << al;
  std::string neg = entry;
  neg.replace(neg.find("\"answer\": 1"), 11, "\"answer\": -2");
  const std::string ng = error_of(head + "\"choices\": [" + neg + R"("epilogue": "none"}]})");
  EXPECT_NE(ng.find("answer=-2"), std::string::npos) << ng;
  // A batch entry: at least 2 problems, with its 3 strides; strides without a batch refused.
  EXPECT_EQ(error_of(head + "\"choices\": [" + entry + R"("epilogue": "none", "batch": 2, "strides": [64, 64, 64]}]})"),
            "");
  const std::string b1 = error_of(head + "\"choices\": [" + entry + R"("epilogue": "none", "batch": 1, "strides": [0, 0, 0]}]})");
  EXPECT_NE(b1.find("choice 0: batch = 1 (a batch entry has at least 2 problems"), std::string::npos) << b1;
  const std::string no_st = error_of(head + "\"choices\": [" + entry + R"("epilogue": "none", "batch": 4}]})");
  EXPECT_NE(no_st.find("choice 0: a batch needs 'strides'"), std::string::npos) << no_st;
  const std::string neg_st =
      error_of(head + "\"choices\": [" + entry + R"("epilogue": "none", "batch": 4, "strides": [1, -1, 1]}]})");
  EXPECT_NE(neg_st.find("strides[1] is -1, not a whole number >= 0"), std::string::npos) << neg_st;
  const std::string lone = error_of(head + "\"choices\": [" + entry + R"("epilogue": "none", "strides": [1, 1, 1]}]})");
  EXPECT_NE(lone.find("'strides' without 'batch'"), std::string::npos) << lone;
  std::string str = entry;
  str.replace(str.find("\"m\": 8"), 6, "\"m\": \"8\"");
  const std::string st = error_of(head + "\"choices\": [" + str + R"("epilogue": "none"}]})");
  EXPECT_NE(st.find("'m' is \"8\", not a number"), std::string::npos) << st;
}

// Oracle: the header fields, each changed alone, are named in the message.
TEST(GemmChoicesFile, AnotherMachinesChoicesAreNamed) {
  const GemmChoices here = sample();
  GemmChoices other = here;
  other.device = "NVIDIA H100 80GB HBM3";
  const std::string m = gemm_choices_mismatch(other, here);
  EXPECT_NE(m.find("made on NVIDIA H100 80GB HBM3 (132 SMs, planned for 66), cuBLASLt 130100, this is NVIDIA H200"),
            std::string::npos) << m;
  other = here, other.cublaslt_version = 130000;
  EXPECT_NE(gemm_choices_mismatch(other, here).find("cuBLASLt 130000"), std::string::npos);
  other = here, other.sm_target = 0;
  EXPECT_NE(gemm_choices_mismatch(other, here), "");
  other = here, other.sms = 114;
  EXPECT_NE(gemm_choices_mismatch(other, here).find("114 SMs"), std::string::npos);
}

// Oracle: the documented naming (StepBuilder.h): the path itself for one rank, else .rank<r> before
// the extension (or at the end without one; a dot in a directory is not an extension).
TEST(GemmChoicesFile, EachRankHasItsOwnFile) {
  EXPECT_EQ(gemm_choices_for_rank("runs/x/gemm.json", 0, 1), "runs/x/gemm.json");
  EXPECT_EQ(gemm_choices_for_rank("runs/x/gemm.json", 3, 4), "runs/x/gemm.rank3.json");
  EXPECT_EQ(gemm_choices_for_rank("gemm", 1, 2), "gemm.rank1");
  EXPECT_EQ(gemm_choices_for_rank("runs/v1.2/gemm", 1, 2), "runs/v1.2/gemm.rank1");
  EXPECT_EQ(gemm_choices_for_rank("runs/.hidden", 0, 2), "runs/.hidden.rank0");
}

}  // namespace
}  // namespace dhelix::cuda::test
