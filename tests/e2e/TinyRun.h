// Helpers for end-to-end trainer tests: a tiny model config and a synthetic token dataset in a
// temporary directory (no tokenizer, no corpus needed).
#pragma once
#include <stdlib.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "train/Config.h"
#include "train/IndexedDataset.h"

namespace dhelix::testing {

class TempDir {
 public:
  TempDir() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "dhelix_e2e_XXXXXX").string();
    path_ = ::mkdtemp(tmpl.data());
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// Documents of a noisy repeating pattern over `vocab` tokens (learnable, so loss falls).
inline void write_synthetic_dataset(const std::string& prefix, int64_t vocab, int64_t docs, uint64_t seed) {
  IndexedDatasetWriter w(prefix, IndexDType::kU16);
  std::mt19937_64 rng(seed);
  for (int64_t d = 0; d < docs; ++d) {
    std::vector<int32_t> toks(64 + rng() % 64);
    int32_t start = static_cast<int32_t>(rng() % vocab);
    for (size_t i = 0; i < toks.size(); ++i)
      toks[i] = (rng() % 8 == 0) ? static_cast<int32_t>(rng() % vocab) : static_cast<int32_t>((start + 3 * i) % vocab);
    w.add_document(toks);
  }
  w.finish();
}

inline RunConfig tiny_config(const std::string& dir, const std::string& family) {
  std::string toml = R"(
[model]
preset = "demo"
family = ")" + family + R"("
vocab_size = 200
seq_len = 32
d_model = 64
n_layers = 2
n_heads = 4
n_kv_heads = )" + (family == "gpt" ? "4" : "2") + R"(
ffn_hidden = 128
)" + (family == "moe" ? "n_experts = 4\ntop_k = 2\n" : "") + R"(
[training]
steps = 6
micro_batch_size = 2
micro_batches = 2
lr = 1e-2
min_lr = 1e-3
warmup_steps = 2
eval_interval = 0
sample_tokens = 0
threads = 1
[data]
prefix = ")" + dir + R"(/data"
[checkpoint]
keep = 0
[output]
dir = ")" + dir + R"(/run"
)";
  return load_config_text(toml, "tiny", {});
}

// Two loss curves of equal length (a multiple of 20) compared by 20-step windows (one step's loss
// swings with its micro-batches' contents): the largest gap between the windows' means, the last
// window's means, and each curve's drop from its first loss to its last window's mean.
struct CurveGap {
  double worst = 0, tail_ref = 0, tail = 0, drop_ref = 0, drop = 0;
};
inline CurveGap curve_gap(const std::vector<double>& ref, const std::vector<double>& h) {
  CurveGap g;
  for (size_t w = 0; w + 20 <= ref.size() && w + 20 <= h.size(); w += 20) {
    double mr = 0, mh = 0;
    for (size_t i = w; i < w + 20; ++i) mr += ref[i] / 20, mh += h[i] / 20;
    g.worst = std::max(g.worst, std::abs(mr - mh));
    g.tail_ref = mr, g.tail = mh;
  }
  g.drop_ref = ref.front() - g.tail_ref, g.drop = h.front() - g.tail;
  return g;
}

}  // namespace dhelix::testing
