// The model shape and architecture: GPT-2 by default; Llama-family decoders (RMSNorm, rotary
// positions, SwiGLU, grouped-query attention, no biases, untied head) are the same code with
// other choices. config/config.cpp reads the [model] section and presets its architecture;
// ModelConfig::validate (model/config.cpp) checks it.
#pragma once

#include <algorithm>
#include <cmath>
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

// How a mixture-of-experts router turns its logits into scores: a softmax over all experts (Mixtral,
// Qwen3-MoE), or an independent sigmoid per expert (DeepSeek-V3).
enum class MoeRouter { Softmax, Sigmoid };
template <> struct EnumNames<MoeRouter> {
  static constexpr std::array<std::string_view, 2> names{"softmax", "sigmoid"};
};

// The [moe] section: the feed-forward half of (some) layers as a mixture of experts. experts = 0
// (the default) is a dense model, exactly as without the section. model/moe.h has the equations.
struct MoeConfig {
  int experts = 0;         // routed experts per MoE layer; 0: dense
  int top_k = 2;           // experts each token is sent to
  int ffn_hidden = 0;      // hidden width of one expert; 0: model.ffn_hidden
  int shared_experts = 0;  // always-on experts of the same shape (one MLP of shared_experts x ffn_hidden)
  MoeRouter router = MoeRouter::Softmax;
  bool normalize_top_k = true;  // the chosen experts' weights renormalised to sum to 1
  int first_dense = 0;     // layers [0, first_dense) keep the dense MLP (moe.layers = {first_dense = N})
  double aux_loss_coeff = 0.0;    // the load-balancing loss of every MoE layer, times this
  double z_loss_coeff = 0.0;      // the router z-loss of every MoE layer, times this
  double bias_update_rate = 0.0;  // > 0: aux-loss-free balancing by a per-expert selection bias
  double capacity_factor = 0.0;   // > 0: at most ceil(factor * tokens * top_k / experts) tokens per expert

  // InputError naming `origin` and the [moe] key at fault, with what would be valid.
  void validate(const std::string& origin, int n_layers) const;

