// The model shape and architecture: GPT-2 by default; Llama-family decoders (RMSNorm, rotary
// positions, SwiGLU, grouped-query attention, no biases, untied head) are the same code with
// other choices. config/config.cpp reads the [model] section and presets its architecture;
// ModelConfig::validate (model/config.cpp) checks it.
#pragma once

#include <cstdint>
#include <string>

#include "core/enum_names.h"

namespace tripod {

enum class Arch { Gpt2, Llama };          // a preset of the choices below
enum class NormKind { LayerNorm, RmsNorm };
enum class PositionKind { Learned, Rope };  // a position table, or rotary q and k
enum class MlpKind { Gelu, SwiGlu };        // proj(gelu(fc x)), or proj(silu(gate x) * up x)
template <> struct EnumNames<Arch> { static constexpr std::array<std::string_view, 2> names{"gpt2", "llama"}; };
template <> struct EnumNames<NormKind> {
  static constexpr std::array<std::string_view, 2> names{"layernorm", "rmsnorm"};
};
template <> struct EnumNames<PositionKind> {
  static constexpr std::array<std::string_view, 2> names{"learned", "rope"};
};
template <> struct EnumNames<MlpKind> { static constexpr std::array<std::string_view, 2> names{"gelu", "swiglu"}; };

struct ModelConfig {
  int n_layers = 0;
  int n_heads = 0;
  int d_model = 0;
  int ffn_hidden = 0;  // 0: 4 * d_model (gelu) or Llama's rule (swiglu), see ffn()
  int seq_len = 0;
  int max_positions = 0;  // rows of the position table (learned) / longest sequence (rope); 0: seq_len
  int vocab_size = 0;
  Arch arch = Arch::Gpt2;
  NormKind norm = NormKind::LayerNorm;
  double norm_eps = 1e-5;
  PositionKind position = PositionKind::Learned;
  double rope_theta = 10000.0;
  MlpKind mlp = MlpKind::Gelu;
  int n_kv_heads = 0;        // key/value heads (grouped-query attention); 0: n_heads
  bool bias = true;          // biases in every linear
  bool tie_embeddings = true;  // the output head is the input embedding table

  // Llama's choices (RMSNorm, rope, SwiGLU, no biases, an untied head) when arch is Llama: what
  // model.arch = "llama" sets before the keys given override them.
  void apply_arch_preset() {
    if (arch != Arch::Llama) return;
    norm = NormKind::RmsNorm;
    position = PositionKind::Rope;
    mlp = MlpKind::SwiGlu;
    bias = false;
    tie_embeddings = false;
  }
  // InputError naming `origin` and the [model] key at fault, with what would be valid.
  void validate(const std::string& origin) const;

  bool rms() const { return norm == NormKind::RmsNorm; }
  bool rope() const { return position == PositionKind::Rope; }
  bool swiglu() const { return mlp == MlpKind::SwiGlu; }
  int positions() const { return max_positions > 0 ? max_positions : seq_len; }
  int kv_heads() const { return n_kv_heads > 0 ? n_kv_heads : n_heads; }
  // GELU: 4 d_model. SwiGLU (Llama's rule, which keeps the MLP's parameters near GELU's):
  // 2/3 of 4 d_model rounded up to a multiple of 256.
  int ffn() const {
    if (ffn_hidden > 0) return ffn_hidden;
    if (!swiglu()) return 4 * d_model;
    const int h = 8 * d_model / 3;
    return (h + 255) / 256 * 256;
  }
  int head_dim() const { return d_model / n_heads; }
  // Vocabulary padded to a multiple of 128 * tp (Megatron's rule), so every TP shard is equal
  // and GEMM-friendly.
  int64_t padded_vocab(int tp) const {
    int64_t m = 128LL * tp;
    return (vocab_size + m - 1) / m * m;
  }
  // Parameters of one transformer layer.
  int64_t layer_params() const {
    const int64_t C = d_model, F = ffn(), D = head_dim(), Q = int64_t{n_heads} * D, KV = int64_t{kv_heads()} * D;
    const int64_t b = bias ? 1 : 0, norms = 2 * (rms() ? C : 2 * C);
    const int64_t attn = C * (Q + 2 * KV) + b * (Q + 2 * KV) + Q * C + b * C;
    const int64_t mlp_p = swiglu() ? 3 * F * C + b * (2 * F + C) : 2 * F * C + b * (F + C);
    return norms + attn + mlp_p;
  }
  // All parameters, counting each vocabulary table with its padded rows (the tied table once).
  int64_t num_params(int tp = 1) const {
    const int64_t C = d_model, V = padded_vocab(tp);
    const int64_t tables = (tie_embeddings ? 1 : 2) * V * C + (rope() ? 0 : int64_t{positions()} * C);
    return tables + n_layers * layer_params() + (rms() ? C : 2 * C);
  }
  // Model FLOPs per token of a training step (forward + backward), llm.c's convention:
  // 6 N' + 6 L (H D) T, where N' is num_params() less the input embedding table when it is untied
  // (a lookup, not a matrix product; the tied table is counted once, as llm.c does). The
  // attention term counts the query heads (H D = d_model): grouped K/V do not reduce it.
  // Recomputation is not counted.
  double flops_per_token(int tp = 1) const { return flops_per_token(tp, static_cast<double>(seq_len)); }
  // The same with each token attending `attended` keys on average in the attention term (llm.c
  // counts seq_len, every key of the sequence; packed documents under data.reset_attention_mask
  // need only their own: the sum over documents of length^2, per token).
  double flops_per_token(int tp, double attended) const {
    const double n = static_cast<double>(num_params(tp)) -
                     (tie_embeddings ? 0.0 : static_cast<double>(padded_vocab(tp)) * d_model);
    return 6.0 * n + 6.0 * n_layers * static_cast<double>(n_heads) * head_dim() * attended;
  }
};

}  // namespace tripod

namespace tripod {

// Activation recomputation (Megatron's modes). selective: the attention core (scores, softmax)
// is recomputed in the backward instead of stored; full: a layer keeps only its input and reruns
// its forward just before its backward. num_layers: only the first N layers of each pipeline
// chunk recompute (-1: all).
enum class RecomputeMode { None, Selective, Full };
template <> struct EnumNames<RecomputeMode> {
  static constexpr std::array<std::string_view, 3> names{"none", "selective", "full"};
};

struct RecomputeConfig {
  RecomputeMode mode = RecomputeMode::None;
  int num_layers = -1;
  bool applies_to(int layer_in_chunk) const { return num_layers < 0 || layer_in_chunk < num_layers; }
  void validate(const std::string& origin) const;
};

}  // namespace tripod
