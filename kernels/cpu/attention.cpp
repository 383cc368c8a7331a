// Causal self-attention on the CPU: per (batch, head) sgemm for QK^T and PV, softmax between.
//
// qkv (B, T, H + 2 Hkv, D), W = (H + 2 Hkv) D floats per token: for token t of batch b, q of head
// h starts at (b*T + t)*W + h*D, k of key/value head j at (b*T + t)*W + (H + j)*D and v at
// (b*T + t)*W + (H + Hkv + j)*D, so the rows of one head's Q are W floats apart (the sgemm leading
// dimension). Query head h uses key/value head h / (H / Hkv). out (B, T, H, D): rows H*D apart.
#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <vector>

#include "kernels/cpu/cpu_ops.h"

namespace tripod::cpu {

namespace {

struct Dims {
  int64_t B, T, H, Hkv, D;
  int64_t ld() const { return (H + 2 * Hkv) * D; }
  int64_t group() const { return H / Hkv; }
};

// qkv (B, T, H + 2 Hkv, D) or (B, T, 3, H, D); H from `out`, which holds (B, T, H, D) elements.
Dims dims_of(const Tensor& qkv, const Tensor& out) {
  TRIPOD_CHECK((qkv.dim() == 4 || (qkv.dim() == 5 && qkv.size(2) == 3)),
               "attention qkv must be (B, T, H + 2 Hkv, D), got {}", qkv.str());
  const int64_t B = qkv.size(0), T = qkv.size(1), D = qkv.size(qkv.dim() - 1);
  const int64_t heads = qkv.numel() / (B * T * D), H = out.numel() / (B * T * D), Hkv = (heads - H) / 2;
  TRIPOD_CHECK(H >= 1 && Hkv >= 1 && H + 2 * Hkv == heads && H % Hkv == 0 && out.numel() == B * T * H * D,
               "attention qkv {} and out {}: not H + 2 Hkv heads with Hkv dividing H", qkv.str(), out.str());
  return {B, T, H, Hkv, D};
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

// Causal attention of one query head over T consecutive rows (a sequence, or one packed document):
// q, k, v rows ld_qkv apart, o rows ld_out apart, lse (T) f32; S (T, T) scratch, or the
// probabilities to keep.
void causal_head_forward(const float* q, const float* k, const float* v, int64_t ld_qkv, int64_t T, int64_t D,
                         float scale, float* S, float* lse, float* o, int64_t ld_out) {
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, T, D, scale, q, ld_qkv, k, ld_qkv, 0.f, S, T);
  causal_softmax(S, T, nullptr, lse);
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, T, D, T, 1.f, S, T, v, ld_qkv, 0.f, o, ld_out);
}

// The backward of one key/value head j over T consecutive rows starting at row `base` of qkv:
// its query heads in order add into dK, dV (the group's first head overwrites them). P comes from
// `probs` (per query head h at probs_of(h)) or is recomputed from lse (lse_of(h), T entries);
// `mine` is (2, T, T) scratch.
template <class ProbsOf, class LseOf>
void causal_group_backward(const float* pqkv, const float* pdout, float* pdqkv, int64_t base, int64_t out_base,
                           int64_t T, int64_t H, int64_t Hkv, int64_t D, int64_t j, float scale, ProbsOf probs_of,
                           LseOf lse_of, float* mine) {
  const int64_t ld_qkv = (H + 2 * Hkv) * D, ld_out = H * D, g = H / Hkv;
  const float* k = pqkv + base + (H + j) * D;
  const float* v = pqkv + base + (H + Hkv + j) * D;
  float* dk = pdqkv + base + (H + j) * D;
  float* dv = pdqkv + base + (H + Hkv + j) * D;
  float* dS = mine + T * T;
  for (int64_t h = j * g; h < (j + 1) * g; ++h) {
    const float beta = h == j * g ? 0.f : 1.f;  // the group's first head overwrites dK, dV
    const float* q = pqkv + base + h * D;
    float* dq = pdqkv + base + h * D;
    const float* dO = pdout + out_base + h * D;
    const float* P = probs_of(h);
    if (!P) {
      float* S = mine;
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, T, D, scale, q, ld_qkv, k, ld_qkv, 0.f, S, T);
      causal_softmax(S, T, lse_of(h), nullptr);
      P = S;
    }
    // dV (T, D) (+)= P^T dO
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, T, D, T, 1.f, P, T, dO, ld_out, beta, dv, ld_qkv);
    // dP (T, T) = dO V^T
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, T, D, 1.f, dO, ld_out, v, ld_qkv, 0.f, dS, T);
    // dS = P * (dP - sum_j P dP)
    for (int64_t t = 0; t < T; ++t) {
      const float* pr = P + t * T;
      float* dr = dS + t * T;
      float dot = 0;
#pragma omp simd reduction(+ : dot)
      for (int64_t i = 0; i <= t; ++i) dot += pr[i] * dr[i];
      for (int64_t i = 0; i <= t; ++i) dr[i] = pr[i] * (dr[i] - dot);
      for (int64_t i = t + 1; i < T; ++i) dr[i] = 0.f;
    }
    // dQ = scale dS K ; dK (+)= scale dS^T Q
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, T, D, T, scale, dS, T, k, ld_qkv, 0.f, dq, ld_qkv);
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, T, D, T, scale, dS, T, q, ld_qkv, beta, dk, ld_qkv);
  }
}

