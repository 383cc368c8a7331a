// Reading text and JSONL documents.
#include "data/documents.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "core/error.h"

namespace tripod {

InputFormat parse_input_format(std::string_view name, std::string_view option) {
  if (name == "auto") return InputFormat::Auto;
  if (name == "text") return InputFormat::Text;
  if (name == "jsonl") return InputFormat::Jsonl;
  throw InputError(fmt::format("{} '{}': valid formats are auto, text and jsonl", option, name));
}

InputFormat resolve_input_format(InputFormat f, const std::string& path) {
  if (f != InputFormat::Auto) return f;
  for (std::string_view ext : {".jsonl", ".json", ".ndjson"})
    if (path.size() >= ext.size() && path.compare(path.size() - ext.size(), ext.size(), ext) == 0)
      return InputFormat::Jsonl;
  return InputFormat::Text;
}

size_t find_invalid_utf8(std::string_view s) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const size_t n = s.size();
  size_t i = 0;
  while (i < n) {
    // ASCII fast path, 8 bytes at a time.
    if (i + 8 <= n) {
      uint64_t w;
      std::memcpy(&w, p + i, 8);
      if ((w & 0x8080808080808080ull) == 0) {
        i += 8;
        continue;
      }
    }
    unsigned c = p[i];
    if (c < 0x80) {
      ++i;
      continue;
    }
    int len;
    uint32_t cp;
    if (c >= 0xC2 && c <= 0xDF) {
      len = 2;
      cp = c & 0x1F;
    } else if (c >= 0xE0 && c <= 0xEF) {
      len = 3;
      cp = c & 0x0F;
    } else if (c >= 0xF0 && c <= 0xF4) {
      len = 4;
      cp = c & 0x07;
    } else {
      return i;  // a continuation byte, an overlong lead (C0, C1) or F5..FF
    }
    if (i + len > n) return i;
    for (int k = 1; k < len; ++k) {
      unsigned cc = p[i + k];
      if ((cc & 0xC0) != 0x80) return i;
      cp = (cp << 6) | (cc & 0x3F);
    }
    if ((len == 3 && (cp < 0x800 || (cp >= 0xD800 && cp <= 0xDFFF))) || (len == 4 && (cp < 0x10000 || cp > 0x10FFFF)))
      return i;
    i += len;
  }
  return std::string_view::npos;
}

namespace {

bool is_blank(std::string_view s) {
  for (char c : s)
    if (c != ' ' && c != '\t' && c != '\r' && c != '\f' && c != '\v') return false;
  return true;
}

// The common JSONL line, read in one pass: an object whose `key` holds a string. It checks the
// whole line against JSON's grammar (RFC 8259; the line's UTF-8 is checked before) and decodes the
// key's last string value into `text`; anything else (not an object, no such key, a value of
// another type, a syntax error, nesting deeper than kMaxDepth) gives false, and the SAX parser
// below then reads the line and says what is wrong. The tests and a fuzzer hold it to nlohmann.
class FastLine {
 public:
  FastLine(std::string_view line, const std::string& key, std::string& text)
      : p_(line.data()), end_(line.data() + line.size()), key_(key), text_(text) {}

  bool read() {
    bool found = false;
    ws();
    if (!eat('{')) return false;
    ws();
    if (eat('}')) return false;  // {}: no key
    for (;;) {
      const char* k = p_;
      if (!string(nullptr)) return false;
      const bool ours = same_key(k + 1, p_ - 1);
      ws();
      if (!eat(':')) return false;
      ws();
      if (ours) {
        if (p_ == end_ || *p_ != '"') return false;  // not a string: the SAX reader names its type
        text_.clear();
        if (!string(&text_)) return false;
        found = true;
      } else if (!value(1)) {
        return false;
      }
      ws();
      if (eat('}')) break;
      if (!eat(',')) return false;
      ws();
    }
    ws();
    return found && p_ == end_;
  }

 private:
  static constexpr int kMaxDepth = 64;

