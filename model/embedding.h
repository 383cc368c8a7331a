// The tied token embedding, vocabulary-parallel across TP ranks: the input side (token +
// position embedding on the first chunk) and the output side (final LayerNorm, logits against
// the same table, fused softmax cross-entropy on the last chunk).
#pragma once

#include "model/attention.h"
#include "model/layernorm.h"

namespace tripod {

// This rank's rows of the padded vocabulary: [start, start + rows); the first `valid` are real.
struct VocabShard {
  int64_t start = 0, rows = 0, valid = 0;
  static VocabShard of(const ModelConfig& cfg, int tp, int tp_rank);
};

// Registers "wte" (the input table, sharded by rows across TP). When it is tied to the output
// head, a stage that only uses it for the output (the last pipeline stage when pp > 1) holds a
// tied copy.
Param& register_wte(ParamRegistry& reg, const ModelConfig& cfg, const ParallelContext& par, bool tied_copy,
                    int chunk);
// Registers "lm_head.weight", the untied output table (padded vocabulary, C), sharded by rows.
Param& register_lm_head(ParamRegistry& reg, const ModelConfig& cfg, const ParallelContext& par, int chunk);

class Embedding {
 public:
  Embedding(Ops& ops, const ParallelContext& par, const ModelConfig& cfg, ParamRegistry& reg, Param& wte, int chunk);
  // tokens (N) i32 -> x (Ns, C), the first block's input.
  Tensor forward(const Tensor& tokens, const MicroShape& ms);
  // dx (Ns, C): the gradient of the first block's input. Only parameters' gradients: in a split
  // backward this is all W work (EmbeddingPending).
  void backward(const Tensor& tokens, const Tensor& dx, const MicroShape& ms);

 private:
  Ops& ops_;
  const ParallelContext& par_;
  VocabShard shard_;
  Param* wte_;
  Param* wpe_ = nullptr;  // learned positions only
};

struct HeadActs {
  Tensor x;       // (Ns, C) input of ln_f
  Tensor h;       // (Ns, C) ln_f output
  NormActs ln;
  Tensor dlogits;  // (N, V/tp): the gradient of the logits, computed in the forward (fused)
};

// What the embedding's deferred gradient needs: the micro-batch's tokens (held, not copied) and
// the gradient of its output (Ns, C).
struct EmbeddingPending {
  Tensor tokens, dy;
};

// What the head's deferred gradients need: ln_f's input, statistics and output gradient (Ns, C);
// the logits GEMM's input (ln_f's output (Ns, C), all-gathered again in W under SP) and output
// gradient (N, V/tp), which for the tied table is the embedding table's gradient's share.
struct HeadPending {
  NormPending ln_f;
  LinearPending logits;
};

class LmHead {
 public:
  // `table`: the tied "wte" or the untied "lm_head.weight".
  LmHead(Ops& ops, const ParallelContext& par, const ModelConfig& cfg, ParamRegistry& reg, Param& table, int chunk);
  // x (Ns, C) -> per-token losses (N) f32 in `losses`; the logits' gradient for a loss scaled by
  // `grad_scale` (per token) is kept for the backward.
  void forward(const Tensor& x, const Tensor& targets, float grad_scale, HeadActs& a, Tensor& losses);
  // -> the gradient of x, (Ns, C).
  Tensor backward(HeadActs& a);
  // backward split in two, bit for bit the same: the gradient of x, with what the parameters'
  // gradients need moved into `p` (nothing is freed: all of `a` is needed by W) ...
  Tensor backward_input(HeadActs& a, HeadPending& p);
  // ... and the table's and ln_f's gradients from it, releasing `p`.
  void backward_weight(HeadPending& p);

 private:
  Ops& ops_;
  const ParallelContext& par_;
  VocabShard shard_;
  Norm ln_f_;
  Param* table_;
};

}  // namespace tripod
