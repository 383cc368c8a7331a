// Linear layers on cuBLASLt: bf16 operands, f32 accumulation, bias (and GELU) fused in the
// epilogue; weight gradients accumulate in f32 (beta = 1) straight into the gradient buffers.
//
// Row-major tensors are column-major matrices transposed, so with x (N, I), w (O, I), y (N, O):
//   forward  y^T (O x N)  = (w^T)^T (O x I) . x^T (I x N)      A = w stored (I x O), transposed
//   dx       dx^T (I x N) = w^T (I x O) . dy^T (O x N)          A = w, B = dy, no transposes
//   dw       dw^T (I x O) = x^T (I x N) . (dy^T)^T (N x O)      B = dy stored (O x N), transposed
#include "kernels/cuda/gemm_runner.h"

#include <spdlog/spdlog.h>

#include <cmath>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/op_checks.h"

namespace tripod::cuda {

namespace {

constexpr size_t kWorkspaceBytes = 32u << 20;  // what cuBLASLt's fastest Hopper kernels ask for

uint32_t alignment(const void* p) {
  if (!p) return 256;
  uint32_t a = 1;
  auto v = reinterpret_cast<uintptr_t>(p);
  while (a < 256 && v % (a * 2) == 0) a *= 2;
  return a;
}

template <class T>
void set_desc(cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t attr, const T& v, const std::string& what) {
  TRIPOD_CUBLAS_CHECK(cublaslt().MatmulDescSetAttribute(d, attr, &v, sizeof(v)), "{}", what);
}

}  // namespace

GemmRunner::GemmRunner(CudaOps& ops) : ops_(ops) {
  TRIPOD_CUBLAS_CHECK(cublaslt().Create(&handle_), "cuBLASLt on GPU {}", ops.device_index());
  workspace_ = Tensor::empty(ops.allocator(), {static_cast<int64_t>(kWorkspaceBytes / 4)}, DType::I32,
                             MemCategory::Workspace);
}

GemmRunner::~GemmRunner() {
  for (auto& [key, p] : plans_) {
    cublaslt().MatrixLayoutDestroy(p.a);
    cublaslt().MatrixLayoutDestroy(p.b);
    cublaslt().MatrixLayoutDestroy(p.d);
    cublaslt().MatmulDescDestroy(p.desc);
  }
  if (handle_) cublaslt().Destroy(handle_);
}

GemmRunner::Plan GemmRunner::make_plan(const GemmArgs& g, const Key& key, const std::string& what) {
  Plan p;
  TRIPOD_CUBLAS_CHECK(cublaslt().MatmulDescCreate(&p.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F), "{}", what);
  const int32_t ta = g.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, tb = g.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  set_desc(p.desc, CUBLASLT_MATMUL_DESC_TRANSA, ta, what);
  set_desc(p.desc, CUBLASLT_MATMUL_DESC_TRANSB, tb, what);
  cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
  if (g.dgelu)
    epilogue = CUBLASLT_EPILOGUE_DGELU;
  else if (g.bias && g.gelu_pre)
    epilogue = CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
  else if (g.bias)
    epilogue = CUBLASLT_EPILOGUE_BIAS;
  else if (g.gelu_pre)
    epilogue = CUBLASLT_EPILOGUE_GELU_AUX;
  set_desc(p.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, epilogue, what);
  if (g.bias) {
    const int32_t bias_type = g.d_type;
    set_desc(p.desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, bias_type, what);
    // The heuristic reads the pointer's alignment; the pointer itself is set per call.
    set_desc(p.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, g.bias, what);
  }
  if (g.gelu_pre) {
    set_desc(p.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, static_cast<const void*>(g.gelu_pre), what);
    set_desc(p.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, g.ldd, what);
  }
  // FP8: the operands' scale factors (pointers set again per call).
  if (g.a_scale) set_desc(p.desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, static_cast<const void*>(g.a_scale), what);
  if (g.b_scale) set_desc(p.desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, static_cast<const void*>(g.b_scale), what);
  TRIPOD_CUBLAS_CHECK(cublaslt().MatrixLayoutCreate(&p.a, g.a_type, g.trans_a ? g.k : g.m, g.trans_a ? g.m : g.k, g.lda),
                      "{}", what);
  TRIPOD_CUBLAS_CHECK(cublaslt().MatrixLayoutCreate(&p.b, g.b_type, g.trans_b ? g.n : g.k, g.trans_b ? g.k : g.n, g.ldb),
                      "{}", what);
  TRIPOD_CUBLAS_CHECK(cublaslt().MatrixLayoutCreate(&p.d, g.d_type, g.m, g.n, g.ldd), "{}", what);

  cublasLtMatmulPreference_t pref = nullptr;
  TRIPOD_CUBLAS_CHECK(cublaslt().MatmulPreferenceCreate(&pref), "{}", what);
  const uint64_t ws = kWorkspaceBytes;
  // The heuristic may only pick kernels that work at the operands' actual alignment.
  const std::pair<cublasLtMatmulPreferenceAttributes_t, uint32_t> alignments[] = {
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, key.align_a},
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, key.align_b},
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, key.align_d},
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, key.align_d}};
  cublasStatus_t st =
      cublaslt().MatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws));
  for (const auto& [attr, bytes] : alignments)
    if (st == CUBLAS_STATUS_SUCCESS) st = cublaslt().MatmulPreferenceSetAttribute(pref, attr, &bytes, sizeof(bytes));
  if (st != CUBLAS_STATUS_SUCCESS) cublaslt().MatmulPreferenceDestroy(pref);
  TRIPOD_CUBLAS_CHECK(st, "{}: matmul preferences", what);
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  st = cublaslt().MatmulAlgoGetHeuristic(handle_, p.desc, p.a, p.b, p.d, p.d, pref, 1, &result, &found);
  cublaslt().MatmulPreferenceDestroy(pref);
  if (st != CUBLAS_STATUS_SUCCESS || found == 0) {
    cublaslt().MatrixLayoutDestroy(p.a);
    cublaslt().MatrixLayoutDestroy(p.b);
    cublaslt().MatrixLayoutDestroy(p.d);
    cublaslt().MatmulDescDestroy(p.desc);
    TRIPOD_FAIL("{}: cuBLASLt has no algorithm for m={} n={} k={} (lda {}, ldb {}, ldd {}, epilogue {}): {}", what, g.m,
                g.n, g.k, g.lda, g.ldb, g.ldd, static_cast<int>(epilogue),
                st == CUBLAS_STATUS_SUCCESS ? "no candidate" : cublaslt().GetStatusString(st));
  }
  p.algo = result.algo;
  return p;
}

