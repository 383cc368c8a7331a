// Elementwise kernels of the CUDA backend: fill, dtype conversion, add, accumulate, scale, GELU,
// rotary embeddings, SwiGLU,
// the embedding lookup and its gradient, deterministic sums and the multi-range AdamW.
#include <cuda_fp8.h>

#include "kernels/cuda/device_utils.cuh"
#include "kernels/fp8.h"

namespace tripod::cuda::k {

namespace {

constexpr int kThreads = 256;

// ---- generic maps over packs --------------------------------------------------------------
// o[i] = f(a[i]) (map1) or f(a[i], b[i]) (map2), V elements per load when every pointer is
// aligned to its pack; o may alias an input (each element is read and written by one thread).
template <int V, class A, class O, class F>
__global__ void map1_kernel(const A* a, O* o, int64_t n, F f) {
  const int64_t nv = n / V, stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  for (int64_t i = first; i < nv; i += stride) {
    Pack<A, V> pa = reinterpret_cast<const Pack<A, V>*>(a)[i];
    Pack<O, V> po;
#pragma unroll
    for (int j = 0; j < V; ++j) po.v[j] = from_float<O>(f(to_float(pa.v[j])));
    reinterpret_cast<Pack<O, V>*>(o)[i] = po;
  }
  for (int64_t i = nv * V + first; i < n; i += stride) o[i] = from_float<O>(f(to_float(a[i])));
}

template <int V, class A, class B, class O, class F>
__global__ void map2_kernel(const A* a, const B* b, O* o, int64_t n, F f) {
  const int64_t nv = n / V, stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  for (int64_t i = first; i < nv; i += stride) {
    Pack<A, V> pa = reinterpret_cast<const Pack<A, V>*>(a)[i];
    Pack<B, V> pb = reinterpret_cast<const Pack<B, V>*>(b)[i];
    Pack<O, V> po;
#pragma unroll
    for (int j = 0; j < V; ++j) po.v[j] = from_float<O>(f(to_float(pa.v[j]), to_float(pb.v[j])));
    reinterpret_cast<Pack<O, V>*>(o)[i] = po;
  }
  for (int64_t i = nv * V + first; i < n; i += stride) o[i] = from_float<O>(f(to_float(a[i]), to_float(b[i])));
}

template <class A, class O> constexpr int pack_width() {
  constexpr size_t big = sizeof(A) > sizeof(O) ? sizeof(A) : sizeof(O);
  return static_cast<int>(16 / big);
}

template <class A, class O, class F> void map1(const A* a, O* o, int64_t n, F f, cudaStream_t s) {
  if (n <= 0) return;
  constexpr int V = pack_width<A, O>();
  if (aligned_to(a, V * sizeof(A)) && aligned_to(o, V * sizeof(O)))
    map1_kernel<V><<<blocks_for(n / V + 1, kThreads), kThreads, 0, s>>>(a, o, n, f);
  else
    map1_kernel<1><<<blocks_for(n, kThreads), kThreads, 0, s>>>(a, o, n, f);
}

template <class A, class B, class O, class F>
void map2(const A* a, const B* b, O* o, int64_t n, F f, cudaStream_t s) {
  if (n <= 0) return;
  constexpr int V1 = pack_width<A, O>(), V2 = pack_width<B, O>(), V = V1 < V2 ? V1 : V2;
  if (aligned_to(a, V * sizeof(A)) && aligned_to(b, V * sizeof(B)) && aligned_to(o, V * sizeof(O)))
    map2_kernel<V><<<blocks_for(n / V + 1, kThreads), kThreads, 0, s>>>(a, b, o, n, f);
  else
    map2_kernel<1><<<blocks_for(n, kThreads), kThreads, 0, s>>>(a, b, o, n, f);
}

struct Identity {
  __device__ float operator()(float x) const { return x; }
};
struct Plus {
  __device__ float operator()(float x, float y) const { return x + y; }
};
struct Times {
  float v;
  __device__ float operator()(float x) const { return x * v; }
};

// GELU, tanh approximation: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
constexpr float kGeluS = 0.7978845608028654f;
constexpr float kGeluA = 0.044715f;
struct Gelu {
  __device__ float operator()(float x) const {
    float u = kGeluS * (x + kGeluA * x * x * x);
    return 0.5f * x * (1.0f + tanhf(u));
  }
};
struct GeluGrad {
  __device__ float operator()(float x, float dy) const {
    float u = kGeluS * (x + kGeluA * x * x * x);
    float t = tanhf(u);
    float sech2 = 1.0f - t * t;
    float g = 0.5f * (1.0f + t) + 0.5f * x * sech2 * kGeluS * (1.0f + 3.0f * kGeluA * x * x);
    return g * dy;
  }
};

template <class T> __global__ void fill_kernel(T* p, int64_t n, T v) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) p[i] = v;
}

