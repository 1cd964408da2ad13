// JSONL metrics writer.
#include "train/Metrics.h"

#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>

#include "base/Error.h"

namespace dhelix {

nlohmann::json StepMetrics::to_json() const {
  nlohmann::json j;
  j["step"] = step;
  auto put = [&](const char* k, const std::optional<double>& v) {
    if (v) j[k] = std::isfinite(*v) ? nlohmann::json(*v) : nlohmann::json(nullptr);  // JSON has no NaN
  };
  put("loss", loss);
  put("lr", lr);
  put("grad_norm", grad_norm);
  put("tokens_per_s", tokens_per_s);
  put("model_flops_per_s", model_flops_per_s);
  put("sgemm_fraction", sgemm_fraction);
  if (peak_bytes) j["peak_bytes"] = *peak_bytes;
  if (extras.is_object())
    for (const auto& [k, v] : extras.items()) j[k] = v;
  return j;
}

MetricsWriter::MetricsWriter(const std::string& path, MetricsMode mode) : path_(path) {
  std::filesystem::path parent = std::filesystem::path(path).parent_path();
  std::error_code ec;
  if (!parent.empty()) std::filesystem::create_directories(parent, ec);
  f_ = std::fopen(path.c_str(), mode == MetricsMode::kAppend ? "a" : "w");
  DHX_CHECK(f_ != nullptr, IoError, "cannot open metrics file '{}': {}", path, std::strerror(errno));
}

MetricsWriter::~MetricsWriter() {
  if (f_) std::fclose(f_);
}

void MetricsWriter::write_json(const nlohmann::json& line) {
  std::string s = line.dump() + "\n";
  DHX_CHECK(std::fwrite(s.data(), 1, s.size(), f_) == s.size() && std::fflush(f_) == 0, IoError,
            "writing metrics to '{}' failed: {}", path_, std::strerror(errno));
}

}  // namespace dhelix
