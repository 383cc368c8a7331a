// The TRIPOD_* environment variables: debugging switches and test hooks, read once at start-up
// (read_debug_options, in make_runtime) into one typed value that is passed down.
#pragma once

#include <cstdint>
#include <string>
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

// A communication fault on one world rank (test hook, TRIPOD_TEST_COMM_FAULT; injected by the
// flight recorder's communicator wrapper, parallel/comm/flight_recorder.h):
//   stop-send:R@S        from step S on, rank R posts no send on the pipeline communicator
//   skip-allreduce:R@S   in step S, rank R skips its data-parallel gradient reduction (every
//                        bucket's all-reduce or reduce-scatter on the dp communicator)
//   sleep:R@S[:SECONDS]  in step S, rank R sleeps SECONDS (default 60) before its first communication
struct CommFault {
  enum class Kind { None, StopSend, SkipAllReduce, Sleep };
  Kind kind = Kind::None;
  int rank = -1;
  int64_t step = 0;
  double sleep_s = 60;
};

// What the restart launcher (launch/restarts.sh) tells the ranks it starts again; attempt 0: a
// first start.
struct RestartInfo {
  int attempt = 0;           // TRIPOD_RESTART_ATTEMPT: 1 for the first restart
  std::string cause;         // TRIPOD_RESTART_CAUSE: why the previous attempt ended
  int exit_status = 0;       // TRIPOD_RESTART_EXIT_STATUS: the launcher's exit status of that attempt
  double failed_at = 0;      // TRIPOD_RESTART_FAILED_AT: Unix time it ended
  double previous_start = 0; // TRIPOD_RESTART_PREVIOUS_START: Unix time it started
};

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
  // TRIPOD_TEST_EXIT_LINGER_MS=N: `tripod train` waits N ms after MPI_Finalize before it exits, so
  // a test can freeze a rank after its peers have finished (test hook).
  int exit_linger_ms = 0;
  // TRIPOD_TEST_STEP_SLEEP_MS=N: every training step starts with an N ms sleep, so that a test's
  // faults land mid-run however fast the machine is (test hook).
  int step_sleep_ms = 0;
  // TRIPOD_SLOW_RANK=RANK:FACTOR (RANK >= 0, FACTOR >= 1), e.g. "3:2": world rank 3 counts its
  // compute time twice and idles for the extra at each step's end (test hook for stragglers).
  SlowRank slow_rank = {};
  // TRIPOD_TEST_COMM_FAULT (test hook, see CommFault).
  CommFault comm_fault = {};
  // TRIPOD_RESTART_* (set by the launcher when it starts a failed run again).
  RestartInfo restart = {};
  // TRIPOD_LAUNCH_STATUS=FILE: rank 0 of `tripod train` writes the run's state there (JSON:
  // output_dir, checkpoint_dir, state "running" | "finished" | "stopped", step), so that the
  // launcher knows where the run lives and whether it reached its last step.
  std::string launch_status = {};
};

// Reads the variables. Throws InputError naming a variable whose value is not valid.
DebugOptions read_debug_options();

// "3:2" -> {3, 2.0}; null or empty -> none. Throws InputError on a malformed spec.
SlowRank parse_slow_rank(const char* spec);

// "loss@3,grad@5" -> the faults; null or empty -> none. Throws InputError on a malformed spec.
std::vector<FaultInjection> parse_fault_injections(const char* spec);

// "stop-send:1@2" -> the fault; null or empty -> none. Throws InputError on a malformed spec.
CommFault parse_comm_fault(const char* spec);

}  // namespace tripod
