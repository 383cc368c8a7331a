// MPI communicator: non-blocking MPI calls, waits with a timeout, device tensors staged on the host.
#include "parallel/comm/mpi_comm.h"

#include <fmt/ranges.h>
#include <sched.h>
#include <time.h>
#ifdef __GLIBC__
#include <malloc.h>
#endif

#include <algorithm>
#include <chrono>
#include <cstdlib>

#include "core/error.h"
#include "parallel/comm/mpi_deadline.h"

namespace tripod {

namespace {

MPI_Datatype mpi_type(DType t) {
  switch (t) {
    case DType::F32: return MPI_FLOAT;
    case DType::I32: return MPI_INT;
    case DType::F64: return MPI_DOUBLE;
    case DType::BF16:
    case DType::F8E4M3:
    case DType::F8E5M2: break;
  }
  TRIPOD_FAIL("MPI has no native type for {}", dtype_name(t));
}

// After a timed-out wait: the world ranks that do not answer within `window_s`. Every rank whose
// wait times out sends one byte to every other and waits for theirs; the ranks stuck on the same
// fault time out within one timeout of each other and answer, while a rank that is dead, stopped
// or stuck outside communication never does. The requests are abandoned: the caller is exiting.
std::vector<int> unresponsive_ranks(MPI_Comm probe, double window_s) {
  std::vector<int> silent;
  int me = 0, n = 1;
  MPI_Comm_rank(probe, &me);
  MPI_Comm_size(probe, &n);
  static const char token = 1;
  auto* in = new std::vector<char>(n);  // leaked with the requests
  std::vector<MPI_Request> recvs(n, MPI_REQUEST_NULL);
  for (int r = 0; r < n; ++r) {
    if (r == me) continue;
    MPI_Request send;
    MPI_Isend(&token, 1, MPI_CHAR, r, 0, probe, &send);
    MPI_Request_free(&send);
    MPI_Irecv(&(*in)[r], 1, MPI_CHAR, r, 0, probe, &recvs[r]);
  }
  auto start = std::chrono::steady_clock::now();
  std::vector<int> done(n, 0);
  done[me] = 1;
  while (std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() < window_s) {
    bool all = true;
    for (int r = 0; r < n; ++r) {
      if (!done[r]) MPI_Test(&recvs[r], &done[r], MPI_STATUS_IGNORE);
      all = all && done[r];
    }
    if (all) break;
    timespec ts{0, 10000000};
    nanosleep(&ts, nullptr);
  }
  for (int r = 0; r < n; ++r)
    if (!done[r]) silent.push_back(r);
  return silent;
}

// How long a wait spins (yielding) before it sleeps between tests.
constexpr double kYieldS = 0.005;

// mpi_wait_seconds: this thread's.
thread_local double waited_total_s = 0;

// Adds its lifetime to waited_total_s.
struct WaitClock {
  std::chrono::steady_clock::time_point t0 = std::chrono::steady_clock::now();
  ~WaitClock() { waited_total_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(); }
};

int mpi_count(int64_t n) {
  TRIPOD_CHECK(n <= INT32_MAX, "message of {} elements exceeds MPI's int count", n);
  return static_cast<int>(n);
}

// A tensor as MPI sees it: the tensor itself when it is host f32/i32, otherwise a host f32 copy
// (device memory, or bf16 whose sums MPI cannot do) that is copied back on completion.
struct Staged {
  Tensor host;      // what MPI reads and writes
  Tensor original;  // where results go back (undefined when no copy-back is needed)
};

bool needs_staging(const Tensor& t) { return t.device() != Device::CPU || t.dtype() == DType::BF16; }

Staged stage(Ops* ops, const Tensor& t, bool copy_in, bool copy_back) {
  if (!needs_staging(t)) return {t, Tensor{}};
  TRIPOD_CHECK(ops, "staging {} needs a backend", t.str());
  DType dt = t.dtype() == DType::BF16 ? DType::F32 : t.dtype();
  Tensor host = Tensor::empty(ops->host_allocator(), t.shape(), dt, MemCategory::Comm);
  if (copy_in) ops->copy(t, host);
  return {host, copy_back ? t : Tensor{}};
}

class MpiRequest final : public CommRequest {
 public:
  MpiRequest(const MpiComm* comm, std::string what, Ops* ops) : comm_(comm), what_(std::move(what)), ops_(ops) {}
  ~MpiRequest() override {
    if (done_ || req_ == MPI_REQUEST_NULL) return;
    // Abandoned: an exception (often a timeout on this very request) is unwinding and the process
    // is on its way out. Waiting could hang on a dead peer, and a non-blocking collective cannot
    // be cancelled, so the staging buffers are leaked on purpose: MPI may still write into them.
    int flag = 0;
    MPI_Test(&req_, &flag, MPI_STATUS_IGNORE);
    if (!flag) new std::vector<Staged>(std::move(staged_));
  }
  void progress() override {
    if (done_ || req_ == MPI_REQUEST_NULL) return;
    int flag = 0;
    MPI_Test(&req_, &flag, MPI_STATUS_IGNORE);  // completed: req_ becomes MPI_REQUEST_NULL; wait() copies back
  }
  void wait() override {
    if (done_) return;
    comm_->wait(req_, what_.c_str());
    done_ = true;
    for (auto& s : staged_)
      if (s.original.defined()) ops_->copy(s.host, s.original);
  }
  MPI_Request req_ = MPI_REQUEST_NULL;
  std::vector<Staged> staged_;

