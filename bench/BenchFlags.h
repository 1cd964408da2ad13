// The benchmark programs' flag reading: `--name value` words in order, a missing value or a
// count that is not a non-negative integer (or a number that does not parse) is a ConfigError
// naming the flag.
#pragma once
#include <cstdint>
#include <cstdlib>
#include <string>

#include "base/Error.h"

namespace dhelix {

class BenchFlags {
 public:
  BenchFlags(int argc, char** argv) : argc_(argc), argv_(argv) {}
  // Moves to the next word (the flag name, key()); false when none is left.
  bool next() {
    if (++i_ >= argc_) return false;
    key_ = argv_[i_];
    return true;
  }
  const std::string& key() const { return key_; }
  // The word after the flag.
  std::string value() {
    DHX_CHECK(i_ + 1 < argc_, ConfigError, "{} needs a value", key_);
    return argv_[++i_];
  }
  int64_t count() {
    const std::string v = value();
    char* end = nullptr;
    const long long n = std::strtoll(v.c_str(), &end, 10);
    DHX_CHECK(end != v.c_str() && *end == '\0' && n >= 0, ConfigError, "{}={} is not a count", key_, v);
    return n;
  }
  double number() {
    const std::string v = value();
    char* end = nullptr;
    const double x = std::strtod(v.c_str(), &end);
    DHX_CHECK(end != v.c_str() && *end == '\0', ConfigError, "{}={} is not a number", key_, v);
    return x;
  }

 private:
  int argc_;
  char** argv_;
  int i_ = 0;
  std::string key_;
};

}  // namespace dhelix
