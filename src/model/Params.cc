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

namespace {

int64_t div_tp(int64_t n, int tp, const std::string& what) {
  DHX_CHECK(n % tp == 0, ConfigError, "{}={} is not divisible by parallel.tp={}", what, n, tp);
  return n / tp;
}

ParamSpec column(const std::string& local, std::vector<int64_t> parts, int64_t in, int tp, double std_) {
  ParamSpec p;
  p.local = local;
  int64_t out = 0, out_local = 0;
  for (int64_t q : parts) {
    out += q;
    out_local += div_tp(q, tp, local + " rows");
  }
  p.full = {out, in};
  p.shard = {out_local, in};
  p.role = ShardRole::kColumn;
  p.parts = std::move(parts);
  p.init_std = std_;
  return p;
}

ParamSpec column_bias(const std::string& local, std::vector<int64_t> parts, int tp) {
  ParamSpec p = column(local, parts, 1, tp, 0);
  p.full = {p.full[0]};
  p.shard = {p.shard[0]};
  p.init = ParamInit::kZeros;
  p.weight_decay = false;
  return p;
}

ParamSpec row(const std::string& local, int64_t out, int64_t in, int tp, double std_) {
  ParamSpec p;
  p.local = local;
  p.full = {out, in};
  p.shard = {out, div_tp(in, tp, local + " columns")};
  p.role = ShardRole::kRow;
  p.init_std = std_;
  return p;
}

ParamSpec replicated(const std::string& local, Shape shape, ParamInit init, bool sp_partial, double std_ = 0) {
  ParamSpec p;
  p.local = local;
  p.full = shape;
  p.shard = shape;
  p.init = init;
  p.init_std = std_;
  p.partial_grad = sp_partial;
  p.weight_decay = shape.size() > 1;
  return p;
}

// E experts' [rows, cols] weights stacked as [E * rows, cols]; each of the ep ranks holds E / ep
// whole experts (contiguous).
ParamSpec experts(const std::string& local, int64_t E, int64_t rows, int64_t cols, int64_t ep, bool sp_partial,
                  double std_) {
  DHX_CHECK(E % ep == 0, ConfigError, "model.n_experts={} is not divisible by parallel.ep={}", E, ep);
  ParamSpec p;
  p.local = local;
  p.full = {E * rows, cols};
  p.shard = {E / ep * rows, cols};
  p.role = ShardRole::kExpert;
  p.init_std = std_;
  p.partial_grad = sp_partial;
  return p;
}

// --- 3D tensor parallelism (AxoNN) -----------------------------------------------------------
int axis_size(const LayoutConfig& lay, GridAxis a) {
  return a == GridAxis::kX ? lay.tp_x : a == GridAxis::kY ? lay.tp_y : 1;
}
const char* axis_key(GridAxis a) { return a == GridAxis::kX ? "parallel.tp_x" : "parallel.tp_y"; }

// A tensor of shape `full` split over the grid: dim 0 (by `parts`) over `rows`, dim 1 over `cols`,
// and with z_flat the block flattened over z. Replicas: the block ranks holding the same shard.
ParamSpec grid(const std::string& local, Shape full, std::vector<int64_t> parts, GridAxis rows, GridAxis cols,
               bool z_flat, const LayoutConfig& lay, ParamInit init, double std_) {
  ParamSpec p;
  p.local = local;
  p.full = full;
  p.role = ShardRole::kGrid;
  p.grid_rows = rows, p.grid_cols = full.size() > 1 ? cols : GridAxis::kNone;
  p.z_flat = z_flat && lay.tp_z > 1;
  p.parts = parts.empty() ? std::vector<int64_t>{full[0]} : std::move(parts);
  p.init = init;
  p.init_std = std_;
  int64_t rows_l = 0;
  for (int64_t q : p.parts) {
    DHX_CHECK(q % axis_size(lay, rows) == 0, ConfigError, "{}: {} rows are not divisible by {}={}", local, q,
              axis_key(rows), axis_size(lay, rows));
    rows_l += q / axis_size(lay, rows);
  }
  int64_t cols_l = 1;
  if (full.size() > 1) {
    DHX_CHECK(full[1] % axis_size(lay, p.grid_cols) == 0, ConfigError, "{}: {} columns are not divisible by {}={}",
              local, full[1], axis_key(p.grid_cols), axis_size(lay, p.grid_cols));
    cols_l = full[1] / axis_size(lay, p.grid_cols);
  }
  const int64_t block = rows_l * cols_l;
  if (p.z_flat) {
    DHX_CHECK(block % lay.tp_z == 0, ConfigError,
              "{}: its {} x {} block ({} elements) is not divisible by parallel.tp_z={} (each block is flattened and "
              "split over z); choose tp_z dividing it",
              local, rows_l, cols_l, block, lay.tp_z);
    p.shard = {block / lay.tp_z};
  } else {
    p.shard = full.size() > 1 ? Shape{rows_l, cols_l} : Shape{rows_l};
  }
  // Identical copies: over every grid axis that splits neither dimension (z unless z_flat).
  p.replicas = lay.tp_block() / (axis_size(lay, rows) * axis_size(lay, p.grid_cols) * (p.z_flat ? lay.tp_z : 1));
  p.partial_grad = !p.z_flat && lay.tp_z > 1;  // tokens are split over z: reduce unless reduce-scattered
  p.weight_decay = full.size() > 1;
  return p;
}

}  // namespace

