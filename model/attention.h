// Causal self-attention with its heads split across TP ranks: a column-parallel QKV projection,
// the attention core on this rank's heads, and a row-parallel output projection.
#pragma once

#include "model/config.h"
#include "model/param_registry.h"
#include "parallel/context.h"

namespace tripod {

// Shape of a micro-batch: B sequences of T tokens, N = B*T.
struct MicroShape {
  int64_t B = 0, T = 0;
  int64_t N() const { return B * T; }
};

struct AttentionActs {
  Tensor qkv;    // (N, 3*C/tp) = (B, T, 3, H/tp, D)
  Tensor att;    // (N, C/tp) attention output, input of the output projection
  Tensor lse;    // (B, H/tp, T) f32 softmax statistics
  Tensor probs;  // (B, H/tp, T, T) softmax, only when kept (no recomputation, CPU)
};

class Attention {
 public:
  Attention(Ops& ops, const ParallelContext& par, const ModelConfig& cfg, ParamRegistry& reg,
            const std::string& prefix, int chunk);
  // h_full (N, C), the LayerNorm output as every TP rank sees it -> partial output (N, C)
  // of this rank's heads (the bias added on TP rank 0 only; summed by the caller).
  void forward(const Tensor& h_full, const MicroShape& ms, bool keep_probs, AttentionActs& a, Tensor& out_partial);
  // dout_full (N, C) -> dh_full (N, C), this rank's contribution to the input gradient.
  void backward(const Tensor& dout_full, const Tensor& h_full, const MicroShape& ms, const AttentionActs& a,
                Tensor& dh_full);

 private:
  Ops& ops_;
  const ParallelContext& par_;
  int64_t C_, H_local_, D_;
  Param *qkv_w_, *qkv_b_, *proj_w_, *proj_b_;
};

}  // namespace tripod
