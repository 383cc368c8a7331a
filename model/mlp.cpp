// Tensor-parallel MLP (GELU or SwiGLU).
#include "model/mlp.h"

#include <cmath>

namespace tripod {

MlpParams MlpParams::find(ParamRegistry& reg, const ModelConfig& cfg, const std::string& prefix, bool bias) {
  MlpParams m;
  m.fc.reg = m.proj.reg = &reg;
  auto need = [&](const std::string& name) {
    Param* p = reg.find(prefix + "." + name);
    TRIPOD_CHECK(p, "parameter {}.{} is not on this rank", prefix, name);
    return p;
  };
  for (const char* part : cfg.swiglu() ? std::vector<const char*>{"gate", "up"} : std::vector<const char*>{"fc"}) {
    m.fc.w.push_back(need(std::string(part) + ".weight"));
    if (bias) m.fc.b.push_back(need(std::string(part) + ".bias"));
  }
  m.proj.w.push_back(need("proj.weight"));
  if (bias) m.proj.b.push_back(need("proj.bias"));
  return m;
}

Mlp::Mlp(Ops& ops, const ParallelContext& par, const ModelConfig& cfg, ParamRegistry& reg, const std::string& prefix,
         int chunk, int64_t ffn, bool bias, Fp8Registry* fp8, int layer)
    : ops_(ops), par_(par), swiglu_(cfg.swiglu()), F_local_(ffn / par.grid.tp()) {
  const int r = par.coords.tp;
  const int64_t C = cfg.d_model, F = ffn, Fl = F_local_;
  const float std = 0.02f, proj_std = 0.02f / std::sqrt(2.0f * cfg.n_layers);
  const std::vector<const char*> parts = swiglu_ ? std::vector<const char*>{"gate", "up"}
                                                 : std::vector<const char*>{"fc"};
  for (size_t i = 0; i < parts.size(); ++i)
    reg.add({.name = prefix + "." + parts[i] + ".weight", .global_shape = {F, C}, .shard_dim = 0,
             .shard_offset = r * Fl, .shard_size = Fl, .decay = true, .init = Init::Normal, .stddev = std,
             .chunk = chunk, .packed = i > 0});
  if (bias)
    for (size_t i = 0; i < parts.size(); ++i)
      reg.add({.name = prefix + "." + parts[i] + ".bias", .global_shape = {F}, .shard_dim = 0,
               .shard_offset = r * Fl, .shard_size = Fl, .init = Init::Zeros, .chunk = chunk, .packed = i > 0});
  reg.add({.name = prefix + ".proj.weight", .global_shape = {C, F}, .shard_dim = 1, .shard_offset = r * Fl,
           .shard_size = Fl, .decay = true, .init = Init::Normal, .stddev = proj_std, .chunk = chunk});
  if (bias) reg.add({.name = prefix + ".proj.bias", .global_shape = {C}, .init = Init::Zeros, .chunk = chunk});
  p_ = MlpParams::find(reg, cfg, prefix, bias);
  if (fp8 && fp8->fp8_layer(layer)) {
    fc_fp8_ = fp8->add(prefix + ".fc", layer, 2, /*row_parallel=*/false, (swiglu_ ? 2 : 1) * Fl, C);
    proj_fp8_ = fp8->add(prefix + ".proj", layer, 3, /*row_parallel=*/true, C, Fl);
  }
}

void Mlp::activate(Ops& ops, bool swiglu, const MlpParams& p, const Tensor& h, Tensor& fc, Tensor& act,
                   Fp8Linear* fc_fp8) {
  if (swiglu) {
    linear_forward(ops, fc_fp8, h, p.fc.weight(), p.fc.bias(), fc);
    ops.swiglu_forward(fc, act);
  } else if (fc_fp8) {
    fc_fp8->forward(h, p.fc.weight(), p.fc.bias(), fc);
    ops.gelu_forward(fc, act);
  } else {
    ops.linear_gelu_forward(h, p.fc.weight(), p.fc.bias(), fc, act);  // one GEMM epilogue on CUDA
  }
}

void Mlp::forward(const Tensor& h_full, MlpActs& a, Tensor& out_partial) {
  const int64_t N = h_full.size(0);
  a.fc = ops_.empty({N, (swiglu_ ? 2 : 1) * F_local_}, ops_.compute_dtype(), MemCategory::Activations);
  a.act = ops_.empty({N, F_local_}, ops_.compute_dtype(), MemCategory::Activations);
  activate(ops_, swiglu_, p_, h_full, a.fc, a.act, fc_fp8_);
  linear_forward(ops_, proj_fp8_, a.act, p_.proj.weight(), par_.coords.tp == 0 ? p_.proj.bias() : Tensor{},
                 out_partial);
}

Tensor Mlp::backward_input(const Tensor& dout_full, const MlpActs& a, Tensor& dh_full, MemCategory dfc_category) {
  const int64_t N = dout_full.size(0);
  // With GELU the activation's gradient is formed in place: da becomes dfc.
  Tensor da = ops_.empty({N, F_local_}, ops_.compute_dtype(), swiglu_ ? MemCategory::Workspace : dfc_category);
  Tensor dfc = da;
  if (swiglu_) {
    linear_backward_input(ops_, proj_fp8_, dout_full, p_.proj.weight(), da);
    dfc = ops_.empty({N, 2 * F_local_}, ops_.compute_dtype(), dfc_category);
    ops_.swiglu_backward(a.fc, da, dfc);
    da = Tensor{};
  } else if (proj_fp8_) {
    linear_backward_input(ops_, proj_fp8_, dout_full, p_.proj.weight(), da);
    ops_.gelu_backward(a.fc, da, da);
  } else {
    ops_.linear_backward_input_gelu(dout_full, p_.proj.weight(), a.fc, da);  // one GEMM epilogue on CUDA
  }
  linear_backward_input(ops_, fc_fp8_, dfc, p_.fc.weight(), dh_full);
  return dfc;
}

void Mlp::backward_weight(const Tensor& dout_full, const Tensor& act, const Tensor& dfc, const Tensor& h_full) {
  Tensor proj_wgrad = p_.proj.weight_grad(), proj_bgrad = p_.proj.bias_grad();
  linear_backward_weight(ops_, proj_fp8_, dout_full, act, proj_wgrad, proj_bgrad);
  Tensor fc_wgrad = p_.fc.weight_grad(), fc_bgrad = p_.fc.bias_grad();
  linear_backward_weight(ops_, fc_fp8_, dfc, h_full, fc_wgrad, fc_bgrad);
}

}  // namespace tripod
