// SentencePiece tokenizers: loading a model to encode and decode, and training one from text or
// JSONL documents.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "data/documents.h"

namespace sentencepiece {
class SentencePieceProcessor;
}

namespace tripod {

// Encodings of whitespace-separated words already seen, for Tokenizer::encode: one per thread.
class WordCache {
 public:
  explicit WordCache(size_t max_words = 1 << 20) : max_words_(max_words) {}

 private:
  friend class Tokenizer;
  std::unordered_map<std::string, std::vector<int>> words_;
  size_t max_words_;
};

class Tokenizer {
 public:
  // Loads a SentencePiece model; a missing file or one that is not a model is an InputError.
  // `eod_piece` names the end-of-document token; empty: the model's end-of-sentence token.
  explicit Tokenizer(const std::string& model_path, const std::string& eod_piece = "");
  ~Tokenizer();

  int vocab_size() const;
  // The end-of-document id, or -1 when the model has none.
  int eod_id() const { return eod_id_; }
  std::string piece(int id) const;
  const std::string& path() const { return path_; }

  // Thread-safe: encoding only reads the model. With a cache, ASCII text is encoded word by word
  // (split at spaces) and each distinct word once: the same ids, several times faster on real
  // text. Used only when the model provably encodes words independently (see word_splittable).
  void encode(std::string_view text, std::vector<int>& ids, WordCache* cache = nullptr) const;
  // Whether encoding ASCII text equals concatenating the encodings of its space-separated words:
  // no piece holds a word boundary (U+2581) after its start, and probes agree (dummy prefix on,
  // extra spaces removed).
  bool word_splittable() const { return word_splittable_; }
  // Ids outside the vocabulary are an InputError.
  std::string decode(std::span<const int32_t> ids) const;

 private:
  std::string path_;
  std::unique_ptr<sentencepiece::SentencePieceProcessor> sp_;
  int eod_id_ = -1;
  bool word_splittable_ = false;
};

struct TokenizerTrainOptions {
  std::vector<std::string> inputs;
  InputFormat format = InputFormat::Auto;
  std::string json_key = "text";
  int vocab_size = 0;
  std::string model_prefix;           // writes PREFIX.model and PREFIX.vocab
  std::string model_type = "bpe";     // bpe | unigram
  double character_coverage = 1.0;
  std::string eod_piece = "<|endoftext|>";  // the end-of-document token (SentencePiece's eos)
  std::vector<std::string> user_symbols;    // more special tokens, each kept whole
  bool byte_fallback = false;
  int64_t max_sentences = 0;  // training sentences sampled from the input; 0: all
  int threads = 0;            // 0: all hardware threads
  uint64_t seed = 1234;
  bool skip_bad_lines = false;
  bool overwrite = false;
  bool verbose = false;
};

struct TokenizerTrainStats {
  int64_t documents = 0, sentences = 0, bad_lines = 0;
};

// Trains with the SentencePiece library. Documents are cut at newlines (and long lines at
// spaces) into the sentences SentencePiece learns from. The model is written under a temporary
// name and renamed into place at the end.
TokenizerTrainStats train_tokenizer(const TokenizerTrainOptions& o);

}  // namespace tripod
