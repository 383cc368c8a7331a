// Communicators on the CUDA backend under mpirun -np 2: NCCL when each rank has a GPU of its own,
// MPI staging device tensors through pinned host memory when both share one. Every collective and
// point-to-point transfer is checked against the values it must produce. Skipped without a GPU.
#include <gtest/gtest.h>
#include <mpi.h>

#include "parallel/comm/mpi_comm.h"
#include "parallel/comm/nccl_comm.h"
#include "parallel/context.h"
#include "tests/cuda/cuda_test_util.h"

namespace tripod {
namespace {

using namespace test;

class CudaCommTest : public ::testing::Test {
 protected:
  void SetUp() override {
    TRIPOD_REQUIRE_GPU();
    MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
    gpus_ = cuda_device_count();
    host_ = make_ops(Device::CPU);
    ops_ = make_ops(Device::CUDA, rank_ % gpus_);
    world_ = mpi_world(ops_.get(), 120);
    par_ = make_parallel_context(*world_, RankGrid(2, 1, 1), {});
    comm_ = par_.tp.get();
  }

  // A device tensor with x[i] = f(i) (small integers, exact in bf16).
  template <class F> Tensor make(int64_t n, DType dt, F f) {
    Tensor h = host_->empty({n}, DType::F32, MemCategory::Workspace);
    for (int64_t i = 0; i < n; ++i) h.data<float>()[i] = static_cast<float>(f(i));
    return upload(*ops_, h, dt);
  }
  Tensor down(const Tensor& d) { return download(*ops_, *host_, d); }

  int rank_ = 0, gpus_ = 0;
  std::unique_ptr<Ops> host_, ops_;
  std::unique_ptr<MpiComm> world_;
  ParallelContext par_;
  Communicator* comm_ = nullptr;
};

TEST_F(CudaCommTest, UsesNcclOnlyWithAGpuPerRank) {
  const bool nccl = dynamic_cast<NcclComm*>(comm_) != nullptr;
  EXPECT_EQ(nccl, gpus_ >= 2) << "ranks on " << gpus_ << " GPU(s)";
  EXPECT_EQ(comm_->size(), 2);
  EXPECT_EQ(comm_->name(), "tp");
}

TEST_F(CudaCommTest, AllReduceSumAndMax) {
  for (DType dt : {DType::BF16, DType::F32}) {
    const int64_t n = 1001;
    Tensor t = make(n, dt, [&](int64_t i) { return (rank_ + 1) * (i % 17); });
    comm_->all_reduce(t);
    Tensor h = down(t);
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(h.data<float>()[i], 3.f * (i % 17)) << i;
    Tensor m = make(n, dt, [&](int64_t i) { return rank_ == 0 ? i % 5 : 4 - i % 5; });
    comm_->all_reduce(m, ReduceOp::Max);
    Tensor hm = down(m);
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hm.data<float>()[i], std::max(i % 5, 4 - i % 5)) << i;
  }
}

TEST_F(CudaCommTest, ReduceScatterAllGatherBroadcast) {
  const int64_t n = 300;
  Tensor in = make(2 * n, DType::F32, [&](int64_t i) { return rank_ * 1000 + i; });
  Tensor out = poisoned(*ops_, {n}, DType::F32);
  comm_->reduce_scatter(in, out);
  Tensor h = down(out);
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(h.data<float>()[i], 1000.f + 2.f * (rank_ * n + i)) << i;

  Tensor mine = make(n, DType::BF16, [&](int64_t i) { return rank_ * 7 + i % 11; });
  Tensor all = poisoned(*ops_, {2 * n}, DType::BF16);
  comm_->all_gather(mine, all);
  Tensor ha = down(all);
  for (int r = 0; r < 2; ++r)
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(ha.data<float>()[r * n + i], r * 7 + i % 11) << r << " " << i;

  Tensor b = make(n, DType::BF16, [&](int64_t i) { return rank_ == 1 ? i % 9 : -1; });
  comm_->broadcast(b, 1);
  Tensor hb = down(b);
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hb.data<float>()[i], i % 9) << i;
}

// Both ranks post a send and a receive (in either order) before waiting: no deadlock.
TEST_F(CudaCommTest, ExchangeWithNonBlockingSendReceive) {
  const int64_t n = 1 << 16;
  const int peer = 1 - rank_;
  for (bool send_first : {true, false}) {
    Tensor out = make(n, DType::BF16, [&](int64_t i) { return rank_ * 100 + i % 50; });
    Tensor in = poisoned(*ops_, {n}, DType::BF16);
    std::unique_ptr<CommRequest> s, r;
    if (send_first) {
      s = comm_->isend(out, peer, 3);
      r = comm_->irecv(in, peer, 3);
    } else {
      r = comm_->irecv(in, peer, 3);
      s = comm_->isend(out, peer, 3);
    }
    r->wait();
    s->wait();
    Tensor h = down(in);
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(h.data<float>()[i], peer * 100 + i % 50) << i;
  }
}

// A non-blocking all-reduce is ordered with the compute stream: ops after wait() see its result.
TEST_F(CudaCommTest, NonBlockingAllReduceOrdersWithCompute) {
  const int64_t n = 1 << 20;
  Tensor t = make(n, DType::F32, [&](int64_t i) { return (rank_ + 1) * (i % 3); });
  auto req = comm_->iall_reduce(t);
  req->wait();
  ops_->scale(t, 2.f);
  Tensor h = down(t);
  for (int64_t i = 0; i < n; i += 4099) ASSERT_EQ(h.data<float>()[i], 6.f * (i % 3)) << i;
}

// Host tensors go through MPI on either communicator.
TEST_F(CudaCommTest, HostTensorsGoThroughMpi) {
  Tensor h = host_->empty({4}, DType::F32, MemCategory::Workspace);
  for (int i = 0; i < 4; ++i) h.data<float>()[i] = static_cast<float>(rank_ + i);
  comm_->all_reduce(h);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(h.data<float>()[i], 1.f + 2.f * i);
}

}  // namespace
}  // namespace tripod
