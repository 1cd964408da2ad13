// ParamStore: flat layout in backward order, buckets, deterministic init, lookup.
#include "parallel/ParamStore.h"

#include <algorithm>
#include <map>

#include "base/Error.h"

namespace dhelix {

namespace {
std::vector<int> all_units(size_t n) {
  std::vector<int> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<int>(i);
  return v;
}
}  // namespace

ParamStore::ParamStore(const std::vector<UnitSpec>& units, const ShardIndex& at, int dp, uint64_t seed,
                       MemoryTracker* tracker, int64_t bucket_elems)
    : ParamStore(units, all_units(units.size()), at, dp, seed, tracker, bucket_elems) {}

ParamStore::ParamStore(const std::vector<UnitSpec>& all, const std::vector<int>& owned_units, const ShardIndex& at,
                       int dp, uint64_t seed, MemoryTracker* tracker, int64_t bucket_elems)
    : dp_(dp), owned_(owned_units) {
  std::sort(owned_.begin(), owned_.end());
  DHX_CHECK(!owned_.empty() && owned_.front() >= 0 && owned_.back() < static_cast<int>(all.size()), InternalError,
            "owned units must be a non-empty subset of the model's {} units", all.size());
  // This store's view of the model: the owned units' parameters (others empty), plus the head's
  // copy of a tied embedding when the embedding lives on another stage.
  std::vector<UnitSpec> units = all;
  for (int u = 0; u < static_cast<int>(units.size()); ++u)
    if (!owns_unit(u)) units[u].params.clear();
  const int head = static_cast<int>(all.size()) - 1;
  const bool tied = std::none_of(all[head].params.begin(), all[head].params.end(),
                                 [](const ParamSpec& p) { return p.local == "lm_head"; });
  if (tied && owns_unit(head) && !owns_unit(0))
    for (const ParamSpec& p : all[0].params)
      if (p.local == "wte") units[head].params.push_back(p);
  // Global positions: the order a store owning every unit gives its entries (units backward,
  // parameters in reverse declaration order).
  std::map<std::string, int64_t> global;
  for (int u = static_cast<int>(all.size()) - 1; u >= 0; --u)
    for (auto it = all[u].params.rbegin(); it != all[u].params.rend(); ++it) {
      global[it->name] = num_global_++;
      global_names_.push_back(it->name);
    }
  if (bucket_elems <= 0) {
    int64_t total = 0;
    for (const auto& u : units)
      for (const auto& spec : u.params) total += shape_numel(spec.shard);
    bucket_elems = auto_bucket_elems(total);
  }
  // Pass 1: offsets, bucket by bucket (plan_grad_buckets, Params.h), each padded to a multiple of dp.
  int64_t off = 0;
  for (const GradBucketPlan& plan : plan_grad_buckets(units, bucket_elems)) {
    GradBucket cur;
    cur.begin = off;
    cur.min_unit = plan.min_unit;
    cur.expert = plan.expert;
    for (const auto& [u, i] : plan.members) {
      const ParamSpec& spec = units[static_cast<size_t>(u)].params[static_cast<size_t>(i)];
      if (u == head && spec.local == "wte") tied_copy_ = static_cast<int64_t>(entries_.size());
      ParamEntry e;
      e.spec = spec;
      e.unit = u;
      e.offset = off;
      e.bucket = buckets_.size();
      e.global_index = global.at(spec.name);
      off += shape_numel(spec.shard);
      index_[spec.name] = entries_.size();
      cur.params.push_back(entries_.size());
      entries_.push_back(std::move(e));
    }
    off = cur.begin + (off - cur.begin + dp - 1) / dp * dp;
    cur.end = off;
    buckets_.push_back(std::move(cur));
  }
  flat_values_ = Tensor::zeros({off}, DType::kF32, tracker);
  flat_grads_ = Tensor::zeros({off}, DType::kF32, tracker);
  // Pass 2: views and initial values.
  for (auto& e : entries_) {
    int64_t n = shape_numel(e.spec.shard);
    e.value = flat_values_.narrow0(e.offset, n).view(e.spec.shard);
    e.grad = flat_grads_.narrow0(e.offset, n).view(e.spec.shard);
    Tensor full = Tensor::empty(e.spec.full);
    init_full_param(e.spec, full, seed);
    extract_shard(e.spec, full, e.value, at);
  }
}

ParamEntry& ParamStore::get(const std::string& name) {
  auto it = index_.find(name);
  DHX_CHECK(it != index_.end(), InternalError, "no parameter named '{}'", name);
  return entries_[it->second];
}

const ParamEntry& ParamStore::get(const std::string& name) const {
  auto it = index_.find(name);
  DHX_CHECK(it != index_.end(), InternalError, "no parameter named '{}'", name);
  return entries_[it->second];
}

ParamEntry& ParamStore::resolve(const UnitSpec& u, const std::string& local) {
  auto it = index_.find(u.prefix + local);
  if (it == index_.end()) it = index_.find(local);  // shared across units (tied embeddings)
  DHX_CHECK(it != index_.end(), InternalError, "unit '{}{}' has no parameter '{}'", u.kind,
            u.layer >= 0 ? std::to_string(u.layer) : "", local);
  return entries_[it->second];
}

void ParamStore::zero_grads() { flat_grads_.zero_(); }

void ParamStore::move_to(Device d, MemoryTracker* tracker, StreamHandle stream) {
  if (d == device()) return;
  flat_values_ = flat_values_.to(d, tracker, stream);
  flat_grads_ = flat_grads_.to(d, tracker, stream);
  flat_bf16_ = d.is_host() ? Tensor() : Tensor::empty(flat_values_.shape(), DType::kBF16, tracker, d, stream);
  for (ParamEntry& e : entries_) {
    const int64_t n = shape_numel(e.spec.shard);
    e.value = flat_values_.narrow0(e.offset, n).view(e.spec.shard);
    e.grad = flat_grads_.narrow0(e.offset, n).view(e.spec.shard);
    e.value_bf16 = d.is_host() ? Tensor() : flat_bf16_.narrow0(e.offset, n).view(e.spec.shard);
  }
  refresh_bf16(stream);
}

void ParamStore::refresh_bf16(StreamHandle stream) {
  if (!flat_bf16_.defined()) return;
  const Tensor v = flat_values_.to(Device::host(), nullptr, stream);
  Tensor h = Tensor::empty(v.shape(), DType::kBF16);
  const float* src = v.f32();
  uint16_t* dst = h.data<uint16_t>();
  for (int64_t i = 0; i < v.numel(); ++i) dst[i] = f32_to_bf16(src[i]);
  flat_bf16_.copy_from(h);
}

bool ParamStore::owns_unit(int unit) const { return std::binary_search(owned_.begin(), owned_.end(), unit); }

int64_t ParamStore::num_elements() const {
  int64_t n = 0;
  for (auto& e : entries_) n += e.value.numel();
  return n;
}

}  // namespace dhelix
