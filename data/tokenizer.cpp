// Tokenizers: SentencePiece through the library's C++ API, byte-level BPE through data/bpe.h;
// which one a path names, and the fingerprint of its files.
#include "data/tokenizer.h"

#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>
#include <unordered_map>

#include "core/error.h"
#include "data/bpe.h"
#include "data/hash.h"

// Exported by libsentencepiece but not declared in its installed headers: the level below which
// the library's own log lines are dropped (0 info, 1 warning, 2 error).
namespace sentencepiece::logging {
void SetMinLogLevel(int v);
}

namespace tripod {

namespace {

bool is_ascii(std::string_view s) {
  size_t i = 0;
  for (; i + 8 <= s.size(); i += 8) {
    uint64_t w;
    std::memcpy(&w, s.data() + i, 8);
    if (w & 0x8080808080808080ull) return false;
  }
  for (; i < s.size(); ++i)
    if (static_cast<unsigned char>(s[i]) & 0x80) return false;
  return true;
}

// Calls fn(word) for the runs of `s` between ASCII spaces.
template <typename Fn>
void for_each_word(std::string_view s, Fn&& fn) {
  size_t start = 0;
  while (start < s.size()) {
    size_t end = s.find(' ', start);
    if (end == std::string_view::npos) end = s.size();
    if (end > start) fn(s.substr(start, end - start));
    start = end + 1;
  }
}

}  // namespace

WordCache::WordCache(size_t max_words, bool enabled) : max_words_(max_words), enabled_(enabled) {}
WordCache::~WordCache() = default;

namespace {

namespace fs = std::filesystem;

std::string read_file(const std::string& path, const char* what) {
  std::error_code ec;
  TRIPOD_INPUT_CHECK(fs::is_regular_file(path, ec), "{}: no such file ({})", path, what);
  std::ifstream f(path, std::ios::binary);
  TRIPOD_INPUT_CHECK(f.good(), "{}: cannot be read ({})", path, what);
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

enum class TokenizerFiles { SentencePiece, Gpt2, Tiktoken, HuggingFace };

// The merges.txt that goes with a vocab.json: NAME-vocab.json -> NAME-merges.txt, vocab.json ->
// merges.txt, in the same folder.
std::string merges_beside(const std::string& vocab) {
  fs::path p(vocab);
  std::string name = p.filename().string();
  const size_t at = name.rfind("vocab.json");
  name = name.substr(0, at) + "merges.txt";
  return (p.parent_path() / name).string();
}

// Which reader a path needs: by folder content, by file name, then by the file's first bytes.
TokenizerFiles detect(std::string& path) {
  std::error_code ec;
  if (fs::is_directory(path, ec)) {
    const fs::path d(path);
    if (fs::is_regular_file(d / "tokenizer.json", ec)) {
      path = (d / "tokenizer.json").string();
      return TokenizerFiles::HuggingFace;
    }
    if (fs::is_regular_file(d / "vocab.json", ec)) {
      path = (d / "vocab.json").string();
      return TokenizerFiles::Gpt2;
    }
    if (fs::is_regular_file(d / "tokenizer.model", ec)) {
      path = (d / "tokenizer.model").string();
      return TokenizerFiles::SentencePiece;
    }
    throw InputError(fmt::format("{}: a folder without tokenizer.json, vocab.json + merges.txt or tokenizer.model",
                                 path));
  }
  TRIPOD_INPUT_CHECK(fs::is_regular_file(path, ec), "{}: no such file (a tokenizer: SentencePiece .model, GPT-2 "
                     "vocab.json + merges.txt, *.tiktoken, or tokenizer.json)", path);
  const std::string name = fs::path(path).filename().string();
  if (name.ends_with(".tiktoken")) return TokenizerFiles::Tiktoken;
  if (name.ends_with("vocab.json")) return TokenizerFiles::Gpt2;
  if (name.ends_with(".json")) return TokenizerFiles::HuggingFace;
  if (name.ends_with(".model")) return TokenizerFiles::SentencePiece;
  char head[256] = {};
  std::ifstream f(path, std::ios::binary);
  f.read(head, sizeof head);
  const std::string_view h(head, static_cast<size_t>(f.gcount()));
  const size_t first = h.find_first_not_of(" \t\r\n");
  if (first != std::string_view::npos && h[first] == '{') return TokenizerFiles::HuggingFace;
  // A rank file's first line: base64, one space, digits.
  const size_t eol = h.find('\n'), sp = h.find(' ');
  if (sp != std::string_view::npos && sp > 0 && (eol == std::string_view::npos || sp < eol) &&
      h.substr(0, sp).find_first_not_of("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/=") ==
          std::string_view::npos &&
      sp + 1 < h.size() && h[sp + 1] >= '0' && h[sp + 1] <= '9')
    return TokenizerFiles::Tiktoken;
  return TokenizerFiles::SentencePiece;
}

std::string hex64(uint64_t h) { return fmt::format("{:016x}", h); }

// Where a UTF-8 text can be cut without splitting a character at its end: the length of its
// longest prefix that does not end inside an incomplete character.
size_t complete_prefix(std::string_view s) {
  const size_t n = s.size();
  for (size_t back = 1; back <= 4 && back <= n; ++back) {
    const auto c = static_cast<unsigned char>(s[n - back]);
    if ((c & 0xC0) == 0x80) continue;  // a continuation byte: look further back
    const size_t need = c >= 0xF0 && c < 0xF8 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
    return need > back ? n - back : n;
  }
  return n;
}

// The files of a tokenizer, read, and their fingerprint.
struct TokenizerBytes {
  TokenizerFiles kind;
  std::string file, text, merges_file, merges;
  std::string fingerprint;
};

TokenizerBytes read_tokenizer(const std::string& path, const std::string& pattern) {
  TokenizerBytes t;
  t.file = path;
  t.kind = detect(t.file);
  TRIPOD_INPUT_CHECK(pattern.empty() || t.kind == TokenizerFiles::Tiktoken,
                     "a pattern ('{}') is for tiktoken rank files; {} brings its own", pattern, path);
  switch (t.kind) {
    case TokenizerFiles::SentencePiece: t.text = read_file(t.file, "a SentencePiece .model"); break;
    case TokenizerFiles::Gpt2:
      t.text = read_file(t.file, "a GPT-2 vocab.json");
      t.merges_file = merges_beside(t.file);
      t.merges = read_file(t.merges_file, "the merges.txt beside vocab.json");
      break;
    case TokenizerFiles::Tiktoken: t.text = read_file(t.file, "a tiktoken rank file"); break;
    case TokenizerFiles::HuggingFace: t.text = read_file(t.file, "a Hugging Face tokenizer.json"); break;
  }
  // The pattern (as given; empty: the file name decides) is part of a rank file's identity.
  t.fingerprint = hex64(hash_string(t.merges, hash_string(t.text, hash_string(pattern))));
  return t;
}

const char* kind_name(TokenizerFiles k) {
  switch (k) {
    case TokenizerFiles::SentencePiece: return "sentencepiece";
    case TokenizerFiles::Gpt2: return BpeModel::kind_name(BpeModel::Kind::Gpt2Files);
    case TokenizerFiles::Tiktoken: return BpeModel::kind_name(BpeModel::Kind::Tiktoken);
    case TokenizerFiles::HuggingFace: return BpeModel::kind_name(BpeModel::Kind::HuggingFace);
  }
  return "?";
}

}  // namespace

void Tokenizer::open_sentencepiece(const std::string& model_path) {
  sp_ = std::make_unique<sentencepiece::SentencePieceProcessor>();
  sentencepiece::logging::SetMinLogLevel(2);
  auto status = sp_->Load(model_path);
  TRIPOD_INPUT_CHECK(status.ok(), "{}: not a SentencePiece model ({})", model_path, status.ToString());
  // Word-by-word encoding is exact when no piece spans a word boundary ("\u2581" after a
  // piece's start: split_by_whitespace off, or whitespace as suffix) and spaces behave as in
  // the default normalisation (dummy prefix added, runs of spaces collapsed): checked on probes.
  const std::string boundary = "\xe2\x96\x81";
  word_splittable_ = true;
  for (int id = 0; id < sp_->GetPieceSize() && word_splittable_; ++id)
    word_splittable_ = sp_->IdToPiece(id).find(boundary, 1) == std::string::npos;
  for (std::string_view probe : {"a b", "In the beginning God", "  two  spaces  ", "x y z", "tab\tand\nnewline here",
                                 "12 345 6789", "end.", "Mixed CASE, punct-uation! (yes)"}) {
    if (!word_splittable_) break;
    std::vector<int> whole, part, joined;
    encode(probe, whole);
    for_each_word(probe, [&](std::string_view w) {
      encode(w, part);
      joined.insert(joined.end(), part.begin(), part.end());
    });
    word_splittable_ = whole == joined;
  }
}

Tokenizer::Identity Tokenizer::identify(const std::string& path, const std::string& pattern) {
  TokenizerBytes t = read_tokenizer(path, pattern);
  return {kind_name(t.kind), t.fingerprint};
}

nlohmann::json tokenizer_record(const std::string& path, const std::string& pattern) {
  if (path.empty()) return nullptr;
  try {
    Tokenizer::Identity id = Tokenizer::identify(path, pattern);
    return {{"kind", id.kind}, {"fingerprint", id.fingerprint}, {"path", path}};
  } catch (const InputError& e) {
    return {{"path", path}, {"error", e.what()}};
  }
}

void check_tokenizer_record(const nlohmann::json& record, const Tokenizer::Identity& id, const std::string& path,
                            const std::string& checkpoint) {
  if (!record.is_object() || !record.contains("kind") || !record.contains("fingerprint") ||
      !record["kind"].is_string() || !record["fingerprint"].is_string())
    return;
  const std::string kind = record["kind"].get<std::string>(), fp = record["fingerprint"].get<std::string>();
  const std::string was = record.contains("path") && record["path"].is_string() ? record["path"].get<std::string>() : "?";
  TRIPOD_INPUT_CHECK(kind == id.kind && fp == id.fingerprint,
                     "data.tokenizer is {} {} ({}), but the checkpoint {} was trained with {} {} ({}); give the "
                     "tokenizer it was trained with (--set data.tokenizer=PATH)",
                     id.kind, id.fingerprint, path, checkpoint, kind, fp, was);
}

Tokenizer::Tokenizer(const std::string& path, const std::string& eod_piece, const std::string& pattern)
    : path_(path) {
  TokenizerBytes t = read_tokenizer(path, pattern);
  fingerprint_ = t.fingerprint;
  switch (t.kind) {
    case TokenizerFiles::SentencePiece: open_sentencepiece(t.file); break;
    case TokenizerFiles::Gpt2:
      bpe_ = std::make_unique<BpeModel>(BpeModel::from_gpt2(t.text, t.file, t.merges, t.merges_file));
      break;
    case TokenizerFiles::Tiktoken:
      bpe_ = std::make_unique<BpeModel>(BpeModel::from_tiktoken(t.text, t.file, pattern));
      break;
    case TokenizerFiles::HuggingFace:
      bpe_ = std::make_unique<BpeModel>(BpeModel::from_hf_json(t.text, t.file));
      break;
  }
  if (sp_) {
    if (eod_piece.empty()) {
      eod_id_ = sp_->eos_id();
    } else {
      eod_id_ = sp_->PieceToId(eod_piece);
      TRIPOD_INPUT_CHECK(eod_id_ >= 0 && sp_->IdToPiece(eod_id_) == eod_piece,
                         "{}: the model has no piece \"{}\" for the end-of-document token", path, eod_piece);
    }
  } else {
    eod_id_ = eod_piece.empty() ? bpe_->default_eod() : bpe_->find_token(eod_piece);
    TRIPOD_INPUT_CHECK(eod_piece.empty() || eod_id_ >= 0,
                       "{}: the tokenizer has no token \"{}\" for the end-of-document token", path, eod_piece);
  }
}

Tokenizer::~Tokenizer() = default;

std::string Tokenizer::kind() const { return sp_ ? "sentencepiece" : BpeModel::kind_name(bpe_->kind()); }

std::string Tokenizer::describe() const { return fmt::format("{} {} ({})", kind(), fingerprint_, path_); }

int Tokenizer::vocab_size() const { return sp_ ? sp_->GetPieceSize() : bpe_->vocab_size(); }

std::string Tokenizer::piece(int id) const {
  TRIPOD_CHECK(id >= 0 && id < vocab_size(), "token id {} outside the vocabulary of {}", id, vocab_size());
  return sp_ ? sp_->IdToPiece(id) : bpe_->token_bytes(id);
}

void Tokenizer::encode(std::string_view text, std::vector<int>& ids, WordCache* cache, bool specials) const {
  if (bpe_) {
    ids.clear();
    if (!cache) {
      BpeScratch scratch(0, false);
      bpe_->encode(text, ids, scratch, specials);
      return;
    }
    if (!cache->bpe_) cache->bpe_ = std::make_unique<BpeScratch>(cache->max_words_, cache->enabled_);
    bpe_->encode(text, ids, *cache->bpe_, specials);
    return;
  }
  if (!cache || !cache->enabled_ || !word_splittable_ || !is_ascii(text)) {
    auto status = sp_->Encode(text, &ids);
    TRIPOD_CHECK(status.ok(), "sentencepiece encode failed: {}", status.ToString());
    return;
  }
  ids.clear();
  std::vector<int> part;
  std::string key;
  for_each_word(text, [&](std::string_view w) {
    key.assign(w);
    auto it = cache->words_.find(key);
    if (it == cache->words_.end()) {
      encode(w, part);
      if (cache->words_.size() >= cache->max_words_) cache->words_.clear();
      it = cache->words_.emplace(key, part).first;
    }
    ids.insert(ids.end(), it->second.begin(), it->second.end());
  });
}

std::string Tokenizer::decode(std::span<const int32_t> ids) const {
  for (size_t i = 0; i < ids.size(); ++i)
    TRIPOD_INPUT_CHECK(ids[i] >= 0 && ids[i] < vocab_size() && (sp_ || bpe_->has_token(ids[i])),
                       "token id {} (position {}) is outside the vocabulary of {} ({} ids): the data was made with "
                       "another tokenizer?", ids[i], i, path_, vocab_size());
  std::string text;
  if (bpe_) {
    for (int32_t id : ids) bpe_->decode_append(id, text);
    return text;
  }
  std::vector<int> v(ids.begin(), ids.end());
  auto status = sp_->Decode(v, &text);
  TRIPOD_CHECK(status.ok(), "sentencepiece decode failed: {}", status.ToString());
  return text;
}

DecodeStream::DecodeStream(const Tokenizer& tok, std::vector<int32_t> prompt) : tok_(tok), ids_(std::move(prompt)) {
  decoded_ = tok_.decode(ids_);
}

std::string DecodeStream::take_complete() {
  // SentencePiece may decode a longer id list to a text that does not extend the previous one
  // (a leading space dropped): nothing new is printed then.
  if (decoded_.size() <= printed_) return {};
  const size_t end = complete_prefix(decoded_);
  if (end <= printed_) return {};
  std::string out = decoded_.substr(printed_, end - printed_);
  printed_ = end;
  return out;
}

std::string DecodeStream::start() { return take_complete(); }

std::string DecodeStream::push(int32_t id) {
  ids_.push_back(id);
  decoded_ = tok_.decode(ids_);
  return take_complete();
}

std::string DecodeStream::finish() {
  if (decoded_.size() <= printed_) return {};
  std::string out = decoded_.substr(printed_);
  printed_ = decoded_.size();
  return out;
}

// ---- training ------------------------------------------------------------------------------

namespace {

// SentencePiece skips sentences longer than max_sentence_length bytes: longer lines are cut at
// the last space before the limit (or at a character boundary when there is none).
constexpr size_t kMaxSentenceBytes = 8192;
constexpr size_t kCutBytes = 8000;

class DocumentSentences final : public sentencepiece::SentenceIterator {
 public:
  explicit DocumentSentences(const TokenizerTrainOptions& o, TokenizerTrainStats& stats) : o_(o), stats_(stats) {
    advance();
  }
  bool done() const override { return done_; }
  void Next() override { advance(); }
  const std::string& value() const override { return current_; }
  sentencepiece::util::Status status() const override {
    if (error_.empty()) return {};
    return {sentencepiece::util::StatusCode::kInvalidArgument, error_};
  }
  const std::string& error() const { return error_; }