// The documents of DocRows, checked against the B T rows: {0 = o_0 < o_1 < ... = B T}, each inside
// one sequence. Returns the longest.
int64_t check_doc_rows(const DocRows& docs, int64_t B, int64_t T, const char* op) {
  const auto& o = docs.offsets;
  TRIPOD_CHECK(o.size() >= 2 && o.front() == 0 && o.back() == B * T, "{}: document offsets must run from 0 to B T = "
               "{}", op, B * T);
  int64_t longest = 0;
  for (size_t i = 0; i + 1 < o.size(); ++i) {
    TRIPOD_CHECK(o[i] < o[i + 1] && o[i] / T == (o[i + 1] - 1) / T, "{}: document {} = rows [{}, {}) is empty or "
                 "crosses a sequence of {}", op, i, o[i], o[i + 1], T);
    longest = std::max<int64_t>(longest, o[i + 1] - o[i]);
  }
  return longest;
}

}  // namespace

void CpuOps::attention_forward(const Tensor& qkv, Tensor& out, Tensor& lse, Tensor& probs) {
  ScopedTimer timer(*this, OpFamily::Attention);
  // Plain variables, not a structured binding: clang before 16 cannot use those in OpenMP regions.
  const Dims dm = dims_of(qkv, out);
  const int64_t B = dm.B, T = dm.T, H = dm.H, Hkv = dm.Hkv, D = dm.D;
  TRIPOD_CHECK(lse.numel() == B * H * T, "attention out {} lse {}", out.str(), lse.str());
  TRIPOD_CHECK(!probs.defined() || probs.numel() == B * H * T * T, "attention probs {}", probs.str());
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  const int64_t ld_qkv = dm.ld(), ld_out = H * D, g = dm.group();
  const float* pqkv = qkv.data<float>();
  float* pout = out.data<float>();
  float* plse = lse.data<float>();
  float* pprobs = probs.defined() ? probs.data<float>() : nullptr;
  Tensor scratch;
  if (!pprobs) scratch = empty({omp_get_max_threads(), T, T}, DType::F32, MemCategory::Workspace);
#pragma omp parallel for schedule(static)
  for (int64_t bh = 0; bh < B * H; ++bh) {
    int64_t b = bh / H, h = bh % H;
    const float* q = pqkv + b * T * ld_qkv + h * D;
    const float* k = pqkv + b * T * ld_qkv + (H + h / g) * D;
    const float* v = pqkv + b * T * ld_qkv + (H + Hkv + h / g) * D;
    float* S = pprobs ? pprobs + bh * T * T : scratch.data<float>() + omp_get_thread_num() * T * T;
    causal_head_forward(q, k, v, ld_qkv, T, D, scale, S, plse + bh * T, pout + b * T * ld_out + h * D, ld_out);
  }
}

void CpuOps::attention_backward(const Tensor& dout, const Tensor& qkv, const Tensor& out, const Tensor& lse,
                                const Tensor& probs, Tensor& dqkv) {
  ScopedTimer timer(*this, OpFamily::Attention);
  const Dims dm = dims_of(qkv, out);
  const int64_t B = dm.B, T = dm.T, H = dm.H, Hkv = dm.Hkv, D = dm.D;
  TRIPOD_CHECK(dqkv.numel() == qkv.numel() && dout.numel() == out.numel(), "attention backward dqkv {} dout {}",
               dqkv.str(), dout.str());
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  const int64_t ld_qkv = dm.ld(), ld_out = H * D;
  const float* pqkv = qkv.data<float>();
  const float* pdout = dout.data<float>();
  const float* plse = lse.data<float>();
  const float* pprobs = probs.defined() ? probs.data<float>() : nullptr;
  float* pdqkv = dqkv.data<float>();
  const int nthreads = omp_get_max_threads();
  // Per thread: P (recomputed when not saved) and dP/dS.
  Tensor scratch = empty({nthreads, 2, T, T}, DType::F32, MemCategory::Workspace);
  // One task per key/value head: its query heads in order add into its dK and dV (no races, and
  // the same sums at any thread count).
#pragma omp parallel for schedule(static)
  for (int64_t bj = 0; bj < B * Hkv; ++bj) {
    const int64_t b = bj / Hkv, j = bj % Hkv;
    causal_group_backward(
        pqkv, pdout, pdqkv, b * T * ld_qkv, b * T * ld_out, T, H, Hkv, D, j, scale,
        [&](int64_t h) { return pprobs ? pprobs + (b * H + h) * T * T : nullptr; },
        [&](int64_t h) { return plse + (b * H + h) * T; }, scratch.data<float>() + omp_get_thread_num() * 2 * T * T);
  }
}

