// Reference causal attention on the GPU: one warp per query (forward, dQ) or key (dK, dV) row,
// exact softmax in f32 with the online max/sum. Simple and deterministic rather than fast; the
// fast path is cuDNN's fused attention (attention.cpp), this one serves shapes cuDNN declines.
//
// qkv (B, T, H + 2 Hkv, D): q of token t, head h of batch b starts at (b*T + t)*W + h*D with
// W = (H + 2 Hkv) D, its key at ... + (H + h/g)*D and value at ... + (H + Hkv + h/g)*D (g = H/Hkv
// query heads per key/value head). out, dout (B, T, H, D): tokens H*D apart. lse, delta
// (B, H, T). Lane l of a warp holds elements d = l, l + 32, ... of a head row.
//
// Packed documents (a document start per query row, `start`, as Ops::attention_forward_docs and
// BlockDocs give them): a query sees only the keys from its document's start on, and only those
// are visited; a key's gradient visits the queries that see it, a run that ends where the next
// document begins (document starts never decrease along a sequence).
#include <cmath>
#include <type_traits>

#include "kernels/cuda/device_utils.cuh"

namespace tripod::cuda::k {

namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;

struct Geometry {
  int64_t B, T, H, Hkv, D;
  const int32_t* start;  // (B, T) document starts, or null (causal over the whole sequence)
  __device__ int64_t first_key(int64_t b, int64_t t) const { return start ? start[b * T + t] : 0; }
  __host__ __device__ int64_t tok_qkv() const { return (H + 2 * Hkv) * D; }  // between tokens in qkv
  __host__ __device__ int64_t tok_out() const { return H * D; }              // between tokens in out
  __host__ __device__ int64_t k_off(int64_t h) const { return (H + h / (H / Hkv)) * D; }  // query head h's key
  __host__ __device__ int64_t v_off(int64_t h) const { return (H + Hkv + h / (H / Hkv)) * D; }
};

// Per-lane slice of one head row (NPL = elements per lane).
template <int NPL> struct Row {
  float v[NPL];
  __device__ void load(const bf16_t* p, int64_t D, int lane) {
#pragma unroll
    for (int i = 0; i < NPL; ++i) {
      const int64_t d = lane + 32 * i;
      v[i] = d < D ? to_float(p[d]) : 0.f;
    }
  }
  __device__ void zero() {
#pragma unroll
    for (int i = 0; i < NPL; ++i) v[i] = 0.f;
  }
  __device__ void store(bf16_t* p, int64_t D, int lane, float s) const {
#pragma unroll
    for (int i = 0; i < NPL; ++i) {
      const int64_t d = lane + 32 * i;
      if (d < D) p[d] = from_float<bf16_t>(v[i] * s);
    }
  }
  __device__ void load(const float* p, int64_t D, int lane) {
#pragma unroll
    for (int i = 0; i < NPL; ++i) {
      const int64_t d = lane + 32 * i;
      v[i] = d < D ? p[d] : 0.f;
    }
  }
  // p += s * this (f32 accumulators of the context-parallel blocks).
  __device__ void add_to(float* p, int64_t D, int lane, float s) const {
#pragma unroll
    for (int i = 0; i < NPL; ++i) {
      const int64_t d = lane + 32 * i;
      if (d < D) p[d] += v[i] * s;
    }
  }
  // Dot product with a row in memory, summed over the warp (every lane gets it).
  __device__ float dot(const bf16_t* p, int64_t D, int lane) const {
    float acc = 0;
#pragma unroll
    for (int i = 0; i < NPL; ++i) {
      const int64_t d = lane + 32 * i;
      if (d < D) acc += v[i] * to_float(p[d]);
    }
    return warp_sum(acc);
  }
  __device__ void axpy(float a, const bf16_t* p, int64_t D, int lane) {
#pragma unroll
    for (int i = 0; i < NPL; ++i) {
      const int64_t d = lane + 32 * i;
      if (d < D) v[i] += a * to_float(p[d]);
    }
  }
};

// Warp per (b, h, t): out = softmax(scale q K^T over keys j <= t) V; lse = log-sum-exp.
template <int NPL>
__global__ void forward_kernel(const bf16_t* qkv, bf16_t* out, float* lse, Geometry g, float scale) {
  const int lane = threadIdx.x % 32;
  const int64_t w = static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32;
  if (w >= g.B * g.H * g.T) return;
  const int64_t t = w % g.T, bh = w / g.T, b = bh / g.H, h = bh % g.H;
  const bf16_t* base = qkv + b * g.T * g.tok_qkv();
  Row<NPL> q, acc;
  q.load(base + t * g.tok_qkv() + h * g.D, g.D, lane);
  acc.zero();
  float m = -INFINITY, l = 0.f;
  for (int64_t j = g.first_key(b, t); j <= t; ++j) {
    const bf16_t* kj = base + j * g.tok_qkv() + g.k_off(h);
    const float s = q.dot(kj, g.D, lane) * scale;
    const float m_new = fmaxf(m, s);
    const float corr = expf(m - m_new), p = expf(s - m_new);
    l = l * corr + p;
#pragma unroll
    for (int i = 0; i < NPL; ++i) acc.v[i] *= corr;
    acc.axpy(p, base + j * g.tok_qkv() + g.v_off(h), g.D, lane);  // v_j
    m = m_new;
  }
  acc.store(out + (b * g.T + t) * g.tok_out() + h * g.D, g.D, lane, 1.0f / l);
  if (lane == 0) lse[bh * g.T + t] = m + logf(l);
}

// delta (b, h, t) = sum_d dout * out, the row term of the softmax gradient.
template <int NPL>
__global__ void delta_kernel(const bf16_t* dout, const bf16_t* out, float* delta, Geometry g) {
  const int lane = threadIdx.x % 32;
  const int64_t w = static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32;
  if (w >= g.B * g.H * g.T) return;
  const int64_t t = w % g.T, bh = w / g.T, b = bh / g.H, h = bh % g.H;
  const int64_t off = (b * g.T + t) * g.tok_out() + h * g.D;
  Row<NPL> d;
  d.load(dout + off, g.D, lane);
  const float v = d.dot(out + off, g.D, lane);
  if (lane == 0) delta[bh * g.T + t] = v;
}

// Warp per query (b, h, t): dq = scale sum_{j<=t} p_tj (dO_t . v_j - delta_t) k_j.
template <int NPL>
__global__ void dq_kernel(const bf16_t* dout, const bf16_t* qkv, const float* lse, const float* delta, bf16_t* dqkv,
                          Geometry g, float scale) {
  const int lane = threadIdx.x % 32;
  const int64_t w = static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32;
  if (w >= g.B * g.H * g.T) return;
  const int64_t t = w % g.T, bh = w / g.T, b = bh / g.H, h = bh % g.H;
  const bf16_t* base = qkv + b * g.T * g.tok_qkv();
  Row<NPL> q, d, dq;
  q.load(base + t * g.tok_qkv() + h * g.D, g.D, lane);
  d.load(dout + (b * g.T + t) * g.tok_out() + h * g.D, g.D, lane);
  dq.zero();
  const float l = lse[bh * g.T + t], dl = delta[bh * g.T + t];
  for (int64_t j = g.first_key(b, t); j <= t; ++j) {
    const bf16_t* kj = base + j * g.tok_qkv() + g.k_off(h);
    const float p = expf(q.dot(kj, g.D, lane) * scale - l);
    const float ds = p * (d.dot(base + j * g.tok_qkv() + g.v_off(h), g.D, lane) - dl);
    dq.axpy(ds, kj, g.D, lane);
  }
  dq.store(dqkv + (b * g.T + t) * g.tok_qkv() + h * g.D, g.D, lane, scale);
}

// Warp per key (b, key/value head kv, j): over the query heads h of its group and t >= j,
// dv = sum p_tj dO_t; dk = scale sum p_tj (dO_t . v_j - delta_t) q_t.
template <int NPL>
__global__ void dkv_kernel(const bf16_t* dout, const bf16_t* qkv, const float* lse, const float* delta, bf16_t* dqkv,
                           Geometry g, float scale) {
  const int lane = threadIdx.x % 32;
  const int64_t w = static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32;
  if (w >= g.B * g.Hkv * g.T) return;
  const int64_t j = w % g.T, bk = w / g.T, b = bk / g.Hkv, kv = bk % g.Hkv, group = g.H / g.Hkv;
  const bf16_t* base = qkv + b * g.T * g.tok_qkv();
  Row<NPL> k, v, dk, dv;
  k.load(base + j * g.tok_qkv() + (g.H + kv) * g.D, g.D, lane);
  v.load(base + j * g.tok_qkv() + (g.H + g.Hkv + kv) * g.D, g.D, lane);
  dk.zero();
  dv.zero();
  for (int64_t h = kv * group; h < (kv + 1) * group; ++h) {
    const int64_t bh = b * g.H + h;
    for (int64_t t = j; t < g.T && g.first_key(b, t) <= j; ++t) {
      const bf16_t* qt = base + t * g.tok_qkv() + h * g.D;
      const bf16_t* dot_row = dout + (b * g.T + t) * g.tok_out() + h * g.D;
      const float p = expf(k.dot(qt, g.D, lane) * scale - lse[bh * g.T + t]);
      dv.axpy(p, dot_row, g.D, lane);
      const float ds = p * (v.dot(dot_row, g.D, lane) - delta[bh * g.T + t]);
      dk.axpy(ds, qt, g.D, lane);
    }
  }
  bf16_t* dst = dqkv + (b * g.T + j) * g.tok_qkv();
  dk.store(dst + (g.H + kv) * g.D, g.D, lane, scale);
  dv.store(dst + (g.H + g.Hkv + kv) * g.D, g.D, lane, 1.0f);
}

template <int NPL> void run_forward(const bf16_t* qkv, bf16_t* out, float* lse, Geometry g, float scale,
                                    cudaStream_t s) {
  const unsigned blocks = static_cast<unsigned>((g.B * g.H * g.T + kWarps - 1) / kWarps);
  forward_kernel<NPL><<<blocks, kThreads, 0, s>>>(qkv, out, lse, g, scale);
}

template <int NPL>
void run_backward(const bf16_t* dout, const bf16_t* qkv, const bf16_t* out, const float* lse, bf16_t* dqkv,
                  float* delta, Geometry g, float scale, cudaStream_t s) {
  const unsigned blocks = static_cast<unsigned>((g.B * g.H * g.T + kWarps - 1) / kWarps);
  const unsigned kv_blocks = static_cast<unsigned>((g.B * g.Hkv * g.T + kWarps - 1) / kWarps);
  delta_kernel<NPL><<<blocks, kThreads, 0, s>>>(dout, out, delta, g);
  dq_kernel<NPL><<<blocks, kThreads, 0, s>>>(dout, qkv, lse, delta, dqkv, g, scale);
  dkv_kernel<NPL><<<kv_blocks, kThreads, 0, s>>>(dout, qkv, lse, delta, dqkv, g, scale);
}

// Thread per element: the new tokens' k and v (qkv (B, n, H + 2 Hkv, D)) into the caches
// (B, Hkv, T_max, D) at positions [pos, pos + n). Element i = ((b*n + t)*Hkv + kv)*D + d.
__global__ void kv_append_kernel(const bf16_t* qkv, bf16_t* k_cache, bf16_t* v_cache, int64_t B, int64_t n,
                                 int64_t H, int64_t Hkv, int64_t D, int64_t Tmax, int64_t pos) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= B * n * Hkv * D) return;
  const int64_t d = i % D, kv = (i / D) % Hkv, t = (i / (D * Hkv)) % n, b = i / (D * Hkv * n);
  const bf16_t* src = qkv + (b * n + t) * (H + 2 * Hkv) * D + d;
  const int64_t dst = ((b * Hkv + kv) * Tmax + pos + t) * D + d;
  k_cache[dst] = src[(H + kv) * D];
  v_cache[dst] = src[(H + Hkv + kv) * D];
}

