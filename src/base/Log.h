// Minimal leveled logging to stderr with a rank prefix. The rank travels in a LogContext
// owned by the caller (no global mutable state beyond the process-wide verbosity read once).
#pragma once
#include <fmt/format.h>
#include <cstdio>
#include <string>

namespace dhelix {

enum class LogLevel { kDebug = 0, kInfo = 1, kWarn = 2, kError = 3 };

// Reads DHELIX_LOG (debug|info|warn|error) once; default info.
LogLevel log_threshold();

void log_line(LogLevel level, const std::string& text);

template <typename... Args>
void log_info(fmt::format_string<Args...> f, Args&&... args) {
  if (log_threshold() <= LogLevel::kInfo) log_line(LogLevel::kInfo, fmt::format(f, std::forward<Args>(args)...));
}
template <typename... Args>
void log_warn(fmt::format_string<Args...> f, Args&&... args) {
  if (log_threshold() <= LogLevel::kWarn) log_line(LogLevel::kWarn, fmt::format(f, std::forward<Args>(args)...));
}
template <typename... Args>
void log_debug(fmt::format_string<Args...> f, Args&&... args) {
  if (log_threshold() <= LogLevel::kDebug) log_line(LogLevel::kDebug, fmt::format(f, std::forward<Args>(args)...));
}

}  // namespace dhelix
