// The model (GPT-2 or a Llama-family decoder, as ModelConfig says) on one rank: its pipeline model chunks (virtual stages), each a run of blocks, the first
// chunk of the model with the embedding, the last with the head and loss.
//
// Layers are split into pp*vp virtual stages in order; the placement (parallel/pipeline/
// placement.h) says which rank and local chunk hold stage g. Loop: rank g % pp, chunk g / pp
// (Megatron's interleaving: rank r holds r, r+pp, r+2pp, ...). V (vp = 2): rank r holds r and
// 2pp-1-r, so rank 0 holds the embedding and the head (a tied table is then one parameter).
// Example: 8 layers, pp=2, vp=2: stages 0..3 hold layers {0,1} {2,3} {4,5} {6,7}; loop: rank 0
// holds stages 0 and 2 (layers 0,1 and 4,5), rank 1 holds stages 1 and 3; V: rank 0 holds
// stages 0 and 3, rank 1 stages 1 and 2.
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "model/block.h"
#include "model/embedding.h"
#include "model/moe.h"
#include "parallel/pipeline/placement.h"

namespace tripod {

struct ChunkLayout {
  int virtual_stage = 0;           // global index of this chunk among the pp*vp
  int layer_begin = 0, layer_end = 0;
  bool has_embedding = false, has_head = false;
};

// Layers per virtual stage: `explicit_counts` when given (pp*vp entries), else an even split.
// Throws InputError naming the numbers when the split is impossible.
std::vector<int> layers_per_stage(int n_layers, int pp, int vp, const std::vector<int>& explicit_counts);
// The chunks of pipeline rank `pp_rank`, in local order, where `placement` puts them
// (parallel/pipeline/placement.h).
std::vector<ChunkLayout> rank_chunks(const std::vector<int>& counts, int pp, int vp, int pp_rank,
                                     Placement placement = Placement::Loop);

// One micro-batch as the model sees it.
struct MicroBatch {
  MicroShape shape;
  Tensor tokens;   // (N) i32 input tokens, on the first stage
  Tensor targets;  // (N) i32 next tokens, on the last stage
  float grad_scale = 1.f;  // d(step loss)/d(token loss): 1 / (tokens in the global batch)
  Tensor losses;   // (N) f32, filled by the head
};

struct ChunkActs {
  std::vector<BlockActs> blocks;
  HeadActs head;
};

// Called with parameters whose gradients are final for this step (see GptModel::backward).
using GradReadyFn = std::function<void(const std::vector<Param*>&)>;

// The weight-gradient work GptModel::backward_input leaves for backward_weight, of one
// (micro-batch, chunk): data, not closures. Per weight GEMM its input and output gradient, per
// norm its input, statistics and output gradient, the embedding's tokens and output gradient;
// charged to MemCategory::Activations (ChunkActivationBytes::weight_pending counts it) and
// released by backward_weight.
struct ChunkPending {
  MicroShape shape;
  std::vector<BlockPending> blocks;  // by the chunk's block index
  HeadPending head;                  // last chunk
  EmbeddingPending embedding;        // first chunk
  bool active = false;               // between backward_input and backward_weight
};

class GptModel {
 public:
  GptModel(Ops& ops, const ParallelContext& par, const ModelConfig& cfg, const std::vector<ChunkLayout>& chunks,
           const RecomputeConfig& recompute, ParamRegistry& reg);
  int num_chunks() const { return static_cast<int>(chunks_.size()); }
  const ChunkLayout& layout(int chunk) const { return chunks_[chunk].layout; }
  const ModelConfig& config() const { return cfg_; }

  // The first chunk reads mb.tokens; others take `input` (Ns, C). Returns the chunk's output
  // (Ns, C), or nothing for the last chunk, which writes mb.losses.
  Tensor forward(int chunk, const MicroBatch& mb, const Tensor& input, ChunkActs& acts);
  // dy: the gradient of the chunk's output (ignored by the last chunk). Returns the gradient of
  // its input (nothing for the first chunk). When `ready` is set (the last backward of this
  // chunk in the step), it is called as each layer's gradients become final.
  Tensor backward(int chunk, const MicroBatch& mb, Tensor dy, ChunkActs& acts, const GradReadyFn& ready = {});

  // backward split in two for zero-bubble schedules: backward_input (I) computes every gradient
  // with respect to activations (a fully recomputed block reruns its forward here) and returns
  // what backward returns; it moves what the weight gradients need from `acts` (released) into
  // `pending`. backward_weight (W) computes the weight and bias gradients from `pending` (released)
  // and calls `ready`, when set (the last W of this chunk in the step), as each layer's gradients
  // become final, in backward's order. I then W gives the same bits as backward, gradients of
  // parameters included when the Ws of a step run in the order backward would have run (the f32
  // accumulation over micro-batches depends on its order). Under TP every rank of a TP group must
  // run its Ws in the same order (under SP they all-gather).
  Tensor backward_input(int chunk, const MicroBatch& mb, Tensor dy, ChunkActs& acts, ChunkPending& pending);
  void backward_weight(int chunk, ChunkPending& pending, const GradReadyFn& ready = {});

  // The tied embedding table on this rank (owner or copy), or null (none here, or untied).
  Param* wte() const { return wte_; }
  // This rank's mixture-of-experts layers, by layer index (none for a dense model).
  const std::vector<MoeLayer*>& moe_layers() const { return moe_layers_; }

 private:
  struct Chunk {
    ChunkLayout layout;
    std::unique_ptr<Embedding> embedding;
    std::vector<std::unique_ptr<Block>> blocks;
    std::unique_ptr<LmHead> head;
    std::vector<Param*> embedding_params, head_params;
  };
  Ops& ops_;
  ModelConfig cfg_;
  std::vector<Chunk> chunks_;
  Param* wte_ = nullptr;
  std::vector<MoeLayer*> moe_layers_;
};

// Every parameter of model `cfg` as one rank holding it whole (tp = pp = 1) registers it: global
// names and shapes (vocabulary tables padded), in registration order, then its buffers
// (ParamSpec::buffer); nothing allocated. The one list of a model's tensors for whoever needs it
// without building a rank's model (the Hugging Face import of `tripod ckpt convert`).
std::vector<ParamSpec> model_param_specs(const ModelConfig& cfg);

}  // namespace tripod