// Warp per (b, h, t) of the new tokens: out = softmax(scale q K^T over cache positions
// 0..pos+t) V against key/value head h / (H/Hkv), with the online max/sum of forward_kernel.
// Keys of one head are D apart.
template <int NPL>
__global__ void decode_kernel(const bf16_t* qkv, const bf16_t* k_cache, const bf16_t* v_cache, bf16_t* out,
                              int64_t B, int64_t n, int64_t H, int64_t Hkv, int64_t D, int64_t Tmax, int64_t pos,
                              float scale) {
  const int lane = threadIdx.x % 32;
  const int64_t w = static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32;
  if (w >= B * H * n) return;
  const int64_t t = w % n, bh = w / n, b = bh / H, h = bh % H, bk = b * Hkv + h / (H / Hkv);
  Row<NPL> q, acc;
  q.load(qkv + (b * n + t) * (H + 2 * Hkv) * D + h * D, D, lane);
  acc.zero();
  const bf16_t* K = k_cache + bk * Tmax * D;
  const bf16_t* V = v_cache + bk * Tmax * D;
  float m = -INFINITY, l = 0.f;
  for (int64_t j = 0; j <= pos + t; ++j) {
    const float s = q.dot(K + j * D, D, lane) * scale;
    const float m_new = fmaxf(m, s);
    const float corr = expf(m - m_new), p = expf(s - m_new);
    l = l * corr + p;
#pragma unroll
    for (int i = 0; i < NPL; ++i) acc.v[i] *= corr;
    acc.axpy(p, V + j * D, D, lane);
    m = m_new;
  }
  acc.store(out + (b * n + t) * H * D + h * D, D, lane, 1.0f / l);
}

