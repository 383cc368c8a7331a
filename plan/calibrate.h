// `tripod calibrate`'s measurements: GEMM, attention and elementwise rates of this rank's
// backend (OpenBLAS/OpenMP on CPUs; cuBLASLt, cuDNN and CUDA kernels on GPUs), and collectives
// and point-to-point transfers over the world communicator (MPI, or NCCL with one rank per GPU),
// written into a Hardware whose tables the cost model then interpolates.
#pragma once

#include <vector>

#include "kernels/op.h"
#include "parallel/comm/communicator.h"
#include "plan/hardware.h"

namespace tripod {

struct CalibrateGrid {
  std::vector<int64_t> gemm_m, gemm_nk;     // GEMM (M, N, K): every M with every N and K
  std::vector<int64_t> attention_t, attention_d;
  std::vector<int64_t> message_bytes;       // collectives and point-to-point
  int repeats = 5;                          // timings per point; the median is kept
};
// The default grid for the device: shapes of GPT layers that run in seconds on it.
CalibrateGrid default_grid(Device device);

// Measures into `hw` (which keeps its other fields: capacity, the inter-node link, ...). Every
// rank measures at once, as in training (they share the machine); rank 0's medians are kept.
// `world` may be null (one rank: no collectives).
void calibrate(Ops& ops, Communicator* world, const CalibrateGrid& grid, Hardware& hw);

}  // namespace tripod