void GemmRunner::run(const GemmArgs& g, const std::string& what) {
  if (g.m == 0 || g.n == 0) return;
  Key key{g.trans_a, g.trans_b, g.m, g.n, g.k, g.lda, g.ldb, g.ldd, static_cast<int>(g.a_type),
          static_cast<int>(g.b_type), static_cast<int>(g.d_type), g.bias != nullptr, g.gelu_pre != nullptr, g.dgelu,
          g.a_scale != nullptr, alignment(g.a), alignment(g.b), alignment(g.d),
          alignment(g.bias), alignment(g.gelu_pre)};
  auto it = plans_.find(key);
  if (it == plans_.end()) it = plans_.emplace(key, make_plan(g, key, what)).first;
  Plan& p = it->second;
  if (g.bias) set_desc(p.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, g.bias, what);
  if (g.gelu_pre) set_desc(p.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, static_cast<const void*>(g.gelu_pre), what);
  if (g.a_scale) set_desc(p.desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, static_cast<const void*>(g.a_scale), what);
  if (g.b_scale) set_desc(p.desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, static_cast<const void*>(g.b_scale), what);
  const float alpha = 1.f, beta = g.beta;
  TRIPOD_CUBLAS_CHECK(cublaslt().Matmul(handle_, p.desc, &alpha, g.a, p.a, g.b, p.b, &beta, g.d, p.d, g.d, p.d, &p.algo,
                                     workspace_.raw(), kWorkspaceBytes, ops_.compute_stream()),
                      "{}", what);
}