template <int NPL>
void run_decode(const bf16_t* qkv, const bf16_t* k, const bf16_t* v, bf16_t* out, int64_t B, int64_t n, int64_t H,
                int64_t Hkv, int64_t D, int64_t Tmax, int64_t pos, float scale, cudaStream_t s) {
  const unsigned blocks = static_cast<unsigned>((B * H * n + kWarps - 1) / kWarps);
  decode_kernel<NPL><<<blocks, kThreads, 0, s>>>(qkv, k, v, out, B, n, H, Hkv, D, Tmax, pos, scale);
}

// ---- blocks of context-parallel attention ------------------------------------------------------
// q (B, Tq, Wq, D) (query head h at h*D of a token row), kv (B, Tk, 2 Hkv, D) (key head j at j*D,
// value head j at (Hkv + j)*D), out, dout (B, Tq, H, D), lse, delta (B, H, Tq).
struct BlockGeometry {
  int64_t B, Tq, Tk, Wq, H, Hkv, D;
  bool causal;
  const int32_t* start;  // (B, Tq) document starts (BlockDocs), or null
  int64_t key_pos;       // the position of key 0 in the sequence
  // The first key query t of sequence b sees (Tk or more: none).
  __device__ int64_t first_key(int64_t b, int64_t t) const {
    if (!start) return 0;
    const int64_t k = start[b * Tq + t] - key_pos;
    return k < 0 ? 0 : k;
  }
  __host__ __device__ int64_t group() const { return H / Hkv; }
  __host__ __device__ int64_t keys(int64_t t) const { return causal ? t + 1 : Tk; }  // keys query t sees
};

