// Tensor-parallel MLP.
#include "model/mlp.h"

#include <cmath>

namespace tripod {

Mlp::Mlp(Ops& ops, const ParallelContext& par, const ModelConfig& cfg, ParamRegistry& reg, const std::string& prefix,
         int chunk)
    : ops_(ops), par_(par), F_local_(cfg.ffn() / par.grid.tp()) {
  const int r = par.coords.tp;
  const int64_t C = cfg.d_model, F = cfg.ffn(), Fl = F_local_;
  const float std = 0.02f, proj_std = 0.02f / std::sqrt(2.0f * cfg.n_layers);
  fc_w_ = &reg.add({.name = prefix + ".fc.weight", .global_shape = {F, C}, .shard_dim = 0, .shard_offset = r * Fl,
                    .shard_size = Fl, .decay = true, .init = Init::Normal, .stddev = std, .chunk = chunk});
  fc_b_ = &reg.add({.name = prefix + ".fc.bias", .global_shape = {F}, .shard_dim = 0, .shard_offset = r * Fl,
                    .shard_size = Fl, .init = Init::Zeros, .chunk = chunk});
  proj_w_ = &reg.add({.name = prefix + ".proj.weight", .global_shape = {C, F}, .shard_dim = 1,
                      .shard_offset = r * Fl, .shard_size = Fl, .decay = true, .init = Init::Normal,
                      .stddev = proj_std, .chunk = chunk});
  proj_b_ = &reg.add({.name = prefix + ".proj.bias", .global_shape = {C}, .init = Init::Zeros, .chunk = chunk});
}

void Mlp::forward(const Tensor& h_full, MlpActs& a, Tensor& out_partial) {
  const int64_t N = h_full.size(0);
  a.fc = ops_.empty({N, F_local_}, ops_.compute_dtype(), MemCategory::Activations);
  a.gelu = ops_.empty({N, F_local_}, ops_.compute_dtype(), MemCategory::Activations);
  ops_.linear_gelu_forward(h_full, fc_w_->value, fc_b_->value, a.fc, a.gelu);  // one GEMM epilogue on CUDA
  ops_.linear_forward(a.gelu, proj_w_->value, par_.coords.tp == 0 ? proj_b_->value : Tensor{}, out_partial);
}

void Mlp::backward(const Tensor& dout_full, const Tensor& h_full, const MlpActs& a, Tensor& dh_full) {
  const int64_t N = h_full.size(0);
  Tensor dg = ops_.empty({N, F_local_}, ops_.compute_dtype(), MemCategory::Workspace);
  ops_.linear_backward(dout_full, a.gelu, proj_w_->value, dg, proj_w_->grad, proj_b_->grad);
  ops_.gelu_backward(a.fc, dg, dg);
  ops_.linear_backward(dg, h_full, fc_w_->value, dh_full, fc_w_->grad, fc_b_->grad);
}

}  // namespace tripod
