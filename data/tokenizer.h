// Tokenizers: one interface over SentencePiece models and byte-level BPE (GPT-2's vocab.json +
// merges.txt, tiktoken rank files, Hugging Face tokenizer.json), and training SentencePiece
// models from text or JSONL documents.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include <nlohmann/json.hpp>

#include "data/documents.h"

namespace sentencepiece {
class SentencePieceProcessor;
}

namespace tripod {

class BpeModel;
class BpeScratch;

// A thread's encoding state for Tokenizer::encode: the encodings of words (SentencePiece) or
// pre-tokenized pieces (BPE) already seen, and BPE's regex scratch. One per thread.
class WordCache {
 public:
  explicit WordCache(size_t max_words = 1 << 20, bool enabled = true);
  ~WordCache();

 private:
  friend class Tokenizer;
  std::unordered_map<std::string, std::vector<int>> words_;
  size_t max_words_;
  bool enabled_;
  std::unique_ptr<BpeScratch> bpe_;
};

class Tokenizer {
 public:
  // Opens what `path` names, by its name or content:
  // - a SentencePiece .model;
  // - a GPT-2 vocab.json (merges.txt beside it; NAME-vocab.json pairs with NAME-merges.txt), or a
  //   folder holding vocab.json + merges.txt;
  // - a tiktoken rank file (*.tiktoken), its pattern named by `pattern` (r50k, p50k, cl100k,
  //   o200k, or a regex) or inferred from the file name (cl100k_base.tiktoken);
  // - a Hugging Face tokenizer.json (BPE over ByteLevel, after Split), or a folder holding one.
  // Anything missing or malformed is an InputError naming the file and line or field.
  // `eod_piece` names the end-of-document token; empty: the one the tokenizer names
  // (SentencePiece's end of sentence; <|endoftext|>, <|end_of_text|> or </s> for BPE).
  explicit Tokenizer(const std::string& path, const std::string& eod_piece = "", const std::string& pattern = "");
  ~Tokenizer();

  struct Identity {
    std::string kind, fingerprint;
  };
  // The kind and fingerprint of what `path` names, from its files' bytes (and the pattern).
  static Identity identify(const std::string& path, const std::string& pattern = "");

  // "sentencepiece", "gpt2-bpe", "tiktoken" or "hf-bpe".
  std::string kind() const;
  // A hash of the files read (and the pattern): 16 hex digits. Two tokenizers with the same
  // kind and fingerprint encode alike.
  const std::string& fingerprint() const { return fingerprint_; }
  // kind, fingerprint and path in one line, for messages.
  std::string describe() const;

  int vocab_size() const;
  // The end-of-document id, or -1 when the model has none.
  int eod_id() const { return eod_id_; }
  // A token's text (SentencePiece's piece; BPE's bytes).
  std::string piece(int id) const;
  const std::string& path() const { return path_; }

  // Thread-safe: encoding only reads the model. With a cache, SentencePiece encodes ASCII text
  // word by word (split at spaces), each distinct word once, when the model provably encodes
  // words independently (see word_splittable); BPE encodes each distinct pre-tokenized piece
  // once. The same ids either way.
  // `specials`: special tokens written in the text (<|endoftext|>) are their ids; otherwise
  // (documents) such text is ordinary text. SentencePiece ignores it.
  void encode(std::string_view text, std::vector<int>& ids, WordCache* cache = nullptr, bool specials = false) const;
  // Whether encoding ASCII text equals concatenating the encodings of its space-separated words:
  // no piece holds a word boundary (U+2581) after its start, and probes agree (dummy prefix on,
  // extra spaces removed).
  bool word_splittable() const { return word_splittable_; }
  // Ids outside the vocabulary are an InputError. BPE gives the bytes back exactly (possibly
  // ending inside a UTF-8 character).
  std::string decode(std::span<const int32_t> ids) const;

 private:
  void open_sentencepiece(const std::string& model_path);
  std::string path_, fingerprint_;
  std::unique_ptr<sentencepiece::SentencePieceProcessor> sp_;
  std::unique_ptr<BpeModel> bpe_;
  int eod_id_ = -1;
  bool word_splittable_ = false;
};

// What a checkpoint records about its run's tokenizer (data.tokenizer): {"kind", "fingerprint",
// "path"}, from the files alone (cheap: no model is built). Null when `path` is empty; when the
// files cannot be read, {"path", "error"} (training does not need them).
nlohmann::json tokenizer_record(const std::string& path, const std::string& pattern);
// InputError, naming both, when a checkpoint's record (of `checkpoint`) names another tokenizer
// (kind or fingerprint) than `id` (of `path`). A missing or unreadable record is accepted.
void check_tokenizer_record(const nlohmann::json& record, const Tokenizer::Identity& id, const std::string& path,
                            const std::string& checkpoint);

// Streams generated text: push() each new id and print what it returns; finish() gives the rest.
// Byte-level tokens can end inside a UTF-8 character: such bytes are held until the character
// is complete, so every piece printed is whole characters, and all pieces together are exactly
// decode(all ids).
class DecodeStream {
 public:
  DecodeStream(const Tokenizer& tok, std::vector<int32_t> prompt);
  // The prompt's text (its whole characters).
  std::string start();
  std::string push(int32_t id);
  std::string finish();

 private:
  std::string take_complete();
  const Tokenizer& tok_;
  std::vector<int32_t> ids_;
  std::string decoded_;  // decode(ids_)
  size_t printed_ = 0;
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
