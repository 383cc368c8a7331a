// Mixture-of-experts kernels of the CUDA backend: the router's top-k and its backward, the
// expert-sorted dispatch order, the permutations, the combine's backward, and the per-head q/k
// RMSNorm. Every sum runs in a fixed order (per thread, then a fixed tree), so results do not
// depend on scheduling; the dispatch order is the CPU's (token order within each expert).
#include <cub/block/block_scan.cuh>

#include "kernels/cuda/device_utils.cuh"

namespace tripod::cuda::k {

namespace {

constexpr int kThreads = 256;

// A router row's log-sum-exp and (sigmoid) the sum of its sigmoid scores.
struct RowStats {
  float lse = 0, ssum = 0;
};

__device__ RowStats row_stats(const float* l, int64_t E, bool sigmoid) {
  float m = -INFINITY;
  for (int64_t e = 0; e < E; ++e) m = fmaxf(m, l[e]);
  float z = 0;
  for (int64_t e = 0; e < E; ++e) z += expf(l[e] - m);
  RowStats r;
  r.lse = m + logf(z);
  if (sigmoid)
    for (int64_t e = 0; e < E; ++e) r.ssum += 1.f / (1.f + expf(-l[e]));
  return r;
}

__device__ __forceinline__ float score(float l, float lse, bool sigmoid) {
  return sigmoid ? 1.f / (1.f + expf(-l)) : expf(l - lse);
}

// One thread per token. The j-th choice is the largest (s + b) after the (j-1)-th in the order
// (value descending, index ascending), so no per-token storage is needed.
__global__ void route_kernel(const float* logits, const float* bias, int64_t N, int64_t E, int k, bool sigmoid,
                             bool normalize, int32_t* idx, float* weights, float* p, float* lse) {
  const int64_t t = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (t >= N) return;
  const float* l = logits + t * E;
  const RowStats rs = row_stats(l, E, sigmoid);
  float prev_v = 0, sum = 0;
  int64_t prev_e = -1;
  for (int j = 0; j < k; ++j) {
    int64_t best = -1;
    float bv = 0;
    for (int64_t e = 0; e < E; ++e) {
      const float v = score(l[e], rs.lse, sigmoid) + (bias ? bias[e] : 0.f);
      const bool after = j == 0 || v < prev_v || (v == prev_v && e > prev_e);
      if (after && (best < 0 || v > bv)) best = e, bv = v;
    }
    const float s = score(l[best], rs.lse, sigmoid);
    idx[t * k + j] = static_cast<int32_t>(best);
    weights[t * k + j] = s;
    sum += s;
    prev_v = bv;
    prev_e = best;
  }
  if (normalize)
    for (int j = 0; j < k; ++j) weights[t * k + j] /= sum;
  for (int64_t e = 0; e < E; ++e) {
    const float s = score(l[e], rs.lse, sigmoid);
    p[t * E + e] = sigmoid ? s / rs.ssum : s;
  }
  lse[t] = rs.lse;
}

// One block per column c of stats: sum over the tokens of p[:, c] (c < E) or lse^2 (c = E), in double.
__global__ void route_stats_kernel(const float* p, const float* lse, int64_t N, int64_t E, float* stats) {
  __shared__ double part[kThreads];
  const int64_t c = blockIdx.x;
  double acc = 0;
  for (int64_t t = threadIdx.x; t < N; t += blockDim.x)
    acc += c < E ? static_cast<double>(p[t * E + c]) : static_cast<double>(lse[t]) * lse[t];
  part[threadIdx.x] = acc;
  __syncthreads();
  for (int w = kThreads / 2; w > 0; w >>= 1) {
    if (static_cast<int>(threadIdx.x) < w) part[threadIdx.x] += part[threadIdx.x + w];
    __syncthreads();
  }
  if (threadIdx.x == 0) stats[c] = static_cast<float>(part[0]);
}

__global__ void route_backward_kernel(const float* logits, const int32_t* idx, const float* dweights,
                                      const float* aux, float z_scale, int64_t N, int64_t E, int k, bool sigmoid,
                                      bool normalize, bf16_t* dlogits) {
  const int64_t t = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (t >= N) return;
  const float* l = logits + t * E;
  const int32_t* it = idx + t * k;
  const float* dw = dweights + t * k;
  const RowStats rs = row_stats(l, E, sigmoid);
  // Through the weights: ds_{i_j} = dw_j, or (dw_j - sum_j' dw_j' w_j') / Z when renormalised.
  float z = 0, wdot = 0;
  if (normalize) {
    for (int j = 0; j < k; ++j) z += score(l[it[j]], rs.lse, sigmoid);
    for (int j = 0; j < k; ++j) wdot += dw[j] * score(l[it[j]], rs.lse, sigmoid) / z;
  }
  float adot = 0;  // sigmoid balancing probabilities P = s / sum(s): sum_e aux_e P_e
  if (aux && sigmoid)
    for (int64_t e = 0; e < E; ++e) adot += aux[e] * score(l[e], rs.lse, true) / rs.ssum;
  auto ds = [&](int64_t e) {
    float d = 0;
    for (int j = 0; j < k; ++j)
      if (it[j] == e) d += normalize ? (dw[j] - wdot) / z : dw[j];
    if (aux) d += sigmoid ? (aux[e] - adot) / rs.ssum : aux[e];
    return d;
  };
  float sdot = 0;  // softmax: sum_e s_e ds_e
  if (!sigmoid)
    for (int64_t e = 0; e < E; ++e) sdot += score(l[e], rs.lse, false) * ds(e);
  for (int64_t e = 0; e < E; ++e) {
    const float s = score(l[e], rs.lse, sigmoid);
    float d = sigmoid ? ds(e) * s * (1.f - s) : s * (ds(e) - sdot);
    if (z_scale != 0.f) d += z_scale * 2.f * rs.lse * expf(l[e] - rs.lse);
    dlogits[t * E + e] = from_float<bf16_t>(d);
  }
}

__global__ void count_kernel(const int32_t* idx, int64_t P, int32_t* routed) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t p = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; p < P; p += stride)
    atomicAdd(&routed[idx[p]], 1);
}

