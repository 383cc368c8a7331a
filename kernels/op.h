// The backend interface: the math of every op, forward and backward, one implementation per
// device (kernels/cpu, kernels/cuda), chosen at run time by train.device. Layers call these;
// they never branch on the device.
//
// Conventions, shared by every backend:
// - Activations and weights are in compute_dtype() (f32 on CPU, bf16 on CUDA); gradients of
//   parameters, optimizer states, LayerNorm statistics and losses are f32.
// - N is the number of tokens of a micro-batch (B*T, or its sequence-parallel slice), C the
//   model width. Matrices are row-major; a linear weight is (out, in) as in PyTorch.
// - "+=" in a comment means the op accumulates into that output; everything else overwrites.
// - An optional tensor argument is passed as an undefined Tensor{} when absent.
#pragma once

#include <memory>
#include <span>
#include <string_view>

#include "core/debug_options.h"
#include "core/tensor.h"
#include "kernels/op_timing.h"

namespace tripod {

struct AdamWHyper {
  float lr = 0, beta1 = 0.9f, beta2 = 0.95f, eps = 1e-8f, weight_decay = 0;
  int64_t step = 1;        // 1-based, for the bias corrections
  float grad_scale = 1.f;  // multiplies every gradient first (grad-norm clipping)
};

// Packed documents in a micro-batch's rows (data.reset_attention_mask): each query sees only the
// keys of its own document (causally). The same documents twice, for what each backend reads.
struct DocRows {
  // On the host: the documents as cumulative row offsets over the B T rows, {0, ..., B T} (the
  // varlen / THD form; every sequence end is a document end).
  std::span<const int32_t> offsets;
  // On the device: (B, T) i32, per row the position in its sequence where its document starts.
  Tensor start;
};

// The document mask of one attention block (context parallelism): key j of the block, at position
// key_pos + j of the sequence, is visible to query i only when key_pos + j >= start[b, i], the
// position where the query's document starts.
struct BlockDocs {
  Tensor start;  // (B, Tq) i32 on the device (the host on the CPU); undefined: no document mask
  int64_t key_pos = 0;
};

// A range [begin, end) of a flat parameter buffer and whether weight decay applies to it.
struct FlatRange {
  int64_t begin = 0, end = 0;
  bool decay = false;
};

class Ops {
 public:
  virtual ~Ops() = default;
  virtual Device device() const = 0;
  virtual DType compute_dtype() const = 0;
  virtual Allocator& allocator() = 0;
  // Host memory for staging transfers (pinned on CUDA); the CPU backend's own allocator on CPU.
  virtual Allocator& host_allocator() { return allocator(); }
  // The peak dense FLOP/s this rank's device can do, the denominator of MFU: on CPU the sgemm rate
  // measured now (in this process, with its threads), on GPUs the datasheet's.
  virtual double peak_flops() = 0;
  // Waits for all queued work (a no-op on CPU).
  virtual void synchronize() {}
  // What `tripod calibrate` sizes its measurements by: the device's memory and its last-level
  // cache (a GPU's L2; on the CPU the largest cache this core sees), in bytes; 0 when unknown.
  struct DeviceInfo {
    int64_t memory_bytes = 0, cache_bytes = 0;
  };
  virtual DeviceInfo device_info() const { return {}; }
  // Per-op-family timing (kernels/op_timing.h), off by default: while on, every op adds its time
  // to its family (wall time on the CPU, GPU time between events on CUDA); while off an op pays
  // one branch.
  virtual void set_timing(bool on) = 0;
  // The times recorded since the previous call (after waiting for queued work); starts anew.
  virtual OpTimes take_times() = 0;
  // The compute clock: the device's time for the work issued between compute_begin() and
  // compute_end() (regions do not nest), summed until take_compute_seconds(), which waits for
  // queued work and starts anew. GPU time between an event pair on CUDA; on the CPU the process's
  // CPU time, so that a rank descheduled by other processes on its cores (several ranks on one
  // machine) is not taken for a slow one. Straggler detection times every rank's forward and
  // backward work with it: host wall time would time only the launches on a GPU.
  virtual void compute_begin() = 0;
  virtual void compute_end() = 0;
  virtual double take_compute_seconds() = 0;
  Tensor empty(Shape shape, DType dtype, MemCategory category) {
    return Tensor::empty(allocator(), std::move(shape), dtype, category);
  }

