// Analytic activation memory of the tensors tripod keeps (Korthikanti et al. 2022's accounting,
// applied to this code's tensors rather than Megatron's), per micro-batch and model chunk.
// Tests hold the measured peaks to these figures, so a layer that changes what it keeps must
// change this file too.
#pragma once

#include <cstdint>

#include "model/config.h"
#include "model/gpt.h"
#include "parallel/pipeline/plan.h"

namespace tripod {

// What shapes and storage decide the bytes.
struct ActivationShape {
  int64_t B = 1, T = 1;   // micro-batch
  int tp = 1;
  bool sequence_parallel = false;
  int64_t act_bytes = 4;  // bytes per element in the compute dtype
  bool keeps_probs = true;  // the backend keeps attention probabilities when not recomputing
  // Expert parallelism (parallel.ep, parallel.moe_dispatcher): a rank's expert rows are counted at
  // the most its experts can receive (MoeConfig::routed_rows), the dispatcher's plan as it keeps it.
  int ep = 1;
  MoeDispatcher dispatcher = MoeDispatcher::AllToAll;
};

// Bytes one micro-batch of one chunk occupies (MemCategory::Activations).
struct ChunkActivationBytes {
  int64_t input = 0;   // the chunk's input (first block's x): embedding output or received activation
  int64_t held = 0;    // kept from the end of the forward until the backward, input excluded
  int64_t output = 0;  // the output sent to the next stage (non-last chunks), until the send completes
  int64_t tokens = 0;  // input tokens (first chunk) and targets (last chunk) of the micro-batch
  // The most this chunk's own tensors (input, held, output) reach inside its forward and inside
  // its backward; larger than input + held + output only where layers recompute.
  int64_t forward_peak = 0, backward_peak = 0;
  // A backward split into I and W (GptModel::backward_input / backward_weight). weight_pending:
  // held from the end of the chunk's I until its W (ChunkPending), the chunk's input included
  // (the first norm keeps it for its weight gradient) and the tokens excluded (the first chunk's
  // W reads the micro-batch's tokens, so they live until that W). input_backward_peak: the most
  // the chunk's own tensors reach inside its I, starting from input + held. W only frees
  // (what it gathers is workspace): its peak is weight_pending.
  int64_t weight_pending = 0, input_backward_peak = 0;
};

// Bytes of transformer layer `layer`'s saved tensors under `mode` (input x excluded; under full
// recomputation what the feed-forward half keeps to replay: an MoE router's decision).
int64_t layer_saved_bytes(const ModelConfig& cfg, const ActivationShape& s, RecomputeMode mode, int layer = 0);
// Bytes of transformer layer `layer`'s pending weight-gradient work (BlockPending), its input x included.
int64_t layer_pending_bytes(const ModelConfig& cfg, const ActivationShape& s, int layer = 0);

// The feed-forward half of layer `layer` (model/ffn.h): the dense MLP's tensors or an MoE layer's,
// whose routed rows are counted at their most (every (token, choice) pair, or the capacity's
// bound: MoeConfig::routed_rows), what the layers allocate at ep = 1; under expert parallelism the
// layers allocate the rows that arrive, and this is their bound.
struct FfnBytes {
  int64_t saved = 0;      // kept from the forward to the backward
  int64_t replay = 0;     // of which kept under full recomputation (the router's decision)
  int64_t fc = 0;         // of which freed by the split backward's I (fc, the router's logits, ...)
  int64_t grads = 0;      // allocated by I for W (the fc and router output gradients)
  int64_t input_peak = 0; // the most I adds above what it started with, before its frees end
  int64_t pending = 0;    // held from I to W
};
FfnBytes ffn_bytes(const ModelConfig& cfg, const ActivationShape& s, int layer);
// The per-micro-batch bytes of a chunk.
ChunkActivationBytes chunk_activation_bytes(const ModelConfig& cfg, const ChunkLayout& chunk,
                                            const RecomputeConfig& rc, const ActivationShape& s);

// The peak of MemCategory::Activations on pipeline rank `pp_rank` during one step, walking the
// executor's plan op by op: received activations are held from their receive's posting, a chunk's
// tensors from its forward to its backward (B, or I, which leaves weight_pending until its W), a
// sent output until its send completes, and a micro-batch's tokens (`token_bytes`, this rank's
// share) from its first forward here to its last B or W here.
int64_t activation_peak(const Schedule& schedule, const PipePlan& plan, int pp_rank,
                        const std::vector<ChunkActivationBytes>& chunks, int64_t token_bytes);

}  // namespace tripod