// Warp per (b, h, t): the block's softmax(scale q K^T) V and its log-sum-exp, merged into the f32
// running out and lse (lse = -inf: nothing merged yet).
template <int NPL>
__global__ void block_forward_kernel(const bf16_t* q, const bf16_t* kv, float* out, float* lse, BlockGeometry g,
                                     float scale) {
  const int lane = threadIdx.x % 32;
  const int64_t w = static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32;
  if (w >= g.B * g.H * g.Tq) return;
  const int64_t t = w % g.Tq, bh = w / g.Tq, b = bh / g.H, h = bh % g.H, j0 = h / g.group();
  const int64_t ldkv = 2 * g.Hkv * g.D;
  const bf16_t* kvb = kv + b * g.Tk * ldkv;
  const int64_t first = g.first_key(b, t);
  if (first >= g.keys(t)) return;  // the document mask leaves this query nothing here: out and lse stay
  Row<NPL> qr, acc;
  qr.load(q + (b * g.Tq + t) * g.Wq * g.D + h * g.D, g.D, lane);
  acc.zero();
  float m = -INFINITY, l = 0.f;
  for (int64_t j = first; j < g.keys(t); ++j) {
    const float sc = qr.dot(kvb + j * ldkv + j0 * g.D, g.D, lane) * scale;
    const float m_new = fmaxf(m, sc);
    const float corr = expf(m - m_new), p = expf(sc - m_new);
    l = l * corr + p;
#pragma unroll
    for (int i = 0; i < NPL; ++i) acc.v[i] *= corr;
    acc.axpy(p, kvb + j * ldkv + (g.Hkv + j0) * g.D, g.D, lane);
    m = m_new;
  }
  const float lb = m + logf(l);
  float* o = out + (b * g.Tq + t) * g.H * g.D + h * g.D;
  float& lr = lse[bh * g.Tq + t];
  const float l_old = lr;
  if (l_old == -INFINITY) {
#pragma unroll
    for (int i = 0; i < NPL; ++i) {
      const int64_t d = lane + 32 * i;
      if (d < g.D) o[d] = acc.v[i] / l;
    }
  } else {
    const float l_new = fmaxf(l_old, lb) + log1pf(expf(-fabsf(l_old - lb)));
    const float w_old = expf(l_old - l_new), w_new = expf(lb - l_new) / l;
#pragma unroll
    for (int i = 0; i < NPL; ++i) {
      const int64_t d = lane + 32 * i;
      if (d < g.D) o[d] = w_old * o[d] + w_new * acc.v[i];
    }
  }
  __syncwarp();
  if (lane == 0) lr = l_old == -INFINITY ? lb : fmaxf(l_old, lb) + log1pf(expf(-fabsf(l_old - lb)));
}