 private:
  const MpiComm* comm_;
  std::string what_;
  Ops* ops_;
  bool done_ = false;
};

}  // namespace

void set_mpi_defaults() {
  setenv("OMPI_MCA_coll_libnbc_iallreduce_algorithm", "3", /*overwrite=*/0);
#ifdef __GLIBC__
  mallopt(M_MMAP_THRESHOLD, 32 << 20);
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
#endif
}

MpiComm::MpiComm(MPI_Comm comm, std::string name, Ops* ops, double timeout_s, std::vector<int> world_ranks,
                 std::shared_ptr<const MPI_Comm> probe)
    : comm_(comm), name_(std::move(name)), ops_(ops), timeout_s_(timeout_s), world_ranks_(std::move(world_ranks)),
      probe_(std::move(probe)) {
  MPI_Comm_rank(comm_, &rank_);
  MPI_Comm_size(comm_, &size_);
}

MpiComm::~MpiComm() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized && comm_ != MPI_COMM_WORLD && comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
}

double mpi_wait_seconds() { return waited_total_s; }

void MpiComm::wait(MPI_Request& req, const char* what) const {
  WaitClock clock;
  int done = 0;
  MPI_Test(&req, &done, MPI_STATUS_IGNORE);
  if (done) return;
  // MPI progresses a collective's rounds only inside these tests. Spin, yielding the core to any
  // rank that shares it (ranks often outnumber cores on CPU runs) for the first few milliseconds,
  // then poll with sleeps: a sleep (50 us or more, as the kernel rounds it) between the rounds
  // of a message that takes microseconds would multiply its time.
  auto start = std::chrono::steady_clock::now();
  double waited = 0;
  for (int spins = 0;; ++spins) {
    MPI_Test(&req, &done, MPI_STATUS_IGNORE);
    if (done) return;
    if (spins > 200) {
      if (waited < kYieldS) {
        sched_yield();
      } else {
        timespec ts{0, waited > 1 ? 1000000 : 20000};
        nanosleep(&ts, nullptr);
      }
    }
    if ((spins & 63) == 0) {
      waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      if (hooks_ && hooks_->poll && spins > 200) hooks_->poll();
      if (waited > timeout_s_) {
        const std::string op = fmt::format("{} on the '{}' communicator (world ranks {})", what, name_,
                                           fmt::join(world_ranks_, ","));
        if (hooks_ && hooks_->timed_out) hooks_->timed_out(op);
        const double window = std::min(timeout_s_, 30.0);
        std::vector<int> silent = probe_ ? unresponsive_ranks(*probe_, window) : std::vector<int>{};
        std::string who = !probe_ ? "a peer rank has died or stopped responding"
                          : silent.empty() ? "every world rank answered a liveness probe, so a peer is slow or stuck"
                                           : fmt::format("world rank(s) {} did not answer a liveness probe within {:.0f} "
                                                       "s: dead or stopped",
                                                       fmt::join(silent, ","), window);
        const std::string message =
            fmt::format("{} did not complete within {:.0f} s; {} (parallel.timeout_s sets this limit)", op, timeout_s_,
                        who);
        if (hooks_ && hooks_->failed) hooks_->failed(message);
        TRIPOD_FAIL("{}", message);
      }
    }
  }
}

