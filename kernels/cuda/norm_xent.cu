// Row-wise kernels of the CUDA backend: LayerNorm and RMSNorm forward/backward, bias gradients (column sums)
// and the fused softmax cross-entropy over (vocabulary-parallel) logits.
#include <cmath>

#include "kernels/cuda/device_utils.cuh"

namespace tripod::cuda::k {

namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int64_t kMaxPartialRows = 128;

// ---- LayerNorm forward: one warp per row, statistics in f32 ----------------------------------
// V elements per load: 8 (16 bytes) when C % 8 == 0 and the pointers are aligned, else 1.
template <int V>
__global__ void layernorm_forward_kernel(const bf16_t* x, const bf16_t* w, const bf16_t* b, bf16_t* y, float* mean,
                                         float* rstd, int64_t N, int64_t C, float eps) {
  const int lane = threadIdx.x % 32;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32;
  if (row >= N) return;
  using P = Pack<bf16_t, V>;
  const bf16_t* xr = x + row * C;
  float s = 0;
  for (int64_t c = lane * V; c < C; c += 32 * V) {
    P px = *reinterpret_cast<const P*>(xr + c);
#pragma unroll
    for (int j = 0; j < V; ++j) s += to_float(px.v[j]);
  }
  const float m = warp_sum(s) / static_cast<float>(C);
  float var = 0;
  for (int64_t c = lane * V; c < C; c += 32 * V) {
    P px = *reinterpret_cast<const P*>(xr + c);
#pragma unroll
    for (int j = 0; j < V; ++j) {
      float d = to_float(px.v[j]) - m;
      var += d * d;
    }
  }
  const float r = 1.0f / sqrtf(warp_sum(var) / static_cast<float>(C) + eps);
  bf16_t* yr = y + row * C;
  for (int64_t c = lane * V; c < C; c += 32 * V) {
    P px = *reinterpret_cast<const P*>(xr + c);
    P pw = *reinterpret_cast<const P*>(w + c);
    P pb = *reinterpret_cast<const P*>(b + c);
    P py;
#pragma unroll
    for (int j = 0; j < V; ++j)
      py.v[j] = from_float<bf16_t>((to_float(px.v[j]) - m) * r * to_float(pw.v[j]) + to_float(pb.v[j]));
    *reinterpret_cast<P*>(yr + c) = py;
  }
  if (lane == 0) {
    mean[row] = m;
    rstd[row] = r;
  }
}

// ---- LayerNorm backward, dx: one warp per row; dx += (w dy - mean(w dy) - norm mean(w dy norm)) r
template <int V>
__global__ void layernorm_backward_dx_kernel(const bf16_t* dy, const bf16_t* x, const bf16_t* w, const float* mean,
                                             const float* rstd, bf16_t* dx, int64_t N, int64_t C) {
  const int lane = threadIdx.x % 32;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32;
  if (row >= N) return;
  using P = Pack<bf16_t, V>;
  const bf16_t* xr = x + row * C;
  const bf16_t* dyr = dy + row * C;
  const float m = mean[row], r = rstd[row];
  float sum_d = 0, sum_dn = 0;
  for (int64_t c = lane * V; c < C; c += 32 * V) {
    P px = *reinterpret_cast<const P*>(xr + c);
    P pd = *reinterpret_cast<const P*>(dyr + c);
    P pw = *reinterpret_cast<const P*>(w + c);
#pragma unroll
    for (int j = 0; j < V; ++j) {
      float norm = (to_float(px.v[j]) - m) * r;
      float dnorm = to_float(pw.v[j]) * to_float(pd.v[j]);
      sum_d += dnorm;
      sum_dn += dnorm * norm;
    }
  }
  const float mean_d = warp_sum(sum_d) / static_cast<float>(C);
  const float mean_dn = warp_sum(sum_dn) / static_cast<float>(C);
  bf16_t* dxr = dx + row * C;
  for (int64_t c = lane * V; c < C; c += 32 * V) {
    P px = *reinterpret_cast<const P*>(xr + c);
    P pd = *reinterpret_cast<const P*>(dyr + c);
    P pw = *reinterpret_cast<const P*>(w + c);
    P po = *reinterpret_cast<const P*>(dxr + c);
#pragma unroll
    for (int j = 0; j < V; ++j) {
      float norm = (to_float(px.v[j]) - m) * r;
      float dnorm = to_float(pw.v[j]) * to_float(pd.v[j]);
      po.v[j] = from_float<bf16_t>(to_float(po.v[j]) + (dnorm - mean_d - norm * mean_dn) * r);
    }
    *reinterpret_cast<P*>(dxr + c) = po;
  }
}

// ---- RMSNorm forward: one warp per row; y = x r w, r = 1 / sqrt(mean(x^2) + eps) -------------
template <int V>
__global__ void rmsnorm_forward_kernel(const bf16_t* x, const bf16_t* w, bf16_t* y, float* rstd, int64_t N, int64_t C,
                                       float eps) {
  const int lane = threadIdx.x % 32;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32;
  if (row >= N) return;
  using P = Pack<bf16_t, V>;
  const bf16_t* xr = x + row * C;
  float ss = 0;
  for (int64_t c = lane * V; c < C; c += 32 * V) {
    P px = *reinterpret_cast<const P*>(xr + c);
#pragma unroll
    for (int j = 0; j < V; ++j) ss += to_float(px.v[j]) * to_float(px.v[j]);
  }
  const float r = 1.0f / sqrtf(warp_sum(ss) / static_cast<float>(C) + eps);
  bf16_t* yr = y + row * C;
  for (int64_t c = lane * V; c < C; c += 32 * V) {
    P px = *reinterpret_cast<const P*>(xr + c);
    P pw = *reinterpret_cast<const P*>(w + c);
    P py;
#pragma unroll
    for (int j = 0; j < V; ++j) py.v[j] = from_float<bf16_t>(to_float(px.v[j]) * r * to_float(pw.v[j]));
    *reinterpret_cast<P*>(yr + c) = py;
  }
  if (lane == 0) rstd[row] = r;
}

// ---- RMSNorm backward, dx: one warp per row; dx += (w dy - xhat mean(w dy xhat)) r, xhat = x r
template <int V>
__global__ void rmsnorm_backward_dx_kernel(const bf16_t* dy, const bf16_t* x, const bf16_t* w, const float* rstd,
                                           bf16_t* dx, int64_t N, int64_t C) {
  const int lane = threadIdx.x % 32;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32;
  if (row >= N) return;
  using P = Pack<bf16_t, V>;
  const bf16_t* xr = x + row * C;
  const bf16_t* dyr = dy + row * C;
  const float r = rstd[row];
  float dot = 0;
  for (int64_t c = lane * V; c < C; c += 32 * V) {
    P px = *reinterpret_cast<const P*>(xr + c);
    P pd = *reinterpret_cast<const P*>(dyr + c);
    P pw = *reinterpret_cast<const P*>(w + c);
#pragma unroll
    for (int j = 0; j < V; ++j) dot += to_float(pw.v[j]) * to_float(pd.v[j]) * to_float(px.v[j]) * r;
  }
  const float mean_dot = warp_sum(dot) / static_cast<float>(C);
  bf16_t* dxr = dx + row * C;
  for (int64_t c = lane * V; c < C; c += 32 * V) {
    P px = *reinterpret_cast<const P*>(xr + c);
    P pd = *reinterpret_cast<const P*>(dyr + c);
    P pw = *reinterpret_cast<const P*>(w + c);
    P po = *reinterpret_cast<const P*>(dxr + c);
#pragma unroll
    for (int j = 0; j < V; ++j)
      po.v[j] = from_float<bf16_t>(to_float(po.v[j]) +
                                   (to_float(pw.v[j]) * to_float(pd.v[j]) - to_float(px.v[j]) * r * mean_dot) * r);
    *reinterpret_cast<P*>(dxr + c) = po;
  }
}

// ---- column sums over rows, in two deterministic steps ---------------------------------------
// Step 1: block (column block, row chunk) of 8 warps; each lane owns V adjacent columns (one
// 16-byte load per row when V = 8), warp w sums rows w, w + 8, ... of the chunk, and the warps'
// sums are added in warp order through shared memory. Writes the chunk's sums to scratch:
// LN: scratch (R, 2, C) = {sum dy*norm, sum dy} (norm = (x - mean) rstd, or x rstd without a
// mean: RMSNorm); bias only: scratch (R, C) = sum dy.
template <bool LN, int V>
__global__ void column_partials_kernel(const bf16_t* dy, const bf16_t* x, const float* mean, const float* rstd,
                                       int64_t N, int64_t C, int64_t rows_per_chunk, float* scratch) {
  constexpr int kCols = 32 * V;  // columns per block
  __shared__ float part_b[kWarps][kCols];
  __shared__ float part_w[LN ? kWarps : 1][LN ? kCols : 1];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int64_t c = static_cast<int64_t>(blockIdx.x) * kCols + lane * V;
  const int64_t r0 = static_cast<int64_t>(blockIdx.y) * rows_per_chunk;
  const int64_t r1 = r0 + rows_per_chunk < N ? r0 + rows_per_chunk : N;
  float sw[V] = {}, sb[V] = {};
  if (c < C) {
    using P = Pack<bf16_t, V>;
    for (int64_t n = r0 + warp; n < r1; n += kWarps) {
      const P pd = *reinterpret_cast<const P*>(dy + n * C + c);
      if constexpr (LN) {
        const P px = *reinterpret_cast<const P*>(x + n * C + c);
        const float m = mean ? mean[n] : 0.f, r = rstd[n];
#pragma unroll
        for (int j = 0; j < V; ++j) sw[j] += to_float(pd.v[j]) * (to_float(px.v[j]) - m) * r;
      }
#pragma unroll
      for (int j = 0; j < V; ++j) sb[j] += to_float(pd.v[j]);
    }
  }
#pragma unroll
  for (int j = 0; j < V; ++j) {
    part_b[warp][lane * V + j] = sb[j];
    if constexpr (LN) part_w[warp][lane * V + j] = sw[j];
  }
  __syncthreads();
  for (int t = threadIdx.x; t < kCols; t += blockDim.x) {
    const int64_t col = static_cast<int64_t>(blockIdx.x) * kCols + t;
    if (col >= C) continue;
    float b = 0, w = 0;
    for (int i = 0; i < kWarps; ++i) {
      b += part_b[i][t];
      if constexpr (LN) w += part_w[i][t];
    }
    if constexpr (LN) {
      scratch[(blockIdx.y * 2 + 0) * C + col] = w;
      scratch[(blockIdx.y * 2 + 1) * C + col] = b;
    } else {
      scratch[blockIdx.y * C + col] = b;
    }
  }
}

// Step 2: thread = column; sums the R chunk partials in order and adds them to dw (LN), db.
template <bool LN>
__global__ void column_final_kernel(const float* scratch, int64_t R, int64_t C, float* dw, float* db) {
  const int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= C) return;
  float sw = 0, sb = 0;
  for (int64_t r = 0; r < R; ++r) {
    if constexpr (LN) {
      sw += scratch[(r * 2 + 0) * C + c];
      sb += scratch[(r * 2 + 1) * C + c];
    } else {
      sb += scratch[r * C + c];
    }
  }
  if constexpr (LN) dw[c] += sw;
  db[c] += sb;
}

