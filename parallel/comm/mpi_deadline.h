// A deadline for the MPI calls that block with no timeout of their own: MPI_Init, communicator
// creation (MPI_Comm_dup, MPI_Comm_split, MPI_Comm_create_group) and MPI_Finalize. Each waits for
// every rank to take part, so a rank that is stopped (SIGSTOP, a frozen node) or hung before it gets
// there keeps the others waiting forever, and mpirun, which sees no process end, waits with them.
// While an MpiDeadline lives, a thread watches the clock; past the limit it prints this rank's one
// error line and ends the process with exit status 1, so that mpirun ends the job (killing the
// frozen rank) and launch/restarts.sh can start it again. Every other wait has its own timeout
// (MpiComm::wait).
#pragma once

#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>

namespace tripod {

class MpiDeadline {
 public:
  // Such calls get parallel.timeout_s, but at least this long: start-up on a loaded node (every
  // rank loading its libraries, MPI wiring up) must not be mistaken for a frozen peer.
  static constexpr double kMinLimitS = 30;
  static double limit_for(double timeout_s) { return timeout_s > kMinLimitS ? timeout_s : kMinLimitS; }

  // `what`: the call, as the error names it ("MPI_Init"); `limit_s`: seconds it may take.
  MpiDeadline(std::string what, double limit_s);
  ~MpiDeadline();  // the call returned: disarms the watch
  MpiDeadline(const MpiDeadline&) = delete;
  MpiDeadline& operator=(const MpiDeadline&) = delete;

 private:
  std::string what_;
  double limit_s_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  std::thread watch_;
};

}  // namespace tripod