template <class S> void convert_from(const S* src, void* dst, DType ddt, int64_t n, cudaStream_t s) {
  switch (ddt) {
    case DType::F32: map1(src, static_cast<float*>(dst), n, Identity{}, s); break;
    case DType::BF16: map1(src, static_cast<bf16_t*>(dst), n, Identity{}, s); break;
    case DType::I32: map1(src, static_cast<int32_t*>(dst), n, Identity{}, s); break;
    case DType::F64: break;  // host-only (reductions): CudaOps refuses f64 on the device
    case DType::F8E4M3:
    case DType::F8E5M2: break;  // written by fp8_quantize only: CudaOps refuses conversions
  }
}

// ---- reductions ---------------------------------------------------------------------------
// A thread's loads of one pass over a chunk, issued before any is used: a loop that used each
// element before loading the next kept one load in flight per thread, a fifth of the memory's
// bandwidth. The elements stay in their order (i, i + blockDim.x, ...), so sums keep their bits.
constexpr int kUnroll = 8;

// Block b sums the chunks b, b + gridDim.x, ...; partials[b] gets its sum (0 without chunks).
__global__ void reduce_partial_kernel(const float* x, const Chunk* chunks, int nchunks, bool square,
                                      double* partials) {
  double acc = 0;
  for (int c = blockIdx.x; c < nchunks; c += gridDim.x) {
    const Chunk ch = chunks[c];
    for (int64_t i0 = ch.begin + threadIdx.x; i0 < ch.end; i0 += kUnroll * blockDim.x) {
      float v[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int64_t i = i0 + u * static_cast<int64_t>(blockDim.x);
        v[u] = i < ch.end ? x[i] : 0.f;
      }
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        if (i0 + u * static_cast<int64_t>(blockDim.x) >= ch.end) break;
        const double d = v[u];
        acc += square ? d * d : d;
      }
    }
  }
  __shared__ double warp_sums[kThreads / 32];
  acc = warp_sum(acc);
  if (threadIdx.x % 32 == 0) warp_sums[threadIdx.x / 32] = acc;
  __syncthreads();
  if (threadIdx.x < 32) {
    double v = threadIdx.x < kThreads / 32 ? warp_sums[threadIdx.x] : 0.0;
    v = warp_sum(v);
    if (threadIdx.x == 0) partials[blockIdx.x] = v;
  }
}

// One block of kReduceBlocks threads sums the partials in a fixed tree order.
__global__ void reduce_final_kernel(const double* partials, double* out) {
  __shared__ double buf[kReduceBlocks];
  buf[threadIdx.x] = partials[threadIdx.x];
  __syncthreads();
  for (int half = kReduceBlocks / 2; half > 0; half >>= 1) {
    if (threadIdx.x < half) buf[threadIdx.x] += buf[threadIdx.x + half];
    __syncthreads();
  }
  if (threadIdx.x == 0) out[0] = buf[0];
}

// ---- embedding ------------------------------------------------------------------------------
// Row n's position: pos[n] when given (packed documents), else n % T.
__global__ void embedding_forward_kernel(const int32_t* tok, int64_t N, const bf16_t* wte, int64_t V, int64_t C,
                                         int64_t vocab_start, const bf16_t* wpe, int64_t T, const int32_t* pos,
                                         bf16_t* out) {
  const int64_t total = N * C, stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += stride) {
    const int64_t n = i / C, c = i % C;
    const int64_t row = tok[n] - vocab_start;
    float v = (row >= 0 && row < V) ? to_float(wte[row * C + c]) : 0.f;
    if (wpe) v += to_float(wpe[(pos ? pos[n] : n % T) * C + c]);
    out[i] = from_float<bf16_t>(v);
  }
}

