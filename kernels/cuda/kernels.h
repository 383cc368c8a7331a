// Launchers of the CUDA backend's own kernels: raw pointers and sizes, enqueued on an explicit
// stream. They do not check for errors; the Ops wrappers (cuda_ops.cpp, layers.cpp) check every
// launch and name the op and the shapes. This header stays free of fmt/spdlog so that nvcc only
// compiles CUDA code.
//
// bf16 arrays are tripod::bf16 here (host type, same bits as __nv_bfloat16 on the device).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "core/dtype.h"

namespace tripod::cuda::k {

// A piece [begin, end) of a flat buffer for the multi-range kernels (AdamW, sums), with a flag
// (AdamW: weight decay applies). Ranges are cut into chunks of at most kChunkElems so one block
// handles one chunk.
struct Chunk {
  int64_t begin = 0, end = 0;
  int32_t flag = 0, pad = 0;
};
inline constexpr int64_t kChunkElems = 1 << 16;
// Blocks of the reductions: each writes one partial sum, summed in a fixed order afterwards, so
// sums do not depend on scheduling.
inline constexpr int kReduceBlocks = 1024;

// ---- memory and elementwise (elementwise.cu) ------------------------------------------------
void fill(void* p, DType dt, int64_t n, float value, cudaStream_t s);
// dst[i] = src[i] converted (f32, bf16, i32 in any combination).
void convert(const void* src, DType sdt, void* dst, DType ddt, int64_t n, cudaStream_t s);
// out = a + b, all of dtype dt (f32 or bf16).
void add(const void* a, const void* b, void* out, DType dt, int64_t n, cudaStream_t s);
// dst += src (dst f32 or bf16, src f32 or bf16).
void accumulate(void* dst, DType ddt, const void* src, DType sdt, int64_t n, cudaStream_t s);
void scale(void* p, DType dt, int64_t n, float v, cudaStream_t s);
// out[0] = sum of x[i] (or x[i]^2 with `square`) over the chunks, in double. `partials` holds
// kReduceBlocks doubles.
void reduce_sum(const float* x, const Chunk* chunks, int nchunks, bool square, double* partials, double* out,
                cudaStream_t s);

// ---- GELU, tanh approximation (elementwise.cu) ----------------------------------------------
void gelu_forward(const bf16* x, bf16* y, int64_t n, cudaStream_t s);
// dx = dy * gelu'(x); dx may alias dy.
void gelu_backward(const bf16* x, const bf16* dy, bf16* dx, int64_t n, cudaStream_t s);

// ---- rotary embeddings, SwiGLU (elementwise.cu) ----------------------------------------------
// In place on x (N, heads, D): heads [0, rot_heads) of row n rotated by the angles of position
// pos0 + n % T (Ops::rope's convention; angles in double); `inverse` rotates back.
void rope(bf16* x, int64_t N, int64_t heads, int64_t D, int64_t rot_heads, int64_t T, int64_t pos0, double theta,
          bool inverse, cudaStream_t s);
// The same with row n at position positions[n] (i32, on the device).
void rope_positions(bf16* x, int64_t N, int64_t heads, int64_t D, int64_t rot_heads, const int32_t* positions,
                    double theta, bool inverse, cudaStream_t s);
// gu (N, 2F) = [gate | up] -> y (N, F) = silu(gate) up; backward: dgu (N, 2F) from dy (N, F).
void swiglu_forward(const bf16* gu, bf16* y, int64_t N, int64_t F, cudaStream_t s);
void swiglu_backward(const bf16* gu, const bf16* dy, bf16* dgu, int64_t N, int64_t F, cudaStream_t s);

// ---- embedding (elementwise.cu) -------------------------------------------------------------
// out (N, C) = wte[tok - vocab_start] (0 outside [0, V)) + wpe[n % T] (when wpe is not null).
void embedding_forward(const int32_t* tok, int64_t N, const bf16* wte, int64_t V, int64_t C, int64_t vocab_start,
                       const bf16* wpe, int64_t T, bf16* out, cudaStream_t s);
// dwte (V, C) += rows of dout by token (atomics); dwpe (>= T, C) += dout summed per position.
void embedding_backward(const int32_t* tok, int64_t N, const bf16* dout, int64_t C, int64_t vocab_start, float* dwte,
                        int64_t V, float* dwpe, int64_t T, cudaStream_t s);

// The same with row n at position positions[n] (i32, on the device; wpe given); the backward adds
// into dwpe by atomics.
void embedding_forward_positions(const int32_t* tok, int64_t N, const bf16* wte, int64_t V, int64_t C,
                                 int64_t vocab_start, const bf16* wpe, const int32_t* positions, bf16* out,
                                 cudaStream_t s);
void embedding_backward_positions(const int32_t* tok, int64_t N, const bf16* dout, int64_t C, int64_t vocab_start,
                                  float* dwte, int64_t V, float* dwpe, const int32_t* positions, cudaStream_t s);

// ---- AdamW over chunks of flat f32 buffers (elementwise.cu) ---------------------------------
struct AdamWArgs {
  float lr, beta1, beta2, eps, weight_decay, grad_scale;
  float bias_corr1, bias_corr2;  // 1 - beta^step, computed on the host as the CPU backend does
};
// copy (bf16, may be null) receives the updated values. Chunks index all buffers alike.
void adamw(float* p, const float* g, float* m, float* v, bf16* copy, const Chunk* chunks, int nchunks,
           const AdamWArgs& a, cudaStream_t s);

// ---- FP8 casts (elementwise.cu; formats and rules in kernels/fp8.h) ------------------------------
// amax[0] = max(amax[0], max |x|) over n elements (f32 bits compared: a NaN wins, as on the CPU).
void fp8_amax(const bf16* x, int64_t n, float* amax, cudaStream_t s);
// a = the max of amaxes[0..P); scale = {s, 1/s}, s = fp8_scale_from_amax(a, fmt_max, margin_factor,
// 1); record (may be null) = max(record, a). One thread: the scale never leaves the device.
void fp8_scale(const float* amaxes, int P, float fmt_max, float margin_factor, float* scale, float* record,
               cudaStream_t s);
// x (R, C) bf16 -> q (R, C) and/or qt (C, R) (either may be null) = fp8(x * scale[0]) in e4m3 or
// e5m2 (the hardware's saturating conversion), one pass over 32 x 32 tiles; amax (may be null) =
// max(amax, max |x|); saturated (may be null) += the clipped elements (fp8_clipped).
void fp8_quantize(const bf16* x, int64_t R, int64_t C, const float* scale, bool e5m2, uint8_t* q, uint8_t* qt,
                  float* amax, float* saturated, cudaStream_t s);
// out[0] = a_scale[1], out[4] = b_scale[1]: two {s, 1/s} pairs' dequantization factors 16 bytes
// apart (cuBLASLt's FP8 GEMMs take scale pointers aligned to 16 bytes; a pair's 1/s is at 4).
void fp8_gemm_scales(const float* a_scale, const float* b_scale, float* out, cudaStream_t s);

// ---- LayerNorm, bias gradient, softmax cross-entropy (norm_xent.cu) --------------------------
// x (N, C) -> y (N, C); mean, rstd (N) f32.
void layernorm_forward(const bf16* x, const bf16* w, const bf16* b, bf16* y, float* mean, float* rstd, int64_t N,
                       int64_t C, float eps, cudaStream_t s);
// dx (N, C) += d/dx. The weight and bias gradients (f32, += into dw, db) go through `scratch`
// (column_partial_rows(N) * 2 * C floats). dx null skips the input gradient; dw (and db, scratch)
// null skips the weight gradients.
void layernorm_backward(const bf16* dy, const bf16* x, const bf16* w, const float* mean, const float* rstd, bf16* dx,
                        float* dw, float* db, int64_t N, int64_t C, float* scratch, cudaStream_t s);
// RMSNorm: x (N, C) -> y = x rstd w; rstd (N) f32.
void rmsnorm_forward(const bf16* x, const bf16* w, bf16* y, float* rstd, int64_t N, int64_t C, float eps,
                     cudaStream_t s);
// dx (N, C) += d/dx; dw (C) f32 +=. db_scratch: C floats that receive the (unused) column sums of
// dy; scratch as layernorm_backward's. dx or dw null skips that half.
void rmsnorm_backward(const bf16* dy, const bf16* x, const bf16* w, const float* rstd, bf16* dx, float* dw,
                      float* db_scratch, int64_t N, int64_t C, float* scratch, cudaStream_t s);
// db (O) f32 += sum over the N rows of dy (N, O); scratch: column_partial_rows(N) * O floats.
void bias_grad(const bf16* dy, int64_t N, int64_t O, float* db, float* scratch, cudaStream_t s);
// Row chunks of the column reductions above (each writes one partial row, summed in order).
int64_t column_partial_rows(int64_t N);

// logits (N, V) bf16, targets (N) i32: stats (N, 3) f32 = {max over the first `valid` columns,
// sum exp(l - max), logit of target - vocab_start or 0}; NaN in a row makes stats[0] NaN.
void xent_stats(const bf16* logits, int64_t N, int64_t V, const int32_t* targets, int64_t vocab_start, int64_t valid,
                float* stats, cudaStream_t s);
// parts (P, N, 3) -> lse (N), loss (N).
void xent_combine(const float* parts, int64_t P, int64_t N, float* lse, float* loss, cudaStream_t s);
// In place: logits = (exp(l - lse) - onehot(target)) * scale over the valid columns, 0 beyond.
void xent_backward(bf16* logits, int64_t N, int64_t V, const int32_t* targets, int64_t vocab_start, int64_t valid,
                   const float* lse, float scale, cudaStream_t s);

// ---- reference causal attention (attention_ref.cu) ------------------------------------------
// Exact (non-tiled) kernels used when cuDNN has no engine for a shape, or on request
// (TRIPOD_ATTENTION=reference). qkv (B, T, H + 2 Hkv, D) (Ops' grouped layout), out (B, T, H, D)
// bf16, lse (B, H, T) f32. `start` (B, T) i32, or null: each query's document start (packed
// documents: it sees keys start..itself only).
void attention_forward(const bf16* qkv, bf16* out, float* lse, int64_t B, int64_t T, int64_t H, int64_t Hkv,
                       int64_t D, const int32_t* start, float scale, cudaStream_t s);
// dqkv (B, T, H + 2 Hkv, D) from dout (B, T, H, D) (a key/value head's gradient sums over its
// query group); delta: B*H*T floats of scratch.
void attention_backward(const bf16* dout, const bf16* qkv, const bf16* out, const float* lse, bf16* dqkv,
                        float* delta, int64_t B, int64_t T, int64_t H, int64_t Hkv, int64_t D,
                        const int32_t* start, float scale, cudaStream_t s);
// Attention against a KV cache (inference): the n new tokens of qkv (B, n, H + 2 Hkv, D) at
// positions [pos, pos + n) append their k, v to k_cache, v_cache (B, Hkv, T_max, D); out
// (B, n, H, D) is each new token's causal attention over the cache. bf16 in and out, f32 softmax.
void attention_decode(const bf16* qkv, bf16* k_cache, bf16* v_cache, bf16* out, int64_t B, int64_t n, int64_t H,
                      int64_t Hkv, int64_t D, int64_t Tmax, int64_t pos, float scale, cudaStream_t s);
// Blocks of context-parallel attention (Ops::attention_block_forward / _backward): q (B, Tq, Wq, D)
// bf16, kv (B, Tk, 2 Hkv, D) bf16; out (B, Tq, H, D) and lse (B, H, Tq) f32 running results the
// block merges into. Backward: dout, out bf16; delta B*H*Tq floats of scratch; dq (B, Tq, Wq, D)
// and dkv f32 +=. `start` (B, Tq) i32 and key_pos: BlockDocs (null: no document mask).
void attention_block_forward(const bf16* q, const bf16* kv, float* out, float* lse, int64_t B, int64_t Tq, int64_t Tk,
                             int64_t Wq, int64_t H, int64_t Hkv, int64_t D, bool causal, const int32_t* start,
                             int64_t key_pos, float scale, cudaStream_t s);
void attention_block_backward(const bf16* dout, const bf16* q, const bf16* kv, const bf16* out, const float* lse,
                              float* delta, float* dq, float* dkv, int64_t B, int64_t Tq, int64_t Tk, int64_t Wq,
                              int64_t H, int64_t Hkv, int64_t D, bool causal, const int32_t* start, int64_t key_pos,
                              float scale, cudaStream_t s);
// The last w elements of every row of width W <-> rows of width w (the key/value heads of qkv).
void attention_kv_pack(const bf16* qkv, bf16* kv, int64_t N, int64_t W, int64_t w, cudaStream_t s);
void attention_kv_unpack(const float* kv, bf16* qkv, int64_t N, int64_t W, int64_t w, cudaStream_t s);
void attention_kv_unpack(const bf16* kv, bf16* qkv, int64_t N, int64_t W, int64_t w, cudaStream_t s);
// Packed documents batched by length for cuDNN (attention.cpp): gather copies document i's len[i]
// rows (of width w elements) from row first[i] of src (B T rows) into rows [i L, i L + len[i]) of
// dst (n L rows), zeroing the rest; !gather copies the real rows back. table (device, i32):
// first[0..n) then len[0..n). doc_lse does the same between lse (B, H, T) and (n, H, L).
void doc_rows(const bf16* src, bf16* dst, const int32_t* table, int64_t n, int64_t L, int64_t w, bool gather,
              cudaStream_t s);
void doc_lse(const float* src, float* dst, const int32_t* table, int64_t n, int64_t L, int64_t H, int64_t T,
             bool gather, cudaStream_t s);
// Largest head dimension the reference kernels take.
inline constexpr int64_t kMaxRefHeadDim = 256;

// ---- mixture of experts (moe.cu), Ops' conventions (kernels/op.h) ------------------------------
// logits (N, E) f32 -> idx, weights (N, k); p_scratch (N, E) and lse_scratch (N) f32 receive the
// balancing probabilities and log-sum-exps; stats (E + 1) f32 their column sums and sum of lse^2.
void moe_route(const float* logits, const float* bias, int64_t N, int64_t E, int k, bool sigmoid, bool normalize,
               int32_t* idx, float* weights, float* p_scratch, float* lse_scratch, float* stats, cudaStream_t s);
void moe_route_backward(const float* logits, const int32_t* idx, const float* dweights, const float* aux,
                        float z_scale, int64_t N, int64_t E, int k, bool sigmoid, bool normalize, bf16* dlogits,
                        cudaStream_t s);
// P = N k pairs of idx; routed (E) i32 counted (zeroed first), row_of (P), slot_of (kept rows).
void moe_dispatch(const int32_t* idx, int64_t P, int64_t E, int64_t capacity, int32_t* routed, int32_t* row_of,
                  int32_t* slot_of, cudaStream_t s);
void moe_permute(const bf16* x, const int32_t* slot_of, int64_t k, const float* weights, bf16* xp, int64_t R,
                 int64_t C, cudaStream_t s);
// out (R, W) row r = x row index[r], zeros where index[r] < 0; elements of 2 or 4 bytes.
void gather_rows(const void* x, const int32_t* index, void* out, int64_t R, int64_t W, int element_bytes,
                 cudaStream_t s);
void moe_unpermute(const bf16* yp, const int32_t* row_of, const float* weights, bf16* y, int64_t N, int64_t k,
                   int64_t C, cudaStream_t s);
void moe_combine_backward(bf16* g, const bf16* act, const int32_t* slot_of, const float* weights, float* dweights,
                          int64_t R, int64_t F, cudaStream_t s);
// qkv (N, H, D): heads [0, hq + hk) normalised in place (w (2, D)); saved (N, hq + hk, D), rstd.
void qk_norm_forward(bf16* qkv, int64_t N, int64_t H, int64_t D, int64_t hq, int64_t hk, const bf16* w, float eps,
                     bf16* saved, float* rstd, cudaStream_t s);
// dw (2, D) f32 += through `partial` (qk_norm_chunks(N) * 2 * D floats); heads [0, n) of dqkv
// become the input gradient in place.
void qk_norm_backward(bf16* dqkv, int64_t N, int64_t H, int64_t D, int64_t hq, int64_t n, const bf16* saved,
                      const bf16* w, const float* rstd, float* dw, float* partial, cudaStream_t s);
int64_t qk_norm_chunks(int64_t N);

}  // namespace tripod::cuda::k
