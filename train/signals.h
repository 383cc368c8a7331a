// SIGTERM and SIGUSR1 (what Slurm and most schedulers send before a job's time is up) ask the
// trainer to checkpoint and stop: the handler only records the signal; the training loop looks
// after each step, and the ranks agree (in the step's own all-reduce) so that every rank saves
// and exits 0.
#pragma once

namespace tripod {

// Installs the handlers (idempotent).
void install_stop_signal_handlers();
// The signal received since the handlers were installed, or 0.
int stop_signal();

}  // namespace tripod
