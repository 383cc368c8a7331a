// Communicator over NCCL for device tensors when every rank has a GPU of its own; host tensors go
// through the MPI communicator of the same ranks (its "twin"), which also bootstraps NCCL by
// broadcasting the NCCL id.
//
// Ordering: every transfer runs on this communicator's own high-priority stream (communicators of
// different axes never queue behind each other, which could deadlock when two ranks post them in
// different orders), after the work already queued on the compute stream (an event joins them),
// and the compute stream waits for it in turn: at once for the blocking calls, at wait() for the
// non-blocking ones. Neither blocks the
// host. A watchdog thread checks every transfer in flight and ends the process with an error
// naming the communicator, the operation and the peers when one does not complete within the
// timeout (or NCCL reports an error), instead of hanging.
//
// Sends and receives are queued and launched together as one NCCL group at the next wait() or
// other call on this communicator, so exchanges posted as isend + irecv and then waited (either
// order, both ranks) cannot deadlock. A rank must wait() its sends before blocking on anything
// the peer's progress depends on.
#pragma once

#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "parallel/comm/communicator.h"
#include "parallel/comm/mpi_comm.h"

struct ncclComm;
struct CUstream_st;
struct CUevent_st;

namespace tripod {

namespace cuda {
class CudaOps;
}

class NcclComm final : public Communicator {
 public:
  // Collective over the members of `twin`. `world_ranks` names them in errors.
  NcclComm(std::unique_ptr<MpiComm> twin, cuda::CudaOps& ops, std::vector<int> world_ranks);
  ~NcclComm() override;
  NcclComm(const NcclComm&) = delete;
  NcclComm& operator=(const NcclComm&) = delete;

  int rank() const override { return twin_->rank(); }
  int size() const override { return twin_->size(); }
  const std::string& name() const override { return twin_->name(); }

  void all_reduce(Tensor& t, ReduceOp op = ReduceOp::Sum) override;
  void reduce_scatter(const Tensor& in, Tensor& out) override;
  void all_gather(const Tensor& in, Tensor& out) override;
  void broadcast(Tensor& t, int root) override;
  void barrier() override;
  // One NCCL group of a send and a receive per peer (zero counts skipped); this rank's own block
  // is a device copy on the communicator's stream.
  void all_to_all_v(const Tensor& in, std::span<const int64_t> send_counts, Tensor& out,
                    std::span<const int64_t> recv_counts) override;

  std::unique_ptr<CommRequest> iall_reduce(Tensor& t) override;
  std::unique_ptr<CommRequest> ireduce_scatter(const Tensor& in, Tensor& out) override;
  std::unique_ptr<CommRequest> iall_gather(const Tensor& in, Tensor& out) override;
  std::unique_ptr<CommRequest> isend(const Tensor& t, int peer, int tag) override;
  std::unique_ptr<CommRequest> irecv(Tensor& t, int peer, int tag) override;

  // Launches the queued sends and receives (one NCCL group).
  void flush();

  // A transfer's completion event (shared by a request and the watchdog).
  struct Done;

 private:
  struct PendingP2P {
    bool send;
    void* ptr;
    size_t count;
    int dtype;
    int peer;
    std::shared_ptr<Done> done;
  };
  friend class NcclRequest;

  // The stream waits for the work queued so far on the compute stream.
  void after_compute(const char* what);
  // Runs `launch` (the NCCL calls) on this communicator's stream after the compute stream's queued
  // work; returns the completion, which the watchdog tracks.
  template <class F> std::shared_ptr<Done> enqueue(const char* what, F&& launch);
  // The compute stream waits for `done`.
  void join(const Done& done);
  void watch(const std::shared_ptr<Done>& done);
  void watchdog_loop();
  [[noreturn]] void die(const std::string& message);
  std::string describe(const char* what) const;

  std::unique_ptr<MpiComm> twin_;
  cuda::CudaOps& ops_;
  std::vector<int> world_ranks_;
  ncclComm* comm_ = nullptr;  // null for a communicator of one rank (everything is local)
  CUstream_st* stream_ = nullptr;  // this communicator's transfers
  CUevent_st* ready_ = nullptr;    // recorded on the compute stream, waited for by stream_
  std::vector<PendingP2P> pending_;

  // Watchdog: transfers in flight, oldest first.
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<Done>> in_flight_;
  bool stop_ = false;
  std::thread watchdog_;
};

}  // namespace tripod