// `vec`: C % 8 == 0 and dy, x 16-byte aligned (rows_vectorizable).
template <bool LN>
void column_sums(const bf16_t* dy, const bf16_t* x, const float* mean, const float* rstd, int64_t N, int64_t C,
                 float* dw, float* db, float* scratch, bool vec, cudaStream_t s) {
  if (N == 0 || C == 0) return;
  const int64_t R = column_partial_rows(N), rows_per = (N + R - 1) / R;
  const int64_t cols = vec ? 32 * 8 : 32;
  dim3 grid(static_cast<unsigned>((C + cols - 1) / cols), static_cast<unsigned>(R));
  if (vec)
    column_partials_kernel<LN, 8><<<grid, kThreads, 0, s>>>(dy, x, mean, rstd, N, C, rows_per, scratch);
  else
    column_partials_kernel<LN, 1><<<grid, kThreads, 0, s>>>(dy, x, mean, rstd, N, C, rows_per, scratch);
  column_final_kernel<LN><<<static_cast<unsigned>((C + kThreads - 1) / kThreads), kThreads, 0, s>>>(scratch, R, C, dw,
                                                                                                    db);
}

// ---- softmax cross-entropy: one block per row -------------------------------------------------
// Online (max, sum of exp) per thread, merged across the block.
struct MaxSum {
  float m, s;
};
__device__ __forceinline__ MaxSum merge(MaxSum a, MaxSum b) {
  const float m = fmaxf(a.m, b.m);
  const float sa = a.m == -INFINITY ? 0.f : a.s * expf(a.m - m);
  const float sb = b.m == -INFINITY ? 0.f : b.s * expf(b.m - m);
  // A NaN sum stays NaN (a NaN logit must reach the loss).
  return {m, (a.s != a.s || b.s != b.s) ? NAN : sa + sb};
}
__device__ __forceinline__ void push(MaxSum& a, float x) {
  if (x > a.m) {
    a.s = a.s * expf(a.m - x) + 1.0f;
    a.m = x;
  } else {
    a.s += expf(x - a.m);  // NaN x makes the sum NaN
  }
}

