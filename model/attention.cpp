// Tensor-parallel causal self-attention.
#include "model/attention.h"

#include <cmath>

namespace tripod {

Attention::Attention(Ops& ops, const ParallelContext& par, const ModelConfig& cfg, ParamRegistry& reg,
                     const std::string& prefix, int chunk)
    : ops_(ops), par_(par), C_(cfg.d_model), H_local_(cfg.n_heads / par.grid.tp()), D_(cfg.head_dim()) {
  const int tp = par.grid.tp(), r = par.coords.tp;
  const int64_t C = C_, Cl = C / tp;
  const float std = 0.02f, proj_std = 0.02f / std::sqrt(2.0f * cfg.n_layers);
  // QKV as (3, C_out, C_in): sharding dim 1 gives each rank q, k and v of its own heads, and the
  // local (3, C/tp, C) is the (3C/tp, C) weight of the local GEMM.
  qkv_w_ = &reg.add({.name = prefix + ".qkv.weight", .global_shape = {3, C, C}, .shard_dim = 1,
                     .shard_offset = r * Cl, .shard_size = Cl, .decay = true, .init = Init::Normal,
                     .stddev = std, .chunk = chunk});
  qkv_b_ = &reg.add({.name = prefix + ".qkv.bias", .global_shape = {3, C}, .shard_dim = 1, .shard_offset = r * Cl,
                     .shard_size = Cl, .init = Init::Zeros, .chunk = chunk});
  // Row-parallel: the input dimension is split.
  proj_w_ = &reg.add({.name = prefix + ".proj.weight", .global_shape = {C, C}, .shard_dim = 1,
                      .shard_offset = r * Cl, .shard_size = Cl, .decay = true, .init = Init::Normal,
                      .stddev = proj_std, .chunk = chunk});
  proj_b_ = &reg.add({.name = prefix + ".proj.bias", .global_shape = {C}, .init = Init::Zeros, .chunk = chunk});
}

void Attention::forward(const Tensor& h_full, const MicroShape& ms, bool keep_probs, AttentionActs& a,
                        Tensor& out_partial) {
  const int64_t N = ms.N(), Cl = H_local_ * D_;
  a.qkv = ops_.empty({N, 3 * Cl}, ops_.compute_dtype(), MemCategory::Activations);
  ops_.linear_forward(h_full, qkv_w_->value.view({3 * Cl, C_}), qkv_b_->value.view({3 * Cl}), a.qkv);
  a.att = ops_.empty({N, Cl}, ops_.compute_dtype(), MemCategory::Activations);
  a.lse = ops_.empty({ms.B, H_local_, ms.T}, DType::F32, MemCategory::Activations);
  a.probs = keep_probs ? ops_.empty({ms.B, H_local_, ms.T, ms.T}, ops_.compute_dtype(), MemCategory::Activations)
                       : Tensor{};
  Tensor att4 = a.att.view({ms.B, ms.T, H_local_, D_});
  ops_.attention_forward(a.qkv.view({ms.B, ms.T, 3, H_local_, D_}), att4, a.lse, a.probs);
  // The replicated bias joins the partial sums once, on TP rank 0.
  ops_.linear_forward(a.att, proj_w_->value, par_.coords.tp == 0 ? proj_b_->value : Tensor{}, out_partial);
}

void Attention::backward(const Tensor& dout_full, const Tensor& h_full, const MicroShape& ms,
                         const AttentionActs& a, Tensor& dh_full) {
  const int64_t N = ms.N(), Cl = H_local_ * D_;
  Tensor datt = ops_.empty({N, Cl}, ops_.compute_dtype(), MemCategory::Workspace);
  // Every TP rank sees the whole output gradient, so the replicated bias gets the same gradient everywhere.
  ops_.linear_backward(dout_full, a.att, proj_w_->value, datt, proj_w_->grad, proj_b_->grad);
  Tensor dqkv = ops_.empty({N, 3 * Cl}, ops_.compute_dtype(), MemCategory::Workspace);
  Tensor dqkv5 = dqkv.view({ms.B, ms.T, 3, H_local_, D_});
  ops_.attention_backward(datt.view({ms.B, ms.T, H_local_, D_}), a.qkv.view({ms.B, ms.T, 3, H_local_, D_}),
                          a.att.view({ms.B, ms.T, H_local_, D_}), a.lse, a.probs, dqkv5);
  datt = Tensor{};
  Tensor qkv_bgrad = qkv_b_->grad.view({3 * Cl});
  Tensor qkv_wgrad = qkv_w_->grad.view({3 * Cl, C_});
  ops_.linear_backward(dqkv, h_full, qkv_w_->value.view({3 * Cl, C_}), dh_full, qkv_wgrad, qkv_bgrad);
  // The key bias adds q.b_k to every score of a row, which the softmax ignores: its gradient is
  // exactly zero, and what the sum above holds is rounding noise. Adam would divide that noise by
  // its eps and walk the key bias randomly (differently on every grid), so it is kept at zero.
  Tensor key_bias_grad = qkv_b_->grad.slice(1, 2);
  ops_.fill(key_bias_grad, 0.f);
}

}  // namespace tripod
