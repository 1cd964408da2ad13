// Typed errors for the whole engine, and the DHX_CHECK macro that throws them with the
// values and context that failed. Library code throws; only main() turns errors into exit codes
// (ConfigError / IoError / PlanError on user input -> exit 2, DivergedError -> exit 3).
#pragma once
#include <fmt/format.h>
#include <stdexcept>
#include <string>

namespace dhelix {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};
// Bad configuration or command-line values (exit 2).
class ConfigError : public Error { public: using Error::Error; };
// Missing, truncated or corrupt files (exit 2).
class IoError : public Error { public: using Error::Error; };
// A collective failed, timed out, or a peer died.
class CommError : public Error { public: using Error::Error; };
// A device (GPU backend) was asked for and is not available.
class DeviceError : public Error { public: using Error::Error; };
// A plan (SI plan, schedule) that breaks a rule (exit 2 when it came from a file).
class PlanError : public Error { public: using Error::Error; };
// Training diverged: a non-finite loss or gradient the run may not skip, or state that would put
// non-finite values into a checkpoint (exit 3).
class DivergedError : public Error { public: using Error::Error; };
// An internal invariant broke: a bug in dhelix, not in the input.
class InternalError : public Error { public: using Error::Error; };

}  // namespace dhelix

// DHX_CHECK(cond, ErrorType, "fmt {}", args...): throw ErrorType with the formatted message.
#define DHX_CHECK(cond, ErrType, ...)                                   \
  do {                                                                  \
    if (!(cond)) [[unlikely]] throw ErrType(fmt::format(__VA_ARGS__));  \
  } while (0)

// DHX_ASSERT(cond, ...): internal invariant; names the file and line.
#define DHX_ASSERT(cond, ...)                                                          \
  do {                                                                                 \
    if (!(cond)) [[unlikely]]                                                          \
      throw ::dhelix::InternalError(fmt::format("{}:{}: internal check `{}` failed: {}", \
                                                __FILE__, __LINE__, #cond,             \
                                                fmt::format(__VA_ARGS__)));            \
  } while (0)
