// NCCL communicator: transfers on the communicator's own stream joined to the compute stream with
// events, grouped sends/receives, host tensors through MPI, a watchdog for timeouts and errors.
#include "parallel/comm/nccl_comm.h"
#include "parallel/comm/mpi_deadline.h"

#include <mpi.h>
#include <spdlog/spdlog.h>

#include <cuda_runtime_api.h>
#include <fmt/ranges.h>
#include <nccl.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>

#include "core/error.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/cuda_ops.h"
#include "parallel/comm/device_comm.h"

#define TRIPOD_NCCL_CHECK(call, ...)                                                                      \
  do {                                                                                                    \
    ncclResult_t tripod_nr_ = (call);                                                                     \
    if (tripod_nr_ != ncclSuccess) [[unlikely]]                                                           \
      TRIPOD_FAIL("{}: {} failed: {}", fmt::format(__VA_ARGS__), #call, ncclGetErrorString(tripod_nr_)); \
  } while (0)

namespace tripod {

using Clock = std::chrono::steady_clock;

struct NcclComm::Done {
  cudaEvent_t event = nullptr;  // recorded on the communicator's stream after the transfer; null until launched
  std::string what;             // e.g. "all_reduce of bf16(8192, 768) cuda"
  Clock::time_point launched;
  ~Done() {
    if (event) cudaEventDestroy(event);
  }
};

// A non-blocking transfer: wait() launches it if it is a queued send/receive and makes the
// compute stream wait for it; the host does not block.
class NcclRequest final : public CommRequest {
 public:
  NcclRequest(NcclComm* comm, std::shared_ptr<NcclComm::Done> done) : comm_(comm), done_(std::move(done)) {}
  ~NcclRequest() override {
    if (waited_) return;
    try {  // abandoned (e.g. an exception unwound past it): still launched and joined
      wait();
    } catch (...) {
    }
  }
  void wait() override {
    if (waited_) return;
    waited_ = true;
    if (!done_) return;  // nothing to do (a communicator of one rank)
    if (!done_->event) comm_->flush();
    comm_->join(*done_);
  }
  // Launches a queued send/receive now (with everything queued beside it), after the compute
  // stream's work so far: the transfer then runs while the work queued next computes.
  void progress() override {
    if (!waited_ && done_ && !done_->event) comm_->flush();
  }

 private:
  NcclComm* comm_;
  std::shared_ptr<NcclComm::Done> done_;
  bool waited_ = false;
};

namespace {

ncclDataType_t nccl_type(DType t) {
  switch (t) {
    case DType::F32: return ncclFloat32;
    case DType::BF16: return ncclBfloat16;
    case DType::I32: return ncclInt32;
    case DType::F64: return ncclFloat64;
    case DType::F8E4M3:
    case DType::F8E5M2: return ncclUint8;  // (never reduced: FP8 casts stay on their rank)
  }
  return ncclFloat32;
}

bool on_host(const Tensor& t) { return t.device() == Device::CPU; }

}  // namespace

NcclComm::NcclComm(std::unique_ptr<MpiComm> twin, cuda::CudaOps& ops, std::vector<int> world_ranks)
    : twin_(std::move(twin)), ops_(ops), world_ranks_(std::move(world_ranks)) {
  if (twin_->size() == 1) return;
  TRIPOD_CUDA_CHECK(cudaSetDevice(ops_.device_index()), "'{}' communicator", name());
  int least = 0, greatest = 0;
  TRIPOD_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest), "'{}' communicator", name());
  TRIPOD_CUDA_CHECK(cudaStreamCreateWithPriority(&stream_, cudaStreamNonBlocking, greatest),
                    "stream of the '{}' communicator", name());
  TRIPOD_CUDA_CHECK(cudaEventCreateWithFlags(&ready_, cudaEventDisableTiming), "'{}' communicator", name());
  ncclUniqueId id{};
  if (twin_->rank() == 0) TRIPOD_NCCL_CHECK(ncclGetUniqueId(&id), "'{}' communicator", name());
  ncclComm_t comm = nullptr;
  {
    // Both wait for every member, with no timeout of their own.
    MpiDeadline deadline("creating the NCCL '" + name() + "' communicator", MpiDeadline::limit_for(twin_->timeout_s()));
    MPI_Bcast(&id, sizeof(id), MPI_BYTE, 0, twin_->handle());
    TRIPOD_NCCL_CHECK(ncclCommInitRank(&comm, twin_->size(), id, twin_->rank()),
                      "creating the NCCL '{}' communicator (world ranks {})", name(), fmt::join(world_ranks_, ","));
  }
  comm_ = comm;
  watchdog_ = std::thread([this] { watchdog_loop(); });
}