  bool enabled() const { return experts > 0; }
  // Whether layer `layer` is a mixture of experts.
  bool sparse(int layer) const { return enabled() && layer >= first_dense; }
  // The selection bias exists (a buffer saved in checkpoints) when it is updated.
  bool selection_bias() const { return bias_update_rate > 0; }
  // Tokens one expert may take out of `tokens` routed to top_k experts each; -1: no limit.
  int64_t capacity(int64_t tokens) const {
    if (capacity_factor <= 0) return -1;
    const double c = std::ceil(capacity_factor * static_cast<double>(tokens) * top_k / experts);
    return static_cast<int64_t>(c);
  }
  // Rows of the expert-sorted token copies a layer holds for `tokens` tokens per rank: every
  // (token, choice) pair when dropless, else at most `capacity` per expert. Under expert
  // parallelism over `ep` ranks, the most one EP rank's E/ep experts can receive: every token of
  // the ep ranks choosing min(top_k, E/ep) of them, or each of them full from every rank (E
  // capacities). Example: 512 tokens, top 2 of 8, ep = 2: 1024 rows at ep = 1, 2048 at ep = 2.
  int64_t routed_rows(int64_t tokens, int ep = 1) const {
    const int64_t all = ep * tokens * std::min<int64_t>(top_k, experts / ep), cap = capacity(tokens);
    return cap < 0 ? all : std::min(all, cap * experts);
  }
};

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
  bool qk_norm = false;        // per-head RMSNorm of q and k before rope (Qwen3)
  MoeConfig moe{};             // the [moe] section

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
  // One expert's hidden width (MoE layers).
  int expert_ffn() const { return moe.ffn_hidden > 0 ? moe.ffn_hidden : ffn(); }
  // Parameters of a feed-forward block of hidden width F (GELU: fc, proj; SwiGLU: gate, up, proj).
  int64_t mlp_params(int64_t F, bool with_bias) const {
    const int64_t C = d_model, b = with_bias ? 1 : 0;
    return swiglu() ? 3 * F * C + b * (2 * F + C) : 2 * F * C + b * (F + C);
  }
  // Parameters of transformer layer `layer`; `active`: only those one token is multiplied by (an
  // MoE layer's router, top_k routed experts and the shared experts). The selection bias, a
  // buffer, is not a parameter.
  int64_t layer_params(int layer = 0, bool active = false) const {
    const int64_t C = d_model, D = head_dim(), Q = int64_t{n_heads} * D, KV = int64_t{kv_heads()} * D;
    const int64_t b = bias ? 1 : 0, norms = 2 * (rms() ? C : 2 * C) + (qk_norm ? 2 * D : 0);
    const int64_t attn = C * (Q + 2 * KV) + b * (Q + 2 * KV) + Q * C + b * C;
    if (!moe.sparse(layer)) return norms + attn + mlp_params(ffn(), bias);
    const int64_t Fe = expert_ffn(), routed = active ? moe.top_k : moe.experts;
    const int64_t ffn_p = int64_t{moe.experts} * C + routed * mlp_params(Fe, false) +
                          (moe.shared_experts > 0 ? mlp_params(int64_t{moe.shared_experts} * Fe, bias) : 0);
    return norms + attn + ffn_p;
  }
  // All parameters, counting each vocabulary table with its padded rows (the tied table once);
  // `active`: with MoE layers' active parameters only (layer_params).
  int64_t num_params(int tp = 1, bool active = false) const {
    const int64_t C = d_model, V = padded_vocab(tp);
    const int64_t tables = (tie_embeddings ? 1 : 2) * V * C + (rope() ? 0 : int64_t{positions()} * C);
    int64_t layers = 0;
    for (int l = 0; l < n_layers; ++l) layers += layer_params(l, active);
    return tables + layers + (rms() ? C : 2 * C);
  }
  // Model FLOPs per token of a training step (forward + backward), llm.c's convention:
  // 6 N' + 6 L (H D) T, where N' is num_params() less the input embedding table when it is untied
  // (a lookup, not a matrix product; the tied table is counted once, as llm.c does), and with
  // mixture-of-experts layers the active parameters only (top_k routed experts, the shared ones and
  // the router). The attention term counts the query heads (H D = d_model): grouped K/V do not
  // reduce it. Recomputation is not counted.
  double flops_per_token(int tp = 1) const { return flops_per_token(tp, static_cast<double>(seq_len)); }
  // The same with each token attending `attended` keys on average in the attention term (llm.c
  // counts seq_len, every key of the sequence; packed documents under data.reset_attention_mask
  // need only their own: the sum over documents of length^2, per token).
  double flops_per_token(int tp, double attended) const {
    const double n = static_cast<double>(num_params(tp, /*active=*/true)) -
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

// The precision of the linear layers' GEMMs (train.precision): the backend's compute dtype (bf16
// on GPUs, f32 on the CPU), or FP8 (model/fp8.h) with one of two scaling recipes. tensorwise: each
// tensor scaled from its own amax when it is cast (current scaling: torchao's float8 tensorwise,
// Megatron's "tensorwise"); delayed: Transformer Engine's DelayedScaling, a scale per tensor from
// the max of the amaxes of the last `amax_history` steps.
enum class Precision { Bf16, Fp8 };
enum class Fp8Recipe { Tensorwise, Delayed };
template <> struct EnumNames<Precision> { static constexpr std::array<std::string_view, 2> names{"bf16", "fp8"}; };
template <> struct EnumNames<Fp8Recipe> {
  static constexpr std::array<std::string_view, 2> names{"tensorwise", "delayed"};
};

struct Fp8Config {
  Fp8Recipe recipe = Fp8Recipe::Tensorwise;
  int amax_history = 1024;  // delayed: steps of amax history
  int margin = 0;           // scales are divided by 2^margin (headroom below the format's largest value)
  int bf16_layers = 0;      // the first and the last this many layers keep the compute dtype
  // Whether layer `layer` of `n_layers` runs its GEMMs in FP8.
  bool fp8_layer(int layer, int n_layers) const { return layer >= bf16_layers && layer < n_layers - bf16_layers; }
  // How many of layer `layer`'s linears run in FP8 (model/fp8.h): 4 (the attention's QKV and
  // projection, the dense MLP's input and output), 2 in a mixture-of-experts layer (its attention's:
  // the router and the experts stay in bf16), 0 in a layer kept in bf16. The model registers, the
  // memory plan charges and the metrics list exactly these.
  int linears(const ModelConfig& m, int layer) const {
    if (!fp8_layer(layer, m.n_layers)) return 0;
    return m.moe.sparse(layer) ? 2 : 4;
  }
  // Whether some layer runs a dense MLP in FP8 (its width then obeys the FP8 GEMMs' rules).
  bool any_fp8_mlp(const ModelConfig& m) const {
    for (int l = 0; l < m.n_layers; ++l)
      if (linears(m, l) == 4) return true;
    return false;
  }
};

}  // namespace tripod