// ---- the Ops entry points ---------------------------------------------------------------------

namespace {

struct LinearDims {
  int64_t N, I, O;
};

LinearDims linear_dims(const Tensor& x, const Tensor& w, const char* op) {
  expect_on_device(w, op, "w");
  expect_dtype(w, DType::BF16, op, "w");
  TRIPOD_CHECK(w.dim() >= 2 && w.size(0) > 0, "{}: w must be (out, in), got {}", op, w.str());
  const int64_t O = w.size(0), I = w.numel() / O;
  TRIPOD_CHECK(I > 0 && x.numel() % I == 0, "{}: x {} does not have rows of w's {} inputs", op, x.str(), I);
  return {x.numel() / I, I, O};
}

}  // namespace

void CudaOps::linear_forward(const Tensor& x, const Tensor& w, const Tensor& b, Tensor& y) {
  ScopedTimer timer(*this, OpFamily::Gemm);
  auto [N, I, O] = linear_dims(x, w, "linear_forward");
  expect(x, DType::BF16, N * I, "linear_forward", "x");
  expect(y, DType::BF16, N * O, "linear_forward", "y");
  if (b.defined()) expect(b, DType::BF16, O, "linear_forward", "b");
  GemmArgs g{.trans_a = true, .m = O, .n = N, .k = I, .a = w.raw(), .lda = I, .b = x.raw(), .ldb = I, .d = y.raw(),
             .ldd = O, .bias = b.defined() ? b.raw() : nullptr};
  gemm_->run(g, fmt::format("linear_forward x {} w {} y {}", x.str(), w.str(), y.str()));
}

void CudaOps::linear_gelu_forward(const Tensor& x, const Tensor& w, const Tensor& b, Tensor& pre, Tensor& y) {
  auto [N, I, O] = linear_dims(x, w, "linear_gelu_forward");
  // cuBLASLt's GELU epilogue needs the auxiliary output's leading dimension divisible by 8.
  if (O % 8 != 0) {
    Ops::linear_gelu_forward(x, w, b, pre, y);
    return;
  }
  ScopedTimer timer(*this, OpFamily::Gemm);
  expect(x, DType::BF16, N * I, "linear_gelu_forward", "x");
  expect(pre, DType::BF16, N * O, "linear_gelu_forward", "pre");
  expect(y, DType::BF16, N * O, "linear_gelu_forward", "y");
  if (b.defined()) expect(b, DType::BF16, O, "linear_gelu_forward", "b");
  GemmArgs g{.trans_a = true, .m = O, .n = N, .k = I, .a = w.raw(), .lda = I, .b = x.raw(), .ldb = I, .d = y.raw(),
             .ldd = O, .bias = b.defined() ? b.raw() : nullptr, .gelu_pre = pre.raw()};
  gemm_->run(g, fmt::format("linear_gelu_forward x {} w {} y {}", x.str(), w.str(), y.str()));
}

void CudaOps::linear_input_grad(const Tensor& dy, const Tensor& w, Tensor& dx, const Tensor& gelu_pre) {
  auto [N, I, O] = linear_dims(dx, w, "linear_backward_input");
  expect(dy, DType::BF16, N * O, "linear_backward_input", "dy");
  expect(dx, DType::BF16, N * I, "linear_backward_input", "dx");
  if (gelu_pre.defined()) expect(gelu_pre, DType::BF16, N * I, "linear_backward_input", "pre");
  GemmArgs g{.m = I, .n = N, .k = O, .a = w.raw(), .lda = I, .b = dy.raw(), .ldb = O, .d = dx.raw(), .ldd = I,
             .gelu_pre = gelu_pre.defined() ? const_cast<void*>(gelu_pre.raw()) : nullptr, .dgelu = gelu_pre.defined()};
  gemm_->run(g, fmt::format("linear_backward dx {} = dy {} w {}{}", dx.str(), dy.str(), w.str(),
                            gelu_pre.defined() ? " * gelu'(pre)" : ""));
}

