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
// token id outside model.vocab_size is an InputError.
void load_microbatch(const SampleSource* data, const Config& cfg, const RankLayout& layout, Ops& ops,
                     int64_t consumed, int micro, MicroBatch& mb);

}  // namespace tripod