__global__ void embedding_backward_wte_kernel(const int32_t* tok, int64_t N, const bf16_t* dout, int64_t C,
                                              int64_t vocab_start, float* dwte, int64_t V) {
  const int64_t total = N * C, stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += stride) {
    const int64_t n = i / C, c = i % C;
    const int64_t row = tok[n] - vocab_start;
    if (row >= 0 && row < V) atomicAdd(dwte + row * C + c, to_float(dout[i]));
  }
}

// One thread per (position t, column c) sums the rows n = t, t + T, ... in order.
__global__ void embedding_backward_wpe_kernel(int64_t N, const bf16_t* dout, int64_t C, float* dwpe, int64_t T) {
  const int64_t total = T * C, stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += stride) {
    const int64_t t = i / C, c = i % C;
    float acc = 0;
    for (int64_t n = t; n < N; n += T) acc += to_float(dout[n * C + c]);
    dwpe[t * C + c] += acc;
  }
}

// With each row's position given: dwpe[pos[n]] += dout row n (atomics, as the table's gradient).
__global__ void embedding_backward_wpe_positions_kernel(int64_t N, const bf16_t* dout, int64_t C, float* dwpe,
                                                        const int32_t* pos) {
  const int64_t total = N * C, stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += stride) {
    const int64_t n = i / C, c = i % C;
    atomicAdd(dwpe + static_cast<int64_t>(pos[n]) * C + c, to_float(dout[i]));
  }
}

// ---- AdamW --------------------------------------------------------------------------------
// The same arithmetic as the CPU backend, in f32; chunk.flag says whether weight decay applies.
__global__ void adamw_kernel(float* p, const float* g, float* m, float* v, bf16_t* copy, const Chunk* chunks,
                             int nchunks, AdamWArgs a) {
  constexpr int kU = kUnroll / 2;  // four arrays' loads each
  for (int c = blockIdx.x; c < nchunks; c += gridDim.x) {
    const Chunk ch = chunks[c];
    const float wd = ch.flag ? a.weight_decay : 0.f;
    for (int64_t i0 = ch.begin + threadIdx.x; i0 < ch.end; i0 += kU * blockDim.x) {
      float pu[kU] = {}, gu[kU] = {}, mu[kU] = {}, vu[kU] = {};
#pragma unroll
      for (int u = 0; u < kU; ++u) {
        const int64_t i = i0 + u * static_cast<int64_t>(blockDim.x);
        if (i < ch.end) pu[u] = p[i], gu[u] = g[i], mu[u] = m[i], vu[u] = v[i];
      }
#pragma unroll
      for (int u = 0; u < kU; ++u) {
        const int64_t i = i0 + u * static_cast<int64_t>(blockDim.x);
        if (i >= ch.end) break;
        float gi = gu[u] * a.grad_scale;
        float mi = a.beta1 * mu[u] + (1.0f - a.beta1) * gi;
        float vi = a.beta2 * vu[u] + (1.0f - a.beta2) * gi * gi;
        m[i] = mi;
        v[i] = vi;
        float mhat = mi / a.bias_corr1, vhat = vi / a.bias_corr2;
        float pi = pu[u] - a.lr * (mhat / (sqrtf(vhat) + a.eps) + wd * pu[u]);
        p[i] = pi;
        if (copy) copy[i] = __float2bfloat16_rn(pi);
      }
    }
  }
}

}  // namespace

void fill(void* p, DType dt, int64_t n, float value, cudaStream_t s) {
  if (n <= 0) return;
  const unsigned blocks = blocks_for(n, kThreads);
  switch (dt) {
    case DType::F32: fill_kernel<<<blocks, kThreads, 0, s>>>(static_cast<float*>(p), n, value); break;
    case DType::BF16:
      fill_kernel<<<blocks, kThreads, 0, s>>>(static_cast<bf16_t*>(p), n, __float2bfloat16_rn(value));
      break;
    case DType::I32:
      fill_kernel<<<blocks, kThreads, 0, s>>>(static_cast<int32_t*>(p), n, static_cast<int32_t>(value));
      break;
    case DType::F64: break;  // host-only (reductions): CudaOps refuses f64 on the device
    case DType::F8E4M3:
    case DType::F8E5M2: break;  // written by fp8_quantize only: CudaOps refuses fills
  }
}