void CpuOps::attention_forward_docs(const Tensor& qkv, const DocRows& docs, Tensor& out, Tensor& lse) {
  ScopedTimer timer(*this, OpFamily::Attention);
  const Dims dm = dims_of(qkv, out);
  const int64_t B = dm.B, T = dm.T, H = dm.H, Hkv = dm.Hkv, D = dm.D;
  TRIPOD_CHECK(lse.numel() == B * H * T, "attention out {} lse {}", out.str(), lse.str());
  const int64_t longest = check_doc_rows(docs, B, T, "attention_forward_docs");
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  const int64_t ld_qkv = dm.ld(), ld_out = H * D, g = dm.group(), ndocs = static_cast<int64_t>(docs.offsets.size()) - 1;
  const int32_t* cu = docs.offsets.data();
  const float* pqkv = qkv.data<float>();
  float* pout = out.data<float>();
  float* plse = lse.data<float>();
  Tensor scratch = empty({omp_get_max_threads(), longest, longest}, DType::F32, MemCategory::Workspace);
  // One task per (document, head), each its own causal attention over the document's rows.
#pragma omp parallel for schedule(dynamic)
  for (int64_t dh = 0; dh < ndocs * H; ++dh) {
    const int64_t d = dh / H, h = dh % H, row = cu[d], len = cu[d + 1] - row, b = row / T, t0 = row % T;
    const float* base = pqkv + row * ld_qkv;
    causal_head_forward(base + h * D, base + (H + h / g) * D, base + (H + Hkv + h / g) * D, ld_qkv, len, D, scale,
                        scratch.data<float>() + omp_get_thread_num() * longest * longest, plse + (b * H + h) * T + t0,
                        pout + row * ld_out + h * D, ld_out);
  }
}

void CpuOps::attention_backward_docs(const Tensor& dout, const Tensor& qkv, const Tensor& out, const Tensor& lse,
                                     const DocRows& docs, Tensor& dqkv) {
  ScopedTimer timer(*this, OpFamily::Attention);
  const Dims dm = dims_of(qkv, out);
  const int64_t B = dm.B, T = dm.T, H = dm.H, Hkv = dm.Hkv, D = dm.D;
  TRIPOD_CHECK(dqkv.numel() == qkv.numel() && dout.numel() == out.numel() && lse.numel() == B * H * T,
               "attention backward dqkv {} dout {} lse {}", dqkv.str(), dout.str(), lse.str());
  const int64_t longest = check_doc_rows(docs, B, T, "attention_backward_docs");
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  const int64_t ld_qkv = dm.ld(), ld_out = H * D, ndocs = static_cast<int64_t>(docs.offsets.size()) - 1;
  const int32_t* cu = docs.offsets.data();
  const float* plse = lse.data<float>();
  Tensor scratch = empty({omp_get_max_threads(), 2, longest, longest}, DType::F32, MemCategory::Workspace);
  // One task per (document, key/value head): disjoint rows of dQ, dK and dV.
#pragma omp parallel for schedule(dynamic)
  for (int64_t dj = 0; dj < ndocs * Hkv; ++dj) {
    const int64_t d = dj / Hkv, j = dj % Hkv, row = cu[d], len = cu[d + 1] - row, b = row / T, t0 = row % T;
    causal_group_backward(
        qkv.data<float>(), dout.data<float>(), dqkv.data<float>(), row * ld_qkv, row * ld_out, len, H, Hkv, D, j,
        scale, [](int64_t) { return static_cast<const float*>(nullptr); },
        [&](int64_t h) { return plse + (b * H + h) * T + t0; },
        scratch.data<float>() + omp_get_thread_num() * 2 * longest * longest);
  }
}

}  // namespace tripod::cpu