NcclComm::~NcclComm() {
  const bool unwinding = std::uncaught_exceptions() > 0;
  if (!unwinding && comm_) {
    try {
      flush();
    } catch (...) {
    }
    if (stream_) cudaStreamSynchronize(stream_);  // the transfers in flight end (or the watchdog ends the process)
  }
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (watchdog_.joinable()) watchdog_.join();
  if (comm_) {
    // Unwinding from an error, peers may be gone: abort rather than wait for them.
    if (unwinding)
      ncclCommAbort(comm_);
    else
      ncclCommDestroy(comm_);
  }
  if (ready_) cudaEventDestroy(ready_);
  if (stream_) cudaStreamDestroy(stream_);
  cudaGetLastError();
}

void NcclComm::after_compute(const char* what) {
  cudaError_t err = cudaEventRecord(ready_, ops_.compute_stream());
  if (err == cudaSuccess) err = cudaStreamWaitEvent(stream_, ready_, 0);
  TRIPOD_CUDA_CHECK(err, "{}", describe(what));
}

std::string NcclComm::describe(const char* what) const {
  return fmt::format("{} on the '{}' communicator (world ranks {})", what, name(), fmt::join(world_ranks_, ","));
}

template <class F> std::shared_ptr<NcclComm::Done> NcclComm::enqueue(const char* what, F&& launch) {
  auto done = std::make_shared<Done>();
  done->what = what;
  // The transfer starts after everything queued so far on the compute stream.
  after_compute(what);
  launch(stream_);
  TRIPOD_CUDA_CHECK(cudaEventCreateWithFlags(&done->event, cudaEventDisableTiming), "{}", describe(what));
  TRIPOD_CUDA_CHECK(cudaEventRecord(done->event, stream_), "{}", describe(what));
  done->launched = Clock::now();
  watch(done);
  return done;
}

void NcclComm::join(const Done& done) {
  TRIPOD_CUDA_CHECK(cudaStreamWaitEvent(ops_.compute_stream(), done.event, 0), "{}", describe(done.what.c_str()));
}

void NcclComm::watch(const std::shared_ptr<Done>& done) {
  std::lock_guard lock(mu_);
  in_flight_.push_back(done);
  cv_.notify_one();
}

void NcclComm::die(const std::string& message) {
  // The flight recorder writes its ring first (and rank 0 its diagnosis), as on an MPI timeout.
  if (const auto& hooks = twin_->hooks()) {
    if (hooks->timed_out) hooks->timed_out(fmt::format("an operation on the '{}' communicator", name()));
    if (hooks->failed) hooks->failed(message);
  }
  if (comm_) ncclCommAbort(comm_);
  std::fprintf(stderr, "error: %s\n", message.c_str());
  std::fflush(stderr);
  std::_Exit(1);  // the launcher ends the other ranks
}

void NcclComm::watchdog_loop() {
  cudaSetDevice(ops_.device_index());
  const auto timeout = std::chrono::duration<double>(twin_->timeout_s());
  std::unique_lock lock(mu_);
  while (!stop_) {
    cv_.wait_for(lock, std::chrono::milliseconds(100));
    while (!in_flight_.empty()) {
      std::shared_ptr<Done> d = in_flight_.front();
      cudaError_t q = cudaEventQuery(d->event);
      if (q == cudaSuccess) {
        in_flight_.pop_front();
        continue;
      }
      if (q != cudaErrorNotReady) {
        lock.unlock();
        die(fmt::format("{} failed on the GPU: {} ({})", describe(d->what.c_str()), cudaGetErrorName(q),
                        cudaGetErrorString(q)));
      }
      if (Clock::now() - d->launched > timeout) {
        lock.unlock();
        die(fmt::format("{} did not complete within {:.0f} s: a peer rank has died or stopped responding "
                        "(parallel.timeout_s sets this limit)",
                        describe(d->what.c_str()), twin_->timeout_s()));
      }
      break;  // later transfers cannot have finished before this one
    }
    ncclResult_t async = ncclSuccess;
    if (ncclCommGetAsyncError(comm_, &async) == ncclSuccess && async != ncclSuccess && async != ncclInProgress) {
      lock.unlock();
      die(fmt::format("NCCL reported an error on the '{}' communicator (world ranks {}): {} ({})", name(),
                      fmt::join(world_ranks_, ","), ncclGetErrorString(async), ncclGetLastError(comm_)));
    }
  }
}