void convert(const void* src, DType sdt, void* dst, DType ddt, int64_t n, cudaStream_t s) {
  switch (sdt) {
    case DType::F32: convert_from(static_cast<const float*>(src), dst, ddt, n, s); break;
    case DType::BF16: convert_from(static_cast<const bf16_t*>(src), dst, ddt, n, s); break;
    case DType::I32: convert_from(static_cast<const int32_t*>(src), dst, ddt, n, s); break;
    case DType::F64: break;  // host-only (reductions): CudaOps refuses f64 on the device
    case DType::F8E4M3:
    case DType::F8E5M2: break;  // copied as they are only: CudaOps refuses conversions
  }
}

void add(const void* a, const void* b, void* out, DType dt, int64_t n, cudaStream_t s) {
  if (dt == DType::BF16)
    map2(static_cast<const bf16_t*>(a), static_cast<const bf16_t*>(b), static_cast<bf16_t*>(out), n, Plus{}, s);
  else
    map2(static_cast<const float*>(a), static_cast<const float*>(b), static_cast<float*>(out), n, Plus{}, s);
}

void accumulate(void* dst, DType ddt, const void* src, DType sdt, int64_t n, cudaStream_t s) {
  if (ddt == DType::F32) {
    float* d = static_cast<float*>(dst);
    if (sdt == DType::BF16)
      map2(d, static_cast<const bf16_t*>(src), d, n, Plus{}, s);
    else
      map2(d, static_cast<const float*>(src), d, n, Plus{}, s);
  } else {
    bf16_t* d = static_cast<bf16_t*>(dst);
    if (sdt == DType::BF16)
      map2(d, static_cast<const bf16_t*>(src), d, n, Plus{}, s);
    else
      map2(d, static_cast<const float*>(src), d, n, Plus{}, s);
  }
}

void scale(void* p, DType dt, int64_t n, float v, cudaStream_t s) {
  if (dt == DType::BF16)
    map1(static_cast<const bf16_t*>(p), static_cast<bf16_t*>(p), n, Times{v}, s);
  else
    map1(static_cast<const float*>(p), static_cast<float*>(p), n, Times{v}, s);
}

void reduce_sum(const float* x, const Chunk* chunks, int nchunks, bool square, double* partials, double* out,
                cudaStream_t s) {
  reduce_partial_kernel<<<kReduceBlocks, kThreads, 0, s>>>(x, chunks, nchunks, square, partials);
  reduce_final_kernel<<<1, kReduceBlocks, 0, s>>>(partials, out);
}

void gelu_forward(const bf16* x, bf16* y, int64_t n, cudaStream_t s) { map1(dev(x), dev(y), n, Gelu{}, s); }

void gelu_backward(const bf16* x, const bf16* dy, bf16* dx, int64_t n, cudaStream_t s) {
  map2(dev(x), dev(dy), dev(dx), n, GeluGrad{}, s);
}

namespace {

// Thread per (row n, rotated head, pair i < D/2).
// Row n's position: pos[n] when given (packed documents), else pos0 + n % T.
__global__ void rope_kernel(bf16_t* x, int64_t N, int64_t heads, int64_t D, int64_t rot, int64_t T, int64_t pos0,
                            const int32_t* pos, double theta, bool inverse) {
  const int64_t h = D / 2, stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < N * rot * h; e += stride) {
    const int64_t i = e % h, hd = (e / h) % rot, n = e / (h * rot);
    const int64_t p = pos ? static_cast<int64_t>(pos[n]) : pos0 + n % T;
    const double a = static_cast<double>(p) * pow(theta, -2.0 * static_cast<double>(i) / static_cast<double>(D));
    double sn, cs;
    sincos(a, &sn, &cs);
    const float c = static_cast<float>(cs), s = static_cast<float>(inverse ? -sn : sn);
    bf16_t* v = x + (n * heads + hd) * D;
    const float x1 = to_float(v[i]), x2 = to_float(v[i + h]);
    v[i] = from_float<bf16_t>(x1 * c - x2 * s);
    v[i + h] = from_float<bf16_t>(x2 * c + x1 * s);
  }
}