namespace tripod::cpu {

// Cache layout (B, Hkv, T_max, D): k of key/value head j, position p of batch b at
// ((b*Hkv + j)*T_max + p)*D, so one head's keys are contiguous rows and a query's scores are a
// matrix-vector product. Example: Hkv = 2, T_max = 8, D = 4: batch 0, head 1, position 3 starts
// at (1*8 + 3)*4 = 44.
void CpuOps::attention_decode(const Tensor& qkv, Tensor& k_cache, Tensor& v_cache, int64_t pos, Tensor& out) {
  ScopedTimer timer(*this, OpFamily::Attention);
  const Dims dm = dims_of(qkv, out);
  const int64_t B = dm.B, n = dm.T, H = dm.H, Hkv = dm.Hkv, D = dm.D;
  TRIPOD_CHECK(k_cache.dim() == 4 && k_cache.size(0) == B && k_cache.size(1) == Hkv && k_cache.size(3) == D &&
                   v_cache.shape() == k_cache.shape(),
               "attention_decode: caches {} and {} must be (B, Hkv, T_max, D) = ({}, {}, T_max, {})", k_cache.str(),
               v_cache.str(), B, Hkv, D);
  const int64_t Tmax = k_cache.size(2);
  TRIPOD_CHECK(pos >= 0 && pos + n <= Tmax, "attention_decode: positions [{}, {}) beyond the cache's {}", pos, pos + n,
               Tmax);
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  const int64_t ld_qkv = dm.ld(), ld_out = H * D, g = dm.group();
  const float* pqkv = qkv.data<float>();
  float* pk = k_cache.data<float>();
  float* pv = v_cache.data<float>();
  float* pout = out.data<float>();
  // Append the new keys and values.
#pragma omp parallel for collapse(2) schedule(static)
  for (int64_t bj = 0; bj < B * Hkv; ++bj)
    for (int64_t t = 0; t < n; ++t) {
      const int64_t b = bj / Hkv, j = bj % Hkv;
      const float* src = pqkv + (b * n + t) * ld_qkv;
      std::memcpy(pk + (bj * Tmax + pos + t) * D, src + (H + j) * D, D * sizeof(float));
      std::memcpy(pv + (bj * Tmax + pos + t) * D, src + (H + Hkv + j) * D, D * sizeof(float));
    }
  // Each new token against the cache up to its own position.
  Tensor scratch = empty({omp_get_max_threads(), Tmax}, DType::F32, MemCategory::Workspace);
#pragma omp parallel for collapse(2) schedule(static)
  for (int64_t bh = 0; bh < B * H; ++bh)
    for (int64_t t = 0; t < n; ++t) {
      const int64_t b = bh / H, h = bh % H, len = pos + t + 1, bj = b * Hkv + h / g;
      const float* q = pqkv + (b * n + t) * ld_qkv + h * D;
      const float* K = pk + bj * Tmax * D;
      const float* V = pv + bj * Tmax * D;
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

// ---- one block of context-parallel attention -------------------------------------------------
// q (B, Tq, Wq, D) rows Wq*D floats apart (query head h at h*D), kv (B, Tk, 2 Hkv, D) rows 2 Hkv D
// apart (key head j at j*D, value head j at (Hkv + j)*D), out (B, Tq, H, D), lse (B, H, Tq).

namespace tripod::cpu {

namespace {

struct BlockDims {
  int64_t B, Tq, Tk, Wq, H, Hkv, D;
  int64_t group() const { return H / Hkv; }
};

BlockDims block_dims(const Tensor& q, const Tensor& kv, const Tensor& out, const Tensor& lse, bool causal,
                     const char* op) {
  TRIPOD_CHECK(q.dim() == 4 && kv.dim() == 4 && out.dim() == 4, "{}: q {}, kv {} and out {} must be 4-d", op, q.str(),
               kv.str(), out.str());
  BlockDims d{q.size(0), q.size(1), kv.size(1), q.size(2), out.size(2), kv.size(2) / 2, q.size(3)};
  TRIPOD_CHECK(kv.size(0) == d.B && kv.size(3) == d.D && kv.size(2) % 2 == 0 && d.Hkv >= 1 && d.H % d.Hkv == 0 &&
                   d.Wq >= d.H && out.size(0) == d.B && out.size(1) == d.Tq && out.size(3) == d.D &&
                   lse.numel() == d.B * d.H * d.Tq && (!causal || d.Tq == d.Tk),
               "{}: q {}, kv {}, out {}, lse {}{}: not (B, Tq, >=H, D), (B, Tk, 2 Hkv, D), (B, Tq, H, D), (B, H, Tq)",
               op, q.str(), kv.str(), out.str(), lse.str(), causal ? " (causal: Tq = Tk)" : "");
  return d;
}

// ---- blocks under a document mask ----------------------------------------------------------------
// A query sees the keys from its document's start on (BlockDocs), and causally on a diagonal
// block. Queries in a row whose documents start at the same place form a run [r0, r1) that sees
// the same first key lo: each run is one GEMM over keys [lo, hi), hi = Tk, or r1 on a diagonal
// block (its row t sees keys lo..t). Only the visible part of the block is computed.
struct Run {
  int64_t r0, r1, lo, hi;
};

std::vector<Run> block_runs(const int32_t* start, int64_t Tq, int64_t Tk, int64_t key_pos, bool causal) {
  std::vector<Run> runs;
  for (int64_t r0 = 0; r0 < Tq;) {
    int64_t r1 = r0 + 1;
    while (r1 < Tq && start[r1] == start[r0]) ++r1;
    const int64_t lo = std::clamp<int64_t>(start[r0] - key_pos, 0, Tk), hi = causal ? r1 : Tk;
    TRIPOD_CHECK(!causal || lo <= r0, "a document starting after its query: start {} of row {}, keys from {}",
                 start[r0], r0, key_pos);
    if (lo < hi) runs.push_back({r0, r1, lo, hi});
    r0 = r1;
  }
  return runs;
}

void block_forward_docs(Ops& ops, const Tensor& q, const Tensor& kv, bool causal, const BlockDocs& docs,
                        const BlockDims& d, Tensor& out, Tensor& lse) {
  const int64_t B = d.B, Tq = d.Tq, Tk = d.Tk, H = d.H, Hkv = d.Hkv, D = d.D, g = d.group();
  TRIPOD_CHECK(docs.start.dtype() == DType::I32 && docs.start.numel() == B * Tq, "attention_block_forward: document "
               "starts {} for {} x {} queries", docs.start.str(), B, Tq);
  const int64_t ldq = d.Wq * D, ldkv = 2 * Hkv * D, ldo = H * D, per = Tq * Tk + Tq * D + Tq;
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  const float* pq = q.data<float>();
  const float* pkv = kv.data<float>();
  float* pout = out.data<float>();
  float* plse = lse.data<float>();
  std::vector<std::vector<Run>> runs(B);
  for (int64_t b = 0; b < B; ++b) runs[b] = block_runs(docs.start.data<int32_t>() + b * Tq, Tq, Tk, docs.key_pos, causal);
  Tensor scratch = ops.empty({omp_get_max_threads(), per}, DType::F32, MemCategory::Workspace);
#pragma omp parallel for schedule(dynamic)
  for (int64_t bh = 0; bh < B * H; ++bh) {
    const int64_t b = bh / H, h = bh % H;
    float* S = scratch.data<float>() + omp_get_thread_num() * per;
    float* O = S + Tq * Tk;
    float* L = O + Tq * D;
    for (const Run& run : runs[b]) {
      const int64_t rows = run.r1 - run.r0, cols = run.hi - run.lo;
      const float* qh = pq + (b * Tq + run.r0) * ldq + h * D;
      const float* k = pkv + (b * Tk + run.lo) * ldkv + (h / g) * D;
      const float* v = pkv + (b * Tk + run.lo) * ldkv + (Hkv + h / g) * D;
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, cols, D, scale, qh, ldq, k, ldkv, 0.f, S, cols);
      for (int64_t i = 0; i < rows; ++i) {
        float* row = S + i * cols;
        const int64_t n = causal ? run.r0 + i + 1 - run.lo : cols;  // visible keys of row r0 + i
        float m = -INFINITY;
#pragma omp simd reduction(max : m)
        for (int64_t j = 0; j < n; ++j) m = std::max(m, row[j]);
        float s = 0;
#pragma omp simd reduction(+ : s)
        for (int64_t j = 0; j < n; ++j) s += fast_exp(row[j] - m);
        L[i] = m + std::log(s);
        for (int64_t j = 0; j < n; ++j) row[j] = fast_exp(row[j] - L[i]);
        for (int64_t j = n; j < cols; ++j) row[j] = 0.f;
      }
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, rows, D, cols, 1.f, S, cols, v, ldkv, 0.f, O, D);
      for (int64_t i = 0; i < rows; ++i) {
        const int64_t t = run.r0 + i;
        float* o = pout + (b * Tq + t) * ldo + h * D;
        float& l_old = plse[bh * Tq + t];
        if (l_old == -INFINITY) {
          std::memcpy(o, O + i * D, D * sizeof(float));
          l_old = L[i];
          continue;
        }
        const float l_new = std::max(l_old, L[i]) + std::log1p(std::exp(-std::abs(l_old - L[i])));
        const float w_old = std::exp(l_old - l_new), w_new = std::exp(L[i] - l_new);
        for (int64_t x = 0; x < D; ++x) o[x] = w_old * o[x] + w_new * O[i * D + x];
        l_old = l_new;
      }
    }
  }
}

void block_backward_docs(Ops& ops, const Tensor& dout, const Tensor& q, const Tensor& kv, const Tensor& out,
                         const Tensor& lse, bool causal, const BlockDocs& docs, const BlockDims& d, Tensor& dq,
                         Tensor& dkv) {
  const int64_t B = d.B, Tq = d.Tq, Tk = d.Tk, H = d.H, Hkv = d.Hkv, D = d.D, g = d.group();
  TRIPOD_CHECK(docs.start.dtype() == DType::I32 && docs.start.numel() == B * Tq, "attention_block_backward: document "
               "starts {} for {} x {} queries", docs.start.str(), B, Tq);
  const int64_t ldq = d.Wq * D, ldkv = 2 * Hkv * D, ldo = H * D, per = 2 * Tq * Tk + Tq;
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  const float* pq = q.data<float>();
  const float* pkv = kv.data<float>();
  const float* pout = out.data<float>();
  const float* pdout = dout.data<float>();
  const float* plse = lse.data<float>();
  float* pdq = dq.data<float>();
  float* pdkv = dkv.data<float>();
  std::vector<std::vector<Run>> runs(B);
  for (int64_t b = 0; b < B; ++b) runs[b] = block_runs(docs.start.data<int32_t>() + b * Tq, Tq, Tk, docs.key_pos, causal);
  Tensor scratch = ops.empty({omp_get_max_threads(), per}, DType::F32, MemCategory::Workspace);
  // One task per key/value head, its query heads and runs in order (no races, any thread count the same).
#pragma omp parallel for schedule(dynamic)
  for (int64_t bj = 0; bj < B * Hkv; ++bj) {
    const int64_t b = bj / Hkv, j = bj % Hkv;
    float* P = scratch.data<float>() + omp_get_thread_num() * per;
    float* dS = P + Tq * Tk;
    float* delta = dS + Tq * Tk;
    for (int64_t h = j * g; h < (j + 1) * g; ++h) {
      const int64_t bh = b * H + h;
      for (const Run& run : runs[b]) {
        const int64_t rows = run.r1 - run.r0, cols = run.hi - run.lo;
        const float* qh = pq + (b * Tq + run.r0) * ldq + h * D;
        float* dqh = pdq + (b * Tq + run.r0) * ldq + h * D;
        const float* dO = pdout + (b * Tq + run.r0) * ldo + h * D;
        const float* O = pout + (b * Tq + run.r0) * ldo + h * D;
        const float* k = pkv + (b * Tk + run.lo) * ldkv + j * D;
        const float* v = pkv + (b * Tk + run.lo) * ldkv + (Hkv + j) * D;
        float* dk = pdkv + (b * Tk + run.lo) * ldkv + j * D;
        float* dv = pdkv + (b * Tk + run.lo) * ldkv + (Hkv + j) * D;
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, cols, D, scale, qh, ldq, k, ldkv, 0.f, P, cols);
        for (int64_t i = 0; i < rows; ++i) {
          float* row = P + i * cols;
          const int64_t n = causal ? run.r0 + i + 1 - run.lo : cols;
          const float l = plse[bh * Tq + run.r0 + i];
          for (int64_t x = 0; x < n; ++x) row[x] = fast_exp(row[x] - l);
          for (int64_t x = n; x < cols; ++x) row[x] = 0.f;
          float dot = 0;
#pragma omp simd reduction(+ : dot)
          for (int64_t x = 0; x < D; ++x) dot += dO[i * ldo + x] * O[i * ldo + x];
          delta[i] = dot;
        }
        // dV += P^T dO; dP = dO V^T; dS = P (dP - delta); dQ += scale dS K; dK += scale dS^T Q.
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, cols, D, rows, 1.f, P, cols, dO, ldo, 1.f, dv, ldkv);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, cols, D, 1.f, dO, ldo, v, ldkv, 0.f, dS, cols);
        for (int64_t i = 0; i < rows; ++i) {
          const float* pr = P + i * cols;
          float* dr = dS + i * cols;
          const int64_t n = causal ? run.r0 + i + 1 - run.lo : cols;
          for (int64_t x = 0; x < n; ++x) dr[x] = pr[x] * (dr[x] - delta[i]);
          for (int64_t x = n; x < cols; ++x) dr[x] = 0.f;
        }
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, rows, D, cols, scale, dS, cols, k, ldkv, 1.f, dqh, ldq);
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, cols, D, rows, scale, dS, cols, qh, ldq, 1.f, dk, ldkv);
      }
    }
  }
}

}  // namespace

