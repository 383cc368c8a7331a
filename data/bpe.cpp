// Byte-level BPE: the three readers, the pre-tokenizer stages and the merge loop.
//
// Every format becomes the same model: token ids -> byte strings, and a table of mergeable pairs
// (left id, right id) -> (rank, merged id). Encoding cuts the text with the regex stages, then
// merges each piece's bytes, always taking the lowest-ranked adjacent pair (the leftmost among
// equals) until no pair merges. A GPT-2 / Hugging Face merge rank is the merge line's index; a
// tiktoken rank is the merged token's rank, which gives every split of a token into two tokens
// that token's rank: the two agree with tiktoken's byte_pair_merge and Hugging Face's
// Word::merge_all. With ignore_merges (tiktoken always, Llama 3's tokenizer.json) a piece that is
// itself a token is that token.
#include "data/bpe.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <limits>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "data/hash.h"
#include "data/nfc.h"

namespace tripod {

namespace {

// GPT-2's pattern (also what ByteLevel's use_regex runs) and the tiktoken encodings'.
constexpr const char* kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
constexpr const char* kCl100kPattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr const char* kO200kPattern =
    R"([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?)"
    R"(|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?)"
    R"(|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

// Largest token id a file may name: the vocabulary is a dense table of that size.
constexpr int64_t kMaxTokenId = (1 << 24) - 1;

std::string canonical_name(std::string_view name) {
  std::string n(name);
  if (n.size() > 5 && n.ends_with("_base")) n.resize(n.size() - 5);
  if (n == "gpt2") n = "r50k";
  return n;
}

// The special tokens of a named tiktoken encoding.
std::vector<std::pair<std::string, int>> tiktoken_specials(const std::string& name) {
  if (name == "r50k" || name == "p50k") return {{"<|endoftext|>", 50256}};
  if (name == "cl100k")
    return {{"<|endoftext|>", 100257}, {"<|fim_prefix|>", 100258}, {"<|fim_middle|>", 100259},
            {"<|fim_suffix|>", 100260}, {"<|endofprompt|>", 100276}};
  if (name == "o200k") return {{"<|endoftext|>", 199999}, {"<|endofprompt|>", 200018}};
  return {};
}

// bytes_to_unicode: the printable bytes stand for themselves; the other 68 bytes (controls,
// space, DEL, NBSP, soft hyphen) take the code points 256, 257, ... in byte order.
struct ByteTable {
  uint32_t cp[256];
  int16_t byte_of[512];  // code point (< 512) -> byte, -1 when none
  ByteTable() {
    std::fill(std::begin(byte_of), std::end(byte_of), int16_t{-1});
    uint32_t shifted = 256;
    for (int b = 0; b < 256; ++b) {
      bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      cp[b] = printable ? static_cast<uint32_t>(b) : shifted++;
      byte_of[cp[b]] = static_cast<int16_t>(b);
    }
  }
};
const ByteTable& byte_table() {
  static const ByteTable t;
  return t;
}

bool base64_decode(std::string_view in, std::string& out) {
  auto value = [](char c) -> int {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+') return 62;
    if (c == '/') return 63;
    return -1;
  };
  out.clear();
  if (in.empty() || in.size() % 4 != 0) return false;
  for (size_t i = 0; i < in.size(); i += 4) {
    int v[4];
    int pad = 0;
    for (int k = 0; k < 4; ++k) {
      char c = in[i + k];
      if (c == '=' && i + 4 == in.size() && k >= 2) {
        v[k] = 0;
        ++pad;
      } else {
        if (pad > 0) return false;  // data after padding
        v[k] = value(c);
        if (v[k] < 0) return false;
      }
    }
    uint32_t w = (static_cast<uint32_t>(v[0]) << 18) | (static_cast<uint32_t>(v[1]) << 12) |
                 (static_cast<uint32_t>(v[2]) << 6) | static_cast<uint32_t>(v[3]);
    out.push_back(static_cast<char>(w >> 16));
    if (pad < 2) out.push_back(static_cast<char>((w >> 8) & 0xff));
    if (pad < 1) out.push_back(static_cast<char>(w & 0xff));
  }
  return true;
}

// Calls fn(line, line_number) for each line (without "\n" or "\r\n"), numbered from 1.
template <typename Fn>
void for_each_numbered_line(std::string_view text, Fn&& fn) {
  size_t start = 0;
  int64_t no = 1;
  while (start < text.size()) {
    size_t end = text.find('\n', start);
    if (end == std::string_view::npos) end = text.size();
    std::string_view line = text.substr(start, end - start);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    fn(line, no++);
    start = end + 1;
  }
}

// A short, printable quote of file content for an error message.
std::string quote(std::string_view s) {
  std::string q;
  for (unsigned char c : s.substr(0, 60)) {
    if (c >= 0x20 && c < 0x7f && c != '\\')
      q.push_back(static_cast<char>(c));
    else
      q += fmt::format("\\x{:02x}", c);
  }
  if (s.size() > 60) q += "...";
  return "'" + q + "'";
}

// A vocabulary key (a string in GPT-2's byte table, or plain text when it is not one) as bytes.
std::string key_bytes(std::string_view key) {
  std::string b;
  if (byte_level_decode(key, b)) return b;
  return std::string(key);
}

bool parse_rank(std::string_view s, int64_t& v) {
  if (s.empty() || s.size() > 10) return false;
  v = 0;
  for (char c : s) {
    if (c < '0' || c > '9') return false;
    v = v * 10 + (c - '0');
  }
  return true;
}

// The hash of a piece or token for the in-memory tables (the vocabulary's index, the word cache):
// pieces average a few bytes, so one multiply per 8 bytes and a short finish, where hash_bytes
// (for files, and stable) spends five finalisers on any length.
uint64_t piece_hash(std::string_view s) {
  const char* p = s.data();
  const size_t n = s.size();
  uint64_t h = 0x9e3779b97f4a7c15ull * (n + 1);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    uint64_t w;
    std::memcpy(&w, p + i, 8);
    h = (h ^ w) * 0xbf58476d1ce4e5b9ull;
    h ^= h >> 29;
  }
  if (i < n) {
    uint64_t w = 0;
    for (size_t k = 0; i + k < n; ++k) w |= static_cast<uint64_t>(static_cast<unsigned char>(p[i + k])) << (8 * k);
    h = (h ^ w) * 0xbf58476d1ce4e5b9ull;
  }
  h = (h ^ (h >> 32)) * 0x94d049bb133111ebull;
  return h ^ (h >> 29);
}

uint32_t hash32(std::string_view s) { return static_cast<uint32_t>(piece_hash(s)); }

}  // namespace