template <int NPL>
__global__ void block_delta_kernel(const bf16_t* dout, const bf16_t* out, float* delta, BlockGeometry g) {
  const int lane = threadIdx.x % 32;
  const int64_t w = static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32;
  if (w >= g.B * g.H * g.Tq) return;
  const int64_t t = w % g.Tq, bh = w / g.Tq, b = bh / g.H, h = bh % g.H;
  const int64_t off = (b * g.Tq + t) * g.H * g.D + h * g.D;
  Row<NPL> d;
  d.load(dout + off, g.D, lane);
  const float v = d.dot(out + off, g.D, lane);
  if (lane == 0) delta[bh * g.Tq + t] = v;
}

// Warp per query (b, h, t): dq += scale sum_j p_tj (dO_t . v_j - delta_t) k_j.
template <int NPL>
__global__ void block_dq_kernel(const bf16_t* dout, const bf16_t* q, const bf16_t* kv, const float* lse,
                                const float* delta, float* dq, BlockGeometry g, float scale) {
  const int lane = threadIdx.x % 32;
  const int64_t w = static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32;
  if (w >= g.B * g.H * g.Tq) return;
  const int64_t t = w % g.Tq, bh = w / g.Tq, b = bh / g.H, h = bh % g.H, j0 = h / g.group();
  const int64_t ldkv = 2 * g.Hkv * g.D;
  const bf16_t* kvb = kv + b * g.Tk * ldkv;
  const int64_t first = g.first_key(b, t);
  if (first >= g.keys(t)) return;
  Row<NPL> qr, d, acc;
  qr.load(q + (b * g.Tq + t) * g.Wq * g.D + h * g.D, g.D, lane);
  d.load(dout + (b * g.Tq + t) * g.H * g.D + h * g.D, g.D, lane);
  acc.zero();
  const float l = lse[bh * g.Tq + t], dl = delta[bh * g.Tq + t];
  for (int64_t j = first; j < g.keys(t); ++j) {
    const bf16_t* kj = kvb + j * ldkv + j0 * g.D;
    const float p = expf(qr.dot(kj, g.D, lane) * scale - l);
    const float ds = p * (d.dot(kvb + j * ldkv + (g.Hkv + j0) * g.D, g.D, lane) - dl);
    acc.axpy(ds, kj, g.D, lane);
  }
  acc.add_to(dq + (b * g.Tq + t) * g.Wq * g.D + h * g.D, g.D, lane, scale);
}

