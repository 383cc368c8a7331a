// Byte-level BPE: GPT-2's vocab.json + merges.txt, tiktoken rank files and Hugging Face
// tokenizer.json (BPE over ByteLevel and Split pre-tokenizers), read into one model that encodes
// with the references' ids and decodes byte for byte.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "data/regex_splitter.h"

namespace tripod {

// The pre-tokenizer patterns tiktoken names (also GPT-2's own and Llama 3's / Qwen 2's Split).
// Returns nullopt for a name it does not know. Names: r50k, p50k, cl100k, o200k (with or without
// "_base"), gpt2.
std::optional<std::string> tiktoken_pattern(std::string_view name);

// Maps GPT-2's byte <-> printable character table (bytes_to_unicode): every byte is shown as one
// character, printable bytes as themselves and the others shifted past U+0100.
std::string byte_level_char(uint8_t byte);                   // its UTF-8
// The bytes a token written in that table stands for; false when a character is not in it.
bool byte_level_decode(std::string_view token, std::string& bytes);

// A bytes -> token id index over the vocabulary's byte strings (open addressing).
class TokenIndex {
 public:
  void build(const std::vector<std::string>& tokens, const std::vector<char>& present);
  // The id whose bytes are `bytes` in `tokens` (the vector build() saw), or -1.
  int find(std::string_view bytes, const std::vector<std::string>& tokens) const;

 private:
  struct Slot {
    uint32_t hash = 0;
    int32_t id = -1;
  };
  std::vector<Slot> slots_;
  uint64_t mask_ = 0;
};

// (left id, right id) -> (rank, merged id), open addressing with linear probing.
class PairRanks {
 public:
  static constexpr uint32_t kNone = 0xffffffffu;
  struct Slot {
    uint64_t key = ~0ull;
    uint32_t rank = kNone;
    int32_t merged = -1;
  };
  void reserve(size_t n);
  // Sets the pair's rank (a later merge line of the same pair replaces it, as in Hugging Face).
  void insert(int32_t a, int32_t b, uint32_t rank, int32_t merged);
  const Slot* find(int32_t a, int32_t b) const {
    if (slots_.empty()) return nullptr;  // no merges at all
    const uint64_t key = (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
    for (uint64_t i = hash(key) & mask_;; i = (i + 1) & mask_) {
      const Slot& s = slots_[i];
      if (s.key == key) return &s;
      if (s.key == ~0ull) return nullptr;
    }
  }
  size_t size() const { return size_; }

 private:
  static uint64_t hash(uint64_t k) { return (k * 0x9e3779b97f4a7c15ull) >> 20; }
  void grow();
  std::vector<Slot> slots_;
  uint64_t mask_ = 0;
  size_t size_ = 0;
};

// Per-thread encoding state: the cache of pieces already encoded, the regex scratch, buffers.
class BpeScratch {
 public:
  explicit BpeScratch(size_t max_words = 1 << 18, bool cache = true) : max_words_(max_words), cache_on_(cache) {}

 private:
  friend class BpeModel;
  struct Slot {
    uint64_t hash = 0;
    uint32_t key_at = 0, key_len = 0, ids_at = 0, ids_len = 0;
    bool used = false;
  };
  const int* find(std::string_view piece, uint64_t h, size_t& n) const;
  void insert(std::string_view piece, uint64_t h, const int* ids, size_t n);
  void clear();

  size_t max_words_;
  bool cache_on_;
  std::vector<Slot> slots_;
  size_t used_ = 0;
  std::string keys_;
  std::vector<int> ids_;
  const void* owner_ = nullptr;  // the model whose regexes the scratch below belongs to
  std::vector<RegexScratch> regex_;
  std::vector<std::string> prefixed_;  // per stage: a piece with the ByteLevel prefix space
  std::vector<int> sym_, next_, prev_;
  std::vector<uint32_t> rank_;
  std::vector<std::pair<uint64_t, int>> heap_;
  std::vector<int> out_;
  std::string normalized_;  // a segment of text after the normalizer
};

class BpeModel {
 public:
  enum class Kind { Gpt2Files, Tiktoken, HuggingFace };
  static const char* kind_name(Kind k);

  // Readers; every problem with the input is an InputError naming the file and line or field.
  // vocab.json + merges.txt as GPT-2 ships them (ByteLevel, GPT-2's pattern).
  static BpeModel from_gpt2(std::string_view vocab_json, const std::string& vocab_origin, std::string_view merges_txt,
                            const std::string& merges_origin);
  // A tiktoken rank file ("base64 rank" lines); `pattern` is a name (see tiktoken_pattern), which
  // brings that encoding's special tokens, or a regex; empty: inferred from the file name.
  static BpeModel from_tiktoken(std::string_view text, const std::string& origin, const std::string& pattern);
  // A Hugging Face tokenizer.json with a BPE model (and no normalizer, or NFC).
  static BpeModel from_hf_json(std::string_view json, const std::string& origin);

