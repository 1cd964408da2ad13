// Parameter specs: the units' parameters as model/UnitDesc.cc's steps declare them, their
// deterministic init, and the gradient buckets; the shard arithmetic is in sharding/ShardIndex.cc.
#include "model/Params.h"

#include <algorithm>
#include <random>

#include "base/Error.h"
#include "model/UnitDesc.h"

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
  auto params_of = [](const UnitDesc& d, UnitSpec u) {
    for (const UnitStep& s : d.steps)
      for (const ParamSpec& p : s.params) u.params.push_back(p);
    return u;
  };
  std::vector<UnitSpec> units;
  units.push_back(params_of(describe_embed(m), UnitSpec{"embed", -1, "", {}}));
  const UnitDesc block = describe_block(m);
  for (int l = 0; l < m.n_layers; ++l)
    units.push_back(params_of(block, UnitSpec{"block", l, fmt::format("layers.{}.", l), {}}));
  units.push_back(params_of(describe_head(m), UnitSpec{"head", -1, "", {}}));
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
