// Metrics: one JSON object per line (JSONL), flushed after every line so a crashed or running job
// can be plotted. Fields left unset are omitted. Not here: aggregation or plotting.
#pragma once
#include <cstdint>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

namespace dhelix {

struct StepMetrics {
  int64_t step = 0;
  std::optional<double> loss, lr, grad_norm, tokens_per_s;
  std::optional<double> model_flops_per_s;  // 6*N*tokens + attention terms (ModelConfig::flops_per_token) / s
  std::optional<double> sgemm_fraction;     // model_flops_per_s / this machine's sgemm FLOP/s measured now
  std::optional<int64_t> peak_bytes;        // peak tracked bytes (activations + states)
  nlohmann::json extras = nlohmann::json::object();  // e.g. {"val_loss": 3.2, "phase": "eval"}

  nlohmann::json to_json() const;
};

enum class MetricsMode { kTruncate, kAppend };  // kAppend when resuming a run

class MetricsWriter {
 public:
  // Creates parent directories. Throws IoError naming the path.
  explicit MetricsWriter(const std::string& path, MetricsMode mode = MetricsMode::kTruncate);
  ~MetricsWriter();
  MetricsWriter(const MetricsWriter&) = delete;
  MetricsWriter& operator=(const MetricsWriter&) = delete;

  void write(const StepMetrics& m) { write_json(m.to_json()); }
  void write_json(const nlohmann::json& line);  // one line, flushed
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  std::FILE* f_ = nullptr;
};

}  // namespace dhelix