void CpuOps::attention_block_forward(const Tensor& q, const Tensor& kv, bool causal, const BlockDocs& docs,
                                     Tensor& out, Tensor& lse) {
  ScopedTimer timer(*this, OpFamily::Attention);
  const BlockDims d = block_dims(q, kv, out, lse, causal, "attention_block_forward");
  if (docs.start.defined()) return block_forward_docs(*this, q, kv, causal, docs, d, out, lse);
  const int64_t B = d.B, Tq = d.Tq, Tk = d.Tk, H = d.H, Hkv = d.Hkv, D = d.D, g = d.group();
  const int64_t ldq = d.Wq * D, ldkv = 2 * Hkv * D, ldo = H * D, per = Tq * Tk + Tq * D + Tq;
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  const float* pq = q.data<float>();
  const float* pkv = kv.data<float>();
  float* pout = out.data<float>();
  float* plse = lse.data<float>();
  Tensor scratch = empty({omp_get_max_threads(), per}, DType::F32, MemCategory::Workspace);
#pragma omp parallel for schedule(static)
  for (int64_t bh = 0; bh < B * H; ++bh) {
    const int64_t b = bh / H, h = bh % H;
    const float* qh = pq + b * Tq * ldq + h * D;
    const float* k = pkv + b * Tk * ldkv + (h / g) * D;
    const float* v = pkv + b * Tk * ldkv + (Hkv + h / g) * D;
    float* S = scratch.data<float>() + omp_get_thread_num() * per;
    float* O = S + Tq * Tk;
    float* L = O + Tq * D;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, Tq, Tk, D, scale, qh, ldq, k, ldkv, 0.f, S, Tk);
    for (int64_t t = 0; t < Tq; ++t) {
      float* row = S + t * Tk;
      const int64_t n = causal ? t + 1 : Tk;
      float m = -INFINITY;
#pragma omp simd reduction(max : m)
      for (int64_t j = 0; j < n; ++j) m = std::max(m, row[j]);
      float s = 0;
#pragma omp simd reduction(+ : s)
      for (int64_t j = 0; j < n; ++j) s += fast_exp(row[j] - m);
      L[t] = m + std::log(s);
      for (int64_t j = 0; j < n; ++j) row[j] = fast_exp(row[j] - L[t]);
      for (int64_t j = n; j < Tk; ++j) row[j] = 0.f;
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, Tq, D, Tk, 1.f, S, Tk, v, ldkv, 0.f, O, D);
    // Merge with what the earlier blocks gave: weights exp(lse_i - lse_new) sum to one.
    for (int64_t t = 0; t < Tq; ++t) {
      float* o = pout + (b * Tq + t) * ldo + h * D;
      float& l_old = plse[bh * Tq + t];
      if (l_old == -INFINITY) {
        std::memcpy(o, O + t * D, D * sizeof(float));
        l_old = L[t];
        continue;
      }
      const float l_new = std::max(l_old, L[t]) + std::log1p(std::exp(-std::abs(l_old - L[t])));
      const float w_old = std::exp(l_old - l_new), w_new = std::exp(L[t] - l_new);
      for (int64_t i = 0; i < D; ++i) o[i] = w_old * o[i] + w_new * O[t * D + i];
      l_old = l_new;
    }
  }
}

