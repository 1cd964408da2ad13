// Parameter specs for the GPT and Llama families, shard extraction and deterministic init.
#include "model/Params.h"

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
  p.tp_partial_grad = sp_partial;
  p.weight_decay = shape.size() > 1;
  return p;
}

}  // namespace

std::vector<UnitSpec> model_units(const ModelConfig& m, const LayoutConfig& lay, int tp_rank) {
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
      b.params.push_back(column("wgu", {F, F}, C, tp, std_));
      b.params.push_back(row("wdown", C, F, tp, std_res));
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
    for (auto& p : u.params) p.name = u.prefix + p.local;
  (void)tp_rank;
  return units;
}

namespace {

// Row ranges [begin, len) in `full` that make up a column/vocab shard, in shard order.
std::vector<std::pair<int64_t, int64_t>> shard_rows(const ParamSpec& s, int r, int tp) {
  std::vector<std::pair<int64_t, int64_t>> out;
  if (s.role == ShardRole::kVocab) {
    int64_t n = s.shard[0];
    out.push_back({r * n, n});
  } else {
    int64_t off = 0;
    for (int64_t q : s.parts) {
      int64_t n = q / tp;
      out.push_back({off + r * n, n});
      off += q;
    }
  }
  return out;
}

template <typename Fn>
void for_each_shard_piece(const ParamSpec& s, int r, int tp, Fn fn) {
  // fn(full_offset_elems, shard_offset_elems, count_elems)
  if (s.role == ShardRole::kReplicated) {
    fn(0, 0, shape_numel(s.full));
    return;
  }
  int64_t row_len = s.full.size() > 1 ? s.full[1] : 1;
  if (s.role == ShardRole::kRow) {
    int64_t out = s.full[0], in = s.full[1], in_l = s.shard[1];
    for (int64_t o = 0; o < out; ++o) fn(o * in + r * in_l, o * in_l, in_l);
    return;
  }
  int64_t shard_off = 0;
  for (auto [b, n] : shard_rows(s, r, tp)) {
    fn(b * row_len, shard_off, n * row_len);
    shard_off += n * row_len;
  }
}

}  // namespace

void extract_shard(const ParamSpec& spec, const Tensor& full, Tensor& shard, int tp_rank, int tp) {
  DHX_ASSERT(full.numel() == shape_numel(spec.full) && shard.numel() == shape_numel(spec.shard), "{}", spec.name);
  const float* f = full.f32();
  float* s = shard.f32();
  for_each_shard_piece(spec, tp_rank, tp, [&](int64_t fo, int64_t so, int64_t n) {
    std::copy(f + fo, f + fo + n, s + so);
  });
}

void insert_shard(const ParamSpec& spec, const Tensor& shard, Tensor& full, int tp_rank, int tp) {
  DHX_ASSERT(full.numel() == shape_numel(spec.full) && shard.numel() == shape_numel(spec.shard), "{}", spec.name);
  float* f = full.f32();
  const float* s = shard.f32();
  for_each_shard_piece(spec, tp_rank, tp, [&](int64_t fo, int64_t so, int64_t n) {
    std::copy(s + so, s + so + n, f + fo);
  });
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

}  // namespace dhelix
