// Causal self-attention on the CPU: per (batch, head) sgemm for QK^T and PV, softmax between.
//
// qkv (B, T, 3, H, D): for token t of batch b, q of head h starts at ((b*T + t)*3 + 0)*H*D + h*D,
// k at ((b*T + t)*3 + 1)*H*D + h*D, v at ((b*T + t)*3 + 2)*H*D + h*D, so the rows of one head's Q
// are 3*H*D floats apart (the sgemm leading dimension). out (B, T, H, D): rows H*D apart.
#include <cblas.h>
#include <omp.h>

#include "kernels/cpu/cpu_ops.h"

namespace tripod::cpu {

namespace {

struct Dims {
  int64_t B, T, H, D;
};

Dims dims_of(const Tensor& qkv) {
  TRIPOD_CHECK(qkv.dim() == 5 && qkv.size(2) == 3, "attention qkv must be (B, T, 3, H, D), got {}", qkv.str());
  return {qkv.size(0), qkv.size(1), qkv.size(3), qkv.size(4)};
}

// S (T, T) holds scale * Q K^T of one (b, h); in place it becomes P = softmax over j <= t.
// With saved_lse, P = exp(S - lse) reuses the forward's statistics; otherwise lse[t] is written.
void causal_softmax(float* S, int64_t T, const float* saved_lse, float* lse) {
  for (int64_t t = 0; t < T; ++t) {
    float* row = S + t * T;
    float l;
    if (saved_lse) {
      l = saved_lse[t];
    } else {
      float m = -INFINITY;
#pragma omp simd reduction(max : m)
      for (int64_t j = 0; j <= t; ++j) m = std::max(m, row[j]);
      float s = 0;
#pragma omp simd reduction(+ : s)
      for (int64_t j = 0; j <= t; ++j) s += fast_exp(row[j] - m);
      l = m + std::log(s);
      lse[t] = l;
    }
    for (int64_t j = 0; j <= t; ++j) row[j] = fast_exp(row[j] - l);
    for (int64_t j = t + 1; j < T; ++j) row[j] = 0.f;
  }
}

}  // namespace

void CpuOps::attention_forward(const Tensor& qkv, Tensor& out, Tensor& lse, Tensor& probs) {
  // Plain variables, not a structured binding: clang before 16 cannot use those in OpenMP regions.
  const Dims dims = dims_of(qkv);
  const int64_t B = dims.B, T = dims.T, H = dims.H, D = dims.D;
  TRIPOD_CHECK(out.numel() == B * T * H * D && lse.numel() == B * H * T, "attention out {} lse {}", out.str(),
               lse.str());
  TRIPOD_CHECK(!probs.defined() || probs.numel() == B * H * T * T, "attention probs {}", probs.str());
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  const int64_t ld_qkv = 3 * H * D, ld_out = H * D;
  const float* pqkv = qkv.data<float>();
  float* pout = out.data<float>();
  float* plse = lse.data<float>();
  float* pprobs = probs.defined() ? probs.data<float>() : nullptr;
  Tensor scratch;
  if (!pprobs) scratch = empty({omp_get_max_threads(), T, T}, DType::F32, MemCategory::Workspace);
#pragma omp parallel for schedule(static)
  for (int64_t bh = 0; bh < B * H; ++bh) {
    int64_t b = bh / H, h = bh % H;
    const float* q = pqkv + b * T * ld_qkv + 0 * H * D + h * D;
    const float* k = pqkv + b * T * ld_qkv + 1 * H * D + h * D;
    const float* v = pqkv + b * T * ld_qkv + 2 * H * D + h * D;
    float* S = pprobs ? pprobs + bh * T * T : scratch.data<float>() + omp_get_thread_num() * T * T;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, T, D, scale, q, ld_qkv, k, ld_qkv, 0.f, S, T);
    causal_softmax(S, T, nullptr, plse + bh * T);
    float* o = pout + b * T * ld_out + h * D;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, T, D, T, 1.f, S, T, v, ld_qkv, 0.f, o, ld_out);
  }
}

