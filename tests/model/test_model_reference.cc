// Whole model against PyTorch. Oracle: tests/fixtures/make_reference.py, an independent float64
// implementation of each family in plain torch ops, whose outputs (per-token loss, logits, the
// gradient of the step's objective for every Hugging Face tensor; for moe also each layer's
// load-balancing loss) are committed in tests/fixtures/{gpt,llama,moe}_ref.safetensors together with the weights and tokens they were
// computed from (regenerate with tests/fixtures/regen.sh). The engine runs in float32.
//
// Tolerances (origin: float32 rounding, u = 2^-24 = 6e-8 per operation, vs the float64 oracle):
// a dot product of length K carries at most ~K u relative error (7.6e-6 for K = 128, the longest
// here: d = 32, ffn 128, vocab 96, T = 16) and ~sqrt(K) u typically, compounded over 2 layers
// forward and backward, plus FastMath's polynomial exp/tanh (~2e-7 relative). Measured worst
// cases (printed by each test): loss 2.4e-6 absolute, logits 7e-7 and gradients 1.3e-6 relative.
// The bounds sit ~10-20x above that and well below a modelling error: exact-erf GELU instead of
// tanh moves GPT logits by 3.5e-4 relative, a wrong RoPE theta moves Llama's by 0.7.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <ostream>

#include "ModelHarness.h"
#include "model/HfNames.h"
#include "train/Safetensors.h"

namespace dhelix {
// Test names and failure messages show "gpt" / "llama", not the enum's bytes.
void PrintTo(ModelFamily f, std::ostream* os) { *os << family_name(f); }
}  // namespace dhelix