void NcclComm::flush() {
  if (pending_.empty()) return;
  std::vector<PendingP2P> batch;
  batch.swap(pending_);
  const cudaStream_t comm = stream_;
  const std::string group = fmt::format("a group of {} sends/receives", batch.size());
  after_compute(group.c_str());
  const std::string what = describe(group.c_str());
  TRIPOD_NCCL_CHECK(ncclGroupStart(), "{}", what);
  for (const PendingP2P& p : batch) {
    const auto type = static_cast<ncclDataType_t>(p.dtype);
    if (p.send)
      TRIPOD_NCCL_CHECK(ncclSend(p.ptr, p.count, type, p.peer, comm_, comm), "{}", describe(p.done->what.c_str()));
    else
      TRIPOD_NCCL_CHECK(ncclRecv(p.ptr, p.count, type, p.peer, comm_, comm), "{}", describe(p.done->what.c_str()));
  }
  TRIPOD_NCCL_CHECK(ncclGroupEnd(), "{}", what);
  // Every queued request completes with the group.
  for (const PendingP2P& p : batch) {
    TRIPOD_CUDA_CHECK(cudaEventCreateWithFlags(&p.done->event, cudaEventDisableTiming), "{}", what);
    TRIPOD_CUDA_CHECK(cudaEventRecord(p.done->event, comm), "{}", what);
    p.done->launched = Clock::now();
    watch(p.done);
  }
}

// ---- collectives --------------------------------------------------------------------------------

void NcclComm::all_reduce(Tensor& t, ReduceOp op) {
  if (on_host(t)) {
    flush();
    twin_->all_reduce(t, op);
    return;
  }
  if (size() == 1) return;
  flush();
  const ncclRedOp_t nop = op == ReduceOp::Sum ? ncclSum : ncclMax;
  const std::string what = fmt::format("all_reduce of {}", t.str());
  join(*enqueue(what.c_str(), [&](cudaStream_t s) {
    TRIPOD_NCCL_CHECK(ncclAllReduce(t.raw(), t.raw(), t.numel(), nccl_type(t.dtype()), nop, comm_, s), "{}",
                      describe(what.c_str()));
  }));
  bytes_sent_ += 2 * (size() - 1) * static_cast<int64_t>(t.nbytes()) / size();
}

std::unique_ptr<CommRequest> NcclComm::iall_reduce(Tensor& t) {
  if (on_host(t)) {
    flush();
    return twin_->iall_reduce(t);
  }
  if (size() == 1) return std::make_unique<NcclRequest>(this, nullptr);
  flush();
  const std::string what = fmt::format("all_reduce of {}", t.str());
  auto done = enqueue(what.c_str(), [&](cudaStream_t s) {
    TRIPOD_NCCL_CHECK(ncclAllReduce(t.raw(), t.raw(), t.numel(), nccl_type(t.dtype()), ncclSum, comm_, s), "{}",
                      describe(what.c_str()));
  });
  bytes_sent_ += 2 * (size() - 1) * static_cast<int64_t>(t.nbytes()) / size();
  return std::make_unique<NcclRequest>(this, std::move(done));
}

std::unique_ptr<CommRequest> NcclComm::ireduce_scatter(const Tensor& in, Tensor& out) {
  TRIPOD_CHECK(in.numel() == out.numel() * size() && in.dtype() == out.dtype() && on_host(in) == on_host(out),
               "reduce_scatter {} -> {} over {} ranks of '{}'", in.str(), out.str(), size(), name());
  if (on_host(in)) {
    flush();
    return twin_->ireduce_scatter(in, out);
  }
  if (size() == 1) {
    ops_.copy(in, out);
    return std::make_unique<NcclRequest>(this, nullptr);
  }
  flush();
  const std::string what = fmt::format("reduce_scatter of {}", in.str());
  auto done = enqueue(what.c_str(), [&](cudaStream_t s) {
    TRIPOD_NCCL_CHECK(
        ncclReduceScatter(in.raw(), out.raw(), out.numel(), nccl_type(in.dtype()), ncclSum, comm_, s), "{}",
        describe(what.c_str()));
  });
  bytes_sent_ += static_cast<int64_t>(out.nbytes()) * (size() - 1);
  return std::make_unique<NcclRequest>(this, std::move(done));
}

