// Regex pre-tokenization with PCRE2 (JIT, UTF-8, Unicode properties): cuts text into the pieces
// that byte-level BPE encodes one by one, running the patterns exactly as tokenizer files write them.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

struct pcre2_real_code_8;
struct pcre2_real_match_data_8;
struct pcre2_real_jit_stack_8;
struct pcre2_real_match_context_8;

namespace tripod {

// Per-thread matching state of one pattern (PCRE2 match data and a JIT stack).
class RegexScratch {
 public:
  RegexScratch() = default;
  RegexScratch(RegexScratch&&) noexcept;
  RegexScratch& operator=(RegexScratch&&) noexcept;
  ~RegexScratch();

 private:
  friend class RegexSplitter;
  pcre2_real_match_data_8* match_ = nullptr;
  pcre2_real_jit_stack_8* stack_ = nullptr;
  pcre2_real_match_context_8* context_ = nullptr;
};

class RegexSplitter {
 public:
  // Compiles `pattern` (PCRE2 syntax, which reads the Rust/Oniguruma/Python patterns of tokenizer
  // files the same: \p{L}, (?i:...), lookahead). `literal`: the pattern is a plain string.
  // A pattern that does not compile is an InputError naming `origin`.
  RegexSplitter(const std::string& pattern, const std::string& origin, bool literal = false);
  RegexSplitter(RegexSplitter&&) noexcept;
  ~RegexSplitter();

  const std::string& pattern() const { return pattern_; }
  RegexScratch make_scratch() const;

  // Calls fn(piece) for every match of the pattern in `text` and every run of text between
  // matches (the "Isolated" behaviour of Hugging Face's Split), in order: the pieces put back
  // together are `text`. Bytes that are not valid UTF-8 never match; they travel in the runs
  // between matches.
  template <typename Fn>
  void split(std::string_view text, RegexScratch& s, Fn&& fn) const {
    size_t at = 0, gap = 0;
    while (at < text.size()) {
      size_t b, e;
      if (!next_match(text, at, s, b, e)) break;
      if (b > gap) fn(text.substr(gap, b - gap));
      fn(text.substr(b, e - b));
      at = gap = e;
    }
    if (gap < text.size()) fn(text.substr(gap));
  }

 private:
  // The first non-empty match at or after `at`: [b, e). False when there is none.
  bool next_match(std::string_view text, size_t at, RegexScratch& s, size_t& b, size_t& e) const;

  std::string pattern_, origin_;
  pcre2_real_code_8* code_ = nullptr;
  bool jit_ = false;
};

}  // namespace tripod
