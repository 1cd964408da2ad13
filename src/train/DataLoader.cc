// Deterministic windowed batches (see DataLoader.h for the sampling rule).
#include "train/DataLoader.h"

#include <cmath>

#include "base/Error.h"

namespace dhelix {
namespace {

// splitmix64: a fixed, portable generator (std::shuffle's output is implementation-defined).
uint64_t splitmix64(uint64_t& state) {
  uint64_t z = (state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

}  // namespace

const char* split_name(Split s) { return s == Split::kTrain ? "train" : "val"; }

DataLoader::DataLoader(const IndexedDataset& dataset, Split split, int64_t B, int64_t T, uint64_t seed,
                       int64_t dp_rank, int64_t dp_size, double val_fraction)
    : ds_(dataset), split_(split), B_(B), T_(T), seed_(seed), dp_rank_(dp_rank), dp_size_(dp_size) {
  DHX_CHECK(B >= 1 && T >= 1 && dp_size >= 1 && dp_rank >= 0 && dp_rank < dp_size, ConfigError,
            "DataLoader needs B >= 1, T >= 1, 0 <= dp_rank < dp_size (got B={}, T={}, dp_rank={}, dp_size={})", B, T,
            dp_rank, dp_size);
  DHX_CHECK(val_fraction >= 0 && val_fraction < 1, ConfigError, "data.val_fraction={} must be in [0, 1)",
            val_fraction);
  const int64_t D = ds_.num_documents();
  int64_t n_val = static_cast<int64_t>(std::llround(val_fraction * static_cast<double>(D)));
  if (val_fraction > 0 && n_val == 0 && D > 1) n_val = 1;
  const int64_t n_train = D - n_val;
  auto [b, e] = split == Split::kTrain ? ds_.document_token_range(0, n_train) : ds_.document_token_range(n_train, D);
  begin_ = b, end_ = e;
  num_windows_ = end_ - begin_ > 0 ? (end_ - begin_ - 1) / T_ : 0;
  DHX_CHECK(num_windows_ >= B_ * dp_size_, ConfigError,
            "the {} split of '{}' ({} documents, {} tokens) has {} windows of T+1={} tokens, fewer than one global "
            "micro-batch of B*dp = {}*{} = {}; lower training.micro_batch_size or model.seq_len, or change "
            "data.val_fraction={}", split_name(split), ds_.prefix(), split == Split::kTrain ? n_train : n_val,
            end_ - begin_, num_windows_, T_ + 1, B_, dp_size_, B_ * dp_size_, val_fraction);
}

int64_t DataLoader::window_at(int64_t k) {
  if (split_ == Split::kVal) return k;
  if (order_epoch_ != epoch_) {
    order_.resize(static_cast<size_t>(num_windows_));
    for (int64_t i = 0; i < num_windows_; ++i) order_[i] = i;
    uint64_t st = seed_ ^ (0xd1b54a32d192ed03ull * static_cast<uint64_t>(epoch_ + 1));
    for (int64_t i = num_windows_ - 1; i > 0; --i) {  // Fisher-Yates; j uniform in [0, i] (Lemire)
      auto j = static_cast<int64_t>((static_cast<unsigned __int128>(splitmix64(st)) * (i + 1)) >> 64);
      std::swap(order_[i], order_[j]);
    }
    order_epoch_ = epoch_;
  }
  return order_[static_cast<size_t>(k)];
}

void DataLoader::next_into(Batch& out) {
  const int64_t global = B_ * dp_size_;
  if (position_ + global > num_windows_) {  // drop the tail, start the next epoch
    ++epoch_;
    position_ = 0;
  }
  if (!out.tokens.defined() || out.tokens.shape() != Shape{B_, T_} || out.tokens.dtype() != DType::kI32) {
    out.tokens = Tensor::empty({B_, T_}, DType::kI32);
    out.targets = Tensor::empty({B_, T_}, DType::kI32);
  }
  scratch_.resize(static_cast<size_t>(T_ + 1));
  int32_t* tok = out.tokens.data<int32_t>();
  int32_t* tgt = out.targets.data<int32_t>();
  for (int64_t b = 0; b < B_; ++b) {
    int64_t w = window_at(position_ + dp_rank_ * B_ + b);
    ds_.read_tokens(begin_ + w * T_, T_ + 1, scratch_.data());
    std::copy(scratch_.begin(), scratch_.begin() + T_, tok + b * T_);
    std::copy(scratch_.begin() + 1, scratch_.end(), tgt + b * T_);
  }
  position_ += global;
}

Batch DataLoader::next() {
  Batch b;
  next_into(b);
  return b;
}

nlohmann::json DataLoader::state() const {
  return {{"split", split_name(split_)}, {"epoch", epoch_},          {"position", position_},
          {"windows", num_windows_},     {"global_batch", B_ * dp_size_}, {"seed", seed_}, {"T", T_}};
}

void DataLoader::set_state(const nlohmann::json& s) {
  try {
    auto expect = [&](const char* key, const nlohmann::json& mine) {
      DHX_CHECK(s.at(key) == mine, ConfigError,
                "data-loader state does not fit this run: {} is {} in the checkpoint but {} now", key,
                s.at(key).dump(), mine.dump());
    };
    expect("split", split_name(split_));
    expect("windows", num_windows_);
    expect("global_batch", B_ * dp_size_);
    expect("seed", seed_);
    expect("T", T_);
    int64_t epoch = s.at("epoch").get<int64_t>(), pos = s.at("position").get<int64_t>();
    DHX_CHECK(epoch >= 0 && pos >= 0 && pos <= num_windows_, ConfigError,
              "data-loader state has epoch={} position={} outside [0, {}]", epoch, pos, num_windows_);
    epoch_ = epoch;
    position_ = pos;
  } catch (const nlohmann::json::exception& e) {
    throw ConfigError(fmt::format("data-loader state {} is malformed: {}", s.dump(), e.what()));
  }
}

}  // namespace dhelix