// One block per expert: its pairs in order of p, ranked by a block scan over chunks of the pairs.
__global__ void order_kernel(const int32_t* idx, int64_t P, const int32_t* routed, int64_t capacity, int32_t* row_of,
                             int32_t* slot_of) {
  using Scan = cub::BlockScan<int, kThreads>;
  __shared__ typename Scan::TempStorage temp;
  __shared__ int64_t start, taken;
  const int32_t e = static_cast<int32_t>(blockIdx.x);
  if (threadIdx.x == 0) {
    int64_t s = 0;
    for (int32_t f = 0; f < e; ++f) s += capacity < 0 ? routed[f] : min(static_cast<int64_t>(routed[f]), capacity);
    start = s;
    taken = 0;
  }
  __syncthreads();
  for (int64_t base = 0; base < P; base += kThreads) {
    const int64_t p = base + threadIdx.x;
    const int flag = p < P && idx[p] == e ? 1 : 0;
    int rank = 0, total = 0;
    Scan(temp).ExclusiveSum(flag, rank, total);
    if (flag) {
      const int64_t r = taken + rank;
      if (capacity < 0 || r < capacity) {
        row_of[p] = static_cast<int32_t>(start + r);
        slot_of[start + r] = static_cast<int32_t>(p);
      } else {
        row_of[p] = -1;
      }
    }
    __syncthreads();
    if (threadIdx.x == 0) taken += total;
    __syncthreads();
  }
}

__global__ void permute_kernel(const bf16_t* x, const int32_t* slot_of, int64_t k, const float* weights, bf16_t* xp,
                               int64_t R, int64_t C) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < R * C; i += stride) {
    const int64_t r = i / C, c = i % C;
    const int32_t slot = slot_of[r];
    const float v = to_float(x[(slot / k) * C + c]);
    xp[i] = from_float<bf16_t>(weights ? v * weights[slot] : v);
  }
}

// Rows of W elements of T (a 2- or 4-byte word: the dtype does not matter to a copy).
template <class T>
__global__ void gather_rows_kernel(const T* x, const int32_t* index, T* out, int64_t R, int64_t W) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < R * W; i += stride) {
    const int32_t src = index[i / W];
    out[i] = src < 0 ? T(0) : x[static_cast<int64_t>(src) * W + i % W];
  }
}

__global__ void unpermute_kernel(const bf16_t* yp, const int32_t* row_of, const float* weights, bf16_t* y, int64_t N,
                                 int64_t k, int64_t C) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < N * C; i += stride) {
    const int64_t t = i / C, c = i % C;
    float acc = 0;
    for (int64_t j = 0; j < k; ++j) {
      const int32_t r = row_of[t * k + j];
      if (r < 0) continue;
      acc += (weights ? weights[t * k + j] : 1.f) * to_float(yp[static_cast<int64_t>(r) * C + c]);
    }
    y[i] = from_float<bf16_t>(acc);
  }
}