// Warp per key (b, key/value head j0, key j): over its group's query heads and the queries that
// see it, dv += p dO; dk += scale p (dO . v - delta) q.
template <int NPL>
__global__ void block_dkv_kernel(const bf16_t* dout, const bf16_t* q, const bf16_t* kv, const float* lse,
                                 const float* delta, float* dkv, BlockGeometry g, float scale) {
  const int lane = threadIdx.x % 32;
  const int64_t w = static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32;
  if (w >= g.B * g.Hkv * g.Tk) return;
  const int64_t j = w % g.Tk, bk = w / g.Tk, b = bk / g.Hkv, j0 = bk % g.Hkv;
  const int64_t ldkv = 2 * g.Hkv * g.D;
  const bf16_t* row = kv + (b * g.Tk + j) * ldkv;
  Row<NPL> k, v, dk, dv;
  k.load(row + j0 * g.D, g.D, lane);
  v.load(row + (g.Hkv + j0) * g.D, g.D, lane);
  dk.zero();
  dv.zero();
  for (int64_t h = j0 * g.group(); h < (j0 + 1) * g.group(); ++h) {
    const int64_t bh = b * g.H + h;
    for (int64_t t = g.causal ? j : 0; t < g.Tq && g.first_key(b, t) <= j; ++t) {
      const bf16_t* qt = q + (b * g.Tq + t) * g.Wq * g.D + h * g.D;
      const bf16_t* dot_row = dout + (b * g.Tq + t) * g.H * g.D + h * g.D;
      const float p = expf(k.dot(qt, g.D, lane) * scale - lse[bh * g.Tq + t]);
      dv.axpy(p, dot_row, g.D, lane);
      const float ds = p * (v.dot(dot_row, g.D, lane) - delta[bh * g.Tq + t]);
      dk.axpy(ds, qt, g.D, lane);
    }
  }
  float* dst = dkv + (b * g.Tk + j) * ldkv;
  dk.add_to(dst + j0 * g.D, g.D, lane, scale);
  dv.add_to(dst + (g.Hkv + j0) * g.D, g.D, lane, 1.0f);
}

template <int NPL>
void run_block_forward(const bf16_t* q, const bf16_t* kv, float* out, float* lse, BlockGeometry g, float scale,
                       cudaStream_t s) {
  const unsigned blocks = static_cast<unsigned>((g.B * g.H * g.Tq + kWarps - 1) / kWarps);
  block_forward_kernel<NPL><<<blocks, kThreads, 0, s>>>(q, kv, out, lse, g, scale);
}

template <int NPL>
void run_block_backward(const bf16_t* dout, const bf16_t* q, const bf16_t* kv, const bf16_t* out, const float* lse,
                        float* delta, float* dq, float* dkv, BlockGeometry g, float scale, cudaStream_t s) {
  const unsigned blocks = static_cast<unsigned>((g.B * g.H * g.Tq + kWarps - 1) / kWarps);
  const unsigned kv_blocks = static_cast<unsigned>((g.B * g.Hkv * g.Tk + kWarps - 1) / kWarps);
  block_delta_kernel<NPL><<<blocks, kThreads, 0, s>>>(dout, out, delta, g);
  block_dq_kernel<NPL><<<blocks, kThreads, 0, s>>>(dout, q, kv, lse, delta, dq, g, scale);
  block_dkv_kernel<NPL><<<kv_blocks, kThreads, 0, s>>>(dout, q, kv, lse, delta, dkv, g, scale);
}

