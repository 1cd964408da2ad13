// Logging: a threshold read once from DHELIX_LOG, lines written whole to stderr.
#include "base/Log.h"

#include <cstdlib>
#include <cstring>

namespace dhelix {

LogLevel log_threshold() {
  static const LogLevel level = [] {
    const char* v = std::getenv("DHELIX_LOG");
    if (!v) return LogLevel::kInfo;
    if (!std::strcmp(v, "debug")) return LogLevel::kDebug;
    if (!std::strcmp(v, "warn")) return LogLevel::kWarn;
    if (!std::strcmp(v, "error")) return LogLevel::kError;
    return LogLevel::kInfo;
  }();
  return level;
}

void log_line(LogLevel level, const std::string& text) {
  static const char* kNames[] = {"debug", "info", "warn", "error"};
  std::string line = fmt::format("[dhelix {}] {}\n", kNames[static_cast<int>(level)], text);
  std::fwrite(line.data(), 1, line.size(), stderr);
}

}  // namespace dhelix