  bool eat(char c) {
    if (p_ == end_ || *p_ != c) return false;
    ++p_;
    return true;
  }
  void ws() {
    while (p_ != end_ && (*p_ == ' ' || *p_ == '\t' || *p_ == '\n' || *p_ == '\r')) ++p_;
  }
  static int hex(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  }
  bool hex4(uint32_t& v) {
    if (end_ - p_ < 4) return false;
    v = 0;
    for (int i = 0; i < 4; ++i) {
      const int h = hex(p_[i]);
      if (h < 0) return false;
      v = v << 4 | static_cast<uint32_t>(h);
    }
    p_ += 4;
    return true;
  }
  static void put_utf8(uint32_t cp, std::string& out) {
    if (cp < 0x80) {
      out += static_cast<char>(cp);
    } else if (cp < 0x800) {
      out += static_cast<char>(0xC0 | cp >> 6);
      out += static_cast<char>(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
      out += static_cast<char>(0xE0 | cp >> 12);
      out += static_cast<char>(0x80 | (cp >> 6 & 0x3F));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    } else {
      out += static_cast<char>(0xF0 | cp >> 18);
      out += static_cast<char>(0x80 | (cp >> 12 & 0x3F));
      out += static_cast<char>(0x80 | (cp >> 6 & 0x3F));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    }
  }
  // A string at p_ (its opening quote), decoded into *out when out is given.
  bool string(std::string* out) {
    if (!eat('"')) return false;
    for (;;) {
      const char* run = p_;
      while (p_ != end_ && *p_ != '"' && *p_ != '\\' && static_cast<unsigned char>(*p_) >= 0x20) ++p_;
      if (out) out->append(run, p_);
      if (p_ == end_ || static_cast<unsigned char>(*p_) < 0x20) return false;
      if (*p_++ == '"') return true;
      if (p_ == end_) return false;
      const char e = *p_++;
      char plain = 0;
      switch (e) {
        case '"': plain = '"'; break;
        case '\\': plain = '\\'; break;
        case '/': plain = '/'; break;
        case 'b': plain = '\b'; break;
        case 'f': plain = '\f'; break;
        case 'n': plain = '\n'; break;
        case 'r': plain = '\r'; break;
        case 't': plain = '\t'; break;
        case 'u': {
          uint32_t cp;
          if (!hex4(cp)) return false;
          if (cp >= 0xDC00 && cp <= 0xDFFF) return false;  // a low surrogate alone
          if (cp >= 0xD800 && cp <= 0xDBFF) {               // must pair with a low one
            uint32_t lo;
            if (end_ - p_ < 2 || p_[0] != '\\' || p_[1] != 'u') return false;
            p_ += 2;
            if (!hex4(lo) || lo < 0xDC00 || lo > 0xDFFF) return false;
            cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
          }
          if (out) put_utf8(cp, *out);
          continue;
        }
        default: return false;
      }
      if (out) *out += plain;
    }
  }
  bool digits() {
    const char* s = p_;
    while (p_ != end_ && *p_ >= '0' && *p_ <= '9') ++p_;
    return p_ != s;
  }
  bool number() {
    eat('-');
    if (eat('0')) {
    } else if (p_ != end_ && *p_ >= '1' && *p_ <= '9') {
      digits();
    } else {
      return false;
    }
    if (eat('.') && !digits()) return false;
    if (p_ != end_ && (*p_ == 'e' || *p_ == 'E')) {
      ++p_;
      if (!eat('+')) eat('-');
      if (!digits()) return false;
    }
    return true;
  }
  bool word(std::string_view w) {
    if (static_cast<size_t>(end_ - p_) < w.size() || std::string_view(p_, w.size()) != w) return false;
    p_ += w.size();
    return true;
  }
  bool value(int depth) {
    if (p_ == end_) return false;
    switch (*p_) {
      case '"': return string(nullptr);
      case 't': return word("true");
      case 'f': return word("false");
      case 'n': return word("null");
      case '{':
      case '[': {
        if (depth >= kMaxDepth) return false;
        const char close = *p_++ == '{' ? '}' : ']';
        ws();
        if (eat(close)) return true;
        for (;;) {
          if (close == '}') {
            if (!string(nullptr)) return false;
            ws();
            if (!eat(':')) return false;
            ws();
          }
          if (!value(depth + 1)) return false;
          ws();
          if (eat(close)) return true;
          if (!eat(',')) return false;
          ws();
        }
      }
      default: return number();
    }
  }
  // Whether the raw key between its quotes names key_ (a key with escapes is decoded first).
  bool same_key(const char* b, const char* e) {
    std::string_view raw(b, static_cast<size_t>(e - b));
    if (raw.find('\\') == std::string_view::npos) return raw == key_;
    std::string decoded;
    const char* keep = p_;
    p_ = b - 1;
    string(&decoded);
    p_ = keep;
    return decoded == key_;
  }

  const char* p_;
  const char* const end_;
  const std::string& key_;
  std::string& text_;
};

// Finds the string under one top-level key of a JSON line with nlohmann's SAX parser: no tree is
// built and the document's string is moved out of the lexer's buffer, so a line costs little more
// than the lexer's pass over it. The whole line is still parsed (and so validated); a repeated key
// counts with its last value, as when the line is parsed into an object.
class KeyFinder final : public nlohmann::json_sax<nlohmann::json> {
 public:
  KeyFinder(const std::string& key, std::string& text) : key_(key), text_(text) {}

  const char* top = nullptr;    // the line's value when it is not an object ("an array", ...)
  const char* found = nullptr;  // the key's value when it is not a string; "" when it is one
  std::string error;            // the parser's account of a syntax error

  bool null() override { return value("null"); }
  bool boolean(bool) override { return value("a boolean"); }
  bool number_integer(number_integer_t) override { return value("a number"); }
  bool number_unsigned(number_unsigned_t) override { return value("a number"); }
  bool number_float(number_float_t, const string_t&) override { return value("a number"); }
  bool binary(binary_t&) override { return value("binary data"); }
  bool string(string_t& s) override {
    if (depth_ == 1 && want_) text_.swap(s);  // the lexer clears its buffer before the next token
    return value("");
  }
  bool start_object(std::size_t) override {
    value("an object");
    ++depth_;
    return true;
  }
  bool end_object() override { return --depth_, true; }
  bool start_array(std::size_t) override {
    value("an array");
    ++depth_;
    return true;
  }
  bool end_array() override { return --depth_, true; }
  bool key(string_t& k) override {
    want_ = depth_ == 1 && k == key_;
    return true;
  }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception& e) override {
    std::string_view msg = e.what();
    if (auto pos = msg.find("] "); pos != std::string_view::npos) msg.remove_prefix(pos + 2);
    error = msg;
    return false;
  }

