// A micro-batch's tokens and targets as the rank layout places them: shared by training and
// evaluation (the sample order is data/sampler.h's, the CP slots parallel/grid.h's cp_chunk).
#pragma once

#include <cstdint>
#include <span>

#include "config/config.h"
#include "config/layout.h"
#include "data/sample_source.h"
#include "model/gpt.h"

namespace tripod {

// Writes one sequence, `sample` (the whole sequence, L + 1 tokens for L = ms.T * ms.cp: inputs
// sample[0, L), next-token targets sample[1, L]), as row b of a micro-batch of shape `ms` in this rank's layout: under
// context parallelism the rank's two chunks of c tokens, slot-major ((slot * B + b) * c + t).
// `tokens` and `targets` (host, ms.N() each) may be null.
void place_sample(const MicroShape& ms, int64_t b, std::span<const int32_t> sample, int32_t* tokens, int32_t* targets);

// Fills micro-batch `micro` of the global batch that starts after `consumed` samples of `data`
// (data/sampler.h's order, for the layout's DP rank): its shape, and on the device its input
// tokens (when the rank holds the embedding) and next-token targets (when it holds the head). A
// token id outside model.vocab_size is an InputError. With packed documents (data.reset_position_ids
// or reset_attention_mask, parallel/documents.h) every rank reads its samples for their document
// boundaries, which the shape carries (with the positions and document starts of the rank's tokens
// on the device); with data.eod_mask_loss a target whose input is the end-of-document token is -1
// (not counted).
void load_microbatch(const SampleSource* data, const Config& cfg, const RankLayout& layout, Ops& ops,
                     int64_t consumed, int micro, MicroBatch& mb);

// What the packed documents of samples [first, first + samples) of `data` make of a batch: the
// tokens whose loss counts (all but those whose input is the end-of-document token under
// data.eod_mask_loss) and the (query, key) pairs attention needs, counted as llm.c counts T^2 per
// sequence (the sum over documents of length^2 under data.reset_attention_mask).
struct BatchDocuments {
  int64_t counted = 0;
  double attended = 0;
};
BatchDocuments summarize_documents(const SampleSource& data, const Config& cfg, int64_t first, int64_t samples);

// data.eod_token as an id (data.eod_token_id), from data.tokenizer when it names a piece or is
// empty, when any of the packed-document keys is on (nothing otherwise); an InputError naming
// data.eod_token when there is no tokenizer to ask or it has no such token.
void resolve_eod_token(Config& cfg);

}  // namespace tripod
