// Transformer block forward, backward and recomputation.
#include "model/block.h"

#include <fmt/format.h>

#include "parallel/tensor_parallel/mappings.h"

namespace tripod {

Block::Block(Ops& ops, const ParallelContext& par, const ModelConfig& cfg, ParamRegistry& reg, int layer, int chunk,
             RecomputeMode recompute)
    : ops_(ops),
      par_(par),
      recompute_(recompute),
      ln1_(Norm::make(reg, fmt::format("h.{}.ln_1", layer), cfg, chunk)),
      ln2_(Norm::make(reg, fmt::format("h.{}.ln_2", layer), cfg, chunk)),
      attn_(ops, par, cfg, reg, fmt::format("h.{}.attn", layer), chunk),
      ffn_(make_feed_forward(ops, par, cfg, reg, layer, chunk)) {
  // The four sub-layers registered their parameters in construction order; gather them.
  const std::string prefix = fmt::format("h.{}.", layer);
  for (Param& p : reg.params())  // (buffers are not among them: they have no gradient)
    if (p.spec.name.rfind(prefix, 0) == 0) params_.push_back(&p);
}

Tensor Block::run_forward(const Tensor& x, const MicroShape& ms, BlockActs& a, bool replay) {
  const int64_t Ns = x.size(0), C = x.size(1), N = ms.N();
  const DType dt = ops_.compute_dtype();
  a.x = x;
  // Attention half.
  a.h1 = ops_.empty({Ns, C}, dt, MemCategory::Activations);
  ln1_.forward(ops_, x, a.h1, a.ln1);
  Tensor h1_full = enter_tp_forward(ops_, par_, a.h1, MemCategory::Workspace);
  Tensor partial = ops_.empty({N, C}, dt, MemCategory::Workspace);
  attn_.forward(h1_full, ms, /*keep_probs=*/recompute_ == RecomputeMode::None && ops_.keeps_attention_probs(), a.attn,
                partial);
  h1_full = Tensor{};
  Tensor attn_out = exit_tp_forward(ops_, par_, partial, MemCategory::Workspace);
  a.x1 = ops_.empty({Ns, C}, dt, MemCategory::Activations);
  ops_.add(x, attn_out, a.x1);
  attn_out = Tensor{};
  // Feed-forward half.
  a.h2 = ops_.empty({Ns, C}, dt, MemCategory::Activations);
  ln2_.forward(ops_, a.x1, a.h2, a.ln2);
  Tensor h2_full = enter_tp_forward(ops_, par_, a.h2, MemCategory::Workspace);
  // `partial` is free again (the residual add consumed it) and takes the feed-forward's partial sums.
  ffn_->forward(h2_full, ms, replay, a.ffn, partial);
  h2_full = Tensor{};
  Tensor mlp_out = exit_tp_forward(ops_, par_, partial, MemCategory::Workspace);
  Tensor out = ops_.empty({Ns, C}, dt, MemCategory::Activations);
  ops_.add(a.x1, mlp_out, out);
  return out;
}

Tensor Block::forward(const Tensor& x, const MicroShape& ms, BlockActs& a) {
  Tensor out = run_forward(x, ms, a, /*replay=*/false);
  if (recompute_ == RecomputeMode::Full) {
    FfnActs kept = std::move(a.ffn);
    ffn_->keep_for_recompute(kept);
    a = BlockActs{};
    a.x = x;
    a.ffn = std::move(kept);
    a.recomputed = true;
  }
  return out;
}

Tensor Block::backward(Tensor dres, const MicroShape& ms, BlockActs& a) {
  if (a.recomputed) run_forward(a.x, ms, a, /*replay=*/true);  // the output is dropped; the activations are back
  const int64_t N = ms.N(), C = dres.size(1);
  const DType dt = ops_.compute_dtype();
  // Feed-forward half: dres is the gradient of x2 = x1 + ffn(...), so it flows to x1 unchanged,
  // plus the feed-forward's contribution through ln_2.
  {
    Tensor dout_full = exit_tp_backward(ops_, par_, dres);
    Tensor h2_full = enter_tp_forward(ops_, par_, a.h2, MemCategory::Workspace);
    Tensor dh2_full = ops_.empty({N, C}, dt, MemCategory::Workspace);
    ffn_->backward(dout_full, h2_full, ms, a.ffn, dh2_full);
    a.ffn = FfnActs{};
    Tensor dh2 = enter_tp_backward(ops_, par_, dh2_full);
    ln2_.backward(ops_, dh2, a.x1, a.ln2, dres);
  }
  a.h2 = a.x1 = Tensor{};
  // Attention half.
  {
    Tensor dout_full = exit_tp_backward(ops_, par_, dres);
    Tensor h1_full = enter_tp_forward(ops_, par_, a.h1, MemCategory::Workspace);
    Tensor dh1_full = ops_.empty({N, C}, dt, MemCategory::Workspace);
    attn_.backward(dout_full, h1_full, ms, a.attn, dh1_full);
    a.attn = AttentionActs{};
    Tensor dh1 = enter_tp_backward(ops_, par_, dh1_full);
    ln1_.backward(ops_, dh1, a.x, a.ln1, dres);
  }
  a = BlockActs{};
  return dres;
}

Tensor Block::backward_input(Tensor dres, const MicroShape& ms, BlockActs& a, BlockPending& p) {
  if (a.recomputed) run_forward(a.x, ms, a, /*replay=*/true);
  const int64_t N = ms.N(), C = dres.size(1);
  const DType dt = ops_.compute_dtype();
  auto keep_copy = [&](const Tensor& t) {
    Tensor c = ops_.empty(t.shape(), t.dtype(), MemCategory::Activations);
    ops_.copy(t, c);
    return c;
  };
  // The norm's input gradient before the reduce-scatter: kept itself without SP, a workspace with.
  const MemCategory dh_full_category =
      sequence_parallel(par_) ? MemCategory::Workspace : MemCategory::Activations;
  // Feed-forward half. dres is about to take the norm's gradient in place; W needs it as it is now.
  {
    p.ffn.dy = keep_copy(dres);
    Tensor dout_full = exit_tp_backward(ops_, par_, dres);
    Tensor dh2_full = ops_.empty({N, C}, dt, dh_full_category);
    ffn_->backward_input(dout_full, ms, a.ffn, dh2_full, p.ffn_work, MemCategory::Activations);
    a.ffn = FfnActs{};
    Tensor dh2 = enter_tp_backward(ops_, par_, dh2_full, MemCategory::Activations);
    ln2_.backward_input(ops_, dh2, a.x1, a.ln2, dres);
    p.ln2 = {.x = a.x1, .dy = dh2, .stats = a.ln2};
    p.ffn.x = a.h2;
  }
  a.h2 = a.x1 = Tensor{};
  a.ln2 = NormActs{};
  // Attention half.
  {
    p.attn_proj.dy = keep_copy(dres);
    Tensor dout_full = exit_tp_backward(ops_, par_, dres);
    Tensor dh1_full = ops_.empty({N, C}, dt, dh_full_category);
    p.qkv.dy = attn_.backward_input(dout_full, ms, a.attn, dh1_full, MemCategory::Activations);
    p.attn_proj.x = a.attn.att;
    a.attn = AttentionActs{};
    Tensor dh1 = enter_tp_backward(ops_, par_, dh1_full, MemCategory::Activations);
    ln1_.backward_input(ops_, dh1, a.x, a.ln1, dres);
    p.ln1 = {.x = a.x, .dy = dh1, .stats = a.ln1};
    p.qkv.x = a.h1;
  }
  a = BlockActs{};
  return dres;
}

void Block::backward_weight(BlockPending& p, const MicroShape& ms) {
  {
    Tensor dout_full = exit_tp_backward(ops_, par_, p.ffn.dy);
    Tensor h2_full = enter_tp_forward(ops_, par_, p.ffn.x, MemCategory::Workspace);
    ffn_->backward_weight(dout_full, h2_full, ms, p.ffn_work);
  }
  p.ffn = LinearPending{};
  p.ffn_work = FfnPending{};
  ln2_.backward_weight(ops_, p.ln2);
  p.ln2 = NormPending{};
  {
    Tensor dout_full = exit_tp_backward(ops_, par_, p.attn_proj.dy);
    Tensor h1_full = enter_tp_forward(ops_, par_, p.qkv.x, MemCategory::Workspace);
    attn_.backward_weight(dout_full, p.attn_proj.x, p.qkv.dy, h1_full);
  }
  p.attn_proj = p.qkv = LinearPending{};
  ln1_.backward_weight(ops_, p.ln1);
  p = BlockPending{};
}

}  // namespace tripod
