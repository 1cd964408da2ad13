// Minimal leveled logging to stderr with a rank prefix. The rank travels in a LogContext
// owned by the caller (no global mutable state beyond the process-wide verbosity, which main sets
// from the config's output.log_level).
#pragma once
#include <fmt/format.h>
#include <cstdio>
#include <optional>
#include <string>

namespace dhelix {

enum class LogLevel { kDebug = 0, kInfo = 1, kWarn = 2, kError = 3 };

// "debug" | "info" | "warn" | "error" -> the level; anything else -> nullopt.
std::optional<LogLevel> parse_log_level(const std::string& name);
// The least severe level printed; default info until set_log_threshold (main, from output.log_level).
LogLevel log_threshold();
void set_log_threshold(LogLevel level);

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