void CudaOps::linear_weight_grad(const Tensor& dy, const Tensor& x, Tensor& dw, Tensor& db) {
  const char* op = "linear_backward_weight";
  TRIPOD_CHECK(dw.dim() >= 2 && dw.size(0) > 0, "{}: dw must be (out, in), got {}", op, dw.str());
  const int64_t O = dw.size(0), I = dw.numel() / O;
  TRIPOD_CHECK(x.numel() % I == 0, "{}: x {} does not have rows of dw's {} inputs", op, x.str(), I);
  const int64_t N = x.numel() / I;
  expect(dy, DType::BF16, N * O, op, "dy");
  expect(x, DType::BF16, N * I, op, "x");
  expect(dw, DType::F32, O * I, op, "dw");
  GemmArgs g{.trans_b = true, .m = I, .n = O, .k = N, .a = x.raw(), .lda = I, .b = dy.raw(), .ldb = O,
             .d = dw.raw(), .ldd = I, .d_type = CUDA_R_32F, .beta = 1.f};
  gemm_->run(g, fmt::format("linear_backward dw {} += dy {}^T x {}", dw.str(), dy.str(), x.str()));
  if (db.defined()) {
    expect(db, DType::F32, O, op, "db");
    Tensor scratch = empty({k::column_partial_rows(N), O}, DType::F32, MemCategory::Workspace);
    k::bias_grad(dy.data<bf16>(), N, O, db.data<float>(), scratch.data<float>(), compute_);
    TRIPOD_CUDA_LAUNCHED("linear_backward db {} += sum of dy {}", db.str(), dy.str());
  }
}

void CudaOps::linear_backward(const Tensor& dy, const Tensor& x, const Tensor& w, Tensor& dx, Tensor& dw,
                              Tensor& db) {
  ScopedTimer timer(*this, OpFamily::Gemm);
  auto [N, I, O] = linear_dims(x, w, "linear_backward");
  expect(dw, DType::F32, O * I, "linear_backward", "dw");
  if (dx.defined()) linear_input_grad(dy, w, dx);
  linear_weight_grad(dy, x, dw, db);
}

void CudaOps::linear_backward_input(const Tensor& dy, const Tensor& w, Tensor& dx) {
  ScopedTimer timer(*this, OpFamily::Gemm);
  linear_input_grad(dy, w, dx);
}

void CudaOps::linear_backward_input_gelu(const Tensor& dy, const Tensor& w, const Tensor& pre, Tensor& dpre) {
  {
    ScopedTimer timer(*this, OpFamily::Gemm);
    // The operands checked here, so that what the catch below meets is cuBLASLt declining.
    auto [N, I, O] = linear_dims(dpre, w, "linear_backward_input_gelu");
    expect(dy, DType::BF16, N * O, "linear_backward_input_gelu", "dy");
    expect(dpre, DType::BF16, N * I, "linear_backward_input_gelu", "dpre");
    expect(pre, DType::BF16, N * I, "linear_backward_input_gelu", "pre");
    // cuBLASLt's GELU epilogues need the auxiliary matrix's leading dimension divisible by 8.
    if (I % 8 == 0 && !dgelu_declined_) {
      try {
        linear_input_grad(dy, w, dpre, pre);
        return;
      } catch (const Error& e) {
        // A cuBLASLt without this epilogue for these types: the GEMM, then the GELU's gradient.
        spdlog::warn("cuBLASLt has no DGELU epilogue here ({}): the GELU's gradient runs as a pass of its own",
                     e.what());
        dgelu_declined_ = true;
      }
    }
    linear_input_grad(dy, w, dpre);
  }
  gelu_backward(pre, dpre, dpre);
}

void CudaOps::linear_backward_weight(const Tensor& dy, const Tensor& x, Tensor& dw, Tensor& db) {
  ScopedTimer timer(*this, OpFamily::Gemm);
  linear_weight_grad(dy, x, dw, db);
}