// Thread per (n, f).
// Thread per V consecutive outputs of a row (F % V == 0; with V > 1 every pointer aligned to a
// pack): one division per V elements and 16-byte loads, where a thread per element divided by F
// for each and loaded 2 bytes at a time. The same arithmetic per element either way.
template <int V>
__global__ void swiglu_forward_kernel(const bf16_t* gu, bf16_t* y, int64_t N, int64_t F) {
  using P = Pack<bf16_t, V>;
  const int64_t Fv = F / V, stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < N * Fv; e += stride) {
    const int64_t n = e / Fv, f = (e % Fv) * V;
    const P g = *reinterpret_cast<const P*>(gu + n * 2 * F + f), u = *reinterpret_cast<const P*>(gu + n * 2 * F + F + f);
    P o;
#pragma unroll
    for (int j = 0; j < V; ++j) {
      const float gj = to_float(g.v[j]), uj = to_float(u.v[j]);
      o.v[j] = from_float<bf16_t>(gj / (1.0f + expf(-gj)) * uj);
    }
    *reinterpret_cast<P*>(y + e * V) = o;
  }
}

template <int V>
__global__ void swiglu_backward_kernel(const bf16_t* gu, const bf16_t* dy, bf16_t* dgu, int64_t N, int64_t F) {
  using P = Pack<bf16_t, V>;
  const int64_t Fv = F / V, stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < N * Fv; e += stride) {
    const int64_t n = e / Fv, f = (e % Fv) * V;
    const P g = *reinterpret_cast<const P*>(gu + n * 2 * F + f), u = *reinterpret_cast<const P*>(gu + n * 2 * F + F + f);
    const P d = *reinterpret_cast<const P*>(dy + e * V);
    P dg, du;
#pragma unroll
    for (int j = 0; j < V; ++j) {
      const float gj = to_float(g.v[j]), uj = to_float(u.v[j]), dj = to_float(d.v[j]);
      const float sg = 1.0f / (1.0f + expf(-gj));
      dg.v[j] = from_float<bf16_t>(dj * uj * sg * (1.0f + gj * (1.0f - sg)));
      du.v[j] = from_float<bf16_t>(dj * gj * sg);
    }
    *reinterpret_cast<P*>(dgu + n * 2 * F + f) = dg;
    *reinterpret_cast<P*>(dgu + n * 2 * F + F + f) = du;
  }
}

}  // namespace

void rope(bf16* x, int64_t N, int64_t heads, int64_t D, int64_t rot_heads, int64_t T, int64_t pos0, double theta,
          bool inverse, cudaStream_t s) {
  const int64_t n = N * rot_heads * (D / 2);
  if (n == 0) return;
  rope_kernel<<<blocks_for(n, kThreads), kThreads, 0, s>>>(dev(x), N, heads, D, rot_heads, T, pos0, nullptr, theta,
                                                           inverse);
}

void rope_positions(bf16* x, int64_t N, int64_t heads, int64_t D, int64_t rot_heads, const int32_t* positions,
                    double theta, bool inverse, cudaStream_t s) {
  const int64_t n = N * rot_heads * (D / 2);
  if (n == 0) return;
  rope_kernel<<<blocks_for(n, kThreads), kThreads, 0, s>>>(dev(x), N, heads, D, rot_heads, 1, 0, positions, theta,
                                                           inverse);
}

void swiglu_forward(const bf16* gu, bf16* y, int64_t N, int64_t F, cudaStream_t s) {
  if (N * F == 0) return;
  if (F % 8 == 0 && aligned_to(gu, 16) && aligned_to(y, 16))
    swiglu_forward_kernel<8><<<blocks_for(N * F / 8, kThreads), kThreads, 0, s>>>(dev(gu), dev(y), N, F);
  else
    swiglu_forward_kernel<1><<<blocks_for(N * F, kThreads), kThreads, 0, s>>>(dev(gu), dev(y), N, F);
}

void swiglu_backward(const bf16* gu, const bf16* dy, bf16* dgu, int64_t N, int64_t F, cudaStream_t s) {
  if (N * F == 0) return;
  if (F % 8 == 0 && aligned_to(gu, 16) && aligned_to(dy, 16) && aligned_to(dgu, 16))
    swiglu_backward_kernel<8><<<blocks_for(N * F / 8, kThreads), kThreads, 0, s>>>(dev(gu), dev(dy), dev(dgu), N, F);
  else
    swiglu_backward_kernel<1><<<blocks_for(N * F, kThreads), kThreads, 0, s>>>(dev(gu), dev(dy), dev(dgu), N, F);
}

void embedding_forward(const int32_t* tok, int64_t N, const bf16* wte, int64_t V, int64_t C, int64_t vocab_start,
                       const bf16* wpe, int64_t T, bf16* out, cudaStream_t s) {
  if (N * C == 0) return;
  embedding_forward_kernel<<<blocks_for(N * C, kThreads), kThreads, 0, s>>>(tok, N, dev(wte), V, C, vocab_start,
                                                                          dev(wpe), T, nullptr, dev(out));
}

