// Per-rank memory estimates.
#include "config/memory_plan.h"

#include <fmt/format.h>

#include <map>

#include "model/fp8.h"
#include "model/memory_estimate.h"

namespace tripod {

RankMemory plan_rank_memory(const Config& cfg, int rank) { return plan_rank_memory(cfg, make_rank_layout(cfg, rank)); }

namespace {
// Adam's two f32 moments, and an f32 master copy when the weights compute in bf16.
int64_t optimizer_bytes_per_element(Device device) { return device == Device::CUDA ? 12 : 8; }
}  // namespace

RankMemory plan_rank_memory(const Config& cfg, const RankLayout& l) {
  const bool cuda = cfg.train.device == Device::CUDA;
  const int64_t act_bytes = cuda ? 2 : 4;
  RankMemory m;
  m.rank = l.rank;
  m.coords = l.coords;
  m.params = l.flat_elements * act_bytes + l.buffer_elements * 4;  // buffers are f32
  // FP8 linears keep their weights' casts (and transposes) and scaling state (model/fp8.h).
  if (cfg.train.fp8()) m.params += fp8_persistent_bytes(cfg.model, cfg.train.fp8_config(), l.grid.tp(), l.chunks);
  m.grads = l.flat_elements * 4;
  m.optimizer = l.grad_sync.owned_elements() * optimizer_bytes_per_element(cfg.train.device);

  // Under context parallelism a rank holds seq_len / cp tokens of every sequence, and attention
  // merges blocks from their log-sum-exp: no probabilities are kept; nor within packed documents.
  const int cp = l.grid.cp();
  const DataConfig& d = cfg.data;
  ActivationShape shape{.B = l.micro_batch_size, .T = cfg.model.seq_len / cp, .tp = l.grid.tp(),
                        .sequence_parallel = l.sequence_parallel, .act_bytes = act_bytes,
                        .keeps_probs = !cuda && cp == 1 && !d.reset_attention_mask, .ep = l.grid.ep(),
                        .dispatcher = cfg.parallel.moe_dispatcher};
  std::vector<ChunkActivationBytes> bytes;
  for (const ChunkLayout& c : l.chunks) bytes.push_back(chunk_activation_bytes(cfg.model, c, cfg.recompute, shape));
  // A micro-batch's i32 tensors, held from its first forward here to its last backward: tokens,
  // targets, and with packed documents the tokens' positions in their documents (where the
  // embedding or rope reads them) and where their documents start (for attention).
  int64_t token_bytes = (l.has_embedding ? l.micro_tokens * 4 : 0) + (l.has_head ? l.micro_tokens * 4 : 0);
  if (d.reset_position_ids && (cfg.model.rope() || l.has_embedding)) token_bytes += l.micro_tokens * 4;
  if (d.reset_attention_mask) token_bytes += l.micro_tokens * 4;
  m.activations = activation_peak(l.schedule, l.plan, l.coords.pp, bytes, token_bytes);
  return m;
}

std::vector<RankMemory> plan_memory(const Config& cfg) { return plan_memory(cfg, make_schedule(cfg)); }

std::vector<RankMemory> plan_memory(const Config& cfg, const Schedule& schedule) {
  PipePlan plan = plan_pipeline(schedule);
  std::vector<RankMemory> out;
  const RankGrid grid = cfg.parallel.grid();
  for (int r = 0; r < grid.world_size(); ++r) out.push_back(plan_rank_memory(cfg, make_rank_layout(cfg, r, schedule, plan)));
  return out;
}

std::string memory_table(const Config& cfg, const std::vector<RankMemory>& ranks) {
  auto gib = [](int64_t b) { return static_cast<double>(b) / (1 << 30); };
  std::map<std::pair<int, int>, RankMemory> rows;  // (pp, tp) -> the largest DP (x CP) replica
  for (const RankMemory& m : ranks) {
    auto key = std::make_pair(m.coords.pp, m.coords.tp);
    if (!rows.count(key) || m.total() > rows[key].total()) rows[key] = m;
  }
  std::string out = fmt::format(
      "memory estimate per rank (GiB), recompute {}, schedule {}, micro-batch {} x {} tokens{}, {}:\n",
      enum_name(cfg.recompute.mode),
      cfg.parallel.schedule_file.empty() ? std::string(enum_name(cfg.parallel.schedule)) : cfg.parallel.schedule_file,
      cfg.train.micro_batch_size, cfg.model.seq_len,
      cfg.parallel.cp > 1 ? fmt::format(" ({} per rank, cp = {})", cfg.model.seq_len / cfg.parallel.cp, cfg.parallel.cp)
                          : std::string(),
      cfg.train.device == Device::CUDA ? "bf16" : "f32");
  const ModelConfig& mc = cfg.model;
  if (mc.moe.enabled()) {
    // A mixture of experts holds every expert (E/ep of them per rank under expert parallelism) but
    // computes with top_k of them; its expert rows are planned at their bound, every (token,
    // choice) pair when dropless (whatever the routing), under ep the most an EP rank can receive.
    const MoeConfig& e = mc.moe;
    const int ep = cfg.parallel.ep;
    const int64_t tokens = static_cast<int64_t>(cfg.train.micro_batch_size) * mc.seq_len / cfg.parallel.cp;
    out += fmt::format(
        "mixture of experts: {:.2f}M parameters, {:.2f}M active per token ({} experts of width {}, top {}{}, layers "
        "{}-{}){}; per MoE layer and micro-batch {} expert rows{} ({}){}\n",
        mc.num_params(cfg.parallel.tp) / 1e6, mc.num_params(cfg.parallel.tp, /*active=*/true) / 1e6, e.experts,
        mc.expert_ffn(), e.top_k, e.shared_experts > 0 ? fmt::format(", {} shared", e.shared_experts) : "",
        e.first_dense, mc.n_layers - 1,
        ep > 1 ? fmt::format("; expert parallelism over {} ranks, {} experts each, {} dispatcher", ep, e.experts / ep,
                             enum_name(cfg.parallel.moe_dispatcher))
               : std::string(),
        e.routed_rows(tokens, ep), ep > 1 ? " per EP rank at most" : "",
        e.capacity_factor > 0 ? fmt::format("at most {} per expert and source rank, capacity factor {}",
                                            e.capacity(tokens), e.capacity_factor)
        : ep > 1 ? "dropless: every EP rank's tokens choosing min(top_k, experts per rank) of its experts"
                 : "dropless: every token's top_k choices, the most any routing sends",
        e.selection_bias() ? "; selection biases f32 among the parameters" : "");
  }
  if (cfg.train.fp8())
    out += fmt::format("precision fp8 ({}): {}; their weights' casts (2 bytes per element) and scaling state are "
                       "among the parameters\n",
                       enum_name(cfg.train.fp8_recipe), fp8_summary(mc, cfg.train.fp8_config()));
  out += fmt::format("{:>4} {:>4} {:>10} {:>10} {:>10} {:>12} {:>10}\n", "pp", "tp", "params", "grads", "optimizer",
                     "activations", "total");
  for (auto& [key, m] : rows)
    out += fmt::format("{:>4} {:>4} {:>10.3f} {:>10.3f} {:>10.3f} {:>12.3f} {:>10.3f}\n", key.first, key.second,
                       gib(m.params), gib(m.grads), gib(m.optimizer), gib(m.activations), gib(m.total()));
  return out;
}

}  // namespace tripod