// One block per row: the row's dot product (fixed tree), then the row scaled by its weight.
__global__ void combine_backward_kernel(bf16_t* g, const bf16_t* act, const int32_t* slot_of, const float* weights,
                                        float* dweights, int64_t F) {
  __shared__ float part[kThreads];
  const int64_t r = blockIdx.x;
  bf16_t* gr = g + r * F;
  const bf16_t* ar = act + r * F;
  float acc = 0;
  for (int64_t f = threadIdx.x; f < F; f += blockDim.x) acc += to_float(ar[f]) * to_float(gr[f]);
  part[threadIdx.x] = acc;
  __syncthreads();
  for (int w = kThreads / 2; w > 0; w >>= 1) {
    if (static_cast<int>(threadIdx.x) < w) part[threadIdx.x] += part[threadIdx.x + w];
    __syncthreads();
  }
  const int32_t slot = slot_of[r];
  if (threadIdx.x == 0) dweights[slot] = part[0];
  const float w = weights[slot];
  for (int64_t f = threadIdx.x; f < F; f += blockDim.x) gr[f] = from_float<bf16_t>(to_float(gr[f]) * w);
}

// One warp per (token, head) of the first n heads.
__global__ void qk_norm_forward_kernel(bf16_t* qkv, int64_t N, int64_t H, int64_t D, int64_t hq, int64_t n,
                                       const bf16_t* w, float eps, bf16_t* saved, float* rstd) {
  const int64_t warp = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (warp >= N * n) return;
  const int64_t t = warp / n, h = warp % n;
  bf16_t* x = qkv + (t * H + h) * D;
  bf16_t* sv = saved + warp * D;
  float ss = 0;
  for (int64_t d = lane; d < D; d += 32) {
    const float v = to_float(x[d]);
    ss += v * v;
    sv[d] = x[d];
  }
  ss = warp_sum(ss);
  const float r = rsqrtf(ss / static_cast<float>(D) + eps);
  const bf16_t* wr = w + (h < hq ? 0 : D);
  for (int64_t d = lane; d < D; d += 32) x[d] = from_float<bf16_t>(to_float(sv[d]) * r * to_float(wr[d]));
  if (lane == 0) rstd[warp] = r;
}

// dw partial sums: block (chunk, column group); each thread one column over the chunk's tokens.
__global__ void qk_norm_dw_kernel(const bf16_t* dqkv, const bf16_t* saved, const float* rstd, int64_t N, int64_t H,
                                  int64_t D, int64_t hq, int64_t n, int64_t tokens_per_chunk, float* partial) {
  const int64_t chunk = blockIdx.x;
  const int64_t col = static_cast<int64_t>(blockIdx.y) * blockDim.x + threadIdx.x;  // in [0, 2D)
  if (col >= 2 * D) return;
  const int64_t g = col / D, d = col % D;
  const int64_t h0 = g == 0 ? 0 : hq, h1 = g == 0 ? hq : n;
  float acc = 0;
  const int64_t t1 = min(N, (chunk + 1) * tokens_per_chunk);
  for (int64_t t = chunk * tokens_per_chunk; t < t1; ++t)
    for (int64_t h = h0; h < h1; ++h)
      acc += to_float(dqkv[(t * H + h) * D + d]) * to_float(saved[(t * n + h) * D + d]) * rstd[t * n + h];
  partial[chunk * 2 * D + col] = acc;
}

__global__ void sum_partials_kernel(const float* partial, int64_t chunks, int64_t cols, float* out) {
  const int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= cols) return;
  float acc = 0;
  for (int64_t i = 0; i < chunks; ++i) acc += partial[i * cols + c];
  out[c] += acc;
}

__global__ void qk_norm_dx_kernel(bf16_t* dqkv, int64_t N, int64_t H, int64_t D, int64_t hq, int64_t n,
                                  const bf16_t* saved, const bf16_t* w, const float* rstd) {
  const int64_t warp = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (warp >= N * n) return;
  const int64_t t = warp / n, h = warp % n;
  bf16_t* dy = dqkv + (t * H + h) * D;
  const bf16_t* x = saved + warp * D;
  const bf16_t* wr = w + (h < hq ? 0 : D);
  const float r = rstd[warp];
  float dot = 0;
  for (int64_t d = lane; d < D; d += 32) dot += to_float(wr[d]) * to_float(dy[d]) * to_float(x[d]) * r;
  dot = warp_sum(dot) / static_cast<float>(D);
  for (int64_t d = lane; d < D; d += 32)
    dy[d] = from_float<bf16_t>((to_float(wr[d]) * to_float(dy[d]) - to_float(x[d]) * r * dot) * r);
}

}  // namespace

void moe_route(const float* logits, const float* bias, int64_t N, int64_t E, int k, bool sigmoid, bool normalize,
               int32_t* idx, float* weights, float* p_scratch, float* lse_scratch, float* stats, cudaStream_t s) {
  if (N > 0)
    route_kernel<<<blocks_for(N, kThreads, 1 << 20), kThreads, 0, s>>>(logits, bias, N, E, k, sigmoid, normalize,
                                                                        idx, weights, p_scratch, lse_scratch);
  route_stats_kernel<<<static_cast<unsigned>(E + 1), kThreads, 0, s>>>(p_scratch, lse_scratch, N, E, stats);
}