std::optional<std::string> tiktoken_pattern(std::string_view name) {
  const std::string n = canonical_name(name);
  if (n == "r50k" || n == "p50k") return std::string(kGpt2Pattern);
  if (n == "cl100k") return std::string(kCl100kPattern);
  if (n == "o200k") return std::string(kO200kPattern);
  return std::nullopt;
}

std::string byte_level_char(uint8_t byte) {
  uint32_t cp = byte_table().cp[byte];
  std::string s;
  if (cp < 0x80) {
    s.push_back(static_cast<char>(cp));
  } else {
    s.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    s.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
  return s;
}

bool byte_level_decode(std::string_view token, std::string& bytes) {
  // Every character of the table is below U+0200: one byte, or two (110xxxxx 10xxxxxx).
  bytes.clear();
  const ByteTable& t = byte_table();
  for (size_t i = 0; i < token.size();) {
    auto c = static_cast<unsigned char>(token[i]);
    uint32_t cp;
    if (c < 0x80) {
      cp = c;
      i += 1;
    } else if ((c & 0xE0) == 0xC0 && i + 1 < token.size() &&
               (static_cast<unsigned char>(token[i + 1]) & 0xC0) == 0x80) {
      cp = ((c & 0x1Fu) << 6) | (static_cast<unsigned char>(token[i + 1]) & 0x3Fu);
      if (cp < 0x80) return false;  // overlong
      i += 2;
    } else {
      return false;
    }
    if (cp >= 512 || t.byte_of[cp] < 0) return false;
    bytes.push_back(static_cast<char>(t.byte_of[cp]));
  }
  return true;
}

// ---- the indexes --------------------------------------------------------------------------

void TokenIndex::build(const std::vector<std::string>& tokens, const std::vector<char>& present) {
  size_t n = 0;
  for (char p : present) n += p == 1;
  size_t cap = 16;
  while (cap < 2 * n + 2) cap <<= 1;
  slots_.assign(cap, Slot{});
  mask_ = cap - 1;
  for (size_t id = 0; id < tokens.size(); ++id) {
    if (present[id] != 1) continue;
    const uint32_t h = hash32(tokens[id]);
    for (uint64_t i = h & mask_;; i = (i + 1) & mask_) {
      Slot& s = slots_[i];
      if (s.id < 0) {
        s = {h, static_cast<int32_t>(id)};
        break;
      }
      if (s.hash == h && tokens[static_cast<size_t>(s.id)] == tokens[id]) break;  // the same bytes twice: first id
    }
  }
}

int TokenIndex::find(std::string_view bytes, const std::vector<std::string>& tokens) const {
  if (slots_.empty()) return -1;
  const uint32_t h = hash32(bytes);
  for (uint64_t i = h & mask_;; i = (i + 1) & mask_) {
    const Slot& s = slots_[i];
    if (s.id < 0) return -1;
    if (s.hash == h && tokens[static_cast<size_t>(s.id)] == bytes) return s.id;
  }
}

void PairRanks::reserve(size_t n) {
  size_t cap = 16;
  while (cap < 2 * n + 2) cap <<= 1;
  if (cap <= slots_.size()) return;
  std::vector<Slot> old = std::move(slots_);
  slots_.assign(cap, Slot{});
  mask_ = cap - 1;
  size_ = 0;
  for (const Slot& s : old)
    if (s.key != ~0ull) insert(static_cast<int32_t>(s.key >> 32), static_cast<int32_t>(s.key & 0xffffffffu), s.rank,
                               s.merged);
}

void PairRanks::grow() { reserve(std::max<size_t>(size_ * 2, 64)); }

void PairRanks::insert(int32_t a, int32_t b, uint32_t rank, int32_t merged) {
  if (2 * (size_ + 1) + 2 > slots_.size()) grow();
  const uint64_t key = (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
  for (uint64_t i = hash(key) & mask_;; i = (i + 1) & mask_) {
    Slot& s = slots_[i];
    if (s.key == key) {
      s.rank = rank;
      s.merged = merged;
      return;
    }
    if (s.key == ~0ull) {
      s = {key, rank, merged};
      ++size_;
      return;
    }
  }
}

// ---- the word cache -------------------------------------------------------------------------

const int* BpeScratch::find(std::string_view piece, uint64_t h, size_t& n) const {
  if (slots_.empty()) return nullptr;
  const uint64_t mask = slots_.size() - 1;
  for (uint64_t i = h & mask;; i = (i + 1) & mask) {
    const Slot& s = slots_[i];
    if (!s.used) return nullptr;
    if (s.hash == h && s.key_len == piece.size() && std::memcmp(keys_.data() + s.key_at, piece.data(), piece.size()) == 0) {
      n = s.ids_len;
      return ids_.data() + s.ids_at;
    }
  }
}

void BpeScratch::clear() {
  std::fill(slots_.begin(), slots_.end(), Slot{});
  used_ = 0;
  keys_.clear();
  ids_.clear();
}

void BpeScratch::insert(std::string_view piece, uint64_t h, const int* ids, size_t n) {
  // Arena offsets are 32-bit: start over well before they could overflow, or when full.
  if (used_ >= max_words_ || keys_.size() + piece.size() > (1u << 30) || ids_.size() + n > (1u << 28)) clear();
  if (slots_.empty()) {
    size_t cap = 16;  // a power of two, at least twice the words it may hold
    while (cap < 1024 && cap < 2 * max_words_) cap <<= 1;
    slots_.assign(cap, Slot{});
  }
  if (2 * (used_ + 1) > slots_.size()) {
    // Double the table, re-placing the entries (the arenas stay).
    std::vector<Slot> old = std::move(slots_);
    slots_.assign(old.size() * 2, Slot{});
    const uint64_t mask = slots_.size() - 1;
    for (const Slot& s : old) {
      if (!s.used) continue;
      uint64_t i = s.hash & mask;
      while (slots_[i].used) i = (i + 1) & mask;
      slots_[i] = s;
    }
  }
  const uint64_t mask = slots_.size() - 1;
  uint64_t i = h & mask;
  while (slots_[i].used) i = (i + 1) & mask;
  slots_[i] = {h, static_cast<uint32_t>(keys_.size()), static_cast<uint32_t>(piece.size()),
               static_cast<uint32_t>(ids_.size()), static_cast<uint32_t>(n), true};
  keys_.append(piece);
  ids_.insert(ids_.end(), ids, ids + n);
  ++used_;
}

// ---- building a model -----------------------------------------------------------------------

const char* BpeModel::kind_name(Kind k) {
  switch (k) {
    case Kind::Gpt2Files: return "gpt2-bpe";
    case Kind::Tiktoken: return "tiktoken";
    case Kind::HuggingFace: return "hf-bpe";
  }
  return "?";
}

int BpeModel::set_token(int id, std::string bytes, const std::string& origin) {
  TRIPOD_INPUT_CHECK(id >= 0 && id <= kMaxTokenId, "{}: token id {} is outside 0..{}", origin, id, kMaxTokenId);
  TRIPOD_INPUT_CHECK(!bytes.empty(), "{}: an empty token (id {})", origin, id);
  const auto at = static_cast<size_t>(id);
  if (at >= tokens_.size()) {
    tokens_.resize(at + 1);
    present_.resize(at + 1, 0);
  }
  TRIPOD_INPUT_CHECK(present_[at] == 0, "{}: id {} is given to two tokens, {} and {}", origin, id, quote(tokens_[at]),
                     quote(bytes));
  tokens_[at] = std::move(bytes);
  present_[at] = 1;
  return id;
}

void BpeModel::add_pair_from_vocab() {
  size_t pairs = 0;
  for (size_t id = 0; id < tokens_.size(); ++id) pairs += present_[id] == 1 ? tokens_[id].size() : 0;
  pairs_.reserve(pairs);
  for (size_t id = 0; id < tokens_.size(); ++id) {
    if (present_[id] != 1) continue;
    const std::string_view t = tokens_[id];
    for (size_t k = 1; k < t.size(); ++k) {
      const int a = index_.find(t.substr(0, k), tokens_);
      if (a < 0) continue;
      const int b = index_.find(t.substr(k), tokens_);
      if (b < 0) continue;
      pairs_.insert(a, b, static_cast<uint32_t>(id), static_cast<int32_t>(id));
    }
  }
}

void BpeModel::finish(const std::string& origin) {
  TRIPOD_INPUT_CHECK(!tokens_.empty(), "{}: no tokens", origin);
  for (int b = 0; b < 256; ++b) {
    const char c = static_cast<char>(b);
    byte_id_[b] = index_.find(std::string_view(&c, 1), tokens_);
    byte_fallback_[b] = index_.find(fmt::format("<0x{:02X}>", b), tokens_);
  }
  added_raw_.finish();
  added_normalized_.finish();
}

void BpeModel::AddedTokens::finish() {
  std::stable_sort(tokens.begin(), tokens.end(),
                   [](const auto& x, const auto& y) { return x.first.size() > y.first.size(); });
  for (const auto& [content, id] : tokens) first[static_cast<unsigned char>(content[0])] = true;
}

BpeModel BpeModel::from_gpt2(std::string_view vocab_json, const std::string& vocab_origin, std::string_view merges_txt,
                             const std::string& merges_origin) {
  BpeModel m;
  m.kind_ = Kind::Gpt2Files;
  const nlohmann::json v = nlohmann::json::parse(vocab_json, nullptr, /*allow_exceptions=*/false);
  TRIPOD_INPUT_CHECK(!v.is_discarded(), "{}: not JSON (a GPT-2 vocab.json is an object of token -> id)", vocab_origin);
  TRIPOD_INPUT_CHECK(v.is_object(), "{}: a {} where an object of token -> id was expected", vocab_origin, v.type_name());
  for (const auto& [key, id] : v.items()) {
    TRIPOD_INPUT_CHECK(id.is_number_integer(), "{}: token {} has {} {} where an integer id was expected", vocab_origin,
                       quote(key), id.type_name(), id.dump());
    const int64_t i = id.get<int64_t>();
    TRIPOD_INPUT_CHECK(i >= 0 && i <= kMaxTokenId, "{}: token {} has id {}, outside 0..{}", vocab_origin, quote(key), i,
                       kMaxTokenId);
    m.set_token(static_cast<int>(i), key_bytes(key), vocab_origin);
  }
  m.index_.build(m.tokens_, m.present_);
  int64_t rank = 0;
  for_each_numbered_line(merges_txt, [&](std::string_view line, int64_t no) {
    if (no == 1 && line.starts_with("#version")) return;
    if (line.empty()) return;
    const size_t sp = line.find(' ');
    TRIPOD_INPUT_CHECK(sp != std::string_view::npos && sp > 0 && sp + 1 < line.size() &&
                           line.find(' ', sp + 1) == std::string_view::npos,
                       "{}:{}: {} is not a merge (two tokens separated by one space)", merges_origin, no, quote(line));
    const std::string a = key_bytes(line.substr(0, sp)), b = key_bytes(line.substr(sp + 1));
    const int ia = m.index_.find(a, m.tokens_), ib = m.index_.find(b, m.tokens_);
    TRIPOD_INPUT_CHECK(ia >= 0, "{}:{}: token {} is not in {}", merges_origin, no, quote(line.substr(0, sp)),
                       vocab_origin);
    TRIPOD_INPUT_CHECK(ib >= 0, "{}:{}: token {} is not in {}", merges_origin, no, quote(line.substr(sp + 1)),
                       vocab_origin);
    const int merged = m.index_.find(a + b, m.tokens_);
    TRIPOD_INPUT_CHECK(merged >= 0, "{}:{}: the merge {} makes a token that is not in {}", merges_origin, no,
                       quote(line), vocab_origin);
    m.pairs_.insert(ia, ib, static_cast<uint32_t>(rank++), merged);
  });
  Stage st;
  st.re = std::make_unique<RegexSplitter>(kGpt2Pattern, vocab_origin);
  m.stages_.push_back(std::move(st));
  m.pattern_desc_ = "gpt2";
  const int eot = m.index_.find("<|endoftext|>", m.tokens_);
  if (eot >= 0) m.added_raw_.tokens.emplace_back("<|endoftext|>", eot);
  m.finish(vocab_origin);
  return m;
}

BpeModel BpeModel::from_tiktoken(std::string_view text, const std::string& origin, const std::string& pattern) {
  BpeModel m;
  m.kind_ = Kind::Tiktoken;
  m.ignore_merges_ = true;  // tiktoken looks a piece up whole before merging
  std::string bytes;
  for_each_numbered_line(text, [&](std::string_view line, int64_t no) {
    if (line.empty()) return;
    const size_t sp = line.find(' ');
    TRIPOD_INPUT_CHECK(sp != std::string_view::npos, "{}:{}: {} is not 'BASE64 RANK'", origin, no, quote(line));
    TRIPOD_INPUT_CHECK(base64_decode(line.substr(0, sp), bytes), "{}:{}: bad base64 {}", origin, no,
                       quote(line.substr(0, sp)));
    int64_t rank = 0;
    TRIPOD_INPUT_CHECK(parse_rank(line.substr(sp + 1), rank) && rank <= kMaxTokenId,
                       "{}:{}: rank {} is not an integer in 0..{}", origin, no, quote(line.substr(sp + 1)), kMaxTokenId);
    m.set_token(static_cast<int>(rank), bytes, fmt::format("{}:{}", origin, no));
  });
  TRIPOD_INPUT_CHECK(!m.tokens_.empty(), "{}: no ranks (a tiktoken file has 'BASE64 RANK' lines)", origin);
  m.index_.build(m.tokens_, m.present_);
  for (int b = 0; b < 256; ++b) {
    const char c = static_cast<char>(b);
    TRIPOD_INPUT_CHECK(m.index_.find(std::string_view(&c, 1), m.tokens_) >= 0,
                       "{}: no rank for the single byte 0x{:02x} (a rank file covers every byte)", origin, b);
  }
  std::string name = pattern;
  if (name.empty()) {
    const std::string file = std::filesystem::path(origin).filename().string();
    for (const char* known : {"cl100k", "o200k", "p50k", "r50k", "gpt2"})
      if (file.find(known) != std::string::npos) {
        name = known;
        break;
      }
    TRIPOD_INPUT_CHECK(!name.empty(), "{}: which pattern splits the text? The file name does not say; name it "
                       "(data.tokenizer_pattern / --tokenizer-pattern: r50k, p50k, cl100k, o200k, or a regex)", origin);
  }
  if (auto p = tiktoken_pattern(name)) {
    name = canonical_name(name);
    m.stages_.push_back(Stage{std::make_unique<RegexSplitter>(*p, origin), false});
    m.pattern_desc_ = name;
    for (auto& [content, id] : tiktoken_specials(name)) {
      TRIPOD_INPUT_CHECK(id >= static_cast<int>(m.tokens_.size()) || m.present_[static_cast<size_t>(id)] == 0,
                         "{}: rank {} is {}'s special token {}; this is not a {} rank file", origin, id, name, content,
                         name);
      if (id >= static_cast<int>(m.tokens_.size())) {
        m.tokens_.resize(static_cast<size_t>(id) + 1);
        m.present_.resize(static_cast<size_t>(id) + 1, 0);
      }
      m.tokens_[static_cast<size_t>(id)] = content;
      m.present_[static_cast<size_t>(id)] = 2;
      m.added_raw_.tokens.emplace_back(content, id);
    }
  } else {
    m.stages_.push_back(Stage{std::make_unique<RegexSplitter>(name, origin + " (the pattern given for it)"), false});
    m.pattern_desc_ = "regex " + name;
  }
  m.add_pair_from_vocab();
  m.finish(origin);
  return m;
}

BpeModel BpeModel::from_hf_json(std::string_view text, const std::string& origin) {
  using nlohmann::json;
  BpeModel m;
  m.kind_ = Kind::HuggingFace;
  const json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  TRIPOD_INPUT_CHECK(!j.is_discarded(), "{}: not JSON (a Hugging Face tokenizer.json)", origin);
  TRIPOD_INPUT_CHECK(j.is_object(), "{}: a {} where a tokenizer.json object was expected", origin, j.type_name());
  auto field = [&](const json& obj, const char* key, const std::string& /*where*/) -> const json* {
    auto it = obj.find(key);
    return it == obj.end() || it->is_null() ? nullptr : &*it;
  };
  auto want_bool = [&](const json& obj, const char* key, const std::string& where, bool dflt) {
    const json* v = field(obj, key, where);
    if (!v) return dflt;
    TRIPOD_INPUT_CHECK(v->is_boolean(), "{}: {}.{} is {} where true or false was expected", origin, where, key,
                       v->dump());
    return v->get<bool>();
  };
  auto type_of = [&](const json& obj, const std::string& where) {
    TRIPOD_INPUT_CHECK(obj.is_object(), "{}: {} is {} where an object was expected", origin, where, obj.type_name());
    const json* t = field(obj, "type", where);
    TRIPOD_INPUT_CHECK(t && t->is_string(), "{}: {}.type is missing (a string naming the kind)", origin, where);
    return t->get<std::string>();
  };

  const json* model = field(j, "model", "");
  TRIPOD_INPUT_CHECK(model, "{}: no model", origin);
  const std::string mtype = type_of(*model, "model");
  TRIPOD_INPUT_CHECK(mtype == "BPE", "{}: model.type '{}' is not supported: tripod reads BPE tokenizer.json models",
                     origin, mtype);
  if (const json* d = field(*model, "dropout", "model"))
    TRIPOD_INPUT_CHECK(d->is_number() && d->get<double>() == 0.0,
                       "{}: model.dropout {} is not supported (BPE dropout is for training; null)", origin, d->dump());
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"})
    if (const json* s = field(*model, key, "model"))
      TRIPOD_INPUT_CHECK(s->is_string() && s->get<std::string>().empty(),
                         "{}: model.{} {} is not supported (byte-level BPE has none: null)", origin, key, s->dump());
  m.byte_fallback_on_ = want_bool(*model, "byte_fallback", "model", false);
  m.ignore_merges_ = want_bool(*model, "ignore_merges", "model", false);
  m.fuse_unk_ = want_bool(*model, "fuse_unk", "model", false);
  const json* vocab = field(*model, "vocab", "model");
  TRIPOD_INPUT_CHECK(vocab && vocab->is_object(), "{}: model.vocab is {} where an object of token -> id was expected",
                     origin, vocab ? vocab->type_name() : "missing");
  for (const auto& [key, id] : vocab->items()) {
    TRIPOD_INPUT_CHECK(id.is_number_integer(), "{}: model.vocab[{}] is {} where an integer id was expected", origin,
                       quote(key), id.dump());
    const int64_t i = id.get<int64_t>();
    TRIPOD_INPUT_CHECK(i >= 0 && i <= kMaxTokenId, "{}: model.vocab[{}] = {} is outside 0..{}", origin, quote(key), i,
                       kMaxTokenId);
    m.set_token(static_cast<int>(i), key_bytes(key), origin + ": model.vocab");
  }
  m.index_.build(m.tokens_, m.present_);
  const json* merges = field(*model, "merges", "model");
  TRIPOD_INPUT_CHECK(merges && merges->is_array(), "{}: model.merges is {} where an array of merges was expected",
                     origin, merges ? merges->type_name() : "missing");
  m.pairs_.reserve(merges->size());
  for (size_t r = 0; r < merges->size(); ++r) {
    const json& e = (*merges)[r];
    std::string sa, sb;
    if (e.is_string()) {
      const std::string s = e.get<std::string>();
      const size_t sp = s.find(' ');
      TRIPOD_INPUT_CHECK(sp != std::string::npos && sp > 0 && sp + 1 < s.size() && s.find(' ', sp + 1) == std::string::npos,
                         "{}: model.merges[{}] {} is not a merge (two tokens separated by one space)", origin, r,
                         quote(s));
      sa = s.substr(0, sp);
      sb = s.substr(sp + 1);
    } else {
      TRIPOD_INPUT_CHECK(e.is_array() && e.size() == 2 && e[0].is_string() && e[1].is_string(),
                         "{}: model.merges[{}] is {} where \"A B\" or [\"A\", \"B\"] was expected", origin, r,
                         e.dump().substr(0, 80));
      sa = e[0].get<std::string>();
      sb = e[1].get<std::string>();
    }
    const std::string a = key_bytes(sa), b = key_bytes(sb);
    const int ia = m.index_.find(a, m.tokens_), ib = m.index_.find(b, m.tokens_);
    TRIPOD_INPUT_CHECK(ia >= 0, "{}: model.merges[{}]: token {} is not in model.vocab", origin, r, quote(sa));
    TRIPOD_INPUT_CHECK(ib >= 0, "{}: model.merges[{}]: token {} is not in model.vocab", origin, r, quote(sb));
    const int merged = m.index_.find(a + b, m.tokens_);
    TRIPOD_INPUT_CHECK(merged >= 0, "{}: model.merges[{}]: {} + {} makes a token that is not in model.vocab", origin, r,
                       quote(sa), quote(sb));
    m.pairs_.insert(ia, ib, static_cast<uint32_t>(r), merged);
  }
  if (const json* u = field(*model, "unk_token", "model")) {
    TRIPOD_INPUT_CHECK(u->is_string(), "{}: model.unk_token is {} where a token was expected", origin, u->dump());
    m.unk_id_ = m.index_.find(key_bytes(u->get<std::string>()), m.tokens_);
    TRIPOD_INPUT_CHECK(m.unk_id_ >= 0, "{}: model.unk_token {} is not in model.vocab", origin, u->dump());
  }

  if (const json* n = field(j, "normalizer", "")) {
    const std::string t = type_of(*n, "normalizer");
    TRIPOD_INPUT_CHECK(t == "NFC", "{}: normalizer.type '{}' is not supported: tripod reads byte-level BPE with no "
                       "normalizer (normalizer: null) or Unicode NFC (\"type\": \"NFC\", as Qwen 2 ships)", origin, t);
    TRIPOD_INPUT_CHECK(nfc_available(), "{}: normalizer.type 'NFC' needs ICU, which this build of tripod leaves out "
                       "(CMake option TRIPOD_ICU=OFF, as in the GPU bundle); use a build with it", origin);
    m.nfc_ = true;
  }
  // Pre-tokenizers: Split (Isolated) stages, then ByteLevel last (it hands bytes to the model).
  const json* pre = field(j, "pre_tokenizer", "");
  TRIPOD_INPUT_CHECK(pre, "{}: pre_tokenizer is null; tripod reads byte-level BPE (a ByteLevel pre-tokenizer, after "
                     "any Split)", origin);
  std::vector<std::pair<const json*, std::string>> parts;
  if (type_of(*pre, "pre_tokenizer") == "Sequence") {
    const json* list = field(*pre, "pretokenizers", "pre_tokenizer");
    TRIPOD_INPUT_CHECK(list && list->is_array(), "{}: pre_tokenizer.pretokenizers is not an array", origin);
    for (size_t i = 0; i < list->size(); ++i)
      parts.emplace_back(&(*list)[i], fmt::format("pre_tokenizer.pretokenizers[{}]", i));
  } else {
    parts.emplace_back(pre, "pre_tokenizer");
  }
  bool byte_level = false;
  std::string desc;
  for (const auto& [p, where] : parts) {
    const std::string t = type_of(*p, where);
    TRIPOD_INPUT_CHECK(!byte_level, "{}: {}.type '{}' comes after ByteLevel; tripod reads ByteLevel as the last "
                       "pre-tokenizer", origin, where, t);
    if (t == "Split") {
      const json* pat = field(*p, "pattern", where);
      TRIPOD_INPUT_CHECK(pat && pat->is_object() && pat->size() == 1 &&
                             (pat->contains("Regex") || pat->contains("String")) && pat->begin()->is_string(),
                         "{}: {}.pattern is {} where {{\"Regex\": ...}} or {{\"String\": ...}} was expected", origin,
                         where, pat ? pat->dump().substr(0, 80) : "missing");
      const json* behavior = field(*p, "behavior", where);
      TRIPOD_INPUT_CHECK(behavior && *behavior == "Isolated",
                         "{}: {}.behavior {} is not supported (tripod reads \"Isolated\")", origin, where,
                         behavior ? behavior->dump() : "missing");
      TRIPOD_INPUT_CHECK(!want_bool(*p, "invert", where, false), "{}: {}.invert true is not supported", origin, where);
      const bool literal = pat->contains("String");
      const std::string s = pat->begin()->get<std::string>();
      m.stages_.push_back(Stage{std::make_unique<RegexSplitter>(s, origin + ": " + where + ".pattern", literal), false});
      desc += (desc.empty() ? "" : " + ") + std::string(literal ? "split string " : "split regex ") + s;
    } else if (t == "ByteLevel") {
      byte_level = true;
      Stage st;
      st.add_prefix_space = want_bool(*p, "add_prefix_space", where, true);
      if (want_bool(*p, "use_regex", where, true)) st.re = std::make_unique<RegexSplitter>(kGpt2Pattern, origin);
      desc += (desc.empty() ? "" : " + ") + std::string("byte-level") + (st.re ? " gpt2 regex" : "") +
              (st.add_prefix_space ? " prefix space" : "");
      m.stages_.push_back(std::move(st));
    } else {
      throw InputError(fmt::format("{}: {}.type '{}' is not supported: tripod reads Split and ByteLevel "
                                   "pre-tokenizers", origin, where, t));
    }
  }
  TRIPOD_INPUT_CHECK(byte_level, "{}: pre_tokenizer has no ByteLevel; tripod reads byte-level BPE", origin);
  m.pattern_desc_ = (m.nfc_ ? "NFC + " : "") + desc;
  if (const json* d = field(j, "decoder", "")) {
    const std::string t = type_of(*d, "decoder");
    TRIPOD_INPUT_CHECK(t == "ByteLevel", "{}: decoder.type '{}' is not supported: byte-level BPE decodes with ByteLevel",
                       origin, t);
  }

  if (const json* added = field(j, "added_tokens", "")) {
    TRIPOD_INPUT_CHECK(added->is_array(), "{}: added_tokens is not an array", origin);
    for (size_t i = 0; i < added->size(); ++i) {
      const json& a = (*added)[i];
      const std::string where = fmt::format("added_tokens[{}]", i);
      TRIPOD_INPUT_CHECK(a.is_object() && a.contains("id") && a["id"].is_number_integer() && a.contains("content") &&
                             a["content"].is_string(),
                         "{}: {} is {} where {{\"id\": N, \"content\": \"...\", ...}} was expected", origin, where,
                         a.dump().substr(0, 80));
      for (const char* flag : {"single_word", "lstrip", "rstrip"})
        TRIPOD_INPUT_CHECK(!want_bool(a, flag, where, false), "{}: {}.{} true is not supported", origin, where, flag);
      // Hugging Face's default: special tokens are matched in the text as given, others after the normalizer.
      const bool normalized = want_bool(a, "normalized", where, !want_bool(a, "special", where, false));
      const int64_t id = a["id"].get<int64_t>();
      const std::string content = a["content"].get<std::string>();
      TRIPOD_INPUT_CHECK(id >= 0 && id <= kMaxTokenId, "{}: {}.id {} is outside 0..{}", origin, where, id, kMaxTokenId);
      TRIPOD_INPUT_CHECK(!content.empty(), "{}: {}.content is empty", origin, where);
      const auto at = static_cast<size_t>(id);
      if (at >= m.tokens_.size()) {
        m.tokens_.resize(at + 1);
        m.present_.resize(at + 1, 0);
      }
      if (m.present_[at] == 0) {
        m.tokens_[at] = content;
        m.present_[at] = 2;
      }
      if (normalized && m.nfc_ && !nfc_quick_yes(content)) {
        std::string n;
        nfc_normalize(content, n);  // matched in normalized text, so normalized too (as Hugging Face does)
        m.added_normalized_.tokens.emplace_back(std::move(n), static_cast<int>(id));
      } else {
        (normalized ? m.added_normalized_ : m.added_raw_).tokens.emplace_back(content, static_cast<int>(id));
      }
    }
  }
  m.finish(origin);
  return m;
}

int BpeModel::find_token(std::string_view text) const {
  for (const AddedTokens* set : {&added_raw_, &added_normalized_})
    for (const auto& [content, id] : set->tokens)
      if (content == text) return id;
  int id = index_.find(text, tokens_);
  if (id >= 0) return id;
  std::string b;
  if (byte_level_decode(text, b)) return index_.find(b, tokens_);
  return -1;
}

int BpeModel::default_eod() const {
  for (const char* name : {"<|endoftext|>", "<|end_of_text|>", "</s>"})
    for (const AddedTokens* set : {&added_raw_, &added_normalized_})
      for (const auto& [content, id] : set->tokens)
        if (content == name) return id;
  return -1;
}

// ---- encoding -------------------------------------------------------------------------------

void BpeModel::prepare(BpeScratch& s) const {
  if (s.owner_ == this) return;
  s.regex_.clear();
  for (const Stage& st : stages_) s.regex_.push_back(st.re ? st.re->make_scratch() : RegexScratch{});
  s.prefixed_.assign(stages_.size(), std::string());
  s.clear();
  s.owner_ = this;
}

template <typename Text, typename Token>
void BpeModel::AddedTokens::split(std::string_view text, Text&& on_text, Token&& on_token) const {
  if (tokens.empty()) {
    on_text(text);
    return;
  }
  size_t start = 0, i = 0;
  while (i < text.size()) {
    if (first[static_cast<unsigned char>(text[i])]) {
      const std::string_view rest = text.substr(i);
      bool hit = false;
      for (const auto& [content, id] : tokens) {  // longest first: leftmost-longest
        if (rest.starts_with(content)) {
          on_text(text.substr(start, i - start));
          on_token(id);
          i += content.size();
          start = i;
          hit = true;
          break;
        }
      }
      if (hit) continue;
    }
    ++i;
  }
  on_text(text.substr(start));
}

void BpeModel::encode(std::string_view text, std::vector<int>& ids, BpeScratch& s, bool specials) const {
  prepare(s);
  if (!specials) {
    encode_normalized(text, s, ids, false);
    return;
  }
  added_raw_.split(
      text, [&](std::string_view segment) { encode_normalized(segment, s, ids, true); },
      [&](int id) { ids.push_back(id); });
}

void BpeModel::encode_normalized(std::string_view text, BpeScratch& s, std::vector<int>& ids, bool specials) const {
  if (text.empty()) return;
  if (nfc_ && !nfc_quick_yes(text)) {
    nfc_normalize(text, s.normalized_);
    text = s.normalized_;
  }
  if (!specials) {
    encode_ordinary(text, s, ids);
    return;
  }
  added_normalized_.split(
      text, [&](std::string_view segment) { encode_ordinary(segment, s, ids); }, [&](int id) { ids.push_back(id); });
}

template <typename Emit>
void BpeModel::split(std::string_view text, size_t stage, BpeScratch& s, Emit&& emit) const {
  if (stage == stages_.size()) {
    emit(text);
    return;
  }
  const Stage& st = stages_[stage];
  std::string_view t = text;
  if (st.add_prefix_space && !text.empty() && text[0] != ' ') {
    std::string& buf = s.prefixed_[stage];
    buf.assign(1, ' ');
    buf.append(text);
    t = buf;
  }
  if (!st.re) {
    split(t, stage + 1, s, emit);
    return;
  }
  st.re->split(t, s.regex_[stage], [&](std::string_view piece) { split(piece, stage + 1, s, emit); });
}

void BpeModel::encode_ordinary(std::string_view text, BpeScratch& s, std::vector<int>& ids) const {
  if (text.empty()) return;
  split(text, 0, s, [&](std::string_view piece) { encode_piece(piece, s, ids); });
}

void BpeModel::encode_piece(std::string_view piece, BpeScratch& s, std::vector<int>& ids) const {
  const size_t n = piece.size();
  if (n == 1) {
    const int id = byte_id_[static_cast<unsigned char>(piece[0])];
    if (id >= 0) {
      ids.push_back(id);
      return;
    }
  }
  // The thread's own cache first: a piece seen before costs one hash and one probe of a small
  // table, where the vocabulary's index (shared, 100K+ tokens) would cost cache misses.
  uint64_t h = 0;
  if (s.cache_on_) {
    h = piece_hash(piece);
    size_t m = 0;
    if (const int* hit = s.find(piece, h, m)) {
      ids.insert(ids.end(), hit, hit + m);
      return;
    }
  }
  if (ignore_merges_) {
    const int id = index_.find(piece, tokens_);
    if (id >= 0) {
      if (s.cache_on_) s.insert(piece, h, &id, 1);
      ids.push_back(id);
      return;
    }
  }
  // Symbols are token ids; a byte the vocabulary lacks is -1 - byte (it never merges).
  if (s.sym_.size() < n) {
    s.sym_.resize(n);
    s.rank_.resize(n);
    s.next_.resize(n);
    s.prev_.resize(n);
  }
  for (size_t i = 0; i < n; ++i) {
    const auto b = static_cast<unsigned char>(piece[i]);
    s.sym_[i] = byte_id_[b] >= 0 ? byte_id_[b] : -1 - b;
  }
  s.out_.clear();
  if (n <= scan_limit) {
    merge_scan(s, n);  // leaves the symbols in sym_[0..k), -1-terminated when shorter
  } else {
    merge_heap(s, n);
  }
  if (s.cache_on_) s.insert(piece, h, s.out_.data(), s.out_.size());
  ids.insert(ids.end(), s.out_.begin(), s.out_.end());
}

void BpeModel::emit_symbols(BpeScratch& s, const std::vector<int>& syms, size_t n, std::vector<int>& out) const {
  (void)s;
  bool last_unk = false;
  for (size_t i = 0; i < n; ++i) {
    const int sym = syms[i];
    if (sym >= 0) {
      out.push_back(sym);
      last_unk = false;
      continue;
    }
    const int b = -1 - sym;
    if (byte_fallback_on_ && byte_fallback_[b] >= 0) {
      out.push_back(byte_fallback_[b]);
      last_unk = false;
    } else if (unk_id_ >= 0) {
      if (!(fuse_unk_ && last_unk)) out.push_back(unk_id_);
      last_unk = true;
    }
    // Neither: the byte is dropped, as Hugging Face does without an unk token.
  }
}

void BpeModel::merge_scan(BpeScratch& s, size_t n) const {
  // rank_[i]: the rank of the pair (sym_[i], sym_[i + 1]).
  auto rank_at = [&](size_t i) -> uint32_t {
    const PairRanks::Slot* p = pairs_.find(s.sym_[i], s.sym_[i + 1]);
    return p ? p->rank : PairRanks::kNone;
  };
  size_t m = n;
  for (size_t i = 0; i + 1 < m; ++i) s.rank_[i] = rank_at(i);
  while (m > 1) {
    uint32_t best = PairRanks::kNone;
    size_t at = 0;
    for (size_t i = 0; i + 1 < m; ++i)
      if (s.rank_[i] < best) {
        best = s.rank_[i];
        at = i;
      }
    if (best == PairRanks::kNone) break;
    s.sym_[at] = pairs_.find(s.sym_[at], s.sym_[at + 1])->merged;
    for (size_t k = at + 1; k + 1 < m; ++k) s.sym_[k] = s.sym_[k + 1];
    for (size_t k = at + 1; k + 2 < m; ++k) s.rank_[k] = s.rank_[k + 1];
    --m;
    if (at + 1 < m) s.rank_[at] = rank_at(at);
    if (at > 0) s.rank_[at - 1] = rank_at(at - 1);
  }
  emit_symbols(s, s.sym_, m, s.out_);
}

void BpeModel::merge_heap(BpeScratch& s, size_t n) const {
  // A linked list of symbols and a min-heap of candidate merges keyed (rank, left position);
  // an entry whose pair has changed since it was pushed is skipped when it comes up.
  constexpr int kDead = std::numeric_limits<int>::min();
  for (size_t i = 0; i < n; ++i) {
    s.next_[i] = i + 1 < n ? static_cast<int>(i + 1) : -1;
    s.prev_[i] = static_cast<int>(i) - 1;
  }
  auto& heap = s.heap_;
  heap.clear();
  auto cmp = [](const std::pair<uint64_t, int>& x, const std::pair<uint64_t, int>& y) { return x.first > y.first; };
  auto push = [&](int i) {
    const int j = s.next_[static_cast<size_t>(i)];
    if (j < 0) return;
    const PairRanks::Slot* p = pairs_.find(s.sym_[static_cast<size_t>(i)], s.sym_[static_cast<size_t>(j)]);
    if (!p) return;
    heap.emplace_back((static_cast<uint64_t>(p->rank) << 32) | static_cast<uint32_t>(i), i);
    std::push_heap(heap.begin(), heap.end(), cmp);
  };
  for (size_t i = 0; i + 1 < n; ++i) push(static_cast<int>(i));
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), cmp);
    const auto [key, i] = heap.back();
    heap.pop_back();
    const auto ui = static_cast<size_t>(i);
    if (s.sym_[ui] == kDead) continue;
    const int j = s.next_[ui];
    if (j < 0) continue;
    const PairRanks::Slot* p = pairs_.find(s.sym_[ui], s.sym_[static_cast<size_t>(j)]);
    if (!p || p->rank != static_cast<uint32_t>(key >> 32)) continue;  // stale
    s.sym_[ui] = p->merged;
    const int k = s.next_[static_cast<size_t>(j)];
    s.next_[ui] = k;
    if (k >= 0) s.prev_[static_cast<size_t>(k)] = i;
    s.sym_[static_cast<size_t>(j)] = kDead;
    if (s.prev_[ui] >= 0) push(s.prev_[ui]);
    push(i);
  }
  // Compact the survivors in order.
  size_t m = 0;
  for (int i = 0; i >= 0; i = s.next_[static_cast<size_t>(i)]) s.sym_[m++] = s.sym_[static_cast<size_t>(i)];
  emit_symbols(s, s.sym_, m, s.out_);
}

}  // namespace tripod
