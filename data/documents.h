// Input documents for the tokenizer trainer and preprocess: text (one document per line) or JSONL
// (one JSON object per line, the document under a key), read in blocks of whole lines.
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <string_view>

namespace tripod {

enum class InputFormat { Auto, Text, Jsonl };

// "auto" | "text" | "jsonl"; anything else is an InputError naming `option`.
InputFormat parse_input_format(std::string_view name, std::string_view option);
// Auto becomes Jsonl for names ending .jsonl, .json or .ndjson and Text otherwise.
InputFormat resolve_input_format(InputFormat f, const std::string& path);

// Offset of the first byte of `s` that is not well-formed UTF-8 (overlong forms, surrogates
// and code points above U+10FFFF included), or npos when all of it is.
size_t find_invalid_utf8(std::string_view s);

// What one input line holds.
enum class LineKind { Document, Blank, Bad };

// Classifies `line` and, for a document, puts its text in `text`; for a bad line (not UTF-8,
// not JSON, no `key`, not a string) puts the reason in `why`. Blank lines (only whitespace)
// hold no document in either format.
LineKind extract_document(std::string_view line, InputFormat fmt, const std::string& key, std::string& text,
                          std::string& why);
// The same without a copy of text lines: `doc` is the document, in `line` (text) or in
// `scratch` (JSONL, unescaped there).
LineKind extract_document_view(std::string_view line, InputFormat fmt, const std::string& key, std::string& scratch,
                               std::string_view& doc, std::string& why);

// Reads a file in blocks of whole lines. A block ends after a newline, except the last one of
// a file that does not end in a newline.
class BlockReader {
 public:
  BlockReader(const std::string& path, size_t block_bytes = 1 << 20);
  ~BlockReader();
  BlockReader(const BlockReader&) = delete;
  BlockReader& operator=(const BlockReader&) = delete;

  // The next block and the line number (from 1) of its first line; false at the end.
  bool next(std::string& block, int64_t& first_line);
  // The next block without counting its lines (the caller counts them; the line numbers of
  // the other overload then no longer hold).
  bool next(std::string& block);
  int64_t bytes_read() const { return bytes_read_; }
  int64_t file_size() const { return file_size_; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  std::FILE* f_ = nullptr;
  size_t block_bytes_;
  std::string carry_;
  int64_t next_line_ = 1, bytes_read_ = 0, file_size_ = 0;
  bool eof_ = false;
};

// Calls fn(line) for every line of `block` (without the newline; a trailing '\r' dropped).
template <typename Fn>
void for_each_line(std::string_view block, Fn&& fn) {
  size_t start = 0;
  while (start < block.size()) {
    const void* nl = std::memchr(block.data() + start, '\n', block.size() - start);
    const size_t end = nl ? static_cast<size_t>(static_cast<const char*>(nl) - block.data()) : block.size();
    std::string_view line = block.substr(start, end - start);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    fn(line);
    start = end + 1;
  }
}

}  // namespace tripod