  // ---- memory and elementwise ------------------------------------------------------------
  virtual void fill(Tensor& t, float value) = 0;
  // dst = src, converting dtype; either may live on the host or the device. Same numel.
  virtual void copy(const Tensor& src, Tensor& dst) = 0;
  // out = a + b (out may alias a or b).
  virtual void add(const Tensor& a, const Tensor& b, Tensor& out) = 0;
  // dst += src (src in any float dtype, dst f32 or the same dtype).
  virtual void accumulate(Tensor& dst, const Tensor& src) = 0;
  virtual void scale(Tensor& t, float s) = 0;
  // Sum of squares of t over the given ranges of its flat elements, in double, on the host.
  virtual double sum_squares(const Tensor& t, std::span<const FlatRange> ranges) = 0;
  // Sum of all elements of an f32 tensor, on the host.
  virtual double sum(const Tensor& t) = 0;
  // out (R, W) row r = x (., W) row index[r], or zeros where index[r] < 0: a row gather (and, with
  // the inverse map as index, a scatter). index (>= R) i32; x and out of one dtype (f32, bf16 or
  // i32), W = out.numel() / R. Expert parallelism reorders rows and per-row weights with it.
  virtual void gather_rows(const Tensor& x, const Tensor& index, Tensor& out) = 0;

  // ---- embedding (vocabulary-parallel) ---------------------------------------------------
  // tokens (N) i32, wte (Vl, C) holds rows [vocab_start, vocab_start + Vl) of the table.
  // out (N, C) = wte[tok - vocab_start] (zero when tok is outside the rows)
  //            + wpe[n % T] when wpe (>= T, C) is defined.
  virtual void embedding_forward(const Tensor& tokens, const Tensor& wte, int64_t vocab_start, const Tensor& wpe,
                                 int64_t T, Tensor& out) = 0;
  // dwte (Vl, C) f32 += scatter of dout rows; dwpe (P, C) f32 += dout summed per position.
  virtual void embedding_backward(const Tensor& tokens, const Tensor& dout, int64_t vocab_start, Tensor& dwte,
                                  Tensor& dwpe, int64_t T) = 0;

  // The same with each row's position given (packed documents, data.reset_position_ids): positions
  // (N) i32, out (N, C) = wte[tok - vocab_start] + wpe[positions[n]] (wpe defined, more rows than
  // any position); dwpe (P, C) f32 += each dout row at its position.
  virtual void embedding_forward_positions(const Tensor& tokens, const Tensor& wte, int64_t vocab_start,
                                           const Tensor& wpe, const Tensor& positions, Tensor& out) = 0;
  virtual void embedding_backward_positions(const Tensor& tokens, const Tensor& dout, int64_t vocab_start,
                                            Tensor& dwte, Tensor& dwpe, const Tensor& positions) = 0;

  // ---- normalisation ------------------------------------------------------------------------
  // LayerNorm: x (N, C), w, b (C) -> y (N, C); mean, rstd (N) f32 are saved for the backward.
  virtual void layernorm_forward(const Tensor& x, const Tensor& w, const Tensor& b, float eps, Tensor& y,
                                 Tensor& mean, Tensor& rstd) = 0;
  // dx (N, C) += d/dx; dw, db (C) f32 +=. Either half may be skipped, bit for bit the same as the
  // whole: dx undefined skips the input gradient, dw and db undefined skip the parameters'.
  virtual void layernorm_backward(const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& mean,
                                  const Tensor& rstd, Tensor& dx, Tensor& dw, Tensor& db) = 0;
  // RMSNorm (Llama's): y = x * rstd * w with rstd = 1 / sqrt(mean(x^2) + eps); rstd (N) f32 saved.
  virtual void rmsnorm_forward(const Tensor& x, const Tensor& w, float eps, Tensor& y, Tensor& rstd) = 0;
  // dx (N, C) += d/dx; dw (C) f32 +=. dx or dw undefined skips that half (as layernorm_backward).
  virtual void rmsnorm_backward(const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& rstd, Tensor& dx,
                                Tensor& dw) = 0;