void embedding_forward_positions(const int32_t* tok, int64_t N, const bf16* wte, int64_t V, int64_t C,
                                 int64_t vocab_start, const bf16* wpe, const int32_t* positions, bf16* out,
                                 cudaStream_t s) {
  if (N * C == 0) return;
  embedding_forward_kernel<<<blocks_for(N * C, kThreads), kThreads, 0, s>>>(tok, N, dev(wte), V, C, vocab_start,
                                                                          dev(wpe), 1, positions, dev(out));
}

void embedding_backward_positions(const int32_t* tok, int64_t N, const bf16* dout, int64_t C, int64_t vocab_start,
                                  float* dwte, int64_t V, float* dwpe, const int32_t* positions, cudaStream_t s) {
  if (N * C == 0) return;
  embedding_backward_wte_kernel<<<blocks_for(N * C, kThreads), kThreads, 0, s>>>(tok, N, dev(dout), C, vocab_start,
                                                                               dwte, V);
  if (dwpe)
    embedding_backward_wpe_positions_kernel<<<blocks_for(N * C, kThreads), kThreads, 0, s>>>(N, dev(dout), C, dwpe,
                                                                                           positions);
}

void embedding_backward(const int32_t* tok, int64_t N, const bf16* dout, int64_t C, int64_t vocab_start, float* dwte,
                        int64_t V, float* dwpe, int64_t T, cudaStream_t s) {
  if (N * C == 0) return;
  embedding_backward_wte_kernel<<<blocks_for(N * C, kThreads), kThreads, 0, s>>>(tok, N, dev(dout), C, vocab_start,
                                                                               dwte, V);
  if (dwpe)
    embedding_backward_wpe_kernel<<<blocks_for(T * C, kThreads), kThreads, 0, s>>>(N, dev(dout), C, dwpe, T);
}

void adamw(float* p, const float* g, float* m, float* v, bf16* copy, const Chunk* chunks, int nchunks,
           const AdamWArgs& a, cudaStream_t s) {
  if (nchunks <= 0) return;
  const unsigned blocks = static_cast<unsigned>(nchunks < 4096 ? nchunks : 4096);
  adamw_kernel<<<blocks, kThreads, 0, s>>>(p, g, m, v, dev(copy), chunks, nchunks, a);
}

