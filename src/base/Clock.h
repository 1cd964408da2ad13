// Monotonic wall-clock helpers (seconds as double) used by timers, metrics and traces.
#pragma once
#include <chrono>

namespace dhelix {

inline double now_seconds() {
  using namespace std::chrono;
  return duration<double>(steady_clock::now().time_since_epoch()).count();
}

}  // namespace dhelix