std::unique_ptr<CommRequest> MpiComm::start_all_reduce(Tensor& t, ReduceOp op) {
  auto r = std::make_unique<MpiRequest>(this, op == ReduceOp::Sum ? "all_reduce" : "all_reduce(max)", ops_);
  Staged s = stage(ops_, t, true, true);
  MPI_Iallreduce(MPI_IN_PLACE, s.host.raw(), mpi_count(s.host.numel()), mpi_type(s.host.dtype()),
                 op == ReduceOp::Sum ? MPI_SUM : MPI_MAX, comm_, &r->req_);
  r->staged_.push_back(std::move(s));
  bytes_sent_ += size_ > 1 ? 2 * (size_ - 1) * static_cast<int64_t>(t.nbytes()) / size_ : 0;
  return r;
}

void MpiComm::all_reduce(Tensor& t, ReduceOp op) {
  if (size_ == 1) return;
  start_all_reduce(t, op)->wait();
}

std::unique_ptr<CommRequest> MpiComm::iall_reduce(Tensor& t) { return start_all_reduce(t, ReduceOp::Sum); }

std::unique_ptr<CommRequest> MpiComm::ireduce_scatter(const Tensor& in, Tensor& out) {
  TRIPOD_CHECK(in.numel() == out.numel() * size_, "reduce_scatter {} -> {} over {} ranks", in.str(), out.str(),
               size_);
  auto r = std::make_unique<MpiRequest>(this, "reduce_scatter", ops_);
  Staged si = stage(ops_, in, true, false), so = stage(ops_, out, false, true);
  MPI_Ireduce_scatter_block(si.host.raw(), so.host.raw(), mpi_count(out.numel()), mpi_type(so.host.dtype()), MPI_SUM,
                            comm_, &r->req_);
  r->staged_.push_back(std::move(si));
  r->staged_.push_back(std::move(so));
  bytes_sent_ += static_cast<int64_t>(out.nbytes()) * (size_ - 1);
  return r;
}

void MpiComm::reduce_scatter(const Tensor& in, Tensor& out) { ireduce_scatter(in, out)->wait(); }

std::unique_ptr<CommRequest> MpiComm::iall_gather(const Tensor& in, Tensor& out) {
  TRIPOD_CHECK(out.numel() == in.numel() * size_, "all_gather {} -> {} over {} ranks", in.str(), out.str(), size_);
  auto r = std::make_unique<MpiRequest>(this, "all_gather", ops_);
  Staged si = stage(ops_, in, true, false), so = stage(ops_, out, false, true);
  MPI_Iallgather(si.host.raw(), mpi_count(in.numel()), mpi_type(si.host.dtype()), so.host.raw(),
                 mpi_count(in.numel()), mpi_type(so.host.dtype()), comm_, &r->req_);
  r->staged_.push_back(std::move(si));
  r->staged_.push_back(std::move(so));
  bytes_sent_ += static_cast<int64_t>(in.nbytes()) * (size_ - 1);
  return r;
}

void MpiComm::all_gather(const Tensor& in, Tensor& out) { iall_gather(in, out)->wait(); }

void MpiComm::broadcast(Tensor& t, int root) {
  if (size_ == 1) return;
  MpiRequest r(this, "broadcast", ops_);
  Staged s = stage(ops_, t, rank_ == root, rank_ != root);
  MPI_Ibcast(s.host.raw(), mpi_count(s.host.numel()), mpi_type(s.host.dtype()), root, comm_, &r.req_);
  r.staged_.push_back(std::move(s));
  if (rank_ == root) bytes_sent_ += static_cast<int64_t>(t.nbytes());
  r.wait();
}

void MpiComm::barrier() {
  MPI_Request req;
  MPI_Ibarrier(comm_, &req);
  wait(req, "barrier");
}

