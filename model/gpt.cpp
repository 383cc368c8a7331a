// Model chunks: partitioning, construction, forward and backward.
#include "model/gpt.h"

#include <fmt/ranges.h>

#include <numeric>

namespace tripod {

std::vector<int> layers_per_stage(int n_layers, int pp, int vp, const std::vector<int>& explicit_counts) {
  const int stages = pp * vp;
  if (!explicit_counts.empty()) {
    TRIPOD_INPUT_CHECK(static_cast<int>(explicit_counts.size()) == stages,
                       "parallel.layers_per_stage has {} entries but pp*vp = {}*{} = {} virtual stages need one each "
                       "(give {} counts adding up to {}, or \"auto\")",
                       explicit_counts.size(), pp, vp, stages, stages, n_layers);
    int total = std::accumulate(explicit_counts.begin(), explicit_counts.end(), 0);
    TRIPOD_INPUT_CHECK(total == n_layers, "parallel.layers_per_stage [{}] adds up to {} layers but model.n_layers = {} (give {} "
                       "counts adding up to {}, or \"auto\")",
                       fmt::join(explicit_counts, ", "), total, n_layers, stages, n_layers);
    for (size_t i = 0; i < explicit_counts.size(); ++i)
      TRIPOD_INPUT_CHECK(explicit_counts[i] >= 1, "parallel.layers_per_stage gives virtual stage {} {} layers; every "
                         "stage needs at least 1", i, explicit_counts[i]);
    return explicit_counts;
  }
  TRIPOD_INPUT_CHECK(n_layers >= stages,
                     "model.n_layers = {} is fewer than the pp*vp = {}*{} = {} pipeline stages; every stage needs a layer",
                     n_layers, pp, vp, stages);
  TRIPOD_INPUT_CHECK(n_layers % stages == 0,
                     "model.n_layers = {} does not split evenly into pp*vp = {} virtual stages; give "
                     "parallel.layers_per_stage (a list of {} counts adding up to {}, or \"auto\")",
                     n_layers, stages, stages, n_layers);
  return std::vector<int>(stages, n_layers / stages);
}

std::vector<ChunkLayout> rank_chunks(const std::vector<int>& counts, int pp, int vp, int pp_rank, Placement placement) {
  check_placement(placement, vp);
  std::vector<int> start(counts.size() + 1, 0);
  std::partial_sum(counts.begin(), counts.end(), start.begin() + 1);
  std::vector<ChunkLayout> out;
  for (int c = 0; c < vp; ++c) {
    const int g = placement_stage(placement, pp, pp_rank, c);
    out.push_back({.virtual_stage = g, .layer_begin = start[g], .layer_end = start[g + 1], .has_embedding = g == 0,
                   .has_head = g == pp * vp - 1});
  }
  return out;
}

GptModel::GptModel(Ops& ops, const ParallelContext& par, const ModelConfig& cfg,
                   const std::vector<ChunkLayout>& chunks, const RecomputeConfig& recompute, ParamRegistry& reg)
    : ops_(ops), cfg_(cfg) {
  auto added_since = [&reg](size_t before) {
    std::vector<Param*> out;
    for (size_t i = before; i < reg.params().size(); ++i) out.push_back(&reg.params()[i]);
    return out;
  };
  for (int c = 0; c < static_cast<int>(chunks.size()); ++c) {
    Chunk& ch = chunks_.emplace_back();
    ch.layout = chunks[c];
    if (ch.layout.has_embedding) {
      size_t before = reg.params().size();
      Param& table = register_wte(reg, cfg, par, /*tied_copy=*/false, c);
      if (cfg.tie_embeddings) wte_ = &table;
      ch.embedding = std::make_unique<Embedding>(ops, par, cfg, reg, table, c);
      ch.embedding_params = added_since(before);
    }
    for (int l = ch.layout.layer_begin; l < ch.layout.layer_end; ++l) {
      bool recompute_here = recompute.mode != RecomputeMode::None && recompute.applies_to(l - ch.layout.layer_begin);
      ch.blocks.push_back(std::make_unique<Block>(ops, par, cfg, reg, l, c,
                                                  recompute_here ? recompute.mode : RecomputeMode::None));
      if (auto* moe = dynamic_cast<MoeLayer*>(&ch.blocks.back()->ffn())) moe_layers_.push_back(moe);
    }
    if (ch.layout.has_head) {
      size_t before = reg.params().size();
      // A tied head uses the embedding's table; on another stage it holds a tied copy.
      Param* table = nullptr;
      if (cfg.tie_embeddings) {
        if (!wte_) wte_ = &register_wte(reg, cfg, par, /*tied_copy=*/true, c);
        table = wte_;
      } else {
        table = &register_lm_head(reg, cfg, par, c);
      }
      ch.head = std::make_unique<LmHead>(ops, par, cfg, reg, *table, c);
      ch.head_params = added_since(before);
    }
  }
}

std::vector<ParamSpec> model_param_specs(const ModelConfig& cfg) {
  // The model itself registers them (on a CPU backend that allocates nothing here), so this list
  // cannot drift from what training registers and checkpoints store.
  std::unique_ptr<Ops> cpu = make_ops(Device::CPU);
  ParallelContext serial;  // grid (1, 1, 1), rank 0, no communicators: construction communicates nothing
  ParamRegistry reg;
  GptModel model(*cpu, serial, cfg, rank_chunks({cfg.n_layers}, 1, 1, 0), RecomputeConfig{}, reg);
  std::vector<ParamSpec> out;
  for (const Param* p : reg.tensors()) out.push_back(p->spec);
  return out;
}

namespace {
// The micro-batch's shape as the layers see it, with its gradient scale (MicroShape::grad_scale).
MicroShape layer_shape(const MicroBatch& mb) {
  MicroShape ms = mb.shape;
  ms.grad_scale = mb.grad_scale;
  return ms;
}
}  // namespace

Tensor GptModel::forward(int chunk, const MicroBatch& mb, const Tensor& input, ChunkActs& acts) {
  Chunk& ch = chunks_.at(chunk);
  const MicroShape ms = layer_shape(mb);
  Tensor x = ch.embedding ? ch.embedding->forward(mb.tokens, ms) : input;
  acts.blocks.resize(ch.blocks.size());
  for (size_t i = 0; i < ch.blocks.size(); ++i) x = ch.blocks[i]->forward(x, ms, acts.blocks[i]);
  if (!ch.head) return x;
  Tensor losses = mb.losses;
  ch.head->forward(x, mb.targets, mb.grad_scale, acts.head, losses);
  return Tensor{};
}

Tensor GptModel::backward(int chunk, const MicroBatch& mb, Tensor dy, ChunkActs& acts, const GradReadyFn& ready) {
  Chunk& ch = chunks_.at(chunk);
  Tensor d = ch.head ? ch.head->backward(acts.head) : dy;
  // head_params holds the table only where the head owns a tied copy; a table shared with the
  // embedding on this rank is reported after the embedding's backward.
  if (ch.head && ready) ready(ch.head_params);
  const MicroShape ms = layer_shape(mb);
  for (int i = static_cast<int>(ch.blocks.size()) - 1; i >= 0; --i) {
    d = ch.blocks[i]->backward(d, ms, acts.blocks[i]);
    if (ready) ready(ch.blocks[i]->params());
  }
  acts = ChunkActs{};
  if (!ch.embedding) return d;
  ch.embedding->backward(mb.tokens, d, mb.shape);
  if (ready) ready(ch.embedding_params);
  return Tensor{};
}

Tensor GptModel::backward_input(int chunk, const MicroBatch& mb, Tensor dy, ChunkActs& acts, ChunkPending& pending) {
  Chunk& ch = chunks_.at(chunk);
  TRIPOD_CHECK(!pending.active, "backward_input of chunk {}: its pending weight gradients were never computed", chunk);
  pending = ChunkPending{};
  pending.shape = layer_shape(mb);
  pending.blocks.resize(ch.blocks.size());
  Tensor d = ch.head ? ch.head->backward_input(acts.head, pending.head) : dy;
  for (int i = static_cast<int>(ch.blocks.size()) - 1; i >= 0; --i)
    d = ch.blocks[i]->backward_input(d, pending.shape, acts.blocks[i], pending.blocks[i]);
  acts = ChunkActs{};
  pending.active = true;
  if (!ch.embedding) return d;
  // d is the chunk's incoming gradient buffer, changed in place by the blocks: W gets a copy.
  Tensor kept = ops_.empty(d.shape(), d.dtype(), MemCategory::Activations);
  ops_.copy(d, kept);
  pending.embedding = {.tokens = mb.tokens, .dy = kept};
  return Tensor{};
}

void GptModel::backward_weight(int chunk, ChunkPending& pending, const GradReadyFn& ready) {
  Chunk& ch = chunks_.at(chunk);
  TRIPOD_CHECK(pending.active, "backward_weight of chunk {} without its backward_input", chunk);
  TRIPOD_CHECK(pending.blocks.size() == ch.blocks.size(), "backward_weight of chunk {}: pending work of {} blocks, "
               "the chunk has {}", chunk, pending.blocks.size(), ch.blocks.size());
  // The same order as backward: head, blocks from the last, embedding (a tied table shared by the
  // head and the embedding of one chunk gets the head's share first).
  if (ch.head) {
    ch.head->backward_weight(pending.head);
    if (ready) ready(ch.head_params);
  }
  for (int i = static_cast<int>(ch.blocks.size()) - 1; i >= 0; --i) {
    ch.blocks[i]->backward_weight(pending.blocks[i], pending.shape);
    if (ready) ready(ch.blocks[i]->params());
  }
  if (ch.embedding) {
    ch.embedding->backward(pending.embedding.tokens, pending.embedding.dy, pending.shape);
    if (ready) ready(ch.embedding_params);
  }
  pending = ChunkPending{};
}

}  // namespace tripod