  // ---- rotary position embedding ------------------------------------------------------------
  // In place on x (N, heads, D): the first `rot_heads` heads of every row n are rotated by the
  // angles of position pos0 + n % T (positions restart with every sequence of T tokens), in the
  // Hugging Face convention over the two halves of a head: with h = D/2, i < h,
  // a = position * theta^(-2i/D): y_i = x_i cos a - x_{i+h} sin a, y_{i+h} = x_{i+h} cos a + x_i sin a.
  // `inverse` rotates by -a: the backward (the rotation is orthogonal).
  virtual void rope(Tensor& x, int64_t rot_heads, int64_t T, int64_t pos0, double theta, bool inverse) = 0;
  // The same with row n at position positions[n] (positions (N) i32): the angles of a position are
  // rope's, bit for bit.
  virtual void rope_positions(Tensor& x, int64_t rot_heads, const Tensor& positions, double theta, bool inverse) = 0;

  // ---- SwiGLU (gate and up fused in one input) --------------------------------------------------
  // gu (N, 2F) = [gate | up] -> y (N, F) = silu(gate) * up.
  virtual void swiglu_forward(const Tensor& gu, Tensor& y) = 0;
  // dgu (N, 2F) from dy (N, F).
  virtual void swiglu_backward(const Tensor& gu, const Tensor& dy, Tensor& dgu) = 0;

  // ---- linear -----------------------------------------------------------------------------
  // y (N, O) = x (N, I) w^T (w: (O, I)) + b (O, optional).
  virtual void linear_forward(const Tensor& x, const Tensor& w, const Tensor& b, Tensor& y) = 0;
  // dx (N, I) = dy w (skipped when dx is undefined); dw (O, I) f32 += dy^T x; db (O) f32 += sum_n dy.
  virtual void linear_backward(const Tensor& dy, const Tensor& x, const Tensor& w, Tensor& dx, Tensor& dw,
                               Tensor& db) = 0;
  // The two halves of linear_backward, for a backward split into an input-gradient pass and a
  // deferred weight-gradient pass (zero-bubble pipelines). Each computes exactly what
  // linear_backward computes for its outputs, bit for bit.
  // dx (N, I) = dy w.
  virtual void linear_backward_input(const Tensor& dy, const Tensor& w, Tensor& dx) = 0;
  // dw (O, I) f32 += dy^T x; db (O) f32 += sum_n dy (skipped when db is undefined).
  virtual void linear_backward_weight(const Tensor& dy, const Tensor& x, Tensor& dw, Tensor& db) = 0;
  // pre (N, O) = x w^T + b and y (N, O) = gelu(pre): the MLP's first half, with the
  // pre-activation kept for gelu_backward. A backend may fuse the GELU into the GEMM (cuBLASLt's
  // epilogue on CUDA); this default is the two ops.
  virtual void linear_gelu_forward(const Tensor& x, const Tensor& w, const Tensor& b, Tensor& pre, Tensor& y) {
    linear_forward(x, w, b, pre);
    gelu_forward(pre, y);
  }
  // dpre (N, I) = (dy w) * gelu'(pre): the input gradient of the linear after a GELU, taken back
  // through the GELU (pre (N, I) as linear_gelu_forward kept it). A backend may fuse the GELU's
  // gradient into the GEMM (cuBLASLt's DGELU epilogue on CUDA); this default is the two ops, in
  // place in dpre.
  virtual void linear_backward_input_gelu(const Tensor& dy, const Tensor& w, const Tensor& pre, Tensor& dpre) {
    linear_backward_input(dy, w, dpre);
    gelu_backward(pre, dpre, dpre);
  }

