// Activation bytes per layer and chunk, mirroring what Block, Embedding and LmHead keep.
#include "model/memory_estimate.h"

#include <algorithm>
#include <vector>

namespace tripod {

namespace {
int64_t local_tokens(const ActivationShape& s) {
  int64_t N = s.B * s.T;
  return s.sequence_parallel && s.tp > 1 ? N / s.tp : N;
}
}  // namespace

FfnBytes ffn_bytes(const ModelConfig& cfg, const ActivationShape& s, int layer) {
  const int64_t N = s.B * s.T, b = s.act_bytes, sw = cfg.swiglu() ? 2 : 1;
  FfnBytes f;
  if (!cfg.moe.sparse(layer)) {
    // fc before and after the GELU, or [gate | up] and silu(gate) * up; I turns fc into dfc.
    const int64_t Fl = cfg.ffn() / s.tp;
    f.fc = N * sw * Fl * b;
    f.saved = f.fc + N * Fl * b;
    f.grads = f.fc;
    f.input_peak = f.grads;
    f.pending = f.grads + N * Fl * b;  // dfc and act
    return f;
  }
  const MoeConfig& m = cfg.moe;
  const int64_t E = m.experts, k = m.top_k, rows = m.routed_rows(N, s.ep), Fl = cfg.expert_ffn() / s.tp;
  const int64_t Fs = int64_t{m.shared_experts} * cfg.expert_ffn() / s.tp;
  // The router's decision: logits (f32), experts and weights of every pair.
  const int64_t logits = N * E * 4, idx = N * k * 4, weights = N * k * 4;
  // The dispatcher's plan (parallel/expert_parallel/token_dispatcher.h, i32 tensors of at least
  // one element): what a split backward's W still reads (kept) and what its I frees (dropped).
  // Token side: each pair's row, each row's pair; all-to-all: each expert row's arrival position
  // and its inverse; all-gather: the EP group's pairs' weights and rows, each expert row's pair.
  const int64_t row_of = N * k * 4, slot_of = std::max<int64_t>(m.routed_rows(N), 1) * 4;
  const int64_t expert_side = std::max<int64_t>(rows, 1) * 4;
  int64_t plan_kept = slot_of, plan_dropped = row_of;
  if (s.ep > 1 && s.dispatcher == MoeDispatcher::AllToAll) {
    plan_kept += expert_side;     // src_of
    plan_dropped += expert_side;  // dst_of
  } else if (s.ep > 1) {
    plan_kept = expert_side + s.ep * N * k * 4;  // pair_of, weights_all
    plan_dropped = s.ep * N * k * 4;             // row_of_all
  }
  const int64_t expert_fc = rows * sw * Fl * b, expert_act = rows * Fl * b;
  const int64_t shared_fc = N * sw * Fs * b, shared_act = N * Fs * b;
  f.replay = logits + idx + weights + plan_kept + plan_dropped;
  f.saved = f.replay + expert_fc + expert_act + shared_fc + shared_act;
  // I allocates the experts' dfc (then frees their fc), the router's output gradient and the
  // shared experts' dfc; at its end it frees the shared fc and the router's logits, experts and
  // what of the plan only the forward's combine reads.
  const int64_t dlogits = N * E * b;
  f.grads = expert_fc + dlogits + shared_fc;
  f.fc = expert_fc + shared_fc + logits + idx + plan_dropped;
  f.input_peak = std::max(expert_fc, dlogits + shared_fc);
  f.pending = f.grads + expert_act + shared_act + weights + plan_kept;
  return f;
}

int64_t layer_saved_bytes(const ModelConfig& cfg, const ActivationShape& s, RecomputeMode mode, int layer) {
  const int64_t N = s.B * s.T, Ns = local_tokens(s), C = cfg.d_model, D = cfg.head_dim();
  const int64_t Hl = cfg.n_heads / s.tp, KVl = cfg.kv_heads() / s.tp;
  const int64_t b = s.act_bytes;
  const FfnBytes ffn = ffn_bytes(cfg, s, layer);
  if (mode == RecomputeMode::Full) return ffn.replay;  // and the input, counted by the caller
  int64_t bytes = 0;
  bytes += 2 * Ns * C * b;                     // h1, h2: norm outputs (this rank's token slice under SP)
  bytes += 2 * Ns * Norm::stat_bytes(cfg);     // both norms' statistics, f32
  bytes += N * (Hl + 2 * KVl) * D * b;         // q, k, v of this rank's heads (q and k rotated)
  if (cfg.qk_norm) bytes += N * (Hl + KVl) * (D * b + 4);  // q and k before their norms, rstd
  bytes += N * Hl * D * b;                     // attention output (input of the output projection)
  bytes += s.B * Hl * s.T * 4;                 // softmax log-sum-exp, f32
  if (mode == RecomputeMode::None && s.keeps_probs) bytes += s.B * Hl * s.T * s.T * b;  // softmax
  bytes += Ns * C * b;                         // x1, the residual after attention
  bytes += ffn.saved;                          // the feed-forward half's
  return bytes;
}

int64_t layer_pending_bytes(const ModelConfig& cfg, const ActivationShape& s, int layer) {
  const int64_t N = s.B * s.T, Ns = local_tokens(s), C = cfg.d_model, D = cfg.head_dim();
  const int64_t Hl = cfg.n_heads / s.tp, KVl = cfg.kv_heads() / s.tp;
  const int64_t b = s.act_bytes;
  int64_t bytes = 0;
  bytes += 2 * (2 * Ns * C * b + Ns * Norm::stat_bytes(cfg));  // norms: input (x, x1), output gradient, statistics
  bytes += 2 * Ns * C * b;                                    // QKV, feed-forward: input h1, h2 (token slice under SP)
  bytes += N * (Hl + 2 * KVl) * D * b;                        // QKV: output gradient
  bytes += N * Hl * D * b;                                    // output projection: input (att)
  bytes += 2 * Ns * C * b;                                    // output projection, feed-forward: output gradient (token slice)
  bytes += ffn_bytes(cfg, s, layer).pending;                  // the feed-forward half's own
  return bytes;
}

ChunkActivationBytes chunk_activation_bytes(const ModelConfig& cfg, const ChunkLayout& chunk,
                                            const RecomputeConfig& rc, const ActivationShape& s) {
  const int64_t N = s.B * s.T, Ns = local_tokens(s), C = cfg.d_model, b = s.act_bytes;
  const int64_t x = Ns * C * b;
  ChunkActivationBytes out;
  out.input = x;
  out.tokens = (chunk.has_embedding ? N * 4 : 0) + (chunk.has_head ? N * 4 : 0);
  const int n = chunk.layer_end - chunk.layer_begin;
  // Per layer: what it keeps; and what a fully recomputed layer holds while it runs: everything but
  // the attention probabilities (a recomputing layer never keeps those), of which it kept `saved`.
  std::vector<int64_t> saved(n), working_set(n);
  std::vector<bool> recomputed(n), keeps_probs(n);
  std::vector<FfnBytes> ffn(n);
  for (int i = 0; i < n; ++i) {
    const int layer = chunk.layer_begin + i;
    RecomputeMode mode = rc.mode != RecomputeMode::None && rc.applies_to(i) ? rc.mode : RecomputeMode::None;
    saved[i] = layer_saved_bytes(cfg, s, mode, layer);
    working_set[i] = layer_saved_bytes(cfg, s, RecomputeMode::Selective, layer);
    recomputed[i] = mode == RecomputeMode::Full;
    keeps_probs[i] = mode == RecomputeMode::None && s.keeps_probs;
    ffn[i] = ffn_bytes(cfg, s, layer);
  }
  const int64_t head =
      chunk.has_head ? x + Ns * Norm::stat_bytes(cfg) + N * (cfg.padded_vocab(s.tp) / s.tp) * b : 0;

  // Forward: each layer adds what it keeps and its output (the next input); a recomputed layer
  // first holds everything, then drops all but its input.
  int64_t live = x, peak = x;
  for (int i = 0; i < n; ++i) {
    if (recomputed[i]) peak = std::max(peak, live + working_set[i] + x);
    live += saved[i] + x;
  }
  live += head;
  peak = std::max(peak, live);
  out.forward_peak = peak;
  // The last layer's output is either the head's input (held) or sent away (output).
  out.held = live - x - (chunk.has_head ? 0 : x);
  out.output = chunk.has_head ? 0 : x;
  // Backward (the output is gone by then on a non-last chunk): the head frees its tensors and its
  // input (the last layer's output), then
  // each layer from the last reruns its forward if recomputed (holding all it keeps plus the
  // discarded output) and frees what it kept and its input.
  live = x + out.held;
  peak = live;
  live -= head + (chunk.has_head ? x : 0);  // ln_f's output, statistics, logits' gradient; its input
  for (int i = n - 1; i >= 0; --i) {
    if (recomputed[i]) peak = std::max(peak, live - saved[i] + working_set[i] + x);
    live -= saved[i] + x;
  }
  out.backward_peak = peak;

  // The split backward's I (Block::backward_input, LmHead::backward_input), tensor by tensor:
  // what W needs stays (moved from the activations or newly kept), the rest is freed.
  const bool sp = s.sequence_parallel && s.tp > 1;
  const int64_t D = cfg.head_dim(), Hl = cfg.n_heads / s.tp, KVl = cfg.kv_heads() / s.tp;
  const int64_t dqkv = N * (Hl + 2 * KVl) * D * b, qkv = dqkv, lse = s.B * Hl * s.T * 4;
  const int64_t qk_norm = cfg.qk_norm ? N * (Hl + KVl) * (D * b + 4) : 0;
  live = x + out.held;
  peak = live;
  if (chunk.has_head) live += x;  // ln_f's output gradient; the head's activations all stay
  peak = std::max(peak, live);
  for (int i = n - 1; i >= 0; --i) {
    if (recomputed[i]) {
      peak = std::max(peak, live - saved[i] + working_set[i] + x);
      live += working_set[i] - saved[i];
    }
    const int64_t probs_bytes = keeps_probs[i] ? s.B * Hl * s.T * s.T * b : 0;
    // Feed-forward half: a copy of the residual gradient, the norm's output gradient (whole
    // without SP, a workspace before its reduce-scatter with), the fc (and router) output
    // gradients; then fc (and the router's logits, experts and rows) are freed.
    live += x + (sp ? 0 : x);
    peak = std::max(peak, live + ffn[i].input_peak);
    live += ffn[i].grads - ffn[i].fc;
    if (sp) live += x, peak = std::max(peak, live);
    // Attention half: the same, with QKV's output gradient; then qkv, lse (and probs, q and k
    // before their norms) are freed.
    live += x + (sp ? 0 : x) + dqkv;
    peak = std::max(peak, live);
    live -= qkv + lse + probs_bytes + qk_norm;
    if (sp) live += x, peak = std::max(peak, live);
  }
  if (chunk.has_embedding) live += x, peak = std::max(peak, live);  // a copy of the embedding's output gradient
  out.input_backward_peak = peak;
  out.weight_pending = live;
  // What is left is exactly the pending work: the layers', the head's (ln_f's input and output
  // gradient besides its activations) and the embedding's.
  int64_t pending = (chunk.has_head ? head + 2 * x : 0) + (chunk.has_embedding ? x : 0);
  for (int i = 0; i < n; ++i) pending += layer_pending_bytes(cfg, s, chunk.layer_begin + i);
  TRIPOD_CHECK(live == pending, "split-backward accounting of chunk {}: {} bytes left after I, {} pending",
               chunk.virtual_stage, live, pending);
  return out;
}

int64_t activation_peak(const Schedule& schedule, const PipePlan& plan, int pp_rank,
                        const std::vector<ChunkActivationBytes>& chunks, int64_t token_bytes) {
  const auto& list = schedule.ranks[pp_rank];
  const int M = schedule.microbatches;
  std::vector<int> first_f(M, -1), last_b(M, -1);
  for (int i = 0; i < static_cast<int>(list.size()); ++i) {
    if (list[i].forward() && first_f[list[i].mb] < 0) first_f[list[i].mb] = i;
    if (list[i].weight_grad()) last_b[list[i].mb] = i;
  }
  int64_t live = 0, peak = 0;
  for (const PlanOp& op : plan.ranks[pp_rank]) {
    if (op.kind == PlanOpKind::PostRecv || op.kind == PlanOpKind::WaitSend) {
      const PipeMessage& m = plan.messages[op.index];
      if (m.grad) continue;  // gradients are workspace
      // A received activation is the receiving chunk's input; a sent one was its output.
      live += op.kind == PlanOpKind::PostRecv ? chunks[m.dst.chunk].input : -chunks[m.src.chunk].output;
      peak = std::max(peak, live);
      continue;
    }
    if (op.kind != PlanOpKind::Compute) continue;
    const Action& a = list[op.index];
    const ChunkActivationBytes& c = chunks[a.chunk];
    if (a.forward()) {
      if (op.index == first_f[a.mb]) live += token_bytes;
      // Past stage 0 the input is already here: received (counted at its posting) or handed over
      // by the previous stage's chunk on this rank (counted as that chunk's output).
      bool input_here = schedule.stage(pp_rank, a.chunk) > 0;
      int64_t base = live - (input_here ? c.input : 0);
      peak = std::max(peak, base + c.forward_peak);
      live = base + c.input + c.held + c.output;
    } else if (a.kind == ActionKind::Input) {
      // A split backward's I frees the chunk's activations but keeps what its W needs.
      const int64_t base = live - c.input - c.held;
      peak = std::max(peak, base + c.input_backward_peak);
      live = base + c.weight_pending;
    } else if (a.kind == ActionKind::Weight) {
      live -= c.weight_pending;
      if (op.index == last_b[a.mb]) live -= token_bytes;
    } else {  // B
      const int64_t base = live - c.input - c.held;
      peak = std::max(peak, base + c.backward_peak);
      live = base;
      if (op.index == last_b[a.mb]) live -= token_bytes;
    }
    peak = std::max(peak, live);
  }
  return peak;
}

}  // namespace tripod
