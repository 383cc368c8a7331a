// What every command that computes on ranks starts from: the debug switches, this rank's backend,
// the world communicator and the grid's communicators, built in one place from a resolved config.
#pragma once

#include <memory>

#include "core/debug_options.h"
#include "kernels/op.h"
#include "parallel/comm/mpi_comm.h"
#include "parallel/context.h"
#include "config/config.h"

namespace tripod {

struct Runtime {
  DebugOptions debug;
  std::unique_ptr<Ops> ops;
  std::unique_ptr<MpiComm> world;  // over every rank; the grid's communicators are split from it
  ParallelContext par;             // the grid of cfg.parallel, sequence parallel as it says
};

// This rank's backend for train.device: on CUDA the node-local rank's GPU; more ranks than GPUs
// share them round-robin (their communicators then stage through MPI, see parallel/context.cpp).
std::unique_ptr<Ops> make_rank_ops(const Config& cfg, const DebugOptions& debug);

// Builds the runtime for `cfg`, which must have passed validate_layout() for the world size.
// Collective over the world. Throws InputError, before any communication, when a TRIPOD_*
// variable is invalid or the backend cannot be made (the same on every rank).
Runtime make_runtime(const Config& cfg);

}  // namespace tripod
