// Synthetic samples: a random phrase of 3..16 tokens repeated to fill the sequence.
#include "core/error.h"
#include "core/rng.h"
#include "data/sample_source.h"

namespace tripod {

SyntheticSource::SyntheticSource(int64_t seq_len, int64_t vocab_size, uint64_t seed, int64_t num_samples)
    : seq_len_(seq_len), vocab_(vocab_size), num_samples_(num_samples), seed_(seed) {
  TRIPOD_CHECK(seq_len >= 1 && vocab_size >= 2 && num_samples >= 1, "synthetic source seq_len {} vocab {} samples {}",
               seq_len, vocab_size, num_samples);
}

void SyntheticSource::get(int64_t index, std::span<int32_t> out) const {
  TRIPOD_CHECK(static_cast<int64_t>(out.size()) == seq_len_ + 1, "synthetic sample of {} tokens, want {}", out.size(),
               seq_len_ + 1);
  CounterRng rng(seed_, static_cast<uint64_t>(index % num_samples_) + 0x5eed);
  int64_t period = 3 + static_cast<int64_t>(rng.uniform(0) * 14);
  for (int64_t i = 0; i < seq_len_ + 1; ++i) {
    int64_t j = i % period;
    out[i] = static_cast<int32_t>(rng.uniform(1 + j) * vocab_) % vocab_;
  }
}

}  // namespace tripod