void CudaOps::bias_backward(const Tensor& dy, Tensor& db) {
  ScopedTimer timer(*this, OpFamily::Gemm);
  const char* op = "bias_backward";
  expect_on_device(db, op, "db");
  expect_dtype(db, DType::F32, op, "db");
  const int64_t O = db.numel(), N = O > 0 ? dy.numel() / O : 0;
  expect(dy, DType::BF16, N * O, op, "dy");
  Tensor scratch = empty({k::column_partial_rows(N), O}, DType::F32, MemCategory::Workspace);
  k::bias_grad(dy.data<bf16>(), N, O, db.data<float>(), scratch.data<float>(), compute_);
  TRIPOD_CUDA_LAUNCHED("bias_backward db {} += sum of dy {}", db.str(), dy.str());
}

// ---- FP8 --------------------------------------------------------------------------------------
// fp8_gemm's row-major out (R, C) = a (R, K) b (C, K)^T is cuBLASLt's column-major
// D (C x R) = op(A) (C x K) . B (K x R) with A = b stored (K x C), transposed, and B = a stored
// (K x R): both operands K-major, the "TN" layout FP8 GEMMs require; A's scale is b's.

namespace {

cudaDataType_t fp8_type(const Tensor& t, const char* op, const char* name) {
  TRIPOD_CHECK(is_fp8(t.dtype()), "{}: {} must be f8e4m3 or f8e5m2, got {}", op, name, t.str());
  return t.dtype() == DType::F8E4M3 ? CUDA_R_8F_E4M3 : CUDA_R_8F_E5M2;
}

}  // namespace

void CudaOps::fp8_gemm(const Tensor& a, const Tensor& a_scale, const Tensor& b, const Tensor& b_scale,
                       const Tensor& bias, bool accumulate, Tensor& out, Tensor& out_amax) {
  ScopedTimer timer(*this, OpFamily::Gemm);
  const char* op = "fp8_gemm";
  expect_on_device(a, op, "a");
  expect_on_device(b, op, "b");
  const cudaDataType_t ta = fp8_type(a, op, "a"), tb = fp8_type(b, op, "b");
  TRIPOD_CHECK(!(ta == CUDA_R_8F_E5M2 && tb == CUDA_R_8F_E5M2), "{}: a {} and b {} are both e5m2", op, a.str(), b.str());
  TRIPOD_CHECK(a.dim() == 2 && b.dim() == 2 && a.size(1) == b.size(1), "{}: a {} and b {} must be (R, K), (C, K)", op,
               a.str(), b.str());
  const int64_t R = a.size(0), K = a.size(1), C = b.size(0);
  TRIPOD_CHECK(K % 16 == 0 && C % 16 == 0, "{}: K = {} and C = {} must be multiples of 16 (cuBLASLt's FP8 rule)", op, K,
               C);
  TRIPOD_CHECK(!accumulate || !bias.defined(), "{}: a bias with accumulate", op);
  expect(a_scale, DType::F32, 2, op, "a_scale");
  expect(b_scale, DType::F32, 2, op, "b_scale");
  expect(out, accumulate ? DType::F32 : DType::BF16, R * C, op, "out");
  if (bias.defined()) expect(bias, DType::BF16, C, op, "bias");
  // The dequantization factors (each pair's 1/s) staged 16 bytes apart, as cuBLASLt requires
  // (a factor read from its {s, 1/s} pair directly is only 4-byte aligned: "not supported").
  Tensor factors = empty({8}, DType::F32, MemCategory::Workspace);
  k::fp8_gemm_scales(b_scale.data<float>(), a_scale.data<float>(), factors.data<float>(), compute_);
  TRIPOD_CUDA_LAUNCHED("fp8_gemm: scales of a {} and b {}", a.str(), b.str());
  GemmArgs g{.trans_a = true, .m = C, .n = R, .k = K, .a = b.raw(), .lda = K, .a_type = tb, .b = a.raw(), .ldb = K,
             .b_type = ta, .d = out.raw(), .ldd = C, .d_type = accumulate ? CUDA_R_32F : CUDA_R_16BF,
             .beta = accumulate ? 1.f : 0.f, .bias = bias.defined() ? bias.raw() : nullptr,
             .a_scale = factors.data<float>(), .b_scale = factors.data<float>() + 4};
  gemm_->run(g, fmt::format("fp8_gemm out {} = a {} b {}^T", out.str(), a.str(), b.str()));
  if (!out_amax.defined()) return;
  // cuBLASLt computes the amax of an FP8 D only; of this bf16 one, a pass (a running max).
  expect(out_amax, DType::F32, 1, op, "out_amax");
  k::fp8_amax(out.data<bf16>(), R * C, out_amax.data<float>(), compute_);
  TRIPOD_CUDA_LAUNCHED("fp8_gemm: amax of out {}", out.str());
}