  // ---- grouped linear (the experts of a mixture-of-experts layer) ---------------------------------
  // One GEMM per group, over rows [offsets[g], offsets[g + 1]) of the row-major inputs (G = w.size()
  // groups, offsets G + 1 ascending host values; empty groups are skipped). CPU: a loop of sgemms;
  // CUDA: one grouped call.
  // y rows of group g (., O) = x rows (., I) w[g]^T (w[g]: (O, I)).
  virtual void grouped_linear_forward(const Tensor& x, std::span<const Tensor> w, std::span<const int64_t> offsets,
                                      Tensor& y) = 0;
  // dx rows of group g (., I) = dy rows (., O) w[g].
  virtual void grouped_linear_backward_input(const Tensor& dy, std::span<const Tensor> w,
                                             std::span<const int64_t> offsets, Tensor& dx) = 0;
  // dw[g] (O, I) f32 += dy rows^T x rows.
  virtual void grouped_linear_backward_weight(const Tensor& dy, const Tensor& x, std::span<const int64_t> offsets,
                                              std::span<Tensor> dw) = 0;

  // ---- mixture-of-experts routing (model/moe.h) ---------------------------------------------------
  // The router's decision for N tokens over E experts from logits (N, E) f32: scores s = softmax of
  // the row, or (`sigmoid`) the sigmoid of each logit; the k = idx.size(1) experts of largest
  // s + bias (bias (E) f32, the selection bias, optional; ties: the lower index first), by
  // decreasing s + bias, into idx (N, k) i32, and their scores (divided by the k scores' sum when
  // `normalize`) into weights (N, k) f32. stats (E + 1) f32 receives the sums over the tokens of
  // each expert's balancing probability P_e (softmax: s_e; sigmoid: s_e / sum of s) and, last, of
  // lse(logits)^2.
  virtual void moe_route(const Tensor& logits, const Tensor& bias, bool sigmoid, bool normalize, Tensor& idx,
                         Tensor& weights, Tensor& stats) = 0;
  // dlogits (N, E) (compute dtype) = the gradient with respect to the logits of
  //   sum_{t,j} dweights[t,j] weights[t,j] + sum_{t,e} aux[e] P_e(t) + z_scale sum_t lse_t^2
  // for the choices idx of moe_route (the bias only chose them); aux (E) f32 optional (zero).
  virtual void moe_route_backward(const Tensor& logits, const Tensor& idx, const Tensor& dweights, const Tensor& aux,
                                  float z_scale, bool sigmoid, bool normalize, Tensor& dlogits) = 0;
  // The expert-sorted order of the N k (token, choice) pairs p = t k + j of idx (N, k) i32: expert
  // e's pairs in order of p, the first `capacity` of them kept (capacity < 0: all), experts after
  // one another. routed (E) i32 = the pairs choosing each expert (before the capacity); row_of
  // (N k) i32 = each pair's row in that order, or -1 when dropped; slot_of (>= kept rows) i32 =
  // the pair p of each kept row (rows beyond untouched).
  virtual void moe_dispatch(const Tensor& idx, int64_t experts, int64_t capacity, Tensor& routed, Tensor& row_of,
                            Tensor& slot_of) = 0;
  // xp (R, C) row r = x (N, C) row slot_of[r] / k, times weights[slot_of[r]] when weights (N k) f32
  // is defined; R = xp.size(0) rows of slot_of are read.
  virtual void moe_permute(const Tensor& x, const Tensor& slot_of, int64_t k, const Tensor& weights, Tensor& xp) = 0;
  // y (N, C) row t = sum over j of weights[t k + j] * yp row row_of[t k + j] (weight 1 when weights
  // is undefined; dropped pairs skipped; 0 when all are), summed in f32 in order of j.
  virtual void moe_unpermute(const Tensor& yp, const Tensor& row_of, const Tensor& weights, Tensor& y) = 0;
  // For each of the R = g.size(0) rows: dweights[slot_of[r]] (f32) = <act row r, g row r>, then g
  // row r *= weights[slot_of[r]] (the gradient through y = w * (expert output) when g is the
  // expert's output gradient times its second weight). act and g (R, F) in the compute dtype.
  virtual void moe_combine_backward(Tensor& g, const Tensor& act, const Tensor& slot_of, const Tensor& weights,
                                    Tensor& dweights) = 0;

