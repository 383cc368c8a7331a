// The normalisation layer: LayerNorm (a weight and a bias) or RMSNorm (a weight) over the model
// width, as model.norm chooses; statistics saved by the caller.
#pragma once

#include "kernels/op.h"
#include "model/config.h"
#include "model/param_registry.h"

namespace tripod {

struct NormActs {
  Tensor mean, rstd;  // (N) f32; no mean for RMSNorm
};

// What a norm's deferred weight gradient needs (a split backward's W): its input, statistics and
// output gradient.
struct NormPending {
  Tensor x, dy;  // (N, C)
  NormActs stats;
};

struct Norm {
  Param* weight = nullptr;
  Param* bias = nullptr;  // LayerNorm only
  float eps = 1e-5f;

  // Registers "<prefix>.weight" (ones) and, for LayerNorm, "<prefix>.bias" (zeros), replicated
  // across TP; their gradients are partial per TP rank under sequence parallelism.
  static Norm make(ParamRegistry& reg, const std::string& prefix, const ModelConfig& cfg, int chunk) {
    Norm n;
    n.eps = static_cast<float>(cfg.norm_eps);
    n.weight = &reg.add({.name = prefix + ".weight", .global_shape = {cfg.d_model}, .sp_partial_grad = true,
                         .init = Init::Ones, .chunk = chunk});
    if (!cfg.rms())
      n.bias = &reg.add({.name = prefix + ".bias", .global_shape = {cfg.d_model}, .sp_partial_grad = true,
                         .init = Init::Zeros, .chunk = chunk});
    return n;
  }
  // Finds the parameters a model registered under `prefix` (for inference).
  static Norm find(ParamRegistry& reg, const std::string& prefix, const ModelConfig& cfg) {
    Norm n{.weight = reg.find(prefix + ".weight"), .bias = reg.find(prefix + ".bias"),
           .eps = static_cast<float>(cfg.norm_eps)};
    TRIPOD_CHECK(n.weight && (cfg.rms() || n.bias), "norm {} is not on this rank", prefix);
    return n;
  }
  // Statistics bytes per token (f32): mean and rstd, or rstd alone.
  static int64_t stat_bytes(const ModelConfig& cfg) { return cfg.rms() ? 4 : 8; }

  // y (N, C) from x (N, C); the statistics allocated in `category`.
  void forward(Ops& ops, const Tensor& x, Tensor& y, NormActs& a,
               MemCategory category = MemCategory::Activations) const {
    a.rstd = ops.empty({x.size(0)}, DType::F32, category);
    if (!bias) {
      ops.rmsnorm_forward(x, weight->value, eps, y, a.rstd);
      return;
    }
    a.mean = ops.empty({x.size(0)}, DType::F32, category);
    ops.layernorm_forward(x, weight->value, bias->value, eps, y, a.mean, a.rstd);
  }
  // dx += the gradient through the norm; the parameters' gradients accumulate.
  void backward(Ops& ops, const Tensor& dy, const Tensor& x, const NormActs& a, Tensor& dx) const {
    if (bias)
      ops.layernorm_backward(dy, x, weight->value, a.mean, a.rstd, dx, weight->grad, bias->grad);
    else
      ops.rmsnorm_backward(dy, x, weight->value, a.rstd, dx, weight->grad);
  }
  // The two halves of backward, bit for bit the same: dx only, then the parameters' gradients.
  void backward_input(Ops& ops, const Tensor& dy, const Tensor& x, const NormActs& a, Tensor& dx) const {
    Tensor none;
    if (bias)
      ops.layernorm_backward(dy, x, weight->value, a.mean, a.rstd, dx, none, none);
    else
      ops.rmsnorm_backward(dy, x, weight->value, a.rstd, dx, none);
  }
  void backward_weight(Ops& ops, const NormPending& p) const {
    Tensor none;
    if (bias)
      ops.layernorm_backward(p.dy, p.x, weight->value, p.stats.mean, p.stats.rstd, none, weight->grad, bias->grad);
    else
      ops.rmsnorm_backward(p.dy, p.x, weight->value, p.stats.rstd, none, weight->grad);
  }
};

}  // namespace tripod
