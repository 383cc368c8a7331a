// Loading a micro-batch of samples onto the device.
#include "train/microbatch.h"

#include <algorithm>
#include <memory>
#include <vector>

#include "data/sampler.h"
#include "data/tokenizer.h"

namespace tripod {

namespace {

// Checks a sample's token ids against the vocabulary.
void check_sample(std::span<const int32_t> sample, int64_t index, const Config& cfg) {
  for (int32_t t : sample)
    TRIPOD_INPUT_CHECK(t >= 0 && t < cfg.model.vocab_size,
                       "sample {} holds token id {} but model.vocab_size = {} (the data was made with another "
                       "tokenizer?)", index, t, cfg.model.vocab_size);
}

}  // namespace

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
  const DataConfig& dc = cfg.data;
  const bool tokens = layout.has_embedding, targets = layout.has_head;
  const bool documents = dc.reset_position_ids || dc.reset_attention_mask;
  // Under context parallelism this rank holds two chunks of c tokens of every sequence, slot-major.
  const int cp = layout.grid.cp(), cp_rank = layout.coords.cp;
  const int64_t Tl = T / cp;
  mb.shape = {.B = B, .T = Tl, .cp = cp, .cp_rank = cp_rank};
  const int64_t c = mb.shape.slot_tokens();
  if (!tokens && !targets && !documents) return;
  TRIPOD_CHECK(data, "rank {} holds the embedding or head, or needs its samples' documents, but has no data",
               layout.rank);
  TRIPOD_CHECK(!dc.documents() || dc.eod_token_id >= 0, "packed documents without an end-of-document token id");
  const auto eod = static_cast<int32_t>(dc.eod_token_id);
  // The samples depend on (step, micro, DP rank) only through the global index (data/sampler.h).
  const SampleOrder order{.global_batch = cfg.train.global_batch_size, .micro_batch = B, .dp = layout.grid.dp()};
  const int64_t base = order.index(consumed, micro, layout.coords.dp, 0);
  CpuAllocator host;
  Tensor in = Tensor::empty(host, {B * Tl}, DType::I32, MemCategory::Workspace);
  Tensor tg = Tensor::empty(host, {B * Tl}, DType::I32, MemCategory::Workspace);
  auto docs = documents ? std::make_shared<Documents>() : nullptr;
  if (docs) {
    docs->T = T;
    docs->reset_positions = dc.reset_position_ids;
    docs->mask = dc.reset_attention_mask;
  }
  std::vector<int32_t> sample(T + 1);
  for (int64_t b = 0; b < B; ++b) {
    data->get(base + b, sample);
    check_sample(sample, base + b, cfg);
    if (docs) docs->add_sequence(std::span<const int32_t>(sample.data(), T), eod);
    for (int s = 0; s < mb.shape.slots(); ++s) {
      const int64_t p0 = mb.shape.slot_position(s), at = (s * B + b) * c;
      std::copy(sample.begin() + p0, sample.begin() + p0 + c, in.data<int32_t>() + at);
      std::copy(sample.begin() + p0 + 1, sample.begin() + p0 + c + 1, tg.data<int32_t>() + at);
      // Megatron's loss mask: the position whose input ends a document predicts nothing that counts.
      if (dc.eod_mask_loss)
        for (int64_t t = 0; t < c; ++t)
          if (sample[p0 + t] == eod) tg.data<int32_t>()[at + t] = -1;
    }
  }
  if (tokens) {
    mb.tokens = ops.empty({B * Tl}, DType::I32, MemCategory::Activations);
    ops.copy(in, mb.tokens);
  }
  if (targets) {
    mb.targets = ops.empty({B * Tl}, DType::I32, MemCategory::Activations);
    ops.copy(tg, mb.targets);
  }
  if (!docs) return;
  // Per token of this rank (slot-major): its position in its document and where that starts.
  Tensor pos = Tensor::empty(host, {B * Tl}, DType::I32, MemCategory::Workspace);
  Tensor start = Tensor::empty(host, {B * Tl}, DType::I32, MemCategory::Workspace);
  for (int s = 0; s < mb.shape.slots(); ++s)
    for (int64_t b = 0; b < B; ++b)
      for (int64_t t = 0; t < c; ++t) {
        const int64_t p = mb.shape.slot_position(s) + t, at = (s * B + b) * c + t;
        const int32_t first = docs->start_of(b, p);
        start.data<int32_t>()[at] = first;
        pos.data<int32_t>()[at] = static_cast<int32_t>(p - first);
      }
  if (docs->reset_positions && (cfg.model.rope() || tokens)) {
    docs->positions = ops.empty({B * Tl}, DType::I32, MemCategory::Activations);
    ops.copy(pos, docs->positions);
  }
  if (docs->mask) {
    docs->doc_start = ops.empty({B * Tl}, DType::I32, MemCategory::Activations);
    ops.copy(start, docs->doc_start);
    if (cp == 1) docs->row_cu = docs->row_offsets();
  }
  mb.shape.docs = std::move(docs);
}

BatchDocuments summarize_documents(const SampleSource& data, const Config& cfg, int64_t first, int64_t samples) {
  const DataConfig& dc = cfg.data;
  const int64_t T = cfg.model.seq_len;
  const auto eod = static_cast<int32_t>(dc.eod_token_id);
  BatchDocuments out;
  std::vector<int32_t> sample(T + 1);
  for (int64_t i = first; i < first + samples; ++i) {
    data.get(i, sample);
    const std::span<const int32_t> inputs(sample.data(), T);
    out.counted += dc.eod_mask_loss ? T - std::count(inputs.begin(), inputs.end(), eod) : T;
    if (dc.reset_attention_mask) {
      Documents d{.T = T};
      d.add_sequence(inputs, eod);
      out.attended += d.squared_lengths();
    } else {
      out.attended += static_cast<double>(T) * static_cast<double>(T);
    }
  }
  return out;
}

void resolve_eod_token(Config& cfg) {
  DataConfig& dc = cfg.data;
  if (!dc.documents() || dc.eod_token_id >= 0) return;
  TRIPOD_INPUT_CHECK(!dc.tokenizer.empty(),
                     "data.eod_token: data.reset_position_ids, data.reset_attention_mask and data.eod_mask_loss cut "
                     "sequences into documents at the end-of-document token: give its id (data.eod_token = 50256, "
                     "say), or data.tokenizer to find it{}",
                     dc.eod_token.empty() ? "" : fmt::format(" (data.eod_token = \"{}\" names a piece)", dc.eod_token));
  std::unique_ptr<Tokenizer> tok;
  try {
    tok = std::make_unique<Tokenizer>(dc.tokenizer, dc.eod_token, dc.tokenizer_pattern);
  } catch (const InputError& e) {
    throw InputError(fmt::format("data.eod_token: {}", e.what()));
  }
  TRIPOD_INPUT_CHECK(tok->eod_id() >= 0, "data.eod_token: the tokenizer {} names no end-of-document token; give its id "
                     "or piece", dc.tokenizer);
  TRIPOD_INPUT_CHECK(tok->eod_id() < cfg.model.vocab_size, "data.eod_token: the tokenizer's end-of-document token {} "
                     "is outside model.vocab_size = {}", tok->eod_id(), cfg.model.vocab_size);
  dc.eod_token_id = tok->eod_id();
}

}  // namespace tripod
