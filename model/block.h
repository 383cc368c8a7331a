// A pre-norm transformer block: x1 = x + attn(ln_1(x)); x2 = x1 + ffn(ln_2(x1)) (ln: LayerNorm or
// RMSNorm; ffn: the dense MLP or a mixture of experts, model/ffn.h). Under sequence parallelism x,
// x1, x2 and the norm outputs are this rank's token slice (N/tp, C); the linears see the gathered
// (N, C).
#pragma once

#include "model/attention.h"
#include "model/ffn.h"
#include "model/layernorm.h"

namespace tripod {

// What a block keeps between its forward and backward. With full recomputation only `x` (and what
// the feed-forward half keeps to replay: an MoE router's decision).
struct BlockActs {
  Tensor x;            // (Ns, C) input (the previous block's output)
  Tensor h1, h2;       // (Ns, C) norm outputs
  NormActs ln1, ln2;
  AttentionActs attn;
  Tensor x1;           // (Ns, C) after the attention residual
  FfnActs ffn;
  bool recomputed = false;  // only x is held; the forward reruns before the backward
};

// What a block's weight gradients need, kept by backward_input for backward_weight (a zero-bubble
// pipeline's I and W): per weight GEMM its input and output gradient, per norm its input,
// statistics and output gradient; nothing else. All of it is charged to MemCategory::Activations
// (model/memory_estimate.h counts it). Under sequence parallelism the column-parallel GEMMs' input
// (the norm output) and the row-parallel GEMMs' output gradient (the residual's) are kept as this
// rank's token slice (Ns, C) and all-gathered again by backward_weight, the same all-gathers the
// forward and backward do: 1/tp of the memory of keeping the gathered (N, C) tensors, for one
// more all-gather per GEMM in W.
struct BlockPending {
  NormPending ln1, ln2;        // x (Ns, C) (the block input, x1), dy (Ns, C), statistics
  LinearPending qkv;           // x: h1 (Ns, C), gathered in W; dy (N, (H + 2 Hkv) D/tp)
  LinearPending attn_proj;     // x: att (N, H D/tp); dy (Ns, C), gathered in W
  LinearPending ffn;           // the feed-forward half's input h2 and output gradient (Ns, C), gathered in W
  FfnPending ffn_work;         // the rest of what its weight gradients need (model/ffn.h)
};

class Block {
 public:
  Block(Ops& ops, const ParallelContext& par, const ModelConfig& cfg, ParamRegistry& reg, int layer, int chunk,
        RecomputeMode recompute);
  // x (Ns, C) -> output (Ns, C), charged as an activation (it is the next block's input).
  Tensor forward(const Tensor& x, const MicroShape& ms, BlockActs& a);
  // dres (Ns, C), the gradient of the block's output, is turned in place into the gradient of its
  // input and returned; the activations are released.
  Tensor backward(Tensor dres, const MicroShape& ms, BlockActs& a);
  // backward split in two, bit for bit the same. The input half: as backward, but the parameters'
  // gradients are left to backward_weight, for which `p` receives what they need (a recomputed
  // block reruns its forward here).
  Tensor backward_input(Tensor dres, const MicroShape& ms, BlockActs& a, BlockPending& p);
  // The weight half: accumulates the parameters' gradients and releases `p`. Under tensor
  // parallelism it all-gathers (SP), so every TP rank runs its W actions in the same order.
  void backward_weight(BlockPending& p, const MicroShape& ms);
  const std::vector<Param*>& params() const { return params_; }
  FeedForward& ffn() { return *ffn_; }

 private:
  Tensor run_forward(const Tensor& x, const MicroShape& ms, BlockActs& a, bool replay);
  Ops& ops_;
  const ParallelContext& par_;
  RecomputeMode recompute_;
  Norm ln1_, ln2_;
  Attention attn_;
  std::unique_ptr<FeedForward> ffn_;
  std::vector<Param*> params_;  // trained parameters (not buffers)
};

}  // namespace tripod
