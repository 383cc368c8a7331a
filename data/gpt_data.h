// The trainer's entry to real data: GPT samples over one or more indexed datasets, split into
// train/valid/test by documents and blended by weight.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "data/sample_source.h"

namespace tripod {

class Communicator;

enum class Split { Train = 0, Valid = 1, Test = 2 };
const char* split_name(Split s);

struct GptDataOptions {
  std::vector<std::string> prefixes;  // indexed datasets (PREFIX.bin + PREFIX.idx)
  std::vector<double> weights;        // one per prefix; empty: in proportion to each split's tokens
  std::string split = "969,30,1";     // train, valid, test weights over each dataset's documents
  int64_t seq_len = 0;
  uint64_t seed = 0;
  int64_t num_samples = 0;  // samples the run will draw from this split
  int64_t vocab_size = 0;   // the model's vocabulary: larger token ids are an InputError; 0: unchecked
  // The end-of-document token the run's packed documents need (data.reset_attention_mask, ...): a
  // split in which it does not occur is an InputError naming data.eod_token; -1: unchecked.
  int64_t eod_token = -1;
};

// "969,30,1" (or "969/30/1", missing parts 0) -> normalised weights; an InputError naming
// data.split otherwise.
std::array<double, 3> parse_split(const std::string& split);
// Documents [begin, end) of `split` among `num_documents`: consecutive ranges whose cumulative
// boundaries are the rounded cumulative weights, so the three splits never overlap.
std::pair<int64_t, int64_t> split_documents(const std::array<double, 3>& weights, int64_t num_documents, Split split);

// Collective over `sync` (null for one process): every member must call it with the same
// options. Rank 0 of `sync` builds missing index caches beside the data while the others wait;
// then each maps them. Opening is cheap (the .idx is checked and hashed, the .bin only mapped):
// tokens are read only by get(). Errors in the data or options are InputErrors naming the
// data.* key and the file.
std::unique_ptr<SampleSource> make_gpt_source(const GptDataOptions& o, Split split, Communicator* sync);

}  // namespace tripod