void CpuOps::attention_block_backward(const Tensor& dout, const Tensor& q, const Tensor& kv, const Tensor& out,
                                      const Tensor& lse, bool causal, const BlockDocs& docs, Tensor& dq, Tensor& dkv) {
  ScopedTimer timer(*this, OpFamily::Attention);
  const BlockDims d = block_dims(q, kv, out, lse, causal, "attention_block_backward");
  TRIPOD_CHECK(dout.numel() == out.numel() && dq.numel() == q.numel() && dkv.numel() == kv.numel(),
               "attention_block_backward: dout {}, dq {}, dkv {} against out {}, q {}, kv {}", dout.str(), dq.str(),
               dkv.str(), out.str(), q.str(), kv.str());
  if (docs.start.defined()) return block_backward_docs(*this, dout, q, kv, out, lse, causal, docs, d, dq, dkv);
  const int64_t B = d.B, Tq = d.Tq, Tk = d.Tk, H = d.H, Hkv = d.Hkv, D = d.D, g = d.group();
  const int64_t ldq = d.Wq * D, ldkv = 2 * Hkv * D, ldo = H * D, per = 2 * Tq * Tk + Tq;
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  const float* pq = q.data<float>();
  const float* pkv = kv.data<float>();
  const float* pout = out.data<float>();
  const float* pdout = dout.data<float>();
  const float* plse = lse.data<float>();
  float* pdq = dq.data<float>();
  float* pdkv = dkv.data<float>();
  Tensor scratch = empty({omp_get_max_threads(), per}, DType::F32, MemCategory::Workspace);
  // One task per key/value head, its query heads in order (no races, any thread count the same).
#pragma omp parallel for schedule(static)
  for (int64_t bj = 0; bj < B * Hkv; ++bj) {
    const int64_t b = bj / Hkv, j = bj % Hkv;
    const float* k = pkv + b * Tk * ldkv + j * D;
    const float* v = pkv + b * Tk * ldkv + (Hkv + j) * D;
    float* dk = pdkv + b * Tk * ldkv + j * D;
    float* dv = pdkv + b * Tk * ldkv + (Hkv + j) * D;
    float* P = scratch.data<float>() + omp_get_thread_num() * per;
    float* dS = P + Tq * Tk;
    float* delta = dS + Tq * Tk;
    for (int64_t h = j * g; h < (j + 1) * g; ++h) {
      const int64_t bh = b * H + h;
      const float* qh = pq + b * Tq * ldq + h * D;
      float* dqh = pdq + b * Tq * ldq + h * D;
      const float* dO = pdout + b * Tq * ldo + h * D;
      const float* O = pout + b * Tq * ldo + h * D;
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, Tq, Tk, D, scale, qh, ldq, k, ldkv, 0.f, P, Tk);
      for (int64_t t = 0; t < Tq; ++t) {
        float* row = P + t * Tk;
        const int64_t n = causal ? t + 1 : Tk;
        const float l = plse[bh * Tq + t];
        for (int64_t i = 0; i < n; ++i) row[i] = fast_exp(row[i] - l);
        for (int64_t i = n; i < Tk; ++i) row[i] = 0.f;
        float dot = 0;
#pragma omp simd reduction(+ : dot)
        for (int64_t i = 0; i < D; ++i) dot += dO[t * ldo + i] * O[t * ldo + i];
        delta[t] = dot;
      }
      // dV += P^T dO; dP = dO V^T; dS = P (dP - delta); dQ += scale dS K; dK += scale dS^T Q.
      cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, Tk, D, Tq, 1.f, P, Tk, dO, ldo, 1.f, dv, ldkv);
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, Tq, Tk, D, 1.f, dO, ldo, v, ldkv, 0.f, dS, Tk);
      for (int64_t t = 0; t < Tq; ++t) {
        const float* pr = P + t * Tk;
        float* dr = dS + t * Tk;
        const int64_t n = causal ? t + 1 : Tk;
        for (int64_t i = 0; i < n; ++i) dr[i] = pr[i] * (dr[i] - delta[t]);
        for (int64_t i = n; i < Tk; ++i) dr[i] = 0.f;
      }
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, Tq, D, Tk, scale, dS, Tk, k, ldkv, 1.f, dqh, ldq);
      cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, Tk, D, Tq, scale, dS, Tk, qh, ldq, 1.f, dk, ldkv);
    }
  }
}

