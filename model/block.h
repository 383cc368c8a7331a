// A pre-norm transformer block: x1 = x + attn(ln_1(x)); x2 = x1 + mlp(ln_2(x1)) (ln: LayerNorm or
// RMSNorm). Under sequence parallelism x, x1, x2 and the norm outputs are this rank's token slice
// (N/tp, C); the linears see the gathered (N, C).
#pragma once

#include "model/attention.h"
#include "model/layernorm.h"
#include "model/mlp.h"

namespace tripod {

// What a block keeps between its forward and backward. With full recomputation only `x`.
struct BlockActs {
  Tensor x;            // (Ns, C) input (the previous block's output)
  Tensor h1, h2;       // (Ns, C) norm outputs
  NormActs ln1, ln2;
  AttentionActs attn;
  Tensor x1;           // (Ns, C) after the attention residual
  MlpActs mlp;
  bool recomputed = false;  // only x is held; the forward reruns before the backward
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
  const std::vector<Param*>& params() const { return params_; }

 private:
  Tensor run_forward(const Tensor& x, const MicroShape& ms, BlockActs& a);
  Ops& ops_;
  const ParallelContext& par_;
  RecomputeMode recompute_;
  Norm ln1_, ln2_;
  Attention attn_;
  Mlp mlp_;
  std::vector<Param*> params_;
};

}  // namespace tripod
