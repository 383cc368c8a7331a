// GPT samples over one indexed dataset, with Megatron's GPTDataset structure: a document index
// (the split's documents, shuffled, one epoch after another), a sample index (where each sample
// of seq_len + 1 tokens starts; samples cross document boundaries and share one token with the
// next), and a shuffle index (the order samples are served in).
//
// Unlike Megatron, each epoch of documents and each epoch's block of samples is shuffled on its
// own stream of (seed, split, epoch). So sample i is the same whether 10 or 10 million samples
// are requested: a run that is extended or resumed with more steps draws the same samples.
//
// Worked example: 2 documents of 5 and 3 tokens (T = 8 per epoch), seq_len 3. Epoch 0 shuffles
// to (doc 1, doc 0), epoch 1 to (doc 0, doc 1): the token stream is b0 b1 b2 a0 a1 a2 a3 a4 |
// a0 ... Sample j starts at stream token 3j: samples 0, 1, 2 start in epoch 0 (tokens 0, 3, 6)
// and form its shuffle block; sample 2 is a3 a4 a0 a1, crossing into epoch 1.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "data/index_cache.h"
#include "data/indexed_dataset.h"
#include "data/sample_source.h"

namespace tripod {

class Communicator;

struct GptIndexOptions {
  int64_t seq_len = 0;
  uint64_t seed = 0;
  int64_t num_samples = 0;             // at least this many samples (whole epochs are built)
  int64_t doc_begin = 0, doc_end = 0;  // the split: documents [doc_begin, doc_end)
  std::string split = "train";         // names the cache and keys the shuffles
};

class GptDataset final : public SampleSource {
 public:
  // Loads the indices from the cache beside the data (PREFIX.SPLIT-HASH.gptidx), building them
  // when missing or stale; collective over `sync` (may be null): rank 0 builds, the rest wait.
  GptDataset(std::shared_ptr<const IndexedDataset> data, const GptIndexOptions& o, Communicator* sync);

  int64_t sample_tokens() const override { return seq_len_ + 1; }
  int64_t num_samples() const override { return static_cast<int64_t>(shuffle_.size()); }
  // Sample `index` (wrapping at num_samples()) in shuffled order.
  void get(int64_t index, std::span<int32_t> out) const override;
  // Sample `raw` of the sample index, before shuffling.
  void get_unshuffled(int64_t raw, std::span<int32_t> out) const;

  const IndexedDataset& data() const { return *data_; }
  const std::string& cache_path() const { return cache_path_; }
  bool built_cache() const { return built_; }
  int64_t tokens_per_epoch() const { return stats_[2]; }
  int64_t epochs() const { return stats_[0]; }  // epochs the document index spans
  // The largest and smallest token id in the split's documents, and a document holding each.
  int64_t max_token() const { return stats_[3]; }
  int64_t max_token_document() const { return stats_[4]; }
  int64_t min_token() const { return stats_[5]; }
  int64_t min_token_document() const { return stats_[6]; }

  std::span<const int64_t> document_index() const { return doc_index_; }
  std::span<const int64_t> sample_document() const { return sample_doc_; }  // num_samples() + 1 entries
  std::span<const int64_t> sample_offset() const { return sample_offset_; }
  std::span<const int64_t> shuffle_index() const { return shuffle_; }

 private:
  std::shared_ptr<const IndexedDataset> data_;
  int64_t seq_len_;
  std::string cache_path_;
  bool built_ = false;
  std::unique_ptr<IndexCache> cache_;
  std::span<const int64_t> doc_index_, sample_doc_, sample_offset_, shuffle_, stats_;
};

// Fisher-Yates over `v` with the counter-based generator on stream (seed, stream): the same
// permutation on every machine.
void shuffle_in_place(std::span<int64_t> v, uint64_t seed, uint64_t stream);

}  // namespace tripod