// Thread per element: heads [off, off + w) of every token row of width W <-> rows of width w.
template <class In, class Out>
__global__ void columns_kernel(const In* src, Out* dst, int64_t N, int64_t W, int64_t w, int64_t off, bool pack) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= N * w) return;
  const int64_t n = i / w, e = i % w;
  if (pack)
    dst[i] = from_float<Out>(to_float(src[n * W + off + e]));
  else
    dst[n * W + off + e] = from_float<Out>(to_float(src[i]));
}

// Packed documents batched by length (attention.cpp): rows of a (B T, w) tensor <-> (n, L, w),
// document i's len rows from row first (table: first[0..n), len[0..n)); padding rows are 0.
template <class V>
__global__ void doc_rows_kernel(const V* src, V* dst, const int32_t* table, int64_t n, int64_t L, int64_t w,
                                bool gather) {
  const int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (e >= n * L * w) return;
  const int64_t i = e / (L * w), t = (e / w) % L, x = e % w;
  const bool real = t < table[n + i];
  const int64_t row = static_cast<int64_t>(table[i]) + t;
  if (gather)
    dst[e] = real ? src[row * w + x] : V{};
  else if (real)
    dst[row * w + x] = src[e];
}

// lse (B, H, T) <-> (n, H, L) by the same table (padding 0).
__global__ void doc_lse_kernel(const float* src, float* dst, const int32_t* table, int64_t n, int64_t L, int64_t H,
                               int64_t T, bool gather) {
  const int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (e >= n * H * L) return;
  const int64_t i = e / (H * L), h = (e / L) % H, t = e % L;
  const bool real = t < table[n + i];
  const int64_t first = table[i], b = first / T, at = (b * H + h) * T + first % T + t;
  if (gather)
    dst[e] = real ? src[at] : 0.f;
  else if (real)
    dst[at] = src[e];
}

// Calls f with the elements of a head row per lane, NPL, as a compile-time constant: D up to
// 32, 64, 128 or more gives 1, 2, 4 or 8.
template <class F> void by_head_size(int64_t D, F&& f) {
  if (D <= 32)
    f(std::integral_constant<int, 1>{});
  else if (D <= 64)
    f(std::integral_constant<int, 2>{});
  else if (D <= 128)
    f(std::integral_constant<int, 4>{});
  else
    f(std::integral_constant<int, 8>{});
}

}  // namespace

void attention_block_forward(const bf16* q, const bf16* kv, float* out, float* lse, int64_t B, int64_t Tq, int64_t Tk,
                             int64_t Wq, int64_t H, int64_t Hkv, int64_t D, bool causal, const int32_t* start,
                             int64_t key_pos, float scale, cudaStream_t s) {
  const BlockGeometry g{B, Tq, Tk, Wq, H, Hkv, D, causal, start, key_pos};
  if (B * H * Tq == 0) return;
  by_head_size(D, [&](auto npl) {
    run_block_forward<decltype(npl)::value>(dev(q), dev(kv), out, lse, g, scale, s);
  });
}

void attention_block_backward(const bf16* dout, const bf16* q, const bf16* kv, const bf16* out, const float* lse,
                              float* delta, float* dq, float* dkv, int64_t B, int64_t Tq, int64_t Tk, int64_t Wq,
                              int64_t H, int64_t Hkv, int64_t D, bool causal, const int32_t* start, int64_t key_pos,
                              float scale, cudaStream_t s) {
  const BlockGeometry g{B, Tq, Tk, Wq, H, Hkv, D, causal, start, key_pos};
  if (B * H * Tq == 0) return;
  by_head_size(D, [&](auto npl) {
    run_block_backward<decltype(npl)::value>(dev(dout), dev(q), dev(kv), dev(out), lse, delta, dq, dkv, g, scale, s);
  });
}