template <int V>
__global__ void xent_stats_kernel(const bf16_t* logits, int64_t N, int64_t Vocab, const int32_t* targets,
                                  int64_t vocab_start, int64_t valid, float* stats) {
  const int64_t n = blockIdx.x;
  const bf16_t* row = logits + n * Vocab;
  using P = Pack<bf16_t, V>;
  // Two packs loaded before either is used (one at a time kept too few loads in flight: 2.2 TB/s
  // on an H200), pushed in the order a pack at a time would.
  constexpr int kLoads = 2;
  const int64_t step = static_cast<int64_t>(blockDim.x) * V;
  MaxSum acc{-INFINITY, 0.f};
  for (int64_t j0 = static_cast<int64_t>(threadIdx.x) * V; j0 < valid; j0 += kLoads * step) {
    P p[kLoads];
#pragma unroll
    for (int l = 0; l < kLoads; ++l)
      if (j0 + l * step < valid) p[l] = *reinterpret_cast<const P*>(row + j0 + l * step);
#pragma unroll
    for (int l = 0; l < kLoads; ++l)
#pragma unroll
      for (int q = 0; q < V; ++q)
        if (j0 + l * step + q < valid) push(acc, to_float(p[l].v[q]));
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    MaxSum other{__shfl_xor_sync(0xffffffffu, acc.m, o), __shfl_xor_sync(0xffffffffu, acc.s, o)};
    acc = merge(acc, other);
  }
  __shared__ MaxSum warps[kWarps];
  if (threadIdx.x % 32 == 0) warps[threadIdx.x / 32] = acc;
  __syncthreads();
  if (threadIdx.x == 0) {
    MaxSum total = warps[0];
    for (int w = 1; w < kWarps; ++w) total = merge(total, warps[w]);
    const int64_t t = targets[n] - vocab_start;
    const bool nan = total.s != total.s;
    if (targets[n] < 0) {  // a token that does not count: lse and loss 0 once the shards are combined
      stats[3 * n + 0] = 0.f;
      stats[3 * n + 1] = vocab_start == 0 ? 1.f : 0.f;
      stats[3 * n + 2] = 0.f;
      return;
    }
    stats[3 * n + 0] = nan ? NAN : total.m;
    stats[3 * n + 1] = total.s;
    stats[3 * n + 2] = (t >= 0 && t < valid) ? to_float(row[t]) : 0.f;
  }
}