namespace {

// Units under 3D tensor parallelism (DESIGN.md "4D hybrid parallelism"): type-A weights (QKV,
// MLP-up; rows = output features over y, by their fused parts, columns over x) and type-B weights
// (attention-out, MLP-down; rows over x, columns over y), each block flattened over z; the residual
// stream's per-feature tensors (norms, attention-out / MLP-down biases, positions) over x; the
// type-A biases over y; the vocabulary table rows over y and columns over x (not over z).
std::vector<UnitSpec> model_units_3d(const ModelConfig& m, const LayoutConfig& lay) {
  const int64_t C = m.d_model, D = m.head_dim(), F = m.ffn_hidden;
  const int64_t Vp = padded_vocab(m, lay.tp_y);
  const double std_ = m.init_std;
  const double std_res = m.family == ModelFamily::kGPT ? std_ / std::sqrt(2.0 * m.n_layers) : std_;
  const GridAxis X = GridAxis::kX, Y = GridAxis::kY, N = GridAxis::kNone;
  auto vec_x = [&](const std::string& local, ParamInit init) { return grid(local, {C}, {}, X, N, false, lay, init, 0); };
  auto vec_y = [&](const std::string& local, std::vector<int64_t> parts) {
    int64_t n = 0;
    for (int64_t q : parts) n += q;
    ParamSpec p = grid(local, {n}, std::move(parts), Y, N, false, lay, ParamInit::kZeros, 0);
    return p;
  };
  auto type_a = [&](const std::string& local, std::vector<int64_t> parts, int64_t in, double sd) {
    int64_t out = 0;
    for (int64_t q : parts) out += q;
    return grid(local, {out, in}, std::move(parts), Y, X, true, lay, ParamInit::kNormal, sd);
  };
  auto type_b = [&](const std::string& local, int64_t out, int64_t in, double sd) {
    return grid(local, {out, in}, {}, X, Y, true, lay, ParamInit::kNormal, sd);
  };
  std::vector<UnitSpec> units;
  UnitSpec embed{"embed", -1, "", {}};
  embed.params.push_back(grid("wte", {Vp, C}, {}, Y, X, false, lay, ParamInit::kNormal, std_));
  if (m.family == ModelFamily::kGPT)
    embed.params.push_back(grid("wpe", {m.seq_len, C}, {}, N, X, false, lay, ParamInit::kNormal, 0.01));
  units.push_back(embed);
  for (int l = 0; l < m.n_layers; ++l) {
    UnitSpec b{"block", l, fmt::format("layers.{}.", l), {}};
    if (m.family == ModelFamily::kGPT) {
      b.params.push_back(vec_x("ln1.weight", ParamInit::kOnes));
      b.params.push_back(vec_x("ln1.bias", ParamInit::kZeros));
      b.params.push_back(type_a("wqkv", {C, C, C}, C, std_));
      b.params.push_back(vec_y("bqkv", {C, C, C}));
      b.params.push_back(type_b("wo", C, C, std_res));
      b.params.push_back(vec_x("bo", ParamInit::kZeros));
      b.params.push_back(vec_x("ln2.weight", ParamInit::kOnes));
      b.params.push_back(vec_x("ln2.bias", ParamInit::kZeros));
      b.params.push_back(type_a("wfc", {F}, C, std_));
      b.params.push_back(vec_y("bfc", {F}));
      b.params.push_back(type_b("wproj", C, F, std_res));
      b.params.push_back(vec_x("bproj", ParamInit::kZeros));
    } else {
      b.params.push_back(vec_x("attn_norm.weight", ParamInit::kOnes));
      b.params.push_back(type_a("wqkv", {m.n_heads * D, m.n_kv_heads * D, m.n_kv_heads * D}, C, std_));
      b.params.push_back(type_b("wo", C, m.n_heads * D, std_res));
      b.params.push_back(vec_x("mlp_norm.weight", ParamInit::kOnes));
      b.params.push_back(type_a("wgu", {F, F}, C, std_));
      b.params.push_back(type_b("wdown", C, F, std_res));
    }
    units.push_back(b);
  }
  UnitSpec head{"head", -1, "", {}};
  head.params.push_back(vec_x("final_norm.weight", ParamInit::kOnes));
  if (m.family == ModelFamily::kGPT) head.params.push_back(vec_x("final_norm.bias", ParamInit::kZeros));
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

}  // namespace

std::vector<UnitSpec> model_units(const ModelConfig& m, const LayoutConfig& lay, int tp_rank) {
  if (lay.is_3d()) return model_units_3d(m, lay);
  const int tp = lay.tp;
  const bool sp = tp > 1;  // sequence-parallel regions: norm/bias grads are partial over tp
  const int64_t C = m.d_model, D = m.head_dim(), F = m.ffn_hidden;
  const int64_t Vp = padded_vocab(m, tp);
  const double std_ = m.init_std;
  // GPT-2 scales the residual projections' init by 1/sqrt(2L).
  const double std_res = m.family == ModelFamily::kGPT ? std_ / std::sqrt(2.0 * m.n_layers) : std_;
  std::vector<UnitSpec> units;

  UnitSpec embed{"embed", -1, "", {}};
  ParamSpec wte;
  wte.local = "wte";
  wte.full = {Vp, C};
  wte.shard = {div_tp(Vp, tp, "padded vocab"), C};
  wte.role = ShardRole::kVocab;
  wte.init_std = std_;
  embed.params.push_back(wte);
  if (m.family == ModelFamily::kGPT)
    embed.params.push_back(replicated("wpe", {m.seq_len, C}, ParamInit::kNormal, sp, 0.01));
  units.push_back(embed);

  for (int l = 0; l < m.n_layers; ++l) {
    UnitSpec b{"block", l, fmt::format("layers.{}.", l), {}};
    if (m.family == ModelFamily::kGPT) {
      b.params.push_back(replicated("ln1.weight", {C}, ParamInit::kOnes, sp));
      b.params.push_back(replicated("ln1.bias", {C}, ParamInit::kZeros, sp));
      b.params.push_back(column("wqkv", {C, C, C}, C, tp, std_));
      b.params.push_back(column_bias("bqkv", {C, C, C}, tp));
      b.params.push_back(row("wo", C, C, tp, std_res));
      b.params.push_back(replicated("bo", {C}, ParamInit::kZeros, sp));
      b.params.push_back(replicated("ln2.weight", {C}, ParamInit::kOnes, sp));
      b.params.push_back(replicated("ln2.bias", {C}, ParamInit::kZeros, sp));
      b.params.push_back(column("wfc", {F}, C, tp, std_));
      b.params.push_back(column_bias("bfc", {F}, tp));
      b.params.push_back(row("wproj", C, F, tp, std_res));
      b.params.push_back(replicated("bproj", {C}, ParamInit::kZeros, sp));
    } else {
      b.params.push_back(replicated("attn_norm.weight", {C}, ParamInit::kOnes, sp));
      b.params.push_back(column("wqkv", {m.n_heads * D, m.n_kv_heads * D, m.n_kv_heads * D}, C, tp, std_));
      b.params.push_back(row("wo", C, m.n_heads * D, tp, std_res));
      b.params.push_back(replicated("mlp_norm.weight", {C}, ParamInit::kOnes, sp));
      if (m.is_moe()) {
        // Router and experts see this rank's tokens only (the sequence shard under tp): their
        // gradients are partial sums over tp, like the norms'.
        ParamSpec router = replicated("router", {m.n_experts, C}, ParamInit::kNormal, sp, std_);
        router.weight_decay = true;
        b.params.push_back(router);
        b.params.push_back(experts("experts.wgu", m.n_experts, 2 * F, C, lay.ep, sp, std_));
        b.params.push_back(experts("experts.wdown", m.n_experts, C, F, lay.ep, sp, std_res));
      } else {
        b.params.push_back(column("wgu", {F, F}, C, tp, std_));
        b.params.push_back(row("wdown", C, F, tp, std_res));
      }
    }
    units.push_back(b);
  }

  UnitSpec head{"head", -1, "", {}};
  head.params.push_back(replicated("final_norm.weight", {C}, ParamInit::kOnes, sp));
  if (m.family == ModelFamily::kGPT) head.params.push_back(replicated("final_norm.bias", {C}, ParamInit::kZeros, sp));
  if (!m.tie_embeddings) {
    ParamSpec lm = wte;
    lm.local = "lm_head";
    head.params.push_back(lm);
  }
  units.push_back(head);

  for (auto& u : units)
    for (auto& p : u.params) {
      p.name = u.prefix + p.local;
      p.replicas = p.role == ShardRole::kReplicated || p.role == ShardRole::kExpert ? tp : 1;
    }
  (void)tp_rank;
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
