// Tensor-parallel causal self-attention.
#include "model/attention.h"

#include <cmath>

#include "parallel/context_parallel/attention.h"

namespace tripod {

namespace {
// GPT-2's fused (3, C, C) QKV when every query head has its own key/value head.
bool fused_qkv(const ModelConfig& cfg) { return cfg.kv_heads() == cfg.n_heads; }

// Rotates (or un-rotates) q and k of every slot by their positions in the sequence, or in their
// documents (data.reset_position_ids).
void rope_slots(Ops& ops, Tensor& qkv, const MicroShape& ms, int64_t heads, int64_t rot_heads, int64_t D, double theta,
                bool inverse) {
  if (ms.docs && ms.docs->reset_positions) {
    Tensor x = qkv.view({ms.N(), heads, D});
    ops.rope_positions(x, rot_heads, ms.docs->positions, theta, inverse);
    return;
  }
  const int64_t rows = ms.B * ms.slot_tokens();
  for (int s = 0; s < ms.slots(); ++s) {
    Tensor x = qkv.slice(s * rows, (s + 1) * rows).view({rows, heads, D});
    ops.rope(x, rot_heads, ms.slot_tokens(), ms.slot_position(s), theta, inverse);
  }
}
// Whether attention stays within documents (data.reset_attention_mask).
bool masked(const MicroShape& ms) { return ms.docs && ms.docs->mask; }
// The documents of a cp = 1 micro-batch as the attention op takes them.
DocRows doc_rows(const MicroShape& ms) {
  TRIPOD_CHECK(ms.docs->B == ms.B && ms.docs->T == ms.T && ms.docs->row_cu.size() >= 2,
               "documents of {} x {} for a micro-batch of {} x {}", ms.docs->B, ms.docs->T, ms.B, ms.T);
  return {.offsets = ms.docs->row_cu, .start = ms.docs->doc_start.view({ms.B, ms.T})};
}
}  // namespace

AttentionParams AttentionParams::find(ParamRegistry& reg, const ModelConfig& cfg, const std::string& prefix) {
  AttentionParams a;
  a.qkv.reg = a.proj.reg = &reg;
  auto need = [&](const std::string& name) {
    Param* p = reg.find(prefix + "." + name);
    TRIPOD_CHECK(p, "parameter {}.{} is not on this rank", prefix, name);
    return p;
  };
  for (const char* part : fused_qkv(cfg) ? std::vector<const char*>{"qkv"} : std::vector<const char*>{"q", "k", "v"}) {
    a.qkv.w.push_back(need(std::string(part) + ".weight"));
    if (cfg.bias) a.qkv.b.push_back(need(std::string(part) + ".bias"));
  }
  a.proj.w.push_back(need("proj.weight"));
  if (cfg.bias) a.proj.b.push_back(need("proj.bias"));
  if (cfg.qk_norm) {
    a.q_norm = need("q_norm.weight");
    a.k_norm = need("k_norm.weight");
  }
  return a;
}

Tensor AttentionParams::qk_norm_weight(bool grad) const {
  Param* const parts[2] = {q_norm, k_norm};
  ParamRegistry& reg = *qkv.reg;
  const Tensor& flat = grad ? reg.flat_grads() : reg.flat_values();
  return ParamRegistry::packed_view(flat, parts).view({2, q_norm->numel()});
}

Attention::Attention(Ops& ops, const ParallelContext& par, const ModelConfig& cfg, ParamRegistry& reg,
                     const std::string& prefix, int chunk)
    : ops_(ops),
      par_(par),
      cfg_(cfg),
      C_(cfg.d_model),
      H_local_(cfg.n_heads / par.grid.tp()),
      KV_local_(cfg.kv_heads() / par.grid.tp()),
      D_(cfg.head_dim()) {
  const int tp = par.grid.tp(), r = par.coords.tp;
  const int64_t C = C_, D = D_, Ql = H_local_ * D, KVl = KV_local_ * D;
  const float std = 0.02f, proj_std = 0.02f / std::sqrt(2.0f * cfg.n_layers);
  if (fused_qkv(cfg)) {
    // QKV as (3, C_out, C_in): sharding dim 1 gives each rank q, k and v of its own heads, and the
    // local (3, C/tp, C) is the (3C/tp, C) weight of the local GEMM.
    reg.add({.name = prefix + ".qkv.weight", .global_shape = {3, C, C}, .shard_dim = 1, .shard_offset = r * Ql,
             .shard_size = Ql, .decay = true, .init = Init::Normal, .stddev = std, .chunk = chunk});
    if (cfg.bias)
      reg.add({.name = prefix + ".qkv.bias", .global_shape = {3, C}, .shard_dim = 1, .shard_offset = r * Ql,
               .shard_size = Ql, .init = Init::Zeros, .chunk = chunk});
  } else {
    // q, k, v as separate (rows, C) tensors, each split by heads over TP and packed one after
    // another: the local [q; k; v] rows are the local GEMM's weight.
    const int64_t rows[3] = {Ql * tp, KVl * tp, KVl * tp}, local[3] = {Ql, KVl, KVl};
    const char* names[3] = {"q", "k", "v"};
    for (int i = 0; i < 3; ++i)
      reg.add({.name = prefix + "." + names[i] + ".weight", .global_shape = {rows[i], C}, .shard_dim = 0,
               .shard_offset = r * local[i], .shard_size = local[i], .decay = true, .init = Init::Normal,
               .stddev = std, .chunk = chunk, .packed = i > 0});
    if (cfg.bias)
      for (int i = 0; i < 3; ++i)
        reg.add({.name = prefix + "." + names[i] + ".bias", .global_shape = {rows[i]}, .shard_dim = 0,
                 .shard_offset = r * local[i], .shard_size = local[i], .init = Init::Zeros, .chunk = chunk,
                 .packed = i > 0});
  }
  if (cfg.qk_norm)  // per-head norms of q and k, packed into one (2, D) weight
    for (int i = 0; i < 2; ++i)
      reg.add({.name = prefix + (i == 0 ? ".q_norm.weight" : ".k_norm.weight"), .global_shape = {D},
               .init = Init::Ones, .chunk = chunk, .packed = i > 0, .tp_partial_grad = true});
  // Row-parallel: the input dimension is split.
  reg.add({.name = prefix + ".proj.weight", .global_shape = {C, Ql * tp}, .shard_dim = 1, .shard_offset = r * Ql,
           .shard_size = Ql, .decay = true, .init = Init::Normal, .stddev = proj_std, .chunk = chunk});
  if (cfg.bias) reg.add({.name = prefix + ".proj.bias", .global_shape = {C}, .init = Init::Zeros, .chunk = chunk});
  p_ = AttentionParams::find(reg, cfg, prefix);
}

void Attention::forward(const Tensor& h_full, const MicroShape& ms, bool keep_probs, AttentionActs& a,
                        Tensor& out_partial) {
  const int64_t N = ms.N(), heads = H_local_ + 2 * KV_local_;
  a.qkv = ops_.empty({N, heads * D_}, ops_.compute_dtype(), MemCategory::Activations);
  ops_.linear_forward(h_full, p_.qkv.weight(), p_.qkv.bias(), a.qkv);
  if (cfg_.qk_norm) {
    a.qk_in = ops_.empty({N, H_local_ + KV_local_, D_}, ops_.compute_dtype(), MemCategory::Activations);
    a.qk_rstd = ops_.empty({N, H_local_ + KV_local_}, DType::F32, MemCategory::Activations);
    Tensor rows = a.qkv.view({N, heads, D_});
    ops_.qk_norm_forward(rows, H_local_, KV_local_, p_.qk_norm_weight(), static_cast<float>(cfg_.norm_eps), a.qk_in,
                         a.qk_rstd);
  }
  if (cfg_.rope()) rope_slots(ops_, a.qkv, ms, heads, H_local_ + KV_local_, D_, cfg_.rope_theta, /*inverse=*/false);
  a.att = ops_.empty({N, H_local_ * D_}, ops_.compute_dtype(), MemCategory::Activations);
  if (ms.cp > 1) {
    a.lse = ops_.empty({2, ms.B, H_local_, ms.T / 2}, DType::F32, MemCategory::Activations);
    a.probs = Tensor{};
    // The blocks merge into an f32 result: att itself where that is the compute dtype.
    const bool direct = a.att.dtype() == DType::F32;
    Tensor o = direct ? a.att : ops_.empty({N, H_local_ * D_}, DType::F32, MemCategory::Workspace);
    cp_attention_forward(ops_, *par_.cp, par_.cp_comm, cp_shape(ms), a.qkv, o, a.lse, par_.trace, ms.docs.get());
    if (!direct) ops_.copy(o, a.att);
    ops_.linear_forward(a.att, p_.proj.weight(), par_.coords.tp == 0 ? p_.proj.bias() : Tensor{}, out_partial);
    return;
  }
  a.lse = ops_.empty({ms.B, H_local_, ms.T}, DType::F32, MemCategory::Activations);
  Tensor att4 = a.att.view({ms.B, ms.T, H_local_, D_});
  if (masked(ms)) {  // each document on its own; nothing of the probabilities is kept
    a.probs = Tensor{};
    ops_.attention_forward_docs(a.qkv.view({ms.B, ms.T, heads, D_}), doc_rows(ms), att4, a.lse);
  } else {
    a.probs = keep_probs ? ops_.empty({ms.B, H_local_, ms.T, ms.T}, ops_.compute_dtype(), MemCategory::Activations)
                         : Tensor{};
    ops_.attention_forward(a.qkv.view({ms.B, ms.T, heads, D_}), att4, a.lse, a.probs);
  }
  // The replicated bias joins the partial sums once, on TP rank 0.
  ops_.linear_forward(a.att, p_.proj.weight(), par_.coords.tp == 0 ? p_.proj.bias() : Tensor{}, out_partial);
}

CpAttentionShape Attention::cp_shape(const MicroShape& ms) const {
  TRIPOD_CHECK(par_.cp && par_.grid.cp() == ms.cp, "a micro-batch split over cp = {} on a grid with cp = {}", ms.cp,
               par_.grid.cp());
  return {.B = ms.B, .c = ms.T / 2, .H = H_local_, .Hkv = KV_local_, .D = D_};
}

void Attention::backward(const Tensor& dout_full, const Tensor& h_full, const MicroShape& ms,
                         const AttentionActs& a, Tensor& dh_full) {
  Tensor dqkv = backward_input(dout_full, ms, a, dh_full, MemCategory::Workspace);
  backward_weight(dout_full, a.att, dqkv, h_full);
}

Tensor Attention::backward_input(const Tensor& dout_full, const MicroShape& ms, const AttentionActs& a,
                                 Tensor& dh_full, MemCategory dqkv_category) {
  const int64_t N = ms.N(), heads = H_local_ + 2 * KV_local_;
  Tensor datt = ops_.empty({N, H_local_ * D_}, ops_.compute_dtype(), MemCategory::Workspace);
  ops_.linear_backward_input(dout_full, p_.proj.weight(), datt);
  Tensor dqkv = ops_.empty({N, heads * D_}, ops_.compute_dtype(), dqkv_category);
  Tensor dqkv4 = dqkv.view({ms.B, ms.T, heads, D_});
  if (ms.cp > 1)
    cp_attention_backward(ops_, *par_.cp, par_.cp_comm, cp_shape(ms), datt, a.qkv, a.att, a.lse, dqkv,
                          par_.trace, ms.docs.get());
  else if (masked(ms))
    ops_.attention_backward_docs(datt.view({ms.B, ms.T, H_local_, D_}), a.qkv.view({ms.B, ms.T, heads, D_}),
                                 a.att.view({ms.B, ms.T, H_local_, D_}), a.lse, doc_rows(ms), dqkv4);
  else
    ops_.attention_backward(datt.view({ms.B, ms.T, H_local_, D_}), a.qkv.view({ms.B, ms.T, heads, D_}),
                            a.att.view({ms.B, ms.T, H_local_, D_}), a.lse, a.probs, dqkv4);
  datt = Tensor{};
  // Back through the rotation of q and k.
  if (cfg_.rope()) rope_slots(ops_, dqkv, ms, heads, H_local_ + KV_local_, D_, cfg_.rope_theta, /*inverse=*/true);
  // Back through the q and k norms. Their weights' gradients (two D-vectors) are computed here,
  // also in a split backward's I: keeping their output gradient for W would cost N (H + Hkv) D.
  if (cfg_.qk_norm) {
    Tensor rows = dqkv.view({N, heads, D_}), dw = p_.qk_norm_weight(/*grad=*/true);
    ops_.qk_norm_backward(rows, H_local_, a.qk_in, p_.qk_norm_weight(), a.qk_rstd, dw);
  }
  ops_.linear_backward_input(dqkv, p_.qkv.weight(), dh_full);
  return dqkv;
}

void Attention::backward_weight(const Tensor& dout_full, const Tensor& att, const Tensor& dqkv,
                                const Tensor& h_full) {
  // Every TP rank sees the whole output gradient, so the replicated bias gets the same gradient everywhere.
  Tensor proj_wgrad = p_.proj.weight_grad(), proj_bgrad = p_.proj.bias_grad();
  ops_.linear_backward_weight(dout_full, att, proj_wgrad, proj_bgrad);
  Tensor qkv_wgrad = p_.qkv.weight_grad(), qkv_bgrad = p_.qkv.bias_grad();
  ops_.linear_backward_weight(dqkv, h_full, qkv_wgrad, qkv_bgrad);
  // With learned positions the key bias adds q.b_k to every score of a row, which the softmax
  // ignores: its gradient is exactly zero, and what the sum above holds is rounding noise. Adam
  // would divide that noise by its eps and walk the key bias randomly (differently on every
  // grid), so it is kept at zero. (Rotated, the key bias's term depends on the key's position, so
  // with rope its gradient is real.)
  if (qkv_bgrad.defined() && !cfg_.rope()) {
    Tensor key_bias_grad = qkv_bgrad.flat(H_local_ * D_, (H_local_ + KV_local_) * D_);
    ops_.fill(key_bias_grad, 0.f);
  }
}

}  // namespace tripod
