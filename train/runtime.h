// What every command that computes on ranks starts from: the debug switches, this rank's backend,
// the world communicator and the grid's communicators, built in one place from a resolved config.
#pragma once

#include <memory>

#include "core/debug_options.h"
#include "kernels/op.h"
#include "parallel/comm/flight_recorder.h"
#include "parallel/comm/mpi_comm.h"
#include "parallel/context.h"
#include "config/config.h"

namespace tripod {

struct Runtime {
  DebugOptions debug;
  std::unique_ptr<Ops> ops;
  std::unique_ptr<MpiComm> world;  // over every rank; the grid's communicators are split from it
  ParallelContext par;             // the grid of cfg.parallel, sequence parallel as it says
  std::shared_ptr<FlightRecorder> flight;  // par.flight: null unless asked for and sized > 0
};

// This rank's backend for train.device: on CUDA the node-local rank's GPU; more ranks than GPUs
// share them round-robin (their communicators then stage through MPI, see parallel/context.cpp).
std::unique_ptr<Ops> make_rank_ops(const Config& cfg, const DebugOptions& debug);

// Builds the runtime for `cfg`, which must have passed validate_layout() for the world size.
// Collective over the world. Throws InputError, before any communication, when a TRIPOD_*
// variable is invalid or the backend cannot be made (the same on every rank).
// With `flight_recorder` (tripod train) and parallel.flight_recorder_size > 0, every communicator
// records into a flight recorder that dumps to <train.output_dir>/flight/ when a wait times out
// (rank 0 then prints the diagnosis) and when SIGTERM or SIGUSR1 arrives while a wait blocks (a
// hung job: `kill -USR1` its ranks, then `tripod trace diagnose`); an earlier run's dumps are
// moved to flight.previous/ first.
Runtime make_runtime(const Config& cfg, bool flight_recorder = false);
// The same with the TRIPOD_* switches already read (tripod train reads them before MPI starts, for
// the launcher's heartbeat).
Runtime make_runtime(const Config& cfg, const DebugOptions& debug, bool flight_recorder = false);

// Rank 0's report after a timeout: waits briefly for the other ranks' dumps of this incident
// (written at or after `since`), then returns the diagnosis lines ("" when there is nothing).
std::string flight_report(const std::string& run_dir, double since);

}  // namespace tripod
