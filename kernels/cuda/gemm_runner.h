// cuBLASLt GEMMs of the CUDA backend with their plans (descriptors, layouts and the heuristic's
// algorithm) cached per shape, types, epilogue and pointer alignment.
#pragma once

#include <cublasLt.h>

#include <compare>
#include <map>
#include <string>

#include "core/tensor.h"

namespace tripod::cuda {

class CudaOps;

// One column-major GEMM: D (m x n, ldd) = op(A) (m x k) op(B) (k x n) [+ bias] [GELU] + beta D.
// A is stored (k x m) when trans_a, else (m x k); B is stored (n x k) when trans_b, else (k x n).
struct GemmArgs {
  bool trans_a = false, trans_b = false;
  int64_t m = 0, n = 0, k = 0;
  const void* a = nullptr;
  int64_t lda = 0;
  cudaDataType_t a_type = CUDA_R_16BF;
  const void* b = nullptr;
  int64_t ldb = 0;
  cudaDataType_t b_type = CUDA_R_16BF;
  void* d = nullptr;
  int64_t ldd = 0;
  cudaDataType_t d_type = CUDA_R_16BF;
  float beta = 0.f;
  const void* bias = nullptr;  // (m) of d_type, added to every column (the bias epilogue)
  void* gelu_pre = nullptr;    // when set, D = gelu(...) and this (m x n, ldd) gets the input of the GELU
  bool dgelu = false;          // gelu_pre is read instead: D = (...) * gelu'(gelu_pre)
  // FP8 operands (a_type, b_type CUDA_R_8F_E4M3 / _E5M2; cuBLASLt takes them as "TN" only:
  // trans_a, not trans_b): device f32 factors A and B are multiplied by (their dequantization
  // scales), each pointer aligned to 16 bytes.
  const float* a_scale = nullptr;
  const float* b_scale = nullptr;
};

class GemmRunner {
 public:
  explicit GemmRunner(CudaOps& ops);
  ~GemmRunner();
  GemmRunner(const GemmRunner&) = delete;
  GemmRunner& operator=(const GemmRunner&) = delete;
  // Enqueues the GEMM on the compute stream; `what` names the op and shapes in errors.
  void run(const GemmArgs& g, const std::string& what);

 private:
  struct Key {
    bool trans_a, trans_b;
    int64_t m, n, k, lda, ldb, ldd;
    int a_type, b_type, d_type;
    bool bias, gelu, dgelu, scales;
    uint32_t align_a, align_b, align_d, align_bias, align_aux;
    auto operator<=>(const Key&) const = default;
  };
  struct Plan {
    cublasLtMatmulDesc_t desc = nullptr;
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
    cublasLtMatmulAlgo_t algo{};
  };
  Plan make_plan(const GemmArgs& g, const Key& key, const std::string& what);

  CudaOps& ops_;
  cublasLtHandle_t handle_ = nullptr;
  Tensor workspace_;
  std::map<Key, Plan> plans_;
};

}  // namespace tripod::cuda