  Kind kind() const { return kind_; }
  int vocab_size() const { return static_cast<int>(tokens_.size()); }
  bool has_token(int id) const { return id >= 0 && id < vocab_size() && present_[static_cast<size_t>(id)]; }
  // The bytes a token stands for (empty for an id the files do not define).
  const std::string& token_bytes(int id) const { return tokens_[static_cast<size_t>(id)]; }
  // Whether the model's vocabulary has a token for the single byte `b` (else byte fallback, unk or nothing).
  bool has_byte(uint8_t b) const { return byte_id_[b] >= 0; }
  // A token by its text: an added/special token's content, else the vocabulary's bytes. -1 when none.
  int find_token(std::string_view text) const;
  // The end-of-document token the files name (<|endoftext|>, <|end_of_text|>, </s>), or -1.
  int default_eod() const;
  const std::string& pattern_description() const { return pattern_desc_; }
  // Whether text is put in Unicode NFC before it is split (a tokenizer.json "NFC" normalizer):
  // decoding then gives the normalized text back.
  bool normalizes_nfc() const { return nfc_; }
  // Whether a ByteLevel stage puts a space before pieces (add_prefix_space): decoding then gives
  // those spaces back too.
  bool adds_prefix_space() const {
    for (const Stage& st : stages_)
      if (st.add_prefix_space) return true;
    return false;
  }
  // Appends the ids of `text` to `ids`. `specials`: added/special tokens written in the text are
  // their ids (as Hugging Face's encode and tiktoken's allowed_special="all"); otherwise the text
  // is all ordinary text (tiktoken's encode_ordinary). As Hugging Face does, the tokens that are
  // not `normalized` are found in the text as given, the normalizer runs on the text between them,
  // and the `normalized` ones are found in what it gives.
  void encode(std::string_view text, std::vector<int>& ids, BpeScratch& s, bool specials) const;
  // Appends the bytes of `id` (checked by the caller) to `out`.
  void decode_append(int id, std::string& out) const { out += tokens_[static_cast<size_t>(id)]; }

  // Pieces longer than this are merged with a heap instead of a scan (tests lower it).
  size_t scan_limit = 96;

 private:
  struct Stage {
    std::unique_ptr<RegexSplitter> re;  // null: no split at this stage
    bool add_prefix_space = false;
  };
  void finish(const std::string& origin);  // builds the indexes once tokens_ and merges are in
  void prepare(BpeScratch& s) const;
  // Added tokens found in text: leftmost-longest matches, as Hugging Face and tiktoken find them.
  struct AddedTokens {
    std::vector<std::pair<std::string, int>> tokens;  // (content, id), longest first
    bool first[256] = {};                              // bytes a content starts with
    void finish();
    // Calls text(segment) for the text between matches and token(id) for each match, in order.
    template <typename Text, typename Token> void split(std::string_view text, Text&& on_text, Token&& on_token) const;
  };
  void encode_normalized(std::string_view text, BpeScratch& s, std::vector<int>& ids, bool specials) const;
  void encode_ordinary(std::string_view text, BpeScratch& s, std::vector<int>& ids) const;
  template <typename Emit> void split(std::string_view text, size_t stage, BpeScratch& s, Emit&& emit) const;
  void encode_piece(std::string_view piece, BpeScratch& s, std::vector<int>& ids) const;
  void merge_scan(BpeScratch& s, size_t n) const;
  void merge_heap(BpeScratch& s, size_t n) const;
  void emit_symbols(BpeScratch& s, const std::vector<int>& syms, size_t n, std::vector<int>& out) const;
  void add_pair_from_vocab();  // tiktoken: every split of every token into two tokens
  int set_token(int id, std::string bytes, const std::string& origin);

  Kind kind_ = Kind::HuggingFace;
  std::vector<std::string> tokens_;
  std::vector<char> present_;
  TokenIndex index_;
  PairRanks pairs_;
  int byte_id_[256];
  int byte_fallback_[256];
  bool byte_fallback_on_ = false, ignore_merges_ = false, fuse_unk_ = false;
  int unk_id_ = -1;
  std::vector<Stage> stages_;
  std::string pattern_desc_;
  bool nfc_ = false;
  // Added and special tokens, matched in text when `specials`: those found in the text as given
  // (every special token of GPT-2 and tiktoken files; a tokenizer.json's "normalized": false ones)
  // and those found after the normalizer ("normalized": true, their content normalized too).
  AddedTokens added_raw_, added_normalized_;
};

}  // namespace tripod