void CudaOps::fp8_amax(const Tensor& x, Tensor& amax) {
  ScopedTimer timer(*this, OpFamily::Elementwise);
  expect_on_device(x, "fp8_amax", "x");
  expect_dtype(x, DType::BF16, "fp8_amax", "x");
  expect(amax, DType::F32, 1, "fp8_amax", "amax");
  fill(amax, 0.f);
  k::fp8_amax(x.data<bf16>(), x.numel(), amax.data<float>(), compute_);
  TRIPOD_CUDA_LAUNCHED("fp8_amax of {}", x.str());
}

void CudaOps::fp8_scale(const Tensor& amaxes, float fmt_max, int margin, Tensor& scale, Tensor& record) {
  expect_on_device(amaxes, "fp8_scale", "amaxes");
  expect_dtype(amaxes, DType::F32, "fp8_scale", "amaxes");
  expect(scale, DType::F32, 2, "fp8_scale", "scale");
  if (record.defined()) expect(record, DType::F32, 1, "fp8_scale", "record");
  k::fp8_scale(amaxes.data<float>(), static_cast<int>(amaxes.numel()), fmt_max, std::ldexp(1.f, -margin),
               scale.data<float>(), record.defined() ? record.data<float>() : nullptr, compute_);
  TRIPOD_CUDA_LAUNCHED("fp8_scale from {}", amaxes.str());
}

void CudaOps::fp8_quantize(const Tensor& x, const Tensor& scale, Tensor& q, Tensor& qt, Tensor& amax,
                           Tensor& saturated) {
  ScopedTimer timer(*this, OpFamily::Elementwise);
  const char* op = "fp8_quantize";
  const Tensor& any = q.defined() ? q : qt;
  TRIPOD_CHECK(any.defined() && is_fp8(any.dtype()) && any.dim() == 2, "{}: q {} / qt {} must be 2-D FP8", op,
               q.defined() ? q.str() : "undefined", qt.defined() ? qt.str() : "undefined");
  const int64_t R = q.defined() ? q.size(0) : qt.size(1), C = q.defined() ? q.size(1) : qt.size(0);
  expect(x, DType::BF16, R * C, op, "x");
  expect(scale, DType::F32, 2, op, "scale");
  if (q.defined()) expect_on_device(q, op, "q");
  if (qt.defined()) {
    expect_on_device(qt, op, "qt");
    TRIPOD_CHECK(qt.dtype() == any.dtype() && qt.size(0) == C && qt.size(1) == R, "{}: qt {} must be q {} transposed",
                 op, qt.str(), any.str());
  }
  if (amax.defined()) expect(amax, DType::F32, 1, op, "amax");
  if (saturated.defined()) expect(saturated, DType::F32, 1, op, "saturated");
  k::fp8_quantize(x.data<bf16>(), R, C, scale.data<float>(), any.dtype() == DType::F8E5M2,
                  q.defined() ? static_cast<uint8_t*>(q.raw()) : nullptr,
                  qt.defined() ? static_cast<uint8_t*>(qt.raw()) : nullptr,
                  amax.defined() ? amax.data<float>() : nullptr,
                  saturated.defined() ? saturated.data<float>() : nullptr, compute_);
  TRIPOD_CUDA_LAUNCHED("fp8_quantize {} -> {}", x.str(), any.str());
}

}  // namespace tripod::cuda
