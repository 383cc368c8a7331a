// The CUDA backend's layer ops: embedding, LayerNorm, RMSNorm, rotary embeddings, GELU, SwiGLU,
// softmax cross-entropy and AdamW.
// Each checks its arguments (device, dtype, size), launches the kernels of kernels.h on the
// compute stream and checks the launch, naming the op and the shapes.
#include <cmath>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/op_checks.h"

namespace tripod::cuda {

namespace {
// The rows of a normalization's input x, C = w.numel() columns each (w on the device).
int64_t norm_rows(const Tensor& x, const Tensor& w, const char* op) {
  expect_on_device(w, op, "w");
  const int64_t C = w.numel();
  TRIPOD_CHECK(C > 0 && x.numel() % C == 0, "{}: x {} is not rows of {} columns", op, x.str(), C);
  return x.numel() / C;
}
}  // namespace

void CudaOps::embedding_forward(const Tensor& tokens, const Tensor& wte, int64_t vocab_start, const Tensor& wpe,
                                int64_t T, Tensor& out) {
  ScopedTimer timer(*this, OpFamily::Embedding);
  const char* op = "embedding_forward";
  expect_on_device(tokens, op, "tokens");
  expect_dtype(tokens, DType::I32, op, "tokens");
  expect_on_device(wte, op, "wte");
  expect_dtype(wte, DType::BF16, op, "wte");
  TRIPOD_CHECK(wte.dim() == 2, "{}: wte must be (V, C), got {}", op, wte.str());
  const int64_t N = tokens.numel(), V = wte.size(0), C = wte.size(1);
  expect(out, DType::BF16, N * C, op, "out");
  if (wpe.defined()) {
    expect_on_device(wpe, op, "wpe");
    expect_dtype(wpe, DType::BF16, op, "wpe");
    TRIPOD_CHECK(wpe.dim() == 2 && wpe.size(1) == C && wpe.size(0) >= T && T > 0 && N % T == 0,
                 "{}: wpe {} for T={} and N={}", op, wpe.str(), T, N);
  }
  k::embedding_forward(tokens.data<int32_t>(), N, wte.data<bf16>(), V, C, vocab_start,
                       wpe.defined() ? wpe.data<bf16>() : nullptr, T, out.data<bf16>(), compute_);
  TRIPOD_CUDA_LAUNCHED("{} tokens {} wte {} out {}", op, tokens.str(), wte.str(), out.str());
}

void CudaOps::embedding_backward(const Tensor& tokens, const Tensor& dout, int64_t vocab_start, Tensor& dwte,
                                 Tensor& dwpe, int64_t T) {
  ScopedTimer timer(*this, OpFamily::Embedding);
  const char* op = "embedding_backward";
  expect_on_device(tokens, op, "tokens");
  expect_dtype(tokens, DType::I32, op, "tokens");
  expect_on_device(dwte, op, "dwte");
  expect_dtype(dwte, DType::F32, op, "dwte");
  TRIPOD_CHECK(dwte.dim() == 2, "{}: dwte must be (V, C), got {}", op, dwte.str());
  const int64_t N = tokens.numel(), V = dwte.size(0), C = dwte.size(1);
  expect(dout, DType::BF16, N * C, op, "dout");
  if (dwpe.defined()) {
    expect_on_device(dwpe, op, "dwpe");
    expect_dtype(dwpe, DType::F32, op, "dwpe");
    TRIPOD_CHECK(dwpe.dim() == 2 && dwpe.size(1) == C && dwpe.size(0) >= T && T > 0, "{}: dwpe {} for T={}", op,
                 dwpe.str(), T);
  }
  k::embedding_backward(tokens.data<int32_t>(), N, dout.data<bf16>(), C, vocab_start, dwte.data<float>(), V,
                        dwpe.defined() ? dwpe.data<float>() : nullptr, T, compute_);
  TRIPOD_CUDA_LAUNCHED("{} tokens {} dout {} dwte {}", op, tokens.str(), dout.str(), dwte.str());
}

void CudaOps::embedding_forward_positions(const Tensor& tokens, const Tensor& wte, int64_t vocab_start,
                                          const Tensor& wpe, const Tensor& positions, Tensor& out) {
  ScopedTimer timer(*this, OpFamily::Embedding);
  const char* op = "embedding_forward_positions";
  expect_on_device(tokens, op, "tokens");
  expect_dtype(tokens, DType::I32, op, "tokens");
  expect_on_device(wte, op, "wte");
  expect_dtype(wte, DType::BF16, op, "wte");
  TRIPOD_CHECK(wte.dim() == 2 && wpe.defined(), "{}: wte must be (V, C) and wpe given, got {}", op, wte.str());
  const int64_t N = tokens.numel(), V = wte.size(0), C = wte.size(1);
  expect(out, DType::BF16, N * C, op, "out");
  expect(positions, DType::I32, N, op, "positions");
  expect_on_device(wpe, op, "wpe");
  expect_dtype(wpe, DType::BF16, op, "wpe");
  TRIPOD_CHECK(wpe.dim() == 2 && wpe.size(1) == C, "{}: wpe {} for width {}", op, wpe.str(), C);
  k::embedding_forward_positions(tokens.data<int32_t>(), N, wte.data<bf16>(), V, C, vocab_start, wpe.data<bf16>(),
                                 positions.data<int32_t>(), out.data<bf16>(), compute_);
  TRIPOD_CUDA_LAUNCHED("{} tokens {} wte {} out {}", op, tokens.str(), wte.str(), out.str());
}

void CudaOps::embedding_backward_positions(const Tensor& tokens, const Tensor& dout, int64_t vocab_start,
                                           Tensor& dwte, Tensor& dwpe, const Tensor& positions) {
  ScopedTimer timer(*this, OpFamily::Embedding);
  const char* op = "embedding_backward_positions";
  expect_on_device(tokens, op, "tokens");
  expect_dtype(tokens, DType::I32, op, "tokens");
  expect_on_device(dwte, op, "dwte");
  expect_dtype(dwte, DType::F32, op, "dwte");
  TRIPOD_CHECK(dwte.dim() == 2, "{}: dwte must be (V, C), got {}", op, dwte.str());
  const int64_t N = tokens.numel(), V = dwte.size(0), C = dwte.size(1);
  expect(dout, DType::BF16, N * C, op, "dout");
  if (dwpe.defined()) {
    expect_on_device(dwpe, op, "dwpe");
    expect_dtype(dwpe, DType::F32, op, "dwpe");
    expect(positions, DType::I32, N, op, "positions");
    TRIPOD_CHECK(dwpe.dim() == 2 && dwpe.size(1) == C, "{}: dwpe {} for width {}", op, dwpe.str(), C);
  }
  k::embedding_backward_positions(tokens.data<int32_t>(), N, dout.data<bf16>(), C, vocab_start, dwte.data<float>(), V,
                                  dwpe.defined() ? dwpe.data<float>() : nullptr,
                                  dwpe.defined() ? positions.data<int32_t>() : nullptr, compute_);
  TRIPOD_CUDA_LAUNCHED("{} tokens {} dout {} dwte {}", op, tokens.str(), dout.str(), dwte.str());
}

void CudaOps::layernorm_forward(const Tensor& x, const Tensor& w, const Tensor& b, float eps, Tensor& y,
                                Tensor& mean, Tensor& rstd) {
  ScopedTimer timer(*this, OpFamily::LayerNorm);
  const char* op = "layernorm_forward";
  const int64_t C = w.numel(), N = norm_rows(x, w, op);
  expect(x, DType::BF16, N * C, op, "x");
  expect(w, DType::BF16, C, op, "w");
  expect(b, DType::BF16, C, op, "b");
  expect(y, DType::BF16, N * C, op, "y");
  expect(mean, DType::F32, N, op, "mean");
  expect(rstd, DType::F32, N, op, "rstd");
  k::layernorm_forward(x.data<bf16>(), w.data<bf16>(), b.data<bf16>(), y.data<bf16>(), mean.data<float>(),
                       rstd.data<float>(), N, C, eps, compute_);
  TRIPOD_CUDA_LAUNCHED("{} x {} y {}", op, x.str(), y.str());
}

void CudaOps::layernorm_backward(const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& mean,
                                 const Tensor& rstd, Tensor& dx, Tensor& dw, Tensor& db) {
  ScopedTimer timer(*this, OpFamily::LayerNorm);
  const char* op = "layernorm_backward";
  const int64_t C = w.numel(), N = norm_rows(x, w, op);
  expect(dy, DType::BF16, N * C, op, "dy");
  expect(x, DType::BF16, N * C, op, "x");
  expect(w, DType::BF16, C, op, "w");
  expect(mean, DType::F32, N, op, "mean");
  expect(rstd, DType::F32, N, op, "rstd");
  // Either half may be skipped (a split backward): dx undefined, or dw and db undefined.
  TRIPOD_CHECK(dw.defined() == db.defined(), "{}: dw and db go together (dw {} db {})", op, dw.str(), db.str());
  if (dx.defined()) expect(dx, DType::BF16, N * C, op, "dx");
  if (dw.defined()) {
    expect(dw, DType::F32, C, op, "dw");
    expect(db, DType::F32, C, op, "db");
  }
  Tensor scratch =
      dw.defined() ? empty({k::column_partial_rows(N), 2, C}, DType::F32, MemCategory::Workspace) : Tensor{};
  k::layernorm_backward(dy.data<bf16>(), x.data<bf16>(), w.data<bf16>(), mean.data<float>(), rstd.data<float>(),
                        dx.defined() ? dx.data<bf16>() : nullptr, dw.defined() ? dw.data<float>() : nullptr,
                        db.defined() ? db.data<float>() : nullptr, N, C,
                        dw.defined() ? scratch.data<float>() : nullptr, compute_);
  TRIPOD_CUDA_LAUNCHED("{} dy {} x {} dx {}", op, dy.str(), x.str(), dx.str());
}

void CudaOps::rmsnorm_forward(const Tensor& x, const Tensor& w, float eps, Tensor& y, Tensor& rstd) {
  ScopedTimer timer(*this, OpFamily::LayerNorm);
  const char* op = "rmsnorm_forward";
  const int64_t C = w.numel(), N = norm_rows(x, w, op);
  expect(x, DType::BF16, N * C, op, "x");
  expect(w, DType::BF16, C, op, "w");
  expect(y, DType::BF16, N * C, op, "y");
  expect(rstd, DType::F32, N, op, "rstd");
  k::rmsnorm_forward(x.data<bf16>(), w.data<bf16>(), y.data<bf16>(), rstd.data<float>(), N, C, eps, compute_);
  TRIPOD_CUDA_LAUNCHED("{} x {} y {}", op, x.str(), y.str());
}

void CudaOps::rmsnorm_backward(const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& rstd, Tensor& dx,
                               Tensor& dw) {
  ScopedTimer timer(*this, OpFamily::LayerNorm);
  const char* op = "rmsnorm_backward";
  const int64_t C = w.numel(), N = norm_rows(x, w, op);
  expect(dy, DType::BF16, N * C, op, "dy");
  expect(x, DType::BF16, N * C, op, "x");
  expect(w, DType::BF16, C, op, "w");
  expect(rstd, DType::F32, N, op, "rstd");
  // Either half may be skipped (a split backward): dx or dw undefined.
  if (dx.defined()) expect(dx, DType::BF16, N * C, op, "dx");
  if (dw.defined()) expect(dw, DType::F32, C, op, "dw");
  Tensor scratch = dw.defined() ? empty({k::column_partial_rows(N) * 2 * C + C}, DType::F32, MemCategory::Workspace)
                                : Tensor{};
  float* sums = dw.defined() ? scratch.data<float>() : nullptr;
  k::rmsnorm_backward(dy.data<bf16>(), x.data<bf16>(), w.data<bf16>(), rstd.data<float>(),
                      dx.defined() ? dx.data<bf16>() : nullptr, dw.defined() ? dw.data<float>() : nullptr,
                      sums ? sums + k::column_partial_rows(N) * 2 * C : nullptr, N, C, sums, compute_);
  TRIPOD_CUDA_LAUNCHED("{} dy {} x {} dx {}", op, dy.str(), x.str(), dx.str());
}

void CudaOps::rope(Tensor& x, int64_t rot_heads, int64_t T, int64_t pos0, double theta, bool inverse) {
  ScopedTimer timer(*this, OpFamily::Attention);
  const char* op = "rope";
  TRIPOD_CHECK(x.dim() == 3 && x.size(2) % 2 == 0 && rot_heads <= x.size(1) && T >= 1 && x.size(0) % T == 0,
               "{}: x {} must be (N, heads, D) with D even, N a multiple of T = {}, rot_heads {}", op, x.str(), T,
               rot_heads);
  expect(x, DType::BF16, x.numel(), op, "x");
  k::rope(x.data<bf16>(), x.size(0), x.size(1), x.size(2), rot_heads, T, pos0, theta, inverse, compute_);
  TRIPOD_CUDA_LAUNCHED("{} x {} pos0 {}", op, x.str(), pos0);
}

void CudaOps::rope_positions(Tensor& x, int64_t rot_heads, const Tensor& positions, double theta, bool inverse) {
  ScopedTimer timer(*this, OpFamily::Attention);
  const char* op = "rope_positions";
  TRIPOD_CHECK(x.dim() == 3 && x.size(2) % 2 == 0 && rot_heads <= x.size(1),
               "{}: x {} must be (N, heads, D) with D even, rot_heads {}", op, x.str(), rot_heads);
  expect(x, DType::BF16, x.numel(), op, "x");
  expect(positions, DType::I32, x.size(0), op, "positions");
  k::rope_positions(x.data<bf16>(), x.size(0), x.size(1), x.size(2), rot_heads, positions.data<int32_t>(), theta,
                    inverse, compute_);
  TRIPOD_CUDA_LAUNCHED("{} x {} (positions)", op, x.str());
}

void CudaOps::swiglu_forward(const Tensor& gu, Tensor& y) {
  ScopedTimer timer(*this, OpFamily::Gelu);
  const int64_t F = y.size(-1), N = y.numel() / F;
  expect(gu, DType::BF16, 2 * N * F, "swiglu_forward", "gu");
  expect(y, DType::BF16, N * F, "swiglu_forward", "y");
  k::swiglu_forward(gu.data<bf16>(), y.data<bf16>(), N, F, compute_);
  TRIPOD_CUDA_LAUNCHED("swiglu_forward gu {} y {}", gu.str(), y.str());
}

void CudaOps::swiglu_backward(const Tensor& gu, const Tensor& dy, Tensor& dgu) {
  ScopedTimer timer(*this, OpFamily::Gelu);
  const int64_t F = dy.size(-1), N = dy.numel() / F;
  expect(gu, DType::BF16, 2 * N * F, "swiglu_backward", "gu");
  expect(dy, DType::BF16, N * F, "swiglu_backward", "dy");
  expect(dgu, DType::BF16, 2 * N * F, "swiglu_backward", "dgu");
  k::swiglu_backward(gu.data<bf16>(), dy.data<bf16>(), dgu.data<bf16>(), N, F, compute_);
  TRIPOD_CUDA_LAUNCHED("swiglu_backward gu {} dy {} dgu {}", gu.str(), dy.str(), dgu.str());
}

void CudaOps::gelu_forward(const Tensor& x, Tensor& y) {
  ScopedTimer timer(*this, OpFamily::Gelu);
  expect(x, DType::BF16, x.numel(), "gelu_forward", "x");
  expect(y, DType::BF16, x.numel(), "gelu_forward", "y");
  k::gelu_forward(x.data<bf16>(), y.data<bf16>(), x.numel(), compute_);
  TRIPOD_CUDA_LAUNCHED("gelu_forward x {} y {}", x.str(), y.str());
}

void CudaOps::gelu_backward(const Tensor& x, const Tensor& dy, Tensor& dx) {
  ScopedTimer timer(*this, OpFamily::Gelu);
  expect(x, DType::BF16, x.numel(), "gelu_backward", "x");
  expect(dy, DType::BF16, x.numel(), "gelu_backward", "dy");
  expect(dx, DType::BF16, x.numel(), "gelu_backward", "dx");
  k::gelu_backward(x.data<bf16>(), dy.data<bf16>(), dx.data<bf16>(), x.numel(), compute_);
  TRIPOD_CUDA_LAUNCHED("gelu_backward x {} dy {} dx {}", x.str(), dy.str(), dx.str());
}

void CudaOps::xent_stats(const Tensor& logits, const Tensor& targets, int64_t vocab_start, int64_t valid,
                         Tensor& stats) {
  ScopedTimer timer(*this, OpFamily::Xent);
  const char* op = "xent_stats";
  expect_on_device(targets, op, "targets");
  expect_dtype(targets, DType::I32, op, "targets");
  const int64_t N = targets.numel();
  TRIPOD_CHECK(N > 0 && logits.numel() % N == 0, "{}: logits {} for {} targets", op, logits.str(), N);
  const int64_t V = logits.numel() / N;
  expect(logits, DType::BF16, N * V, op, "logits");
  expect(stats, DType::F32, 3 * N, op, "stats");
  TRIPOD_CHECK(0 <= valid && valid <= V, "{}: valid {} of {} columns", op, valid, V);
  k::xent_stats(logits.data<bf16>(), N, V, targets.data<int32_t>(), vocab_start, valid, stats.data<float>(),
                compute_);
  TRIPOD_CUDA_LAUNCHED("{} logits {} valid {}", op, logits.str(), valid);
}

void CudaOps::xent_combine(const Tensor& parts, Tensor& lse, Tensor& loss) {
  ScopedTimer timer(*this, OpFamily::Xent);
  const char* op = "xent_combine";
  TRIPOD_CHECK(parts.dim() == 3 && parts.size(2) == 3, "{}: parts must be (P, N, 3), got {}", op, parts.str());
  const int64_t P = parts.size(0), N = parts.size(1);
  expect(parts, DType::F32, P * N * 3, op, "parts");
  expect(lse, DType::F32, N, op, "lse");
  expect(loss, DType::F32, N, op, "loss");
  k::xent_combine(parts.data<float>(), P, N, lse.data<float>(), loss.data<float>(), compute_);
  TRIPOD_CUDA_LAUNCHED("{} parts {}", op, parts.str());
}

void CudaOps::xent_backward(Tensor& logits, const Tensor& targets, int64_t vocab_start, int64_t valid,
                            const Tensor& lse, float scale) {
  ScopedTimer timer(*this, OpFamily::Xent);
  const char* op = "xent_backward";
  expect_on_device(targets, op, "targets");
  expect_dtype(targets, DType::I32, op, "targets");
  const int64_t N = targets.numel();
  TRIPOD_CHECK(N > 0 && logits.numel() % N == 0, "{}: logits {} for {} targets", op, logits.str(), N);
  const int64_t V = logits.numel() / N;
  expect(logits, DType::BF16, N * V, op, "logits");
  expect(lse, DType::F32, N, op, "lse");
  TRIPOD_CHECK(0 <= valid && valid <= V, "{}: valid {} of {} columns", op, valid, V);
  k::xent_backward(logits.data<bf16>(), N, V, targets.data<int32_t>(), vocab_start, valid, lse.data<float>(), scale,
                   compute_);
  TRIPOD_CUDA_LAUNCHED("{} logits {} valid {}", op, logits.str(), valid);
}

void CudaOps::adamw(Tensor& master, const Tensor& grads, Tensor& m, Tensor& v, std::span<const FlatRange> ranges,
                    const AdamWHyper& h, Tensor& compute_copy) {
  ScopedTimer timer(*this, OpFamily::Optimizer);
  const char* op = "adamw";
  const int64_t n = master.numel();
  expect(master, DType::F32, n, op, "master");
  expect(grads, DType::F32, n, op, "grads");
  expect(m, DType::F32, n, op, "m");
  expect(v, DType::F32, n, op, "v");
  if (compute_copy.defined()) expect(compute_copy, DType::BF16, n, op, "compute_copy");
  for (const FlatRange& r : ranges)
    TRIPOD_CHECK(0 <= r.begin && r.begin <= r.end && r.end <= n, "{}: range [{}, {}) of {} elements", op, r.begin,
                 r.end, n);
  const k::Chunk* table = nullptr;
  const int nchunks = chunk_table(ranges, &table);
  // The bias corrections exactly as the CPU backend computes them.
  const k::AdamWArgs a{.lr = h.lr, .beta1 = h.beta1, .beta2 = h.beta2, .eps = h.eps, .weight_decay = h.weight_decay,
                       .grad_scale = h.grad_scale,
                       .bias_corr1 = 1.0f - std::pow(h.beta1, static_cast<float>(h.step)),
                       .bias_corr2 = 1.0f - std::pow(h.beta2, static_cast<float>(h.step))};
  k::adamw(master.data<float>(), grads.data<float>(), m.data<float>(), v.data<float>(),
           compute_copy.defined() ? compute_copy.data<bf16>() : nullptr, table, nchunks, a, compute_);
  TRIPOD_CUDA_LAUNCHED("{} over {} elements in {} ranges", op, n, ranges.size());
}

}  // namespace tripod::cuda
