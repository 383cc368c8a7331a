// Error checks for CUDA runtime, cuBLASLt and cuDNN calls and for kernel launches: a failure
// throws tripod::Error naming the call, the op and the shapes (exit status 1).
//
// Kernels run asynchronously, so a fault inside one (e.g. an illegal address) is reported by a
// later call; run with CUDA_LAUNCH_BLOCKING=1 to have it named by the op that caused it.
#pragma once

#include "kernels/cuda/cublaslt.h"
#include <cuda_runtime_api.h>
#include <cudnn_graph.h>

#include <string>

#include "core/error.h"

// `call` is a CUDA runtime call; the rest is a fmt format naming the op and shapes.
#define TRIPOD_CUDA_CHECK(call, ...)                                                                       \
  do {                                                                                                     \
    cudaError_t tripod_err_ = (call);                                                                      \
    if (tripod_err_ != cudaSuccess) [[unlikely]]                                                           \
      TRIPOD_FAIL("{}: {} failed: {} ({})", fmt::format(__VA_ARGS__), #call, cudaGetErrorName(tripod_err_), \
                  cudaGetErrorString(tripod_err_));                                                        \
  } while (0)

// After a kernel launch: a bad launch configuration or an earlier asynchronous fault.
#define TRIPOD_CUDA_LAUNCHED(...)                                                                           \
  do {                                                                                                     \
    cudaError_t tripod_err_ = cudaGetLastError();                                                          \
    if (tripod_err_ != cudaSuccess) [[unlikely]]                                                           \
      TRIPOD_FAIL("{}: kernel launch failed: {} ({})", fmt::format(__VA_ARGS__), cudaGetErrorName(tripod_err_), \
                  cudaGetErrorString(tripod_err_));                                                        \
  } while (0)

#define TRIPOD_CUBLAS_CHECK(call, ...)                                                                       \
  do {                                                                                                       \
    cublasStatus_t tripod_st_ = (call);                                                                      \
    if (tripod_st_ != CUBLAS_STATUS_SUCCESS) [[unlikely]]                                                    \
      TRIPOD_FAIL("{}: {} failed: {}", fmt::format(__VA_ARGS__), #call, ::tripod::cuda::cublaslt().GetStatusString(tripod_st_)); \
  } while (0)

namespace tripod::cuda {

// cuDNN's status string followed by its last error message (which says why a graph or plan was
// refused).
std::string cudnn_error(cudnnStatus_t status);

}  // namespace tripod::cuda

#define TRIPOD_CUDNN_CHECK(call, ...)                                                                      \
  do {                                                                                                     \
    cudnnStatus_t tripod_st_ = (call);                                                                     \
    if (tripod_st_ != CUDNN_STATUS_SUCCESS) [[unlikely]]                                                   \
      TRIPOD_FAIL("{}: {} failed: {}", fmt::format(__VA_ARGS__), #call, ::tripod::cuda::cudnn_error(tripod_st_)); \
  } while (0)
