// Blending several sample sources by weight with Megatron's blended-dataset index: sample i goes
// to the source whose share is furthest behind its weight, so after any n samples source d has
// served within one sample of weight_d * n.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "data/index_cache.h"
#include "data/sample_source.h"

namespace tripod {

class Communicator;

struct BlendIndex {
  std::vector<int64_t> source;         // which source serves blended sample i
  std::vector<int64_t> source_sample;  // and which of its samples
};

// The greedy index over `n` samples; `weights` are normalised here.
BlendIndex build_blend_index(std::span<const double> weights, int64_t n);
// Samples to ask of each source so that the blend of `n` never wraps around one of them.
std::vector<int64_t> blend_source_samples(std::span<const double> weights, int64_t n);

class BlendedSource final : public SampleSource {
 public:
  // The index is cached at `cache_prefix`.blend-HASH.gptidx (collective over `sync`, as the GPT
  // indices). Every source must give samples of the same length.
  BlendedSource(std::vector<std::unique_ptr<SampleSource>> sources, std::vector<double> weights, int64_t num_samples,
                const std::string& cache_prefix, Communicator* sync);

  int64_t sample_tokens() const override { return sources_[0]->sample_tokens(); }
  int64_t num_samples() const override { return static_cast<int64_t>(source_.size()); }
  void get(int64_t index, std::span<int32_t> out) const override;

  const SampleSource& source(int i) const { return *sources_[i]; }
  std::span<const int64_t> source_index() const { return source_; }
  std::span<const int64_t> source_sample_index() const { return source_sample_; }
  const std::string& cache_path() const { return cache_path_; }

 private:
  std::vector<std::unique_ptr<SampleSource>> sources_;
  std::string cache_path_;
  std::unique_ptr<IndexCache> cache_;
  std::span<const int64_t> source_, source_sample_;
};

}  // namespace tripod