void NcclComm::reduce_scatter(const Tensor& in, Tensor& out) { ireduce_scatter(in, out)->wait(); }

std::unique_ptr<CommRequest> NcclComm::iall_gather(const Tensor& in, Tensor& out) {
  TRIPOD_CHECK(out.numel() == in.numel() * size() && in.dtype() == out.dtype() && on_host(in) == on_host(out),
               "all_gather {} -> {} over {} ranks of '{}'", in.str(), out.str(), size(), name());
  if (on_host(in)) {
    flush();
    return twin_->iall_gather(in, out);
  }
  if (size() == 1) {
    ops_.copy(in, out);
    return std::make_unique<NcclRequest>(this, nullptr);
  }
  flush();
  const std::string what = fmt::format("all_gather of {}", in.str());
  auto done = enqueue(what.c_str(), [&](cudaStream_t s) {
    TRIPOD_NCCL_CHECK(ncclAllGather(in.raw(), out.raw(), in.numel(), nccl_type(in.dtype()), comm_, s), "{}",
                      describe(what.c_str()));
  });
  bytes_sent_ += static_cast<int64_t>(in.nbytes()) * (size() - 1);
  return std::make_unique<NcclRequest>(this, std::move(done));
}

void NcclComm::all_gather(const Tensor& in, Tensor& out) { iall_gather(in, out)->wait(); }

void NcclComm::broadcast(Tensor& t, int root) {
  TRIPOD_CHECK(0 <= root && root < size(), "broadcast from rank {} of the {} ranks of '{}'", root, size(), name());
  if (on_host(t)) {
    flush();
    twin_->broadcast(t, root);
    return;
  }
  if (size() == 1) return;
  flush();
  const std::string what = fmt::format("broadcast of {} from rank {}", t.str(), root);
  join(*enqueue(what.c_str(), [&](cudaStream_t s) {
    TRIPOD_NCCL_CHECK(ncclBroadcast(t.raw(), t.raw(), t.numel(), nccl_type(t.dtype()), root, comm_, s), "{}",
                      describe(what.c_str()));
  }));
  if (rank() == root) bytes_sent_ += static_cast<int64_t>(t.nbytes());
}

void NcclComm::all_to_all_v(const Tensor& in, std::span<const int64_t> send_counts, Tensor& out,
                            std::span<const int64_t> recv_counts) {
  check_all_to_all_v(*this, in, send_counts, out, recv_counts);
  TRIPOD_CHECK(on_host(in) == on_host(out), "all_to_all_v {} -> {} on '{}'", in.str(), out.str(), name());
  if (on_host(in)) {
    flush();
    twin_->all_to_all_v(in, send_counts, out, recv_counts);
    return;
  }
  const int n = size(), me = rank();
  const size_t elem = dtype_size(in.dtype());
  std::vector<int64_t> sd(n + 1, 0), rd(n + 1, 0);
  for (int q = 0; q < n; ++q) {
    sd[q + 1] = sd[q] + send_counts[q];
    rd[q + 1] = rd[q] + recv_counts[q];
  }
  TRIPOD_CHECK(send_counts[me] == recv_counts[me], "all_to_all_v on '{}': rank {} sends itself {} elements but "
               "receives {}", name(), me, send_counts[me], recv_counts[me]);
  const auto* src = static_cast<const char*>(in.raw());
  auto* dst = static_cast<char*>(out.raw());
  if (n == 1) {
    if (send_counts[0] > 0)
      TRIPOD_CUDA_CHECK(cudaMemcpyAsync(dst, src, send_counts[0] * elem, cudaMemcpyDeviceToDevice, ops_.compute_stream()),
                        "all_to_all_v on '{}'", name());
    return;
  }
  flush();
  const std::string what = fmt::format("all_to_all_v of {} -> {}", in.str(), out.str());
  const ncclDataType_t type = nccl_type(in.dtype());
  join(*enqueue(what.c_str(), [&](cudaStream_t s) {
    if (send_counts[me] > 0)
      TRIPOD_CUDA_CHECK(cudaMemcpyAsync(dst + rd[me] * elem, src + sd[me] * elem, send_counts[me] * elem,
                                        cudaMemcpyDeviceToDevice, s),
                        "{}", describe(what.c_str()));
    TRIPOD_NCCL_CHECK(ncclGroupStart(), "{}", describe(what.c_str()));
    for (int q = 0; q < n; ++q) {
      if (q == me) continue;
      if (send_counts[q] > 0)
        TRIPOD_NCCL_CHECK(ncclSend(src + sd[q] * elem, send_counts[q], type, q, comm_, s), "{}", describe(what.c_str()));
      if (recv_counts[q] > 0)
        TRIPOD_NCCL_CHECK(ncclRecv(dst + rd[q] * elem, recv_counts[q], type, q, comm_, s), "{}", describe(what.c_str()));
    }
    TRIPOD_NCCL_CHECK(ncclGroupEnd(), "{}", describe(what.c_str()));
  }));
  bytes_sent_ += (sd[n] - send_counts[me]) * static_cast<int64_t>(elem);
}

