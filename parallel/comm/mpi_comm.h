// Communicator over MPI (Open MPI). Host memory directly; device memory staged through host
// buffers (pinned, from the backend's host allocator). Every wait is bounded by a timeout so a
// dead peer ends this rank with an error instead of a hang.
#pragma once

#include <mpi.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "kernels/op.h"
#include "parallel/comm/communicator.h"

namespace tripod {

// Callbacks of a rank's waits, shared by the communicators split from one world (set on the world
// before splitting). `poll` runs every few milliseconds while a wait blocks (the flight recorder
// looks for a stop signal there); `timed_out` runs when a wait runs out, before the liveness probe
// (the flight recorder dumps its ring), and `failed` after the probe, with the error about to be
// thrown (rank 0 prints the diagnosis). They may run on the NCCL watchdog's thread too.
struct WaitHooks {
  std::function<void()> poll;
  std::function<void(const std::string& what)> timed_out;
  std::function<void(const std::string& message)> failed;
};

// Before MPI_Init: the defaults tripod changes for MPI's collectives. Each Open MPI parameter is
// set only where the environment (OMPI_MCA_...) does not name it already.
//  - Non-blocking all-reduce (libnbc; every all-reduce here is one, so that its wait has a
//    timeout) reduces to one root and broadcasts back below 4 ranks and for every in-place call,
//    at any size: twice the bytes of a reduce-scatter and all-gather, whose schedule
//    (Rabenseifner's) it is told to use, within microseconds of it on small messages.
//  - libnbc allocates a message-sized scratch buffer per all-reduce. The buckets of one gradient
//    reduction in flight together, freed together, are more than glibc trims back to the system by
//    default, so every step would fault a bucket's pages in anew: glibc keeps up to 1 GiB of free
//    heap, and serves blocks up to 32 MiB (its most) from it.
void set_mpi_defaults();

// Seconds the calling thread has spent in MpiComm waits (every communicator's): on a CPU run, the
// time its collectives and messages take, waiting for the peers included.
double mpi_wait_seconds();

class MpiComm final : public Communicator {
 public:
  // Takes ownership of `comm`. `ops` stages device tensors (may be null when all are host).
  // `world_ranks` are the world ranks of this communicator's members (for error messages).
  // `probe`, a duplicate of the world shared by the communicators split from it, asks every
  // world rank for a sign of life after a timed-out wait (null: no probe, a plainer message).
  MpiComm(MPI_Comm comm, std::string name, Ops* ops, double timeout_s, std::vector<int> world_ranks,
          std::shared_ptr<const MPI_Comm> probe = nullptr);
  ~MpiComm() override;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const std::string& name() const override { return name_; }

  void all_reduce(Tensor& t, ReduceOp op = ReduceOp::Sum) override;
  void reduce_scatter(const Tensor& in, Tensor& out) override;
  void all_gather(const Tensor& in, Tensor& out) override;
  void broadcast(Tensor& t, int root) override;
  void barrier() override;
  void all_to_all_v(const Tensor& in, std::span<const int64_t> send_counts, Tensor& out,
                    std::span<const int64_t> recv_counts) override;

  std::unique_ptr<CommRequest> iall_reduce(Tensor& t) override;
  std::unique_ptr<CommRequest> ireduce_scatter(const Tensor& in, Tensor& out) override;
  std::unique_ptr<CommRequest> iall_gather(const Tensor& in, Tensor& out) override;
  std::unique_ptr<CommRequest> isend(const Tensor& t, int peer, int tag) override;
  std::unique_ptr<CommRequest> irecv(Tensor& t, int peer, int tag) override;

  MPI_Comm handle() const { return comm_; }
  Ops* ops() const { return ops_; }
  double timeout_s() const { return timeout_s_; }
  const std::shared_ptr<const MPI_Comm>& probe() const { return probe_; }
  const std::shared_ptr<const WaitHooks>& hooks() const { return hooks_; }
  void set_hooks(std::shared_ptr<const WaitHooks> hooks) { hooks_ = std::move(hooks); }
  // Waits for `req`, failing after the timeout with a message naming `what` and the peers.
  void wait(MPI_Request& req, const char* what) const;

 private:
  std::unique_ptr<CommRequest> start_all_reduce(Tensor& t, ReduceOp op);
  MPI_Comm comm_;
  std::string name_;
  Ops* ops_;
  double timeout_s_;
  std::vector<int> world_ranks_;
  std::shared_ptr<const MPI_Comm> probe_;
  std::shared_ptr<const WaitHooks> hooks_;
  int rank_ = 0, size_ = 1;
};

// A world communicator; tests and tools build sub-communicators with split().
std::unique_ptr<MpiComm> mpi_world(Ops* ops, double timeout_s);
// Members of `ranks` (world ranks, in order) get a communicator over them; others get null.
std::unique_ptr<MpiComm> mpi_subgroup(const MpiComm& world, const std::vector<int>& ranks, std::string name);

}  // namespace tripod
