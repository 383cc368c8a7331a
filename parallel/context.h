// ParallelContext: this rank's place on the grid and its communicators, one per axis. It is
// built once in the entry point and passed explicitly to whatever communicates; no globals.
#pragma once

#include <memory>

#include "core/debug_options.h"
#include "parallel/comm/communicator.h"
#include "parallel/grid.h"

namespace tripod {

class MpiComm;
class FlightRecorder;
class TraceRecorder;

struct ParallelContext {
  RankGrid grid;
  int rank = 0;
  Coords coords;
  bool sequence_parallel = false;
  CpComm cp_comm = CpComm::Ring;
  MoeDispatcher moe_dispatcher = MoeDispatcher::AllToAll;
  // cp: the ranks holding the other chunks of this rank's sequences (null when cp == 1);
  // dpcp: DP x CP, the ranks that reduce gradients together (the dp communicator when cp == 1).
  // ep: the ranks splitting the experts with this one (null when ep == 1); edp: those holding the
  // same experts, over which expert gradients are reduced (dpcp when ep == 1).
  std::unique_ptr<Communicator> world, tp, dp, pp, cp, dpcp_owned, ep, edp_owned;
  Communicator* dpcp = nullptr;
  Communicator* edp = nullptr;
  // First and last pipeline stage of this (tp, dp), which both hold the tied embedding; null on
  // the stages in between and when pp == 1.
  std::unique_ptr<Communicator> embedding;
  // The flight recorder every communicator above records into (null when it is off): the
  // trainer and the pipeline executor tell it the step and phase.
  std::shared_ptr<FlightRecorder> flight;
  // The timeline that communication inside the layers (the cp attention's exchanges) records
  // into, or null: the trainer owning the recorder sets it for its lifetime when tracing is on.
  TraceRecorder* trace = nullptr;

  bool first_stage() const { return coords.pp == 0; }
  bool last_stage() const { return coords.pp == grid.pp() - 1; }
};

struct ContextOptions {
  // Activations between the TP regions sharded along the sequence (parallel.sequence_parallel).
  bool sequence_parallel = false;
  CpComm cp_comm = CpComm::Ring;  // parallel.cp_comm (read when the grid has cp > 1)
  MoeDispatcher moe_dispatcher = MoeDispatcher::AllToAll;  // parallel.moe_dispatcher (read when ep > 1)
  // Device tensors travel through MPI, staged in host memory, even where NCCL could carry them
  // (DebugOptions::force_mpi, TRIPOD_COMM=mpi).
  bool force_mpi = false;
  // When set, every communicator records its operations here (parallel.flight_recorder_size > 0)
  // and injects `comm_fault` (a test hook) when it names this rank.
  std::shared_ptr<FlightRecorder> flight = nullptr;
  CommFault comm_fault = {};
};

// Splits `world` into the axis communicators of `grid` (collective over all world ranks).
ParallelContext make_parallel_context(const MpiComm& world, const RankGrid& grid, const ContextOptions& options);

}  // namespace tripod
