// Parameter specs for the GPT, Llama and MoE families and their deterministic init; the shard
// arithmetic is in sharding/ShardIndex.cc.
#include "model/Params.h"

#include <algorithm>
#include <cmath>
#include <random>

#include "base/Error.h"

namespace dhelix {

const char* shard_role_name(ShardRole r) {
  switch (r) {
    case ShardRole::kReplicated: return "replicated";
    case ShardRole::kColumn: return "column";
    case ShardRole::kRow: return "row";
    case ShardRole::kVocab: return "vocab";
    case ShardRole::kExpert: return "expert";
    case ShardRole::kGrid: return "grid";
  }
  return "?";
}

int64_t padded_vocab(const ModelConfig& m, int tp) {
  int64_t mult = 128 * tp;
  return (m.vocab_size + mult - 1) / mult * mult;
}

std::vector<UnitSpec> model_params(const ModelConfig& m) {
  const int64_t C = m.d_model, D = m.head_dim(), F = m.ffn_hidden;
  const double std_ = m.init_std;
  // GPT-2 scales the residual projections' init by 1/sqrt(2L).
  const double std_res = m.family == ModelFamily::kGPT ? std_ / std::sqrt(2.0 * m.n_layers) : std_;
  auto param = [](std::string local, Shape full, ShardRole role, ParamInit init, double sd,
                  std::vector<int64_t> parts = {}) {
    ParamSpec p;
    p.local = std::move(local);
    p.full = p.shard = std::move(full);
    p.role = role;
    p.init = init;
    p.init_std = sd;
    p.parts = std::move(parts);
    p.weight_decay = p.full.size() > 1;  // matrices decay; vectors (norms, biases) do not
    return p;
  };
  auto sum = [](const std::vector<int64_t>& parts) {
    int64_t n = 0;
    for (int64_t q : parts) n += q;
    return n;
  };
  const ShardRole kRep = ShardRole::kReplicated, kCol = ShardRole::kColumn, kRow = ShardRole::kRow;
  const ParamInit kN = ParamInit::kNormal, k1 = ParamInit::kOnes, k0 = ParamInit::kZeros;
  auto column = [&](std::string local, std::vector<int64_t> parts, int64_t in, double sd) {
    return param(std::move(local), {sum(parts), in}, kCol, kN, sd, parts);
  };
  auto column_bias = [&](std::string local, std::vector<int64_t> parts) {
    return param(std::move(local), {sum(parts)}, kCol, k0, 0, parts);
  };
  std::vector<UnitSpec> units;
  UnitSpec embed{"embed", -1, "", {}};
  embed.params.push_back(param("wte", {m.vocab_size, C}, ShardRole::kVocab, kN, std_));
  if (m.family == ModelFamily::kGPT) embed.params.push_back(param("wpe", {m.seq_len, C}, kRep, kN, 0.01));
  units.push_back(embed);
  for (int l = 0; l < m.n_layers; ++l) {
    UnitSpec b{"block", l, fmt::format("layers.{}.", l), {}};
    auto& q = b.params;
    if (m.family == ModelFamily::kGPT) {
      q.push_back(param("ln1.weight", {C}, kRep, k1, 0));
      q.push_back(param("ln1.bias", {C}, kRep, k0, 0));
      q.push_back(column("wqkv", {C, C, C}, C, std_));
      q.push_back(column_bias("bqkv", {C, C, C}));
      q.push_back(param("wo", {C, C}, kRow, kN, std_res));
      q.push_back(param("bo", {C}, kRep, k0, 0));
      q.push_back(param("ln2.weight", {C}, kRep, k1, 0));
      q.push_back(param("ln2.bias", {C}, kRep, k0, 0));
      q.push_back(column("wfc", {F}, C, std_));
      q.push_back(column_bias("bfc", {F}));
      q.push_back(param("wproj", {C, F}, kRow, kN, std_res));
      q.push_back(param("bproj", {C}, kRep, k0, 0));
    } else {
      q.push_back(param("attn_norm.weight", {C}, kRep, k1, 0));
      q.push_back(column("wqkv", {m.n_heads * D, m.n_kv_heads * D, m.n_kv_heads * D}, C, std_));
      q.push_back(param("wo", {C, m.n_heads * D}, kRow, kN, std_res));
      q.push_back(param("mlp_norm.weight", {C}, kRep, k1, 0));
      if (m.is_moe()) {
        // E experts' [rows, cols] weights stacked as [E * rows, cols].
        q.push_back(param("router", {m.n_experts, C}, kRep, kN, std_));
        q.push_back(param("experts.wgu", {m.n_experts * 2 * F, C}, ShardRole::kExpert, kN, std_));
        q.push_back(param("experts.wdown", {m.n_experts * C, F}, ShardRole::kExpert, kN, std_res));
      } else {
        q.push_back(column("wgu", {F, F}, C, std_));
        q.push_back(param("wdown", {C, F}, kRow, kN, std_res));
      }
    }
    units.push_back(b);
  }
  UnitSpec head{"head", -1, "", {}};
  head.params.push_back(param("final_norm.weight", {C}, kRep, k1, 0));
  if (m.family == ModelFamily::kGPT) head.params.push_back(param("final_norm.bias", {C}, kRep, k0, 0));
  if (!m.tie_embeddings) {
    ParamSpec lm = embed.params.front();
    lm.local = "lm_head";
    head.params.push_back(lm);
  }
  units.push_back(head);
  for (auto& u : units)
    for (auto& p : u.params) p.name = u.prefix + p.local;
  return units;
}

void init_full_param(const ParamSpec& spec, Tensor& full, uint64_t seed) {
  float* p = full.f32();
  int64_t n = full.numel();
  if (spec.init == ParamInit::kOnes) {
    std::fill(p, p + n, 1.0f);
    return;
  }
  if (spec.init == ParamInit::kZeros) {
    std::fill(p, p + n, 0.0f);
    return;
  }
  uint64_t h = 1469598103934665603ull ^ seed;  // FNV-1a over the name, mixed with the seed
  for (char c : spec.name) h = (h ^ static_cast<unsigned char>(c)) * 1099511628211ull;
  std::mt19937_64 rng(h);
  std::normal_distribution<float> dist(0.0f, static_cast<float>(spec.init_std));
  for (int64_t i = 0; i < n; ++i) p[i] = dist(rng);
}

std::vector<GradBucketPlan> plan_grad_buckets(const std::vector<UnitSpec>& units, int64_t bucket_elems) {
  DHX_CHECK(bucket_elems > 0, InternalError, "bucket_elems = {}", bucket_elems);
  std::vector<GradBucketPlan> out;
  GradBucketPlan cur;
  auto close = [&] {
    if (!cur.members.empty()) out.push_back(std::move(cur));
    cur = GradBucketPlan{};
  };
  const int head = static_cast<int>(units.size()) - 1;
  for (int u = head; u >= 0; --u) {
    if (u == 0) close();
    const auto& params = units[static_cast<size_t>(u)].params;
    for (int i = static_cast<int>(params.size()) - 1; i >= 0; --i) {
      const ParamSpec& q = params[static_cast<size_t>(i)];
      const bool copy = u == head && u > 0 && q.local == "wte", expert = q.role == ShardRole::kExpert;
      if (copy || expert) close();
      cur.members.push_back({u, i});
      cur.min_unit = u;
      cur.expert = expert;
      cur.elems += shape_numel(q.shard);
      if (u == 0 || copy || expert || cur.elems >= bucket_elems) close();
    }
  }
  close();
  return out;
}

int64_t auto_bucket_elems(int64_t param_elems) {
  return std::clamp<int64_t>(param_elems / 16, int64_t{64} << 10, int64_t{4} << 20);
}

}  // namespace dhelix
