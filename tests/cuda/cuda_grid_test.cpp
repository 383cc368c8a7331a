// A (tp=2, dp=2) grid of 4 ranks on the CUDA backend gives the serial run's loss and gradient
// norm: on one GPU (the ranks share it, so MPI stages the device tensors through pinned host
// memory) or on four (NCCL). Run under mpirun -np 4; skipped without a GPU.
#include <gtest/gtest.h>
#include <mpi.h>

#include "data/sample_source.h"
#include "model/gpt.h"
#include "parallel/comm/mpi_comm.h"
#include "tests/cuda/cuda_test_util.h"

namespace tripod {
namespace {

using namespace test;

constexpr uint64_t kSeed = 77;

ModelConfig config() {
  ModelConfig c;
  c.n_layers = 2;
  c.n_heads = 4;
  c.d_model = 64;
  c.seq_len = 32;
  c.vocab_size = 250;
  return c;
}

// Loss (summed over tokens) and the sum of squared gradients of one forward and backward over
// `samples` sequences starting at `first`, each token's loss weighted by `grad_scale`.
struct Pass {
  double loss_sum = 0, grad_sq = 0;
};

Pass run_pass(Ops& ops, const ParallelContext& par, int64_t first, int64_t samples, float grad_scale) {
  const ModelConfig cfg = config();
  ParamRegistry reg;
  GptModel model(ops, par, cfg, rank_chunks(layers_per_stage(cfg.n_layers, 1, 1, {}), 1, 1, 0), RecomputeConfig{},
                 reg);
  reg.allocate(ops);
  reg.initialize(ops, kSeed);
  const int64_t T = cfg.seq_len, N = samples * T;
  SyntheticSource data(T, cfg.vocab_size, kSeed);
  CpuAllocator host;
  Tensor tok = Tensor::empty(host, {N}, DType::I32, MemCategory::Workspace);
  Tensor tgt = Tensor::empty(host, {N}, DType::I32, MemCategory::Workspace);
  std::vector<int32_t> sample(T + 1);
  for (int64_t b = 0; b < samples; ++b) {
    data.get(first + b, sample);
    std::copy(sample.begin(), sample.end() - 1, tok.data<int32_t>() + b * T);
    std::copy(sample.begin() + 1, sample.end(), tgt.data<int32_t>() + b * T);
  }
  MicroBatch mb;
  mb.shape = {samples, T};
  mb.grad_scale = grad_scale;
  mb.tokens = ops.empty({N}, DType::I32, MemCategory::Activations);
  mb.targets = ops.empty({N}, DType::I32, MemCategory::Activations);
  ops.copy(tok, mb.tokens);
  ops.copy(tgt, mb.targets);
  mb.losses = ops.empty({N}, DType::F32, MemCategory::Workspace);
  ChunkActs acts;
  model.forward(0, mb, Tensor{}, acts);
  model.backward(0, mb, Tensor{}, acts);
  Pass p;
  p.loss_sum = ops.sum(mb.losses);
  if (par.dp && par.dp->size() > 1) par.dp->all_reduce(reg.flat_grads());
  std::vector<FlatRange> counted;
  for (const Param& prm : reg.params())
    if (prm.spec.counts_in_norm(par.coords.tp)) counted.push_back({prm.offset, prm.offset + prm.numel(), false});
  p.grad_sq = ops.sum_squares(reg.flat_grads(), counted);
  return p;
}

TEST(CudaGrid, TensorAndDataParallelMatchSerial) {
  TRIPOD_REQUIRE_GPU();
  int rank = 0, size = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  ASSERT_EQ(size, 4);
  auto ops = make_ops(Device::CUDA, rank % cuda_device_count());
  const int64_t B = 2, T = config().seq_len;
  const float scale = 1.0f / static_cast<float>(2 * B * T);  // the global batch: 2 DP ranks of B sequences

  Pass serial;
  {
    ParallelContext alone;  // (1, 1, 1), no communicators
    serial = run_pass(*ops, alone, 0, 2 * B, scale);
  }

  auto world = mpi_world(ops.get(), 120);
  ParallelContext par = make_parallel_context(*world, RankGrid(2, 2, 1), {});
  Pass mine = run_pass(*ops, par, par.coords.dp * B, B, scale);
  // The loss once per DP replica (TP rank 0), the gradient once per shard (DP rank 0, after the
  // DP all-reduce made the replicas equal).
  double local[2] = {par.coords.tp == 0 ? mine.loss_sum : 0.0, par.coords.dp == 0 ? mine.grad_sq : 0.0};
  double total[2] = {0, 0};
  MPI_Allreduce(local, total, 2, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
  EXPECT_NEAR(total[0], serial.loss_sum, 1e-2 * serial.loss_sum);
  EXPECT_NEAR(std::sqrt(total[1]), std::sqrt(serial.grad_sq), 2e-2 * std::sqrt(serial.grad_sq));
}

}  // namespace
}  // namespace tripod