__global__ void xent_combine_kernel(const float* parts, int64_t P, int64_t N, float* lse, float* loss) {
  const int64_t n = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (n >= N) return;
  float m = -INFINITY;
  for (int64_t p = 0; p < P; ++p) {
    float x = parts[(p * N + n) * 3];
    m = (m < x) ? x : m;  // std::max's rule, as the CPU backend: a NaN never becomes the max
  }
  float s = 0, target = 0;
  bool nan = false;
  for (int64_t p = 0; p < P; ++p) {
    const float* st = parts + (p * N + n) * 3;
    nan |= st[0] != st[0];
    if (st[1] > 0) s += st[1] * expf(st[0] - m);
    target += st[2];
  }
  const float l = m + logf(s);
  lse[n] = nan ? NAN : l;
  loss[n] = nan ? NAN : l - target;
}

template <int V>
__global__ void xent_backward_kernel(bf16_t* logits, int64_t N, int64_t Vocab, const int32_t* targets,
                                     int64_t vocab_start, int64_t valid, const float* lse, float scale) {
  const int64_t n = blockIdx.x;
  bf16_t* row = logits + n * Vocab;
  const float l = lse[n];
  const int64_t t = targets[n] - vocab_start;
  const bool counted = targets[n] >= 0;  // a negative target: not counted, no gradient
  using P = Pack<bf16_t, V>;
  for (int64_t j = static_cast<int64_t>(threadIdx.x) * V; j < Vocab; j += static_cast<int64_t>(blockDim.x) * V) {
    P p = *reinterpret_cast<const P*>(row + j);
#pragma unroll
    for (int q = 0; q < V; ++q) {
      const int64_t col = j + q;
      float g = 0.f;
      if (col < valid && counted) {
        g = expf(to_float(p.v[q]) - l) * scale;
        if (col == t) g -= scale;
      }
      p.v[q] = from_float<bf16_t>(g);
    }
    *reinterpret_cast<P*>(row + j) = p;
  }
}

