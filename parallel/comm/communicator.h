// One interface for every collective and point-to-point transfer a rank makes. Ranks are the
// communicator's own (0..size-1). Tensors may be on the host or the device: MpiComm stages device
// memory through pinned host buffers, NcclComm works on device memory directly.
#pragma once

#include <chrono>
#include <memory>
#include <span>
#include <string>

#include "core/tensor.h"

namespace tripod {

enum class ReduceOp { Sum, Max };

// An operation in flight. wait() completes it (and copies staged results into place).
class CommRequest {
 public:
  virtual ~CommRequest() = default;
  virtual void wait() = 0;
  // Lets the operation advance without blocking, for transports that move data only inside their
  // own calls (MPI, on one thread per rank): call it now and then while computing, so that the
  // transfer overlaps the compute instead of happening at wait(). A no-op elsewhere.
  virtual void progress() {}
};

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // A short name for logs and traces ("tp", "dp", "pp", "embedding", "world").
  virtual const std::string& name() const = 0;

  // In place, f32 or bf16 (bf16 sums are done in f32 by MPI staging, natively by NCCL).
  virtual void all_reduce(Tensor& t, ReduceOp op = ReduceOp::Sum) = 0;
  // in (size * n) -> out (n): out = sum over ranks of in's block [rank*n, (rank+1)*n).
  virtual void reduce_scatter(const Tensor& in, Tensor& out) = 0;
  // in (n) -> out (size * n): block r of out is rank r's in.
  virtual void all_gather(const Tensor& in, Tensor& out) = 0;
  virtual void broadcast(Tensor& t, int root) = 0;
  virtual void barrier() = 0;
  // in -> out, every rank to every rank in one exchange, blocks of any size: in holds
  // send_counts[r] elements for rank r, back to back in rank order; out receives recv_counts[r]
  // elements from rank r, likewise (out past them is unspecified afterwards). The counts are the
  // exchange's: rank r's send_counts[q] must equal rank q's recv_counts[r] (exchange them first).
  // Example, 2 ranks: rank 0 sends [a0 a1 | b0] with send_counts {2, 1}, rank 1 sends [c0 | d0 d1]
  // with {1, 2}; rank 0 receives [a0 a1 | c0] (recv_counts {2, 1}), rank 1 [b0 | d0 d1] ({1, 2}).
  virtual void all_to_all_v(const Tensor& in, std::span<const int64_t> send_counts, Tensor& out,
                            std::span<const int64_t> recv_counts) = 0;

  // Non-blocking variants: the tensors must stay alive and untouched until wait().
  virtual std::unique_ptr<CommRequest> iall_reduce(Tensor& t) = 0;
  virtual std::unique_ptr<CommRequest> ireduce_scatter(const Tensor& in, Tensor& out) = 0;
  virtual std::unique_ptr<CommRequest> iall_gather(const Tensor& in, Tensor& out) = 0;
  virtual std::unique_ptr<CommRequest> isend(const Tensor& t, int peer, int tag) = 0;
  virtual std::unique_ptr<CommRequest> irecv(Tensor& t, int peer, int tag) = 0;

  // Bytes this rank has sent through this communicator (for the traffic benchmark).
  int64_t bytes_sent() const { return bytes_sent_; }

 protected:
  int64_t bytes_sent_ = 0;
};

// Collective: every rank passes its error ("" when it succeeded). When any rank failed, every rank
// throws InputError: the lowest failing rank with its message, printed once by main (as shared
// when every rank failed, else with that rank in front, since the cause is its own: a file only it
// lacks, say), the others with InputError::reported_elsewhere() (main prints nothing for them).
void throw_if_any_failed(const std::string& error, Communicator& world);

// The checks every all_to_all_v makes: one count per rank, none negative, in and out of one dtype
// and large enough.
void check_all_to_all_v(const Communicator& c, const Tensor& in, std::span<const int64_t> send_counts,
                        const Tensor& out, std::span<const int64_t> recv_counts);

}  // namespace tripod
