// Shared by the fuzz targets: the contract every reader is held to, and scratch files for
// readers that take a path. A reader may return or throw one of the errors a user's bad input
// earns (ConfigError, IoError, PlanError); anything else -- another exception, InternalError,
// a crash, a sanitizer report -- ends the run, so libFuzzer records the input.
#pragma once
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <string>
#include <string_view>

#include "base/Error.h"

namespace dhelix::fuzz {

[[noreturn]] inline void fail(std::string_view target, std::string_view why) {
  std::fprintf(stderr, "\n==fuzz %.*s== %.*s\n", static_cast<int>(target.size()), target.data(),
               static_cast<int>(why.size()), why.data());
  std::abort();  // libFuzzer reports a deadly signal and saves the input as crash-<sha1>
}

// Runs `read`; true when it returned, false when it threw a bad-input error. Other exceptions
// fail the run.
template <class F>
bool accepts(std::string_view target, F&& read) {
  try {
    read();
    return true;
  } catch (const ConfigError&) {
  } catch (const IoError&) {
  } catch (const PlanError&) {
  } catch (const std::exception& e) {
    fail(target, std::string("reader threw an exception that is not a bad-input error: ") + e.what());
  } catch (...) {
    fail(target, "reader threw a non-std exception");
  }
  return false;
}

// Checks a property of a writer/reader round trip: any exception in `check` is a bug.
template <class F>
void must_hold(std::string_view target, F&& check) {
  try {
    check();
  } catch (const std::exception& e) {
    fail(target, std::string("round trip threw: ") + e.what());
  }
}

// A per-process scratch directory, in memory when /dev/shm exists (readers run thousands of
// times a second). Removed at exit; libFuzzer's time limit ends a run without exit handlers, so
// each start also removes the directories of fuzz processes that are gone.
inline const std::filesystem::path& scratch_dir() {
  static const std::filesystem::path dir = [] {
    std::filesystem::path base = std::filesystem::exists("/dev/shm") ? std::filesystem::path("/dev/shm")
                                                                     : std::filesystem::temp_directory_path();
    std::error_code ec;
    for (const auto& e : std::filesystem::directory_iterator(base, ec)) {
      const std::string n = e.path().filename().string();
      if (n.rfind("dhelix-fuzz-", 0) != 0) continue;
      const long pid = std::atol(n.c_str() + 12);
      if (pid > 0 && ::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH) std::filesystem::remove_all(e.path(), ec);
    }
    std::filesystem::path d = base / ("dhelix-fuzz-" + std::to_string(::getpid()));
    std::filesystem::create_directories(d);
    std::atexit([] {
      std::error_code ec;
      std::filesystem::remove_all(scratch_dir(), ec);
    });
    return d;
  }();
  return dir;
}

// Writes `bytes` to scratch_dir()/name and returns the path.
inline std::string write_scratch(const std::string& name, const void* bytes, size_t n) {
  const std::string path = (scratch_dir() / name).string();
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) fail("scratch", "cannot create " + path);
  if (n > 0 && std::fwrite(bytes, 1, n, f) != n) fail("scratch", "cannot write " + path);
  std::fclose(f);
  return path;
}

}  // namespace dhelix::fuzz