bool rows_vectorizable(int64_t C, std::initializer_list<const void*> ptrs) {
  if (C % 8 != 0) return false;
  for (const void* p : ptrs)
    if (p && !aligned_to(p, 16)) return false;
  return true;
}

}  // namespace

int64_t column_partial_rows(int64_t N) { return N < kMaxPartialRows ? (N > 0 ? N : 1) : kMaxPartialRows; }

void layernorm_forward(const bf16* x, const bf16* w, const bf16* b, bf16* y, float* mean, float* rstd, int64_t N,
                       int64_t C, float eps, cudaStream_t s) {
  if (N == 0) return;
  const unsigned blocks = static_cast<unsigned>((N + kWarps - 1) / kWarps);
  if (rows_vectorizable(C, {x, w, b, y}))
    layernorm_forward_kernel<8><<<blocks, kThreads, 0, s>>>(dev(x), dev(w), dev(b), dev(y), mean, rstd, N, C, eps);
  else
    layernorm_forward_kernel<1><<<blocks, kThreads, 0, s>>>(dev(x), dev(w), dev(b), dev(y), mean, rstd, N, C, eps);
}

void rmsnorm_forward(const bf16* x, const bf16* w, bf16* y, float* rstd, int64_t N, int64_t C, float eps,
                     cudaStream_t s) {
  if (N == 0) return;
  const unsigned blocks = static_cast<unsigned>((N + kWarps - 1) / kWarps);
  if (rows_vectorizable(C, {x, w, y}))
    rmsnorm_forward_kernel<8><<<blocks, kThreads, 0, s>>>(dev(x), dev(w), dev(y), rstd, N, C, eps);
  else
    rmsnorm_forward_kernel<1><<<blocks, kThreads, 0, s>>>(dev(x), dev(w), dev(y), rstd, N, C, eps);
}

