// cuBLAS (the grouped GEMM of a mixture of experts' experts), loaded (dlopen) when the first grouped
// GEMM runs, like cuBLASLt (kernels/cuda/cublaslt.h): a process that never runs one, every CPU run
// and dense model included, never pays for loading it.
#pragma once

#include <cublas_api.h>

namespace tripod::cuda {

// The functions tripod calls, with cuBLAS's own signatures (the _v2 entry points).
#define TRIPOD_CUBLAS_FUNCTIONS(X) \
  X(Create_v2) X(Destroy_v2) X(SetStream_v2) X(GetStatusString) X(GemmGroupedBatchedEx)

struct Cublas {
#define TRIPOD_CUBLAS_MEMBER(name) decltype(&cublas##name) name = nullptr;
  TRIPOD_CUBLAS_FUNCTIONS(TRIPOD_CUBLAS_MEMBER)
#undef TRIPOD_CUBLAS_MEMBER
};

// libcublas.so.<the major version this build compiled against>, loaded once. Throws (an Error
// naming the library and dlerror()) when it or one of the functions cannot be found.
const Cublas& cublas();

}  // namespace tripod::cuda