 private:
  void advance() {
    try {
      while (pending_.empty()) {
        if (!fill()) {
          done_ = true;
          return;
        }
      }
      current_ = std::move(pending_.front());
      pending_.pop_front();
    } catch (const std::exception& e) {
      // Exceptions must not unwind through the library: report through status() instead.
      error_ = e.what();
      done_ = true;
    }
  }

  // Reads the next block of input lines into pending_; false when every input is consumed.
  bool fill() {
    while (true) {
      if (!reader_) {
        if (file_ >= o_.inputs.size()) return false;
        reader_ = std::make_unique<BlockReader>(o_.inputs[file_]);
        format_ = resolve_input_format(o_.format, o_.inputs[file_]);
      }
      std::string block;
      int64_t line_no = 0;
      if (!reader_->next(block, line_no)) {
        reader_.reset();
        ++file_;
        continue;
      }
      std::string text, why;
      for_each_line(block, [&](std::string_view line) {
        LineKind kind = extract_document(line, format_, o_.json_key, text, why);
        if (kind == LineKind::Bad) {
          if (!o_.skip_bad_lines)
            throw InputError(fmt::format("{}:{}: {} (--skip-bad-lines skips such lines)", o_.inputs[file_], line_no,
                                         why));
          ++stats_.bad_lines;
        } else if (kind == LineKind::Document) {
          ++stats_.documents;
          add_sentences(text);
        }
        ++line_no;
      });
      if (!pending_.empty()) return true;
    }
  }