void rmsnorm_backward(const bf16* dy, const bf16* x, const bf16* w, const float* rstd, bf16* dx, float* dw,
                      float* db_scratch, int64_t N, int64_t C, float* scratch, cudaStream_t s) {
  if (N == 0) return;
  const unsigned blocks = static_cast<unsigned>((N + kWarps - 1) / kWarps);
  if (!dx) {
    // weight gradients only
  } else if (rows_vectorizable(C, {dy, x, w, dx}))
    rmsnorm_backward_dx_kernel<8><<<blocks, kThreads, 0, s>>>(dev(dy), dev(x), dev(w), rstd, dev(dx), N, C);
  else
    rmsnorm_backward_dx_kernel<1><<<blocks, kThreads, 0, s>>>(dev(dy), dev(x), dev(w), rstd, dev(dx), N, C);
  if (dw)
    column_sums<true>(dev(dy), dev(x), nullptr, rstd, N, C, dw, db_scratch, scratch, rows_vectorizable(C, {dy, x}),
                      s);
}

void layernorm_backward(const bf16* dy, const bf16* x, const bf16* w, const float* mean, const float* rstd, bf16* dx,
                        float* dw, float* db, int64_t N, int64_t C, float* scratch, cudaStream_t s) {
  if (N == 0) return;
  const unsigned blocks = static_cast<unsigned>((N + kWarps - 1) / kWarps);
  if (!dx) {
    // weight gradients only
  } else if (rows_vectorizable(C, {dy, x, w, dx}))
    layernorm_backward_dx_kernel<8><<<blocks, kThreads, 0, s>>>(dev(dy), dev(x), dev(w), mean, rstd, dev(dx), N, C);
  else
    layernorm_backward_dx_kernel<1><<<blocks, kThreads, 0, s>>>(dev(dy), dev(x), dev(w), mean, rstd, dev(dx), N, C);
  if (dw) column_sums<true>(dev(dy), dev(x), mean, rstd, N, C, dw, db, scratch, rows_vectorizable(C, {dy, x}), s);
}

void bias_grad(const bf16* dy, int64_t N, int64_t O, float* db, float* scratch, cudaStream_t s) {
  column_sums<false>(dev(dy), nullptr, nullptr, nullptr, N, O, nullptr, db, scratch, rows_vectorizable(O, {dy}), s);
}

void xent_stats(const bf16* logits, int64_t N, int64_t V, const int32_t* targets, int64_t vocab_start, int64_t valid,
                float* stats, cudaStream_t s) {
  if (N == 0) return;
  if (rows_vectorizable(V, {logits}))
    xent_stats_kernel<8><<<static_cast<unsigned>(N), kThreads, 0, s>>>(dev(logits), N, V, targets, vocab_start, valid,
                                                                       stats);
  else
    xent_stats_kernel<1><<<static_cast<unsigned>(N), kThreads, 0, s>>>(dev(logits), N, V, targets, vocab_start, valid,
                                                                       stats);
}

void xent_combine(const float* parts, int64_t P, int64_t N, float* lse, float* loss, cudaStream_t s) {
  if (N == 0) return;
  xent_combine_kernel<<<static_cast<unsigned>((N + kThreads - 1) / kThreads), kThreads, 0, s>>>(parts, P, N, lse,
                                                                                                 loss);
}

void xent_backward(bf16* logits, int64_t N, int64_t V, const int32_t* targets, int64_t vocab_start, int64_t valid,
                   const float* lse, float scale, cudaStream_t s) {
  if (N == 0) return;
  if (rows_vectorizable(V, {logits}))
    xent_backward_kernel<8><<<static_cast<unsigned>(N), kThreads, 0, s>>>(dev(logits), N, V, targets, vocab_start,
                                                                          valid, lse, scale);
  else
    xent_backward_kernel<1><<<static_cast<unsigned>(N), kThreads, 0, s>>>(dev(logits), N, V, targets, vocab_start,
                                                                          valid, lse, scale);
}

}  // namespace tripod::cuda::k