  // ---- per-head q/k RMSNorm (Qwen3's qk_norm) -------------------------------------------------------
  // In place on qkv (N, heads, D): heads [0, hq) normalised with w row 0, heads [hq, hq + hk) with
  // row 1 (w (2, D)): y = x rstd w, rstd = 1 / sqrt(mean(x^2) + eps). saved (N, hq + hk, D)
  // receives the input of those heads and rstd (N, hq + hk) f32 their statistics.
  virtual void qk_norm_forward(Tensor& qkv, int64_t hq, int64_t hk, const Tensor& w, float eps, Tensor& saved,
                               Tensor& rstd) = 0;
  // From dy = heads [0, n) of dqkv (N, heads, D) (n = saved.size(1)): those heads of dqkv become the
  // gradient with respect to the input (in place); dw (2, D) f32 += the weights' gradient.
  virtual void qk_norm_backward(Tensor& dqkv, int64_t hq, const Tensor& saved, const Tensor& w, const Tensor& rstd,
                                Tensor& dw) = 0;

  // db (O) f32 += sum_n dy (N, O): a bias's gradient alone (FP8 linears compute their weight
  // gradient with fp8_gemm and their bias gradient from the high-precision dy, as here).
  virtual void bias_backward(const Tensor& dy, Tensor& db) = 0;

  // ---- FP8 linear layers (train.precision = "fp8"; kernels/fp8.h has the formats) -------------
  // A tensor x is held as q = fp8(x * s) with a per-tensor scale s; a GEMM of two such operands
  // multiplies its f32 result by 1/s of each. Scales live on the device as (2) f32 = {s, 1/s}.
  // The CPU backend computes exactly what the GPU holds: the same FP8 bytes from the same inputs
  // and scales, then the GEMM in f32 (the GPU's accumulation order is its own).
  //
  // amax (1) f32 = max |x| over x (compute dtype); NaN when x holds a NaN.
  virtual void fp8_amax(const Tensor& x, Tensor& amax) = 0;
  // amaxes (P) f32 -> scale (2) f32 = {s, 1/s}, s = fp8_scale_from_amax(a = the max of the P
  // amaxes, fmt_max, 2^-margin, 1); record (1) f32, when defined, = max(record, a). (Delayed
  // scaling computes its scales on the host, from the amax history.)
  virtual void fp8_scale(const Tensor& amaxes, float fmt_max, int margin, Tensor& scale, Tensor& record) = 0;
  // q (R, C) = fp8(x * scale[0]) (x (R, C) in the compute dtype; q F8E4M3 or F8E5M2: round to
  // nearest even, saturating, NaN kept); qt (C, R) the same bytes transposed. Either may be
  // undefined (not both).
  // When defined: amax (1) f32 = max(amax, max |x|) (an amax kept over a step's calls, computed
  // in the same pass as the cast), and saturated (1) f32 += the number of elements whose scaled
  // value is clipped to the format's largest (fp8_clipped).
  virtual void fp8_quantize(const Tensor& x, const Tensor& scale, Tensor& q, Tensor& qt, Tensor& amax,
                            Tensor& saturated) = 0;
  // out (R, C) = (a (R, K) . b (C, K)^T) * a_scale[1] * b_scale[1] + bias (C, optional): the "TN"
  // GEMM of two FP8 operands stored with K contiguous (not both F8E5M2), f32 accumulation. out is
  // in the compute dtype, or f32 with `accumulate` (out +=; no bias). out_amax (1) f32, when
  // defined, becomes max(out_amax, max |out|) (cuBLASLt's amax of D, kept over a step's calls).
  // K and C must be multiples of 16.
  virtual void fp8_gemm(const Tensor& a, const Tensor& a_scale, const Tensor& b, const Tensor& b_scale,
                        const Tensor& bias, bool accumulate, Tensor& out, Tensor& out_amax) = 0;

  // ---- GELU, tanh approximation ---------------------------------------------------------------
  virtual void gelu_forward(const Tensor& x, Tensor& y) = 0;
  // dx = dy * gelu'(x); dx may alias dy.
  virtual void gelu_backward(const Tensor& x, const Tensor& dy, Tensor& dx) = 0;

