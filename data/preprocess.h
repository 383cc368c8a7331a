// Preprocess: text or JSONL documents -> tokens -> a Megatron-compatible indexed dataset, with
// several encoding threads, in input order (the same bytes for any number of them).
#pragma once

#include <cstdint>
#include <string>

#include "data/documents.h"
#include "data/indexed_dataset.h"

namespace tripod {

inline constexpr int kMaxPreprocessWorkers = 256;

struct PreprocessOptions {
  std::string input, tokenizer_model, output_prefix;
  std::string tokenizer_pattern;  // a tiktoken rank file's pattern (see Tokenizer); empty: from its name
  InputFormat format = InputFormat::Auto;
  std::string json_key = "text";
  std::string eod_piece;  // the end-of-document token; empty: the model's end-of-sentence token
  bool append_eod = true;
  int workers = 0;  // encoding threads, at most kMaxPreprocessWorkers; 0: one per hardware thread
  bool skip_bad_lines = false;
  bool overwrite = false;
  bool progress = true;  // a progress line on stderr, only when stderr is a terminal
  bool word_cache = true;  // encode each distinct word / piece once (same ids)
  size_t block_bytes = 256 << 10;  // input bytes a worker takes at a time (whole lines); small, so the last blocks end together
};

struct PreprocessStats {
  int64_t documents = 0, tokens = 0, bad_lines = 0, blank_lines = 0, bytes = 0;
  double seconds = 0;       // reading, encoding and writing (after the tokenizer is loaded)
  double load_seconds = 0;  // loading the tokenizer
  double cpu_seconds = 0;   // CPU time (user + system, all threads) over `seconds`
  double writer_cpu_seconds = 0;  // of which the writing thread's (the only serial work)
  TokenDType dtype = TokenDType::U16;
  int vocab_size = 0;
  int workers = 0;  // encoding threads used
};

// Writes PREFIX.bin and PREFIX.idx (one sequence per document, the end-of-document token
// appended). Bad input lines are an InputError naming file:line unless skip_bad_lines; an input
// without documents is an InputError. Nothing is left behind or replaced on failure.
PreprocessStats preprocess(const PreprocessOptions& o);

}  // namespace tripod
