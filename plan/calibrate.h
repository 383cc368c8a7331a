// `tripod calibrate`'s measurements: GEMM, attention and elementwise rates of this rank's
// backend (OpenBLAS/OpenMP on CPUs; cuBLASLt, cuDNN and CUDA kernels on GPUs), and collectives
// and point-to-point transfers over the world communicator (MPI, or NCCL with one rank per GPU),
// written into a Hardware whose tables the cost model then interpolates.
#pragma once

#include <vector>

#include "kernels/op.h"
#include "model/config.h"
#include "parallel/comm/communicator.h"
#include "plan/hardware.h"

namespace tripod {

struct CalibrateGrid {
  std::vector<int64_t> gemm_m, gemm_nk;     // GEMM (M, N, K): every M with every N and K
  std::vector<GemmPoint> gemm_shapes;       // and these (M, N, K)
  std::vector<int64_t> attention_t, attention_d;
  std::vector<int64_t> message_bytes;       // collectives and point-to-point
  int repeats = 5;                          // timings per point; the median is kept
  double min_time_s = 0.05;                 // each timing loops the operation at least this long
};
// The default grid for the device: shapes of GPT layers that run in seconds on it.
CalibrateGrid default_grid(Device device);
// Exactly the shapes of one model: its layers' and head's GEMMs and its attention for every tp
// (dividing the heads, at most `max_tp`) and micro-batch size, and its activation messages
// added to the default message sizes.
CalibrateGrid model_grid(Device device, const ModelConfig& model, int max_tp, const std::vector<int>& micro_batches);

// Measures into `hw` (which keeps its other fields: capacity, the inter-node link, ...). Every
// rank measures at once, as in training (they share the machine); rank 0's medians are kept.
// `world` may be null (one rank: no collectives).
void calibrate(Ops& ops, Communicator* world, const CalibrateGrid& grid, Hardware& hw);

}  // namespace tripod
