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
