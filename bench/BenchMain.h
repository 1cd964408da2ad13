// The benchmark programs' main(): stdout line-buffered; runs `run`, and turns a ConfigError (or a DeviceError: no such
// GPU here) into its message and exit 2;
// any other error prints and either returns 1 (one process) or aborts the MPI world (multi-rank
// benchmarks, so no rank is left waiting in a collective).
#pragma once
#include <cstdio>
#include <exception>

#include "base/Error.h"
#include "base/JsonText.h"
#include "comm/CommContext.h"

namespace dhelix {

enum class OnFailure { kReturn, kAbortWorld };

template <typename Run>
int bench_main(const char* name, Run run, OnFailure on_failure) {
  // Each line reaches a log file as it is printed: a benchmark stopped by a timeout keeps what it
  // measured (stdout into a file is otherwise fully buffered and lost with the process).
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  try {
    return run();
  } catch (const ConfigError& e) {
    std::fprintf(stderr, "%s: %s\n", name, e.what());
    return 2;
  } catch (const DeviceError& e) {
    std::fprintf(stderr, "%s: %s\n", name, e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: %s\n", name, e.what());
    if (on_failure == OnFailure::kAbortWorld) abort_world(e.what());
    return 1;
  }
}

}  // namespace dhelix