namespace dhelix::test {
namespace {

constexpr double kLossAbsTol = 2e-5;     // per-token loss (~5): 4e-6 relative
constexpr double kLogitsRelTol = 1e-5;   // max |err| / max |ref| over all logits
constexpr double kGradRelTol = 3e-5;     // max |err| / max |ref| per gradient tensor

struct Reference {
  ModelConfig model;
  SafetensorsFile file;
  std::vector<MicroBatch> mbs;
  const Tensor& at(const std::string& name) const {
    const Tensor* t = file.find(name);
    if (!t) throw IoError(fmt::format("fixture lacks tensor '{}'", name));
    return *t;
  }
};

Reference load_reference(ModelFamily family) {
  Reference r{reference_config(family), {}, {}};
  const std::string path = fmt::format("{}/tests/fixtures/{}_ref.safetensors", DHELIX_SOURCE_DIR, family_name(family));
  r.file = read_safetensors(path);
  // The fixture must have been made for exactly this config (else regenerate it).
  const ModelConfig& m = r.model;
  std::map<std::string, std::string> want = {
      {"family", family_name(family)},
      {"vocab_size", fmt::format("{}", m.vocab_size)},
      {"d_model", fmt::format("{}", m.d_model)},
      {"n_layers", fmt::format("{}", m.n_layers)},
      {"n_heads", fmt::format("{}", m.n_heads)},
      {"n_kv_heads", fmt::format("{}", m.n_kv_heads)},
      {"ffn_hidden", fmt::format("{}", m.ffn_hidden)},
      {"norm_eps", fmt::format("{:.17g}", m.norm_eps)},
      {"rope_theta", fmt::format("{:.17g}", m.rope_theta)},
      {"tie_embeddings", m.tie_embeddings ? "1" : "0"},
      {"micro_batches", fmt::format("{}", kRefMicroBatches)},
      {"B", fmt::format("{}", kRefB)},
      {"T", fmt::format("{}", kRefT)},
  };
  if (m.is_moe()) {
    want["n_experts"] = fmt::format("{}", m.n_experts);
    want["top_k"] = fmt::format("{}", m.top_k);
    want["aux_loss_coef"] = fmt::format("{:.17g}", m.aux_loss_coef);
    want["norm_topk"] = m.norm_topk ? "1" : "0";
  }
  for (const auto& [k, v] : want) {
    auto it = r.file.metadata.find(k);
    EXPECT_TRUE(it != r.file.metadata.end() && it->second == v)
        << path << ": metadata " << k << "=" << (it == r.file.metadata.end() ? "<missing>" : it->second)
        << ", the test expects " << v << " (run tests/fixtures/regen.sh)";
  }
  const Tensor& tok = r.at("tokens");
  const Tensor& tgt = r.at("targets");
  EXPECT_EQ(tok.shape(), (Shape{kRefMicroBatches, kRefB, kRefT}));
  for (int64_t i = 0; i < kRefMicroBatches; ++i)
    r.mbs.push_back({tok.narrow0(i, 1).clone().view({kRefB * kRefT}), tgt.narrow0(i, 1).clone().view({kRefB * kRefT})});
  return r;
}

// max |got - ref| / max |ref| for a float32 result against a float64 reference of equal size.
struct Err {
  double rel = 0, max_abs = 0, ref_max = 0;
};
Err compare(const Tensor& got, const Tensor& ref) {
  EXPECT_EQ(got.numel(), ref.numel()) << got.describe() << " vs " << ref.describe();
  Err e;
  const float* g = got.f32();
  const double* r = ref.data<double>();
  for (int64_t i = 0; i < std::min(got.numel(), ref.numel()); ++i) {
    e.max_abs = std::max(e.max_abs, std::abs(double(g[i]) - r[i]));
    e.ref_max = std::max(e.ref_max, std::abs(r[i]));
  }
  e.rel = e.max_abs / std::max(e.ref_max, 1e-30);
  return e;
}

// The fixture's model weights: the file also holds the inputs ("tokens", "targets") and the
// reference outputs ("ref.*"), which from_hf (exact tensor set) would refuse.
TensorList model_tensors(const TensorList& all) {
  TensorList out;
  for (const auto& [name, t] : all)
    if (name != "tokens" && name != "targets" && name.rfind("ref.", 0) != 0) out.push_back({name, t});
  return out;
}

class ModelReference : public ::testing::TestWithParam<ModelFamily> {};

// Hugging Face's bf16 releases load. Oracle: the fp32 weights rounded to bf16 (to nearest even)
// and loaded as f32 -- widening bf16 to f32 is exact, so the loaded parameters are bitwise those,
// after a round trip through a safetensors file of BF16 tensors.
TEST_P(ModelReference, Bf16WeightsLoadExactly) {
  Reference r = load_reference(GetParam());
  const TensorList f32 = model_tensors(r.file.tensors);
  TensorList rounded, bf16;
  for (const auto& [name, t] : f32) {
    Tensor h = Tensor::empty(t.shape(), DType::kBF16), f = Tensor::empty(t.shape(), DType::kF32);
    for (int64_t i = 0; i < t.numel(); ++i) {
      uint32_t u;
      std::memcpy(&u, t.f32() + i, 4);
      u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest even (the weights are finite)
      h.data<uint16_t>()[i] = static_cast<uint16_t>(u >> 16);
      u &= 0xffff0000u;
      std::memcpy(f.f32() + i, &u, 4);
    }
    bf16.push_back({name, h});
    rounded.push_back({name, f});
  }
  const std::string path = ::testing::TempDir() + "/bf16_" + family_name(GetParam()) + ".safetensors";
  write_safetensors(path, bf16);
  const SafetensorsFile back = read_safetensors(path);
  ModelHarness h(r.model, {kRefB, kRefT}, kRefMicroBatches);
  const auto a = from_hf(r.model, h.specs(), back.tensors), b = from_hf(r.model, h.specs(), rounded);
  ASSERT_EQ(a.size(), b.size());
  for (const auto& [name, t] : a) {
    const Tensor& u = b.at(name);
    ASSERT_EQ(t.shape(), u.shape()) << name;
    EXPECT_EQ(std::memcmp(t.f32(), u.f32(), t.nbytes()), 0) << name;
  }
}

// Per-token loss (the head's "loss" buffer) and the logits of the real vocabulary, micro-batch by
// micro-batch, each from a forward pass through the executor.
TEST_P(ModelReference, PerTokenLossAndLogitsMatchTorch) {
  Reference r = load_reference(GetParam());
  ModelHarness h(r.model, {kRefB, kRefT}, kRefMicroBatches);
  h.set_values(from_hf(r.model, h.specs(), model_tensors(r.file.tensors)));
  const int64_t N = kRefB * kRefT, V = r.model.vocab_size;
  double loss_err = 0;
  Err logit_worst;
  for (int64_t m = 0; m < kRefMicroBatches; ++m) {
    Tensor loss = h.forward_token_loss(r.mbs[m]);
    Err el = compare(loss, r.at("ref.loss").narrow0(m, 1));
    loss_err = std::max(loss_err, el.max_abs);
    Tensor logits = h.forward_logits(r.mbs[m]);
    ASSERT_EQ(logits.shape(), (Shape{N, V}));
    Err eg = compare(logits, r.at("ref.logits").narrow0(m, 1));
    if (eg.rel >= logit_worst.rel) logit_worst = eg;
  }
  std::printf("[%s] per-token loss max|err| = %.3g; logits max|err|/max|ref| = %.3g (max|ref| %.3g)\n",
              family_name(GetParam()), loss_err, logit_worst.rel, logit_worst.ref_max);
  EXPECT_LE(loss_err, kLossAbsTol);
  EXPECT_LE(logit_worst.rel, kLogitsRelTol);
}

// One step (forward + backward of both micro-batches, sequential schedule): the step's mean loss
// and every parameter gradient, mapped to Hugging Face names by to_hf on the full tensors.
TEST_P(ModelReference, StepLossAndEveryGradientMatchTorch) {
  Reference r = load_reference(GetParam());
  ModelHarness h(r.model, {kRefB, kRefT}, kRefMicroBatches);
  h.set_values(from_hf(r.model, h.specs(), model_tensors(r.file.tensors)));
  StepStats st = h.step(r.mbs, single_stage(CoExecute::kOff));

  const Tensor& ref_loss = r.at("ref.loss");
  double ref_sum = 0;
  for (int64_t i = 0; i < ref_loss.numel(); ++i) ref_sum += ref_loss.data<double>()[i];
  EXPECT_EQ(st.tokens, ref_loss.numel());
  EXPECT_NEAR(st.loss_sum / double(st.tokens), ref_sum / double(ref_loss.numel()), kLossAbsTol);
  if (r.model.is_moe()) {
    // The load-balancing term of the objective: sum over layers, mean over micro-batches (equal
    // micro-batches, so the token-weighted mean is the plain one). Its value is O(coef) = 0.1.
    const Tensor& aux = r.at("ref.aux");
    double ref_aux = 0;
    for (int64_t i = 0; i < aux.numel(); ++i) ref_aux += aux.data<double>()[i];
    ref_aux /= double(kRefMicroBatches);
    EXPECT_NEAR(st.aux_weighted / double(st.tokens), ref_aux, kLossAbsTol);
    // Every assignment is counted once: tokens * top_k per layer.
    int64_t routed = 0;
    for (int64_t v : st.expert_tokens) routed += v;
    EXPECT_EQ(routed, st.tokens * r.model.top_k * r.model.n_layers);
    std::printf("[moe] aux term %.6f (ref %.6f)\n", st.aux_weighted / double(st.tokens), ref_aux);
  }

  std::map<std::string, Tensor> grads = h.full_grads();
  // Vocabulary padding rows are never read by the loss (oracle: construction), so their
  // gradient must be exactly zero.
  for (const std::string name : {"wte", "lm_head"}) {
    if (!grads.count(name)) continue;
    const Tensor& g = grads.at(name);
    const int64_t C = g.dim(1);
    for (int64_t i = r.model.vocab_size * C; i < g.numel(); ++i)
      ASSERT_EQ(g.f32()[i], 0.0f) << name << " padding row " << i / C << " has a gradient";
  }

  TensorList hf = to_hf(r.model, grads);
  size_t n_ref = 0;
  for (const auto& [name, t] : r.file.tensors) n_ref += name.rfind("ref.grad.", 0) == 0;
  EXPECT_EQ(hf.size(), n_ref) << "the fixture and to_hf disagree on the set of tensors";
  Err worst;
  std::string worst_name;
  for (const auto& [name, g] : hf) {
    const Tensor& ref = r.at("ref.grad." + name);
    ASSERT_EQ(g.shape(), ref.shape()) << name;
    Err e = compare(g, ref);
    EXPECT_LE(e.rel, kGradRelTol) << name << ": max|err| " << e.max_abs << " max|ref| " << e.ref_max;
    EXPECT_GT(e.ref_max, 0.0) << name << ": the reference gradient is zero, the test cannot see this path";
    if (e.rel >= worst.rel) worst = e, worst_name = name;
  }
  std::printf("[%s] step loss %.6f (ref %.6f); %zu gradients, worst max|err|/max|ref| = %.3g (%s)\n",
              family_name(GetParam()), st.loss_sum / double(st.tokens), ref_sum / double(ref_loss.numel()),
              hf.size(), worst.rel, worst_name.c_str());
}

INSTANTIATE_TEST_SUITE_P(Families, ModelReference, ::testing::Values(ModelFamily::kGPT, ModelFamily::kLlama, ModelFamily::kMoE),
                         [](const auto& info) { return std::string(family_name(info.param)); });

}  // namespace
}  // namespace dhelix::test