void MpiComm::all_to_all_v(const Tensor& in, std::span<const int64_t> send_counts, Tensor& out,
                          std::span<const int64_t> recv_counts) {
  check_all_to_all_v(*this, in, send_counts, out, recv_counts);
  std::vector<int> sc(size_), sd(size_), rc(size_), rd(size_);
  int64_t s_at = 0, r_at = 0;
  for (int q = 0; q < size_; ++q) {
    sc[q] = mpi_count(send_counts[q]);
    sd[q] = mpi_count(s_at);
    rc[q] = mpi_count(recv_counts[q]);
    rd[q] = mpi_count(r_at);
    s_at += send_counts[q];
    r_at += recv_counts[q];
  }
  MpiRequest r(this, "all_to_all_v", ops_);
  // Only the elements that travel are staged (device tensors; bf16 goes as f32).
  Staged si = stage(ops_, in.flat(0, s_at), true, false), so = stage(ops_, out.flat(0, r_at), false, true);
  MPI_Ialltoallv(si.host.raw(), sc.data(), sd.data(), mpi_type(si.host.dtype()), so.host.raw(), rc.data(), rd.data(),
                 mpi_type(so.host.dtype()), comm_, &r.req_);
  r.staged_.push_back(std::move(si));
  r.staged_.push_back(std::move(so));
  bytes_sent_ += (s_at - send_counts[rank_]) * static_cast<int64_t>(dtype_size(in.dtype()));
  r.wait();
}

std::unique_ptr<CommRequest> MpiComm::isend(const Tensor& t, int peer, int tag) {
  auto r = std::make_unique<MpiRequest>(this, fmt::format("send to world rank {}", world_ranks_[peer]), ops_);
  Staged s = stage(ops_, t, true, false);
  MPI_Isend(s.host.raw(), mpi_count(s.host.numel()), mpi_type(s.host.dtype()), peer, tag, comm_, &r->req_);
  r->staged_.push_back(std::move(s));
  bytes_sent_ += static_cast<int64_t>(t.nbytes());
  return r;
}

std::unique_ptr<CommRequest> MpiComm::irecv(Tensor& t, int peer, int tag) {
  auto r = std::make_unique<MpiRequest>(this, fmt::format("recv from world rank {}", world_ranks_[peer]), ops_);
  Staged s = stage(ops_, t, false, true);
  MPI_Irecv(s.host.raw(), mpi_count(s.host.numel()), mpi_type(s.host.dtype()), peer, tag, comm_, &r->req_);
  r->staged_.push_back(std::move(s));
  return r;
}

std::unique_ptr<MpiComm> mpi_world(Ops* ops, double timeout_s) {
  int size;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  std::vector<int> ranks(size);
  for (int i = 0; i < size; ++i) ranks[i] = i;
  MpiDeadline deadline("MPI_Comm_dup of the world", MpiDeadline::limit_for(timeout_s));
  MPI_Comm dup;
  MPI_Comm_dup(MPI_COMM_WORLD, &dup);
  // The probe: another duplicate, shared by every communicator split from this one.
  auto probe = std::shared_ptr<MPI_Comm>(new MPI_Comm(MPI_COMM_NULL), [](MPI_Comm* c) {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized && *c != MPI_COMM_NULL) MPI_Comm_free(c);
    delete c;
  });
  MPI_Comm_dup(MPI_COMM_WORLD, probe.get());
  MPI_Comm_set_errhandler(*probe, MPI_ERRORS_RETURN);  // a dead peer must not abort the probe
  return std::make_unique<MpiComm>(dup, "world", ops, timeout_s, std::move(ranks), std::move(probe));
}

std::unique_ptr<MpiComm> mpi_subgroup(const MpiComm& world, const std::vector<int>& ranks, std::string name) {
  // MPI_Comm_create_group is collective only over the members, so groups can be made one at a
  // time without every rank taking part.
  MPI_Group world_group, group;
  MPI_Comm_group(world.handle(), &world_group);
  MPI_Group_incl(world_group, static_cast<int>(ranks.size()), ranks.data(), &group);
  MPI_Comm comm;
  {
    MpiDeadline deadline("MPI_Comm_create_group of '" + name + "'", MpiDeadline::limit_for(world.timeout_s()));
    MPI_Comm_create_group(world.handle(), group, /*tag=*/0, &comm);
  }
  MPI_Group_free(&group);
  MPI_Group_free(&world_group);
  auto out = std::make_unique<MpiComm>(comm, std::move(name), world.ops(), world.timeout_s(), ranks, world.probe());
  out->set_hooks(world.hooks());
  return out;
}

}  // namespace tripod
