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

int64_t layer_saved_bytes(const ModelConfig& cfg, const ActivationShape& s, RecomputeMode mode) {
  const int64_t N = s.B * s.T, Ns = local_tokens(s), C = cfg.d_model, D = cfg.head_dim();
  const int64_t Hl = cfg.n_heads / s.tp, KVl = cfg.kv_heads() / s.tp, Fl = cfg.ffn() / s.tp;
  const int64_t b = s.act_bytes;
  if (mode == RecomputeMode::Full) return 0;  // only the input, counted by the caller
  int64_t bytes = 0;
  bytes += 2 * Ns * C * b;                     // h1, h2: norm outputs (this rank's token slice under SP)
  bytes += 2 * Ns * Norm::stat_bytes(cfg);     // both norms' statistics, f32
  bytes += N * (Hl + 2 * KVl) * D * b;         // q, k, v of this rank's heads (q and k rotated)
  bytes += N * Hl * D * b;                     // attention output (input of the output projection)
  bytes += s.B * Hl * s.T * 4;                 // softmax log-sum-exp, f32
  if (mode == RecomputeMode::None && s.keeps_probs) bytes += s.B * Hl * s.T * s.T * b;  // softmax
  bytes += Ns * C * b;                         // x1, the residual after attention
  bytes += (cfg.swiglu() ? 3 : 2) * N * Fl * b;  // fc before and after the GELU, or [gate | up] and silu(gate) * up
  return bytes;
}

int64_t layer_pending_bytes(const ModelConfig& cfg, const ActivationShape& s) {
  const int64_t N = s.B * s.T, Ns = local_tokens(s), C = cfg.d_model, D = cfg.head_dim();
  const int64_t Hl = cfg.n_heads / s.tp, KVl = cfg.kv_heads() / s.tp, Fl = cfg.ffn() / s.tp;
  const int64_t b = s.act_bytes;
  int64_t bytes = 0;
  bytes += 2 * (2 * Ns * C * b + Ns * Norm::stat_bytes(cfg));  // norms: input (x, x1), output gradient, statistics
  bytes += 2 * Ns * C * b;                                    // QKV, fc: input h1, h2 (token slice under SP)
  bytes += N * (Hl + 2 * KVl) * D * b;                        // QKV: output gradient
  bytes += N * (cfg.swiglu() ? 2 : 1) * Fl * b;               // fc ([gate; up]): output gradient
  bytes += N * Hl * D * b + N * Fl * b;                       // output projections: input (att, act)
  bytes += 2 * Ns * C * b;                                    // output projections: output gradient (token slice)
  return bytes;
}

ChunkActivationBytes chunk_activation_bytes(const ModelConfig& cfg, const ChunkLayout& chunk,
                                            const RecomputeConfig& rc, const ActivationShape& s) {
  const int64_t N = s.B * s.T, Ns = local_tokens(s), C = cfg.d_model, b = s.act_bytes;
  const int64_t x = Ns * C * b;
  // What a fully recomputed layer holds while it runs: everything but the attention probabilities
  // (a recomputing layer never keeps those).
  const int64_t working_set = layer_saved_bytes(cfg, s, RecomputeMode::Selective);
  ChunkActivationBytes out;
  out.input = x;
  out.tokens = (chunk.has_embedding ? N * 4 : 0) + (chunk.has_head ? N * 4 : 0);
  const int n = chunk.layer_end - chunk.layer_begin;
  std::vector<int64_t> saved(n);
  std::vector<bool> recomputed(n), keeps_probs(n);
  for (int i = 0; i < n; ++i) {
    RecomputeMode mode = rc.mode != RecomputeMode::None && rc.applies_to(i) ? rc.mode : RecomputeMode::None;
    saved[i] = layer_saved_bytes(cfg, s, mode);
    recomputed[i] = mode == RecomputeMode::Full;
    keeps_probs[i] = mode == RecomputeMode::None && s.keeps_probs;
  }
  const int64_t head =
      chunk.has_head ? x + Ns * Norm::stat_bytes(cfg) + N * (cfg.padded_vocab(s.tp) / s.tp) * b : 0;

  // Forward: each layer adds what it keeps and its output (the next input); a recomputed layer
  // first holds everything, then drops all but its input.
  int64_t live = x, peak = x;
  for (int i = 0; i < n; ++i) {
    if (recomputed[i]) peak = std::max(peak, live + working_set + x);
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
    if (recomputed[i]) peak = std::max(peak, live + working_set + x);
    live -= saved[i] + x;
  }
  out.backward_peak = peak;

  // The split backward's I (Block::backward_input, LmHead::backward_input), tensor by tensor:
  // what W needs stays (moved from the activations or newly kept), the rest is freed.
  const bool sp = s.sequence_parallel && s.tp > 1;
  const int64_t D = cfg.head_dim(), Hl = cfg.n_heads / s.tp, KVl = cfg.kv_heads() / s.tp, Fl = cfg.ffn() / s.tp;
  const int64_t dqkv = N * (Hl + 2 * KVl) * D * b, dfc = N * (cfg.swiglu() ? 2 : 1) * Fl * b;
  const int64_t fc = dfc, qkv = dqkv, lse = s.B * Hl * s.T * 4;
  live = x + out.held;
  peak = live;
  if (chunk.has_head) live += x;  // ln_f's output gradient; the head's activations all stay
  peak = std::max(peak, live);
  for (int i = n - 1; i >= 0; --i) {
    if (recomputed[i]) {
      peak = std::max(peak, live + working_set + x);
      live += working_set;
    }
    const int64_t probs_bytes = keeps_probs[i] ? s.B * Hl * s.T * s.T * b : 0;
    // MLP half: a copy of the residual gradient, the norm's output gradient (whole without SP, a
    // workspace before its reduce-scatter with), the fc output gradient; then fc is freed.
    live += x + (sp ? 0 : x) + dfc;
    peak = std::max(peak, live);
    live -= fc;
    if (sp) live += x, peak = std::max(peak, live);
    // Attention half: the same, with QKV's output gradient; then qkv, lse (and probs) are freed.
    live += x + (sp ? 0 : x) + dqkv;
    peak = std::max(peak, live);
    live -= qkv + lse + probs_bytes;
    if (sp) live += x, peak = std::max(peak, live);
  }
  if (chunk.has_embedding) live += x, peak = std::max(peak, live);  // a copy of the embedding's output gradient
  out.input_backward_peak = peak;
  out.weight_pending = live;
  // What is left is exactly the pending work: the layers', the head's (ln_f's input and output
  // gradient besides its activations) and the embedding's.
  const int64_t pending = n * layer_pending_bytes(cfg, s) + (chunk.has_head ? head + 2 * x : 0) +
                          (chunk.has_embedding ? x : 0);
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
