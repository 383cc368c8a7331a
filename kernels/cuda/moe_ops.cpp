// The CUDA backend's mixture-of-experts ops: the experts' grouped GEMMs (cuBLAS's grouped batched
// GEMM, one call for every expert) and the routing, permutation and q/k-norm kernels of moe.cu.
// Each checks its arguments, launches on the compute stream and checks the launch.
//
// Row-major tensors are column-major matrices transposed (as in gemm.cpp): for the rows of group
// g, x (n, I), w (O, I), y (n, O):
//   forward  y^T (O x n)  = w^T^T (O x I) . x^T (I x n)   A = w stored (I x O), transposed
//   dx       dx^T (I x n) = w^T (I x O) . dy^T (O x n)     no transposes
//   dw       dw^T (I x O) += x^T (I x n) . dy (n x O)      B = dy stored (O x n), transposed
#include <spdlog/spdlog.h>

#include "kernels/cuda/cublas.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/gemm_runner.h"
#include "kernels/cuda/op_checks.h"

namespace tripod::cuda {

namespace {

#define TRIPOD_CUBLAS_CALL(call, ...)                                                                       \
  do {                                                                                                      \
    cublasStatus_t tripod_st_ = (call);                                                                     \
    if (tripod_st_ != CUBLAS_STATUS_SUCCESS) [[unlikely]]                                                   \
      TRIPOD_FAIL("{}: {} failed: {}", fmt::format(__VA_ARGS__), #call, cublas().GetStatusString(tripod_st_)); \
  } while (0)

void check_offsets(std::span<const int64_t> offsets, size_t groups, int64_t rows, const char* op) {
  TRIPOD_CHECK(offsets.size() == groups + 1 && offsets.front() == 0 && offsets.back() <= rows,
               "{}: {} offsets for {} groups over {} rows", op, offsets.size(), groups, rows);
  for (size_t g = 0; g < groups; ++g) TRIPOD_CHECK(offsets[g] <= offsets[g + 1], "{}: offsets not ascending", op);
}

int32_t* i32(const Tensor& t) { return const_cast<int32_t*>(t.data<int32_t>()); }
float* f32_or_null(const Tensor& t) { return t.defined() ? const_cast<float*>(t.data<float>()) : nullptr; }

}  // namespace

void CudaOps::grouped_gemm(bool trans_a, bool trans_b, const std::vector<GroupedGemm>& problems, bool f32_out,
                           float beta, const std::string& what) {
  const int G = static_cast<int>(problems.size());
  if (G == 0) return;
  const cudaDataType_t ctype = f32_out ? CUDA_R_32F : CUDA_R_16BF;
  if (!grouped_declined_) {
    if (!cublas_) {
      TRIPOD_CUBLAS_CALL(cublas().Create_v2(&cublas_), "cuBLAS on GPU {}", device_);
      TRIPOD_CUBLAS_CALL(cublas().SetStream_v2(cublas_, compute_), "cuBLAS on GPU {}", device_);
    }
    // Per group: its sizes and scalars (host arrays) and its three matrices (device arrays of
    // device pointers, uploaded through pinned staging without waiting).
    std::vector<cublasOperation_t> ta(G, trans_a ? CUBLAS_OP_T : CUBLAS_OP_N), tb(G, trans_b ? CUBLAS_OP_T : CUBLAS_OP_N);
    std::vector<int> m(G), n(G), k(G), lda(G), ldb(G), ldc(G), size(G, 1);
    std::vector<float> alpha(G, 1.f), betas(G, beta);
    std::vector<const void*> ptrs(3 * static_cast<size_t>(G));
    for (int g = 0; g < G; ++g) {
      const GroupedGemm& p = problems[g];
      TRIPOD_CHECK(p.m < (1LL << 31) && p.n < (1LL << 31) && p.k < (1LL << 31), "{}: group {} is too large", what, g);
      m[g] = static_cast<int>(p.m), n[g] = static_cast<int>(p.n), k[g] = static_cast<int>(p.k);
      lda[g] = static_cast<int>(p.lda), ldb[g] = static_cast<int>(p.ldb), ldc[g] = static_cast<int>(p.ldc);
      ptrs[g] = p.a, ptrs[G + g] = p.b, ptrs[2 * G + g] = p.c;
    }
    const int64_t words = static_cast<int64_t>(ptrs.size()) * 2;  // pointers as pairs of 32-bit words
    Tensor host = Tensor::wrap(reinterpret_cast<int32_t*>(ptrs.data()), {words}, DType::I32);
    Tensor arrays = empty({words}, DType::I32, MemCategory::Workspace);
    copy(host, arrays);
    auto* dev_ptrs = static_cast<void**>(arrays.raw());
    const cublasStatus_t st = cublas().GemmGroupedBatchedEx(
        cublas_, ta.data(), tb.data(), m.data(), n.data(), k.data(), alpha.data(),
        const_cast<const void* const*>(dev_ptrs), CUDA_R_16BF, lda.data(), const_cast<const void* const*>(dev_ptrs + G),
        CUDA_R_16BF, ldb.data(), betas.data(), dev_ptrs + 2 * G, ctype, ldc.data(), G, size.data(), CUBLAS_COMPUTE_32F);
    if (st == CUBLAS_STATUS_SUCCESS) return;
    if (st != CUBLAS_STATUS_NOT_SUPPORTED)
      TRIPOD_FAIL("{}: cublasGemmGroupedBatchedEx failed: {}", what, cublas().GetStatusString(st));
    grouped_declined_ = true;
    spdlog::warn("cuBLAS declined a grouped GEMM ({}): the experts' GEMMs run one by one on cuBLASLt", what);
  }
  for (const GroupedGemm& p : problems)
    gemm_->run({.trans_a = trans_a, .trans_b = trans_b, .m = p.m, .n = p.n, .k = p.k, .a = p.a, .lda = p.lda,
                .b = p.b, .ldb = p.ldb, .d = p.c, .ldd = p.ldc, .d_type = ctype, .beta = beta},
               what);
}

void CudaOps::grouped_linear_forward(const Tensor& x, std::span<const Tensor> w, std::span<const int64_t> offsets,
                                     Tensor& y) {
  ScopedTimer timer(*this, OpFamily::Gemm);
  const char* op = "grouped_linear_forward";
  TRIPOD_CHECK(!w.empty() && w[0].dim() >= 2, "{}: no groups", op);
  const int64_t O = w[0].size(0), I = w[0].numel() / O, R = x.numel() / I;
  check_offsets(offsets, w.size(), R, op);
  expect(x, DType::BF16, R * I, op, "x");
  expect_on_device(y, op, "y");
  TRIPOD_CHECK(y.numel() >= offsets.back() * O, "{}: y {} for {} rows of {}", op, y.str(), offsets.back(), O);
  std::vector<GroupedGemm> problems;
  for (size_t g = 0; g < w.size(); ++g) {
    expect(w[g], DType::BF16, O * I, op, "w");
    const int64_t r0 = offsets[g], n = offsets[g + 1] - r0;
    if (n == 0) continue;
    problems.push_back({.m = O, .n = n, .k = I, .a = w[g].raw(), .lda = I, .b = x.data<bf16>() + r0 * I, .ldb = I,
                        .c = y.data<bf16>() + r0 * O, .ldc = O});
  }
  grouped_gemm(/*trans_a=*/true, false, problems, false, 0.f, fmt::format("{} x {} w[0] {}", op, x.str(), w[0].str()));
}

void CudaOps::grouped_linear_backward_input(const Tensor& dy, std::span<const Tensor> w,
                                            std::span<const int64_t> offsets, Tensor& dx) {
  ScopedTimer timer(*this, OpFamily::Gemm);
  const char* op = "grouped_linear_backward_input";
  TRIPOD_CHECK(!w.empty() && w[0].dim() >= 2, "{}: no groups", op);
  const int64_t O = w[0].size(0), I = w[0].numel() / O, R = dy.numel() / O;
  check_offsets(offsets, w.size(), R, op);
  expect(dy, DType::BF16, R * O, op, "dy");
  expect_on_device(dx, op, "dx");
  TRIPOD_CHECK(dx.numel() >= offsets.back() * I, "{}: dx {} for {} rows of {}", op, dx.str(), offsets.back(), I);
  std::vector<GroupedGemm> problems;
  for (size_t g = 0; g < w.size(); ++g) {
    expect(w[g], DType::BF16, O * I, op, "w");
    const int64_t r0 = offsets[g], n = offsets[g + 1] - r0;
    if (n == 0) continue;
    problems.push_back({.m = I, .n = n, .k = O, .a = w[g].raw(), .lda = I, .b = dy.data<bf16>() + r0 * O, .ldb = O,
                        .c = dx.data<bf16>() + r0 * I, .ldc = I});
  }
  grouped_gemm(false, false, problems, false, 0.f, fmt::format("{} dy {} w[0] {}", op, dy.str(), w[0].str()));
}

void CudaOps::grouped_linear_backward_weight(const Tensor& dy, const Tensor& x, std::span<const int64_t> offsets,
                                             std::span<Tensor> dw) {
  ScopedTimer timer(*this, OpFamily::Gemm);
  const char* op = "grouped_linear_backward_weight";
  TRIPOD_CHECK(!dw.empty() && dw[0].dim() >= 2, "{}: no groups", op);
  const int64_t O = dw[0].size(0), I = dw[0].numel() / O, R = x.numel() / I;
  check_offsets(offsets, dw.size(), R, op);
  expect(x, DType::BF16, R * I, op, "x");
  expect_on_device(dy, op, "dy");
  expect_dtype(dy, DType::BF16, op, "dy");
  TRIPOD_CHECK(dy.numel() >= offsets.back() * O, "{}: dy {} for {} rows of {}", op, dy.str(), offsets.back(), O);
  std::vector<GroupedGemm> problems;
  for (size_t g = 0; g < dw.size(); ++g) {
    expect(dw[g], DType::F32, O * I, op, "dw");
    const int64_t r0 = offsets[g], n = offsets[g + 1] - r0;
    if (n == 0) continue;
    problems.push_back({.m = I, .n = O, .k = n, .a = x.data<bf16>() + r0 * I, .lda = I,
                        .b = dy.data<bf16>() + r0 * O, .ldb = O, .c = dw[g].raw(), .ldc = I});
  }
  grouped_gemm(false, /*trans_b=*/true, problems, /*f32_out=*/true, 1.f,
               fmt::format("{} dy {} x {} dw[0] {}", op, dy.str(), x.str(), dw[0].str()));
}

void CudaOps::moe_route(const Tensor& logits, const Tensor& bias, bool sigmoid, bool normalize, Tensor& idx,
                        Tensor& weights, Tensor& stats) {
  ScopedTimer timer(*this, OpFamily::Moe);
  const char* op = "moe_route";
  TRIPOD_CHECK(logits.dim() == 2 && idx.dim() == 2 && idx.size(0) == logits.size(0), "{}: logits {} idx {}", op,
               logits.str(), idx.str());
  const int64_t N = logits.size(0), E = logits.size(1), k = idx.size(1);
  TRIPOD_CHECK(k >= 1 && k <= E, "{}: top {} of {} experts", op, k, E);
  expect(logits, DType::F32, N * E, op, "logits");
  expect(idx, DType::I32, N * k, op, "idx");
  expect(weights, DType::F32, N * k, op, "weights");
  expect(stats, DType::F32, E + 1, op, "stats");
  if (bias.defined()) expect(bias, DType::F32, E, op, "bias");
  Tensor p = empty({N, E}, DType::F32, MemCategory::Workspace), lse = empty({std::max<int64_t>(N, 1)}, DType::F32,
                                                                               MemCategory::Workspace);
  k::moe_route(logits.data<float>(), bias.defined() ? bias.data<float>() : nullptr, N, E, static_cast<int>(k), sigmoid,
               normalize, i32(idx), weights.data<float>(), p.data<float>(), lse.data<float>(), stats.data<float>(),
               compute_);
  TRIPOD_CUDA_LAUNCHED("{} logits {} idx {}", op, logits.str(), idx.str());
}

void CudaOps::moe_route_backward(const Tensor& logits, const Tensor& idx, const Tensor& dweights, const Tensor& aux,
                                 float z_scale, bool sigmoid, bool normalize, Tensor& dlogits) {
  ScopedTimer timer(*this, OpFamily::Moe);
  const char* op = "moe_route_backward";
  const int64_t N = logits.size(0), E = logits.size(1), k = idx.size(1);
  expect(logits, DType::F32, N * E, op, "logits");
  expect(idx, DType::I32, N * k, op, "idx");
  expect(dweights, DType::F32, N * k, op, "dweights");
  expect(dlogits, DType::BF16, N * E, op, "dlogits");
  if (aux.defined()) expect(aux, DType::F32, E, op, "aux");
  k::moe_route_backward(logits.data<float>(), idx.data<int32_t>(), dweights.data<float>(), f32_or_null(aux), z_scale,
                        N, E, static_cast<int>(k), sigmoid, normalize, dlogits.data<bf16>(), compute_);
  TRIPOD_CUDA_LAUNCHED("{} logits {} dlogits {}", op, logits.str(), dlogits.str());
}

void CudaOps::moe_dispatch(const Tensor& idx, int64_t experts, int64_t capacity, Tensor& routed, Tensor& row_of,
                           Tensor& slot_of) {
  ScopedTimer timer(*this, OpFamily::Moe);
  const char* op = "moe_dispatch";
  const int64_t P = idx.numel();
  expect(idx, DType::I32, P, op, "idx");
  expect(routed, DType::I32, experts, op, "routed");
  expect(row_of, DType::I32, P, op, "row_of");
  expect_on_device(slot_of, op, "slot_of");
  expect_dtype(slot_of, DType::I32, op, "slot_of");
  TRIPOD_CHECK(slot_of.numel() >= std::min(P, capacity < 0 ? P : capacity * experts), "{}: slot_of {} for {} pairs",
               op, slot_of.str(), P);
  k::moe_dispatch(idx.data<int32_t>(), P, experts, capacity, i32(routed), i32(row_of), i32(slot_of), compute_);
  TRIPOD_CUDA_LAUNCHED("{} idx {} experts {} capacity {}", op, idx.str(), experts, capacity);
}

void CudaOps::gather_rows(const Tensor& x, const Tensor& index, Tensor& out) {
  ScopedTimer timer(*this, OpFamily::Memory);
  const char* op = "gather_rows";
  const int64_t R = out.dim() >= 1 ? out.size(0) : 0;
  if (R == 0) return;
  const int64_t W = out.numel() / R;
  expect_on_device(x, op, "x");
  expect_on_device(out, op, "out");
  expect_on_device(index, op, "index");
  expect_dtype(index, DType::I32, op, "index");
  TRIPOD_CHECK(x.dtype() == out.dtype() && x.dtype() != DType::F64 && W > 0 && x.numel() % W == 0 &&
                   index.numel() >= R,
               "{}: x {} index {} out {}", op, x.str(), index.str(), out.str());
  k::gather_rows(x.raw(), index.data<int32_t>(), out.raw(), R, W, static_cast<int>(dtype_size(x.dtype())), compute_);
  TRIPOD_CUDA_LAUNCHED("{} x {} out {}", op, x.str(), out.str());
}

void CudaOps::moe_permute(const Tensor& x, const Tensor& slot_of, int64_t k, const Tensor& weights, Tensor& xp) {
  ScopedTimer timer(*this, OpFamily::Moe);
  const char* op = "moe_permute";
  const int64_t R = xp.size(0), C = R > 0 ? xp.numel() / R : 0;
  expect_on_device(x, op, "x");
  expect_dtype(x, DType::BF16, op, "x");
  expect(xp, DType::BF16, R * C, op, "xp");
  expect_on_device(slot_of, op, "slot_of");
  TRIPOD_CHECK(slot_of.numel() >= R && (C == 0 || x.numel() % C == 0), "{}: x {} slot_of {} xp {}", op, x.str(),
               slot_of.str(), xp.str());
  if (weights.defined()) expect_on_device(weights, op, "weights");
  k::moe_permute(x.data<bf16>(), slot_of.data<int32_t>(), k, f32_or_null(weights), xp.data<bf16>(), R, C, compute_);
  TRIPOD_CUDA_LAUNCHED("{} x {} xp {}", op, x.str(), xp.str());
}

void CudaOps::moe_unpermute(const Tensor& yp, const Tensor& row_of, const Tensor& weights, Tensor& y) {
  ScopedTimer timer(*this, OpFamily::Moe);
  const char* op = "moe_unpermute";
  const int64_t N = y.size(0), C = y.numel() / N, P = row_of.numel(), k = P / N;
  expect(y, DType::BF16, N * C, op, "y");
  expect_on_device(yp, op, "yp");
  expect_dtype(yp, DType::BF16, op, "yp");
  expect(row_of, DType::I32, N * k, op, "row_of");
  if (weights.defined()) expect(weights, DType::F32, N * k, op, "weights");
  k::moe_unpermute(yp.data<bf16>(), row_of.data<int32_t>(), f32_or_null(weights), y.data<bf16>(), N, k, C, compute_);
  TRIPOD_CUDA_LAUNCHED("{} yp {} y {}", op, yp.str(), y.str());
}

void CudaOps::moe_combine_backward(Tensor& g, const Tensor& act, const Tensor& slot_of, const Tensor& weights,
                                   Tensor& dweights) {
  ScopedTimer timer(*this, OpFamily::Moe);
  const char* op = "moe_combine_backward";
  const int64_t R = g.size(0), F = R > 0 ? g.numel() / R : 0;
  expect(g, DType::BF16, R * F, op, "g");
  expect_on_device(act, op, "act");
  TRIPOD_CHECK(act.numel() >= R * F && slot_of.numel() >= R, "{}: act {} slot_of {} for g {}", op, act.str(),
               slot_of.str(), g.str());
  expect_dtype(dweights, DType::F32, op, "dweights");
  expect_dtype(weights, DType::F32, op, "weights");
  k::moe_combine_backward(g.data<bf16>(), act.data<bf16>(), slot_of.data<int32_t>(), weights.data<float>(),
                          dweights.data<float>(), R, F, compute_);
  TRIPOD_CUDA_LAUNCHED("{} g {} act {}", op, g.str(), act.str());
}

void CudaOps::qk_norm_forward(Tensor& qkv, int64_t hq, int64_t hk, const Tensor& w, float eps, Tensor& saved,
                              Tensor& rstd) {
  ScopedTimer timer(*this, OpFamily::LayerNorm);
  const char* op = "qk_norm_forward";
  TRIPOD_CHECK(qkv.dim() == 3 && hq + hk <= qkv.size(1), "{}: qkv {} for {} + {} heads", op, qkv.str(), hq, hk);
  const int64_t N = qkv.size(0), H = qkv.size(1), D = qkv.size(2), n = hq + hk;
  expect(qkv, DType::BF16, N * H * D, op, "qkv");
  expect(w, DType::BF16, 2 * D, op, "w");
  expect(saved, DType::BF16, N * n * D, op, "saved");
  expect(rstd, DType::F32, N * n, op, "rstd");
  k::qk_norm_forward(qkv.data<bf16>(), N, H, D, hq, hk, w.data<bf16>(), eps, saved.data<bf16>(), rstd.data<float>(),
                     compute_);
  TRIPOD_CUDA_LAUNCHED("{} qkv {}", op, qkv.str());
}

void CudaOps::qk_norm_backward(Tensor& dqkv, int64_t hq, const Tensor& saved, const Tensor& w, const Tensor& rstd,
                               Tensor& dw) {
  ScopedTimer timer(*this, OpFamily::LayerNorm);
  const char* op = "qk_norm_backward";
  TRIPOD_CHECK(dqkv.dim() == 3, "{}: dqkv {} must be (N, heads, D)", op, dqkv.str());
  const int64_t N = dqkv.size(0), H = dqkv.size(1), D = dqkv.size(2), n = saved.numel() / std::max<int64_t>(N * D, 1);
  expect(dqkv, DType::BF16, N * H * D, op, "dqkv");
  expect(saved, DType::BF16, N * n * D, op, "saved");
  expect(w, DType::BF16, 2 * D, op, "w");
  expect(rstd, DType::F32, N * n, op, "rstd");
  expect(dw, DType::F32, 2 * D, op, "dw");
  Tensor partial = empty({k::qk_norm_chunks(N), 2 * D}, DType::F32, MemCategory::Workspace);
  k::qk_norm_backward(dqkv.data<bf16>(), N, H, D, hq, n, saved.data<bf16>(), w.data<bf16>(), rstd.data<float>(),
                      dw.data<float>(), partial.data<float>(), compute_);
  TRIPOD_CUDA_LAUNCHED("{} dqkv {}", op, dqkv.str());
}

}  // namespace tripod::cuda