namespace {
// qkv (N, H + 2 Hkv, D) <-> kv (N, 2 Hkv, D): the key and value heads of every token.
void check_kv(const Tensor& qkv, int64_t H, const Tensor& kv, const char* op) {
  TRIPOD_CHECK(qkv.dim() >= 2 && kv.dim() >= 2 && qkv.dtype() == DType::F32 && kv.dtype() == DType::F32 && H >= 0,
               "{}: qkv {} and kv {} must be f32 on the CPU", op, qkv.str(), kv.str());
  const int64_t N = qkv.size(0), W = qkv.numel() / std::max<int64_t>(N, 1), Wkv = kv.numel() / std::max<int64_t>(N, 1);
  TRIPOD_CHECK(kv.size(0) == N && Wkv < W && kv.numel() == N * Wkv, "{}: qkv {} and kv {} do not pair", op, qkv.str(),
               kv.str());
}
}  // namespace

void CpuOps::attention_kv_pack(const Tensor& qkv, int64_t H, Tensor& kv) {
  check_kv(qkv, H, kv, "attention_kv_pack");
  const int64_t N = qkv.size(0), W = qkv.numel() / N, Wkv = kv.numel() / N, off = W - Wkv;
  const float* src = qkv.data<float>();
  float* dst = kv.data<float>();
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n) std::memcpy(dst + n * Wkv, src + n * W + off, Wkv * sizeof(float));
}

void CpuOps::attention_kv_unpack(const Tensor& kv, int64_t H, Tensor& qkv) {
  check_kv(qkv, H, kv, "attention_kv_unpack");
  const int64_t N = qkv.size(0), W = qkv.numel() / N, Wkv = kv.numel() / N, off = W - Wkv;
  const float* src = kv.data<float>();
  float* dst = qkv.data<float>();
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < N; ++n) std::memcpy(dst + n * W + off, src + n * Wkv, Wkv * sizeof(float));
}

}  // namespace tripod::cpu
