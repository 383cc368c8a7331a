// The GPT-2 model shape.
#pragma once

#include <cstdint>

namespace tripod {

struct ModelConfig {
  int n_layers = 0;
  int n_heads = 0;
  int d_model = 0;
  int ffn_hidden = 0;  // 0: 4 * d_model
  int seq_len = 0;
  int max_positions = 0;  // rows of the position table; 0: seq_len
  int vocab_size = 0;

  int positions() const { return max_positions > 0 ? max_positions : seq_len; }
  int ffn() const { return ffn_hidden > 0 ? ffn_hidden : 4 * d_model; }
  int head_dim() const { return d_model / n_heads; }
  // Vocabulary padded to a multiple of 128 * tp (Megatron's rule), so every TP shard is equal
  // and GEMM-friendly.
  int64_t padded_vocab(int tp) const {
    int64_t m = 128LL * tp;
    return (vocab_size + m - 1) / m * m;
  }
  // All parameters, counting the tied embedding once with its padded rows.
  int64_t num_params(int tp = 1) const {
    int64_t C = d_model, F = ffn(), L = n_layers;
    int64_t per_layer = 2 * C + (3 * C * C + 3 * C) + (C * C + C) + 2 * C + (F * C + F) + (C * F + C);
    return padded_vocab(tp) * C + static_cast<int64_t>(positions()) * C + L * per_layer + 2 * C;
  }
  // Model FLOPs per token of a training step (forward + backward), llm.c's convention:
  // 6 N + 6 L C T; recomputation is not counted.
  double flops_per_token(int tp = 1) const {
    return 6.0 * static_cast<double>(num_params(tp)) + 6.0 * n_layers * d_model * static_cast<double>(seq_len);
  }
};

}  // namespace tripod

namespace tripod {

// Activation recomputation (Megatron's modes). selective: the attention core (scores, softmax)
// is recomputed in the backward instead of stored; full: a layer keeps only its input and reruns
// its forward just before its backward. num_layers: only the first N layers of each pipeline
// chunk recompute (-1: all).
enum class RecomputeMode { None, Selective, Full };

struct RecomputeConfig {
  RecomputeMode mode = RecomputeMode::None;
  int num_layers = -1;
  bool applies_to(int layer_in_chunk) const { return num_layers < 0 || layer_in_chunk < num_layers; }
};

}  // namespace tripod
