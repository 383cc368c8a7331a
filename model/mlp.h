// The MLP with its hidden units split across TP ranks: a column-parallel input projection, the
// activation, a row-parallel output projection. model.mlp = "gelu": "<prefix>.fc" (F, C), GELU,
// ".proj" (C, F) (GPT-2's). "swiglu": ".gate" and ".up" (F, C), packed so that this rank's
// shards of both are one GEMM weight, silu(gate x) * up x, ".proj" (C, F) (Llama's down_proj).
// Biases only with model.bias.
#pragma once

#include "model/attention.h"

namespace tripod {

struct MlpActs {
  Tensor fc;   // (N, F/tp) before the GELU, or (N, 2F/tp) = [gate | up] for SwiGLU
  Tensor act;  // (N, F/tp) after the activation, input of the projection
};

struct MlpParams {
  LinearParams fc, proj;  // fc: [gate; up] for SwiGLU
  static MlpParams find(ParamRegistry& reg, const ModelConfig& cfg, const std::string& prefix);
};

class Mlp {
 public:
  // With `fp8` the two GEMMs of an FP8 layer (`layer`) run in FP8 (model/fp8.h).
  Mlp(Ops& ops, const ParallelContext& par, const ModelConfig& cfg, ParamRegistry& reg, const std::string& prefix,
      int chunk, Fp8Registry* fp8 = nullptr, int layer = 0);
  // h_full (N, C) -> partial output (N, C) (bias on TP rank 0 only).
  void forward(const Tensor& h_full, MlpActs& a, Tensor& out_partial);
  // dout_full (N, C) -> dh_full (N, C).
  void backward(const Tensor& dout_full, const Tensor& h_full, const MlpActs& a, Tensor& dh_full);
  // backward split in two (bit for bit the same). The input half: dout_full -> dh_full; returns
  // dfc (N, F/tp or 2F/tp), the input projection's output gradient, charged to `dfc_category`.
  Tensor backward_input(const Tensor& dout_full, const MlpActs& a, Tensor& dh_full, MemCategory dfc_category);
  // The weight half: the output projection's gradients from dout_full (N, C) and act (N, F/tp)
  // (MlpActs::act), the input projection's from dfc and h_full (N, C).
  void backward_weight(const Tensor& dout_full, const Tensor& act, const Tensor& dfc, const Tensor& h_full);

  // The activation part shared with inference: fc (N, F/tp or 2F/tp) from h, then act (N, F/tp)
  // (the input GEMM through `fc_fp8` when set).
  static void activate(Ops& ops, bool swiglu, const MlpParams& p, const Tensor& h, Tensor& fc, Tensor& act,
                       Fp8Linear* fc_fp8 = nullptr);

 private:
  Ops& ops_;
  const ParallelContext& par_;
  bool swiglu_;
  int64_t F_local_;
  MlpParams p_;
  Fp8Linear* fc_fp8_ = nullptr;  // null: the backend's own GEMMs
  Fp8Linear* proj_fp8_ = nullptr;
};

}  // namespace tripod
