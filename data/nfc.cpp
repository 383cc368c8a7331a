// NFC through ICU's Normalizer2 (UTF-8 in, UTF-8 out), with a fast path for text below U+0300.
#include "data/nfc.h"

#ifdef TRIPOD_HAVE_ICU
#include <unicode/bytestream.h>
#include <unicode/normalizer2.h>
#endif

#include "core/error.h"

namespace tripod {

namespace {

#ifdef TRIPOD_HAVE_ICU
const icu::Normalizer2& nfc() {
  static const icu::Normalizer2* n = [] {
    UErrorCode err = U_ZERO_ERROR;
    const icu::Normalizer2* p = icu::Normalizer2::getNFCInstance(err);
    TRIPOD_CHECK(U_SUCCESS(err) && p, "ICU's NFC normalizer is not available: {}", u_errorName(err));
    return p;
  }();
  return *n;
}
#endif

// The length of the valid UTF-8 sequence at text[i] (1..4), or 0 when the bytes there are not
// one (a stray continuation byte, an overlong form, a surrogate, past U+10FFFF, cut short).
size_t utf8_length(std::string_view text, size_t i) {
  const auto b = [&](size_t k) { return static_cast<unsigned char>(text[i + k]); };
  const auto cont = [&](size_t k) { return i + k < text.size() && (b(k) & 0xC0) == 0x80; };
  const unsigned char c = b(0);
  if (c < 0x80) return 1;
  if (c >= 0xC2 && c <= 0xDF) return cont(1) ? 2 : 0;
  if (c >= 0xE0 && c <= 0xEF) {
    if (!cont(1) || !cont(2)) return 0;
    if (c == 0xE0 && b(1) < 0xA0) return 0;   // overlong
    if (c == 0xED && b(1) >= 0xA0) return 0;  // a surrogate
    return 3;
  }
  if (c >= 0xF0 && c <= 0xF4) {
    if (!cont(1) || !cont(2) || !cont(3)) return 0;
    if (c == 0xF0 && b(1) < 0x90) return 0;   // overlong
    if (c == 0xF4 && b(1) >= 0x90) return 0;  // past U+10FFFF
    return 4;
  }
  return 0;
}

#ifdef TRIPOD_HAVE_ICU
void normalize_valid(std::string_view run, std::string& out) {
  if (run.empty()) return;
  if (nfc_quick_yes(run)) {
    out.append(run);
    return;
  }
  icu::StringByteSink<std::string> sink(&out);
  UErrorCode err = U_ZERO_ERROR;
  nfc().normalizeUTF8(0, icu::StringPiece(run.data(), static_cast<int32_t>(run.size())), sink, nullptr, err);
  TRIPOD_CHECK(U_SUCCESS(err), "NFC normalization of {} bytes failed: {}", run.size(), u_errorName(err));
}
#else
void normalize_valid(std::string_view run, std::string& out) {
  if (run.empty()) return;
  TRIPOD_CHECK(nfc_quick_yes(run), "NFC normalization without ICU (built with TRIPOD_ICU=OFF)");
  out.append(run);
}
#endif

}  // namespace

bool nfc_available() {
#ifdef TRIPOD_HAVE_ICU
  return true;
#else
  return false;
#endif
}

bool nfc_quick_yes(std::string_view text) {
  // Every byte below 0xCC: every character is below U+0300 (lead bytes 0xC2..0xCB), where each
  // is its own NFC form with combining class 0, so no two of them compose or reorder.
  for (const char ch : text)
    if (static_cast<unsigned char>(ch) >= 0xCC) return false;
  return true;
}

void nfc_normalize(std::string_view text, std::string& out) {
  out.clear();
  TRIPOD_CHECK(text.size() <= static_cast<size_t>(INT32_MAX), "NFC of {} bytes: over ICU's 2 GiB string limit",
               text.size());
  size_t start = 0, i = 0;
  while (i < text.size()) {
    const size_t n = utf8_length(text, i);
    if (n > 0) {
      i += n;
      continue;
    }
    normalize_valid(text.substr(start, i - start), out);
    out += text[i];  // not UTF-8: through unchanged
    start = ++i;
  }
  normalize_valid(text.substr(start), out);
}

}  // namespace tripod