void CpuOps::attention_backward(const Tensor& dout, const Tensor& qkv, const Tensor& out, const Tensor& lse,
                                const Tensor& probs, Tensor& dqkv) {
  // Plain variables, not a structured binding: clang before 16 cannot use those in OpenMP regions.
  const Dims dims = dims_of(qkv);
  const int64_t B = dims.B, T = dims.T, H = dims.H, D = dims.D;
  TRIPOD_CHECK(dqkv.numel() == qkv.numel() && dout.numel() == out.numel(), "attention backward dqkv {} dout {}",
               dqkv.str(), dout.str());
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  const int64_t ld_qkv = 3 * H * D, ld_out = H * D;
  const float* pqkv = qkv.data<float>();
  const float* pdout = dout.data<float>();
  const float* plse = lse.data<float>();
  const float* pprobs = probs.defined() ? probs.data<float>() : nullptr;
  float* pdqkv = dqkv.data<float>();
  const int nthreads = omp_get_max_threads();
  // Per thread: P (recomputed when not saved) and dP/dS.
  Tensor scratch = empty({nthreads, 2, T, T}, DType::F32, MemCategory::Workspace);
#pragma omp parallel for schedule(static)
  for (int64_t bh = 0; bh < B * H; ++bh) {
    int64_t b = bh / H, h = bh % H;
    const int64_t base = b * T * ld_qkv + h * D;
    const float* q = pqkv + base;
    const float* k = pqkv + base + H * D;
    const float* v = pqkv + base + 2 * H * D;
    float* dq = pdqkv + base;
    float* dk = pdqkv + base + H * D;
    float* dv = pdqkv + base + 2 * H * D;
    const float* dO = pdout + b * T * ld_out + h * D;
    float* mine = scratch.data<float>() + omp_get_thread_num() * 2 * T * T;
    float* dS = mine + T * T;
    const float* P;
    if (pprobs) {
      P = pprobs + bh * T * T;
    } else {
      float* S = mine;
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, T, D, scale, q, ld_qkv, k, ld_qkv, 0.f, S, T);
      causal_softmax(S, T, plse + bh * T, nullptr);
      P = S;
    }
    // dV (T, D) = P^T dO
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, T, D, T, 1.f, P, T, dO, ld_out, 0.f, dv, ld_qkv);
    // dP (T, T) = dO V^T
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, T, D, 1.f, dO, ld_out, v, ld_qkv, 0.f, dS, T);
    // dS = P * (dP - sum_j P dP)
    for (int64_t t = 0; t < T; ++t) {
      const float* pr = P + t * T;
      float* dr = dS + t * T;
      float dot = 0;
#pragma omp simd reduction(+ : dot)
      for (int64_t j = 0; j <= t; ++j) dot += pr[j] * dr[j];
      for (int64_t j = 0; j <= t; ++j) dr[j] = pr[j] * (dr[j] - dot);
      for (int64_t j = t + 1; j < T; ++j) dr[j] = 0.f;
    }
    // dQ = scale dS K ; dK = scale dS^T Q
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, T, D, T, scale, dS, T, k, ld_qkv, 0.f, dq, ld_qkv);
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, T, D, T, scale, dS, T, q, ld_qkv, 0.f, dk, ld_qkv);
  }
}

}  // namespace tripod::cpu

namespace tripod::cpu {

// Cache layout (B, H, T_max, D): k of head h, position p of batch b at ((b*H + h)*T_max + p)*D,
// so one head's keys are contiguous rows and a query's scores are a matrix-vector product.
// Example: H = 2, T_max = 8, D = 4: batch 0, head 1, position 3 starts at (1*8 + 3)*4 = 44.
void CpuOps::attention_decode(const Tensor& qkv, Tensor& k_cache, Tensor& v_cache, int64_t pos, Tensor& out) {
  const Dims dims = dims_of(qkv);
  const int64_t B = dims.B, n = dims.T, H = dims.H, D = dims.D;
  TRIPOD_CHECK(k_cache.dim() == 4 && k_cache.size(0) == B && k_cache.size(1) == H && k_cache.size(3) == D &&
                   v_cache.shape() == k_cache.shape(),
               "attention_decode: caches {} and {} must be (B, H, T_max, D) = ({}, {}, T_max, {})", k_cache.str(),
               v_cache.str(), B, H, D);
  const int64_t Tmax = k_cache.size(2);
  TRIPOD_CHECK(pos >= 0 && pos + n <= Tmax, "attention_decode: positions [{}, {}) beyond the cache's {}", pos, pos + n,
               Tmax);
  TRIPOD_CHECK(out.numel() == B * n * H * D, "attention_decode: out {} for qkv {}", out.str(), qkv.str());
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  const int64_t ld_qkv = 3 * H * D, ld_out = H * D;
  const float* pqkv = qkv.data<float>();
  float* pk = k_cache.data<float>();
  float* pv = v_cache.data<float>();
  float* pout = out.data<float>();
  // Append the new keys and values.
#pragma omp parallel for collapse(2) schedule(static)
  for (int64_t bh = 0; bh < B * H; ++bh)
    for (int64_t t = 0; t < n; ++t) {
      const int64_t b = bh / H, h = bh % H;
      const float* src = pqkv + (b * n + t) * ld_qkv + h * D;
      std::memcpy(pk + (bh * Tmax + pos + t) * D, src + H * D, D * sizeof(float));
      std::memcpy(pv + (bh * Tmax + pos + t) * D, src + 2 * H * D, D * sizeof(float));
    }
  // Each new token against the cache up to its own position.
  Tensor scratch = empty({omp_get_max_threads(), Tmax}, DType::F32, MemCategory::Workspace);
#pragma omp parallel for collapse(2) schedule(static)
  for (int64_t bh = 0; bh < B * H; ++bh)
    for (int64_t t = 0; t < n; ++t) {
      const int64_t b = bh / H, h = bh % H, len = pos + t + 1;
      const float* q = pqkv + (b * n + t) * ld_qkv + h * D;
      const float* K = pk + bh * Tmax * D;
      const float* V = pv + bh * Tmax * D;
      float* s = scratch.data<float>() + omp_get_thread_num() * Tmax;
      float m = -INFINITY;
      for (int64_t j = 0; j < len; ++j) {
        float acc = 0;
#pragma omp simd reduction(+ : acc)
        for (int64_t d = 0; d < D; ++d) acc += q[d] * K[j * D + d];
        s[j] = acc * scale;
        m = std::max(m, s[j]);
      }
      float sum = 0;
      for (int64_t j = 0; j < len; ++j) sum += (s[j] = std::exp(s[j] - m));
      float* o = pout + (b * n + t) * ld_out + h * D;
      for (int64_t d = 0; d < D; ++d) o[d] = 0.f;
      for (int64_t j = 0; j < len; ++j) {
        const float p = s[j] / sum;
#pragma omp simd
        for (int64_t d = 0; d < D; ++d) o[d] += p * V[j * D + d];
      }
    }
}

}  // namespace tripod::cpu