void moe_route_backward(const float* logits, const int32_t* idx, const float* dweights, const float* aux,
                        float z_scale, int64_t N, int64_t E, int k, bool sigmoid, bool normalize, bf16* dlogits,
                        cudaStream_t s) {
  if (N == 0) return;
  route_backward_kernel<<<blocks_for(N, kThreads, 1 << 20), kThreads, 0, s>>>(
      logits, idx, dweights, aux, z_scale, N, E, k, sigmoid, normalize, dev(dlogits));
}

void moe_dispatch(const int32_t* idx, int64_t P, int64_t E, int64_t capacity, int32_t* routed, int32_t* row_of,
                  int32_t* slot_of, cudaStream_t s) {
  cudaMemsetAsync(routed, 0, E * sizeof(int32_t), s);
  if (P == 0) return;
  count_kernel<<<blocks_for(P, kThreads), kThreads, 0, s>>>(idx, P, routed);
  order_kernel<<<static_cast<unsigned>(E), kThreads, 0, s>>>(idx, P, routed, capacity, row_of, slot_of);
}

void moe_permute(const bf16* x, const int32_t* slot_of, int64_t k, const float* weights, bf16* xp, int64_t R,
                 int64_t C, cudaStream_t s) {
  if (R * C == 0) return;
  permute_kernel<<<blocks_for(R * C, kThreads), kThreads, 0, s>>>(dev(x), slot_of, k, weights, dev(xp), R, C);
}

void gather_rows(const void* x, const int32_t* index, void* out, int64_t R, int64_t W, int element_bytes,
                 cudaStream_t s) {
  if (R * W == 0) return;
  if (element_bytes == 2)
    gather_rows_kernel<<<blocks_for(R * W, kThreads), kThreads, 0, s>>>(static_cast<const uint16_t*>(x), index,
                                                                         static_cast<uint16_t*>(out), R, W);
  else
    gather_rows_kernel<<<blocks_for(R * W, kThreads), kThreads, 0, s>>>(static_cast<const uint32_t*>(x), index,
                                                                         static_cast<uint32_t*>(out), R, W);
}

void moe_unpermute(const bf16* yp, const int32_t* row_of, const float* weights, bf16* y, int64_t N, int64_t k,
                   int64_t C, cudaStream_t s) {
  if (N * C == 0) return;
  unpermute_kernel<<<blocks_for(N * C, kThreads), kThreads, 0, s>>>(dev(yp), row_of, weights, dev(y), N, k, C);
}

void moe_combine_backward(bf16* g, const bf16* act, const int32_t* slot_of, const float* weights, float* dweights,
                          int64_t R, int64_t F, cudaStream_t s) {
  if (R == 0) return;
  combine_backward_kernel<<<static_cast<unsigned>(R), kThreads, 0, s>>>(dev(g), dev(act), slot_of, weights, dweights,
                                                                         F);
}

void qk_norm_forward(bf16* qkv, int64_t N, int64_t H, int64_t D, int64_t hq, int64_t hk, const bf16* w, float eps,
                     bf16* saved, float* rstd, cudaStream_t s) {
  const int64_t warps = N * (hq + hk);
  if (warps == 0) return;
  qk_norm_forward_kernel<<<blocks_for(warps * 32, kThreads, 1 << 20), kThreads, 0, s>>>(
      dev(qkv), N, H, D, hq, hq + hk, dev(w), eps, dev(saved), rstd);
}

int64_t qk_norm_chunks(int64_t N) { return N < 256 ? (N > 0 ? N : 1) : 256; }

void qk_norm_backward(bf16* dqkv, int64_t N, int64_t H, int64_t D, int64_t hq, int64_t n, const bf16* saved,
                      const bf16* w, const float* rstd, float* dw, float* partial, cudaStream_t s) {
  if (N == 0) return;
  const int64_t chunks = qk_norm_chunks(N), per = (N + chunks - 1) / chunks;
  const dim3 grid(static_cast<unsigned>(chunks), static_cast<unsigned>((2 * D + kThreads - 1) / kThreads));
  qk_norm_dw_kernel<<<grid, kThreads, 0, s>>>(dev(dqkv), dev(saved), rstd, N, H, D, hq, n, per, partial);
  sum_partials_kernel<<<blocks_for(2 * D, kThreads), kThreads, 0, s>>>(partial, chunks, 2 * D, dw);
  qk_norm_dx_kernel<<<blocks_for(N * n * 32, kThreads, 1 << 20), kThreads, 0, s>>>(dev(dqkv), N, H, D, hq, n,
                                                                                   dev(saved), dev(w), rstd);
}

}  // namespace tripod::cuda::k