  // ---- causal self-attention, grouped-query ---------------------------------------------------
  // qkv (B, T, H + 2 Hkv, D): per token the H query heads, then Hkv key heads, then Hkv value heads
  // (Hkv divides H; query head h reads key/value head h / (H / Hkv); Hkv = H is multi-head
  // attention, laid out as (3, H, D)). out (B, T, H, D), scale 1/sqrt(D); H comes from out.
  // lse (B, H, T) f32: the log-sum-exp of each softmax row, saved. probs (B, H, T, T), when
  // defined, receives the softmax so the backward need not recompute it (a backend may ignore it
  // and always recompute).
  virtual void attention_forward(const Tensor& qkv, Tensor& out, Tensor& lse, Tensor& probs) = 0;
  // Whether attention_forward fills `probs` (and the backward reads them). A fused (flash) kernel
  // recomputes them from lse instead, so keeping them would only cost memory.
  virtual bool keeps_attention_probs() const { return true; }
  // dqkv (B, T, H + 2 Hkv, D) from dout (a key/value head's gradient sums over its query group);
  // probs as saved by the forward, or undefined to recompute.
  virtual void attention_backward(const Tensor& dout, const Tensor& qkv, const Tensor& out, const Tensor& lse,
                                  const Tensor& probs, Tensor& dqkv) = 0;

  // Attention within packed documents (data.reset_attention_mask): as attention_forward, but each
  // query sees only the keys of its own document (`docs`), and only those are computed: the work is
  // the sum over documents of length^2, not B T^2. Nothing of the probabilities is kept.
  virtual void attention_forward_docs(const Tensor& qkv, const DocRows& docs, Tensor& out, Tensor& lse) = 0;
  // dqkv (B, T, H + 2 Hkv, D) from dout, recomputing the probabilities from lse.
  virtual void attention_backward_docs(const Tensor& dout, const Tensor& qkv, const Tensor& out, const Tensor& lse,
                                       const DocRows& docs, Tensor& dqkv) = 0;

  // ---- attention of one block of queries against one block of keys (context parallelism) ------
  // The attention of a sequence split into chunks is a sum over (query chunk, key chunk) blocks,
  // merged by their log-sum-exp (parallel/context_parallel.h).
  // q (B, Tq, Wq, D): per token the H query heads first (Wq >= H, so a qkv tensor's rows serve);
  // kv (B, Tk, 2 Hkv, D): per token the Hkv key heads, then the Hkv value heads; query head h reads
  // pair h / (H / Hkv). causal: a diagonal block (Tq == Tk, query i sees keys j <= i); else every
  // key. With docs.start defined, only the keys `docs` leaves visible (packed documents), and only
  // those are computed; a query that sees none of the block keeps out and lse as they were.
  // out (B, Tq, H, D) f32 and lse (B, H, Tq) f32 hold the normalised attention over the
  // blocks merged so far (lse = -inf: none) and receive it over this block too.
  virtual void attention_block_forward(const Tensor& q, const Tensor& kv, bool causal, const BlockDocs& docs,
                                       Tensor& out, Tensor& lse) = 0;
  // The block's share of the backward, from the merged result: out (B, Tq, H, D) (compute dtype)
  // and lse as attention_block_forward left them after the last block, dout like out.
  // dq (B, Tq, Wq, D) f32 += on its query heads (the other heads untouched); dkv (B, Tk, 2 Hkv, D)
  // f32 += (a key/value head's gradient sums over its query group).
  virtual void attention_block_backward(const Tensor& dout, const Tensor& q, const Tensor& kv, const Tensor& out,
                                        const Tensor& lse, bool causal, const BlockDocs& docs, Tensor& dq,
                                        Tensor& dkv) = 0;
  // kv (N, 2 Hkv, D) = heads [H, H + 2 Hkv) of qkv (N, H + 2 Hkv, D), converting dtype.
  virtual void attention_kv_pack(const Tensor& qkv, int64_t H, Tensor& kv) = 0;
  // The inverse: heads [H, H + 2 Hkv) of qkv = kv, converting dtype; the query heads untouched.
  virtual void attention_kv_unpack(const Tensor& kv, int64_t H, Tensor& qkv) = 0;