void NcclComm::barrier() {
  flush();
  twin_->barrier();
}

// ---- point to point: queued, launched as a group by flush() -------------------------------------
// NCCL matches the sends and receives between two ranks in posting order; tags are not used.

std::unique_ptr<CommRequest> NcclComm::isend(const Tensor& t, int peer, int tag) {
  TRIPOD_CHECK(0 <= peer && peer < size() && peer != rank(), "send to rank {} of the {} ranks of '{}' from rank {}",
               peer, size(), name(), rank());
  if (on_host(t)) return twin_->isend(t, peer, tag);
  auto done = std::make_shared<Done>();
  done->what = fmt::format("send of {} to rank {}", t.str(), peer);
  pending_.push_back({true, const_cast<void*>(t.raw()), static_cast<size_t>(t.numel()),
                      static_cast<int>(nccl_type(t.dtype())), peer, done});
  bytes_sent_ += static_cast<int64_t>(t.nbytes());
  return std::make_unique<NcclRequest>(this, std::move(done));
}

std::unique_ptr<CommRequest> NcclComm::irecv(Tensor& t, int peer, int tag) {
  TRIPOD_CHECK(0 <= peer && peer < size() && peer != rank(),
               "receive from rank {} of the {} ranks of '{}' on rank {}", peer, size(), name(), rank());
  if (on_host(t)) return twin_->irecv(t, peer, tag);
  auto done = std::make_shared<Done>();
  done->what = fmt::format("receive of {} from rank {}", t.str(), peer);
  pending_.push_back({false, t.raw(), static_cast<size_t>(t.numel()), static_cast<int>(nccl_type(t.dtype())), peer,
                      done});
  return std::make_unique<NcclRequest>(this, std::move(done));
}

// NCCL when every rank has a GPU of its own; MPI (staged through pinned host memory) when ranks
// share GPUs, which NCCL refuses, or when asked to.
DeviceCommFactory device_comm_factory(const MpiComm& world, bool force_mpi) {
  auto* ops = dynamic_cast<cuda::CudaOps*>(world.ops());
  int ok = ops != nullptr && !force_mpi;
  int node_ranks = 1;
  MpiDeadline deadline("choosing the device communicators (MPI_Comm_split_type, MPI_Allreduce)",
                       MpiDeadline::limit_for(world.timeout_s()));
  if (ok) {
    MPI_Comm node;
    MPI_Comm_split_type(world.handle(), MPI_COMM_TYPE_SHARED, world.rank(), MPI_INFO_NULL, &node);
    MPI_Comm_size(node, &node_ranks);
    MPI_Comm_free(&node);
    if (node_ranks > cuda_device_count()) ok = 0;
  }
  int all_ok = ok;
  MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_MIN, world.handle());
  if (ops && !all_ok && world.rank() == 0 && !force_mpi)
    spdlog::warn("{} ranks share the {} GPU(s) of a node: communication is staged through host memory with MPI, "
                 "which is slow (NCCL needs one GPU per rank); use this for correctness runs",
                 node_ranks, cuda_device_count());
  if (!all_ok) return {};
  return [ops](std::unique_ptr<MpiComm> mpi, const std::vector<int>& group) -> std::unique_ptr<Communicator> {
    return std::make_unique<NcclComm>(std::move(mpi), *ops, group);
  };
}

}  // namespace tripod
