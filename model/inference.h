// Inference on one rank of a tensor-parallel group (pp = 1): the model's forward over new tokens
// with per-layer K/V caches, so generating a token costs one token's forward. It reads the
// parameters the training model registered (by global name, this rank's TP shard, through the
// layers' own parameter lookups), and reuses the training ops (norm, linear, rope, GELU or
// SwiGLU, a mixture of experts' routing and grouped GEMMs, dropless) plus Ops::attention_decode, whose caches hold this rank's key/value heads. Heads are
// split as in training: column-parallel QKV and MLP input, row-parallel projections followed by
// an all-reduce over TP; the vocabulary-parallel head's logits are all-gathered so every TP rank
// holds the same full row and samples the same token.
#pragma once

#include <cstdint>
#include <optional>
#include <random>
#include <span>
#include <vector>

#include "model/config.h"
#include "model/embedding.h"
#include "model/mlp.h"
#include "model/moe.h"
#include "model/param_registry.h"
#include "parallel/context.h"

namespace tripod {

class InferenceModel {
 public:
  // `reg` (allocated, with values) holds every layer on this rank: built by GptModel with one
  // chunk over the grid (tp, 1, 1) of `par` (any dp: only TP collectives run). `max_tokens` sizes
  // the caches (at most the model's positions), `rows` the sequences they hold side by side.
  // Sequence parallelism does not apply.
  InferenceModel(Ops& ops, const ParallelContext& par, const ModelConfig& cfg, ParamRegistry& reg,
                 int64_t max_tokens, int64_t rows = 1);

  // Runs `tokens` at positions [position(), position() + n), appending their keys and values to
  // the caches. Returns host f32 logits over the real vocabulary (model.vocab_size columns): of
  // the last token (vocab_size), or of every new token (n, vocab_size) with `all_logits`. The
  // same values on every TP rank. Collective over TP.
  std::vector<float> forward(std::span<const int32_t> tokens, bool all_logits = false);

  // Continues rows 0 .. lengths.size() - 1 each by its own tokens (`tokens` holds them one row
  // after the other, lengths[r] of row r), all from position(): the per-token layers run on the
  // tokens alone, attention on rows padded to the longest. Returns every new token's
  // cross-entropy against `targets` (one per token, in `tokens`' order; a negative target's loss
  // is 0), computed as the training head does. position() then moves by the longest row (rewind()
  // before the next use of a shorter one). Collective over TP.
  std::vector<float> forward_rows(std::span<const int32_t> tokens, std::span<const int64_t> lengths,
                                  std::span<const int32_t> targets);

  int64_t position() const { return pos_; }
  int64_t max_tokens() const { return max_tokens_; }
  int64_t rows() const { return rows_; }
  // Forgets the cached sequence (the next forward starts at position 0).
  void reset() { pos_ = 0; }
  // Goes back to position `pos`: the caches keep positions [0, pos); later ones are overwritten.
  void rewind(int64_t pos);
  // Copies row 0's cached positions [0, position()) to rows 1 .. rows - 1: a prefix computed once
  // continues as that many sequences.
  void share_prefix(int64_t rows);

 private:
  struct Layer {
    Norm ln1, ln2;
    AttentionParams attn;
    std::optional<MlpParams> mlp;  // a dense layer's MLP, or
    std::optional<MoeParams> moe;  // a mixture of experts
    Tensor k_cache, v_cache;  // (rows, Hkv/tp, max_tokens, D), compute dtype
  };
  // x (n, C) += the row-parallel output of `in` (n, I) through p (bias on TP rank 0), summed over TP.
  void add_row_parallel(const Tensor& in, const LinearParams& p, Tensor& x);
  // The layers and the head over `tok` (N tokens at `positions`); attention over `rows` x `n`
  // (padded by `to_padded`, back by `to_real`, both empty when N = rows x n unpadded). Logits of
  // every token (or of the last alone: one row), or with `targets` (N) the tokens' losses.
  std::vector<float> run(const Tensor& tok, const Tensor& positions, int64_t rows, int64_t n, const Tensor& to_padded,
                         const Tensor& to_real, bool last_only, const Tensor& targets);

  Ops& ops_;
  const ParallelContext& par_;
  ModelConfig cfg_;
  VocabShard shard_;
  int64_t H_local_, KV_local_, D_, F_local_, max_tokens_, rows_, pos_ = 0;
  Param *wte_, *wpe_, *head_;  // wpe: learned positions only; head: wte or lm_head.weight
  Norm ln_f_;
  std::vector<Layer> layers_;
};

// How the next token is drawn from a row of logits.
struct SamplingOptions {
  double temperature = 1.0;  // 0: greedy (the lowest index among equal maxima)
  int top_k = 0;             // keep the k most likely tokens; 0: all
  double top_p = 1.0;        // then the smallest set whose probability reaches top_p (nucleus); 1: all
};

// Samples one token id from `logits` (host f32, one per token). Deterministic for the state of
// `rng`: the same logits and rng give the same token on every rank and run.
int32_t sample_token(std::span<const float> logits, const SamplingOptions& o, std::mt19937_64& rng);

}  // namespace tripod