  void add_sentences(std::string_view text) {
    for_each_line(text, [&](std::string_view s) {
      while (s.size() > kCutBytes) {
        size_t cut = s.rfind(' ', kCutBytes);
        if (cut == std::string_view::npos || cut == 0) {
          cut = kCutBytes;
          while (cut > 0 && (static_cast<unsigned char>(s[cut]) & 0xC0) == 0x80) --cut;  // not inside a character
        }
        push(s.substr(0, cut));
        s.remove_prefix(cut);
      }
      push(s);
    });
  }
  void push(std::string_view s) {
    if (s.find_first_not_of(" \t") == std::string_view::npos) return;
    pending_.emplace_back(s);
    ++stats_.sentences;
  }

  const TokenizerTrainOptions& o_;
  TokenizerTrainStats& stats_;
  size_t file_ = 0;
  std::unique_ptr<BlockReader> reader_;
  InputFormat format_ = InputFormat::Text;
  std::deque<std::string> pending_;
  std::string current_, error_;
  bool done_ = false;
};

std::string join(const std::vector<std::string>& v, char sep) {
  std::string s;
  for (const auto& x : v) {
    if (!s.empty()) s += sep;
    s += x;
  }
  return s;
}

}  // namespace

TokenizerTrainStats train_tokenizer(const TokenizerTrainOptions& o) {
  TRIPOD_INPUT_CHECK(!o.inputs.empty(), "--input: name at least one text or JSONL file");
  TRIPOD_INPUT_CHECK(o.vocab_size >= 8, "--vocab-size {}: must be at least 8", o.vocab_size);
  TRIPOD_INPUT_CHECK(o.model_type == "bpe" || o.model_type == "unigram",
                     "--model-type '{}': valid types are bpe and unigram", o.model_type);
  TRIPOD_INPUT_CHECK(o.character_coverage > 0 && o.character_coverage <= 1,
                     "--character-coverage {}: must be in (0, 1]", o.character_coverage);
  TRIPOD_INPUT_CHECK(o.threads >= 0 && o.threads <= 1024, "--threads {}: must be between 0 (all cores) and 1024",
                     o.threads);
  TRIPOD_INPUT_CHECK(o.max_sentences >= 0, "--max-sentences {}: must be >= 0 (0: all)", o.max_sentences);
  TRIPOD_INPUT_CHECK(!o.model_prefix.empty(), "--model-prefix: must not be empty");
  TRIPOD_INPUT_CHECK(!o.eod_piece.empty(), "--eod-piece: must not be empty");
  for (const auto& s : o.user_symbols)
    TRIPOD_INPUT_CHECK(!s.empty() && s.find(',') == std::string::npos,
                       "--user-symbol '{}': must be non-empty and without commas", s);
  const std::string model = o.model_prefix + ".model", vocab = o.model_prefix + ".vocab";
  std::error_code ec;
  TRIPOD_INPUT_CHECK(o.overwrite || (!std::filesystem::exists(model, ec) && !std::filesystem::exists(vocab, ec)),
                     "{} exists; pass --overwrite to replace it", model);
  for (const auto& in : o.inputs) TRIPOD_INPUT_CHECK(std::filesystem::is_regular_file(in, ec), "{}: no such file", in);

  const std::string tmp = fmt::format("{}.tmp-{}", o.model_prefix, ::getpid());
  int threads = o.threads > 0 ? o.threads : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  std::unordered_map<std::string, std::string> args = {
      {"model_prefix", tmp},
      {"vocab_size", std::to_string(o.vocab_size)},
      {"model_type", o.model_type},
      {"character_coverage", fmt::format("{}", o.character_coverage)},
      {"unk_id", "0"},
      {"bos_id", "1"},
      {"eos_id", "2"},
      {"pad_id", "-1"},
      {"eos_piece", o.eod_piece},
      {"byte_fallback", o.byte_fallback ? "true" : "false"},
      {"num_threads", std::to_string(threads)},
      {"max_sentence_length", std::to_string(kMaxSentenceBytes)},
      {"input_sentence_size", std::to_string(o.max_sentences)},
      {"shuffle_input_sentence", "true"},
      {"hard_vocab_limit", "true"},
  };
  if (!o.user_symbols.empty()) args["user_defined_symbols"] = join(o.user_symbols, ',');

  sentencepiece::logging::SetMinLogLevel(o.verbose ? 0 : 1);
  sentencepiece::SetRandomGeneratorSeed(static_cast<unsigned>(o.seed));
  TokenizerTrainStats stats;
  DocumentSentences sentences(o, stats);
  auto remove_tmp = [&] {
    std::filesystem::remove(tmp + ".model", ec);
    std::filesystem::remove(tmp + ".vocab", ec);
  };
  if (sentences.error().empty() && sentences.done()) {
    remove_tmp();
    throw InputError(fmt::format("{}: no documents to train on (empty input)", join(o.inputs, ' ')));
  }
  auto status = sentencepiece::SentencePieceTrainer::Train(args, &sentences);
  if (!sentences.error().empty()) {
    remove_tmp();
    throw InputError(sentences.error());
  }
  if (!status.ok()) {
    remove_tmp();
    throw InputError(fmt::format("tokenizer training failed (--vocab-size {}, --model-type {}): {}", o.vocab_size,
                                 o.model_type, status.ToString()));
  }
  std::filesystem::rename(tmp + ".vocab", vocab);
  std::filesystem::rename(tmp + ".model", model);
  return stats;
}

}  // namespace tripod
