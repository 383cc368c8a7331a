// The MLP with its hidden units split across TP ranks: a column-parallel input projection, the
// activation, a row-parallel output projection. model.mlp = "gelu": "<prefix>.fc" (F, C), GELU,
// ".proj" (C, F) (GPT-2's). "swiglu": ".gate" and ".up" (F, C), packed so that this rank's
// shards of both are one GEMM weight, silu(gate x) * up x, ".proj" (C, F) (Llama's down_proj).
// Biases only with model.bias (an MoE layer's shared experts, an Mlp of their joint width, have
// none). DenseFfn is the dense feed-forward half of a block (model/ffn.h).
#pragma once

#include "model/ffn.h"

namespace tripod {

struct MlpParams {
  LinearParams fc, proj;  // fc: [gate; up] for SwiGLU
  static MlpParams find(ParamRegistry& reg, const ModelConfig& cfg, const std::string& prefix, bool bias);
};

class Mlp {
 public:
  // Hidden width `ffn` (cfg.ffn() for a block's MLP), biases when `bias`.
  Mlp(Ops& ops, const ParallelContext& par, const ModelConfig& cfg, ParamRegistry& reg, const std::string& prefix,
      int chunk, int64_t ffn, bool bias);
  // h_full (N, C) -> partial output (N, C) (bias on TP rank 0 only).
  void forward(const Tensor& h_full, MlpActs& a, Tensor& out_partial);
  // backward split in two (bit for bit the same as running both). The input half: dout_full ->
  // dh_full; returns dfc (N, F/tp or 2F/tp), the input projection's output gradient, charged to
  // `dfc_category`.
  Tensor backward_input(const Tensor& dout_full, const MlpActs& a, Tensor& dh_full, MemCategory dfc_category);
  // The weight half: the output projection's gradients from dout_full (N, C) and act (N, F/tp)
  // (MlpActs::act), the input projection's from dfc and h_full (N, C).
  void backward_weight(const Tensor& dout_full, const Tensor& act, const Tensor& dfc, const Tensor& h_full);

  // The activation part shared with inference: fc (N, F/tp or 2F/tp) from h, then act (N, F/tp).
  static void activate(Ops& ops, bool swiglu, const MlpParams& p, const Tensor& h, Tensor& fc, Tensor& act);

 private:
  Ops& ops_;
  const ParallelContext& par_;
  bool swiglu_;
  int64_t F_local_;
  MlpParams p_;
};

// The dense feed-forward half of a block: "h.<layer>.mlp", model.ffn_hidden wide.
class DenseFfn final : public FeedForward {
 public:
  DenseFfn(Ops& ops, const ParallelContext& par, const ModelConfig& cfg, ParamRegistry& reg, const std::string& prefix,
           int chunk)
      : mlp_(ops, par, cfg, reg, prefix, chunk, cfg.ffn(), cfg.bias) {}
  void forward(const Tensor& h_full, const MicroShape&, bool, FfnActs& a, Tensor& out_partial) override {
    mlp_.forward(h_full, a.mlp, out_partial);
  }
  void keep_for_recompute(FfnActs& a) override { a = FfnActs{}; }
  void backward_input(const Tensor& dout_full, const MicroShape&, FfnActs& a, Tensor& dh_full, FfnPending& p,
                      MemCategory category) override {
    p.dfc = mlp_.backward_input(dout_full, a.mlp, dh_full, category);
    p.act = a.mlp.act;
    a.mlp = MlpActs{};
  }
  void backward_weight(const Tensor& dout_full, const Tensor& h_full, const MicroShape&, FfnPending& p) override {
    mlp_.backward_weight(dout_full, p.act, p.dfc, h_full);
    p = FfnPending{};
  }

 private:
  Mlp mlp_;
};

}  // namespace tripod
