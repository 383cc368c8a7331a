// The MLP with its hidden units split across TP ranks: column-parallel fc, GELU, row-parallel proj.
#pragma once

#include "model/attention.h"

namespace tripod {

struct MlpActs {
  Tensor fc;    // (N, F/tp) before the GELU
  Tensor gelu;  // (N, F/tp) after it, input of the projection
};

class Mlp {
 public:
  Mlp(Ops& ops, const ParallelContext& par, const ModelConfig& cfg, ParamRegistry& reg, const std::string& prefix,
      int chunk);
  // h_full (N, C) -> partial output (N, C) (bias on TP rank 0 only).
  void forward(const Tensor& h_full, MlpActs& a, Tensor& out_partial);
  // dout_full (N, C) -> dh_full (N, C).
  void backward(const Tensor& dout_full, const Tensor& h_full, const MlpActs& a, Tensor& dh_full);

 private:
  Ops& ops_;
  const ParallelContext& par_;
  int64_t F_local_;
  Param *fc_w_, *fc_b_, *proj_w_, *proj_b_;
};

}  // namespace tripod
