// MPI for the commands that run on many ranks: initialised once, finalised on a clean exit
// (never while an error unwinds), each within a deadline (a frozen peer would hang both).
#pragma once

#include <mpi.h>

#include <exception>
#include <memory>

#include "core/error.h"
#include "parallel/comm/mpi_comm.h"
#include "parallel/comm/mpi_deadline.h"

namespace tripod {

class MpiSession {
 public:
  // `timeout_s`: the run's parallel.timeout_s (its default when the config is not read yet), which
  // bounds MPI_Init and MPI_Finalize (see MpiDeadline).
  explicit MpiSession(double timeout_s = 600) : limit_s_(MpiDeadline::limit_for(timeout_s)) {
    int provided = 0;
    set_mpi_defaults();
    MpiDeadline deadline("MPI_Init", limit_s_);
    MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
    MPI_Comm_size(MPI_COMM_WORLD, &size_);
  }
  ~MpiSession() {
    // Unwinding from an error (a peer that timed out, say): MPI_Finalize would wait for ranks that
    // may never come. main() reports the error and exits; the launcher ends the others.
    if (std::uncaught_exceptions() > 0) return;
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (finalized) return;
    MpiDeadline deadline("MPI_Finalize", limit_s_);
    MPI_Finalize();
  }
  MpiSession(const MpiSession&) = delete;
  MpiSession& operator=(const MpiSession&) = delete;
  int rank() const { return rank_; }
  int size() const { return size_; }
  // The rank on this node (from the launcher), which picks the GPU.
  static int local_rank();

 private:
  double limit_s_;
  int rank_ = 0, size_ = 1;
};

// Before the grid exists every rank reads the same inputs and fails the same way: the command
// rethrows such an error as agreed by every rank, and main reports it once (rank 0), finalizes
// MPI and exits 2 on every rank.
[[noreturn]] inline void rethrow_agreed(const InputError& e) { throw InputError(e.what(), InputError::Scope::Agreed); }

}  // namespace tripod