void doc_rows(const bf16* src, bf16* dst, const int32_t* table, int64_t n, int64_t L, int64_t w, bool gather,
              cudaStream_t s) {
  if (n * L * w == 0) return;
  doc_rows_kernel<bf16_t><<<static_cast<unsigned>((n * L * w + kThreads - 1) / kThreads), kThreads, 0, s>>>(
      dev(src), dev(dst), table, n, L, w, gather);
}

void doc_lse(const float* src, float* dst, const int32_t* table, int64_t n, int64_t L, int64_t H, int64_t T,
             bool gather, cudaStream_t s) {
  if (n * H * L == 0) return;
  doc_lse_kernel<<<static_cast<unsigned>((n * H * L + kThreads - 1) / kThreads), kThreads, 0, s>>>(
      src, dst, table, n, L, H, T, gather);
}

void attention_kv_pack(const bf16* qkv, bf16* kv, int64_t N, int64_t W, int64_t w, cudaStream_t s) {
  if (N * w == 0) return;
  columns_kernel<bf16_t, bf16_t><<<static_cast<unsigned>((N * w + kThreads - 1) / kThreads), kThreads, 0, s>>>(
      dev(qkv), dev(kv), N, W, w, W - w, true);
}

void attention_kv_unpack(const float* kv, bf16* qkv, int64_t N, int64_t W, int64_t w, cudaStream_t s) {
  if (N * w == 0) return;
  columns_kernel<float, bf16_t><<<static_cast<unsigned>((N * w + kThreads - 1) / kThreads), kThreads, 0, s>>>(
      kv, dev(qkv), N, W, w, W - w, false);
}

void attention_kv_unpack(const bf16* kv, bf16* qkv, int64_t N, int64_t W, int64_t w, cudaStream_t s) {
  if (N * w == 0) return;
  columns_kernel<bf16_t, bf16_t><<<static_cast<unsigned>((N * w + kThreads - 1) / kThreads), kThreads, 0, s>>>(
      dev(kv), dev(qkv), N, W, w, W - w, false);
}

void attention_decode(const bf16* qkv, bf16* k_cache, bf16* v_cache, bf16* out, int64_t B, int64_t n, int64_t H,
                      int64_t Hkv, int64_t D, int64_t Tmax, int64_t pos, float scale, cudaStream_t s) {
  const int64_t elems = B * n * Hkv * D;
  if (elems == 0) return;
  kv_append_kernel<<<static_cast<unsigned>((elems + kThreads - 1) / kThreads), kThreads, 0, s>>>(
      dev(qkv), dev(k_cache), dev(v_cache), B, n, H, Hkv, D, Tmax, pos);
  by_head_size(D, [&](auto npl) {
    run_decode<decltype(npl)::value>(dev(qkv), dev(k_cache), dev(v_cache), dev(out), B, n, H, Hkv, D, Tmax, pos,
                                     scale, s);
  });
}

void attention_forward(const bf16* qkv, bf16* out, float* lse, int64_t B, int64_t T, int64_t H, int64_t Hkv,
                       int64_t D, const int32_t* start, float scale, cudaStream_t s) {
  const Geometry g{B, T, H, Hkv, D, start};
  if (B * H * T == 0) return;
  by_head_size(D, [&](auto npl) {
    run_forward<decltype(npl)::value>(dev(qkv), dev(out), lse, g, scale, s);
  });
}

void attention_backward(const bf16* dout, const bf16* qkv, const bf16* out, const float* lse, bf16* dqkv,
                        float* delta, int64_t B, int64_t T, int64_t H, int64_t Hkv, int64_t D,
                        const int32_t* start, float scale, cudaStream_t s) {
  const Geometry g{B, T, H, Hkv, D, start};
  if (B * H * T == 0) return;
  by_head_size(D, [&](auto npl) {
    run_backward<decltype(npl)::value>(dev(dout), dev(qkv), dev(out), lse, dev(dqkv), delta, g, scale, s);
  });
}

}  // namespace tripod::cuda::k
