// DataLoader: deterministic batches of next-token windows from an IndexedDataset.
// The split's tokens form one stream (documents back to back, each ending in EOS). Window w covers
// stream tokens [w*T, w*T + T]: tokens = its first T, targets = its last T (shifted by one).
// Each epoch visits the windows in a seeded permutation (train) or in order (val). A global
// micro-batch is the next B*dp windows of that order; dp rank r takes windows [r*B, (r+1)*B),
// so the global sequence of samples is the same for every dp size. A tail shorter than a global
// micro-batch is dropped at the epoch end. State = (epoch, position): JSON, bitwise resume.
// Not here: tokenization, prefetch threads.
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <vector>

#include "tensor/Tensor.h"
#include "train/IndexedDataset.h"

namespace dhelix {

enum class Split { kTrain, kVal };
const char* split_name(Split s);

struct Batch {
  Tensor tokens;   // i32 [B, T]
  Tensor targets;  // i32 [B, T]: targets[b, t] = tokens[b, t+1] of the same window
};

class DataLoader {
 public:
  // `dataset` must outlive the loader. The last round(val_fraction * documents) documents (at least
  // one when val_fraction > 0) form the validation split. A split with fewer windows than one
  // global micro-batch (B * dp_size) throws ConfigError with the numbers.
  DataLoader(const IndexedDataset& dataset, Split split, int64_t B, int64_t T, uint64_t seed, int64_t dp_rank,
             int64_t dp_size, double val_fraction);

  Batch next();                     // this rank's [B, T] slice of the next global micro-batch
  void next_into(Batch& out);       // same, reusing out's tensors when their shapes match

  int64_t num_windows() const { return num_windows_; }
  int64_t epoch() const { return epoch_; }
  int64_t position() const { return position_; }  // windows of the current epoch already consumed
  std::pair<int64_t, int64_t> token_range() const { return {begin_, end_}; }

  // {"split", "epoch", "position", "windows", "global_batch", "seed", "T"}; set_state checks that
  // the shape fields match this loader (ConfigError naming the field otherwise).
  nlohmann::json state() const;
  void set_state(const nlohmann::json& s);
  // Back to the first batch of epoch 0; call before each evaluation so every evaluation sees the
  // same validation batches.
  void reset() { epoch_ = 0, position_ = 0; }

 private:
  int64_t window_at(int64_t k);  // k-th window of the current epoch's order

  const IndexedDataset& ds_;
  Split split_;
  int64_t B_, T_;
  uint64_t seed_;
  int64_t dp_rank_, dp_size_;
  int64_t begin_ = 0, end_ = 0, num_windows_ = 0;
  int64_t epoch_ = 0, position_ = 0;
  std::vector<int64_t> order_;
  int64_t order_epoch_ = -1;
  std::vector<int32_t> scratch_;
};

}  // namespace dhelix
