// Vocabulary-parallel embedding and the fused vocabulary-parallel classifier.
#include "model/embedding.h"

#include <algorithm>

#include "parallel/tensor_parallel/mappings.h"

namespace tripod {

VocabShard VocabShard::of(const ModelConfig& cfg, int tp, int tp_rank) {
  VocabShard s;
  s.rows = cfg.padded_vocab(tp) / tp;
  s.start = tp_rank * s.rows;
  s.valid = std::clamp<int64_t>(cfg.vocab_size - s.start, 0, s.rows);
  return s;
}

Param& register_wte(ParamRegistry& reg, const ModelConfig& cfg, const ParallelContext& par, bool tied_copy,
                    int chunk) {
  VocabShard s = VocabShard::of(cfg, par.grid.tp(), par.coords.tp);
  return reg.add({.name = "wte", .global_shape = {cfg.padded_vocab(par.grid.tp()), cfg.d_model}, .shard_dim = 0,
                  .shard_offset = s.start, .shard_size = s.rows, .decay = true, .tied_copy = tied_copy,
                  .vocab_rows = cfg.vocab_size, .init = Init::Normal, .stddev = 0.02f, .chunk = chunk});
}

Param& register_lm_head(ParamRegistry& reg, const ModelConfig& cfg, const ParallelContext& par, int chunk) {
  VocabShard s = VocabShard::of(cfg, par.grid.tp(), par.coords.tp);
  return reg.add({.name = "lm_head.weight", .global_shape = {cfg.padded_vocab(par.grid.tp()), cfg.d_model},
                  .shard_dim = 0, .shard_offset = s.start, .shard_size = s.rows, .decay = true,
                  .vocab_rows = cfg.vocab_size, .init = Init::Normal, .stddev = 0.02f, .chunk = chunk});
}

Embedding::Embedding(Ops& ops, const ParallelContext& par, const ModelConfig& cfg, ParamRegistry& reg, Param& wte,
                     int chunk)
    : ops_(ops), par_(par), shard_(VocabShard::of(cfg, par.grid.tp(), par.coords.tp)), wte_(&wte) {
  if (!cfg.rope())
    wpe_ = &reg.add({.name = "wpe", .global_shape = {cfg.positions(), cfg.d_model}, .decay = true,
                     .init = Init::Normal, .stddev = 0.02f, .chunk = chunk});
}

Tensor Embedding::forward(const Tensor& tokens, const MicroShape& ms) {
  const int64_t N = ms.N(), C = wte_->value.size(1);
  const bool sp = par_.sequence_parallel && par_.grid.tp() > 1;
  // Without SP the summed table lookup is the first block's input itself.
  Tensor e = ops_.empty({N, C}, ops_.compute_dtype(), sp ? MemCategory::Workspace : MemCategory::Activations);
  // Positions are replicated: TP rank 0 adds them before the partial lookups are summed. Each slot
  // (context parallelism: a chunk of every sequence) reads the positions of its chunk.
  const bool positions = par_.coords.tp == 0 && wpe_;
  if (ms.docs && ms.docs->reset_positions) {  // every token at its position in its document
    if (positions)
      ops_.embedding_forward_positions(tokens, wte_->value, shard_.start, wpe_->value, ms.docs->positions, e);
    else
      ops_.embedding_forward(tokens, wte_->value, shard_.start, Tensor{}, N, e);
    return exit_tp_forward(ops_, par_, e, MemCategory::Activations);
  }
  const int64_t rows = ms.B * ms.slot_tokens(), len = ms.slot_tokens();
  for (int s = 0; s < ms.slots(); ++s) {
    const int64_t p0 = ms.slot_position(s);
    Tensor es = e.slice(s * rows, (s + 1) * rows);
    ops_.embedding_forward(tokens.slice(s * rows, (s + 1) * rows), wte_->value, shard_.start,
                           positions ? wpe_->value.slice(p0, p0 + len) : Tensor{}, len, es);
  }
  return exit_tp_forward(ops_, par_, e, MemCategory::Activations);
}

void Embedding::backward(const Tensor& tokens, const Tensor& dx, const MicroShape& ms) {
  Tensor d_full = exit_tp_backward(ops_, par_, dx);
  // Every TP rank sees the whole gradient, so all of them update wpe identically.
  if (ms.docs && ms.docs->reset_positions) {
    Tensor no_wpe;
    ops_.embedding_backward_positions(tokens, d_full, shard_.start, wte_->grad, wpe_ ? wpe_->grad : no_wpe,
                                      ms.docs->positions);
    return;
  }
  const int64_t rows = ms.B * ms.slot_tokens(), len = ms.slot_tokens();
  for (int s = 0; s < ms.slots(); ++s) {
    const int64_t p0 = ms.slot_position(s);
    Tensor dwpe = wpe_ ? wpe_->grad.slice(p0, p0 + len) : Tensor{};
    ops_.embedding_backward(tokens.slice(s * rows, (s + 1) * rows), d_full.slice(s * rows, (s + 1) * rows),
                            shard_.start, wte_->grad, dwpe, len);
  }
}

LmHead::LmHead(Ops& ops, const ParallelContext& par, const ModelConfig& cfg, ParamRegistry& reg, Param& table,
               int chunk)
    : ops_(ops),
      par_(par),
      shard_(VocabShard::of(cfg, par.grid.tp(), par.coords.tp)),
      ln_f_(Norm::make(reg, "ln_f", cfg, chunk)),
      table_(&table) {}

void LmHead::forward(const Tensor& x, const Tensor& targets, float grad_scale, HeadActs& a, Tensor& losses) {
  const int64_t Ns = x.size(0), C = x.size(1), N = targets.numel();
  const int tp = par_.grid.tp();
  a.x = x;
  a.h = ops_.empty({Ns, C}, ops_.compute_dtype(), MemCategory::Activations);
  ln_f_.forward(ops_, x, a.h, a.ln);
  Tensor h_full = enter_tp_forward(ops_, par_, a.h, MemCategory::Workspace);
  a.dlogits = ops_.empty({N, shard_.rows}, ops_.compute_dtype(), MemCategory::Activations);
  ops_.linear_forward(h_full, table_->value, Tensor{}, a.dlogits);
  // Each shard's (max, sum-exp, target logit) per token; the shards' stats are combined so the
  // full logits never exist on one rank.
  Tensor stats = ops_.empty({N, 3}, DType::F32, MemCategory::Workspace);
  ops_.xent_stats(a.dlogits, targets, shard_.start, shard_.valid, stats);
  Tensor parts = stats.view({1, N, 3});
  if (tp > 1) {
    parts = ops_.empty({tp, N, 3}, DType::F32, MemCategory::Workspace);
    par_.tp->all_gather(stats, parts);
  }
  Tensor lse = ops_.empty({N}, DType::F32, MemCategory::Workspace);
  ops_.xent_combine(parts, lse, losses);
  ops_.xent_backward(a.dlogits, targets, shard_.start, shard_.valid, lse, grad_scale);
}

Tensor LmHead::backward(HeadActs& a) {
  const int64_t N = a.dlogits.size(0), C = a.x.size(1);
  Tensor h_full = enter_tp_forward(ops_, par_, a.h, MemCategory::Workspace);
  Tensor dh_full = ops_.empty({N, C}, ops_.compute_dtype(), MemCategory::Workspace);
  Tensor no_bias;
  ops_.linear_backward(a.dlogits, h_full, table_->value, dh_full, table_->grad, no_bias);
  a.dlogits = h_full = Tensor{};
  Tensor dh = enter_tp_backward(ops_, par_, dh_full);
  Tensor dx = ops_.empty(a.x.shape(), ops_.compute_dtype(), MemCategory::Workspace);
  ops_.fill(dx, 0.f);
  ln_f_.backward(ops_, dh, a.x, a.ln, dx);
  a = HeadActs{};
  return dx;
}

Tensor LmHead::backward_input(HeadActs& a, HeadPending& p) {
  const int64_t N = a.dlogits.size(0), C = a.x.size(1);
  const bool sp = sequence_parallel(par_);
  // Without SP dh_full is ln_f's output gradient itself, kept for W.
  Tensor dh_full = ops_.empty({N, C}, ops_.compute_dtype(), sp ? MemCategory::Workspace : MemCategory::Activations);
  ops_.linear_backward_input(a.dlogits, table_->value, dh_full);
  Tensor dh = enter_tp_backward(ops_, par_, dh_full, MemCategory::Activations);
  dh_full = Tensor{};
  Tensor dx = ops_.empty(a.x.shape(), ops_.compute_dtype(), MemCategory::Workspace);
  ops_.fill(dx, 0.f);
  ln_f_.backward_input(ops_, dh, a.x, a.ln, dx);
  p.ln_f = {.x = a.x, .dy = dh, .stats = a.ln};
  p.logits = {.x = a.h, .dy = a.dlogits};
  a = HeadActs{};
  return dx;
}

void LmHead::backward_weight(HeadPending& p) {
  Tensor h_full = enter_tp_forward(ops_, par_, p.logits.x, MemCategory::Workspace);
  Tensor no_bias;
  ops_.linear_backward_weight(p.logits.dy, h_full, table_->grad, no_bias);
  h_full = Tensor{};
  p.logits = LinearPending{};
  ln_f_.backward_weight(ops_, p.ln_f);
  p = HeadPending{};
}

}  // namespace tripod