// ---- FP8 casts -------------------------------------------------------------------------------
namespace {

constexpr int kTile = 32, kTileRows = 8;  // a 32 x 32 tile per block of 32 x 8 threads

__device__ __forceinline__ uint32_t abs_bits(float v) { return __float_as_uint(v) & 0x7fffffffu; }

__device__ __forceinline__ uint32_t warp_max_u32(uint32_t v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = max(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
__device__ __forceinline__ int warp_sum_int(int v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Adds a block's max |x| (as bits) and clipped count to the running results; every thread calls it.
template <int kWarps>
__device__ void block_amax_count(uint32_t m, int clipped, float* amax, float* saturated) {
  __shared__ uint32_t wm[kWarps];
  __shared__ int wc[kWarps];
  const int tid = threadIdx.y * blockDim.x + threadIdx.x, warp = tid / 32, lane = tid % 32;
  m = warp_max_u32(m);
  clipped = warp_sum_int(clipped);
  if (lane == 0) {
    wm[warp] = m;
    wc[warp] = clipped;
  }
  __syncthreads();
  if (tid == 0) {
    uint32_t bm = 0;
    int bc = 0;
    for (int w = 0; w < kWarps; ++w) {
      bm = max(bm, wm[w]);
      bc += wc[w];
    }
    if (amax) atomicMax(reinterpret_cast<unsigned int*>(amax), bm);
    if (saturated && bc) atomicAdd(saturated, static_cast<float>(bc));
  }
}

__global__ void fp8_amax_kernel(const bf16_t* x, int64_t n, float* amax) {
  uint32_t m = 0;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    m = max(m, abs_bits(__bfloat162float(x[i])));
  block_amax_count<kThreads / 32>(m, 0, amax, nullptr);
}

__global__ void fp8_scale_kernel(const float* amaxes, int P, float fmt_max, float margin_factor, float* scale,
                                 float* record) {
  uint32_t m = 0;
  for (int i = 0; i < P; ++i) m = max(m, abs_bits(amaxes[i]));
  const float a = __uint_as_float(m);
  const float sc = fp8_scale_from_amax(a, fmt_max, margin_factor, 1.f);
  scale[0] = sc;
  scale[1] = __fdiv_rn(1.f, sc);
  if (record && m > abs_bits(record[0])) record[0] = a;
}

// One 32 x 32 tile of x: each thread casts 4 elements of a column (rows threadIdx.y + 8 j), writes
// q coalesced along the row, keeps the bytes in shared memory and writes qt coalesced along its
// row (a column of x).
template <bool kE5M2>
__global__ void fp8_quantize_kernel(const bf16_t* x, int64_t R, int64_t C, const float* scale, uint8_t* q,
                                    uint8_t* qt, float* amax, float* saturated) {
  __shared__ uint8_t tile[kTile][kTile + 4];
  const int64_t c0 = static_cast<int64_t>(blockIdx.x) * kTile, r0 = static_cast<int64_t>(blockIdx.y) * kTile;
  const float s = scale[0];
  constexpr Fp8Format fmt = kE5M2 ? Fp8Format::E5M2 : Fp8Format::E4M3;
  uint32_t m = 0;
  int clipped = 0;
  const int64_t c = c0 + threadIdx.x;
#pragma unroll
  for (int j = 0; j < kTile / kTileRows; ++j) {
    const int i = threadIdx.y + kTileRows * j;
    const int64_t r = r0 + i;
    uint8_t b = 0;
    if (r < R && c < C) {
      const float v = __bfloat162float(x[r * C + c]);
      m = max(m, abs_bits(v));
      const float sv = __fmul_rn(v, s);
      clipped += fp8_clipped(sv, fmt) ? 1 : 0;
      b = __nv_cvt_float_to_fp8(sv, __NV_SATFINITE, kE5M2 ? __NV_E5M2 : __NV_E4M3);
      if (q) q[r * C + c] = b;
    }
    tile[i][threadIdx.x] = b;
  }
  if (qt) {
    __syncthreads();
    const int64_t r = r0 + threadIdx.x;
#pragma unroll
    for (int j = 0; j < kTile / kTileRows; ++j) {
      const int i = threadIdx.y + kTileRows * j;
      const int64_t cc = c0 + i;
      if (cc < C && r < R) qt[cc * R + r] = tile[threadIdx.x][i];
    }
  }
  if (amax || saturated) block_amax_count<kTile * kTileRows / 32>(m, clipped, amax, saturated);
}

__global__ void fp8_gemm_scales_kernel(const float* a_scale, const float* b_scale, float* out) {
  out[0] = a_scale[1];
  out[4] = b_scale[1];
}

}  // namespace

void fp8_amax(const bf16* x, int64_t n, float* amax, cudaStream_t s) {
  if (n <= 0) return;
  fp8_amax_kernel<<<blocks_for(n, kThreads, 2048), kThreads, 0, s>>>(dev(x), n, amax);
}

void fp8_scale(const float* amaxes, int P, float fmt_max, float margin_factor, float* scale, float* record,
               cudaStream_t s) {
  fp8_scale_kernel<<<1, 1, 0, s>>>(amaxes, P, fmt_max, margin_factor, scale, record);
}

void fp8_quantize(const bf16* x, int64_t R, int64_t C, const float* scale, bool e5m2, uint8_t* q, uint8_t* qt,
                  float* amax, float* saturated, cudaStream_t s) {
  if (R <= 0 || C <= 0) return;
  const dim3 grid(static_cast<unsigned>((C + kTile - 1) / kTile), static_cast<unsigned>((R + kTile - 1) / kTile));
  const dim3 block(kTile, kTileRows);
  if (e5m2)
    fp8_quantize_kernel<true><<<grid, block, 0, s>>>(dev(x), R, C, scale, q, qt, amax, saturated);
  else
    fp8_quantize_kernel<false><<<grid, block, 0, s>>>(dev(x), R, C, scale, q, qt, amax, saturated);
}

void fp8_gemm_scales(const float* a_scale, const float* b_scale, float* out, cudaStream_t s) {
  fp8_gemm_scales_kernel<<<1, 1, 0, s>>>(a_scale, b_scale, out);
}

}  // namespace tripod::cuda::k
