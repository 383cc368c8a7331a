// PCRE2 pre-tokenization: compiled once with JIT, matched with per-thread scratch.
#define PCRE2_CODE_UNIT_WIDTH 8
#include "data/regex_splitter.h"

#include <pcre2.h>

#include <utility>

#include "core/error.h"

namespace tripod {

namespace {

std::string pcre2_message(int code) {
  PCRE2_UCHAR buf[256];
  int n = pcre2_get_error_message(code, buf, sizeof buf);
  return n > 0 ? std::string(reinterpret_cast<const char*>(buf), static_cast<size_t>(n)) : std::to_string(code);
}

}  // namespace

RegexScratch::RegexScratch(RegexScratch&& o) noexcept
    : match_(std::exchange(o.match_, nullptr)),
      stack_(std::exchange(o.stack_, nullptr)),
      context_(std::exchange(o.context_, nullptr)) {}

RegexScratch& RegexScratch::operator=(RegexScratch&& o) noexcept {
  std::swap(match_, o.match_);
  std::swap(stack_, o.stack_);
  std::swap(context_, o.context_);
  return *this;
}

RegexScratch::~RegexScratch() {
  pcre2_match_data_free(match_);
  pcre2_match_context_free(context_);
  pcre2_jit_stack_free(stack_);
}

RegexSplitter::RegexSplitter(const std::string& pattern, const std::string& origin, bool literal)
    : pattern_(pattern), origin_(origin) {
  // UCP: \s, \d, \w and POSIX classes use Unicode properties, as in the Rust regex crates and
  // Oniguruma. MATCH_INVALID_UTF: arbitrary bytes are fine; invalid sequences never match.
  uint32_t options = PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF;
  if (literal) options |= PCRE2_LITERAL;
  int err = 0;
  PCRE2_SIZE offset = 0;
  code_ = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(), options, &err, &offset, nullptr);
  TRIPOD_INPUT_CHECK(code_ != nullptr, "{}: the pattern does not compile at offset {} ({}): {}", origin, offset,
                     pcre2_message(err), pattern);
  jit_ = pcre2_jit_compile(code_, PCRE2_JIT_COMPLETE) == 0;
}

RegexSplitter::RegexSplitter(RegexSplitter&& o) noexcept
    : pattern_(std::move(o.pattern_)), origin_(std::move(o.origin_)), code_(std::exchange(o.code_, nullptr)),
      jit_(o.jit_) {}

RegexSplitter::~RegexSplitter() { pcre2_code_free(code_); }

RegexScratch RegexSplitter::make_scratch() const {
  RegexScratch s;
  s.match_ = pcre2_match_data_create_from_pattern(code_, nullptr);
  TRIPOD_CHECK(s.match_ != nullptr, "pcre2_match_data_create_from_pattern failed");
  if (jit_) {
    // Long whitespace runs recurse deeply in "\s+(?!\S)": a stack that grows to 64 MB.
    s.stack_ = pcre2_jit_stack_create(32 << 10, 64 << 20, nullptr);
    s.context_ = pcre2_match_context_create(nullptr);
    TRIPOD_CHECK(s.stack_ && s.context_, "pcre2_jit_stack_create failed");
    pcre2_jit_stack_assign(s.context_, nullptr, s.stack_);
  }
  return s;
}

bool RegexSplitter::next_match(std::string_view text, size_t at, RegexScratch& s, size_t& b, size_t& e) const {
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  // NOTEMPTY: a pattern that can match the empty string moves on to a real piece.
  int rc = jit_ ? pcre2_jit_match(code_, subject, text.size(), at, PCRE2_NOTEMPTY, s.match_, s.context_)
                : pcre2_match(code_, subject, text.size(), at, PCRE2_NOTEMPTY, s.match_, nullptr);
  if (rc == PCRE2_ERROR_NOMATCH) return false;
  TRIPOD_INPUT_CHECK(rc > 0, "{}: matching the pattern failed at byte {} of a {}-byte text ({})", origin_, at,
                     text.size(), pcre2_message(rc));
  const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(s.match_);
  b = ov[0];
  e = ov[1];
  return e > b;
}

}  // namespace tripod
