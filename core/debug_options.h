// The TRIPOD_* environment variables: debugging switches and test hooks, read once at start-up
// (read_debug_options, in make_runtime) into one typed value that is passed down.
#pragma once

#include <cstdint>
#include <vector>

namespace tripod {

// A step whose loss (or gradient norm) becomes NaN on every rank, as a real overflow would.
struct FaultInjection {
  int64_t step = 0;
  bool in_loss = true;  // else the gradient norm
};

// A rank made slower on purpose: its forward and backward work takes `factor` times as long (it
// sleeps (factor - 1) x the time each took), as a rank on a throttled device would.
struct SlowRank {
  int rank = -1;  // -1: none
  double factor = 1;
};

enum class AttentionKernels { Auto, Cudnn, Reference };

struct DebugOptions {
  // TRIPOD_COMM=mpi: device tensors travel through MPI, staged in host memory, even where NCCL
  // could carry them (tests, debugging).
  bool force_mpi = false;
  // TRIPOD_ATTENTION=auto|cudnn|reference: the CUDA attention kernels (kernels/cuda/attention_runner.h).
  AttentionKernels attention = AttentionKernels::Auto;
  // TRIPOD_CUDA_TIMING=1: GPU time per op family (Ops::take_times).
  bool cuda_timing = false;
  // TRIPOD_PEAK_TFLOPS=X (X > 0): the GPU's peak for MFU, instead of the datasheet figure found by
  // its name (gpu_peak_flops); 0: unset.
  double peak_tflops = 0;
  // TRIPOD_INJECT_NAN="loss@3,grad@5" (test hook).
  std::vector<FaultInjection> inject_nan = {};
  // TRIPOD_TEST_CKPT_SLEEP_MS=N: a checkpoint write sleeps N ms after its first tensor, so a test
  // can kill the process mid-save (test hook).
  int checkpoint_sleep_ms = 0;
  // TRIPOD_SLOW_RANK=RANK:FACTOR (RANK >= 0, FACTOR >= 1), e.g. "3:2": world rank 3 computes at half
  // speed (test hook for straggler detection).
  SlowRank slow_rank = {};
};

// Reads the variables. Throws InputError naming a variable whose value is not valid.
DebugOptions read_debug_options();

// "3:2" -> {3, 2.0}; null or empty -> none. Throws InputError on a malformed spec.
SlowRank parse_slow_rank(const char* spec);

// "loss@3,grad@5" -> the faults; null or empty -> none. Throws InputError on a malformed spec.
std::vector<FaultInjection> parse_fault_injections(const char* spec);

}  // namespace tripod
