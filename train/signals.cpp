// Stop-signal handlers: set a flag, nothing else (async-signal-safe).
#include "train/signals.h"

#include <csignal>

namespace tripod {

namespace {
volatile std::sig_atomic_t g_signal = 0;
extern "C" void on_stop_signal(int sig) { g_signal = sig; }
}  // namespace

void install_stop_signal_handlers() {
  struct sigaction sa {};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGUSR1, &sa, nullptr);
}

int stop_signal() { return g_signal; }

}  // namespace tripod
