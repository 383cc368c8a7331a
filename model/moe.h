// A mixture-of-experts feed-forward layer ([moe], model/config.h), the equations of Mixtral,
// Qwen3-MoE and DeepSeek-V3:
//
//   logits = h Wr^T (N, E)                                         router "<prefix>.router.weight" (E, C)
//   s = softmax(logits) (router "softmax") or sigmoid(logits) (router "sigmoid")
//   the top_k experts of s + b by token (b: the selection bias "<prefix>.expert_bias", a buffer,
//   present when moe.bias_update_rate > 0; it chooses, it never weighs)
//   w_j = s_{e_j}, divided by their sum when moe.normalize_top_k
//   y = sum_j w_j expert_{e_j}(h) + shared(h)
//
// Each expert is the model's MLP kind (GELU: "<prefix>.experts.E.fc", ".proj"; SwiGLU:
// ".experts.E.gate", ".up", ".proj") moe.ffn_hidden wide, without biases; the shared experts are
// one such MLP moe.shared_experts x moe.ffn_hidden wide ("<prefix>.shared.*"). Under tensor
// parallelism every expert is split like the dense MLP (fc column-parallel, proj row-parallel:
// Megatron's rule), the router runs on every TP rank over all N tokens (its weight is
// replicated), and the gradient of the combine weights, partial per TP rank, is summed over TP.
//
// Routed tokens are copied into expert-sorted rows (dispatch), the experts run as grouped GEMMs
// over their rows, and the outputs are combined back weighted (combine), by a token dispatcher
// (parallel/expert_parallel/token_dispatcher.h): locally, or under expert parallelism
// (parallel.ep > 1) between the EP ranks, each of which registers and computes E/ep of the experts
// (its own, by ParamSpec::expert) over the rows every EP rank's tokens send them. With
// moe.capacity_factor > 0 an expert takes at most ceil(factor * N * top_k / E) of the N tokens of
// this rank's micro-batch, first come first served in token order; the pairs past it are dropped
// (the token keeps its residual and its other experts) and counted.
//
// Auxiliary losses, each averaged over the step's micro-batches (Megatron) and added to the
// gradient only (the reported loss is the language model's):
//   load balancing (transformers' Mixtral): aux_loss_coeff * E * sum_e f_e P_e, f_e the fraction of
//   the micro-batch's tokens choosing e (each of its top_k choices counting; capacity ignored),
//   P_e the mean over those tokens of the balancing probability (softmax: s_e; sigmoid: s_e / sum s);
//   z-loss: z_loss_coeff * mean over the tokens of logsumexp(logits)^2.
// Under context parallelism a micro-batch's counts are summed over the CP group, so both losses
// are those of the whole sequences.
#pragma once

#include <memory>
#include <optional>
#include <vector>

#include "model/ffn.h"
#include "model/mlp.h"

namespace tripod {

// This rank's parameters of an MoE layer, as registered (training) or found by name (inference).
struct MoeParams {
  Param* router = nullptr;          // (E, C), replicated over TP
  Param* bias = nullptr;            // (E) f32 selection bias (a buffer), or null
  std::vector<LinearParams> fc;     // per expert here: [gate; up] (SwiGLU) or fc, (F/tp or 2F/tp, C)
  std::vector<LinearParams> proj;   // per expert here: (C, F/tp)
  std::optional<MlpParams> shared;  // the shared experts, when moe.shared_experts > 0
  // The experts [first, first + count) (count < 0: all of them).
  static MoeParams find(ParamRegistry& reg, const ModelConfig& cfg, const std::string& prefix, int first = 0,
                        int count = -1);
  std::vector<Tensor> fc_weights() const;
  std::vector<Tensor> proj_weights() const;
};

// What an MoE layer's forwards counted since reset_stats(), on this rank (the trainer sums them
// over the ranks each step: train/trainer.cpp).
struct MoeStepStats {
  std::vector<double> routed;  // (E) pairs routed to each expert by this rank's tokens
  double dropped = 0;          // pairs dropped by the capacity
  double aux = 0;              // this rank's share of the sum over micro-batches of E sum_e f_e P_e
  double z = 0;                // ... and of the mean of lse^2
};

class MoeLayer final : public FeedForward {
 public:
  MoeLayer(Ops& ops, const ParallelContext& par, const ModelConfig& cfg, ParamRegistry& reg, int layer, int chunk);
  void forward(const Tensor& h_full, const MicroShape& ms, bool replay, FfnActs& a, Tensor& out_partial) override;
  void keep_for_recompute(FfnActs& a) override;
  void backward_input(const Tensor& dout_full, const MicroShape& ms, FfnActs& a, Tensor& dh_full, FfnPending& p,
                      MemCategory category) override;
  void backward_weight(const Tensor& dout_full, const Tensor& h_full, const MicroShape& ms, FfnPending& p) override;

  int layer() const { return layer_; }
  const MoeStepStats& stats() const { return stats_; }
  // Wall time in the token dispatcher since the layer was built (TokenDispatcher::seconds).
  double dispatcher_seconds() const { return dispatcher_ ? dispatcher_->seconds() : 0.0; }
  void reset_stats();
  // Aux-loss-free balancing (DeepSeek-V3): b_e += rate * sign(mean - routed[e]) from the step's
  // pairs per expert over the whole batch (the same on every rank, so every copy of b stays equal).
  void update_bias(const std::vector<double>& routed);
  // Inference (model/inference.h): out_partial (n, C) from h (n, C), dropless, nothing kept.
  static void infer(Ops& ops, const ParallelContext& par, const ModelConfig& cfg, const MoeParams& p,
                    const Tensor& h, Tensor& out_partial);

 private:
  // The router's decision for h_full (N, C) into r; counts summed over CP; statistics.
  void route(const Tensor& h_full, const MicroShape& ms, MoeRouting& r);

  Ops& ops_;
  const ParallelContext& par_;
  MoeConfig moe_;
  bool swiglu_;
  int layer_;
  // The token dispatcher, made at its first use (a model built only to register its parameters, as
  // the rank layout builds one, has no communicators).
  TokenDispatcher& dispatcher();

  int64_t C_, F_local_;
  int first_expert_ = 0;  // this rank's experts: [first_expert_, first_expert_ + E / ep)
  MoeParams p_;
  std::optional<Mlp> shared_;
  std::unique_ptr<TokenDispatcher> dispatcher_;
  MoeStepStats stats_;
};

}  // namespace tripod
