// Logging: a process-wide threshold (set by main from output.log_level), lines written whole to
// stderr.
#include "base/Log.h"

#include <atomic>

namespace dhelix {

namespace {
// The one process-wide setting here: it only filters stderr, and every thread reads it.
std::atomic<int> g_threshold{static_cast<int>(LogLevel::kInfo)};
}  // namespace

std::optional<LogLevel> parse_log_level(const std::string& name) {
  if (name == "debug") return LogLevel::kDebug;
  if (name == "info") return LogLevel::kInfo;
  if (name == "warn") return LogLevel::kWarn;
  if (name == "error") return LogLevel::kError;
  return std::nullopt;
}

LogLevel log_threshold() { return static_cast<LogLevel>(g_threshold.load(std::memory_order_relaxed)); }

void set_log_threshold(LogLevel level) { g_threshold.store(static_cast<int>(level), std::memory_order_relaxed); }

void log_line(LogLevel level, const std::string& text) {
  static const char* kNames[] = {"debug", "info", "warn", "error"};
  std::string line = fmt::format("[dhelix {}] {}\n", kNames[static_cast<int>(level)], text);
  std::fwrite(line.data(), 1, line.size(), stderr);
}

}  // namespace dhelix
