// LayerNorm layer: a weight and a bias over the model width; statistics saved by the caller.
#pragma once

#include "kernels/op.h"
#include "model/param_registry.h"

namespace tripod {

struct LayerNormActs {
  Tensor mean, rstd;  // (N) f32
};

struct LayerNorm {
  Param* weight = nullptr;
  Param* bias = nullptr;

  // Registers "<prefix>.weight" (ones) and "<prefix>.bias" (zeros), replicated across TP; their
  // gradients are partial per TP rank under sequence parallelism.
  static LayerNorm make(ParamRegistry& reg, const std::string& prefix, int64_t C, int chunk) {
    LayerNorm ln;
    ln.weight = &reg.add({.name = prefix + ".weight", .global_shape = {C}, .sp_partial_grad = true,
                          .init = Init::Ones, .chunk = chunk});
    ln.bias = &reg.add({.name = prefix + ".bias", .global_shape = {C}, .sp_partial_grad = true,
                        .init = Init::Zeros, .chunk = chunk});
    return ln;
  }
  // y (N, C) from x (N, C); mean and rstd allocated as activations.
  void forward(Ops& ops, const Tensor& x, Tensor& y, LayerNormActs& a) const {
    a.mean = ops.empty({x.size(0)}, DType::F32, MemCategory::Activations);
    a.rstd = ops.empty({x.size(0)}, DType::F32, MemCategory::Activations);
    ops.layernorm_forward(x, weight->value, bias->value, y, a.mean, a.rstd);
  }
  // dx += the gradient through the norm; weight and bias gradients accumulate.
  void backward(Ops& ops, const Tensor& dy, const Tensor& x, const LayerNormActs& a, Tensor& dx) const {
    ops.layernorm_backward(dy, x, weight->value, a.mean, a.rstd, dx, weight->grad, bias->grad);
  }
};

}  // namespace tripod
