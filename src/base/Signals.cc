// Stop-signal handlers (Signals.h). The handler only touches a sig_atomic_t and, the second time,
// restores the default action and re-raises: both async-signal-safe.
#include "base/Signals.h"

#include <signal.h>

#include <csignal>
#include <cstring>

namespace dhelix {
namespace {

volatile std::sig_atomic_t g_stop = 0;

extern "C" void on_stop_signal(int sig) {
  if (g_stop == 0) {
    g_stop = sig;
    return;
  }
  struct sigaction dfl;
  std::memset(&dfl, 0, sizeof dfl);
  dfl.sa_handler = SIG_DFL;
  sigaction(sig, &dfl, nullptr);
  raise(sig);
}

}  // namespace

void install_stop_handlers() {
  struct sigaction sa;
  std::memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;  // a blocking read or write in flight goes on
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGINT, &sa, nullptr);
}

int stop_signal() { return static_cast<int>(g_stop); }

StopRequested::StopRequested(int sig, const std::string& where)
    : std::runtime_error(std::string("stopped by ") + signal_name(sig) + " during " + where), sig_(sig), where_(where) {}

void stop_point(const std::string& where) {
  if (const int sig = stop_signal(); sig != 0) throw StopRequested(sig, where);
}

const char* signal_name(int sig) {
  switch (sig) {
    case SIGTERM: return "SIGTERM";
    case SIGINT: return "SIGINT";
    default: return "a stop signal";
  }
}

}  // namespace dhelix
