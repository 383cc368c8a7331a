// Where training tokens come from: samples addressed by a global index, so which tokens a rank
// reads is a function of (sample index, seed) alone and never of the grid.
#pragma once

#include <cstdint>
#include <span>

namespace tripod {

class SampleSource {
 public:
  virtual ~SampleSource() = default;
  // Tokens per sample: seq_len + 1 (inputs and the shifted targets).
  virtual int64_t sample_tokens() const = 0;
  // Number of distinct samples; indices wrap around it.
  virtual int64_t num_samples() const = 0;
  // Writes the tokens of sample `index` (any non-negative index; it wraps) into `out`.
  virtual void get(int64_t index, std::span<int32_t> out) const = 0;
};

// Deterministic synthetic tokens for tests and benchmarks: each sample repeats a random phrase,
// so a model can learn it (copying from context) and the loss falls.
class SyntheticSource final : public SampleSource {
 public:
  SyntheticSource(int64_t seq_len, int64_t vocab_size, uint64_t seed, int64_t num_samples = 1 << 20);
  int64_t sample_tokens() const override { return seq_len_ + 1; }
  int64_t num_samples() const override { return num_samples_; }
  void get(int64_t index, std::span<int32_t> out) const override;

 private:
  int64_t seq_len_, vocab_, num_samples_;
  uint64_t seed_;
};

}  // namespace tripod
