// Graceful stop for long runs: the first SIGTERM or SIGINT only records the signal; a second one
// ends the process at once (the default action). The training loop reads it between steps (it then
// finishes the step, saves a checkpoint and exits with 128 + the signal number); every other long
// loop of a command that installs the handlers reads it at its stop points (stop_point), which
// throw StopRequested: the command unwinds (temporary files removed, nothing half-written) and
// exits with 128 + the signal number.
#pragma once
#include <stdexcept>
#include <string>

namespace dhelix {

// A first stop signal seen at a stop point: `where` names what was interrupted.
class StopRequested : public std::runtime_error {
 public:
  StopRequested(int sig, const std::string& where);
  int sig() const { return sig_; }
  const std::string& where() const { return where_; }

 private:
  int sig_;
  std::string where_;
};

// Throws StopRequested(`where`) once a stop signal has arrived; otherwise returns at once.
void stop_point(const std::string& where);

// Installs the handlers (idempotent). Not installed by the library on its own: the CLI does.
void install_stop_handlers();
// The first stop signal received since install_stop_handlers(), or 0.
int stop_signal();
// "SIGTERM", "SIGINT", or "signal N".
const char* signal_name(int sig);

}  // namespace dhelix
