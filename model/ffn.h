// The feed-forward half of a block behind one interface, chosen when the block is built
// (make_feed_forward): a dense MLP (model/mlp.h) or a mixture of experts (model/moe.h). The block,
// the model, the schedules and the checkpoints see only this interface and the data it keeps.
//
// Under tensor parallelism both take the input as every TP rank sees it (h_full, N tokens) and
// return this rank's partial output, which the block sums over TP (or reduce-scatters under
// sequence parallelism), exactly as for the dense MLP.
#pragma once

#include <memory>
#include <vector>

#include "model/attention.h"
#include "parallel/expert_parallel/token_dispatcher.h"

namespace tripod {

struct MlpActs {
  Tensor fc;   // (N, F/tp) before the GELU, or (N, 2F/tp) = [gate | up] for SwiGLU
  Tensor act;  // (N, F/tp) after the activation, input of the projection
};

// A mixture-of-experts router's decision for one micro-batch: data, so that a full recomputation
// replays it (never recomputes it) and a token dispatcher moves rows by it. Per token its experts
// and weights; the dispatcher's plan of where each (token, choice) pair's row is computed.
struct MoeRouting {
  Tensor logits;   // (N, E) f32, the router's output (its backward recomputes the scores from them)
  Tensor idx;      // (N, k) i32, the chosen experts of every token, best first
  Tensor weights;  // (N, k) f32, their weights
  DispatchPlan plan;  // the pairs' rows: parallel/expert_parallel/token_dispatcher.h
  std::vector<int64_t> routed;   // (E) host: pairs choosing each expert over the micro-batch (all its
                                 // context-parallel slices), before the capacity
  int64_t tokens = 0;            // the micro-batch's tokens over its context-parallel slices
  bool defined() const { return idx.defined(); }
};

struct MoeActs {
  MoeRouting routing;
  MlpActs experts;  // fc and act of the rows this rank's experts compute (at least plan.rows())
  MlpActs shared;   // the shared experts (N rows)
};

// What a feed-forward layer keeps between its forward and backward: the dense MLP's tensors, or
// an MoE layer's. With full recomputation only what keep_for_recompute leaves.
struct FfnActs {
  MlpActs mlp;
  MoeActs moe;
};

// What the layer's weight gradients need after a split backward's I (besides the layer's input
// and output gradient, which the block keeps): charged to the category backward_input is given.
struct FfnPending {
  Tensor dfc, act;       // dense: (N, .); MoE: the routed experts' (at least plan.rows() rows)
  Tensor dlogits;        // MoE: the router's output gradient (N, E)
  MoeRouting routing;    // MoE: the rows' order and weights
  Tensor shared_dfc, shared_act;  // MoE: the shared experts' (N, .)
};

class FeedForward {
 public:
  virtual ~FeedForward() = default;
  // h_full (N, C) -> this rank's partial output (N, C). `replay`: the rerun of a fully recomputed
  // layer; `a` holds what keep_for_recompute left, and the layer repeats those decisions.
  virtual void forward(const Tensor& h_full, const MicroShape& ms, bool replay, FfnActs& a, Tensor& out_partial) = 0;
  // Full recomputation: drops from `a` everything a replayed forward recomputes (an MoE layer
  // keeps its router's decision).
  virtual void keep_for_recompute(FfnActs& a) = 0;
  // dout_full (N, C) -> dh_full (N, C) (overwritten): backward_input, then backward_weight.
  void backward(const Tensor& dout_full, const Tensor& h_full, const MicroShape& ms, FfnActs& a, Tensor& dh_full) {
    FfnPending p;
    backward_input(dout_full, ms, a, dh_full, p, MemCategory::Workspace);
    backward_weight(dout_full, h_full, ms, p);
  }
  // The input half: dh_full from dout_full; `a` is released and what the weight gradients need is
  // moved into `p`, new tensors charged to `category`.
  virtual void backward_input(const Tensor& dout_full, const MicroShape& ms, FfnActs& a, Tensor& dh_full,
                              FfnPending& p, MemCategory category) = 0;
  // The weight half, from the layer's input h_full and output gradient dout_full (N, C).
  virtual void backward_weight(const Tensor& dout_full, const Tensor& h_full, const MicroShape& ms,
                               FfnPending& p) = 0;
};

// Layer `layer`'s feed-forward half, "h.<layer>.mlp": a mixture of experts where cfg.moe.sparse(layer),
// else the dense MLP, whose GEMMs join `fp8` when set (train.precision = "fp8"; experts stay in
// bf16 for now). Registers its parameters in `reg`.
std::unique_ptr<FeedForward> make_feed_forward(Ops& ops, const ParallelContext& par, const ModelConfig& cfg,
                                               ParamRegistry& reg, int layer, int chunk, Fp8Registry* fp8 = nullptr);

}  // namespace tripod
