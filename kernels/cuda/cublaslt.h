// cuBLASLt, loaded (dlopen) when the first GEMM runner is made rather than with the process:
// loading the library costs about half a second of CPU in every process that links it (measured:
// an empty main() linked with -lcublasLt takes 0.5 s of CPU to start, one linked with cudart,
// cuDNN and NCCL 0.00 s), and every `tripod` and test process would pay it, CPU runs included.
#pragma once

#include <cublasLt.h>

namespace tripod::cuda {

// The functions tripod calls, with cuBLASLt's own signatures.
#define TRIPOD_CUBLASLT_FUNCTIONS(X)                                                                     \
  X(Create) X(Destroy) X(GetStatusString) X(Matmul) X(MatmulAlgoGetHeuristic) X(MatmulDescCreate)       \
  X(MatmulDescDestroy) X(MatmulDescSetAttribute) X(MatmulPreferenceCreate) X(MatmulPreferenceDestroy)   \
  X(MatmulPreferenceSetAttribute) X(MatrixLayoutCreate) X(MatrixLayoutDestroy)

struct CublasLt {
#define TRIPOD_CUBLASLT_MEMBER(name) decltype(&cublasLt##name) name = nullptr;
  TRIPOD_CUBLASLT_FUNCTIONS(TRIPOD_CUBLASLT_MEMBER)
#undef TRIPOD_CUBLASLT_MEMBER
};

// libcublasLt.so.<the major version this build compiled against>, loaded once. Throws (an Error
// naming the library and dlerror()) when it or one of the functions cannot be found.
const CublasLt& cublaslt();

}  // namespace tripod::cuda
