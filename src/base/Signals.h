// Graceful stop for long runs: the first SIGTERM or SIGINT only records the signal, which the
// training loop reads between steps (it then finishes the step, saves a checkpoint and exits with
// 128 + the signal number); a second one ends the process at once (the default action).
#pragma once

namespace dhelix {

// Installs the handlers (idempotent). Not installed by the library on its own: the CLI does.
void install_stop_handlers();
// The first stop signal received since install_stop_handlers(), or 0.
int stop_signal();
// "SIGTERM", "SIGINT", or "signal N".
const char* signal_name(int sig);

}  // namespace dhelix