 private:
  // A value starts at the current depth: the line's own value, or the key's when it was just named.
  bool value(const char* kind) {
    if (depth_ == 0) {
      top = kind == std::string_view("an object") ? nullptr : (*kind ? kind : "a string");
    } else if (depth_ == 1 && want_) {
      found = kind;
      want_ = false;
    }
    return true;
  }

  const std::string& key_;
  std::string& text_;
  int depth_ = 0;
  bool want_ = false;  // the last key at depth 1 was key_ and its value comes next
};

}  // namespace

LineKind extract_document(std::string_view line, InputFormat fmt, const std::string& key, std::string& text,
                          std::string& why) {
  std::string_view doc;
  const LineKind kind = extract_document_view(line, fmt, key, text, doc, why);
  if (kind == LineKind::Document && doc.data() != text.data()) text.assign(doc);
  return kind;
}

LineKind extract_document_view(std::string_view line, InputFormat fmt, const std::string& key, std::string& scratch,
                               std::string_view& doc, std::string& why) {
  if (is_blank(line)) return LineKind::Blank;
  if (size_t bad = find_invalid_utf8(line); bad != std::string_view::npos) {
    why = fmt::format("invalid UTF-8 at byte {} (byte 0x{:02x}); the input must be UTF-8", bad + 1,
                      static_cast<unsigned char>(line[bad]));
    return LineKind::Bad;
  }
  if (fmt != InputFormat::Jsonl) {
    doc = line;
    return LineKind::Document;
  }
  if (FastLine(line, key, scratch).read()) {
    doc = scratch;
    return scratch.empty() ? LineKind::Blank : LineKind::Document;
  }
  scratch.clear();
  KeyFinder finder(key, scratch);
  if (!nlohmann::json::sax_parse(line.begin(), line.end(), &finder)) {
    why = finder.error.empty() ? "not valid JSON" : fmt::format("not valid JSON ({})", finder.error);
    return LineKind::Bad;
  }
  if (finder.top) {
    why = fmt::format("a JSON line must be an object with the document under \"{}\", got {}", key, finder.top);
    return LineKind::Bad;
  }
  if (!finder.found) {
    why = fmt::format("the JSON object has no key \"{}\" (choose the key with --json-key)", key);
    return LineKind::Bad;
  }
  if (*finder.found) {
    why = fmt::format("key \"{}\" holds {}, not a string", key, finder.found);
    return LineKind::Bad;
  }
  if (scratch.empty()) return LineKind::Blank;
  doc = scratch;
  return LineKind::Document;
}

BlockReader::BlockReader(const std::string& path, size_t block_bytes) : path_(path), block_bytes_(block_bytes) {
  f_ = std::fopen(path.c_str(), "rb");
  if (!f_) {
    int err = errno;
    throw InputError(err == ENOENT ? fmt::format("{}: no such file", path)
                                   : fmt::format("{}: cannot open ({})", path, std::strerror(err)));
  }
  if (std::fseek(f_, 0, SEEK_END) == 0) {
    file_size_ = std::ftell(f_);
    std::fseek(f_, 0, SEEK_SET);
  }
}

BlockReader::~BlockReader() {
  if (f_) std::fclose(f_);
}

bool BlockReader::next(std::string& block, int64_t& first_line) {
  if (!next(block)) return false;
  first_line = next_line_;
  int64_t lines = std::count(block.begin(), block.end(), '\n');
  if (block.back() != '\n') ++lines;
  next_line_ += lines;
  return true;
}

bool BlockReader::next(std::string& block) {
  block.swap(carry_);
  carry_.clear();
  // Read until the block holds at least block_bytes_ and a newline, or the file ends. A line
  // longer than a block doubles the read size, and only new bytes are searched for a newline.
  while (!eof_) {
    size_t have = block.size();
    size_t want = std::max(block_bytes_ > have ? block_bytes_ - have : size_t{0}, std::max(have, size_t{4096}));
    block.resize(have + want);
    size_t got = std::fread(block.data() + have, 1, want, f_);
    block.resize(have + got);
    bytes_read_ += static_cast<int64_t>(got);
    if (got < want) {
      if (std::ferror(f_)) throw InputError(fmt::format("{}: read failed ({})", path_, std::strerror(errno)));
      eof_ = true;
    }
    if (block.size() >= block_bytes_ && got > 0) {
      const void* nl = ::memrchr(block.data() + have, '\n', got);
      if (nl) {
        size_t cut = static_cast<size_t>(static_cast<const char*>(nl) - block.data()) + 1;
        carry_.assign(block, cut, std::string::npos);
        block.resize(cut);
        break;
      }
    }
  }
  return !block.empty();
}

}  // namespace tripod