  // ---- attention against a KV cache (inference) --------------------------------------------
  // qkv (B, n, H + 2 Hkv, D): n new tokens at positions [pos, pos + n) of each sequence. Their k
  // and v are written into k_cache, v_cache (B, Hkv, T_max, D) at positions [pos, pos + n); then
  // out (B, n, H, D) = softmax(q K^T / sqrt(D)) V for each new token over cache positions
  // 0..its own (causal), each query head against its group's key/value head. n = 1 is one
  // decoding step; pos = 0, n = prompt length is the prefill. Needs pos + n <= T_max. Caches and
  // out are in the compute dtype; scores and softmax in f32.
  virtual void attention_decode(const Tensor& qkv, Tensor& k_cache, Tensor& v_cache, int64_t pos, Tensor& out) = 0;

  // ---- fused softmax cross-entropy over a (possibly vocabulary-parallel) classifier ----------
  // logits (N, Vl) hold columns [vocab_start, vocab_start + Vl); only the first `valid` columns
  // are real tokens (the rest is vocabulary padding and never takes part). A negative target is a
  // token that does not count (data.eod_mask_loss): its stats are those of a row whose
  // log-sum-exp is 0 (the shard at vocab_start 0 gives {0, 1, 0}, the others {0, 0, 0}), so its lse
  // and loss are exactly 0, and xent_backward gives its logits a zero gradient.
  // stats (N, 3) f32 = {max of the row, sum exp(logit - max), logit of the target or 0}.
  virtual void xent_stats(const Tensor& logits, const Tensor& targets, int64_t vocab_start, int64_t valid,
                          Tensor& stats) = 0;
  // parts (P, N, 3): the stats of the P vocabulary shards -> lse (N) and loss (N) f32.
  virtual void xent_combine(const Tensor& parts, Tensor& lse, Tensor& loss) = 0;
  // In place: logits become d loss / d logits = (softmax - onehot(target)) * scale; padding 0.
  virtual void xent_backward(Tensor& logits, const Tensor& targets, int64_t vocab_start, int64_t valid,
                             const Tensor& lse, float scale) = 0;

  // ---- optimizer ----------------------------------------------------------------------------
  // AdamW with decoupled weight decay over the given ranges of flat f32 buffers (master, grads,
  // m, v share one layout). When `compute_copy` is defined (the compute-dtype parameters) the
  // updated values are written there too.
  virtual void adamw(Tensor& master, const Tensor& grads, Tensor& m, Tensor& v, std::span<const FlatRange> ranges,
                     const AdamWHyper& h, Tensor& compute_copy) = 0;
};

// The backend for a device; device_index selects the GPU. Throws InputError when the device is
// not available (e.g. "cuda" on a machine without a GPU or a build without CUDA).
std::unique_ptr<Ops> make_ops(Device device, int device_index = 0, const DebugOptions& debug = {});

// Call first in main(). OpenBLAS picks its kernels from the CPU's model name; virtual machines
// that hide it ("Intel Xeon Processor") get the generic SSE3 kernels, about 3x slower. When that
// happened and OPENBLAS_CORETYPE is not set, this sets it from the CPU's instruction sets and
// re-executes the program (OpenBLAS reads it only while loading). Otherwise it returns.
void select_cpu_blas_kernels(char** argv);
// Number of CUDA devices usable by this build (0 without CUDA or without a GPU).
int cuda_device_count();

// The dense bf16 tensor-core peak FLOP/s of a GPU from its name (cudaDeviceProp::name, e.g.
// "NVIDIA H100 80GB HBM3"), from NVIDIA's datasheets: 989e12 for H100 SXM and H200, 756e12 for
// H100 PCIe, 312e12 for A100, ...; 0 for a name the table does not know. (The CUDA backend takes
// DebugOptions::peak_tflops, TRIPOD_PEAK_TFLOPS, instead when it is set.)
double gpu_peak_flops(std::string_view name);

}  // namespace tripod
