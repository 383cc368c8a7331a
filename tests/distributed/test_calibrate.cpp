// The calibration on several ranks (mpirun -np 2): each point keeps its slowest rank's time, so
// that every rank holds the same figures.
#include "kernels/op.h"
#include "parallel/comm/mpi_comm.h"
#include "plan/calibrate.h"
#include "test_util.h"

namespace tripod {
namespace {

TEST(CalibrateRanks, EveryPointKeepsTheSlowestRanksTime) {
  auto ops = make_ops(Device::CPU);
  auto world = mpi_world(ops.get(), 60.0);
  const int r = world->rank(), n = world->size();
  // Rank-dependent figures: the largest is rank n - 1's forward, rank 0's backward.
  Hardware hw;
  hw.gemm = {{64, 64, 64, 1.0 + r, 10.0 - r}};
  hw.attention = {{.t = 64, .d = 32, .forward_s = 2.0 + r, .backward_s = 20.0 - r, .pairs = 1}};
  hw.elementwise_points = {{Elementwise::Gelu, 1024, 3.0 + r, 30.0 - r}};
  hw.collectives = {{Collective::AllReduce, n, 4096, 4.0 + r}};
  keep_slowest(*world, hw);
  EXPECT_EQ(hw.gemm[0].forward_s, n);
  EXPECT_EQ(hw.gemm[0].backward_s, 10.0);
  EXPECT_EQ(hw.attention[0].forward_s, 1.0 + n);
  EXPECT_EQ(hw.attention[0].backward_s, 20.0);
  EXPECT_EQ(hw.elementwise_points[0].forward_s, 2.0 + n);
  EXPECT_EQ(hw.elementwise_points[0].backward_s, 30.0);
  EXPECT_EQ(hw.collectives[0].seconds, 3.0 + n);

  // A real calibration: every rank ends with the same figures (timings alone would differ).
  CalibrateGrid g;
  g.gemm = {{128, 64, 64}};
  g.attention = {{.t = 32, .d = 16, .batch = 1, .heads = 2}};
  g.elementwise = {{Elementwise::Add, 4096, 1, 0}};
  g.message_bytes = {4096};
  g.repeats = 1;
  g.min_time_s = 1e-3;
  Hardware all;
  calibrate(*ops, world.get(), g, all);
  std::vector<double> mine = {all.gemm[0].forward_s, all.gemm[0].backward_s, all.attention[0].forward_s,
                              all.attention[0].backward_s, all.elementwise_points[0].forward_s,
                              all.collectives[0].seconds};
  CpuAllocator host;
  Tensor lo = Tensor::empty(host, {static_cast<int64_t>(mine.size())}, DType::F64, MemCategory::Workspace);
  std::copy(mine.begin(), mine.end(), lo.data<double>());
  world->all_reduce(lo, ReduceOp::Max);
  for (size_t i = 0; i < mine.size(); ++i) EXPECT_EQ(lo.data<double>()[i], mine[i]) << i;  // the same on every rank
  EXPECT_GT(all.intra.bandwidth, 0);  // the links from the ping-pong
  EXPECT_GT(all.memory_bandwidth, 0);
}

}  // namespace
}  // namespace tripod
