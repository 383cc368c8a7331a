// Loading a micro-batch of samples onto the device.
#include "train/microbatch.h"

#include <vector>

#include "data/sampler.h"

namespace tripod {

void place_sample(const MicroShape& ms, int64_t b, std::span<const int32_t> sample, int32_t* tokens, int32_t* targets) {
  const int64_t c = ms.slot_tokens();
  for (int s = 0; s < ms.slots(); ++s) {
    const int64_t p0 = ms.slot_position(s), at = (s * ms.B + b) * c;
    if (tokens) std::copy(sample.begin() + p0, sample.begin() + p0 + c, tokens + at);
    if (targets) std::copy(sample.begin() + p0 + 1, sample.begin() + p0 + c + 1, targets + at);
  }
}

void load_microbatch(const SampleSource* data, const Config& cfg, const RankLayout& layout, Ops& ops,
                     int64_t consumed, int micro, MicroBatch& mb) {
  const int64_t B = layout.micro_batch_size, T = cfg.model.seq_len;
  const bool tokens = layout.has_embedding, targets = layout.has_head;
  // Under context parallelism this rank holds two chunks of c tokens of every sequence, slot-major.
  const int cp = layout.grid.cp(), cp_rank = layout.coords.cp;
  const int64_t Tl = T / cp;
  mb.shape = {.B = B, .T = Tl, .cp = cp, .cp_rank = cp_rank};
  if (!tokens && !targets) return;
  TRIPOD_CHECK(data, "rank {} holds the embedding or head but has no data", layout.rank);
  // The samples depend on (step, micro, DP rank) only through the global index (data/sampler.h).
  const SampleOrder order{.global_batch = cfg.train.global_batch_size, .micro_batch = B, .dp = layout.grid.dp()};
  const int64_t base = order.index(consumed, micro, layout.coords.dp, 0);
  CpuAllocator host;
  Tensor in = Tensor::empty(host, {B * Tl}, DType::I32, MemCategory::Workspace);
  Tensor tg = Tensor::empty(host, {B * Tl}, DType::I32, MemCategory::Workspace);
  std::vector<int32_t> sample(T + 1);
  for (int64_t b = 0; b < B; ++b) {
    data->get(base + b, sample);
    for (int32_t t : sample)
      TRIPOD_INPUT_CHECK(t >= 0 && t < cfg.model.vocab_size,
                         "sample {} holds token id {} but model.vocab_size = {} (the data was made with another "
                         "tokenizer?)", base + b, t, cfg.model.vocab_size);
    place_sample(mb.shape, b, sample, in.data<int32_t>(), tg.data<int32_t>());
  }
  if (tokens) {
    mb.tokens = ops.empty({B * Tl}, DType::I32, MemCategory::Activations);
    ops.copy(in, mb.tokens);
  }
  if (targets) {
    mb.targets = ops.empty({B * Tl}, DType::I32, MemCategory::Activations);
    ops.copy(tg, mb.targets);
  }
}

}  // namespace tripod
