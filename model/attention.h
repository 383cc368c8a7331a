// Causal self-attention with its heads split across TP ranks: a column-parallel QKV projection,
// rotary positions on q and k (model.position = "rope"), the attention core on this rank's query
// heads and their key/value heads (grouped-query attention when model.n_kv_heads < n_heads), and
// a row-parallel output projection.
//
// Parameters: with as many key/value heads as query heads, "<prefix>.qkv.weight" (3, C, C) and
// ".qkv.bias" (3, C) (GPT-2's); with fewer, ".q.weight" (H D, C), ".k.weight" and ".v.weight"
// (Hkv D, C) (and biases), packed so that this rank's shards of the three are one GEMM weight.
// ".proj.weight" (C, H D) is row-parallel; ".proj.bias" (C) replicated. Biases only with model.bias.
// With model.qk_norm (Qwen3), ".q_norm.weight" and ".k_norm.weight" (D), replicated: every query
// and key head is RMS-normalised over its D dimensions before rope (each TP rank's gradient covers
// its own heads and is summed over TP).
#pragma once

#include <memory>

#include "model/config.h"
#include "model/param_registry.h"
#include "parallel/context.h"
#include "parallel/documents.h"

namespace tripod {

struct CpAttentionShape;

// Shape of a micro-batch: B sequences of T tokens on this rank, N = B*T. Under context
// parallelism (cp > 1) T is seq_len / cp: the rank's two chunks of every sequence, chunks
// cp_chunk(cp, cp_rank, 0 and 1) of c = T/2 tokens (parallel/grid.h), stored slot-major. `docs`:
// the packed documents of its sequences (data.reset_position_ids, reset_attention_mask), shared
// by whatever holds the shape (a split backward's pending work, recomputation), or null.
struct MicroShape {
  int64_t B = 0, T = 0;
  int cp = 1, cp_rank = 0;
  // d(step loss)/d(token loss), the micro-batch's MicroBatch::grad_scale: what a layer's own loss
  // terms (a mixture of experts' balancing and z-losses) scale their gradients by.
  float grad_scale = 0.f;
  std::shared_ptr<const Documents> docs = nullptr;
  int64_t N() const { return B * T; }
  int slots() const { return cp > 1 ? 2 : 1; }
  // Tokens per sequence of one slot, and its first position in the sequence.
  int64_t slot_tokens() const { return T / slots(); }
  int64_t slot_position(int slot) const {
    return static_cast<int64_t>(cp_chunk(cp, cp_rank, slot)) * slot_tokens();
  }
};

struct AttentionActs {
  Tensor qkv;    // (N, (H + 2 Hkv) D / tp) = (B, T, (H + 2 Hkv)/tp, D), q and k normalised (qk_norm) and rotated
  Tensor qk_in, qk_rstd;  // model.qk_norm: q and k before their norm (N, (H + Hkv)/tp, D), rstd (N, (H + Hkv)/tp) f32
  Tensor att;    // (N, H D/tp) attention output, input of the output projection
  Tensor lse;    // (B, H/tp, T) f32 softmax statistics ((2, B, H/tp, T/2) under context parallelism)
  Tensor probs;  // (B, H/tp, T, T) softmax, only when kept (no recomputation, CPU, cp = 1, no document mask)
};

// One weight GEMM's deferred gradient (a split backward's W: dw += dy^T x, db += sum of dy): its
// input and its output gradient, nothing more.
struct LinearPending {
  Tensor x, dy;
};

// This rank's attention parameters, as registered by Attention (training) or found by name
// (inference).
struct AttentionParams {
  LinearParams qkv, proj;
  Param *q_norm = nullptr, *k_norm = nullptr;  // model.qk_norm: (D) each, packed
  static AttentionParams find(ParamRegistry& reg, const ModelConfig& cfg, const std::string& prefix);
  // The q and k norms' weights (or f32 gradients) as one (2, D) tensor.
  Tensor qk_norm_weight(bool grad = false) const;
};

class Attention {
 public:
  Attention(Ops& ops, const ParallelContext& par, const ModelConfig& cfg, ParamRegistry& reg,
            const std::string& prefix, int chunk);
  // h_full (N, C), the norm output as every TP rank sees it -> partial output (N, C)
  // of this rank's heads (the bias added on TP rank 0 only; summed by the caller).
  void forward(const Tensor& h_full, const MicroShape& ms, bool keep_probs, AttentionActs& a, Tensor& out_partial);
  // dout_full (N, C) -> dh_full (N, C), this rank's contribution to the input gradient.
  void backward(const Tensor& dout_full, const Tensor& h_full, const MicroShape& ms, const AttentionActs& a,
                Tensor& dh_full);
  // backward split in two (bit for bit the same). The input half: dout_full -> dh_full; returns
  // dqkv (N, (H + 2 Hkv) D / tp), the QKV projection's output gradient, charged to `dqkv_category`.
  Tensor backward_input(const Tensor& dout_full, const MicroShape& ms, const AttentionActs& a, Tensor& dh_full,
                        MemCategory dqkv_category);
  // The weight half: the output projection's gradients from dout_full (N, C) and att (N, H D/tp)
  // (AttentionActs::att), the QKV projection's from dqkv and h_full (N, C).
  void backward_weight(const Tensor& dout_full, const Tensor& att, const Tensor& dqkv, const Tensor& h_full);

 private:
  CpAttentionShape cp_shape(const MicroShape& ms) const;
  Ops& ops_;
  const ParallelContext& par_;
  const ModelConfig cfg_;
  int64_t C_, H_local_, KV_local_, D_;
  AttentionParams p_;
};

}  // namespace tripod
