// ParamStore: this rank's parameter shards and their gradients, one copy shared by both strands
// (Strand Interleaving never replicates model states). Values and gradients live in two flat
// buffers laid out in backward order (head, last layer, ..., first layer, embed), grouped into
// buckets that data parallelism reduces as soon as backward has produced them; each bucket is
// padded to a multiple of dp so ZeRO-1 can give rank r chunk r of every bucket.
#pragma once
#include <map>
#include <string>
#include <vector>

#include "sharding/ShardIndex.h"
#include "tensor/Tensor.h"

namespace dhelix {

struct ParamEntry {
  ParamSpec spec;
  int unit = 0;       // index of the owning unit in forward order
  int64_t offset = 0; // element offset in the flat buffers
  size_t bucket = 0;  // index of the gradient bucket holding it
  int64_t global_index = 0;  // position among the whole model's entries (a one-stage store's order)
  Tensor value;       // view into the flat values, shape spec.shard
  Tensor grad;        // view into the flat grads, accumulated by both strands
  Tensor value_bf16;  // a GPU store's bf16 copy of value (the GEMMs' weights), or undefined
};

struct GradBucket {
  int64_t begin = 0, end = 0;  // element range in the flat buffers (end - begin divisible by dp)
  int min_unit = 0;            // the bucket is complete once backward finished this unit
  std::vector<size_t> params;  // entries inside it
  bool expert = false;         // MoE experts' weights (alone in it): reduced over the edp group
};

class ParamStore {
 public:
  // Allocates every parameter of `units` (this rank's shards) and initialises them from the full
  // deterministic init (so any layout starts from the single-process weights). Buckets hold about
  // `bucket_elems` elements; 0 = auto_bucket_elems() (model/Params.h, as plan_grad_buckets, whose
  // buckets these are: the simulators price the same).
  ParamStore(const std::vector<UnitSpec>& units, const ShardIndex& at, int dp, uint64_t seed, MemoryTracker* tracker,
             int64_t bucket_elems = 0);
  // A pipeline stage's store: only the parameters of `owned_units` (indices into `units`, which is
  // the whole model), entries keeping their unit's index in `units`. A stage that owns the head but
  // not the embedding of a tied model gets its own copy of "wte" (entry unit = the head's index);
  // GradSync sums the two copies' gradients (tied_copy()).
  ParamStore(const std::vector<UnitSpec>& units, const std::vector<int>& owned_units, const ShardIndex& at, int dp,
             uint64_t seed, MemoryTracker* tracker, int64_t bucket_elems = 0);
  ParamEntry& get(const std::string& global_name);
  const ParamEntry& get(const std::string& global_name) const;
  // Resolves a program's parameter name inside unit `u` ("wqkv" -> "layers.3.wqkv"; tied "wte").
  ParamEntry& resolve(const UnitSpec& u, const std::string& local);
  bool has(const std::string& global_name) const { return index_.count(global_name) > 0; }

  std::vector<ParamEntry>& entries() { return entries_; }
  const std::vector<ParamEntry>& entries() const { return entries_; }
  const std::vector<GradBucket>& buckets() const { return buckets_; }
  Tensor& flat_values() { return flat_values_; }
  Tensor& flat_grads() { return flat_grads_; }
  Tensor& flat_bf16() { return flat_bf16_; }  // a GPU store's bf16 copy of flat_values (else undefined)
  int dp() const { return dp_; }
  bool owns_unit(int unit) const;
  // Entries of the whole model (every stage's, the tied copy not counted): global_index bound.
  int64_t num_global_entries() const { return num_global_; }
  // The name of the whole model's entry `global_index` (held by this stage or not).
  const std::string& global_name(int64_t global_index) const { return global_names_.at(static_cast<size_t>(global_index)); }
  // The head's copy of a tied "wte" on a stage without the embedding; null elsewhere.
  const ParamEntry* tied_copy() const { return tied_copy_ < 0 ? nullptr : &entries_[tied_copy_]; }
  void zero_grads();
  int64_t num_elements() const;  // parameter elements (no padding)
  // Moves the flat values and gradients to `d` (their bytes copied, ordered on `stream`; charged to
  // `tracker`) and points every entry's value and grad at the moved buffers. On a GPU the store also
  // keeps a flat bf16 copy of the values (each entry's value_bf16), the weights its bf16 GEMMs read:
  // made here, rewritten by the GPU optimizer with each update (or refresh_bf16). A GPU run keeps
  // its model states on its GPU; checkpoints read them back through Tensor::to.
  void move_to(Device d, MemoryTracker* tracker, StreamHandle stream = nullptr);
  // Rewrites the bf16 copy from the fp32 values (after the values changed other than through the
  // GPU optimizer: set_values, a checkpoint load). Rounds on the host; a no-op on a host store.
  void refresh_bf16(StreamHandle stream = nullptr);
  Device device() const { return flat_values_.device(); }

 private:
  std::vector<ParamEntry> entries_;
  std::map<std::string, size_t> index_;
  std::vector<GradBucket> buckets_;
  Tensor flat_values_, flat_grads_;
  Tensor flat_bf16_;  // a GPU store's bf16 copy of flat_values_ (undefined on the host)
  int dp_;
  std::vector<int> owned_;  // sorted unit indices
  int64_t tied_copy_ = -1;
  int64_t num_global_ = 0;
  std::vector<std::string> global_names_;  // [global_index]
};

}  // namespace dhelix
